/**
 * Side effects from a claim: one call runs prepare -> execute / skip / reconcile -> record, the
 * protocol of the Python SDK (coordinator/sdk/effects.py), at most one send.
 *
 * The effect id the coordinator returns is the idempotency key, for this attempt and every
 * later one: a Downstream sends it with the claim generation and never invents a new key to
 * resend. A send whose answer is lost (a timeout, a dropped connection) is recorded UNKNOWN; a
 * later attempt is told to RECONCILE it - look the key up downstream - and records COMMITTED or
 * ABSENT from what it finds, without sending. Only ABSENT (confirmed not to have happened) lets
 * the holder send again, with the same key. A slot bound to another payload (PAYLOAD_CONFLICT)
 * is never sent with ours: the original is reconciled or skipped.
 */
import type { Claim } from "./claim.js";
import { type Payload, bytesOf, digestOf } from "./payload.js";
import { CoordinatorError } from "./errors.js";
import type { PrepareEffectResponse } from "./gen/coordinator/v1/worker_pb.js";
import { WorkerService } from "./gen/coordinator/v1/worker_pb.js";
import { EffectAction, EffectState, FenceReason, Outcome } from "./outcomes.js";

/** What the downstream produced: a reference to it (message id, URL) and its ETag. */
export interface DownstreamResult {
  externalRef: string;
  etag?: string;
}

/** The call may or may not have been performed (timeout, lost response, 5xx). */
export class DownstreamUncertain extends CoordinatorError {}
/** The downstream answered that it did not perform the call (a definite 4xx, no connection). */
export class DownstreamRefused extends CoordinatorError {}
/** The downstream cannot tell whether a key was performed (it keeps no idempotent results). */
export class LookupUnsupported extends CoordinatorError {}

/** A side-effect target. Implementations send exactly the key they are given. */
export interface Downstream {
  /** Perform the call once for `key` (`generation` is the fencing token). Throw
   * DownstreamUncertain if the outcome is unknown, DownstreamRefused if it was not performed. */
  execute(key: string, generation: bigint, payload: Uint8Array): Promise<DownstreamResult>;
  /** The result of the call of `key` if performed, null if not. Throw LookupUnsupported if it
   * cannot tell, DownstreamUncertain if it did not answer. */
  lookup(key: string, generation: bigint): Promise<DownstreamResult | null>;
}

/** How one `claim.effect` call ended. */
export type EffectStatus =
  /** Sent now and confirmed; recorded COMMITTED. */
  | "executed"
  /** Already COMMITTED (by this or an earlier attempt): not sent. */
  | "skipped"
  /** An earlier attempt's send was found performed downstream: recorded COMMITTED, not sent. */
  | "reconciled"
  /** Nobody knows whether it happened: recorded UNKNOWN. Never retry blindly. */
  | "uncertain"
  /** The downstream definitely did not perform it: recorded ABSENT. */
  | "not_performed"
  /** The slot is bound to another payload whose call did not happen: nothing sent. */
  | "conflict"
  /** The claim lost its fence: nothing sent by this call. */
  | "fenced";

/** The result of `claim.effect`: what happened, under which key, and what it produced. */
export interface EffectOutcome {
  readonly status: EffectStatus;
  readonly effectId: string;
  readonly externalRef: string;
  readonly etag: string;
  /** The digest the slot is bound to (on a conflict: the original payload's). */
  readonly payloadDigest: string;
  /** The slot held another payload (PAYLOAD_CONFLICT); the original effect stands. */
  readonly conflict: boolean;
  /** Whether this call sent anything downstream. */
  readonly sent: boolean;
  /** Whether the coordinator accepted the record of what happened. */
  readonly recorded: boolean;
  readonly outcome: Outcome;
  readonly reason: FenceReason;
  readonly message: string;
  /** Whether the effect is known to have happened exactly once. */
  readonly done: boolean;
}

// A prepare after ABSENT says EXECUTE; more rounds than this mean something is wrong.
const ROUNDS = 3;

/** One effect call in progress. */
class Slot {
  effectId = "";
  boundDigest = "";
  conflict = false;
  sent = false;

  constructor(
    readonly claim: Claim,
    readonly nodeId: string,
    readonly effectSlot: string,
    readonly downstream: Downstream,
    readonly reconcilePrincipal: string,
  ) {}

