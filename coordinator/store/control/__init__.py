"""What operators and the server's own guards keep: the epoch and lease revocation, claim pauses
and drain status (admin, queue_drain), the version gate's records, and the stored answers of
idempotent requests."""
