"""The API on the wire: one module per area turns requests into typed values (``parse_*``,
raising InvalidArgument naming the field) and records into protos (``*_to_proto``).

Pure and mechanical: no store, no interceptor, no servicer (tests/test_import_graph.py holds
it); ``common_wire`` holds what every area shares, ``page_tokens`` the list RPCs' tokens.
"""
