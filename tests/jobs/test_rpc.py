"""StartJob, FinishJob and ListJobs over gRPC against a real store.

StartJob is an acceptance point: a superseded attempt's start is FENCED and writes nothing.
FinishJob records evidence even after the claim is lost, once: a terminal record never
changes. ListJobs says, per job, whether its attempt still holds the claim. Bad input is refused
with the field named and the keyspace untouched (count of keys and highest mod_revision).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from coordinator.domain.jobs import MAX_EVIDENCE, JobRecord, JobState
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import ResultRecord, decode
from coordinator.metrics import AcceptancePoint
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.helpers import eventually

Claim = worker_pb2.ClaimResponse
Probe = Callable[[], tuple[int, int]]
WORKER_A = (("x-coordinator-principal", "worker-a"), ("x-coordinator-roles", "worker"))
WORKER_B = (("x-coordinator-principal", "worker-b"), ("x-coordinator-roles", "worker"))
ADMIN = (("x-coordinator-principal", "root"), ("x-coordinator-roles", "admin"))
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def start_request(claim: Claim, job_id: str = "j-1", **changes: Any) -> worker_pb2.StartJobRequest:
    fields: dict[str, Any] = {
        "fence": claim.fence,
        "job_id": job_id,
        "host": "box-1",
        "pid": 4242,
        "start_ticks": 777,
        "argv": ["make", "test"],
        "log_ref": f"/var/log/jobs/{job_id}.log",
    }
    fields.update(changes)
    return worker_pb2.StartJobRequest(**fields)


def stored_job(etcd_client: Any, prefix: str, task_id: str, job_id: str) -> JobRecord | None:
    value, meta = etcd_client.get(Keyspace(prefix).job(task_id, job_id))
    return decode(JobRecord, value, mod_revision=meta.mod_revision) if value else None


def supersede(store: Store, worker: worker_pb2_grpc.WorkerServiceStub, claim: Claim) -> Claim:
    """End worker-a's claim (its lease revoked, as on expiry) and let worker-b claim t-1."""
    claim_kv = store.ctx.kv.get(store.ctx.keys.claim("t-1"))
    assert claim_kv is not None
    store.ctx.kv.revoke(claim_kv.lease)
    request = worker_pb2.ClaimRequest(
        task_id="t-1", scheduler_epoch=claim.fence.scheduler_epoch, ttl_seconds=30
    )

    def take() -> Claim | None:  # the reclaimer may be moving the task back to READY meanwhile
        taken = worker.Claim(request, metadata=WORKER_B)
        return taken if taken.outcome == types_pb2.OUTCOME_CLAIMED else None

    taken = eventually(take, timeout=5)
    assert taken is not None
    assert taken.fence.claim_generation > claim.fence.claim_generation
    return taken


def test_start_writes_the_record_and_the_worker_index(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, etcd_client: Any, prefix: str
) -> None:
    response = worker.StartJob(start_request(claimed), metadata=WORKER_A)
    assert response.outcome == types_pb2.OUTCOME_OK, response.message
    assert response.job.state == worker_pb2.JOB_STATE_RUNNING
    record = stored_job(etcd_client, prefix, "t-1", "j-1")
    assert record is not None
    assert (record.worker_id, record.attempt_id, record.claim_generation) == (
        "worker-a",
        claimed.fence.attempt_id,
        claimed.fence.claim_generation,
    )
    assert (record.pid, record.start_ticks, record.argv) == (4242, 777, ("make", "test"))
    assert record.state is JobState.RUNNING and record.started_at > 0
    index, _ = etcd_client.get(Keyspace(prefix).worker_job("worker-a", "j-1"))
    assert index == b"t-1"

    # A retry of the same start (its first answer lost) is OK again and writes nothing new.
    again = worker.StartJob(start_request(claimed), metadata=WORKER_A)
    assert again.outcome == types_pb2.OUTCOME_OK
    assert stored_job(etcd_client, prefix, "t-1", "j-1") == record
    # Another start under the same job id is a conflict.
    with pytest.raises(grpc.RpcError) as info:
        worker.StartJob(start_request(claimed, pid=5000), metadata=WORKER_A)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "j-1" in str(info.value.details())


def test_a_job_id_names_one_job_of_a_worker_across_tasks(
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    claimed: Claim,
    keyspace: Probe,
) -> None:
    assert worker.StartJob(start_request(claimed), metadata=WORKER_A).outcome == 1
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-2"))
    other = worker.Claim(
        worker_pb2.ClaimRequest(
            task_id="t-2", scheduler_epoch=claimed.fence.scheduler_epoch, ttl_seconds=30
        ),
        metadata=WORKER_A,
    )
    assert other.outcome == types_pb2.OUTCOME_CLAIMED
    before = keyspace()
    with pytest.raises(grpc.RpcError) as info:
        worker.StartJob(start_request(other), metadata=WORKER_A)  # the same job id "j-1"
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already used by 'worker-a' for task 't-1'" in str(info.value.details())
    assert keyspace() == before


