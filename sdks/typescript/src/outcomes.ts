/**
 * Typed results of worker calls. Business outcomes are results, never errors (types.proto):
 * a FENCED commit is a CommitOutcome whose `committed` is false, with the reason. Enum values
 * are the proto's own (`Outcome[outcome]` is the name without prefix: "FENCED").
 */
import type { Timestamp } from "@bufbuild/protobuf/wkt";

import type { TaskResult } from "./gen/coordinator/v1/tasks_pb.js";
import {
  type Attempt,
  type AttemptEnd,
  type DeadLetterReason,
  FenceReason,
  Outcome,
  type Task,
  type TaskState,
} from "./gen/coordinator/v1/types_pb.js";
import { type TaskRetryPolicy, policyOf } from "./tasks.js";

export {
  AttemptEnd,
  DeadLetterReason,
  EffectAction,
  EffectState,
  FenceReason,
  Outcome,
  TaskState,
} from "./gen/coordinator/v1/types_pb.js";

/** Which call learned that a claim was lost. */
export type LossSource =
  | "renew"
  | "commit"
  | "stage"
  | "authorize"
  | "release"
  | "fail"
  | "effect"
  | "local_expiry"
  | "error";

/** Why a claim was lost: the coordinator's outcome and fence reason, and who learned it. */
export interface LostReason {
  readonly outcome: Outcome;
  readonly reason: FenceReason;
  readonly message: string;
  readonly source: LossSource;
  readonly taskId: string;
}

/** "FENCED/SUPERSEDED via renew: ...", "CANCELLED via renew: ..." (no reason: none given). */
export function describeLoss(lost: LostReason): string {
  const reason = lost.reason ? `/${FenceReason[lost.reason]}` : "";
  return `${Outcome[lost.outcome]}${reason} via ${lost.source}: ${lost.message}`;
}

/** A claim the coordinator did not grant (NO_READY_TASK, ALREADY_CLAIMED, CLAIMS_PAUSED, ...). */
export class ClaimRefused {
  constructor(
    readonly outcome: Outcome,
    readonly reason: FenceReason,
    readonly message: string,
  ) {}

  /** "NO_READY_TASK" etc. */
  toString(): string {
    return `${Outcome[this.outcome]}${this.reason ? `/${FenceReason[this.reason]}` : ""}: ${this.message}`;
  }
}

/** What a fenced call answered: its outcome, the fence reason and a sentence for people. */
export interface Answer {
  readonly outcome: Outcome;
  readonly reason: FenceReason;
  readonly message: string;
}

/** A Commit's answer. `committed`: the result is canonical (COMMITTED); otherwise the claim is
 * lost (FENCED, STALE_INPUT, CANCELLED) and `reason` says why. */
export interface CommitOutcome<C = unknown> extends Answer {
  readonly committed: boolean;
  /** "{attempt_id}@{claim_generation}" of the canonical commit. */
  readonly commitId: string;
  /** DONE, or REVIEW when review is required. */
  readonly state: TaskState;
  /** What `next` claimed (empty without `next`, or when nothing was ready). */
  readonly next: C[];
  /** Why `next` claimed nothing (undefined without `next`, or when it claimed). */
  readonly nextRefused: ClaimRefused | undefined;
}

/** A Fail's answer. `recorded`: the failure was recorded and `state` says where the task went
 * (READY, DELAYED, or FAILED: the dead letter). */
export interface FailOutcome extends Answer {
  readonly recorded: boolean;
  readonly state: TaskState;
  readonly nextEligibleAt: Date | undefined;
}

/** A Release's answer. */
export interface ReleaseOutcome extends Answer {
  readonly released: boolean;
}

/** A StageResult's answer; `current`: whether the attempt still held the claim. */
export interface StageOutcome extends Answer {
  readonly staged: boolean;
  readonly current: boolean;
}

/** An AuthorizeTool answer: run the tool only when `allowed`. */
export interface ToolAuthorization extends Answer {
  readonly allowed: boolean;
}

