/**
 * A claim's life against a real coordinator: the keepalive keeps it past its TTL (and keeps
 * many in few RenewMany calls), a late commit after a takeover is FENCED, a loss aborts the
 * claim's signal with the reason, checkpoints reach the next attempt, fail/retry/dead letter.
 */
import assert from "node:assert/strict";
import { type Server as HttpServer, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import {
  CallAborted,
  Claim,
  ClaimLost,
  FenceReason,
  InvalidArgument,
  Outcome,
  TaskState,
  type WorkerClient,
  describeLoss,
} from "../dist/index.js";
import { type Server, callsOf, clientOf, eventually, metricOf, startServer, unique } from "./server.js";

let server: Server;
let client: WorkerClient;

before(async () => {
  server = await startServer();
  client = clientOf(server);
});

after(async () => {
  client.close();
  await server.stop();
});

async function claimOne(on: WorkerClient, ttlSeconds: number, input = "x"): Promise<Claim> {
  const queue = unique("q");
  await on.createTask({ queue, input });
  const claim = await on.claimNext(queue, { ttlSeconds });
  assert.ok(claim instanceof Claim, String(claim));
  return claim;
}

test("the keepalive keeps a claim past its TTL until it commits", async () => {
  const claim = await claimOne(client, 1);
  await eventually(() => claim.renewals >= 5, 30, "five renewals of a 1 s claim");
  assert.ok(claim.isHeld());
  assert.equal((await claim.commit("ok")).outcome, Outcome.COMMITTED);
});

test("a worker whose keepalive stopped past its TTL is FENCED when it commits after a takeover", async () => {
  const late = clientOf(server, "late");
  const claim = await claimOne(late, 1);
  late.keepalive.close(); // as a SIGSTOPped worker: nothing renews its lease any more
  const next = clientOf(server, "next");
  try {
    const taken = await eventually(async () => {
      const won = await next.claim(claim.taskId, { ttlSeconds: 10 });
      return won instanceof Claim ? won : undefined;
    }, 30, "the takeover");
    assert.ok(taken.generation > claim.generation);
    const outcome = await claim.commit("stale");
    assert.equal(outcome.committed, false);
    assert.equal(Outcome[outcome.outcome], "FENCED");
    assert.equal(FenceReason[outcome.reason], "SUPERSEDED");
    assert.equal(claim.lostReason?.source, "commit");
    assert.ok(claim.signal.aborted);
    assert.equal((await taken.commit("fresh")).committed, true);
    const result = await next.getResult(claim.taskId);
    assert.equal(new TextDecoder().decode(result.result), "fresh");
  } finally {
    late.close();
    next.close();
  }
});

test("a lost claim aborts its signal with the reason, and the work listening to it stops", async () => {
  // A downstream that never answers: only the claim's signal can end a call to it.
  const hanging: HttpServer = createServer(() => undefined);
  await new Promise<void>((ok) => hanging.listen(0, "127.0.0.1", ok));
  const url = `http://127.0.0.1:${(hanging.address() as AddressInfo).port}/`;
  const reported: string[] = [];
  try {
    const queue = unique("q");
    await client.createTask({ queue });
    const claim = await client.claimNext(queue, {
      ttlSeconds: 1,
      onLost: (lost) => reported.push(Outcome[lost.outcome]),
    });
    assert.ok(claim instanceof Claim);
    const work = fetch(url, { signal: claim.signal });
    await client.cancelTask(claim.taskId, "no longer needed");
    await assert.rejects(work, (e: unknown) => {
      assert.ok(e instanceof ClaimLost, String(e));
      assert.equal(Outcome[e.reason?.outcome ?? 0], "CANCELLED");
      assert.equal(e.reason?.source, "renew");
      // No fence reason goes with a cancel: none is named ("CANCELLED/UNSPECIFIED" was).
      assert.ok(e.reason && describeLoss(e.reason).startsWith("CANCELLED via renew: "), e.message);
      return true;
    });
    assert.deepEqual(reported, ["CANCELLED"]);
    assert.throws(() => claim.check(), ClaimLost);
    assert.equal((await claim.authorizeTool("search")).allowed, false);
  } finally {
    hanging.closeAllConnections();
    hanging.close();
  }
});

test("a claim left held when its scope ends (await using) is released, not renewed on", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue });
  let held: Claim | undefined;
  await assert.rejects(
    (async () => {
      await using claim = (await client.claimNext(queue, { ttlSeconds: 30 })) as Claim;
      held = claim;
      assert.ok(claim instanceof Claim);
      throw new Error("the agent crashed before fail or release");
    })(),
    /the agent crashed/,
  );
  assert.equal(held?.ended, "released");
  const after = await client.getTask(task.taskId);
  assert.deepEqual([after.state, after.lastError], [TaskState.READY, "released: left its scope without commit"]);
  // A claim that ended in scope is left alone.
  const again = (await client.claimNext(queue, { ttlSeconds: 30 })) as Claim;
  assert.ok((await again.commit("done")).committed);
  await again[Symbol.asyncDispose]();
  assert.equal(again.ended, "committed");
});

