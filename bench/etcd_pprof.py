"""etcd's own CPU profile, by area: where etcd's share of a cycle goes.

etcd started with ``--enable-pprof`` serves Go's CPU profile at ``/debug/pprof/profile`` (a
gzipped ``profile.proto``, symbolized by etcd itself). ``record`` fetches one while a scenario
runs; ``areas`` sorts its samples into the parts of etcd a cycle pays for (the first area whose
pattern appears in a sample's stack takes it): GC, watches, the 3.4 read-buffer copy, the apply
of compares, puts, deletes and ranges, raft and the WAL, the gRPC handlers and transport. The
schema is declared here (the few fields read), so no generated code or Go tool is needed.
"""

from __future__ import annotations

import gzip
import urllib.request
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GC", ("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.gcAssistAlloc")),
    ("watches", ("watchServer", "serverWatchStream", "watchableStore", "watcherGroup")),
    ("read-buffer copy (etcd 3.4; cached from 3.5)", ("ConcurrentReadTx",)),
    ("apply: compares", ("applyCompares",)),
    ("apply: puts", ("applierV3backend).Put",)),
    ("apply: deletes", ("applierV3backend).DeleteRange",)),
    ("apply: ranges in txns", ("applierV3backend).Range",)),
    ("apply: leases", ("LeaseGrant", "LeaseRevoke", "lessor")),
    ("apply: the rest (txn frame, backend commit)", ("applyAll", "(*backend).run", "batchTx")),
    ("raft and WAL fsync", ("raftNode", "WAL", "raft.(*node)", "raft.(*raft)")),
    ("KV.Range handler", ("_KV_Range_Handler", "linearizableRead")),
    ("KV.Txn handler (decode, interceptors, wait)", ("_KV_Txn_Handler",)),
    ("Lease handlers", ("_Lease_",)),
    ("gRPC transport", ("grpc/internal/transport", "http2", "grpc.(*Server)")),
)
OTHER = "syscalls, scheduler, the rest"


def _profile_class() -> Any:
    """The message class of pprof's ``Profile``, with only the fields ``areas`` reads."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="coordinator_bench_pprof.proto", package="coordinator_bench_pprof", syntax="proto3"
    )
    repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    kind = descriptor_pb2.FieldDescriptorProto
    messages = {
        # pprof's profile.proto field numbers (github.com/google/pprof/proto/profile.proto)
        "Profile": [
            ("sample_type", 1, repeated, kind.TYPE_MESSAGE, "ValueType"),
            ("sample", 2, repeated, kind.TYPE_MESSAGE, "Sample"),
            ("location", 4, repeated, kind.TYPE_MESSAGE, "Location"),
            ("function", 5, repeated, kind.TYPE_MESSAGE, "Function"),
            ("string_table", 6, repeated, kind.TYPE_STRING, ""),
            ("duration_nanos", 10, optional, kind.TYPE_INT64, ""),
        ],
        "ValueType": [
            ("type", 1, optional, kind.TYPE_INT64, ""),
            ("unit", 2, optional, kind.TYPE_INT64, ""),
        ],
        "Sample": [
            ("location_id", 1, repeated, kind.TYPE_UINT64, ""),
            ("value", 2, repeated, kind.TYPE_INT64, ""),
        ],
        "Location": [
            ("id", 1, optional, kind.TYPE_UINT64, ""),
            ("line", 4, repeated, kind.TYPE_MESSAGE, "Line"),
        ],
        "Line": [("function_id", 1, optional, kind.TYPE_UINT64, "")],
        "Function": [
            ("id", 1, optional, kind.TYPE_UINT64, ""),
            ("name", 2, optional, kind.TYPE_INT64, ""),
        ],
    }
    for name, fields in messages.items():
        message = proto.message_type.add(name=name)
        for field, number, label, ftype, type_name in fields:
            added = message.field.add(name=field, number=number, label=label, type=ftype)
            if type_name:
                added.type_name = f".coordinator_bench_pprof.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("coordinator_bench_pprof.Profile")
    )


_PROFILE = _profile_class()


@dataclass(frozen=True)
class EtcdProfile:
    """CPU nanoseconds sampled per area, and how long the profile ran."""

    cpu_ns: dict[str, int]
    seconds: float

    @property
    def total_ns(self) -> int:
        return sum(self.cpu_ns.values())


def record(client_url: str, seconds: int) -> bytes:
    """etcd's CPU profile over the next ``seconds`` (blocks that long); etcd must run with
    ``--enable-pprof``."""
    url = f"{client_url}/debug/pprof/profile?seconds={seconds}"
    with urllib.request.urlopen(url, timeout=seconds + 60) as answer:
        data: bytes = answer.read()
    return data


def areas(raw: bytes) -> EtcdProfile:
    """The profile's CPU by area (``raw``: gzipped, as etcd serves it)."""
    profile = _PROFILE()
    profile.ParseFromString(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    strings = list(profile.string_table)
    names = {f.id: strings[f.name] for f in profile.function}
    frames = {loc.id: [names[line.function_id] for line in loc.line] for loc in profile.location}
    units = [strings[t.type] for t in profile.sample_type]
    column = units.index("cpu") if "cpu" in units else len(units) - 1
    cpu_ns = {name: 0 for name, _ in AREAS} | {OTHER: 0}
    for sample in profile.sample:
        stack = " ".join(f for lid in sample.location_id for f in frames.get(lid, ()))
        area = next((name for name, pats in AREAS if any(p in stack for p in pats)), OTHER)
        cpu_ns[area] += sample.value[column]
    return EtcdProfile(cpu_ns, profile.duration_nanos / 1e9)


def summarize(profile: EtcdProfile, cycles: int) -> str:
    """A markdown table: each area's share of etcd's sampled CPU and its microseconds a cycle."""
    total = max(profile.total_ns, 1)
    lines = [
        f"## etcd: {profile.total_ns / 1e9:.2f} s of CPU sampled in {profile.seconds:.0f} s, "
        "by area",
        "",
        "| area | % | us/cycle |",
        "| --- | ---: | ---: |",
    ]
    for name, ns in sorted(profile.cpu_ns.items(), key=lambda item: -item[1]):
        lines.append(f"| {name} | {100 * ns / total:.1f} | {ns / 1000 / max(cycles, 1):.0f} |")
    return "\n".join([*lines, ""])
