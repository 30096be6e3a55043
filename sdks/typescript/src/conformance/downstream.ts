/**
 * The conformance downstream as this SDK sees it (conformance/PROTOCOL.md, op `effect`): a
 * Downstream whose send POSTs {"slot", "payload", "task_id"} to `<url>/send` and whose lookup
 * GETs `<url>/lookup?slot=...`; the harness serves the URL and counts the calls.
 */
import { DownstreamRefused, type DownstreamResult, DownstreamUncertain, type Downstream } from "../effects.js";

/** Seconds a call to the downstream may take before its outcome counts as unknown. */
const TIMEOUT = 5;

/** One effect slot of one task at the harness's downstream. */
export class SlotDownstream implements Downstream {
  private readonly url: string;

  constructor(
    url: string,
    private readonly slot: string,
    private readonly taskId: string,
  ) {
    this.url = url.replace(/\/+$/, "");
  }

  /** POST /send: 2xx performed, 4xx refused (not performed), anything else unknown. */
  async execute(key: string, generation: bigint, payload: Uint8Array): Promise<DownstreamResult> {
    const body = { slot: this.slot, payload: JSON.parse(new TextDecoder().decode(payload)), task_id: this.taskId };
    const [status, answer] = await call(`${this.url}/send`, {
      method: "POST",
      body: JSON.stringify(body),
      headers: {
        "Content-Type": "application/json",
        "Idempotency-Key": key,
        "X-Fencing-Generation": String(generation),
      },
    });
    if (status >= 200 && status < 300) return { externalRef: String(answer.message_id ?? "") };
    if (status >= 400 && status < 500) {
      throw new DownstreamRefused(`the downstream refused the send: ${status} ${JSON.stringify(answer)}`);
    }
    throw new DownstreamUncertain(`the downstream answered ${status} ${JSON.stringify(answer)}`);
  }

  /** GET /lookup?slot=...: 200 performed (its answer), 404 never performed. */
  async lookup(_key: string, generation: bigint): Promise<DownstreamResult | null> {
    const [status, answer] = await call(`${this.url}/lookup?slot=${encodeURIComponent(this.slot)}`, {
      method: "GET",
      headers: { "X-Fencing-Generation": String(generation) },
    });
    if (status === 200) return { externalRef: String(answer.message_id ?? "") };
    if (status === 404) return null;
    throw new DownstreamUncertain(`the lookup answered ${status} ${JSON.stringify(answer)}`);
  }
}

/** The status and JSON body of one call; a call that got no answer is uncertain. */
async function call(url: string, init: RequestInit): Promise<[number, Record<string, unknown>]> {
  try {
    const response = await fetch(url, { ...init, signal: AbortSignal.timeout(TIMEOUT * 1000) });
    const text = await response.text();
    return [response.status, text ? (JSON.parse(text) as Record<string, unknown>) : {}];
  } catch (error) {
    throw new DownstreamUncertain(`the call was not answered: ${error}`);
  }
}
