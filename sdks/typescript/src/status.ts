/**
 * What a failed call means, as the Python SDK decides it (coordinator/sdk/_status.py): which
 * gRPC statuses are tried again, and which error a status becomes. Pure: no channel.
 */
import { status as Status } from "@grpc/grpc-js";

import {
  AlreadyExists,
  CoordinatorError,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  NotSupported,
  OutcomeUnknown,
  PermissionDenied,
  RpcError,
  TransportError,
  Unauthenticated,
} from "./errors.js";

/** The only codes the SDK retries: the call may not have reached the coordinator, or a replica
 * at its concurrency bound refused it before running it. */
const TRANSPORT = new Set<number>([
  Status.UNAVAILABLE,
  Status.DEADLINE_EXCEEDED,
  Status.RESOURCE_EXHAUSTED,
]);

// A keyed call's duplicate answered while its first try still runs: retried, and the retry gets
// the first try's stored answer.
const IN_FLIGHT = Status.ABORTED;

// How a call that never got a connection fails (grpc-js, then gRPC C-core): no stream was
// opened, so the request never left. Any other transport failure may have reached a server.
const NEVER_SENT = [
  "No connection established",
  "failed to connect to all addresses",
  "connections to all backends failing",
];

/** What OutcomeUnknown tells the caller of a call behind a claim's fence. */
export const ATTEMPT_HINT = "retry the same call on the same attempt to learn it";
/** What OutcomeUnknown tells the caller of any other call. */
export const REPEAT_HINT =
  "repeat the same call to learn it (a create: with the same task id or key)";
/** What OutcomeUnknown tells of a renewal (the keepalive renews again by itself). */
export const RENEW_HINT = "the next renewal learns it";
/** What a read that failed says instead of an unknown outcome: a read has none. */
export const READ_HINT = "a read, nothing changed: repeat it";

/** What an unknown outcome of the RPC `method` (its proto name: "GetTask") tells its caller. */
export function hintFor(method: string, behindFence: boolean): string {
  if (method === "Renew" || method === "RenewMany") return RENEW_HINT;
  if (method.startsWith("Get") || method.startsWith("List") || method === "DrainStatus") return READ_HINT;
  return behindFence ? ATTEMPT_HINT : REPEAT_HINT;
}

const ERRORS: ReadonlyMap<number, new (message: string, code: string) => RpcError> = new Map<
  number,
  new (message: string, code: string) => RpcError
>([
  [Status.INVALID_ARGUMENT, InvalidArgument],
  [Status.NOT_FOUND, NotFound],
  [Status.ALREADY_EXISTS, AlreadyExists],
  [Status.FAILED_PRECONDITION, FailedPrecondition],
  [Status.PERMISSION_DENIED, PermissionDenied],
  [Status.UNAUTHENTICATED, Unauthenticated],
  [Status.UNIMPLEMENTED, NotSupported],
]);

/** A failed gRPC call as grpc-js reports it. */
export interface StatusLike {
  code: number;
  details: string;
}

/** What a call none of whose tries reached a coordinator says to check. */
export const NO_COORDINATOR_HINT = " (is one serving at the target? `coordinator up` runs one on this machine)";

/** The status name of a gRPC code ("INVALID_ARGUMENT"). */
export function codeName(code: number): string {
  return Status[code] ?? "UNKNOWN";
}

/** Whether a try that failed with `code` may not have reached the coordinator. */
export function isTransport(code: number): boolean {
  return TRANSPORT.has(code);
}

/** Whether a try that failed is tried again: a transport failure, or a keyed call's
 * duplicate refused while its first try runs. */
export function isRetried(failure: StatusLike, keyed: boolean): boolean {
  return isTransport(failure.code) || (keyed && failure.code === IN_FLIGHT);
}

/** Whether a failure happened before any connection took the request, or a replica refused
 * to run it (RESOURCE_EXHAUSTED is answered before the handler runs): it cannot have landed. */
export function neverSent(failure: StatusLike): boolean {
  if (failure.code === Status.RESOURCE_EXHAUSTED) return true;
  return (
    failure.code === Status.UNAVAILABLE &&
    NEVER_SENT.some((prefix) => failure.details.startsWith(prefix))
  );
}

/** The SDK error for an item error of a batch (a status name and its message). */
export function errorOf(code: string, message: string): CoordinatorError {
  const number = (Status as unknown as Record<string, number | undefined>)[code];
  const kind = number !== undefined ? ERRORS.get(number) : undefined;
  return kind ? new kind(`${code}: ${message}`, code) : new RpcError(`${code}: ${message}`, code);
}

/**
 * The SDK error for a failed call. A transport code (and a keyed call's ABORTED) becomes
 * OutcomeUnknown (with `hint`, what to repeat) if a try `maybeSent` its request, else a
 * TransportError saying no try reached a coordinator (or, when a coordinator refused every try
 * RESOURCE_EXHAUSTED, that it did).
 */
export function translate(
  failure: StatusLike,
  options: { maybeSent: boolean; hint: string; keyed: boolean },
): CoordinatorError {
  const name = codeName(failure.code);
  const message = `${name}: ${failure.details}`;
  if (!isRetried(failure, options.keyed)) {
    const kind = ERRORS.get(failure.code);
    return kind ? new kind(message, name) : new RpcError(message, name);
  }
  if (options.maybeSent && options.hint === READ_HINT) return new TransportError(`${message}; ${READ_HINT}`, name);
  if (options.maybeSent) {
    return new OutcomeUnknown(`${message}; outcome unknown, not failed; ${options.hint}`, name);
  }
  if (failure.code === Status.RESOURCE_EXHAUSTED) {
    // A coordinator answered every try: a bound refused it. Nothing to look for at the target.
    return new TransportError(`${message}; refused on every try, nothing ran`, name);
  }
  return new TransportError(`${message}; no try reached a coordinator${NO_COORDINATOR_HINT}`, name);
}
