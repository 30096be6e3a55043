"""Everything that extends or ends a held attempt: the acceptance points (authorize, stage,
commit, release), Renew and RenewMany with their screen, Fail, the txn that ends an attempt and
requeues its task, a claim given back undelivered, the lease-expiry reclaimer, and the views of
claims this replica granted."""