def test_start_of_a_superseded_attempt_is_fenced_and_writes_nothing(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    store: Store,
    keyspace: Probe,
    etcd_client: Any,
    prefix: str,
) -> None:
    supersede(store, worker, claimed)
    before = keyspace()
    response = worker.StartJob(start_request(claimed), metadata=WORKER_A)
    assert (response.outcome, response.reason) == (
        types_pb2.OUTCOME_FENCED,
        types_pb2.FENCE_REASON_SUPERSEDED,
    )
    assert not response.HasField("job")
    assert keyspace() == before
    assert stored_job(etcd_client, prefix, "t-1", "j-1") is None


def test_start_is_counted_as_a_validated_acceptance(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, store: Store
) -> None:
    def start_job_counts() -> tuple[int, int]:
        coverage = store.ctx.metrics.fence_coverage()
        (point,) = [p for p in coverage if p.point is AcceptancePoint.START_JOB]
        return point.accepted, point.validated

    assert start_job_counts() == (0, 0)
    assert worker.StartJob(start_request(claimed), metadata=WORKER_A).outcome == 1
    assert start_job_counts() == (1, 1)


def test_finish_after_the_claim_is_lost_records_once_and_never_changes_an_end(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    store: Store,
    keyspace: Probe,
    etcd_client: Any,
    prefix: str,
) -> None:
    assert worker.StartJob(start_request(claimed), metadata=WORKER_A).outcome == 1
    supersede(store, worker, claimed)  # evidence is recorded even for a lost claim

    finish = worker_pb2.FinishJobRequest(
        task_id="t-1", job_id="j-1", state=worker_pb2.JOB_STATE_KILLED, exit_code=-15, detail="x"
    )
    first = worker.FinishJob(finish, metadata=WORKER_A)
    assert first.recorded and first.job.state == worker_pb2.JOB_STATE_KILLED
    ended = stored_job(etcd_client, prefix, "t-1", "j-1")
    assert ended is not None and ended.state is JobState.KILLED and ended.exit_code == -15
    assert ended.ended_at > 0

    # Any later report, the same or another end, leaves the record exactly as it is.
    before = keyspace()
    for state, code in ((worker_pb2.JOB_STATE_EXITED, 0), (worker_pb2.JOB_STATE_KILLED, -15)):
        later = worker_pb2.FinishJobRequest(
            task_id="t-1", job_id="j-1", state=state, exit_code=code
        )
        answer = worker.FinishJob(later, metadata=WORKER_A)
        assert not answer.recorded
        assert (answer.job.state, answer.job.exit_code) == (worker_pb2.JOB_STATE_KILLED, -15)
    assert keyspace() == before
    after = stored_job(etcd_client, prefix, "t-1", "j-1")
    assert after == ended and after is not None and after.mod_revision == ended.mod_revision


def test_only_the_jobs_worker_may_finish_it_and_list_it(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, keyspace: Probe
) -> None:
    assert worker.StartJob(start_request(claimed), metadata=WORKER_A).outcome == 1
    before = keyspace()
    finish = worker_pb2.FinishJobRequest(
        task_id="t-1", job_id="j-1", state=worker_pb2.JOB_STATE_EXITED
    )
    with pytest.raises(grpc.RpcError) as info:
        worker.FinishJob(finish, metadata=WORKER_B)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as info:
        worker.ListJobs(worker_pb2.ListJobsRequest(worker_id="worker-a"), metadata=WORKER_B)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert keyspace() == before
    # An admin may list any worker's jobs.
    listed = worker.ListJobs(worker_pb2.ListJobsRequest(worker_id="worker-a"), metadata=ADMIN)
    assert [s.job.job_id for s in listed.jobs] == ["j-1"]


def test_list_says_whether_each_jobs_attempt_is_current(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, store: Store
) -> None:
    for job_id in ("j-1", "j-2"):
        assert worker.StartJob(start_request(claimed, job_id), metadata=WORKER_A).outcome == 1

    def listed(metadata: Any) -> list[tuple[str, bool, int]]:
        response = worker.ListJobs(worker_pb2.ListJobsRequest(), metadata=metadata)
        return [(s.job.job_id, s.current, s.job.state) for s in response.jobs]

    running = worker_pb2.JOB_STATE_RUNNING
    assert listed(WORKER_A) == [("j-1", True, running), ("j-2", True, running)]
    taken = supersede(store, worker, claimed)
    assert listed(WORKER_A) == [("j-1", False, running), ("j-2", False, running)]
    assert listed(WORKER_B) == []
    mine = worker.StartJob(start_request(taken, "j-3"), metadata=WORKER_B)
    assert mine.outcome == types_pb2.OUTCOME_OK
    assert listed(WORKER_B) == [("j-3", True, running)]