  outcome(status: EffectStatus, fields: Partial<EffectOutcome> = {}): EffectOutcome {
    return {
      status,
      effectId: this.effectId,
      externalRef: "",
      etag: "",
      payloadDigest: this.boundDigest,
      conflict: this.conflict,
      sent: this.sent,
      recorded: true,
      outcome: Outcome.OK,
      reason: FenceReason.UNSPECIFIED,
      message: "",
      ...fields,
      done: status === "executed" || status === "skipped" || status === "reconciled",
    };
  }

  fenced(outcome: Outcome, reason: FenceReason, message: string): EffectOutcome {
    this.claim.markLost(outcome, reason, message, "effect");
    return this.outcome("fenced", { recorded: false, outcome, reason, message });
  }

  /** Record `state` and describe the call as `status` (`recorded` false if fenced). */
  async recorded(
    state: EffectState,
    status: EffectStatus,
    result?: DownstreamResult,
    message = "",
  ): Promise<EffectOutcome> {
    const response = await this.claim.call(WorkerService.method.recordEffect, {
      fence: this.claim.fence,
      effectId: this.effectId,
      state,
      externalRef: result?.externalRef ?? "",
      etag: result?.etag ?? "",
      reconcilePrincipal: state === EffectState.UNKNOWN ? this.reconcilePrincipal : "",
    });
    if (response.outcome !== Outcome.OK) {
      this.claim.markLost(response.outcome, response.reason, response.message, "effect");
    }
    return this.outcome(status, {
      externalRef: result?.externalRef ?? "",
      etag: result?.etag ?? "",
      recorded: response.outcome === Outcome.OK,
      outcome: response.outcome,
      reason: response.reason,
      message: message || response.message,
    });
  }

  /** Send once with the effect id as the key, then record what came of it. */
  async execute(payload: Uint8Array): Promise<EffectOutcome> {
    this.sent = true;
    let result: DownstreamResult;
    try {
      result = await this.downstream.execute(this.effectId, this.claim.generation, payload);
    } catch (error) {
      if (error instanceof DownstreamUncertain) return this.recorded(EffectState.UNKNOWN, "uncertain", undefined, error.message);
      if (error instanceof DownstreamRefused) return this.recorded(EffectState.ABSENT, "not_performed", undefined, error.message);
      throw error;
    }
    return this.recorded(EffectState.COMMITTED, "executed", result);
  }

  /** Ask the downstream about the key instead of sending; undefined when it was ABSENT. */
  async reconcile(): Promise<EffectOutcome | undefined> {
    let found: DownstreamResult | null;
    try {
      found = await this.downstream.lookup(this.effectId, this.claim.generation);
    } catch (error) {
      if (error instanceof LookupUnsupported || error instanceof DownstreamUncertain) {
        return this.recorded(EffectState.UNKNOWN, "uncertain", undefined, error.message);
      }
      throw error;
    }
    if (found) return this.recorded(EffectState.COMMITTED, "reconciled", found);
    const absent = await this.claim.call(WorkerService.method.recordEffect, {
      fence: this.claim.fence,
      effectId: this.effectId,
      state: EffectState.ABSENT,
    });
    if (absent.outcome !== Outcome.OK) return this.fenced(absent.outcome, absent.reason, absent.message);
    return undefined;
  }
}

/**
 * Run the whole protocol for one slot of `claim` (see the module comment): at most one send.
 * What the downstream throws besides DownstreamUncertain / DownstreamRefused / LookupUnsupported
 * reaches the caller.
 */
