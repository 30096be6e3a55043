/**
 * A held claim: its fence, its lease clock, an AbortSignal that fires when it is lost, and the
 * acceptance points (commit, fail, release, stageResult, authorizeTool, effect).
 *
 * The client's one keepalive loop (keepalive.ts) renews it at TTL/3 in the background and never
 * blocks the caller; `progress()` and `checkpoint()` only record the latest value, which the
 * next renewal carries. A renewal the coordinator refuses (FENCED, CANCELLED, STALLED,
 * RENEW_LIMIT, STALE_INPUT), or a lease that runs out by the local monotonic clock while
 * renewals cannot reach the coordinator, marks the claim lost, once: `signal` aborts with a
 * ClaimLost carrying the reason, `onLost` is called, the keepalive drops it. The SDK never
 * claims again or re-grants anything by itself: a lost claim stays lost.
 *
 * `commit` always asks the coordinator, even for a claim the SDK believes lost: the store is
 * the one authority on the fence, and its answer carries the reason.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";

import { type Downstream, type EffectOutcome, runEffect } from "./effects.js";
import {
  MAX_CHECKPOINT_BYTES,
  MAX_RESULT_BYTES,
  MAX_TEXT_CHARS,
  type Payload,
  digestOf,
  limitedBytes,
  limitedText,
} from "./payload.js";
import { ClaimLost, TransportError } from "./errors.js";
import type { ClaimResponse, CommitResponse, RenewResponse } from "./gen/coordinator/v1/worker_pb.js";
import { type CommitRequestSchema, WorkerService } from "./gen/coordinator/v1/worker_pb.js";
import { Lease, type Renewal, monotonic } from "./lease.js";
import {
  type CommitOutcome,
  ClaimRefused,
  type FailOutcome,
  FenceReason,
  type LossSource,
  type LostReason,
  Outcome,
  type ReleaseOutcome,
  type StageOutcome,
  type ToolAuthorization,
  dateOf,
  describeLoss,
} from "./outcomes.js";
import type { Fence } from "./gen/coordinator/v1/types_pb.js";
import { type FailOptions, failRequest, maxTasksOf, ttlSecondsOf } from "./requests.js";
import { ATTEMPT_HINT } from "./status.js";
import { type CallOptions, type RetryPolicy, type Transport, newKey } from "./transport.js";

/** Called once when a claim is lost, with the reason. */
export type LostCallback = (lost: LostReason) => void;

export type ClaimsOf = (response: ClaimResponse | undefined, sentAt: number) => Claim[];

/** Options of a commit. */
export interface CommitOptions {
  /** A reference to a result stored elsewhere (the digest is then of `result` as given). */
  resultRef?: string;
  /** What the result rests on (job ids, log refs; at most 64). */
  evidence?: string[];
  /** Claim the next task(s) of this queue in the same call. */
  next?: { queue: string; ttlSeconds: number; maxTasks?: number };
}

/** What a Claim needs of its client. */
export interface ClaimContext {
  transport: Transport;
  claimsOf: ClaimsOf;
  onLost: LostCallback | undefined;
  safetyMarginSeconds: number | undefined;
}

// A renewal or release answered FENCED with these found that this attempt's own commit, release
// or fail landed (its answer may be lost: OutcomeUnknown): ended by the caller, nothing lost.
const ENDED_BY_THIS_ATTEMPT: ReadonlyMap<FenceReason, string> = new Map([
  [FenceReason.ALREADY_COMMITTED, "committed"],
  [FenceReason.RELEASED, "released"],
  [FenceReason.FAILED, "failed"],
]);


/** One claimed task. Built by WorkerClient; hold it until commit, fail, release or loss. */
export class Claim {
  readonly fence: Fence;
  readonly attempt: number;
  /** The task's input as claimed. */
  readonly input: Uint8Array;
  readonly inputDigest: string;
  readonly taskRevision: bigint;
  /** Where an earlier attempt of this task revision left the work (empty: start afresh). */
  readonly previousCheckpoint: Uint8Array;
  /** The TTL each renewal restores. */
  readonly ttlSeconds: number;
  /** What `check()` demands be left on the lease (a quarter of the TTL unless set). */
  readonly safetyMarginSeconds: number;
  /** Aborts, with a ClaimLost whose `reason` says why, the moment the claim is known lost:
   * pass it to fetch() and tool calls so they stop with the claim. */
  readonly signal: AbortSignal;

