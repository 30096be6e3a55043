"""The operator tests reuse the authentication fixtures: a real store, a server demanding
bearer tokens, and the token file (see tests/auth/conftest.py)."""

from tests.auth.conftest import channel, keyspace, ring, secured, store

__all__ = ["channel", "keyspace", "ring", "secured", "store"]
