/**
 * WorkerClient: claims tasks and hands back Claims; also the producer's calls (createTask,
 * getTask, listTasks, getResult, attempts, updateInput, retryTask, cancelTask).
 *
 * A client pins the scheduler epoch it first sees. A new epoch is the operator's decision and
 * a worker must follow it: a claim refused FENCED/EPOCH_CHANGED re-reads the epoch and, if it
 * moved on, is sent once more under the new one. Claims already held keep the epoch they were
 * claimed under (the bump retires them).
 */
import * as grpc from "@grpc/grpc-js";

import { Claim, type LostCallback } from "./claim.js";
import { monotonic } from "./lease.js";
import { type ConnectionOptions, connection } from "./environment.js";
import { AlreadyExists, NotFound } from "./errors.js";
import { AdminService } from "./gen/coordinator/v1/admin_pb.js";
import { TaskService } from "./gen/coordinator/v1/tasks_pb.js";
import type { ClaimResponse } from "./gen/coordinator/v1/worker_pb.js";
import { WorkerService } from "./gen/coordinator/v1/worker_pb.js";
import { Keepalive } from "./keepalive.js";
import { grantedOf, maxTasksOf, ttlSecondsOf } from "./requests.js";
import { MAX_INPUT_BYTES, type Payload, digestOf, limitedBytes } from "./payload.js";
import { type CreateTaskOptions, type ListTasksOptions, createRequest, durationOf, listRequest } from "./tasks.js";
import {
  type AttemptInfo,
  ClaimRefused,
  FenceReason,
  Outcome,
  type ResultInfo,
  type TaskInfo,
  attemptOf,
  resultOf,
  taskOf,
} from "./outcomes.js";
import { type CallOptions, DEFAULT_RETRY, type RetryPolicy, Transport, newKey } from "./transport.js";

/** What a claim refused by a client's claim says when its answer was lost. */
const CLAIM_HINT = "a claim that landed holds the task until its lease expires; claim it again after that";
/** What a create that was not retried says when its answer was lost. */
const CREATE_HINT =
  "a task may have been created: look for it (a taskId or an idempotencyKey makes a create safe to repeat)";

/** How a WorkerClient connects; anything not given comes from the `COORDINATOR_*` environment. */
export interface WorkerClientOptions extends ConnectionOptions {
  /** Deadlines and retries (seconds); unset fields take the defaults (10 s a try, 15 s budget). */
  retry?: Partial<RetryPolicy>;
  /** grpc-js channel options over the SDK's. */
  channelOptions?: grpc.ChannelOptions;
  /** The environment to read (default: process.env). */
  env?: Readonly<Record<string, string | undefined>>;
}

/** Options of a claim. */
export interface ClaimOptions {
  /** Requested lease TTL (seconds; the coordinator clamps it to its bounds). */
  ttlSeconds: number;
  /** Called once if the claim is lost later (the claim's `signal` aborts as well). */
  onLost?: LostCallback;
  /** What `claim.check()` demands be left on the lease (default: a quarter of the TTL). */
  safetyMarginSeconds?: number;
}

/** Options of a claimNext. */
export interface ClaimNextOptions extends ClaimOptions {
  /** Long poll: how long the coordinator waits for a task (at most its max_claim_wait, 20 s). */
  waitSeconds?: number;
  /** Ends the call (a long poll) at once: CallAborted. */
  signal?: AbortSignal;
}

/**
 * A connection to a coordinator, acting as one principal. Every call has a deadline and is
 * retried on UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED only, for up to the retry
 * budget and, behind a claim's fence, no longer than the lease lasts; other statuses throw the
 * SDK's RpcErrors (InvalidArgument, NotFound, ...). One keepalive loop renews every claim the
 * client holds (RenewMany). Close it when done: `client.close()`.
 */
export class WorkerClient {
  readonly transport: Transport;
  /** The client's keepalive loop (its `calls` counts the renewal calls sent). */
  readonly keepalive: Keepalive;
  private epochPinned: bigint | undefined;

  constructor(options: WorkerClientOptions = {}) {
    const chosen = connection(options, options.env ?? process.env);
    this.transport = new Transport({
      targets: chosen.targets,
      principal: chosen.principal ?? "",
      token: chosen.token,
      tls: chosen.tls,
      retry: { ...DEFAULT_RETRY, ...options.retry },
      channelOptions: options.channelOptions,
    });
    this.keepalive = new Keepalive(this.transport);
  }

  /** The principal every call is made as. */
  get principal(): string {
    return this.transport.principal;
  }

