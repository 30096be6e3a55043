/**
 * WorkerPool against a real coordinator: results committed, failures given back, and a
 * SIGTERMed worker process that stops within its grace and gives its claims back at once
 * (the tasks are READY again long before their 30 s leases would have run out).
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { getEventListeners } from "node:events";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  Claim,
  type ClaimNextOptions,
  ClaimRefused,
  Outcome,
  OutcomeUnknown,
  TaskState,
  TransportError,
  WorkerClient,
  WorkerPool,
} from "../dist/index.js";
import {
  ALL_HELD,
  DUPLICATE_WINDOW_SECONDS,
  NOT_ALL_HELD,
  OUTLIVED,
  Outlived,
  RESULT_DISCARDED,
  sleep,
  stopOnSignals,
} from "../dist/pool.js";
import { readyFileOf } from "../dist/readiness.js";
import { type Server, clientOf, eventually, metricOf, startServer, unique } from "./server.js";

const WORKER = resolve(dirname(fileURLToPath(import.meta.url)), "pool-worker.js");

let server: Server;
let client: WorkerClient;

/** A pool-worker.js process over `queue`: its stdout lines as they come, and its exit code. */
function startWorker(queue: string, env: Record<string, string> = {}): {
  worker: ChildProcess;
  lines: string[];
  exited: Promise<number | null>;
} {
  const worker = spawn("node", [WORKER], {
    env: { PATH: process.env.PATH, COORDINATOR_TARGET: server.target, POOL_QUEUE: queue, ...env },
    stdio: ["pipe", "pipe", "inherit"],
  });
  const exited = new Promise<number | null>((ok) => worker.once("exit", (code) => ok(code)));
  const lines: string[] = [];
  createInterface({ input: worker.stdout as NodeJS.ReadableStream }).on("line", (line) => lines.push(line));
  return { worker, lines, exited };
}

before(async () => {
  server = await startServer();
  client = clientOf(server);
});

after(async () => {
  client.close();
  await server.stop();
});

test("a pool commits what its handler returns and gives a throwing handler's task back", async () => {
  const queue = unique("q");
  const ok = await Promise.all(["ada", "grace", "alan"].map((name) => client.createTask({ queue, input: name })));
  const bad = await client.createTask({ queue, input: "boom", maxAttempts: 1 });
  const pool = new WorkerPool(
    client,
    async (claim) => {
      if (claim.inputText() === "boom") throw new RangeError("no such name");
      return `hello ${claim.inputText()}`;
    },
    { queues: [queue], concurrency: 2, ttlSeconds: 10, longPollSeconds: 1 },
  );
  const running = pool.run();
  await eventually(async () => {
    const states = await Promise.all([...ok, bad].map((t) => client.getTask(t.taskId)));
    return states.every((t) => t.state === TaskState.DONE || t.state === TaskState.FAILED);
  }, 30, "every task settled");
  pool.stop();
  const report = await running;
  assert.deepEqual(report, { committed: 3, released: 0, failed: 1, lost: 0, cut_off: 0, unsettled: 0 });
  const result = await client.getResult(ok[0]?.taskId ?? "");
  assert.equal(new TextDecoder().decode(result.result), "hello ada");
  const failed = await client.getTask(bad.taskId);
  assert.equal(failed.state, TaskState.FAILED);
  assert.match(failed.lastError, /RangeError/);
});

test("SIGTERM stops a worker process within its grace and its claims are given back at once", async () => {
  const queue = unique("q");
  const tasks = await Promise.all([1, 2].map((n) => client.createTask({ queue, input: String(n) })));
  const { worker, lines, exited } = startWorker(queue);
  await eventually(() => lines.filter((l) => l.startsWith("running ")).length === 2, 30, "both handlers running");
  worker.kill("SIGTERM");
  assert.equal(await exited, 0);
  const report = JSON.parse(lines.at(-1) ?? "{}") as Record<string, number>;
  assert.equal(report.cut_off, 2);
  for (const task of tasks) {
    const back = await client.getTask(task.taskId);
    assert.equal(back.state, TaskState.READY); // given back, not left to a 30 s lease
    // A shutdown, not the task's failure: not counted, no error of the task's.
    assert.deepEqual([back.attempt, back.attemptsCounted, back.lastError], [1, 0, ""]);
    const next = await client.claim(task.taskId, { ttlSeconds: 5 });
    assert.ok(next instanceof Claim);
    await next.commit("done elsewhere");
  }
});