/** A task as the coordinator stores it. */
export interface TaskInfo {
  readonly taskId: string;
  readonly queue: string;
  readonly state: TaskState;
  readonly revision: bigint;
  readonly stateVersion: bigint;
  readonly input: Uint8Array;
  readonly inputDigest: string;
  /** The attempt number of the latest attempt (0 before the first claim). */
  readonly attempt: number;
  readonly claimGeneration: bigint;
  /** Attempts counted against its retry policy (a shutdown's give-back is not one). */
  readonly attemptsCounted: number;
  readonly lastError: string;
  readonly resultDigest: string;
  /** The tasks it waits for (WAITING until each is DONE). */
  readonly dependsOn: readonly string[];
  /** Upstreams that ended FAILED or CANCELLED: a WAITING task blocked by them. */
  readonly blockedBy: readonly string[];
  readonly priority: number;
  /** The holder's principal while CLAIMED. */
  readonly ownerId: string;
  /** Its retry policy as resolved at its creation (its own, else its queue's or the server's). */
  readonly retryPolicy: Required<TaskRetryPolicy> | undefined;
  /** While DELAYED: when it becomes READY. */
  readonly nextEligibleAt: Date | undefined;
  /** Creation + schedule_to_close, if it has one. */
  readonly deadline: Date | undefined;
  /** Why a FAILED task is (EXHAUSTED, NON_RETRYABLE, TIMED_OUT). */
  readonly deadLetterReason: DeadLetterReason;
  /** The error code of the failure that ended its latest attempt ("" for any other end). */
  readonly lastErrorCode: string;
  /** When its deadline passed while it was WAITING. */
  readonly overdueAt: Date | undefined;
  readonly createdAt: Date | undefined;
  readonly updatedAt: Date | undefined;
  /** Bytes of the checkpoint its next attempt resumes from (getTask; undefined where the
   * answer did not say, as in listTasks). */
  readonly checkpointSize: number | undefined;
}

/** One attempt of a task, as the coordinator recorded it. */
export interface AttemptInfo {
  readonly attemptId: string;
  /** Its number among the task's attempts (1 for the first). */
  readonly attempt: number;
  readonly ownerId: string;
  readonly claimGeneration: bigint;
  readonly schedulerEpoch: bigint;
  readonly startedAt: Date | undefined;
  readonly endedAt: Date | undefined;
  /** How it ended (UNSPECIFIED while it runs). */
  readonly end: AttemptEnd;
  /** What its holder reported when it failed (Fail). */
  readonly errorCode: string;
  readonly errorMessage: string;
  /** Bytes of the checkpoint it left. */
  readonly checkpointSize: number;
}

/** An AttemptInfo from the wire. */
export function attemptOf(attempt: Attempt): AttemptInfo {
  return {
    attemptId: attempt.attemptId,
    attempt: attempt.attempt,
    ownerId: attempt.ownerId,
    claimGeneration: attempt.claimGeneration,
    schedulerEpoch: attempt.schedulerEpoch,
    startedAt: dateOf(attempt.startedAt),
    endedAt: dateOf(attempt.endedAt),
    end: attempt.end,
    errorCode: attempt.errorCode,
    errorMessage: attempt.errorMessage,
    checkpointSize: attempt.checkpointSize,
  };
}

/** The canonical result of a task revision. */
export interface ResultInfo {
  readonly taskId: string;
  readonly revision: bigint;
  readonly result: Uint8Array;
  readonly resultRef: string;
  readonly resultDigest: string;
  readonly commitId: string;
  readonly claimGeneration: bigint;
  readonly ownerId: string;
  readonly committedAt: Date | undefined;
}

/** A wire timestamp as a Date (undefined when unset). */
export function dateOf(ts: Timestamp | undefined): Date | undefined {
  if (!ts || (ts.seconds === 0n && ts.nanos === 0)) return undefined;
  return new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6));
}

/** A TaskInfo from the wire. */
export function taskOf(task: Task | undefined): TaskInfo {
  if (!task) throw new Error("the coordinator answered without a task");
  return {
    taskId: task.taskId,
    queue: task.queue,
    state: task.state,
    revision: task.revision,
    stateVersion: task.stateVersion,
    input: task.input,
    inputDigest: task.inputDigest,
    attempt: task.attempt,
    claimGeneration: task.claimGeneration,
    attemptsCounted: task.attemptsCounted,
    lastError: task.lastError,
    resultDigest: task.resultDigest,
    dependsOn: [...task.dependsOn],
    blockedBy: [...task.blockedBy],
    priority: task.priority,
    ownerId: task.ownerId,
    retryPolicy: policyOf(task.retryPolicy),
    nextEligibleAt: dateOf(task.nextEligibleAt),
    deadline: dateOf(task.deadline),
    deadLetterReason: task.deadLetterReason,
    lastErrorCode: task.lastErrorCode,
    overdueAt: dateOf(task.overdueAt),
    createdAt: dateOf(task.createdAt),
    updatedAt: dateOf(task.updatedAt),
    checkpointSize: task.checkpointSize,
  };
}

/** A ResultInfo from the wire. */
export function resultOf(result: TaskResult | undefined): ResultInfo {
  if (!result) throw new Error("the coordinator answered without a result");
  return {
    taskId: result.taskId,
    revision: result.revision,
    result: result.result,
    resultRef: result.resultRef,
    resultDigest: result.resultDigest,
    commitId: result.commitId,
    claimGeneration: result.claimGeneration,
    ownerId: result.ownerId,
    committedAt: dateOf(result.committedAt),
  };
}
