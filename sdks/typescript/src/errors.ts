/**
 * One exception root for the SDK, as in the Python SDK (coordinator/errors.py): every error a
 * call raises is a CoordinatorError. Business outcomes (FENCED, NO_READY_TASK, ...) are typed
 * results, never errors; errors mean bad input, a refused credential, an unreachable
 * coordinator, or a claim that is gone.
 */
import type { LostReason } from "./outcomes.js";

/** The root of every error the SDK raises. */
export class CoordinatorError extends Error {
  /** The gRPC status name behind the error ("INVALID_ARGUMENT", ...), or "" when none. */
  readonly code: string;

  constructor(message: string, code = "") {
    super(message);
    this.name = new.target.name;
    this.code = code;
  }
}

/**
 * The coordinator answered with a final gRPC status (bad input, a refused credential, ...):
 * the call did not happen and is not retried. Subclasses name the common statuses.
 */
export class RpcError extends CoordinatorError {}

/** INVALID_ARGUMENT: the request was malformed or past a bound; nothing was written. */
export class InvalidArgument extends RpcError {
  constructor(message: string, code = "INVALID_ARGUMENT") {
    super(message, code);
  }
}
/** NOT_FOUND: the task, effect or result does not exist. */
export class NotFound extends RpcError {
  constructor(message: string, code = "NOT_FOUND") {
    super(message, code);
  }
}
/** ALREADY_EXISTS: e.g. a task id that is taken by another task. */
export class AlreadyExists extends RpcError {
  constructor(message: string, code = "ALREADY_EXISTS") {
    super(message, code);
  }
}
/** FAILED_PRECONDITION: the state does not allow the call (e.g. an SDK below the minimum). */
export class FailedPrecondition extends RpcError {
  constructor(message: string, code = "FAILED_PRECONDITION") {
    super(message, code);
  }
}
/** PERMISSION_DENIED: the caller's principal may not do this. */
export class PermissionDenied extends RpcError {
  constructor(message: string, code = "PERMISSION_DENIED") {
    super(message, code);
  }
}
/** UNAUTHENTICATED: the bearer token or client certificate was refused. */
export class Unauthenticated extends RpcError {
  constructor(message: string, code = "UNAUTHENTICATED") {
    super(message, code);
  }
}
/** UNIMPLEMENTED: the coordinator is too old for this call. */
export class NotSupported extends RpcError {
  constructor(message: string, code = "UNIMPLEMENTED") {
    super(message, code);
  }
}

/** No try of a call is known to have reached a coordinator (or the caller cannot tell). */
export class TransportError extends CoordinatorError {}

/**
 * A try of the call may have reached a coordinator, and no answer came back: the outcome is
 * unknown, not failed. The message says what to repeat to learn it (the same call on the same
 * claim; a create with the same task id or idempotency key). Never treat it as a failure and
 * redo the work blind.
 */
export class OutcomeUnknown extends TransportError {}

/** The call was aborted by the caller's AbortSignal. */
export class CallAborted extends CoordinatorError {}

/**
 * The claim is no longer held (or too close to its lease end to start something): the work
 * must stop. `reason` says what lost it when the coordinator said so.
 */
export class ClaimLost extends CoordinatorError {
  /** What lost the claim; undefined when it was ended by its own commit/release/fail. */
  readonly reason: LostReason | undefined;

  constructor(message: string, reason?: LostReason) {
    super(message);
    this.reason = reason;
  }
}

/** The SDK error family an error belongs to, as the conformance protocol reports it. */
export function errorKind(error: unknown): string {
  if (error instanceof ClaimLost) return "ClaimLost";
  if (error instanceof OutcomeUnknown) return "OutcomeUnknown";
  if (error instanceof TransportError) return "TransportError";
  if (error instanceof RpcError) return "RpcError";
  if (error instanceof CallAborted) return "CallAborted";
  if (error instanceof CoordinatorError) return "CoordinatorError";
  return "Error";
}