test("a claim a long poll won while the event loop was blocked and SIGTERM came is never run", async () => {
  const queue = unique("q");
  const blocker = await client.createTask({ queue, input: "block" });
  const { worker, lines, exited } = startWorker(queue);
  await eventually(() => lines.includes(`running ${blocker.taskId}`), 30, "the blocking handler running");
  await eventually(async () => (await metricOf(server, "coordinator_claim_waiters ")) >= 1, 30, "the other slot polling");
  worker.kill("SIGUSR2");
  await eventually(() => lines.includes("blocking"), 30, "the event loop blocked");
  const next = await client.createTask({ queue, input: "next" });
  await eventually(async () => (await client.getTask(next.taskId)).state === TaskState.CLAIMED, 30, "the poll won it");
  worker.kill("SIGTERM"); // queued behind the poll's answer while the event loop stands still
  worker.stdin?.write("\n");
  assert.equal(await exited, 0);
  assert.deepEqual(lines.filter((l) => l.startsWith("running ")), [`running ${blocker.taskId}`]);
  assert.deepEqual(JSON.parse(lines.at(-1) ?? "{}"), { committed: 1, released: 0, failed: 0, lost: 0, cut_off: 1, unsettled: 0 });
  const back = await client.getTask(next.taskId);
  assert.deepEqual([back.state, back.attempt, back.attemptsCounted], [TaskState.READY, 1, 0]);
});

test("a second signal cuts the grace short: the claims still running are given back at once", async () => {
  const queue = unique("q");
  const tasks = await Promise.all([1, 2].map((n) => client.createTask({ queue, input: String(n) })));
  const { worker, lines, exited } = startWorker(queue, { POOL_GRACE: "600" });
  try {
    await eventually(() => lines.filter((l) => l.startsWith("running ")).length === 2, 30, "both handlers running");
    worker.kill("SIGTERM");
    await eventually(() => lines.includes("SIGTERM"), 30, "the first signal taken");
    await new Promise((done) => setTimeout(done, DUPLICATE_WINDOW_SECONDS * 1000));
    worker.kill("SIGINT"); // Ctrl-C after a SIGTERM: the grace's 600 s are not waited out
    const given = async (): Promise<boolean> => {
      const states = await Promise.all(tasks.map((t) => client.getTask(t.taskId)));
      return states.every((t) => t.state === TaskState.READY && t.attemptsCounted === 0);
    };
    await eventually(given, 30, "both given back");
    assert.equal(await exited, 0);
    assert.deepEqual(JSON.parse(lines.at(-1) ?? "{}"), { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 2, unsettled: 0 });
  } finally {
    worker.kill("SIGKILL"); // a no-op once it exited
  }
});

test("a signal within a second of the first is the same stop delivered twice, not a hurry", () => {
  // GNU timeout signals the process, then its group: the pool was hurried, its grace skipped.
  const calls: string[] = [];
  const pool = { stop: () => calls.push("stop"), hurry: () => calls.push("hurry") };
  const restore = stopOnSignals(pool as unknown as WorkerPool, ["SIGUSR2"]);
  try {
    process.emit("SIGUSR2", "SIGUSR2");
    process.emit("SIGUSR2", "SIGUSR2");
  } finally {
    restore();
  }
  assert.deepEqual(calls, ["stop"]);
});

test("handlers that outlive their lost claims are said once, and so is a pool whose every slot they hold", (t) => {
  // A handler deaf to its signal held its slot for good after its claim was lost, the pool silent.
  const said: string[] = [];
  t.mock.method(console, "warn", (line: string) => said.push(line));
  t.mock.method(console, "error", (line: string) => said.push(line));
  const claim = (name: string, lost: boolean) => ({ lost, isLost() { return this.lost; }, toString: () => name });
  const hung = claim("hung", true);
  const alive = claim("alive", false);
  const outlived = new Outlived(2, 30);
  const look = (running: object[], now: number) => outlived.look(running as unknown as Claim[], now);
  look([hung, alive], 100); // lost now: the grace starts
  look([hung, alive], 130); // one of two slots: said
  look([hung, alive], 131); // said once
  alive.lost = true;
  look([hung, alive], 131);
  look([hung, alive], 161); // every slot held
  look([hung], 162); // alive's handler returned: a slot is free again
  assert.deepEqual(said, [
    `coordinator: ${OUTLIVED}: hung`,
    `coordinator: ${OUTLIVED}: alive`,
    `coordinator: ${ALL_HELD}`,
    `coordinator: ${NOT_ALL_HELD}`,
  ]);
});

