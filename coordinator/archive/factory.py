"""The URL that names a sink: open one, or check that one can work before a server starts.

Kept out of ``sink.py`` (the contract every sink implements) so the arrows point one way: the
factory imports the sinks, the sinks import the contract.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from coordinator.archive.sink import ArchiveSink
from coordinator.errors import ConfigError


def open_sink(url: str, *, setting: str = "archive") -> ArchiveSink:
    """The sink named by ``url``: a directory path (``~`` expanded) or ``file://`` URL, or
    ``s3://bucket/prefix``
    (query: ``endpoint_url``, ``region``). ConfigError naming ``setting`` if unusable."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        from coordinator.archive.s3 import S3Sink  # boto3 only when S3 is used

        return S3Sink.from_url(url, setting=setting)
    if parts.scheme in ("", "file"):
        from coordinator.archive.local import LocalSink

        path = parts.path if parts.scheme == "file" else os.path.expanduser(url)
        if not path:
            raise ConfigError(f"{setting}: give a directory or an s3:// URL")
        return LocalSink(Path(path), setting=setting)
    raise ConfigError(
        f"{setting}: unsupported archive {url!r}; give a directory, file:///dir or s3://bucket/prefix"
    )


def check_sink(url: str, *, setting: str = "archive") -> None:
    """Refuse (ConfigError naming ``setting``) an archive that cannot work, creating nothing: a
    local path must be a writable directory or creatable under a writable one; an s3:// URL
    must name a bucket, and boto3 must be installed."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        open_sink(url, setting=setting)  # builds a client; no network call
        return
    if parts.scheme not in ("", "file"):
        open_sink(url, setting=setting)  # raises, naming the scheme
    path = Path(parts.path if parts.scheme == "file" else os.path.expanduser(url)).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise ConfigError(f"{setting}: {str(existing)!r} is not a directory")
    if existing == path and not path.is_dir():
        raise ConfigError(f"{setting}: {str(path)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{setting}: {str(existing)!r} is not writable")
