"""What happens to finished work: the pruner and its txns, a task's whole history (read, archived),
the sweep of ended attempts' leftovers, and the tombstones that keep a pruned id from coming back.
"""
