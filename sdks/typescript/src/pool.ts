/**
 * WorkerPool: a handler run over one or more queues with N slots, the Python SDK's pool
 * (coordinator/sdk/pool.py) in Node idioms.
 *
 *     const pool = new WorkerPool(client, async (claim, signal) => {
 *       const answer = await callModel(claim.inputText(), { signal }); // aborted if lost
 *       return answer;                                                // committed by the pool
 *     }, { queues: ["emails"], concurrency: 4 });
 *     stopOnSignals(pool);                                            // SIGTERM / SIGINT
 *     const report = await pool.run();                                // once shut down
 *
 * One client (one connection, one keepalive loop) serves every claim. Each queue has its own
 * claim loop; a loop claims only when a slot is free (up to `claimBatch` tasks a call), long
 * polling, and after an empty poll waits a backoff that doubles up to 2 s (a poll that already
 * waited that long on the server is sent again at once).
 *
 * The handler gets the Claim and an AbortSignal that aborts when the claim is lost or the
 * shutdown grace ran out. What it returns is committed; a throw gives the task back as a
 * retryable failure (the task's retry policy decides what follows), and so does an answer that
 * is neither text nor bytes (a TypeError); undefined means it ended the claim itself, or the
 * pool releases it.
 *
 * `stop()` stops claiming at once (the long polls in flight are aborted, so a shutdown never
 * claims), lets running handlers finish until `graceSeconds` passed, then aborts the rest and
 * gives their claims back (a retryable failure, WorkerShutdown) within GIVE_BACK_TIMEOUT, as it
 * does with a claim won as the stop came (never started); `run()` then resolves. `hurry()`
 * (a second SIGTERM or Ctrl-C) cuts the grace short.
 */
import type { Claim } from "./claim.js";
import type { WorkerClient } from "./client.js";
import { CallAborted, CoordinatorError, InvalidArgument, TransportError } from "./errors.js";
import { ReadyFile, readyFileOf } from "./readiness.js";
import type { Payload } from "./payload.js";
import { monotonic } from "./lease.js";
import { ClaimRefused, Outcome, describeLoss } from "./outcomes.js";

/** Runs one claim: resolves with the result to commit (or undefined: ended or to release). It
 * shares the event loop with every claim's keepalive: CPU-bound work belongs on worker_threads. */
export type Handler = (claim: Claim, signal: AbortSignal) => Promise<Payload | undefined | void>;

/** How one claim of the pool ended. */
export type Ending = "committed" | "released" | "failed" | "lost" | "cut_off" | "unsettled";

/** How many of the pool's claims ended which way, once it has shut down. */
export type PoolReport = Record<Ending, number>;

/** What a pool runs with. */
export interface PoolOptions {
  /** The queues to claim from (1 to 32, distinct). */
  queues: string[];
  /** Claims run at once (1 to 256; default 1). */
  concurrency?: number;
  /** Lease TTL of each claim (default 30 s). */
  ttlSeconds?: number;
  /** How long running handlers may finish after `stop()` (default 30 s). */
  graceSeconds?: number;
  /** Each claim call waits this long on the server for a task (default 10 s). */
  longPollSeconds?: number;
  /** Tasks one claim call may win when several slots are free (1 to 64; default 1). */
  claimBatch?: number;
  /** A file that exists exactly while the pool claims, for a probe (`test -f`): created once it
   * claims, removed first thing on stop and while handlers that outlived their lost claims hold
   * every slot. Default: `COORDINATOR_READY_FILE` (the Helm chart sets it); "" for none. */
  readyFile?: string;
}

/** How long the cut-off at the end of the grace waits for its give-backs. */
export const GIVE_BACK_TIMEOUT = 10;
/** The error code of a claim given back because the pool stopped. */
export const SHUTDOWN_ERROR = "WorkerShutdown";
/** Why a claim whose handler returned no result as the pool stopped was given back. */
const STOPPED = "the handler returned no result as the worker was stopping";
/** What a pool logs when settling a claim threw something unexpected (a bug, not the handler's
 * error, which gives the task back): the slot goes back to the claim loops either way. */
const SLOT_FAULT = "claim not settled (a fault past its handler): slot freed, claim left to its lease";

