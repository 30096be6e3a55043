"""Frozen records stored in etcd, and their JSON codec.

Records are JSON (not protobuf) so that `etcdctl get` and `coordinator doctor` show them as they
are; unknown fields are ignored on read, so a newer writer does not break an older reader.
Revisions that etcd assigns (state_version, claim_generation of a fresh claim) are not stored in
the value but attached on decode from the key's metadata: the claim transaction cannot know its
own revision before it commits.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from enum import Enum, IntEnum
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import orjson

from coordinator.domain.json_values import (
    base64_text,
    converter,
    enum_name,
    finite,
    stdlib_encode,
    to_json,
)
from coordinator.domain.states import AttemptEnd, DeadLetterReason, Op, TaskState

T = TypeVar("T")


class EffectIdScheme(IntEnum):
    """How a task's effect ids are made (domain/effect_ids.py); fixed when the task is created."""

    # H(task_id, revision, node, slot): tasks created before ids named the task's incarnation.
    V1 = 1
    # H(task_id, created_revision, revision, node, slot): every task created since.
    V2 = 2


@dataclass(frozen=True)
class TaskRecord:
    """The task record under {p}/tasks/{task_id}."""

    task_id: str
    queue: str
    input_digest: str
    state: TaskState
    revision: int = 1
    priority: int = 0
    input: bytes = b""
    # Generation of the latest claim. Stored as 0 by the claim txn itself, and then read as the
    # task key's mod_revision (which is the claim txn's revision) while the task is CLAIMED.
    claim_generation: int = 0
    scheduler_epoch: int = 0
    attempt: int = 0
    attempt_id: str = ""
    owner_id: str = ""
    lease_id: int = 0
    cancel_generation: int = 0
    result_commit_id: str = ""
    result_digest: str = ""
    root_task_id: str = ""
    parent_task_id: str = ""
    thread_key: str = ""
    depends_on: tuple[str, ...] = ()
    # "{upstream}@{revision}" of each upstream round whose DONE released this task (set by the
    # release txn, which compares those upstream records; empty while WAITING).
    satisfied_by: tuple[str, ...] = ()
    requires_review: bool = False
    non_replayable: bool = False
    # Position in the ready index while READY (the ready key is derived from it).
    ready_seq: int = 0
    # When this revision of the task became READY (kept across reclaim, release and approval,
    # so READY -> canonical commit counts every attempt); 0 if it never was.
    ready_at: float = 0.0
    created_at: float = 0.0
    updated_at: float = 0.0
    # The retry policy, resolved when the task was created (domain/retry.py). A record written
    # before retry policies existed reads max_attempts 0: unlimited, as it was.
    max_attempts: int = 0
    initial_backoff: float = 0.0
    backoff_multiplier: float = 2.0
    max_backoff: float = 300.0
    non_retryable_errors: tuple[str, ...] = ()
    # Read as 0 from a record written before jitter existed: its waits stay as they were.
    backoff_jitter: float = 0.0
    # The attempt count when the current budget began (a new input, a RetryTask): attempts
    # counted against max_attempts are attempt - attempts_base.
    attempts_base: int = 0
    # While DELAYED: when it becomes READY (its key in the delayed index sorts by it).
    not_before: float = 0.0
    # What ended the latest attempt without a result ("lease expired", "released: ...",
    # "{code}: {message}"); and, while FAILED, why.
    last_error: str = ""
    # The error code its holder reported (Fail) when that attempt failed, "" for any other end:
    # what a bulk RetryTasks filters on, so it never parses last_error.
    last_error_code: str = ""
    dead_letter_reason: DeadLetterReason = DeadLetterReason.NONE
    # created_at + schedule_to_close (0: none): past it a task that can run is FAILED; its key
    # in the deadline index sorts by it while the task waits for a result (domain/waiting.py:
    # a WAITING task is marked overdue instead, and released without it).
    deadline: float = 0.0
    # The effect id scheme; a record written before schemes existed reads V1, and its effects
    # keep the ids they were prepared with. TaskStore.create writes V2.
    effect_ids: EffectIdScheme = EffectIdScheme.V1
    # While WAITING: the upstreams (in depends_on order) that are FAILED or CANCELLED, so this
    # task cannot be released until they are retried or its edges change. Set and cleared by
    # the releaser; empty outside WAITING.
    blocked_by: tuple[str, ...] = ()
    # When the deadline passed while the task was WAITING (0: never). Kept after the release,
    # which waived the deadline: it says why the task runs without one.
    overdue_at: float = 0.0
    # Schema 2 (domain/versions.py): the input lives in ``{p}/inputs/{id}``, written by the
    # create and by UpdateInput only; the stored record carries an empty input, and a reader
    # that hands the input out joins the key in (store/task_inputs.py). False for a record whose
    # input is inside it (schema 1, and every record written before that schema was raised).
    input_in_key: bool = False
    # Schema 3 (domain/versions.py): the current attempt (``attempt_id``) has no key of its own;
    # this record describes it (domain/attempt_in_record.py): RUNNING while CLAIMED, else
    # COMMITTED. Only a claim and a commit write a record with it set, so the record holds
    # nothing the attempt does not: it ran on the record's revision and digest, and a committed
    # one ended at the commit's ``updated_at``. Every other move writes the attempt's key first
    # (store/transition.py). Not stored while False: earlier records stay byte for byte.
    attempt_in_record: bool = False
    # The current attempt's lease TTL and start, kept only with ``attempt_in_record``.
    attempt_ttl: int = 0
    attempt_started_at: float = 0.0
    # etcd mod_revision of the task key; never stored, attached on decode.
    state_version: int = field(default=0, compare=False)
    # etcd create_revision of the task key: which incarnation of the task id this is (an id
    # created again after its tombstone expired is another); never stored, attached on decode.
    created_revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ClaimRecord:
    """The live claim under {p}/claims/{task_id}, attached to the claim's lease."""

    attempt_id: str
    owner_id: str
    lease_id: int
    ttl: int
    claimed_at: float
    # Renewals are refused once now + ttl would pass this (claimed_at + max_claim_duration).
    deadline: float
    stall_timeout: float
    progress: str = ""
    progress_at: float = 0.0
    # etcd create_revision of the claim key == the claim generation; attached on decode.
    generation: int = field(default=0, compare=False)
    # etcd mod_revision of the claim key (changes when progress is recorded).
    mod_revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt under {p}/attempts/{task_id}/{attempt_id}."""

    task_id: str
    attempt_id: str
    attempt: int
    owner_id: str
    revision: int
    input_digest: str
    scheduler_epoch: int
    ttl: int
    started_at: float
    # 0 when written by the claim txn: then it is the attempt key's create_revision.
    claim_generation: int = 0
    end: AttemptEnd = AttemptEnd.RUNNING
    ended_at: float = 0.0
    # The error its holder reported when it ended FAILED (WorkerService.Fail).
    error_code: str = ""
    error_message: str = ""
    error_details: bytes = b""
    # The holder's last checkpoint (RenewRequest.checkpoint), or the one it was handed by an
    # earlier attempt of the same revision: the next attempt resumes from it.
    checkpoint: bytes = b""
    # etcd mod_revision of the attempt key; 0 for an attempt its task record describes
    # (``recorded_attempt``: it has no key). Never stored, attached on decode.
    mod_revision: int = field(default=0, compare=False)


@dataclass(frozen=True)
class ResultRecord:
    """The canonical result of one task revision under {p}/results/{task_id}/{revision}."""

    task_id: str
    revision: int
    attempt_id: str
    claim_generation: int
    scheduler_epoch: int
    owner_id: str
    result_digest: str
    committed_at: float
    result: bytes = b""
    result_ref: str = ""
    # What the commit cites as evidence: managed job ids and their log refs (sdk/managed.py).
    evidence: tuple[str, ...] = ()

    @property
    def commit_id(self) -> str:
        """The id by which the task record names this commit."""
        return commit_id(self.attempt_id, self.claim_generation)


@dataclass(frozen=True)
class StagedResult:
    """A staged result under {p}/staging/{task_id}/{attempt_id}: isolated, never canonical."""

    task_id: str
    attempt_id: str
    revision: int
    claim_generation: int
    result_digest: str
    size: int
    staged_at: float
    result: bytes = b""
    result_ref: str = ""


@dataclass(frozen=True)
class EventRecord:
    """One transition under {p}/events/{task_id}/{prev_state_version}."""

    task_id: str
    op: Op
    to_state: TaskState
    at: float
    from_state: TaskState | None = None
    by: str = ""
    attempt_id: str = ""
    claim_generation: int = 0
    scheduler_epoch: int = 0
    detail: str = ""
    # The x-request-id of the call that made the transition ("" for background loops and for
    # events written before request ids existed): settles a lost response from etcd's history.
    request_id: str = ""


def commit_id(attempt_id: str, generation: int) -> str:
    """``{attempt_id}@{generation}``: names one canonical commit."""
    return f"{attempt_id}@{generation}"


def as_stored(task: TaskRecord) -> TaskRecord:
    """``task`` as its record is stored and read back: without the input when that lives in
    a key of its own (``input_in_key``), without the attempt's TTL and start when the record
    does not hold the attempt (``attempt_in_record``): encode leaves them out."""
    if task.input_in_key:
        task = with_changes(task, input=b"")
    if not task.attempt_in_record and (task.attempt_ttl or task.attempt_started_at):
        task = with_changes(task, attempt_ttl=0, attempt_started_at=0.0)
    return task


def encode(record: object) -> bytes:
    """Serialize a record to compact, key-sorted JSON.

    orjson writes what the stdlib codec of earlier versions wrote, byte for byte, but for
    non-ASCII text (UTF-8 instead of ``\\u`` escapes) and floats with an exponent (``1e16``, not
    ``1e+16``): the same JSON values, so either version reads the other's records
    (tests/domain/test_record_compat.py). Record JSON was 8-10% of the server's Python time
    under load, with the stdlib (issue 27).
    """
    cls: Any = type(record)
    attrs = record.__dict__
    out = {name: attrs[name] for name in _stored_fields(cls)}
    if out.get("input_in_key"):
        out["input"] = b""  # a TaskRecord's input lives in its own key: never stored twice
    elif "input_in_key" in out:
        del out["input_in_key"]  # a record of the first schema: byte for byte as before
    if "attempt_in_record" in out and not out["attempt_in_record"]:
        # as before schema 3, byte for byte
        del out["attempt_in_record"], out["attempt_ttl"], out["attempt_started_at"]
    for name, convert in _field_encoders(cls):
        value = out[name]
        if value is not None:
            out[name] = convert(value)
    try:
        data = orjson.dumps(out, default=to_json, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # An int past 64 bits or a lone surrogate, which orjson refuses: the stdlib writes them.
        return stdlib_encode(out)
    # orjson writes a non-finite float as null, which would read back as None: the stdlib keeps
    # it (as Infinity or NaN, which decode reads). Only a null is suspect, and one is rare.
    if b"null" in data and not all(finite(v) for v in out.values()):
        return stdlib_encode(out)
    return data


def decode(cls: type[T], data: bytes, **metadata: Any) -> T:
    """Parse a record; ``metadata`` sets the etcd-assigned fields (state_version, ...)."""
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError:
        # Infinity, NaN or a lone surrogate escape: valid for the stdlib codec that wrote it.
        raw = json.loads(data)
    names, converters = _decoding(cls)  # type: ignore[arg-type]
    # Unknown fields (from a newer writer) are left out; only typed fields need converting. The
    # keys are the fields' own names in their order: the dataclass __init__ then matches them
    # by identity, not by comparing strings (with the JSON's keys it cost more than the parse).
    kwargs = {name: raw[name] for name in names if name in raw}
    for name, convert in converters:
        if name in kwargs:
            kwargs[name] = convert(kwargs[name])
    kwargs.update(metadata)
    return _built(cls, kwargs)


def _built(cls: type[T], kwargs: dict[str, Any]) -> T:
    """``cls(**kwargs)``, without the ``__init__`` call where that is the same (``_copyable``,
    no default factory): the defaults, then ``kwargs``, into a new instance's dict (decode runs
    several times per claim and commit, and a TaskRecord's 44-keyword ``__init__`` was a third
    of it). Anything ``__init__`` would refuse (a name that is no field, a required field
    missing) still goes to it, to raise as it does."""
    kind: type = cls
    plan = _construction(kind)
    if plan is None or not plan[0].issuperset(kwargs) or not plan[2].issubset(kwargs):
        return cls(**kwargs)
    record: T = object.__new__(cls)
    state = record.__dict__
    state.update(plan[1])
    state.update(kwargs)
    return record


@functools.cache
def _construction(cls: type) -> tuple[frozenset[str], dict[str, Any], frozenset[str]] | None:
    """For a class ``_copyable`` admits with no default factory: its field names, their
    defaults and its required fields (None for any other class)."""
    names = _copyable(cls)
    if names is None:
        return None
    found = fields(cls)
    if any(f.default_factory is not MISSING for f in found):
        return None
    defaults = {f.name: f.default for f in found if f.default is not MISSING}
    return names, defaults, names - defaults.keys()


@functools.cache
def _stored_fields(cls: type) -> tuple[str, ...]:
    """The fields a record stores: etcd-assigned metadata (``compare=False``) never is."""
    return tuple(f.name for f in fields(cls) if f.compare)


@functools.cache
def _field_converters(cls: type) -> tuple[tuple[str, Callable[[Any], Any] | None], ...]:
    """Each field's JSON -> value conversion (None: the parsed value as is), built once from its
    resolved type hint: resolving hints per call cost more than the JSON parse, and decode runs
    several times per claim and commit."""
    hints = get_type_hints(cls)
    return tuple((f.name, converter(hints[f.name])) for f in fields(cls))


@functools.cache
def _field_encoders(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """The stored fields orjson would write otherwise than the stdlib codec did, each with its
    value -> JSON conversion: an enum (orjson writes its value; records hold its name) and bytes
    (base64). Tuples need none: orjson writes them as lists."""
    hints = get_type_hints(cls)
    out: list[tuple[str, Callable[[Any], str]]] = []
    for name in _stored_fields(cls):
        hint = hints[name]
        if get_origin(hint) in (Union, types.UnionType):
            (hint,) = [a for a in get_args(hint) if a is not type(None)]
        if isinstance(hint, type) and issubclass(hint, Enum):
            out.append((name, enum_name))
        elif hint is bytes:
            out.append((name, base64_text))
    return tuple(out)


@functools.cache
def _decoding(cls: type) -> tuple[tuple[str, ...], tuple[tuple[str, Callable[[Any], Any]], ...]]:
    """The field names of ``cls`` in order and the fields whose JSON value needs converting."""
    converters = tuple((n, c) for n, c in _field_converters(cls) if c is not None)
    return tuple(f.name for f in fields(cls)), converters


def with_changes(record: T, **changes: Any) -> T:
    """A copy of a frozen dataclass (a record, a view) with some fields changed.

    ``dataclasses.replace`` without its ``__init__`` call, at about a tenth of its cost (0.8
    against 11 µs on a TaskRecord; the store makes a dozen such copies per claim and commit).
    The result is the same for a class with no ``__post_init__``, no ``init=False`` field, no
    ``__slots__`` and no cached property (``_copyable``); any other falls back to ``replace``.
    A name that is not a field is a TypeError, as with ``replace``."""
    cls: type = type(record)
    names = _copyable(cls)
    if names is None:
        return replace(record, **changes)  # type: ignore[type-var]
    if not names.issuperset(changes):
        unknown = ", ".join(sorted(set(changes) - names))
        raise TypeError(f"{cls.__name__} has no field {unknown}")
    copy: T = object.__new__(cls)
    state = copy.__dict__
    state.update(record.__dict__)
    state.update(changes)
    return copy


@functools.cache
def _copyable(cls: type) -> frozenset[str] | None:
    """The field names of ``cls`` if copying its instance dict is what ``replace`` does."""
    if not is_dataclass(cls) or any("__slots__" in vars(k) for k in cls.__mro__[:-1]):
        return None
    if hasattr(cls, "__post_init__") or any(
        isinstance(value, functools.cached_property)
        for klass in cls.__mro__
        for value in vars(klass).values()
    ):
        return None
    found = fields(cls)
    if any(not f.init for f in found):
        return None
    return frozenset(f.name for f in found)


__all__ = [
    "AttemptRecord",
    "ClaimRecord",
    "EffectIdScheme",
    "EventRecord",
    "ResultRecord",
    "StagedResult",
    "TaskRecord",
    "commit_id",
    "decode",
    "encode",
    "with_changes",
]