test("a running pool says so when a handler deaf to its signal holds its only slot past the grace", async (t) => {
  const said: string[] = [];
  t.mock.method(console, "error", (line: string) => said.push(String(line)));
  t.mock.method(console, "warn", (line: string) => said.push(String(line)));
  const queue = unique("q");
  const task = await client.createTask({ queue });
  let finish: () => void = () => undefined;
  const finished = new Promise<void>((ok) => (finish = ok));
  const readyFile = join(mkdtempSync(join(tmpdir(), "ts-ready-")), "ready");
  const options = { queues: [queue], graceSeconds: 1, ttlSeconds: 2, readyFile };
  const pool = new WorkerPool(client, () => finished.then(() => "too late"), options);
  const running = pool.run();
  try {
    await eventually(async () => (await client.getTask(task.taskId)).state === TaskState.CLAIMED, 30, "claimed");
    assert.ok(existsSync(readyFile), "a claiming pool is ready");
    await client.cancelTask(task.taskId, "not needed"); // the claim is lost; the handler goes on
    await eventually(() => said.includes(`coordinator: ${ALL_HELD}`), 30, "never said");
    assert.ok(!existsSync(readyFile), "a pool that claims nothing more is not ready");
  } finally {
    finish();
    pool.stop();
    await running;
  }
  assert.ok(said.some((line) => line.startsWith(`coordinator: ${OUTLIVED}: `)), said.join("\n"));
  // The handler's "too late" came after the cancel lost its claim: thrown away, and said so.
  const discarded = said.filter((line) => line.startsWith(`coordinator: ${RESULT_DISCARDED}: `));
  assert.equal(discarded.length, 1, said.join("\n"));
  assert.match(discarded[0] ?? "", /\(CANCELLED via renew: /);
  rmSync(dirname(readyFile), { recursive: true, force: true });
});

test("a pool says once when its polls reach no coordinator, and once when one answers again", async (t) => {
  // A TypeScript pool pointed at nothing used to be silent; the Python pool logs it.
  const said: string[] = [];
  t.mock.method(console, "warn", (line: string) => said.push(String(line)));
  const queue = unique("q");
  const answers = [
    () => Promise.reject(new TransportError("UNAVAILABLE: no try reached a coordinator", "UNAVAILABLE")),
    () => Promise.reject(new TransportError("UNAVAILABLE: no try reached a coordinator", "UNAVAILABLE")),
    () => Promise.resolve(new ClaimRefused(Outcome.NO_READY_TASK, 0, "nothing ready")),
  ];
  const polled = new WorkerClient({ target: server.target, principal: "w", env: {} });
  let polls = 0;
  t.mock.method(polled, "claimNext", () => answers[Math.min(polls++, answers.length - 1)]());
  const pool = new WorkerPool(polled, async () => "never", { queues: [queue], longPollSeconds: 1 });
  const running = pool.run();
  try {
    await eventually(() => polls >= 4, 30, "the pool did not poll again");
  } finally {
    pool.stop();
    await running;
    polled.close();
  }
  assert.deepEqual(said, [
    `coordinator: nothing claimed from ${queue}: unreachable: UNAVAILABLE: no try reached a coordinator`,
    `coordinator: ${queue}: a coordinator answers again`,
  ]);
});

test("a pool's ready file exists while it claims, gone first thing on stop; by default COORDINATOR_READY_FILE", async () => {
  assert.equal(readyFileOf(undefined, { COORDINATOR_READY_FILE: "/tmp/r" })?.path, "/tmp/r");
  assert.equal(readyFileOf("", { COORDINATOR_READY_FILE: "/tmp/r" }), undefined);
  assert.equal(readyFileOf(undefined, {}), undefined);
  const queue = unique("q");
  await client.createTask({ queue });
  const readyFile = join(mkdtempSync(join(tmpdir(), "ts-ready-")), "ready");
  let finish: () => void = () => undefined;
  const finished = new Promise<void>((ok) => (finish = ok));
  let started = false;
  const handler = async (): Promise<string> => ((started = true), await finished, "done");
  const pool = new WorkerPool(client, handler, { queues: [queue], readyFile, graceSeconds: 30 });
  const running = pool.run();
  try {
    await eventually(() => started, 30, "never claimed");
    assert.match(readFileSync(readyFile, "utf8"), /^claiming pid=\d+\n$/);
    pool.stop();
    await eventually(() => !existsSync(readyFile), 5, "still ready after stop()");
    assert.equal(pool.held, 1); // out of rotation while its handler still runs in the grace
  } finally {
    finish();
    pool.stop();
    await running;
  }
  assert.ok(!existsSync(readyFile));
  rmSync(dirname(readyFile), { recursive: true, force: true });
});

test("a pool stopped while it long-polls an empty queue claims nothing afterwards", async () => {
  const queue = unique("q");
  const pool = new WorkerPool(client, async () => "never", { queues: [queue], longPollSeconds: 15 });
  const running = pool.run();
  pool.stop();
  assert.deepEqual(await running, { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 0, unsettled: 0 });
  const task = await client.createTask({ queue });
  assert.equal((await client.getTask(task.taskId)).state, TaskState.READY);
});

test("a claim won as the pool stopped is never run: it is given back at once", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue });
  let pool: WorkerPool | undefined;
  // The stop lands between the coordinator granting the claim and the pool receiving it: the
  // race a SIGTERM during a long poll can hit, made certain here.
  class StopsAsItWins extends WorkerClient {
    override async claimNext(q: string, options: ClaimNextOptions & { maxTasks?: number }): Promise<never> {
      const won = await super.claimNext(q, { ...options, maxTasks: options.maxTasks ?? 1 });
      pool?.stop();
      return won as never;
    }
  }
  const racing = new StopsAsItWins({ target: server.target, principal: "racing", env: {} });
  let ran = 0;
  pool = new WorkerPool(racing, async () => {
    ran += 1;
    return "never";
  }, { queues: [queue], longPollSeconds: 5 });
  try {
    const report = await pool.run();
    assert.equal(ran, 0);
    assert.deepEqual(report, { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 1, unsettled: 0 });
    const back = await client.getTask(task.taskId);
    assert.equal(back.state, TaskState.READY);
    assert.deepEqual([back.attempt, back.attemptsCounted, back.lastError], [1, 0, ""]);
  } finally {
    racing.close();
  }
});