const POLL_INITIAL = 0.05;
const POLL_MAX = 2;

/** Sleep `seconds`, or less if `signal` aborts. The abort listener goes when the timer fires:
 * left on the pool's long-lived signal, an idle pool added one per empty poll for good (node
 * warned MaxListenersExceededWarning after 11). */
export const sleep = (seconds: number, signal?: AbortSignal): Promise<void> =>
  new Promise((ok) => {
    if (signal?.aborted) return ok();
    const woken = (): void => (clearTimeout(timer), ok());
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", woken);
      ok();
    }, seconds * 1000).unref();
    signal?.addEventListener("abort", woken, { once: true });
  });

/** Seconds between two looks for handlers that outlive their lost claims. */
const OUTLIVED_CHECK = 1;

/** Handlers still running a grace past their claim's loss: each is said once (its slot stays
 * taken: a promise cannot be stopped), and once they hold every slot the pool claims nothing
 * more, said too (and the pool's ready file removed until a slot is free). A handler must
 * settle once its signal aborts; one that never did held its slot for good, the pool silent. As
 * the Python pools do (sdk/_core/slots.py). */
export class Outlived {
  private readonly lostAt = new Map<Claim, number>();
  private readonly said = new Set<Claim>();
  private allHeld = false;

  constructor(
    private readonly slots: number,
    private readonly graceSeconds: number,
    /** Told when every slot comes to be held by such handlers (true) and when one is free again. */
    private readonly onHeld: (held: boolean) => void = () => undefined,
  ) {}

  /** Look at the claims running now (`running`) at `now` (seconds, monotonic). */
  look(running: Iterable<Claim>, now = monotonic()): void {
    const current = new Set(running);
    for (const claim of [...this.lostAt.keys()]) {
      if (!current.has(claim)) {
        this.lostAt.delete(claim);
        this.said.delete(claim);
      }
    }
    for (const claim of current) {
      if (!claim.isLost()) continue;
      const since = this.lostAt.get(claim) ?? now;
      this.lostAt.set(claim, since);
      if (now - since >= this.graceSeconds && !this.said.has(claim)) {
        this.said.add(claim);
        console.warn(`coordinator: ${OUTLIVED}: ${claim}`);
      }
    }
    const held = this.said.size >= this.slots;
    if (held !== this.allHeld) {
      this.allHeld = held;
      if (held) console.error(`coordinator: ${ALL_HELD}`);
      else console.warn(`coordinator: ${NOT_ALL_HELD}`);
      this.onHeld(held);
    }
  }
}

export const RESULT_DISCARDED =
  "the handler's result was discarded: the claim was lost before its commit landed (the attempt counts as the loss says; another attempt may run the task)";
export const OUTLIVED = "handler still running past its lost claim's grace: its slot stays taken";
export const ALL_HELD =
  "every slot is held by a handler that outlived its lost claim: the pool claims nothing more; a handler must settle once its signal aborts; restart the process";
export const NOT_ALL_HELD = "a slot is free again: the pool claims";

/** A handler pool over one client (see the module comment). */
export class WorkerPool {
  // readyFile is read once, into `ready` (its default is the environment's).
  private readonly options: Required<Omit<PoolOptions, "readyFile">>;
  private readonly polls = new AbortController();
  /** Per queue: why its last poll reached no coordinator ("" while one answers). */
  private readonly unreachable = new Map<string, string>();
  private readonly cutOff = new AbortController();
  private readonly hurried = new AbortController(); // the grace cut short
  private readonly running = new Map<Claim, Promise<void>>();
  private readonly abandoned = new Set<Claim>();
  // Give-backs of claims won as the stop came; run() resolves only once they are settled.
  private readonly givingBack = new Set<Promise<void>>();
  private readonly endings: PoolReport = { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 0, unsettled: 0 };
  private readonly slotWaiters: (() => void)[] = [];
  private free: number;
  private fatal: Error | undefined;
  private readonly ready: ReadyFile | undefined;

