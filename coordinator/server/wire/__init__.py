"""The API on the wire. Each service's requests are parsed in one place: ``<service>_requests``
has one ``parse_<rpc>`` per RPC, returning a typed value or raising InvalidArgument naming the
first wrong field. The ``<area>_wire`` modules hold the single-field checks those use and turn
records into protos (``*_to_proto``); ``common_wire`` what every area shares, ``page_tokens``
the list RPCs' tokens.

Pure and mechanical: no store write, no interceptor, no servicer (tests/test_import_graph.py
holds it).
"""
