/** The claim requests' fields and how a claim's answer is read: pure, no I/O. */
import type { MessageInitShape } from "@bufbuild/protobuf";

import { InvalidArgument } from "./errors.js";
import type { Fence } from "./gen/coordinator/v1/types_pb.js";
import type { ClaimResponse, FailRequestSchema } from "./gen/coordinator/v1/worker_pb.js";
import { Outcome } from "./outcomes.js";
import { type Payload, bytesOf } from "./payload.js";
import { durationOf } from "./tasks.js";

// Bounds of what Fail carries (the coordinator refuses more: INVALID_ARGUMENT).
const MAX_ERROR_MESSAGE = 1024;
const MAX_ERROR_DETAILS = 16 * 1024;
const ERROR_CODE = /^[A-Za-z0-9._:-]{1,128}$/;
const NOT_IN_A_CODE = /[^A-Za-z0-9._:-]/g;

/** Options of a fail. */
export interface FailOptions {
  /** Whether another attempt may succeed (default true); false dead-letters the task. */
  retryable?: boolean;
  /** The next attempt starts no earlier than this (0-86400 s; the task's backoff if later). */
  delaySeconds?: number;
  /** For people (default: the error's message); at most 1024 characters are sent. */
  message?: string;
  /** Opaque details (default: the error's stack); the last 16 KiB are sent. */
  details?: Payload;
  /** Given back because this worker is stopping, not failing: not counted, no backoff (within
   * the server's bound; FailRequest.shutdown). The pool gives back so what a shutdown cuts off. */
  shutdown?: boolean;
}

/** A Fail of the attempt behind `fence`: `error` is an Error (its name is the error code, its
 * message the message, its stack the details) or an error code. A malformed code is refused
 * here (InvalidArgument), before any call, as the Python SDK refuses it; an Error's name is
 * made a valid code (codeOf). */
export function failRequest(fence: Fence, error: Error | string, options: FailOptions): MessageInitShape<typeof FailRequestSchema> {
  const isError = error instanceof Error;
  const code = isError ? codeOf(error) : error;
  if (!ERROR_CODE.test(code)) {
    throw new InvalidArgument(`error code ${JSON.stringify(code)} must be 1-128 characters of [A-Za-z0-9._:-]`);
  }
  const message = options.message ?? (isError ? error.message : "");
  const details = bytesOf(options.details ?? (isError ? (error.stack ?? "") : ""));
  const delay = options.delaySeconds;
  return {
    fence,
    retryable: options.retryable ?? true,
    errorCode: code,
    errorMessage: message.slice(0, MAX_ERROR_MESSAGE),
    // The end of a stack is the part that names the failure.
    errorDetails: details.slice(-MAX_ERROR_DETAILS),
    requeueDelay: delay === undefined ? undefined : durationOf(delay),
    shutdown: options.shutdown ?? false,
  };
}

/** An Error's name as an error code: what a code may not hold dropped ("Validation Error" is
 * "ValidationError"), "Error" if nothing is left. Python's, a class name, is always valid; a
 * name refused here would leave the attempt unfailed, its task held by a worker done with it. */
function codeOf(error: Error): string {
  return String(error.name).replace(NOT_IN_A_CODE, "").slice(0, 128) || "Error";
}

/** The claims of the tasks ClaimResponse granted (none when refused). */
export function grantedOf(response: ClaimResponse | undefined): ClaimResponse[] {
  if (!response || response.outcome !== Outcome.CLAIMED) return [];
  return [response, ...response.moreClaims.filter((more) => more.outcome === Outcome.CLAIMED)];
}

/** Tasks one call may claim (the coordinator's bound). */
export const MAX_TASKS = 64;

/** A TTL in whole seconds, rounded up (the wire carries integers); InvalidArgument unless > 0. */
export function ttlSecondsOf(ttl: number): bigint {
  if (!(ttl > 0)) throw new InvalidArgument(`ttlSeconds must be positive, got ${ttl}`);
  return BigInt(Math.ceil(ttl));
}

/** `max_tasks` on the wire (0 for one); InvalidArgument outside 1..MAX_TASKS. */
export function maxTasksOf(maxTasks: number): number {
  if (!Number.isInteger(maxTasks) || maxTasks < 1 || maxTasks > MAX_TASKS) {
    throw new InvalidArgument(`maxTasks must be 1 to ${MAX_TASKS}, got ${maxTasks}`);
  }
  return maxTasks > 1 ? maxTasks : 0;
}