  private readonly ctx: ClaimContext;
  private readonly controller = new AbortController();
  private readonly lease: Lease;
  private lost: LostReason | undefined;
  private finished = "";
  private closed = false;
  // The effect keys this attempt sent downstream: never sent twice within an attempt, even if
  // the coordinator answers EXECUTE again (a retried prepare whose first answer was lost).
  private readonly sentKeys = new Set<string>();

  constructor(response: ClaimResponse, sentAt: number, ctx: ClaimContext) {
    if (!response.fence) throw new Error("a CLAIMED answer without a fence");
    this.ctx = ctx;
    this.fence = response.fence;
    this.attempt = response.attempt;
    this.input = response.input;
    this.inputDigest = response.inputDigest;
    this.taskRevision = response.taskRevision;
    this.previousCheckpoint = response.checkpoint;
    this.ttlSeconds = Math.max(Number(response.ttlSeconds), 1);
    this.safetyMarginSeconds = ctx.safetyMarginSeconds ?? this.ttlSeconds / 4;
    this.signal = this.controller.signal;
    // A reused lease has less left than the TTL: the server says how much, clock-free.
    const left = response.leaseRemaining
      ? Number(response.leaseRemaining.seconds) + response.leaseRemaining.nanos / 1e9
      : 0;
    this.lease = new Lease(this.ttlSeconds, sentAt, left);
  }

  /** The claimed task. */
  get taskId(): string {
    return this.fence.taskId;
  }

  /** The claim generation: the fencing token of this attempt. */
  get generation(): bigint {
    return this.fence.claimGeneration;
  }

  /** What lost the claim, or undefined while it is held. */
  get lostReason(): LostReason | undefined {
    return this.lost;
  }

  /** How its holder ended the claim ("committed", "released", "failed"; "" while not). */
  get ended(): string {
    return this.finished;
  }

  /** Whether this claim's commit is known to have landed. */
  get committed(): boolean {
    return this.finished === "committed";
  }

  /** How many renewals the coordinator accepted. */
  get renewals(): number {
    return this.lease.accepted;
  }

  /** Whether the claim is known to have lost its task. */
  isLost(): boolean {
    return this.lost !== undefined;
  }

  /** Whether the claim is neither lost nor ended by its own commit, fail or release. */
  isHeld(): boolean {
    return this.lost === undefined && !this.finished;
  }

  /** Seconds left on the lease by the local monotonic clock (0 once it ran out). */
  remainingSeconds(): number {
    return this.lease.remaining();
  }

  /** The input as UTF-8 text. */
  inputText(): string {
    return new TextDecoder().decode(this.input);
  }

  /** Throw ClaimLost unless the claim is held with more than `marginSeconds` (default: the
   * safety margin) left on its lease. Call it before an expensive or irreversible step. */
  check(marginSeconds?: number): void {
    if (this.lost) throw new ClaimLost(`claim ${this.name} is lost: ${describeLoss(this.lost)}`, this.lost);
    if (this.finished) throw new ClaimLost(`claim ${this.name} is ${this.finished}: nothing left to work on`);
    const need = marginSeconds ?? this.safetyMarginSeconds;
    const left = this.remainingSeconds();
    if (left < need) {
      throw new ClaimLost(
        `claim ${this.name} has ${left.toFixed(2)}s left on its lease, less than the ${need.toFixed(2)}s safety margin`,
      );
    }
  }

  /** Record a progress marker (at most 1,024 characters; InvalidArgument past it, here: the
   * coordinator would refuse the renewal carrying it, and the claim with it); the next renewal
   * sends the latest one. Never blocks. */
  progress(marker: string): void {
    this.lease.progress(limitedText("progress", marker, MAX_TEXT_CHARS));
  }

  /** Record where the work stands (at most 64 KiB; InvalidArgument past it, here); the next
   * renewal stores it with the attempt (a release or a failure sends one renewal with it first)
   * and a later attempt of this task revision starts with it as `previousCheckpoint`. */
  checkpoint(data: Payload): void {
    this.lease.checkpoint(limitedBytes("checkpoint", data, MAX_CHECKPOINT_BYTES));
  }

