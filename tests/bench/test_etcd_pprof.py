"""etcd's CPU profile by area (bench/etcd_pprof.py): the decoding and sorting on a profile built
here, and a real etcd started with ``--enable-pprof`` through ``EtcdProcess(extra_args=...)``."""

from __future__ import annotations

import gzip
import threading
import urllib.error
import urllib.request

import etcd3
import pytest

from bench import etcd_pprof
from bench.procs import GRPC_OPTIONS
from coordinator.etcd_process import EtcdProcess, find_etcd_binary

_STACKS = {
    # innermost frame first, as pprof lists a sample's locations
    "gc": (["runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"], 700),
    "put": (
        [
            "go.etcd.io/etcd/mvcc.(*storeTxnWrite).put",
            "go.etcd.io/etcd/etcdserver.(*applierV3backend).Put",
            "go.etcd.io/etcd/etcdserver.(*EtcdServer).applyAll",
        ],
        200,
    ),
    "frame": (["go.etcd.io/etcd/etcdserver.(*EtcdServer).applyAll"], 50),
    "other": (["runtime.futex", "runtime.mcall"], 30),
}


def _profile(gzipped: bool) -> bytes:
    """A CPU profile as Go writes one: samples/count and cpu/nanoseconds, each stack's
    functions in the string table, locations pointing at them."""
    profile = etcd_pprof._PROFILE()
    strings = ["", "samples", "count", "cpu", "nanoseconds"]
    profile.sample_type.add(type=1, unit=2)
    profile.sample_type.add(type=3, unit=4)
    ids: dict[str, int] = {}
    for frames, cpu_ns in _STACKS.values():
        locations = []
        for name in frames:
            if name not in ids:
                ids[name] = len(ids) + 1
                strings.append(name)
                profile.function.add(id=ids[name], name=len(strings) - 1)
                profile.location.add(id=ids[name]).line.add(function_id=ids[name])
            locations.append(ids[name])
        profile.sample.add(location_id=locations, value=[cpu_ns // 10, cpu_ns])
    profile.string_table.extend(strings)
    profile.duration_nanos = 2_000_000_000
    raw = profile.SerializeToString()
    return gzip.compress(raw) if gzipped else raw


@pytest.mark.parametrize("gzipped", [True, False])
def test_each_sample_goes_to_the_first_area_its_stack_names(gzipped: bool) -> None:
    got = etcd_pprof.areas(_profile(gzipped))
    assert got.seconds == 2.0
    assert got.total_ns == 980
    nonzero = {area: ns for area, ns in got.cpu_ns.items() if ns}
    # The put is under applyAll too: the narrower area (listed first) takes it.
    assert nonzero == {
        "GC": 700,
        "apply: puts": 200,
        "apply: the rest (txn frame, backend commit)": 50,
        etcd_pprof.OTHER: 30,
    }


def test_the_summary_ranks_areas_with_their_share_and_microseconds_a_cycle() -> None:
    profile = etcd_pprof.EtcdProfile({"GC": 600_000, "apply: puts": 400_000, "watches": 0}, 10.0)
    lines = etcd_pprof.summarize(profile, cycles=100).splitlines()
    assert lines[0] == "## etcd: 0.00 s of CPU sampled in 10 s, by area"
    assert lines[4:] == [
        "| GC | 60.0 | 6 |",
        "| apply: puts | 40.0 | 4 |",
        "| watches | 0.0 | 0 |",
    ]


def test_a_real_etcd_serves_its_profile_only_when_started_with_the_extra_flag() -> None:
    with EtcdProcess(binary=find_etcd_binary()) as plain:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{plain.client_url}/debug/pprof/", timeout=10)
        assert missing.value.code == 404
    with EtcdProcess(binary=find_etcd_binary(), extra_args=["--enable-pprof"]) as etcd:
        client = etcd3.client(etcd.host, etcd.port, timeout=30, grpc_options=GRPC_OPTIONS)
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                client.put(f"/pprof/{n % 100}", b"x" * 100)

        writer = threading.Thread(target=load, daemon=True)
        writer.start()
        try:
            got = etcd_pprof.areas(etcd_pprof.record(etcd.client_url, 2))
        finally:
            stop.set()
            writer.join()
            client.close()
    assert 1.9 <= got.seconds <= 6.0
    assert set(got.cpu_ns) == {name for name, _ in etcd_pprof.AREAS} | {etcd_pprof.OTHER}
    # Two seconds of puts: samples, and some of them in the areas etcd's stacks name.
    assert got.total_ns > got.cpu_ns[etcd_pprof.OTHER] >= 0