  /** Read the scheduler epoch and pin it for this client's later claims. */
  async epoch(): Promise<bigint> {
    const response = await this.transport.call(AdminService.method.getEpoch, {});
    this.epochPinned = response.epoch;
    return response.epoch;
  }

  /** Claim one task: a Claim, or the typed refusal (ALREADY_CLAIMED, NOT_CLAIMABLE, ...). */
  async claim(taskId: string, options: ClaimOptions & { expectedStateVersion?: bigint }): Promise<Claim | ClaimRefused> {
    const request = {
      taskId,
      expectedStateVersion: options.expectedStateVersion ?? 0n,
      schedulerEpoch: await this.pinnedEpoch(),
      ttlSeconds: ttlSecondsOf(options.ttlSeconds),
    };
    const won = await this.claimed((r) => this.send(WorkerService.method.claim, r, {}), request, options);
    return Array.isArray(won) ? (won[0] as Claim) : won;
  }

  /**
   * Claim the next ready task of `queue` (NO_READY_TASK comes back as a ClaimRefused). With
   * `waitSeconds` it is a long poll: the coordinator answers with the first task it wins, so a
   * worker loop needs no sleep between empty claims. With `maxTasks` (at most 64) it claims up
   * to that many in one call, each a claim of its own, and answers with a list.
   */
  claimNext(queue: string, options: ClaimNextOptions & { maxTasks: number }): Promise<Claim[] | ClaimRefused>;
  claimNext(queue: string, options: ClaimNextOptions): Promise<Claim | ClaimRefused>;
  async claimNext(
    queue: string,
    options: ClaimNextOptions & { maxTasks?: number },
  ): Promise<Claim | Claim[] | ClaimRefused> {
    const wait = options.waitSeconds ?? 0;
    const request = {
      queue,
      schedulerEpoch: await this.pinnedEpoch(),
      ttlSeconds: ttlSecondsOf(options.ttlSeconds),
      waitSeconds: wait,
      maxTasks: maxTasksOf(options.maxTasks ?? 1),
    };
    // A long poll's call may take its wait plus one try's deadline.
    const timeout = wait > 0 ? this.transport.policy.timeoutSeconds + wait : undefined;
    const callOptions: CallOptions = { timeoutSeconds: timeout, signal: options.signal };
    const won = await this.claimed((r) => this.send(WorkerService.method.claimNext, r, callOptions), request, options);
    if (options.maxTasks !== undefined || !Array.isArray(won)) return won;
    return won[0] as Claim;
  }

  /** Create a READY task. Retried on transport errors only with a taskId or idempotencyKey (a
   * retry with neither could create a second task); with a taskId, an existing task of the
   * same queue and input is returned instead of AlreadyExists (a retry whose first try landed). */
  async createTask(options: CreateTaskOptions = {}): Promise<TaskInfo> {
    const request = createRequest(options);
    const taskId = request.taskId ?? "";
    const retry = Boolean(taskId || options.idempotencyKey);
    try {
      const response = await this.transport.call(TaskService.method.createTask, request, {
        retry,
        idempotencyKey: options.idempotencyKey,
        hint: retry ? undefined : CREATE_HINT,
      });
      return taskOf(response.task);
    } catch (error) {
      if (!(error instanceof AlreadyExists) || !taskId) throw error;
      const existing = await this.getTask(taskId).catch((e: unknown) => {
        throw e instanceof NotFound ? error : e;
      });
      if (existing.inputDigest !== request.inputDigest || existing.queue !== request.queue) throw error;
      return existing;
    }
  }

  /** The task (NotFound for an unknown id). */
  async getTask(taskId: string): Promise<TaskInfo> {
    const response = await this.transport.call(TaskService.method.getTask, { taskId });
    return taskOf(response.task);
  }

  /** The tasks `options` picks, by id, read a page at a time (`for await (const task of
   * client.listTasks({ queue, blocked: true }))`: a dead letter's dependents). */
  async *listTasks(options: ListTasksOptions = {}): AsyncGenerator<TaskInfo> {
    let pageToken = "";
    do {
      const response = await this.transport.call(TaskService.method.listTasks, listRequest(options, pageToken));
      for (const task of response.tasks) yield taskOf(task);
      pageToken = response.nextPageToken;
    } while (pageToken);
  }

  /** The canonical result of the task's current revision (or `revision`); NotFound if none. */
  async getResult(taskId: string, revision = 0n): Promise<ResultInfo> {
    const response = await this.transport.call(TaskService.method.getResult, { taskId, revision });
    return resultOf(response.result);
  }

