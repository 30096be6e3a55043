"""The etcd database-size watch: a gauge, a warning, and the space guard's state.

etcd refuses all writes (``NOSPACE``, an alarm an operator must disarm) once its database passes
``--quota-backend-bytes`` (2 GiB by default). Every replica asks etcd's Status RPC for ``dbSize``
every ``interval`` seconds, publishes ``coordinator_etcd_db_size_bytes`` and
``coordinator_etcd_quota_ratio``, and logs a warning when the ratio passes ``warn_ratio``: on
crossing it, and again every ``_REPEAT`` seconds while it stays above. The db only shrinks after
compaction and defragmentation, so a ratio that stays high with the pruner keeping up means
etcd needs a defrag (``etcdctl defrag``), not a shorter retention.

Each reading (with etcd's alarm list) also sets the state of the connection's space guard
(store/etcd/space_guard.py): above ``high_water`` of the quota writes that only add data are
refused beyond each caller's high-water share, above ``full`` all of them, at an active NOSPACE
alarm every put is; and, above the mark, ``trim`` (store/etcd/history_trim.py) compacts etcd's
history so the db stops growing. The first reading (and one after etcd's version changed) warns
if etcd is a version that refuses every txn at NOSPACE, deletes included (3.5.0 to 3.5.6).
"""

from __future__ import annotations

import threading
import time

import structlog

from coordinator.domain.space import SpaceState, refuses_every_txn_at_nospace, space_state
from coordinator.errors import StoreRefused
from coordinator.metrics import METRICS, Metrics
from coordinator.store.etcd.history_trim import HistoryTrim
from coordinator.store.etcd.kv import EtcdKV

log = structlog.get_logger(__name__)

DEFAULT_INTERVAL = 5.0
# While above the ratio, the warning repeats this often (a log line per check would flood).
_REPEAT = 600.0


class DbSizeWatch:
    """Polls etcd's db size and alarms; warns above ``warn_ratio`` of ``quota_bytes``, and
    sets the space guard's state from ``high_water``."""

    name = "etcd-db-size"

    def __init__(
        self,
        kv: EtcdKV,
        *,
        quota_bytes: int,
        warn_ratio: float,
        high_water: float = 0.8,
        full: float = 1.0,
        interval: float = DEFAULT_INTERVAL,
        trim: HistoryTrim | None = None,
        metrics: Metrics = METRICS,
    ) -> None:
        self._kv = kv
        self._metrics = metrics
        self._quota = quota_bytes
        self._warn_ratio = warn_ratio
        self._high_water = high_water
        self._full = full
        self._trim = trim
        self._alarm_refused = False
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_at: float | None = None
        self._version = ""  # etcd's, as last read: a change (a rolling upgrade) is checked

    def start(self) -> None:
        """Check now, then every interval."""
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def check(self) -> float:
        """Read the size and alarms once, publish them, warn if needed; returns the quota
        ratio."""
        size, revision, version = self._kv.db_status()
        if version != self._version:
            self._version = version
            if refuses_every_txn_at_nospace(version):
                log.warning(
                    "this etcd refuses every txn while its NOSPACE alarm is up, deletes "
                    "included: at the quota the pool keeps reading and renewing, but nothing "
                    "it deletes frees space until the alarm is disarmed",
                    etcd_version=version,
                    hint="run etcd 3.5.7 or later (docs/retention.md)",
                )
        alarm = self._nospace_alarm(size)
        state = space_state(
            db_size=size,
            quota_bytes=self._quota,
            high_water=self._high_water,
            full=self._full,
            nospace_alarm=alarm,
        )
        self._kv.space.observe(state)
        if self._trim is not None:
            self._trim.observe(revision, state)
        ratio = size / self._quota
        self._metrics.etcd_db_size.set(size)
        self._metrics.etcd_quota_ratio.set(ratio)
        now = time.monotonic()
        if ratio < self._warn_ratio:
            if self._warned_at is not None:
                log.info("etcd db size back below the warning ratio", ratio=round(ratio, 3))
            self._warned_at = None
        elif self._warned_at is None or now - self._warned_at >= _REPEAT:
            log.warning(
                "etcd db size is near its quota; at the quota etcd refuses every write",
                db_size_bytes=size,
                quota_bytes=self._quota,
                ratio=round(ratio, 3),
                hint="check the pruner (coordinator_pruned_tasks_total, retention), then "
                "compact and defragment etcd",
            )
            self._warned_at = now
        return ratio

    def _nospace_alarm(self, size: int) -> bool:
        """etcd's NOSPACE alarm. Where etcd will not list alarms to this user (an etcd that
        keeps Maintenance to the root role), a NOSPACE the guard learnt from etcd's own
        refusal is kept while the db stays above the high-water mark: cleared on a guess,
        the puts nested in group commit's batches would reach a full etcd again."""
        try:
            return self._kv.nospace_alarm()
        except StoreRefused as exc:
            if not self._alarm_refused:
                log.warning("etcd refuses to list its alarms to this user", error=str(exc))
                self._alarm_refused = True
        tripped = self._kv.space.state is SpaceState.NOSPACE
        return tripped and size >= self._high_water * self._quota

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # etcd outage: the health checker reports it
                log.warning("background work failed", loop=self.name, error=str(exc))
            self._stop.wait(self._interval)
