/**
 * A claim's lease clock and what its next renewal carries: pure bookkeeping, no I/O (the
 * Python SDK's sdk/_held.py state). The lease end is measured from the send of the call that
 * restored it, not from its answer, so the local clock can only run early.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";

import type { Fence } from "./gen/coordinator/v1/types_pb.js";
import type { RenewRequestSchema, RenewResponse } from "./gen/coordinator/v1/worker_pb.js";

// A renewal gets at least this long even when the local lease clock says time is up: the
// server may still hold the lease (the local clock starts at the send, so it runs early).
const MIN_RENEW_TIMEOUT = 0.2;

/** Seconds on the monotonic clock every lease computation uses. */
export const monotonic = (): number => performance.now() / 1000;

/** A renewal request. */
export type Renewal = MessageInitShape<typeof RenewRequestSchema>;

/** The lease of one claim: when it ends locally, and the latest progress and checkpoint. */
export class Lease {
  /** Renewals the coordinator accepted. */
  accepted = 0;
  private expiresAt: number;
  private marker = "";
  // The latest checkpoint not yet kept by a renewal (undefined: nothing new to send).
  private pending: Uint8Array | undefined;

  /** `leftSeconds`: what the claim's answer said the lease has left (0: the whole TTL). */
  constructor(
    readonly ttlSeconds: number,
    sentAt: number,
    leftSeconds: number,
  ) {
    this.expiresAt = sentAt + (leftSeconds || ttlSeconds);
  }

  /** Seconds left by the local monotonic clock (0 once it ran out). */
  remaining(): number {
    return Math.max(this.expiresAt - monotonic(), 0);
  }

  /** Record a progress marker; the next renewal carries the latest one. */
  progress(marker: string): void {
    this.marker = marker;
  }

  /** Record a checkpoint; the next renewal carries the latest one until one keeps it. */
  checkpoint(data: Uint8Array): void {
    this.pending = data.slice();
  }

  /** Whether a checkpoint is recorded that no renewal has kept yet. */
  get checkpointPending(): boolean {
    return this.pending !== undefined;
  }

  /** The next renewal of `fence` and its deadline: never past the lease by the local clock,
   * never below MIN_RENEW_TIMEOUT, never above `perTry`. */
  request(fence: Fence, perTry: number): { request: Renewal; timeout: number } {
    const request: Renewal = { fence, progress: this.marker };
    if (this.pending !== undefined) request.checkpoint = this.pending;
    return { request, timeout: Math.min(perTry, Math.max(this.remaining(), MIN_RENEW_TIMEOUT)) };
  }

  /** An accepted renewal sent at `sent`: the lease runs its TTL from the send. A checkpoint it
   * carried is kept unless the server refused it (its write budget): then it is sent again. */
  renewed(sent: number, response: RenewResponse, request: Renewal): void {
    this.expiresAt = sent + Math.max(Number(response.ttlSeconds), 1);
    this.accepted += 1;
    if (request.checkpoint !== undefined && this.pending === request.checkpoint && !response.checkpointRefused) {
      this.pending = undefined;
    }
  }

  /** When to renew next: TTL/3 after `sent`, a quarter of that after a failure. */
  next(sent: number, accepted: boolean): number {
    return sent + (accepted ? this.interval() : this.interval() / 4);
  }

  /** Seconds between accepted renewals: TTL/3. */
  interval(): number {
    return this.ttlSeconds / 3;
  }
}
