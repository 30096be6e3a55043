"""The operator tests reuse the authentication fixtures: a server demanding bearer tokens and
the token file (see tests/auth/conftest.py); the store, channel and keyspace probe are the
shared ones (tests/fixtures.py)."""

from tests.auth.conftest import ring, secured, server

__all__ = ["ring", "secured", "server"]