test("a handler that returns no result as the pool stops has its task given back uncounted", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue });
  let running: () => void = () => {};
  const started = new Promise<void>((ok) => (running = ok));
  let stopped: () => void = () => {};
  const stopping = new Promise<void>((ok) => (stopped = ok));
  const pool = new WorkerPool(client, async () => {
    running();
    await stopping; // a handler that gives up when its worker is told to stop
    return undefined;
  }, { queues: [queue], longPollSeconds: 1, graceSeconds: 30 });
  const done = pool.run();
  await started;
  pool.stop();
  stopped();
  const report = await done;
  assert.deepEqual(report, { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 1, unsettled: 0 });
  const back = await client.getTask(task.taskId);
  assert.equal(back.state, TaskState.READY);
  assert.deepEqual([back.attempt, back.attemptsCounted, back.lastError], [1, 0, ""]);
});

test("a result past the limit is refused before it is sent and the task given back saying why", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue, maxAttempts: 1 });
  const pool = new WorkerPool(client, async () => "x".repeat(600 * 1024), { queues: [queue], longPollSeconds: 1 });
  const running = pool.run();
  await eventually(async () => (await client.getTask(task.taskId)).state === TaskState.FAILED, 30, "given back");
  pool.stop();
  assert.deepEqual(await running, { committed: 0, released: 0, failed: 1, lost: 0, cut_off: 0, unsettled: 0 });
  assert.match((await client.getTask(task.taskId)).lastError, /result is 614400 bytes, the limit is 524288/);
  await assert.rejects(client.createTask({ queue, input: new Uint8Array(256 * 1024 + 1) }), /input is 262145 bytes/);
});

test("a handler that returns neither text nor bytes has its task given back, naming what a handler returns", async () => {
  const queue = unique("q");
  const returned = new Map<string, unknown>([["null", null], ["object", { a: 1 }]]);
  const tasks = await Promise.all([...returned.keys()].map((input) => client.createTask({ queue, input, maxAttempts: 1 })));
  const pool = new WorkerPool(client, async (claim) => returned.get(claim.inputText()) as never, {
    queues: [queue],
    concurrency: 2,
    longPollSeconds: 1,
  });
  const running = pool.run();
  const failed = async (): Promise<boolean> => {
    const states = await Promise.all(tasks.map((t) => client.getTask(t.taskId)));
    return states.every((t) => t.state === TaskState.FAILED);
  };
  await eventually(failed, 30, "both given back");
  pool.stop();
  assert.deepEqual(await running, { committed: 0, released: 0, failed: 2, lost: 0, cut_off: 0, unsettled: 0 });
  const errors = await Promise.all(tasks.map(async (t) => (await client.getTask(t.taskId)).lastError));
  const rule = "a handler returns a string or a Uint8Array (committed) or undefined (the claim released)";
  assert.deepEqual(errors, [`TypeError: the handler returned null: ${rule}`, `TypeError: the handler returned Object: ${rule}`]);
});

