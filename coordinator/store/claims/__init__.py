"""Granting claims: the claim read, decision and txn (``claim``), the gates it passes on the way
(``gates``), long-poll ClaimNext's line of waiters (``long_poll``), and the live-claims listing."""
