"""The three servicers, thin: each method parses its request with the one ``parse_<rpc>`` of
its service (``server/wire/<service>_requests.py``), calls the store, and converts the answer
back; errors map to status codes in one table (``server/status.py``)."""
