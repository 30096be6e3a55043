/** The claim requests' fields and how a claim's answer is read: pure, no I/O. */
import { InvalidArgument } from "./errors.js";
import type { ClaimResponse } from "./gen/coordinator/v1/worker_pb.js";
import { Outcome } from "./outcomes.js";

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

/** A wire Duration of `seconds`. */
export function durationOf(seconds: number): { seconds: bigint; nanos: number } {
  const whole = Math.floor(seconds);
  return { seconds: BigInt(whole), nanos: Math.round((seconds - whole) * 1e9) };
}