  /** Whether a checkpoint is recorded that no renewal has kept yet. */
  get checkpointPending(): boolean {
    return this.lease.checkpointPending;
  }

  /** Stop renewing the claim without ending it: a task it did not settle is claimed again
   * once its lease runs out (the pool closes each claim it settled or could not settle). */
  close(): void {
    this.closed = true;
  }

  // --- acceptance points ---------------------------------------------------------------------

  /**
   * Make `result` canonical for the task revision, behind this claim's fence. COMMITTED ends
   * the claim; FENCED / STALE_INPUT / CANCELLED mark it lost. With `next`, claims up to
   * `next.maxTasks` ready tasks of `next.queue` in the same call (under an idempotency key of
   * its own, so a retry whose first try landed gets the same claims). Transport failures are
   * retried until the retry budget runs out (past the local lease too: the fence decides);
   * then OutcomeUnknown means a try may have landed: commit again with the same result to
   * learn it.
   */
  async commit(result: Payload, options: CommitOptions = {}): Promise<CommitOutcome<Claim>> {
    const bytes = limitedBytes("result", result, MAX_RESULT_BYTES);
    const next = options.next;
    const sent = monotonic();
    let response: CommitResponse;
    try {
      const keyed = next ? { idempotencyKey: newKey() } : {};
      // Retried for the whole budget, past the lease by the local clock too: the fence decides
      // (a commit after a takeover is FENCED), and an outage longer than what was left of the
      // lease no longer throws a finished result away (etcd keeps leases across a restart).
      const untilBudget = { leaseLeftSeconds: undefined, hint: ATTEMPT_HINT };
      response = await this.call(WorkerService.method.commit, this.commitRequest(bytes, options), {
        ...keyed,
        ...untilBudget,
      });
    } catch (error) {
      // Given up with next: commit alone (a claim the lost answer carried expires unheld).
      if (!(next && error instanceof TransportError)) throw error;
      return this.commit(bytes, { resultRef: options.resultRef, evidence: options.evidence });
    }
    const committed = response.outcome === Outcome.COMMITTED;
    if (committed) this.finish("committed");
    else this.markLost(response.outcome, response.reason, response.message, "commit");
    const claims = next ? this.ctx.claimsOf(response.next, sent) : [];
    const refused =
      next && response.next && claims.length === 0
        ? new ClaimRefused(response.next.outcome, response.next.reason, response.next.message)
        : undefined;
    return {
      outcome: response.outcome,
      reason: response.reason,
      message: response.message,
      committed,
      commitId: response.resultCommitId,
      state: response.state,
      next: claims,
      nextRefused: refused,
    };
  }

  private commitRequest(bytes: Uint8Array, options: CommitOptions): MessageInitShape<typeof CommitRequestSchema> {
    const next = options.next;
    return {
      fence: this.fence,
      inputDigest: this.inputDigest,
      resultDigest: digestOf(bytes),
      result: bytes,
      resultRef: options.resultRef ?? "",
      evidence: options.evidence ?? [],
      next: next && {
        queue: next.queue,
        schedulerEpoch: this.fence.schedulerEpoch,
        ttlSeconds: ttlSecondsOf(next.ttlSeconds),
        maxTasks: maxTasksOf(next.maxTasks ?? 1),
      },
    };
  }

  /**
   * Report that this attempt failed: `error` is an Error (its name, less what a code may not
   * hold, is the error code, its message the message, its stack the details) or an error code.
   * `retryable: false` sends the task to the dead letter at once. Recorded ends the claim;
   * FENCED / CANCELLED / STALE_INPUT mark it lost unless this attempt had already ended itself.
   */
  async fail(error: Error | string, options: FailOptions = {}): Promise<FailOutcome> {
    await this.flushCheckpoint();
    const response = await this.call(WorkerService.method.fail, failRequest(this.fence, error, options));
    const recorded = response.outcome === Outcome.OK;
    if (recorded) this.finish("failed");
    else if (!this.endedByThisAttempt(response.outcome, response.reason)) {
      this.markLost(response.outcome, response.reason, response.message, "fail");
    }
    return {
      outcome: response.outcome,
      reason: response.reason,
      message: response.message,
      recorded,
      state: response.state,
      nextEligibleAt: dateOf(response.nextEligibleAt),
    };
  }

