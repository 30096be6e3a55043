"""etcd plumbing that knows no task: the KV client and its ops (``kv``), group commit, lease
keepalive and the claim lease pool, watches, the pacer, the db-size and space guards."""
