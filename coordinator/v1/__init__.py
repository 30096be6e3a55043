"""Generated wire contract (do not edit)."""
