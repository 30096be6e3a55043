"""Chaos suite: real process and etcd faults, a recorded history, and a checker over it.

``python -m chaos run --scenario NAME|all`` (see chaos/runner.py); the checker is pure
(chaos/checker.py over chaos/model.py) and is itself tested on broken histories.
"""
