"""Demo and test fixtures, not part of the coordinator's service or SDK.

``outbox`` is a pretend email service (a real HTTP downstream with idempotency keys and lost
responses on demand); ``worker`` is the demo's worker process. ``coordinator demo`` runs both,
and the tests and the chaos suite use them as a real downstream and real worker processes.
"""
