/**
 * The SDK's transport: one gRPC client per replica, deadlines, metadata and retries, with the
 * Python SDK's rules (coordinator/sdk/_rpc.py).
 *
 * Every call carries the caller's principal, this SDK's version, a request id (the same on
 * every retry) and a deadline. Transport failures (UNAVAILABLE, DEADLINE_EXCEEDED) and refusals
 * at a replica's concurrency bound (RESOURCE_EXHAUSTED) are retried with exponential backoff for
 * as long as the call's time allows (budget.ts); every other status is final. A call given up
 * after a try that may have reached a coordinator throws OutcomeUnknown. A call with an
 * idempotency key sends it on every try, so a retry whose first try landed gets that answer.
 *
 * The client sticks to one replica (a random one at first, so a pool spreads over them) and
 * moves to the next after a transport failure, retried or not (a renewal the keepalive makes
 * again goes to the next replica): the replica that granted a claim also serves its renewals
 * and commit while it is reachable.
 */
import { randomBytes, randomUUID } from "node:crypto";

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { DescMessage, DescMethodUnary, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

import { MIN_TRY_TIMEOUT, backoff, outOfTime, retryDeadline, tryTimeout } from "./budget.js";
import { CallAborted, CoordinatorError, InvalidArgument } from "./errors.js";
import { type StatusLike, hintFor, isRetried, isTransport, neverSent, translate } from "./status.js";
import { SDK_VERSION } from "./version.js";

/** Deadlines and transport retries of every call (seconds). */
export interface RetryPolicy {
  /** Deadline of one try (10 s). */
  timeoutSeconds: number;
  /** How long one call keeps retrying transport failures, its first try included (15 s): long
   * enough to ride out a replica restart or an etcd leader election. */
  budgetSeconds: number;
  /** At most this many tries per call (undefined: the budget alone bounds them). */
  attempts: number | undefined;
  initialBackoffSeconds: number;
  maxBackoffSeconds: number;
}

/** The Python SDK's defaults. */
export const DEFAULT_RETRY: RetryPolicy = {
  timeoutSeconds: 10,
  budgetSeconds: 15,
  attempts: undefined,
  initialBackoffSeconds: 0.1,
  maxBackoffSeconds: 2,
};

/** The metadata key that names the calling principal. */
export const PRINCIPAL_METADATA = "x-coordinator-principal";
/** The metadata key that names the SDK's version (the server's version gate reads it). */
export const SDK_VERSION_METADATA = "x-coordinator-sdk-version";
/** The metadata key of a call's idempotency key. */
export const IDEMPOTENCY_METADATA = "idempotency-key";
/** The metadata key of a call's request id. */
export const REQUEST_ID_METADATA = "x-request-id";

/** How one call is made. */
export interface CallOptions {
  /** Retry transport failures (default true). */
  retry?: boolean;
  /** Deadline of one try in seconds (default: the policy's). */
  timeoutSeconds?: number;
  /** Sent with every try: the server answers a retry whose first try landed with that answer. */
  idempotencyKey?: string;
  /** Behind a claim's fence: the lease left (seconds); retries stop when it runs out. */
  leaseLeftSeconds?: number;
  /** What OutcomeUnknown tells the caller to repeat. */
  hint?: string;
  /** Aborts the call at once (CallAborted). */
  signal?: AbortSignal;
  /** Counts the tries made (a keyed claim answered by a retry may carry an earlier grant). */
  tries?: { count: number };
}

/** A new idempotency key: 16 characters, 96 random bits, as the Python SDK's. */
export function newKey(): string {
  return randomBytes(12).toString("base64url");
}

/** What a call on a closed client throws (a CoordinatorError; nothing was sent). */
const CLOSED = "the client is closed (client.close()): the call was not sent";

const now = (): number => performance.now() / 1000;

const sleep = (seconds: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, seconds * 1000));

// A restarted coordinator is found again within a second, not after gRPC's default backoff.
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.min_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 1000,
  "grpc.enable_http_proxy": 0,
};

/** What a Transport is built from. */
export interface TransportOptions {
  targets: string[];
  principal: string;
  token: string | undefined;
  tls: { ca: Buffer | undefined; cert: Buffer | undefined; key: Buffer | undefined } | undefined;
  retry: RetryPolicy;
  channelOptions: grpc.ChannelOptions | undefined;
}

/** One channel per replica, the metadata every call carries, and the retry loop. */
export class Transport {
  readonly policy: RetryPolicy;
  readonly principal: string;
  private readonly clients: grpc.Client[];
  private current: number;
  private readonly base: [string, string][];
  private closed = false;

  constructor(options: TransportOptions) {
    if (!options.principal) throw new InvalidArgument("principal must not be empty (or set COORDINATOR_WORKER_ID)");
    const credentials = options.tls
      ? grpc.credentials.createSsl(options.tls.ca ?? null, options.tls.key ?? null, options.tls.cert ?? null)
      : grpc.credentials.createInsecure();
    const channelOptions = { ...CHANNEL_OPTIONS, ...options.channelOptions };
    this.clients = options.targets.map((t) => new grpc.Client(t, credentials, channelOptions));
    this.current = Math.floor(Math.random() * this.clients.length);
    this.policy = options.retry;
    this.principal = options.principal;
    this.base = [
      [PRINCIPAL_METADATA, options.principal],
      [SDK_VERSION_METADATA, SDK_VERSION],
    ];
    if (options.token !== undefined) this.base.push(["authorization", bearer(options.token)]);
  }

