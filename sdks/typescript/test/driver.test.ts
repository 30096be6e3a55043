/**
 * The conformance driver (src/conformance/driver.ts) speaks conformance/PROTOCOL.md against a
 * real coordinator: configured from the environment only, replies in order, typed errors, lost
 * events as soon as the SDK knows (here: a driver frozen past its TTL and taken over), effects
 * through the protocol's downstream.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { type Server, eventually, startServer, unique } from "./server.js";

const DRIVER = resolve(dirname(fileURLToPath(import.meta.url)), "../dist/conformance/driver.js");

type Message = Record<string, unknown>;

/** A driver process, its replies by id and its events in order. */
class Driver {
  readonly process: ChildProcess;
  readonly events: Message[] = [];
  /** The exit code, once it exited (listened to from the start: the exit may come first). */
  readonly exit: Promise<number | null>;
  private readonly replies = new Map<number, Message>();
  private next = 1;

  constructor(server: Server, workerId: string) {
    this.process = spawn("node", [DRIVER], {
      env: { PATH: process.env.PATH, COORDINATOR_TARGET: server.target, COORDINATOR_WORKER_ID: workerId },
      stdio: ["pipe", "pipe", "inherit"],
    });
    this.exit = new Promise((ok) => this.process.once("exit", (code) => ok(code)));
    createInterface({ input: this.process.stdout as NodeJS.ReadableStream }).on("line", (line) => {
      const message = JSON.parse(line) as Message; // anything but JSON on stdout fails here
      if (typeof message.id === "number") this.replies.set(message.id, message);
      else this.events.push(message);
    });
  }

  async send(op: string, args: Message = {}): Promise<Message> {
    const id = this.next++;
    this.process.stdin?.write(`${JSON.stringify({ id, op, ...args })}\n`);
    return eventually(() => this.replies.get(id), 60, `the reply to ${op}`);
  }
}

let server: Server;
const drivers: Driver[] = [];

function driver(workerId: string): Driver {
  const started = new Driver(server, workerId);
  drivers.push(started);
  return started;
}

before(async () => {
  server = await startServer();
});

after(async () => {
  for (const d of drivers) d.process.kill("SIGKILL");
  await server.stop();
});

test("create, claim with a checkpoint handed over, commit, result: the protocol's values", async () => {
  const a = driver("conf-a");
  const queue = unique("q");
  const created = await a.send("create_task", { queue, input: { user: "ada" }, task_id: unique("t") });
  assert.equal(created.ok, true);
  const claimed = await a.send("claim", { queue, as: "a1" });
  const [first] = claimed.claims as Message[];
  assert.deepEqual({ ...first, generation: 0 }, {
    as: "a1", task_id: created.task_id, generation: 0, input: { user: "ada" }, checkpoint: null,
  });
  assert.equal(typeof first?.generation, "number");
  assert.deepEqual(await a.send("checkpoint", { claim: "a1", data: { step: 2 } }), { id: 3, ok: true });
  assert.deepEqual((await a.send("held")).claims, ["a1"]);
  await eventually(async () => {
    const renewed = await fetch(server.metrics).then((r) => r.text());
    return /coordinator_rpc_duration_seconds_count\{[^}]*RenewMany"\} [1-9]/.test(renewed);
  }, 20, "a renewal that carries the checkpoint");
  assert.deepEqual((await a.send("release", { claim: "a1" })).outcome, "OK");
  const again = await a.send("claim", { queue, as: "a2", task_id: created.task_id });
  assert.deepEqual((again.claims as Message[])[0]?.checkpoint, { step: 2 });
  assert.deepEqual(await a.send("commit", { claim: "a2", result: "done" }), { id: 7, ok: true, outcome: "COMMITTED" });
  assert.deepEqual((await a.send("get_result", { task_id: created.task_id })).result, "done");
  assert.deepEqual(await a.send("get_task", { task_id: created.task_id }), { id: 9, ok: true, state: "DONE", attempts: 2 });
  assert.deepEqual((await a.send("claim", { queue, as: "none" })).claims, []);
  assert.deepEqual(a.events, []);
  await a.send("exit");
  assert.equal(await a.exit, 0);
});

