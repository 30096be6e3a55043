/**
 * @coordinator/worker: the coordinator's worker and producer SDK for Node (20+).
 *
 * A WorkerClient claims tasks (claim / claimNext, long poll and batches) and hands back Claims
 * that hold the fence, an AbortSignal that fires when the claim is lost, and the acceptance
 * points (commit, fail, release, stageResult, authorizeTool, effect). One keepalive loop per
 * client renews every held claim with RenewMany. WorkerPool runs N slots and stops within a
 * grace on SIGTERM/SIGINT. Connection settings come from options or the `COORDINATOR_*`
 * environment, as for the Python SDK and the CLI.
 */
export { Claim, type CommitOptions, type LostCallback } from "./claim.js";
export type { FailOptions } from "./requests.js";
export { type CreateTaskOptions, type ListTasksOptions, type TaskRetryPolicy } from "./tasks.js";
export { MAX_INPUT_BYTES, MAX_RESULT_BYTES, type Payload, digestOf } from "./payload.js";
export {
  type ClaimNextOptions,
  type ClaimOptions,
  WorkerClient,
  type WorkerClientOptions,
} from "./client.js";
export {
  type Downstream,
  DownstreamRefused,
  type DownstreamResult,
  DownstreamUncertain,
  type EffectOutcome,
  type EffectStatus,
  HttpDownstream,
  LookupUnsupported,
} from "./effects.js";
export { DEFAULT_TARGET, type TlsOptions } from "./environment.js";
export {
  AlreadyExists,
  CallAborted,
  ClaimLost,
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
  errorKind,
} from "./errors.js";
export {
  type Answer,
  AttemptEnd,
  type AttemptInfo,
  ClaimRefused,
  type CommitOutcome,
  DeadLetterReason,
  EffectAction,
  EffectState,
  type FailOutcome,
  FenceReason,
  type LossSource,
  type LostReason,
  Outcome,
  type ReleaseOutcome,
  type ResultInfo,
  type StageOutcome,
  type TaskInfo,
  TaskState,
  type ToolAuthorization,
  describeLoss,
} from "./outcomes.js";
export { type Ending, GIVE_BACK_TIMEOUT, type Handler, type PoolOptions, type PoolReport, SHUTDOWN_ERROR, WorkerPool, stopOnSignals } from "./pool.js";
export { DEFAULT_RETRY, type RetryPolicy } from "./transport.js";
export { SDK_VERSION } from "./version.js";
