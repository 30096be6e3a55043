/**
 * The client against a real coordinator: producer calls (a task's own retry policy and times,
 * listTasks and its filters), claim and commit, typed refusals, and bad input refused with the
 * same typed gRPC errors as the Python SDK gets.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  AttemptEnd,
  Claim,
  ClaimRefused,
  CoordinatorError,
  DeadLetterReason,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  Outcome,
  RpcError,
  TaskState,
  TransportError,
  WorkerClient,
  digestOf,
} from "../dist/index.js";
import { type Server, clientOf, eventually, startServer, unique } from "./server.js";

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

test("a created task is claimed, committed, and its result read back", async () => {
  const queue = unique("q");
  const created = await client.createTask({ queue, input: '{"prompt":"hi"}' });
  assert.equal(created.state, TaskState.READY);
  const claim = await client.claimNext(queue, { ttlSeconds: 10 });
  assert.ok(claim instanceof Claim, String(claim));
  assert.equal(claim.taskId, created.taskId);
  assert.equal(claim.inputText(), '{"prompt":"hi"}');
  assert.equal((await client.getTask(created.taskId)).state, TaskState.CLAIMED);
  const outcome = await claim.commit("done");
  assert.equal(outcome.outcome, Outcome.COMMITTED);
  assert.ok(outcome.committed && claim.committed);
  assert.equal(outcome.commitId, `${claim.fence.attemptId}@${claim.generation}`);
  const result = await client.getResult(created.taskId);
  assert.equal(new TextDecoder().decode(result.result), "done");
  assert.equal(result.resultDigest, digestOf(new TextEncoder().encode("done")));
  assert.equal(result.claimGeneration, claim.generation);
  assert.equal((await client.getTask(created.taskId)).state, TaskState.DONE);
});

test("an empty queue answers NO_READY_TASK as a typed refusal, and a held task ALREADY_CLAIMED", async () => {
  const queue = unique("q");
  const empty = await client.claimNext(queue, { ttlSeconds: 10 });
  assert.ok(empty instanceof ClaimRefused);
  assert.equal(empty.outcome, Outcome.NO_READY_TASK);
  const task = await client.createTask({ queue });
  const held = await client.claim(task.taskId, { ttlSeconds: 10 });
  assert.ok(held instanceof Claim);
  const other = clientOf(server, "other");
  const again = await other.claim(task.taskId, { ttlSeconds: 10 });
  other.close();
  assert.ok(again instanceof ClaimRefused);
  assert.equal(again.outcome, Outcome.ALREADY_CLAIMED);
  assert.equal((await held.release()).released, true);
});

test("a create with a taskId is safe to repeat: the same task comes back", async () => {
  const taskId = unique("t");
  const first = await client.createTask({ taskId, queue: "repeat", input: "x" });
  const second = await client.createTask({ taskId, queue: "repeat", input: "x" });
  assert.equal(second.taskId, first.taskId);
  assert.equal(second.revision, first.revision);
});

test("a task created with dependsOn waits for its upstream, then is READY", async () => {
  const queue = unique("q");
  const up = await client.createTask({ queue, input: "first" });
  const down = await client.createTask({ queue, input: "then", dependsOn: [up.taskId] });
  assert.equal(down.state, TaskState.WAITING);
  assert.deepEqual(down.dependsOn, [up.taskId]);
  const claim = await client.claim(up.taskId, { ttlSeconds: 10 });
  assert.ok(claim instanceof Claim);
  assert.ok((await claim.commit("done")).committed);
  for (let tries = 0; (await client.getTask(down.taskId)).state !== TaskState.READY; tries++) {
    assert.ok(tries < 200, "the dependent never became READY");
    await new Promise((ok) => setTimeout(ok, 50));
  }
});

test("bad input is refused INVALID_ARGUMENT / NOT_FOUND, as for the Python SDK", async () => {
  const oversized = new Uint8Array(2 * 1024 * 1024);
  await assert.rejects(client.createTask({ queue: unique("q"), input: oversized }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument, String(e));
    assert.equal(e.code, "INVALID_ARGUMENT");
    return true;
  });
  await assert.rejects(client.createTask({ taskId: "no spaces allowed" }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument, String(e));
    assert.match(e.message, /task_id/);
    return true;
  });
  await assert.rejects(client.getTask(unique("missing")), (e: unknown) => e instanceof NotFound);
  await assert.rejects(client.getTask("bad/id"), (e: unknown) => e instanceof InvalidArgument);
  await assert.rejects(client.claimNext("q", { ttlSeconds: 0 }), (e: unknown) => e instanceof InvalidArgument);
  await assert.rejects(client.claimNext("q", { ttlSeconds: 5, maxTasks: 65 }), (e: unknown) => e instanceof InvalidArgument);
});

test("claimNext with maxTasks claims several tasks in one call, each its own claim", async () => {
  const queue = unique("q");
  for (let i = 0; i < 3; i++) await client.createTask({ queue, input: `n${i}` });
  const claims = await client.claimNext(queue, { ttlSeconds: 10, maxTasks: 5 });
  assert.ok(Array.isArray(claims), String(claims));
  assert.equal(claims.length, 3);
  assert.equal(new Set(claims.map((c) => c.taskId)).size, 3);
  for (const claim of claims) assert.equal((await claim.commit("ok")).committed, true);
});

test("a coordinator that is not there is a TransportError (no try reached it), not a hang", async () => {
  const nowhere = new WorkerClient({
    target: "127.0.0.1:1",
    principal: "w",
    env: {},
    retry: { budgetSeconds: 0.5, timeoutSeconds: 0.5 },
  });
  try {
    await assert.rejects(
      nowhere.getTask("t"),
      (e: unknown) => e instanceof TransportError && e.message.endsWith("no try reached a coordinator (is one serving at the target? `coordinator up` runs one on this machine)"),
    );
  } finally {
    nowhere.close();
  }
});

test("a call on a closed client throws a CoordinatorError saying so, not an RpcError", async () => {
  const closing = clientOf(server, "closing");
  const task = await closing.createTask({ queue: unique("q") });
  const claim = await closing.claim(task.taskId, { ttlSeconds: 10 });
  assert.ok(claim instanceof Claim);
  closing.close();
  for (const call of [() => closing.getTask(task.taskId), () => claim.commit("too late")]) {
    await assert.rejects(call, (error: Error) => {
      assert.ok(error instanceof CoordinatorError && !(error instanceof RpcError), String(error));
      assert.equal(error.message, "the client is closed (client.close()): the call was not sent");
      return true;
    });
  }
});

// --- the producer's task calls: a task's own policy and times, listTasks ---

async function listed(options: Parameters<WorkerClient["listTasks"]>[0]): Promise<string[]> {
  const ids: string[] = [];
  for await (const task of client.listTasks(options)) ids.push(task.taskId);
  return ids;
}

test("createTask gives the task its own retry policy, start and deadline; getTask reads them back", async () => {
  const queue = unique("q");
  const notBefore = new Date(Date.now() + 3_600_000);
  const policy = {
    maxAttempts: 0,
    initialBackoffSeconds: 2.5,
    backoffMultiplier: 3,
    maxBackoffSeconds: 90,
    backoffJitter: 0.5,
    nonRetryableErrors: ["BadInput"],
  };
  const created = await client.createTask({
    queue,
    priority: 7,
    retryPolicy: policy,
    notBefore,
    scheduleToCloseSeconds: 86_400,
  });
  const task = await client.getTask(created.taskId);
  assert.equal(task.state, TaskState.DELAYED);
  assert.equal(task.priority, 7);
  assert.deepEqual(task.retryPolicy, policy); // every field set: nothing left to a default
  // The server keeps the time as float seconds: the millisecond may round down.
  assert.ok(Math.abs((task.nextEligibleAt?.getTime() ?? 0) - notBefore.getTime()) <= 1, String(task.nextEligibleAt));
  assert.ok(task.createdAt && task.deadline);
  assert.ok(Math.abs(task.deadline.getTime() - task.createdAt.getTime() - 86_400_000) < 2);

  // The shorthand, the rest from the server (this one retries at once, no jitter).
  const short = await client.createTask({ queue, maxAttempts: 2 });
  assert.equal(short.state, TaskState.READY);
  assert.deepEqual(
    [short.retryPolicy?.maxAttempts, short.retryPolicy?.initialBackoffSeconds, short.deadline],
    [2, 0, undefined],
  );
});

test("maxAttempts given twice is refused before sending, nothing created", async () => {
  const queue = unique("q");
  await assert.rejects(client.createTask({ queue, maxAttempts: 2, retryPolicy: { maxAttempts: 3 } }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument, String(e));
    assert.equal(e.message, "give maxAttempts or retryPolicy.maxAttempts, not both");
    return true;
  });
  assert.deepEqual(await listed({ queue }), []);
});

test("listTasks yields a queue's tasks by id a page at a time; blocked picks a dead letter's dependents", async () => {
  const queue = unique("q");
  const up = await client.createTask({ taskId: unique("up"), queue, maxAttempts: 1 });
  const downs = [];
  for (let i = 0; i < 3; i++) {
    downs.push((await client.createTask({ taskId: unique("down"), queue, dependsOn: [up.taskId] })).taskId);
  }
  const other = await client.createTask({ taskId: unique("other"), queue });
  const every = [up.taskId, ...downs, other.taskId].sort();
  assert.deepEqual(await listed({ queue, pageSize: 2 }), every);
  assert.deepEqual(await listed({ queue, blocked: true }), []);

  const claim = await client.claim(up.taskId, { ttlSeconds: 10 });
  assert.ok(claim instanceof Claim, String(claim));
  assert.equal((await claim.fail("BadInput", { retryable: false })).state, TaskState.FAILED);
  const blocked = await eventually(async () => {
    const ids = await listed({ queue, blocked: true, pageSize: 1 });
    return ids.length === 3 ? ids : undefined;
  });
  assert.deepEqual(blocked, [...downs].sort());
  const failed = [];
  for await (const task of client.listTasks({ queue, state: TaskState.FAILED })) failed.push(task);
  assert.deepEqual(
    failed.map((t) => [t.taskId, t.deadLetterReason, t.lastErrorCode]),
    [[up.taskId, DeadLetterReason.NON_RETRYABLE, "BadInput"]],
  );
  assert.deepEqual((await client.getTask(downs[0])).blockedBy, [up.taskId]);
});

test("a bad listTasks is refused INVALID_ARGUMENT naming the field", async () => {
  await assert.rejects(listed({ pageSize: 5000 }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument, String(e));
    assert.match(e.message, /page_size/);
    return true;
  });
});

test("a dead letter's attempts are read, and it is retried with a fresh budget; an input is replaced", async () => {
  const queue = unique("q");
  const task = await client.createTask({ queue, maxAttempts: 1, input: "v1" });
  const claim = await client.claim(task.taskId, { ttlSeconds: 10 });
  assert.ok(claim instanceof Claim, String(claim));
  assert.equal((await claim.fail("BadInput", { retryable: false, message: "no rows" })).state, TaskState.FAILED);
  const attempts = [];
  for await (const attempt of client.attempts(task.taskId, 1)) attempts.push(attempt);
  assert.deepEqual(
    attempts.map((a) => [a.attempt, AttemptEnd[a.end], a.errorCode, a.errorMessage, a.ownerId]),
    [[1, "FAILED", "BadInput", "no rows", client.principal]],
  );

  const retried = await client.retryTask(task.taskId, { reason: "rows fixed", scheduleToCloseSeconds: 3600 });
  assert.deepEqual([retried.state, retried.attemptsCounted], [TaskState.READY, 0]);
  assert.ok(retried.deadline && retried.deadline.getTime() > Date.now() + 3_500_000);
  const again = await client.retryTask(task.taskId);
  assert.equal(again.stateVersion, retried.stateVersion); // a repeat writes nothing

  const changed = await client.updateInput(task.taskId, "v2", retried.revision);
  assert.deepEqual([changed.revision, changed.state], [retried.revision + 1n, TaskState.READY]);
  assert.equal(new TextDecoder().decode((await client.getTask(task.taskId)).input), "v2");
  await assert.rejects(client.updateInput(task.taskId, "v3", retried.revision), (e: unknown) => {
    assert.ok(e instanceof FailedPrecondition, String(e));
    assert.match(e.message, /is at revision 2, expected 1/);
    return true;
  });
});