  /** Give the task back (READY again). Ends the claim; FENCED / CANCELLED mark it lost, except
   * when this attempt's own commit or release had landed (an answer lost earlier). */
  async release(reason = ""): Promise<ReleaseOutcome> {
    await this.flushCheckpoint();
    const response = await this.call(WorkerService.method.release, { fence: this.fence, reason });
    const released = response.outcome === Outcome.OK;
    if (released) this.finish("released");
    else if (!this.endedByThisAttempt(response.outcome, response.reason)) {
      this.markLost(response.outcome, response.reason, response.message, "release");
    }
    return { outcome: response.outcome, reason: response.reason, message: response.message, released };
  }

  /** Record `data` as the checkpoint and store it now, before an expensive or irreversible
   * step, rather than with the renewal due at TTL/3: true once the server kept it. False when
   * the claim is lost (a refusal marks it so) or the server did not keep it (its write budget;
   * it stays pending and the next renewal sends it again). Retried within the lease. */
  async saveCheckpoint(data: Payload): Promise<boolean> {
    this.checkpoint(data);
    if (!this.isHeld()) return false;
    const sent = monotonic();
    const { request } = this.lease.request(this.fence, this.ctx.transport.policy.timeoutSeconds);
    const response = await this.call(WorkerService.method.renew, request);
    if (response.outcome !== Outcome.OK) {
      if (!this.endedByThisAttempt(response.outcome, response.reason)) {
        this.markLost(response.outcome, response.reason, response.message, "renew");
      }
      return false;
    }
    this.lease.renewed(sent, response, request);
    return !response.checkpointRefused;
  }

  /** `await using claim = ...`: a claim still held when its scope ends (a throw, a return
   * without commit) is released (counted: nothing was finished), so it is not renewed on until
   * the stall timeout. A release that fails is logged: the lease then runs out by itself. To
   * fail the task with the error instead, catch it and `await claim.fail(error)` in scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.isHeld()) return;
    try {
      await this.release("left its scope without commit");
    } catch (error) {
      console.warn(`coordinator: could not release ${this} on leaving its scope; its lease runs out:`, error);
    }
  }

  /** One renewal, one try, carrying the checkpoint no renewal kept yet, sent before a release
   * or a failure ends the attempt (they carry none): the next attempt resumes from it. Only an
   * accepted answer is applied; the ending call's answer is the truth about the claim. */
  private async flushCheckpoint(): Promise<void> {
    if (!this.lease.checkpointPending || !this.isHeld()) return;
    const sent = monotonic();
    const { request, timeout } = this.lease.request(this.fence, this.ctx.transport.policy.timeoutSeconds);
    try {
      const once = { retry: false, timeoutSeconds: timeout };
      const response = await this.call(WorkerService.method.renew, request, once);
      if (response.outcome === Outcome.OK) this.lease.renewed(sent, response, request);
    } catch {
      // Not sent: the release or the failure goes on; the next attempt resumes from the last kept.
    }
  }

  /** Stage `result` in this attempt's own area (never canonical by itself). A refusal (the
   * task's deadline passed) marks the claim lost. */
  async stageResult(result: Payload, options: { resultRef?: string } = {}): Promise<StageOutcome> {
    const bytes = limitedBytes("result", result, MAX_RESULT_BYTES);
    const response = await this.call(WorkerService.method.stageResult, {
      fence: this.fence,
      resultDigest: digestOf(bytes),
      result: bytes,
      resultRef: options.resultRef ?? "",
    });
    const staged = response.outcome === Outcome.OK;
    if (!staged) this.markLost(response.outcome, response.reason, response.message, "stage");
    return {
      outcome: response.outcome,
      reason: response.reason,
      message: response.message,
      staged,
      current: response.current,
    };
  }

  /** Ask the tool acceptance point before a side effect; run the tool only when `allowed`.
   * A refusal marks the claim lost. */
  async authorizeTool(tool: string, action = ""): Promise<ToolAuthorization> {
    const response = await this.call(WorkerService.method.authorizeTool, { fence: this.fence, tool, action });
    const allowed = response.outcome === Outcome.OK;
    if (!allowed) this.markLost(response.outcome, response.reason, response.message, "authorize");
    return { outcome: response.outcome, reason: response.reason, message: response.message, allowed };
  }

