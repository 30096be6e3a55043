"""The three servicers, thin: each method turns its request into typed values with its area's
wire module (``server/wire/``), calls the store, and converts the answer back; errors map to
status codes in one table (``server/status.py``)."""