test("saveCheckpoint stores the checkpoint now, not at the next renewal; on a fenced claim it answers false", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue });
  const claim = (await client.claim(task.taskId, { ttlSeconds: 60 })) as Claim; // no renewal for 20 s
  assert.ok(claim instanceof Claim);
  assert.equal(await claim.saveCheckpoint("step 7"), true);
  assert.equal(claim.checkpointPending, false);
  assert.equal((await client.getTask(task.taskId)).checkpointSize, 6); // stored already
  await client.cancelTask(task.taskId, "not needed");
  assert.equal(await claim.saveCheckpoint("step 8"), false);
  assert.ok(claim.isLost());
  assert.equal(Outcome[claim.lostReason?.outcome ?? 0], "CANCELLED");
  assert.equal(await claim.saveCheckpoint("step 9"), false); // lost: nothing sent
});

test("one client keeps many claims alive in few RenewMany calls", async (t) => {
  const queue = unique("q");
  const many = clientOf(server, "many");
  try {
    for (let i = 0; i < 256; i++) await many.createTask({ queue, input: String(i) });
    const before = { many: await callsOf(server, "RenewMany"), one: await callsOf(server, "Renew") };
    const claims: Claim[] = [];
    while (claims.length < 256) {
      // 10 s: on a busy machine claiming the 256 can take longer than a short TTL, and a
      // claim lost before its keepalive starts would never be renewed twice.
      const won = await many.claimNext(queue, { ttlSeconds: 10, maxTasks: 64 });
      assert.ok(Array.isArray(won), String(won));
      claims.push(...won);
    }
    await eventually(() => claims.every((c) => c.renewals >= 2), 60, "two renewals of every claim");
    assert.ok(claims.every((c) => c.isHeld()));
    const calls = (await callsOf(server, "RenewMany")) - before.many;
    // Two renewals of 256 claims one by one would be 512 calls; batched they are a few rounds.
    assert.ok(calls >= 2 && calls <= 256 / 8, `RenewMany calls: ${calls}`);
    t.diagnostic(`256 claims renewed twice each in ${calls} RenewMany calls`);
    assert.equal(await callsOf(server, "Renew"), before.one); // never one Renew per claim
    for (const claim of claims) await claim.release();
  } finally {
    many.close();
  }
});

test("a checkpoint the keepalive carried is handed to the next attempt", async () => {
  const claim = await claimOne(client, 1);
  assert.equal(claim.previousCheckpoint.length, 0);
  claim.progress("step-3");
  claim.checkpoint("step-3 of 5");
  const renewals = claim.renewals;
  await eventually(() => claim.renewals >= renewals + 2, 30, "renewals after the checkpoint");
  assert.equal((await claim.release("handing over")).released, true);
  const next = await client.claim(claim.taskId, { ttlSeconds: 5 });
  assert.ok(next instanceof Claim);
  assert.equal(new TextDecoder().decode(next.previousCheckpoint), "step-3 of 5");
  await next.commit("done");
});