  /** Every attempt of the task, oldest first, read a page (`pageSize`, at most 1000) at a time. */
  async *attempts(taskId: string, pageSize = 100): AsyncGenerator<AttemptInfo> {
    let pageToken = "";
    do {
      const response = await this.transport.call(TaskService.method.listAttempts, { taskId, pageSize, pageToken });
      for (const attempt of response.attempts) yield attemptOf(attempt);
      pageToken = response.nextPageToken;
    } while (pageToken);
  }

  /** Replace the task's input (revision + 1, READY again; a live claim's commit then gets
   * STALE_INPUT). `expectedRevision` (non-zero) makes it conditional. */
  async updateInput(taskId: string, input: Payload, expectedRevision = 0n): Promise<TaskInfo> {
    const bytes = limitedBytes("input", input, MAX_INPUT_BYTES);
    const request = { taskId, input: bytes, inputDigest: digestOf(bytes), expectedRevision };
    return taskOf((await this.transport.call(TaskService.method.updateInput, request)).task);
  }

  /** Send a FAILED task (a dead letter) back to READY with a fresh attempt budget (pm or
   * admin); `scheduleToCloseSeconds` gives it a new deadline from now (one whose own deadline
   * passed needs it: FailedPrecondition without). A repeat is harmless. */
  async retryTask(taskId: string, options: { reason?: string; scheduleToCloseSeconds?: number } = {}): Promise<TaskInfo> {
    const close = options.scheduleToCloseSeconds;
    const request = {
      taskId,
      reason: options.reason ?? "",
      scheduleToClose: close === undefined ? undefined : durationOf(close),
    };
    return taskOf((await this.transport.call(TaskService.method.retryTask, request)).task);
  }

  /** Cancel the task: its holder's next call is answered CANCELLED (its claim is lost). */
  async cancelTask(taskId: string, reason = ""): Promise<TaskInfo> {
    const response = await this.transport.call(TaskService.method.cancelTask, { taskId, reason });
    return taskOf(response.task);
  }

  /** Stop renewing and close the channels (claims still held run out with their leases). */
  close(): void {
    this.keepalive.close();
    this.transport.close();
  }

  private async pinnedEpoch(): Promise<bigint> {
    return this.epochPinned ?? (await this.epoch());
  }

  /** A claim sent as one call under an idempotency key of its own (a re-pinned request is
   * another call): its answer and when its lease clock starts. */
  private async send<R>(
    method: typeof WorkerService.method.claim | typeof WorkerService.method.claimNext,
    request: R,
    options: CallOptions,
  ): Promise<[ClaimResponse, number]> {
    const sentAt = monotonic();
    const tries = { count: 0 };
    const call = this.transport.call as (m: typeof method, r: R, o: CallOptions) => Promise<ClaimResponse>;
    const response = await call.call(this.transport, method, request, {
      ...options,
      hint: CLAIM_HINT,
      idempotencyKey: newKey(),
      tries,
    });
    // A long poll is granted its lease only when it wins, up to its wait after the send: its
    // clock starts at the answer (unless a retry may carry an earlier try's grant).
    const longPoll = options.timeoutSeconds !== undefined;
    return [response, longPoll && tries.count === 1 ? monotonic() : sentAt];
  }

  /** The claims one claim call won, following a new epoch once. */
  private async claimed<R extends { schedulerEpoch: bigint }>(
    send: (request: R) => Promise<[ClaimResponse, number]>,
    request: R,
    options: ClaimOptions,
  ): Promise<Claim[] | ClaimRefused> {
    let [response, sentAt] = await send(request);
    if (response.outcome === Outcome.FENCED && response.reason === FenceReason.EPOCH_CHANGED) {
      const current = await this.epoch();
      if (current !== request.schedulerEpoch) {
        request.schedulerEpoch = current;
        [response, sentAt] = await send(request);
      }
    }
    const won = this.claimsOf(response, sentAt, options);
    return won.length > 0 ? won : new ClaimRefused(response.outcome, response.reason, response.message);
  }

  private claimsOf(response: ClaimResponse | undefined, sentAt: number, options: ClaimOptions): Claim[] {
    const claims = grantedOf(response).map(
      (granted) =>
        new Claim(granted, sentAt, {
          transport: this.transport,
          claimsOf: (next, at) => this.claimsOf(next, at, options),
          onLost: options.onLost,
          safetyMarginSeconds: options.safetyMarginSeconds,
        }),
    );
    for (const claim of claims) this.keepalive.add(claim);
    return claims;
  }
}