test("bad input comes back as the protocol's typed errors", async () => {
  const a = driver("conf-bad");
  const missing = await a.send("get_task", { task_id: "no-such-task" });
  assert.deepEqual(missing.error && { ...(missing.error as Message), message: "" }, { code: "NOT_FOUND", kind: "RpcError", message: "" });
  const bad = (await a.send("get_task", { task_id: "bad id/with slash" })).error as Message;
  assert.deepEqual([bad.code, bad.kind], ["INVALID_ARGUMENT", "RpcError"]);
  const big = (await a.send("create_task", { queue: "bi", input: "x".repeat(300000) })).error as Message;
  assert.deepEqual([big.code, big.kind], ["INVALID_ARGUMENT", "RpcError"]);
  const queue = unique("q");
  await a.send("create_task", { queue, input: "fine" });
  await a.send("claim", { queue, as: "a1" });
  const code = (await a.send("fail", { claim: "a1", error: "not a valid code!", retryable: true })).error as Message;
  assert.deepEqual([code.code, code.kind], ["INVALID_ARGUMENT", "RpcError"]);
  const unknown = (await a.send("teleport")).error as Message;
  assert.deepEqual([unknown.code, unknown.kind], ["UNIMPLEMENTED", "Driver"]);
  assert.deepEqual(await a.send("fail", { claim: "a1", error: "boom", retryable: false }), { id: 8, ok: true, outcome: "OK" });
  a.process.stdin?.end(); // EOF: exit 0
  assert.equal(await a.exit, 0);
});

test("a driver frozen past its TTL is told it lost the claim, and its late commit is FENCED", async () => {
  const a = driver("conf-late");
  const b = driver("conf-next");
  const queue = unique("q");
  await a.send("create_task", { queue, input: 1 });
  const [held] = (await a.send("claim", { queue, as: "a1" })).claims as Message[];
  a.process.kill("SIGSTOP");
  const [taken] = await eventually(async () => {
    const won = (await b.send("claim", { queue, as: "b1", task_id: held?.task_id })).claims as Message[];
    return won.length ? won : undefined;
  }, 60, "the takeover");
  assert.ok(Number(taken?.generation) > Number(held?.generation));
  a.process.kill("SIGCONT");
  const lost = await a.send("wait_lost", { claim: "a1", timeout_s: 30 });
  assert.equal(lost.lost, true);
  assert.ok(["SUPERSEDED", "LEASE_EXPIRED"].includes(String(lost.reason)), String(lost.reason));
  assert.deepEqual(a.events, [{ event: "lost", claim: "a1", reason: lost.reason }]);
  const late = await a.send("commit", { claim: "a1", result: "stale" });
  assert.deepEqual([late.outcome, late.reason], ["FENCED", "SUPERSEDED"]);
  assert.equal((await b.send("commit", { claim: "b1", result: "fresh" })).outcome, "COMMITTED");
  assert.deepEqual((await a.send("held")).claims, []);
});

test("effect: sent once through the protocol's downstream, then skipped; a conflict is named", async () => {
  const sent: Message[] = [];
  const downstream = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk: Buffer) => (body += chunk.toString()));
    request.on("end", () => {
      if (request.url === "/send") {
        sent.push({ ...(JSON.parse(body) as Message), key: request.headers["idempotency-key"] });
        response.writeHead(200).end(JSON.stringify({ message_id: `m${sent.length}` }));
      } else response.writeHead(404).end("{}");
    });
  });
  await new Promise<void>((ok) => downstream.listen(0, "127.0.0.1", ok));
  const url = `http://127.0.0.1:${(downstream.address() as AddressInfo).port}`;
  try {
    const a = driver("conf-fx");
    const queue = unique("q");
    const created = await a.send("create_task", { queue, input: null });
    await a.send("claim", { queue, as: "a1" });
    const args = { claim: "a1", slot: "welcome", downstream_url: url };
    const first = await a.send("effect", { ...args, payload: { to: "ada" } });
    assert.deepEqual([first.outcome, first.sent, first.reconciled], ["OK", true, false]);
    const again = await a.send("effect", { ...args, payload: { to: "ada" } });
    assert.deepEqual([again.outcome, again.sent, again.reconciled], ["OK", false, false]);
    const other = await a.send("effect", { ...args, payload: { to: "eve" } });
    assert.deepEqual([other.outcome, other.sent], ["PAYLOAD_CONFLICT", false]);
    assert.equal(sent.length, 1);
    assert.deepEqual({ ...sent[0], key: typeof sent[0]?.key }, {
      slot: "welcome", payload: { to: "ada" }, task_id: created.task_id, key: "string",
    });
  } finally {
    downstream.close();
  }
});