def test_commit_keeps_its_evidence_in_the_result_record(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, etcd_client: Any, prefix: str
) -> None:
    request = worker_pb2.CommitRequest(
        fence=claimed.fence,
        input_digest=claimed.input_digest,
        result=b"ok",
        evidence=["j-1", "/var/log/jobs/j-1.log"],
    )
    assert worker.Commit(request, metadata=WORKER_A).outcome == types_pb2.OUTCOME_COMMITTED
    (value, _), *rest = list(etcd_client.get_prefix(f"{prefix}/results/t-1/"))
    assert rest == []
    assert decode(ResultRecord, value).evidence == ("j-1", "/var/log/jobs/j-1.log")


# --- bad input: the field named, nothing written ---------------------------------------------


def _start(claim: Claim, **changes: Any) -> Message:
    return start_request(claim, **changes)


START_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("no fence", {"fence": None}, "fence is required"),
    ("no job id", {"job_id": ""}, "job_id is required"),
    ("bad job id", {"job_id": "a/b"}, "job_id must be"),
    ("no argv", {"argv": []}, "argv is required"),
    ("empty command", {"argv": [""]}, "argv[0]"),
    ("no host", {"host": ""}, "host is required"),
    ("no pid", {"pid": 0}, "pid is required"),
    ("negative pid", {"pid": -3}, "pid must be > 0"),
    ("no start time", {"start_ticks": 0}, "start_ticks is required"),
    ("no log", {"log_ref": ""}, "log_ref is required"),
]


@pytest.mark.parametrize(("case", "changes", "named"), START_CASES, ids=[c[0] for c in START_CASES])
def test_start_job_bad_input(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    keyspace: Probe,
    case: str,
    changes: dict[str, Any],
    named: str,
) -> None:
    del case
    request = start_request(claimed)
    for name, value in changes.items():
        if value is None:
            request.ClearField(name)  # type: ignore[arg-type]
        elif isinstance(value, list):
            del getattr(request, name)[:]
            getattr(request, name).extend(value)
        else:
            setattr(request, name, value)
    before = keyspace()
    with pytest.raises(grpc.RpcError) as info:
        worker.StartJob(request, metadata=WORKER_A)
    assert info.value.code() == INVALID, info.value.details()
    assert named in str(info.value.details())
    assert keyspace() == before


FINISH_CASES: list[tuple[str, dict[str, Any], grpc.StatusCode, str]] = [
    ("no task", {"task_id": ""}, INVALID, "task_id is required"),
    ("no job", {"job_id": ""}, INVALID, "job_id is required"),
    ("no state", {"state": 0}, INVALID, "state is required"),
    ("running", {"state": worker_pb2.JOB_STATE_RUNNING}, INVALID, "JOB_STATE_RUNNING"),
    ("unknown state", {"state": 9}, INVALID, "not a known JobState"),
    ("long detail", {"detail": "d" * 2000}, INVALID, "detail is 2000"),
    ("unknown job", {"job_id": "j-404"}, grpc.StatusCode.NOT_FOUND, "j-404"),
]


@pytest.mark.parametrize(
    ("case", "changes", "code", "named"), FINISH_CASES, ids=[c[0] for c in FINISH_CASES]
)
def test_finish_job_bad_input(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    keyspace: Probe,
    case: str,
    changes: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
) -> None:
    del case
    assert worker.StartJob(start_request(claimed), metadata=WORKER_A).outcome == 1
    fields: dict[str, Any] = {
        "task_id": "t-1",
        "job_id": "j-1",
        "state": worker_pb2.JOB_STATE_EXITED,
        **changes,
    }
    before = keyspace()
    with pytest.raises(grpc.RpcError) as info:
        worker.FinishJob(worker_pb2.FinishJobRequest(**fields), metadata=WORKER_A)
    assert info.value.code() == code, info.value.details()
    assert named in str(info.value.details())
    assert keyspace() == before


@pytest.mark.parametrize(
    ("evidence", "named"),
    [([""], "evidence[0] is empty"), (["e"] * (MAX_EVIDENCE + 1), "evidence has 65")],
)
def test_commit_bad_evidence(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    keyspace: Probe,
    evidence: list[str],
    named: str,
) -> None:
    request = worker_pb2.CommitRequest(
        fence=claimed.fence, input_digest=claimed.input_digest, result=b"ok", evidence=evidence
    )
    before = keyspace()
    with pytest.raises(grpc.RpcError) as info:
        worker.Commit(request, metadata=WORKER_A)
    assert info.value.code() == INVALID
    assert named in str(info.value.details())
    assert keyspace() == before


def test_list_jobs_bad_worker_id(worker: worker_pb2_grpc.WorkerServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        worker.ListJobs(worker_pb2.ListJobsRequest(worker_id="a/b"), metadata=ADMIN)
    assert info.value.code() == INVALID
    assert "worker_id must be" in str(info.value.details())


def test_admin_cannot_start_jobs(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, keyspace: Probe
) -> None:
    before = keyspace()
    with pytest.raises(grpc.RpcError) as info:
        worker.StartJob(start_request(claimed), metadata=ADMIN)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert keyspace() == before