test("a fault settling a claim frees its slot and stops its renewals instead of crashing the worker", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue });
  const own = clientOf(server, "faulty");
  let ran = false;
  const pool = new WorkerPool(own, async () => {
    ran = true;
    // An error the pool cannot read: settling it throws past the SDK's errors.
    const error = new Error("unreadable");
    Object.defineProperty(error, "stack", { get: () => assert.fail("no stack") });
    throw error;
  }, { queues: [queue], ttlSeconds: 2, longPollSeconds: 1 });
  try {
    const running = pool.run();
    await eventually(() => ran && pool.held === 0, 30, "the claim ended");
    pool.stop();
    assert.deepEqual(await running, { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 0, unsettled: 1 });
    assert.equal(own.keepalive.size, 0);
    // Left to its lease, which runs out: the task is claimable again.
    await eventually(async () => (await client.getTask(task.taskId)).state === TaskState.READY, 30, "lease ran out");
  } finally {
    own.close();
  }
});

test("an error whose name is no valid error code fails the task under the name's valid characters", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue, maxAttempts: 1 });
  const pool = new WorkerPool(client, async () => {
    const error = new Error("the input has no question");
    error.name = "Validation Error";
    throw error;
  }, { queues: [queue], longPollSeconds: 1 });
  const running = pool.run();
  await eventually(async () => (await client.getTask(task.taskId)).state === TaskState.FAILED, 30, "failed");
  pool.stop();
  assert.deepEqual(await running, { committed: 0, released: 0, failed: 1, lost: 0, cut_off: 0, unsettled: 0 });
  assert.equal((await client.getTask(task.taskId)).lastError, "ValidationError: the input has no question");
});

test("a claim whose failure the coordinator did not take stops renewing, so its lease runs out", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue });
  // The fail's answer lost for good (a coordinator that went away for longer than the retry
  // budget), while renewals still reach it.
  class FailUnknown extends WorkerClient {
    override async claimNext(q: string, options: ClaimNextOptions & { maxTasks?: number }): Promise<never> {
      const won = await super.claimNext(q, { ...options, maxTasks: options.maxTasks ?? 1 });
      for (const claim of Array.isArray(won) ? won : []) {
        claim.fail = () => Promise.reject(new OutcomeUnknown("UNAVAILABLE: gone; outcome unknown, not failed"));
      }
      return won as never;
    }
  }
  const unknown = new FailUnknown({ target: server.target, principal: "fail-unknown", env: {} });
  const pool = new WorkerPool(unknown, async () => {
    throw new RangeError("no such name");
  }, { queues: [queue], ttlSeconds: 2, longPollSeconds: 1 });
  try {
    const running = pool.run();
    await eventually(async () => (await client.getTask(task.taskId)).attempt === 1 && pool.held === 0, 30, "settled");
    pool.stop();
    assert.deepEqual(await running, { committed: 0, released: 0, failed: 0, lost: 0, cut_off: 0, unsettled: 1 });
    assert.equal(unknown.keepalive.size, 0);
    await eventually(async () => (await client.getTask(task.taskId)).state === TaskState.READY, 30, "lease ran out");
  } finally {
    unknown.close();
  }
});

test("the pool's sleep leaves no listener on the signal it could be woken by", async () => {
  // Left on the pool's long-lived signal, an idle pool added one per empty poll for good and
  // node warned MaxListenersExceededWarning after 11.
  const polls = new AbortController();
  for (let i = 0; i < 20; i++) await sleep(0.001, polls.signal);
  assert.equal(getEventListeners(polls.signal, "abort").length, 0);
  const woken = sleep(60, polls.signal);
  assert.equal(getEventListeners(polls.signal, "abort").length, 1);
  polls.abort();
  await woken; // at once, not after 60 s
  assert.equal(getEventListeners(polls.signal, "abort").length, 0);
});
