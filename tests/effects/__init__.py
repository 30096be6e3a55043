"""Side-effect slots: domain, store, RPCs, SDK, the outbox downstream, coverage."""
