"""The gRPC front of the coordinator: thin servicers over the store, health and reflection.

Where to look: ``app.py`` builds and runs the server, ``status.py`` is the one error -> status
table, ``identity.py`` names the caller, the ``*_wire.py`` modules translate requests (``parse_*``)
and records (``*_to_proto``) of one area each (see ``common_wire.py``).
"""

from __future__ import annotations

from coordinator.server.app import SERVICE_NAMES, build_server, serve
from coordinator.server.identity import PRINCIPAL_METADATA_KEY, principal_of

__all__ = ["PRINCIPAL_METADATA_KEY", "SERVICE_NAMES", "build_server", "principal_of", "serve"]
