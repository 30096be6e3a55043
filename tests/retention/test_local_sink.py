"""The local archive sink: files rotate by size and by age, each file is a standard gzip stream
of JSON lines, and a write that never completed is skipped by readers."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from coordinator.archive.local import SUFFIX, LocalSink


def _noise(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest() * 2


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


def test_a_file_past_its_size_is_closed_and_the_next_write_starts_another(
    tmp_path: Path,
) -> None:
    sink = LocalSink(tmp_path, rotate_bytes=200)
    small = [{"task_id": f"t{n}"} for n in range(2)]
    big = [{"task_id": "big", "blob": "x" * 2000}]  # compresses well: a member of ~60 bytes

    first = sink.write(small)
    assert sink.write(small) == first  # both under 200 bytes: the same file
    # Hex digests hardly compress: this write takes the file past 200 bytes.
    sink.write([{"task_id": f"r{n}", "noise": _noise(n)} for n in range(5)])
    third = sink.write(big)  # the file passed 200 bytes with the write before

    files = _files(tmp_path)
    assert len(files) == 2 and third != first
    assert [f.as_uri() for f in files] == sorted([first, third])
    assert files[0].stat().st_size >= 200
    ids = [o["task_id"] for o in sink.read()]
    assert ids == ["t0", "t1", "t0", "t1", "r0", "r1", "r2", "r3", "r4", "big"]


def test_a_file_older_than_its_age_is_closed(tmp_path: Path) -> None:
    sink = LocalSink(tmp_path, rotate_seconds=0.0)  # every file is already too old

    locations = [sink.write([{"task_id": f"t{n}"}]) for n in range(3)]

    assert len(set(locations)) == 3  # one file per write, names unique within one second
    assert len(_files(tmp_path)) == 3
    assert [o["task_id"] for o in sink.read()] == ["t0", "t1", "t2"]


def test_each_file_reads_with_standard_gzip_and_a_torn_last_write_is_skipped(
    tmp_path: Path,
) -> None:
    sink = LocalSink(tmp_path)
    sink.write([{"task_id": "t1"}, {"task_id": "t2"}])
    sink.write([{"task_id": "t3"}])
    (path,) = _files(tmp_path)
    with gzip.open(path, "rt", encoding="utf-8") as handle:  # what zcat reads
        assert [json.loads(line)["task_id"] for line in handle] == ["t1", "t2", "t3"]

    torn = gzip.compress(b'{"task_id": "t4"}\n')
    with path.open("ab") as handle:  # a crash mid-write: never confirmed
        handle.write(torn[: len(torn) // 2])

    assert [o["task_id"] for o in sink.read()] == ["t1", "t2", "t3"]
