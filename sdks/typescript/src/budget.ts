/**
 * How long one call keeps retrying: plain functions over seconds, the Python SDK's rules
 * (coordinator/sdk/_budget.py). A call retries until the earlier of its retry budget and, for a
 * call behind a claim's fence, the lease time the claim has left: past the lease's end a retry
 * could only learn what a later call learns as well.
 */

/** Seconds a retry gets at least, even close to the deadline: a shorter try cannot answer. */
export const MIN_TRY_TIMEOUT = 0.2;

/**
 * When a call that began at `start`, and whose first try failed at `failed`, stops retrying:
 * `budget` seconds after that failure (a long poll's wait spends none of it), or as soon as
 * the lease ends (`leaseLeft` seconds after `start`) for a call behind a claim's fence.
 */
export function retryDeadline(start: number, failed: number, budget: number, leaseLeft?: number): number {
  let end = failed + Math.max(budget, 0);
  if (leaseLeft !== undefined) end = Math.min(end, start + leaseLeft);
  return Math.max(end, start);
}

/** Whether the next try, after `upcomingSleep` of backoff, would start at or after `deadline`. */
export function outOfTime(now: number, upcomingSleep: number, deadline: number): boolean {
  return now + upcomingSleep >= deadline;
}

/** The deadline of a retry: `perTry`, cut to what is left before `deadline`, never below
 * MIN_TRY_TIMEOUT. */
export function tryTimeout(now: number, deadline: number, perTry: number): number {
  return Math.min(perTry, Math.max(deadline - now, MIN_TRY_TIMEOUT));
}

/** The backoff before retry `n` (1 for the first retry): initial, 2x, 4x ... up to `max`, plus
 * up to one `initial` of jitter so a pool cut off together does not come back in lockstep. */
export function backoff(n: number, initial: number, max: number, random: () => number): number {
  return Math.min(initial * 2 ** (n - 1), max) + random() * initial;
}