export async function runEffect(
  claim: Claim,
  nodeId: string,
  effectSlot: string,
  payload: Payload,
  downstream: Downstream,
  options: { reconcilePrincipal?: string } = {},
): Promise<EffectOutcome> {
  const bytes = bytesOf(payload);
  const slot = new Slot(claim, nodeId, effectSlot, downstream, options.reconcilePrincipal ?? "");
  for (let round = 0; round < ROUNDS; round++) {
    const prepared: PrepareEffectResponse = await claim.call(WorkerService.method.prepareEffect, {
      fence: claim.fence,
      nodeId,
      effectSlot,
      payloadDigest: digestOf(bytes),
    });
    if (prepared.outcome !== Outcome.OK && prepared.outcome !== Outcome.PAYLOAD_CONFLICT) {
      return slot.fenced(prepared.outcome, prepared.reason, prepared.message);
    }
    slot.effectId = prepared.effectId;
    slot.boundDigest = prepared.effect?.payloadDigest ?? "";
    slot.conflict = prepared.outcome === Outcome.PAYLOAD_CONFLICT;
    if (prepared.action === EffectAction.SKIP) {
      return slot.outcome("skipped", {
        externalRef: prepared.effect?.externalRef ?? "",
        etag: prepared.effect?.etag ?? "",
        message: prepared.message,
      });
    }
    // A conflict with an original confirmed ABSENT: nothing to do with ours.
    if (prepared.action === EffectAction.UNSPECIFIED) return slot.outcome("conflict", { message: prepared.message });
    // A key this attempt sent before is looked up, never sent again.
    const execute = prepared.action === EffectAction.EXECUTE && claim.firstSend(slot.effectId);
    if (execute) return slot.execute(bytes);
    const found = await slot.reconcile();
    if (found) return found;
    // The original never happened, and ours is not the slot's payload.
    if (slot.conflict) return slot.outcome("conflict", { message: prepared.message });
    // ABSENT: prepare again, which says EXECUTE with the same key.
  }
  throw new CoordinatorError(`effect ${nodeId}/${effectSlot}: still not executable after ${ROUNDS} prepares`);
}

/**
 * The HTTP Downstream of an outbox-style service (coordinator.demo.outbox): `POST /send` with
 * `Idempotency-Key` and `X-Fencing-Generation`, `GET /lookup/<key>`.
 */
export class HttpDownstream implements Downstream {
  constructor(
    private readonly baseUrl: string,
    private readonly timeoutSeconds = 5,
  ) {
    if (!/^https?:\/\/[^/]+/.test(baseUrl)) throw new TypeError(`baseUrl must be http(s)://host:port, got ${baseUrl}`);
  }

  /** `POST /send`: 2xx is a result, 4xx a refusal, anything else uncertain. */
  async execute(key: string, generation: bigint, payload: Uint8Array): Promise<DownstreamResult> {
    const headers = { "Idempotency-Key": key, "X-Fencing-Generation": String(generation) };
    const { status, body, etag } = await this.request("/send", { method: "POST", headers, body: payload });
    if (status >= 200 && status < 300) return { externalRef: String(body.message_id ?? ""), etag };
    if (status >= 400 && status < 500) throw new DownstreamRefused(`downstream refused the call: ${status} ${JSON.stringify(body)}`);
    throw new DownstreamUncertain(`downstream answered ${status} ${JSON.stringify(body)}`);
  }

  /** `GET /lookup/<key>`: 200 performed, 404 not performed, 501 cannot tell. */
  async lookup(key: string, generation: bigint): Promise<DownstreamResult | null> {
    const headers = { "X-Fencing-Generation": String(generation) };
    const { status, body, etag } = await this.request(`/lookup/${encodeURIComponent(key)}`, { method: "GET", headers });
    if (status === 200) return { externalRef: String(body.message_id ?? ""), etag };
    if (status === 404) return null;
    if (status === 501) throw new LookupUnsupported(`the downstream keeps no idempotent results: ${JSON.stringify(body)}`);
    throw new DownstreamUncertain(`lookup answered ${status} ${JSON.stringify(body)}`);
  }

  private async request(
    path: string,
    init: { method: string; headers: Record<string, string>; body?: Uint8Array },
  ): Promise<{ status: number; body: Record<string, unknown>; etag: string }> {
    let response: Response;
    try {
      response = await fetch(this.baseUrl.replace(/\/$/, "") + path, {
        ...init,
        signal: AbortSignal.timeout(this.timeoutSeconds * 1000),
      });
    } catch (error) {
      // fetch cannot say whether the request left: a refused connection did not, a timeout may.
      const cause = (error as { cause?: { code?: string } }).cause;
      if (cause?.code === "ECONNREFUSED") throw new DownstreamRefused(`cannot connect to the downstream: ${cause.code}`);
      throw new DownstreamUncertain(`the response was lost: ${error}`);
    }
    const text = await response.text().catch(() => "");
    let body: Record<string, unknown> = {};
    try {
      body = text ? (JSON.parse(text) as Record<string, unknown>) : {};
    } catch {
      body = { raw: text.slice(0, 200) };
    }
    return { status: response.status, body, etag: (response.headers.get("etag") ?? "").replaceAll('"', "") };
  }
}