for (const ending of ["release", "fail"] as const) {
  test(`a checkpoint no renewal carried yet is sent before a ${ending} ends the attempt`, async () => {
    // Before, one recorded in the last TTL/3 of an attempt was lost: the next began afresh.
    const claim = await claimOne(client, 60); // no keepalive renewal is due during the test
    const renewsBefore = await callsOf(server, "Renew");
    claim.checkpoint("step 7 of 9");
    assert.equal(claim.checkpointPending, true);
    const ended = ending === "release" ? (await claim.release("stopping")).released : (await claim.fail("Flaky")).recorded;
    assert.equal(ended, true);
    assert.equal(claim.checkpointPending, false);
    assert.equal((await callsOf(server, "Renew")) - renewsBefore, 1);
    const next = await client.claim(claim.taskId, { ttlSeconds: 60 });
    assert.ok(next instanceof Claim);
    assert.equal(new TextDecoder().decode(next.previousCheckpoint), "step 7 of 9");
    assert.equal((await next.release("done")).released, true); // nothing pending: no renewal
    assert.equal((await callsOf(server, "Renew")) - renewsBefore, 1);
  });
}

test("a checkpoint or marker past its bound is refused where it is recorded, the claim kept", async () => {
  // The coordinator refuses a renewal carrying one (INVALID_ARGUMENT), and the claim was lost.
  const claim = await claimOne(client, 60);
  assert.throws(() => claim.checkpoint(new Uint8Array(64 * 1024 + 1)), (e: Error) => e instanceof InvalidArgument && /checkpoint is 65537 bytes/.test(e.message));
  assert.throws(() => claim.progress("p".repeat(1025)), (e: Error) => e instanceof InvalidArgument && /progress is 1025 characters/.test(e.message));
  claim.progress("😀".repeat(1024)); // characters (code points), not UTF-16 units or bytes
  assert.equal(claim.checkpointPending, false);
  assert.equal((await claim.release("done")).released, true);
  assert.equal(claim.isLost(), false);
});

test("fail is retried until the attempts are used up, then the task is dead-lettered", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue, maxAttempts: 2 });
  const first = await client.claimNext(queue, { ttlSeconds: 5 });
  assert.ok(first instanceof Claim);
  const retried = await first.fail(new TypeError("flaky"), { retryable: true });
  assert.equal(retried.recorded, true);
  assert.equal(TaskState[retried.state], "READY");
  const second = await client.claimNext(queue, { ttlSeconds: 5 });
  assert.ok(second instanceof Claim);
  assert.equal(second.attempt, 2);
  const dead = await second.fail("still-broken");
  assert.equal(TaskState[dead.state], "FAILED");
  const stored = await client.getTask(task.taskId);
  assert.equal(stored.state, TaskState.FAILED);
  assert.match(stored.lastError, /still-broken/);
});

test("a long poll is woken by a task created while it waits, and an abort ends it", async () => {
  const queue = unique("q");
  const waiting = client.claimNext(queue, { ttlSeconds: 5, waitSeconds: 15 });
  await eventually(async () => (await metricOf(server, "coordinator_claim_waiters ")) === 1, 20, "the waiter");
  const task = await client.createTask({ queue });
  const claim = await waiting;
  assert.ok(claim instanceof Claim, String(claim));
  assert.equal(claim.taskId, task.taskId);
  await claim.commit("ok");

  const stop = new AbortController();
  const aborted = client.claimNext(unique("q"), { ttlSeconds: 5, waitSeconds: 15, signal: stop.signal });
  stop.abort();
  await assert.rejects(aborted, CallAborted);
});

test("stageResult and authorizeTool answer OK while the claim is held", async () => {
  const claim = await claimOne(client, 5);
  const staged = await claim.stageResult("draft");
  assert.ok(staged.staged && staged.current);
  assert.equal((await claim.authorizeTool("search", "query")).allowed, true);
  await claim.commit("final");
});
