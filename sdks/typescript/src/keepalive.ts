/**
 * One keepalive loop for every claim of a client: renewals that fall due together go to the
 * coordinator in one RenewMany call, with the Python SDK's timing (coordinator/sdk/_renewer.py).
 *
 * Each claim keeps its own schedule (TTL/3 after its last renewal was sent, a quarter of that
 * after a failure) and gets its own answer, so loss detection stays per claim. The loop sleeps
 * until the first renewal is due, then renews every claim due within a tenth of its interval
 * (a renewal a little early costs nothing: the TTL is restored from its send), in calls of at
 * most MAX_BATCH claims and MAX_BYTES of requests. A call's deadline is the longest lease left
 * among its claims; a coordinator that cannot be reached loses a claim only once its own lease
 * ran out by the local clock. No SDK retries: this loop is the retry. A coordinator without
 * RenewMany (UNIMPLEMENTED) is renewed one Renew per claim.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";

import type { Claim } from "./claim.js";
import { monotonic } from "./lease.js";
import { CoordinatorError, NotSupported, TransportError } from "./errors.js";
import type { RenewRequestSchema, RenewResponse } from "./gen/coordinator/v1/worker_pb.js";
import { WorkerService } from "./gen/coordinator/v1/worker_pb.js";
import { FenceReason, Outcome } from "./outcomes.js";
import { errorOf } from "./status.js";
import type { Transport } from "./transport.js";

/** Claims per RenewMany (the coordinator takes up to 1000). */
export const MAX_BATCH = 500;
/** Request bytes per RenewMany (checkpoints make renewals up to 64 KiB each). */
export const MAX_BYTES = 1 << 20;
/** A claim due within this fraction of its renewal interval goes with the current call. */
export const EARLY = 0.1;

// Bytes a renewal takes on the wire besides its checkpoint (a fence and a progress marker).
const RENEWAL_OVERHEAD = 256;

type Request = MessageInitShape<typeof RenewRequestSchema>;

/** A claim due for renewal, its request, and how long that request may take. */
export interface Due {
  claim: Claim;
  request: Request;
  timeout: number;
}

type Answer = RenewResponse | Error;

/** The claims due within EARLY of their interval at `now`, in calls (pure: no I/O). */
export function takeDue(schedule: Map<Claim, number>, now: number, transport: Transport): Due[][] {
  const due: Due[] = [];
  for (const [claim, when] of schedule) {
    if (!claim.keepaliveWanted()) {
      schedule.delete(claim);
    } else if (when <= now + EARLY * claim.renewalInterval()) {
      schedule.delete(claim);
      const { request, timeout } = claim.renewalRequest(transport.policy);
      due.push({ claim, request, timeout });
    }
  }
  return batches(due);
}

/** `due` in calls of at most MAX_BATCH claims and MAX_BYTES. */
export function batches(due: Due[]): Due[][] {
  const out: Due[][] = [];
  let current: Due[] = [];
  let size = 0;
  for (const entry of due) {
    const bytes = RENEWAL_OVERHEAD + (entry.request.checkpoint?.length ?? 0) + (entry.request.progress?.length ?? 0);
    if (current.length > 0 && (current.length >= MAX_BATCH || size + bytes > MAX_BYTES)) {
      out.push(current);
      current = [];
      size = 0;
    }
    current.push(entry);
    size += bytes;
  }
  if (current.length > 0) out.push(current);
  return out;
}

/** The keepalive loop of one client (see the module comment). It runs while claims are held. */
export class Keepalive {
  private readonly schedule = new Map<Claim, number>();
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private closed = false;
  private batched = true;
  /** RenewMany (or Renew) calls sent, for callers that measure the loop. */
  calls = 0;

  constructor(private readonly transport: Transport) {}

  /** Keep `claim` alive from now on (its first renewal at TTL/3 from now). */
  add(claim: Claim): void {
    if (this.closed) throw new CoordinatorError("the client is closed: its claims are not renewed");
    this.schedule.set(claim, claim.nextRenewal(monotonic(), true));
    this.arm();
  }

  /** How many claims are kept alive. */
  get size(): number {
    let n = 0;
    for (const claim of this.schedule.keys()) if (claim.keepaliveWanted()) n += 1;
    return n;
  }

  /** Stop the loop (claims still held are no longer renewed: their leases run out). */
  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
  }

  private arm(): void {
    if (this.running || this.closed) return;
    clearTimeout(this.timer);
    let first: number | undefined;
    for (const [claim, when] of this.schedule) {
      if (claim.keepaliveWanted() && (first === undefined || when < first)) first = when;
    }
    if (first === undefined) return;
    const delay = Math.max(first - monotonic(), 0);
    // Unref'd, as the Python SDK's daemon thread: held claims alone keep no process alive.
    this.timer = setTimeout(() => void this.round(), delay * 1000).unref();
  }

  private async round(): Promise<void> {
    this.running = true;
    try {
      for (const batch of takeDue(this.schedule, monotonic(), this.transport)) {
        const sent = monotonic();
        let answers: Answer[];
        try {
          answers = await this.send(batch);
        } catch (error) {
          answers = batch.map(() => error as Error); // a bug here: no claim may look renewed
        }
        batch.forEach(({ claim, request }, i) => {
          const answer = answers[i] ?? new Error("no answer for this renewal");
          let accepted = false;
          try {
            if (answer instanceof CoordinatorError) claim.renewalFailed(answer, answer instanceof TransportError);
            else if (answer instanceof Error) throw answer;
            else accepted = claim.renewed(sent, answer, request);
          } catch (error) {
            // A dead keepalive must never look like a healthy one.
            claim.markLost(Outcome.FENCED, FenceReason.UNSPECIFIED, `keepalive crashed: ${error}`, "error");
          }
          if (!this.closed && claim.keepaliveWanted()) this.schedule.set(claim, claim.nextRenewal(sent, accepted));
        });
      }
    } finally {
      this.running = false;
      this.arm();
    }
  }

  private async send(batch: Due[]): Promise<Answer[]> {
    this.calls += 1;
    if (this.batched) {
      const timeout = Math.max(...batch.map((d) => d.timeout));
      try {
        const response = await this.transport.call(
          WorkerService.method.renewMany,
          { renewals: batch.map((d) => d.request) },
          { retry: false, timeoutSeconds: timeout },
        );
        return response.results.map((r) => (r.error ? errorOf(r.error.code, r.error.message) : (r.renewal as RenewResponse)));
      } catch (error) {
        if (!(error instanceof NotSupported)) return batch.map(() => error as Error);
        this.batched = false; // an older coordinator: one Renew per claim
      }
    }
    return Promise.all(
      batch.map(({ request, timeout }) =>
        this.transport
          .call(WorkerService.method.renew, request, { retry: false, timeoutSeconds: timeout })
          .catch((error: Error) => error),
      ),
    );
  }
}