  /**
   * Run a side effect behind this claim's fence (effects.ts): prepare, then send through
   * `downstream` at most once with the effect id as its idempotency key, or skip (already
   * committed), or reconcile (look the key up; never resend blind), then record the outcome.
   */
  effect(
    nodeId: string,
    slot: string,
    payload: Payload,
    downstream: Downstream,
    options: { reconcilePrincipal?: string } = {},
  ): Promise<EffectOutcome> {
    return runEffect(this, nodeId, slot, payload, downstream, options);
  }

  /** Record that effect `key` is about to be sent; false if this attempt sent it before. */
  firstSend(key: string): boolean {
    if (this.sentKeys.has(key)) return false;
    this.sentKeys.add(key);
    return true;
  }

  /** A call behind this claim's fence: it stops retrying when the lease runs out. */
  call: Transport["call"] = (method, request, options: CallOptions = {}) =>
    this.ctx.transport.call(method, request, { leaseLeftSeconds: this.remainingSeconds(), ...options });

  // --- keepalive (keepalive.ts calls these; callers of the SDK never need them) ---------------

  /** False once the claim ended, was lost or closed: the keepalive drops it. */
  keepaliveWanted(): boolean {
    return this.isHeld() && !this.closed;
  }

  /** The next renewal (latest progress and checkpoint) and its deadline. */
  renewalRequest(policy: RetryPolicy): { request: Renewal; timeout: number } {
    return this.lease.request(this.fence, policy.timeoutSeconds);
  }

  /** Apply a renewal's answer (`request` sent at `sent`); true if it was accepted. */
  renewed(sent: number, response: RenewResponse, request: Renewal): boolean {
    if (this.endedByThisAttempt(response.outcome, response.reason)) return false;
    if (response.outcome !== Outcome.OK) {
      this.markLost(response.outcome, response.reason, response.message, "renew");
      return false;
    }
    this.lease.renewed(sent, response, request);
    return true;
  }

  /** A renewal failed with `error`: a transport failure loses the claim once the lease ran out
   * locally; any other error loses it now. */
  renewalFailed(error: Error, transport: boolean): void {
    if (!transport) {
      this.markLost(Outcome.FENCED, FenceReason.UNSPECIFIED, `renewal refused: ${error.message}`, "error");
    } else if (this.remainingSeconds() <= 0) {
      this.markLost(
        Outcome.FENCED,
        FenceReason.LEASE_EXPIRED,
        `the lease ran out locally while renewals failed (${error.message})`,
        "local_expiry",
      );
    }
  }

  /** When to renew next: TTL/3 after `sent`, sooner after a failure (the lease runs out). */
  nextRenewal(sent: number, accepted: boolean): number {
    return this.lease.next(sent, accepted);
  }

  /** Seconds between accepted renewals: TTL/3. */
  renewalInterval(): number {
    return this.lease.interval();
  }

  /**
   * Mark the claim lost because the coordinator refused it (`source` says which call): abort
   * `signal` with a ClaimLost, call `onLost`; once, and not after the claim was committed,
   * released or failed by its holder. The effect helper calls it too.
   */
  markLost(outcome: Outcome, reason: FenceReason, message: string, source: LossSource): void {
    if (this.finished || this.lost) return;
    const lost: LostReason = { outcome, reason, message, source, taskId: this.taskId };
    this.lost = lost;
    this.controller.abort(new ClaimLost(`claim ${this.name} is lost: ${describeLoss(lost)}`, lost));
    try {
      this.ctx.onLost?.(lost);
    } catch (error) {
      console.error(`coordinator: onLost of ${this.name} threw`, error);
    }
  }

  private endedByThisAttempt(outcome: Outcome, reason: FenceReason): boolean {
    const how = outcome === Outcome.FENCED ? ENDED_BY_THIS_ATTEMPT.get(reason) : undefined;
    if (how === undefined) return false;
    this.finish(how);
    return true;
  }

  private finish(how: string): void {
    if (!this.finished) this.finished = how;
  }

  private get name(): string {
    return `${this.taskId}#${this.attempt}`;
  }

  /** "task#attempt, generation=N, held|lost|committed|..." */
  toString(): string {
    const state = this.lost ? "lost" : this.finished || "held";
    return `Claim(${this.name}, generation=${this.generation}, ${state})`;
  }
}
