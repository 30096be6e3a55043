"""Where a task's history goes before it is pruned from etcd: an archive sink.

A sink takes a batch of archive objects (one JSON object per task, store/retention/history.py) and
returns only once they are durable, with the location they went to (a ``file://`` or ``s3://`` URL);
the pruner deletes nothing before that. A task may be archived twice (a crash after the archive
and before the prune, two replicas racing), never lost: readers keep the latest copy.

Sinks: ``local.LocalSink``, a directory of gzip-compressed JSON Lines files (the default; ``zcat
FILE | jq`` reads them), and ``s3.S3Sink``, S3-compatible object storage through boto3 (``pip
install coordinator[s3]``; imported only when used). ``open_sink(url)`` picks one.
"""

from __future__ import annotations

from coordinator.archive.factory import check_sink, open_sink
from coordinator.archive.sink import ArchiveError, ArchiveSink, latest_copies, latest_swept

__all__ = [
    "ArchiveError",
    "ArchiveSink",
    "check_sink",
    "latest_copies",
    "latest_swept",
    "open_sink",
]
