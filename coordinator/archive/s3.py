"""S3-compatible object storage as an archive sink (``pip install coordinator[s3]``).

``s3://BUCKET/PREFIX?endpoint_url=URL&region=REGION``: each write is one gzip-compressed JSON
Lines object under ``PREFIX/YYYY/MM/DD/``, confirmed when PutObject answers (S3 acknowledges a
put only once the object is stored). Credentials come from boto3's usual chain (environment,
shared files, instance roles). boto3 is imported here only, so it is needed only when used.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from coordinator.archive.sink import ArchiveError
from coordinator.errors import ConfigError


class S3Sink:
    """Archive objects to one bucket and key prefix."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._lock = threading.Lock()
        self._seq = 0

    @classmethod
    def from_url(cls, url: str, *, setting: str = "archive") -> S3Sink:
        """A sink for ``s3://bucket/prefix?endpoint_url=...&region=...``."""
        parts = urlsplit(url)
        if not parts.netloc:
            raise ConfigError(f"{setting}: {url!r} names no bucket (s3://BUCKET/PREFIX)")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint_url", "region"}
        if unknown:
            raise ConfigError(f"{setting}: unknown parameter(s) {', '.join(sorted(unknown))}")
        try:
            import boto3
        except ImportError as exc:
            raise ConfigError(
                f"{setting}: an s3:// archive needs boto3: pip install 'coordinator[s3]'"
            ) from exc
        client = boto3.client(
            "s3", endpoint_url=query.get("endpoint_url"), region_name=query.get("region")
        )
        return cls(client, parts.netloc, parts.path)

    @property
    def url(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self._bucket}/{self._prefix}"

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        """Put ``objects`` as one object; returns its ``s3://`` URL once S3 stored it."""
        body = gzip.compress(
            "".join(
                json.dumps(o, separators=(",", ":"), sort_keys=True) + "\n" for o in objects
            ).encode()
        )
        key = self._next_key()
        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=body)
        except Exception as exc:  # botocore raises many kinds; any of them means unconfirmed
            raise ArchiveError(f"archive put of s3://{self._bucket}/{key} failed: {exc}") from exc
        return f"s3://{self._bucket}/{key}"

    def _next_key(self) -> str:
        with self._lock:
            self._seq += 1
            seq = self._seq
        now = time.gmtime()
        day = time.strftime("%Y/%m/%d", now)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", now)
        name = f"archive-{stamp}-{socket.gethostname()}-{os.getpid()}-{seq:08d}.jsonl.gz"
        return f"{self._prefix}/{day}/{name}" if self._prefix else f"{day}/{name}"

    def read(self) -> Iterator[dict[str, Any]]:
        """Every object under the prefix, in key (time) order."""
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=f"{self._prefix}/" if self._prefix else ""
            )
            keys = sorted(item["Key"] for page in pages for item in page.get("Contents", ()))
            for key in keys:
                body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read()
                for line in gzip.decompress(body).decode().splitlines():
                    if line.strip():
                        yield json.loads(line)
        except ArchiveError:
            raise
        except Exception as exc:
            raise ArchiveError(f"cannot read the archive at {self.url}: {exc}") from exc
