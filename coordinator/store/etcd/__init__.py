"""etcd plumbing that knows no task: the KV client (``kv``) and what its txns are built of
(``ops``), group commit, lease keepalive and the claim lease pool, watches, the pacer, the
db-size and space guards."""