  constructor(
    private readonly client: WorkerClient,
    private readonly handler: Handler,
    options: PoolOptions,
  ) {
    this.options = {
      concurrency: 1,
      ttlSeconds: 30,
      graceSeconds: 30,
      longPollSeconds: 10,
      claimBatch: 1,
      ...options,
    };
    this.ready = readyFileOf(options.readyFile, process.env);
    const { queues, concurrency, claimBatch, graceSeconds } = this.options;
    if (queues.length < 1 || queues.length > 32 || new Set(queues).size !== queues.length) {
      throw new InvalidArgument(`give 1 to 32 distinct queues, got ${JSON.stringify(queues)}`);
    }
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256) {
      throw new InvalidArgument(`concurrency must be 1 to 256, got ${concurrency}`);
    }
    if (!Number.isInteger(claimBatch) || claimBatch < 1 || claimBatch > 64) {
      throw new InvalidArgument(`claimBatch must be 1 to 64, got ${claimBatch}`);
    }
    if (!(graceSeconds >= 0)) throw new InvalidArgument(`graceSeconds must not be negative, got ${graceSeconds}`);
    this.free = concurrency;
  }

  /** How many claims the pool is running now. */
  get held(): number {
    return this.running.size;
  }

  /** Whether `stop()` was called. */
  get stopping(): boolean {
    return this.polls.signal.aborted;
  }

  /** Stop claiming now and shut down (`run` resolves once done). Idempotent. */
  stop(): void {
    this.polls.abort();
    for (const wake of this.slotWaiters.splice(0)) wake();
  }

  /** Stop, and cut the grace short: the handlers still running are aborted and their claims
   * given back now (`stopOnSignals` on a second signal). Idempotent. */
  hurry(): void {
    this.stop();
    this.hurried.abort();
  }

  /** Claim and run claims until `stop()`, then shut down; rejects with the error that stopped a
   * claim loop (bad credentials, a bad queue name, ...) once shut down. */
  async run(): Promise<PoolReport> {
    // A running pool keeps the process alive, as the Python pool's blocked main thread does:
    // handlers awaiting only the claim's signal and the unref'd keepalive hold no handle, and
    // node would exit under them (13: an unsettled top-level await) before any SIGTERM came.
    const alive = setInterval(() => undefined, 1 << 30);
    const ready = (claiming: boolean): void => this.ready?.set(claiming && !this.stopping);
    const outlived = new Outlived(this.options.concurrency, this.options.graceSeconds, (held) => ready(!held));
    const looking = setInterval(() => outlived.look(this.running.keys()), OUTLIVED_CHECK * 1000);
    try {
      const loops = this.options.queues.map((queue) => this.claimLoop(queue));
      ready(true);
      await new Promise<void>((ok) => {
        if (this.stopping) ok();
        else this.polls.signal.addEventListener("abort", () => ok(), { once: true });
      });
      ready(false); // out of rotation first, then the grace
      const grace = sleep(this.options.graceSeconds, this.hurried.signal); // hurry() ends it at once
      await Promise.race([Promise.all(this.running.values()), grace]);
      await this.cutOffRunning();
      await Promise.race([Promise.all(loops), sleep(GIVE_BACK_TIMEOUT)]);
      await Promise.race([Promise.all(this.givingBack), sleep(GIVE_BACK_TIMEOUT)]);
    } finally {
      this.ready?.set(false);
      clearInterval(alive);
      clearInterval(looking);
    }
    if (this.fatal) throw this.fatal;
    return { ...this.endings };
  }

  private async claimLoop(queue: string): Promise<void> {
    let delay = POLL_INITIAL;
    for (let slots = await this.takeSlots(); slots > 0; slots = await this.takeSlots()) {
      const sent = performance.now() / 1000;
      let won: Claim[] | string;
      try {
        won = await this.claim(queue, slots);
      } catch (error) {
        this.giveSlots(slots);
        if (error instanceof CallAborted) return; // stop() ended the poll
        this.fatal ??= error as Error; // no retry cures it: stop the pool, loudly
        console.error(`coordinator: claim loop of ${queue} failed; stopping the pool:`, error);
        this.stop();
        return;
      }
      this.sayWhy(queue, typeof won === "string" ? won : "");
      if (typeof won !== "string") {
        delay = POLL_INITIAL;
        this.giveSlots(slots - won.length);
        // An answer that came while the event loop stood still (a handler's CPU-bound work) is
        // read before a SIGTERM that came meanwhile is: let the signal land first, so start()
        // gives back what a stopped pool won instead of running it.
        await new Promise((ok) => setImmediate(ok));
        for (const claim of won) this.start(claim);
        continue;
      }
      this.giveSlots(slots);
      // A long poll that already waited on the server counts towards the backoff.
      await sleep(Math.max(delay - (performance.now() / 1000 - sent), 0), this.polls.signal);
      delay = Math.min(delay * 2, POLL_MAX);
    }
  }

  /** Say on stderr when `queue`'s polls start failing to reach a coordinator, and when they
   * reach one again (once per change: a pool pointed at nothing is not silent, nor noisy). */
  private sayWhy(queue: string, why: string): void {
    const before = this.unreachable.get(queue) ?? "";
    const now = why.startsWith("unreachable") ? why : "";
    if (now === before) return;
    this.unreachable.set(queue, now);
    if (now) console.warn(`coordinator: nothing claimed from ${queue}: ${now}`);
    else console.warn(`coordinator: ${queue}: a coordinator answers again`);
  }

  /** One claim call for up to `slots` tasks: the claims, or why nothing was claimed. */
  private async claim(queue: string, slots: number): Promise<Claim[] | string> {
    const options = {
      ttlSeconds: this.options.ttlSeconds,
      waitSeconds: this.options.longPollSeconds,
      signal: this.polls.signal,
    };
    try {
      const won = await this.client.claimNext(queue, { ...options, maxTasks: slots });
      return won instanceof ClaimRefused ? Outcome[won.outcome] : won;
    } catch (error) {
      if (error instanceof TransportError) return `unreachable: ${error.message}`;
      throw error;
    }
  }

  private takeSlots(): Promise<number> {
    if (this.stopping) return Promise.resolve(0);
    if (this.free > 0) {
      const taken = Math.min(this.free, this.options.claimBatch);
      this.free -= taken;
      return Promise.resolve(taken);
    }
    return new Promise((ok) => this.slotWaiters.push(() => ok(this.takeSlots())));
  }

  private giveSlots(count: number): void {
    this.free += Math.max(count, 0);
    while (this.free > 0 && this.slotWaiters.length > 0) this.slotWaiters.shift()?.();
  }

  private start(claim: Claim): void {
    if (this.stopping) {
      // Won as the stop came: never run it, give it back at once.
      const back = this.giveBack(claim, "claimed as the pool stopped").then(() => this.giveSlots(1));
      this.givingBack.add(back);
      return;
    }
    const done = this.runOne(claim)
      .catch((error: unknown) => {
        console.error(`coordinator: ${SLOT_FAULT}: ${claim}:`, error);
        claim.close(); // no more renewals: the lease ends it
        this.endings.unsettled += 1;
      })
      .finally(() => {
        this.running.delete(claim);
        this.giveSlots(1);
      });
    this.running.set(claim, done);
  }

  private async runOne(claim: Claim): Promise<void> {
    const signal = AbortSignal.any([claim.signal, this.cutOff.signal]);
    let result: Payload | undefined | void;
    let failure: unknown;
    try {
      result = await this.handler(claim, signal);
    } catch (error) {
      failure = error; // the handler's failure is the task's, never the pool's
    }
    if (this.abandoned.has(claim)) return; // the cut-off settled it; this answer came too late
    this.endings[await this.settle(claim, result, failure)] += 1;
  }

  /** Commit the result, or give the task back; how the claim ended. */
  private async settle(claim: Claim, result: Payload | undefined | void, failure: unknown): Promise<Ending> {
    const refused = failure === undefined ? resultError(result) : undefined;
    if (refused) {
      console.error(`coordinator: ${claim}: ${refused.message}`);
      [result, failure] = [undefined, refused];
    }
    try {
      if (result !== undefined && failure === undefined && !claim.isLost()) {
        try {
          await claim.commit(result);
        } catch (error) {
          // The result itself refused (past the limit): given back at once, saying why.
          if (!(error instanceof InvalidArgument)) throw error;
          failure = error;
        }
      }
      if (claim.committed) return "committed";
      if (claim.isLost()) {
        // Finished work thrown away (an outage past the lease, a pause) otherwise shows only
        // as the loss, and as the task running again.
        if (result !== undefined && failure === undefined) {
          const lost = claim.lostReason;
          console.warn(`coordinator: ${RESULT_DISCARDED}: ${claim}${lost ? ` (${describeLoss(lost)})` : ""}`);
        }
        return "lost";
      }
      if (failure !== undefined) {
        const error = failure instanceof Error ? failure : new Error(String(failure));
        await claim.fail(error, { retryable: true });
        return claim.isLost() ? "lost" : "failed";
      }
      if (!claim.isHeld()) return claim.ended === "failed" ? "failed" : "released"; // ended by the handler
      if (this.stopping) {
        // The handler gave up for the shutdown: given back at once, not counted as an attempt.
        const failed = await claim.fail(SHUTDOWN_ERROR, { retryable: true, message: STOPPED, shutdown: true });
        return claim.committed ? "committed" : failed.recorded ? "cut_off" : "lost";
      }
      await claim.release("the handler returned no result");
      return claim.committed ? "committed" : "released";
    } catch (error) {
      if (!(error instanceof CoordinatorError)) throw error;
      console.error(`coordinator: could not settle ${claim}:`, error.message);
      return claim.committed ? "committed" : "unsettled";
    } finally {
      claim.close(); // settled, or left to its lease: renewing it would only hold the task
    }
  }

  /** Abort the handlers still running and give their claims back, in parallel. */
  private async cutOffRunning(): Promise<void> {
    const left = [...this.running.keys()];
    if (left.length === 0) return;
    for (const claim of left) this.abandoned.add(claim);
    const why = this.hurried.signal.aborted
      ? "a second signal cut the shutdown grace short"
      : `the shutdown grace of ${this.options.graceSeconds}s ran out`;
    this.cutOff.abort(new CoordinatorError(why));
    await Promise.race([Promise.all(left.map((claim) => this.giveBack(claim, why))), sleep(GIVE_BACK_TIMEOUT)]);
  }

  private async giveBack(claim: Claim, why: string): Promise<void> {
    let ending: Ending;
    try {
      const failed = await claim.fail(SHUTDOWN_ERROR, { retryable: true, message: why, shutdown: true });
      ending = claim.committed ? "committed" : failed.recorded ? "cut_off" : "lost";
    } catch (error) {
      console.error(`coordinator: could not give ${claim} back:`, error);
      ending = "unsettled";
    } finally {
      claim.close(); // given back, or left to its lease
    }
    this.endings[ending] += 1;
  }
}

