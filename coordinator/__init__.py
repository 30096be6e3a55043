"""coordinator: an etcd-backed, fenced task-claim coordinator for multi-agent worker pools."""

__version__ = "0.1.0"
