"""Records with every kind of field value, for the codec's compatibility test.

``records_v0.jsonl`` beside this file holds them as the stdlib-json codec (before orjson) wrote
them, one per line in this order: regenerate it only with that codec, never with the current one
(the point of the file is that it was written by the previous version).
"""

from __future__ import annotations

from typing import Any

from coordinator.domain.records import (
    AttemptRecord,
    ClaimRecord,
    EffectIdScheme,
    EventRecord,
    ResultRecord,
    StagedResult,
    TaskRecord,
)
from coordinator.domain.states import AttemptEnd, DeadLetterReason, Op, TaskState

SAMPLES: list[Any] = [
    TaskRecord(task_id="t1", queue="q", input_digest="sha256:00", state=TaskState.READY),
    TaskRecord(
        task_id="t-2",
        queue="emails",
        input_digest="sha256:ab",
        state=TaskState.FAILED,
        revision=3,
        priority=-5,
        input=b"\x00\xff payload",
        claim_generation=1234567,
        scheduler_epoch=2,
        attempt=4,
        attempt_id="a4-9f",
        owner_id="worker-\u00e9\u4e2d",  # non-ASCII: written as \\u escapes by stdlib json
        lease_id=7587890123456789012,
        cancel_generation=1,
        depends_on=("up1", "up2"),
        satisfied_by=("up1@3",),
        requires_review=True,
        non_replayable=True,
        ready_seq=99,
        ready_at=1764660000.123456,
        created_at=1764659999.5,
        updated_at=1e16,  # an exponent: 1e+16 in stdlib json
        max_attempts=5,
        initial_backoff=0.25,
        max_backoff=300.0,
        non_retryable_errors=("BAD_INPUT",),
        backoff_jitter=0.1,
        attempts_base=1,
        not_before=1.5e-7,
        last_error='E1: line\nwith "quotes" \\ and \x7f',
        last_error_code="E1",
        dead_letter_reason=DeadLetterReason.EXHAUSTED,
        deadline=1764663600.0,
        effect_ids=EffectIdScheme.V2,
        blocked_by=("up2",),
        overdue_at=0.0,
    ),
    ClaimRecord("a1-x", "w1", 42, 30, 1764660000.5, 1764663600.5, 60.0, "50%", 1764660001.0),
    AttemptRecord(
        task_id="t1",
        attempt_id="a1-x",
        attempt=1,
        owner_id="w1",
        revision=2,
        input_digest="sha256:00",
        scheduler_epoch=1,
        ttl=30,
        started_at=1764660000.5,
        claim_generation=77,
        end=AttemptEnd.FAILED,
        ended_at=1764660002.25,
        error_code="OOM",
        error_message="out of memory \u2603",
        error_details=b"\x01\x02",
        checkpoint=b"step=3",
    ),
    ResultRecord(
        "t1", 2, "a1-x", 77, 1, "w1", "sha256:cd", 1764660002.0, b'{"ok":true}', "", ("j1", "j2")
    ),
    StagedResult("t1", "a1-x", 2, 77, "sha256:cd", 11, 1764660001.75, b"", "s3://b/k"),
    EventRecord(task_id="t1", op=Op.CREATE, to_state=TaskState.READY, at=1764659999.5),
    EventRecord(
        task_id="t1",
        op=Op.COMMIT,
        to_state=TaskState.DONE,
        at=1764660002.0,
        from_state=TaskState.CLAIMED,
        by="w1",
        attempt_id="a1-x",
        claim_generation=77,
        scheduler_epoch=1,
        detail="committed",
        request_id="req-1",
    ),
]
