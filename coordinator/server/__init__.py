"""The gRPC front of the coordinator: thin servicers over the store, health and reflection.

Where to look: ``app.py`` builds and runs the server, ``status.py`` is the one error -> status
table, ``identity.py`` names the caller. A call passes ``interceptors/`` (the chain, one module
per link), then its servicer in ``services/``, which parses the request with the one
``parse_<rpc>`` of ``wire/<service>_requests.py`` and converts the answer with ``wire/``'s
``*_to_proto`` (see ``wire/common_wire.py``).
"""

from __future__ import annotations

from coordinator.server.app import SERVICE_NAMES, build_server, serve
from coordinator.server.identity import PRINCIPAL_METADATA_KEY, principal_of

__all__ = ["PRINCIPAL_METADATA_KEY", "SERVICE_NAMES", "build_server", "principal_of", "serve"]
