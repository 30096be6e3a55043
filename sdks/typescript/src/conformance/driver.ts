/**
 * The TypeScript SDK's conformance driver: `node sdks/typescript/dist/conformance/driver.js`.
 *
 * Speaks conformance/PROTOCOL.md: one JSON request a line on stdin, answered one at a time
 * with one JSON reply a line on stdout (plus unsolicited `lost` events), logs on stderr. It
 * uses the public SDK only, configured from the SDK's own environment (COORDINATOR_TARGET,
 * COORDINATOR_TOKEN, the TLS variables, COORDINATOR_WORKER_ID), so the env contract is
 * exercised too.
 */
import { createInterface } from "node:readline";

import {
  Claim,
  ClaimRefused,
  CoordinatorError,
  FenceReason,
  type LostReason,
  NotFound,
  Outcome,
  TaskState,
  WorkerClient,
  errorKind,
} from "../index.js";
import { SlotDownstream } from "./downstream.js";

/** The TTL of every claim a driver makes (PROTOCOL.md). */
const TTL = 5;

type Args = Record<string, unknown>;
type Reply = Record<string, unknown>;

/** A JSON value as the bytes the SDK sends: compact UTF-8 JSON. */
export function encode(value: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(value ?? null));
}

/** Bytes received as a JSON value: null when empty, the text when not JSON. */
export function decode(data: Uint8Array): unknown {
  if (data.length === 0) return null;
  const text = new TextDecoder().decode(data);
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** A loss as one name: its fence reason, else its outcome (CANCELLED, STALLED, ...). */
function reasonName(lost: LostReason): string {
  return lost.reason !== FenceReason.UNSPECIFIED ? FenceReason[lost.reason] : Outcome[lost.outcome];
}

function outcomeOf(outcome: Outcome, reason: FenceReason): Reply {
  return { outcome: Outcome[outcome], ...(reason ? { reason: FenceReason[reason] } : {}) };
}

/** The protocol's error object for what an op threw. */
function errorOf(error: unknown): Reply {
  const code = error instanceof CoordinatorError && error.code ? error.code : "UNKNOWN";
  return { code, kind: errorKind(error), message: error instanceof Error ? error.message : String(error) };
}

function write(message: Reply): void {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

/** The ops of PROTOCOL.md over one WorkerClient; claims by their driver-local names. */
class Driver {
  private readonly claims = new Map<string, Claim>();
  // The name a task's claim goes by, for its lost event (a loss names its task).
  private readonly names = new Map<string, string>();
  readonly ops: Record<string, (args: Args) => Promise<Reply>> = {
    create_task: async (a) => {
      const attempts = a.max_attempts as number | undefined;
      const task = await this.client.createTask({
        taskId: (a.task_id as string | undefined) ?? "",
        queue: a.queue as string,
        input: encode(a.input),
        ...(attempts ? { maxAttempts: attempts } : {}),
      });
      return { task_id: task.taskId };
    },
    get_task: async (a) => {
      const task = await this.client.getTask(a.task_id as string);
      return { state: TaskState[task.state], attempts: task.attempt };
    },
    get_result: (a) => this.result(String(a.task_id)),
    claim: (a) => this.claim(a),
    checkpoint: async (a) => {
      this.held(a.claim).checkpoint(encode(a.data));
      return {};
    },
    commit: (a) => this.commit(a),
    fail: async (a) => {
      const failed = await this.held(a.claim).fail(String(a.error), { retryable: Boolean(a.retryable) });
      return outcomeOf(failed.outcome, failed.reason);
    },
    release: async (a) => {
      const released = await this.held(a.claim).release();
      return outcomeOf(released.outcome, released.reason);
    },
    effect: (a) => this.effect(a),
    wait_lost: (a) => this.waitLost(a),
    held: async () => ({
      claims: [...this.claims].filter(([, c]) => c.isHeld()).map(([name]) => name).sort(),
    }),
  };

  constructor(private readonly client: WorkerClient) {}

  private held(name: unknown): Claim {
    const claim = this.claims.get(String(name));
    if (!claim) throw new Error(`no claim named ${JSON.stringify(name)}`);
    return claim;
  }

  private readonly onLost = (lost: LostReason): void => {
    write({ event: "lost", claim: this.names.get(lost.taskId) ?? lost.taskId, reason: reasonName(lost) });
  };

  /** null for a task without a committed result, NOT_FOUND for a task that does not exist. */
  private async result(taskId: string): Promise<Reply> {
    try {
      return { result: decode((await this.client.getResult(taskId)).result) };
    } catch (error) {
      if (!(error instanceof NotFound)) throw error;
      await this.client.getTask(taskId); // NotFound: no such task at all
      return { result: null };
    }
  }

  private async claim(a: Args): Promise<Reply> {
    const options = { ttlSeconds: TTL, onLost: this.onLost };
    const wait = a.wait_s as number | undefined;
    const maxTasks = (a.max_tasks as number | undefined) ?? 1;
    let won: Claim | Claim[] | ClaimRefused;
    if (a.task_id !== undefined) won = await this.client.claim(String(a.task_id), options);
    else if (maxTasks > 1) won = await this.client.claimNext(String(a.queue), { ...options, waitSeconds: wait, maxTasks });
    else won = await this.client.claimNext(String(a.queue), { ...options, waitSeconds: wait });
    const claims = won instanceof ClaimRefused ? [] : Array.isArray(won) ? won : [won];
    return { claims: this.hold(String(a.as), claims) };
  }

  /** Name each claim: `name`, then `name.1`, `name.2` ... */
  private hold(name: string, claims: Claim[]): Reply[] {
    return claims.map((claim, index) => {
      const local = index === 0 ? name : `${name}.${index}`;
      this.names.set(claim.taskId, local);
      this.claims.set(local, claim);
      return {
        as: local,
        task_id: claim.taskId,
        generation: Number(claim.generation),
        input: decode(claim.input),
        checkpoint: decode(claim.previousCheckpoint),
      };
    });
  }

  private async commit(a: Args): Promise<Reply> {
    const name = String(a.claim);
    const claim = this.held(name);
    if (a.next_queue === undefined) {
      const done = await claim.commit(encode(a.result));
      return outcomeOf(done.outcome, done.reason);
    }
    const done = await claim.commit(encode(a.result), { next: { queue: String(a.next_queue), ttlSeconds: TTL } });
    return { ...outcomeOf(done.outcome, done.reason), next: this.hold(`${name}.next`, done.next) };
  }

  private async effect(a: Args): Promise<Reply> {
    const claim = this.held(a.claim);
    const downstream = new SlotDownstream(String(a.downstream_url), String(a.slot), claim.taskId);
    const done = await claim.effect("conformance", String(a.slot), encode(a.payload), downstream);
    const outcome = done.conflict ? Outcome.PAYLOAD_CONFLICT : done.outcome;
    return { ...outcomeOf(outcome, done.reason), sent: done.sent, reconciled: done.status === "reconciled" };
  }

  private async waitLost(a: Args): Promise<Reply> {
    const claim = this.held(a.claim);
    if (!claim.signal.aborted) {
      await new Promise<void>((ok) => {
        const timer = setTimeout(ok, Number(a.timeout_s) * 1000);
        claim.signal.addEventListener("abort", () => (clearTimeout(timer), ok()), { once: true });
      });
    }
    const lost = claim.lostReason;
    return lost ? { lost: true, reason: reasonName(lost) } : { lost: false };
  }
}

async function main(): Promise<number> {
  // The principal from COORDINATOR_WORKER_ID (the SDK reads it), else one of this process.
  const client = new WorkerClient(process.env.COORDINATOR_WORKER_ID ? {} : { principal: `conformance-ts-${process.pid}` });
  const driver = new Driver(client);
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (!line.trim()) continue;
    const request = JSON.parse(line) as Args;
    if (request.op === "exit") {
      write({ id: request.id, ok: true });
      break;
    }
    const op = driver.ops[String(request.op)];
    if (!op) {
      write({ id: request.id, ok: false, error: { code: "UNIMPLEMENTED", kind: "Driver", message: `no op ${line}` } });
      continue;
    }
    try {
      write({ id: request.id, ok: true, ...(await op(request)) });
    } catch (error) {
      if (!(error instanceof CoordinatorError)) console.error(error);
      write({ id: request.id, ok: false, error: errorOf(error) });
    }
  }
  // Held claims are left as they are (not released): they expire as a crashed worker's would.
  client.close();
  return 0;
}

process.exitCode = await main();
process.exit();