  /**
   * Call `method` with the deadline, the metadata and (unless `retry` is false) the retries.
   * Throws OutcomeUnknown when a failed try may have reached a coordinator, TransportError when
   * none did, the mapped RpcError for any other status.
   */
  async call<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    request: MessageInitShape<I>,
    options: CallOptions = {},
  ): Promise<MessageShape<O>> {
    const message = create(method.input, request);
    const metadata = this.metadata(options.idempotencyKey);
    const keyed = Boolean(options.idempotencyKey);
    const hint = options.hint ?? hintFor(method.name, options.leaseLeftSeconds !== undefined);
    const perTry = options.timeoutSeconds ?? this.policy.timeoutSeconds;
    const start = now();
    const tries = options.tries ?? { count: 0 };
    tries.count = 0;
    let maybeSent = false;
    let deadline = 0;
    for (let n = 0; ; n++) {
      const timeout = n === 0 ? perTry : tryTimeout(now(), deadline, perTry);
      const at = this.current;
      tries.count += 1;
      try {
        return await this.once(method, message, metadata, timeout, options.signal);
      } catch (error) {
        const failure = asStatus(error);
        maybeSent = maybeSent || !neverSent(failure);
        if (n === 0) deadline = retryDeadline(start, now(), this.policy.budgetSeconds, options.leaseLeftSeconds);
        const sleepFor = backoff(n + 1, this.policy.initialBackoffSeconds, this.policy.maxBackoffSeconds, Math.random);
        const retried = options.retry !== false && this.retries() && isRetried(failure, keyed);
        const spent = this.policy.attempts !== undefined && tries.count >= this.policy.attempts;
        // Moved on even when this call is not retried: the keepalive's renewals (retry: false)
        // are retried by the keepalive itself, and pinned to a dead replica they would lose
        // every claim while another replica could renew them.
        if (isTransport(failure.code)) this.moveOn(at);
        if (!retried || spent || outOfTime(now(), sleepFor, deadline)) {
          throw translate(failure, { maybeSent, hint, keyed });
        }
        await sleep(sleepFor);
      }
    }
  }

  /** Close every channel; calls in flight fail with CANCELLED, later ones with CLOSED. */
  close(): void {
    this.closed = true;
    for (const client of this.clients) client.close();
  }

  private retries(): boolean {
    return this.policy.attempts !== 1 && this.policy.budgetSeconds > 0;
  }

  private moveOn(at: number): void {
    if (this.current === at) this.current = (at + 1) % this.clients.length;
  }

  private metadata(idempotencyKey: string | undefined): grpc.Metadata {
    const metadata = new grpc.Metadata();
    for (const [key, value] of this.base) metadata.set(key, value);
    // One request id per logical call, the same on every retry.
    metadata.set(REQUEST_ID_METADATA, randomUUID().replaceAll("-", ""));
    if (idempotencyKey) metadata.set(IDEMPOTENCY_METADATA, idempotencyKey);
    return metadata;
  }

  private once<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    message: MessageShape<I>,
    metadata: grpc.Metadata,
    timeout: number,
    signal: AbortSignal | undefined,
  ): Promise<MessageShape<O>> {
    if (signal?.aborted) return Promise.reject(new CallAborted("the call was aborted before it was sent"));
    // Not an RpcError: no coordinator answered (grpc-js would say UNKNOWN "Channel has been shut down").
    if (this.closed) return Promise.reject(new CoordinatorError(CLOSED));
    const client = this.clients[this.current] as grpc.Client;
    const path = `/${method.parent.typeName}/${method.name}`;
    return new Promise((resolve, reject) => {
      const call = client.makeUnaryRequest(
        path,
        (value: MessageShape<I>) => Buffer.from(toBinary(method.input, value)),
        (bytes: Buffer) => fromBinary(method.output, bytes),
        message,
        metadata,
        { deadline: new Date(Date.now() + Math.max(timeout, MIN_TRY_TIMEOUT) * 1000) },
        (error, value) => {
          signal?.removeEventListener("abort", onAbort);
          if (error) reject(error);
          else resolve(value as MessageShape<O>);
        },
      );
      const onAbort = (): void => {
        call.cancel();
        reject(new CallAborted("the call was aborted in flight"));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}

/** The `authorization` value of `token`; InvalidArgument for a malformed one. */
export function bearer(token: string): string {
  const trimmed = token.trim();
  if (!trimmed || /\s/.test(trimmed)) {
    throw new InvalidArgument("token must be a non-empty string without whitespace");
  }
  return `Bearer ${trimmed}`;
}

function asStatus(error: unknown): StatusLike {
  if (error instanceof CoordinatorError) throw error; // CallAborted: final, never retried
  const status = error as Partial<grpc.ServiceError>;
  return { code: status.code ?? grpc.status.UNKNOWN, details: status.details ?? String(error) };
}