/** Undefined if a handler's answer is one it may give (a Payload, or undefined), else the
 * TypeError its task is given back with: null, numbers and objects get past an `any`. */
function resultError(result: unknown): TypeError | undefined {
  if (result === undefined || typeof result === "string" || result instanceof Uint8Array) return undefined;
  const type = result === null ? "null" : typeof result === "object" ? result.constructor?.name ?? "object" : typeof result;
  return new TypeError(
    `the handler returned ${type}: a handler returns a string or a Uint8Array (committed) or undefined (the claim released)`,
  );
}

/** Seconds after the first signal in which another is the same stop delivered twice (GNU
 * `timeout` and some supervisors signal the process, then its group), not a second one. */
export const DUPLICATE_WINDOW_SECONDS = 1;

/** Stop `pool` on SIGTERM and SIGINT (a pod's shutdown, Ctrl-C), and from the second signal on
 * cut its grace short (`hurry()`), as the Python SDK does: a signal within
 * DUPLICATE_WINDOW_SECONDS of the first is taken as the first again. Returns what removes them. */
export function stopOnSignals(pool: WorkerPool, signals: NodeJS.Signals[] = ["SIGTERM", "SIGINT"]): () => void {
  let first: number | undefined;
  const answer = (): void => {
    const now = monotonic();
    if (first === undefined) {
      first = now;
      pool.stop();
    } else if (now - first >= DUPLICATE_WINDOW_SECONDS) {
      pool.hurry();
    }
  };
  for (const signal of signals) process.on(signal, answer);
  return () => {
    for (const signal of signals) process.off(signal, answer);
  };
}
