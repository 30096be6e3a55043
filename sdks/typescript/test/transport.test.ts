/**
 * The transport's retry rules against a scripted gRPC server (grpc-js, in this process): what
 * is retried, that a claim's retries carry its one idempotency key, that a call given up after
 * a try that may have landed is OutcomeUnknown (not a failure), and that a create with neither
 * a task id nor a key is never retried. The coordinator's own answers are tested against the
 * real server in the other files; this server only fails on cue.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { DescMessage, DescMethodUnary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

import { AdminService, GetEpochResponseSchema } from "../dist/gen/coordinator/v1/admin_pb.js";
import { CreateTaskResponseSchema, GetTaskResponseSchema, TaskService } from "../dist/gen/coordinator/v1/tasks_pb.js";
import { Outcome } from "../dist/gen/coordinator/v1/types_pb.js";
import { ClaimResponseSchema, CommitResponseSchema, WorkerService } from "../dist/gen/coordinator/v1/worker_pb.js";
import { Claim, ClaimRefused, OutcomeUnknown, TransportError, WorkerClient } from "../dist/index.js";

/** Each call's metadata, by method name; `failNext` fails that many next calls of a method. */
const seen = new Map<string, grpc.Metadata[]>();
const failNext = new Map<string, number>();
let server: grpc.Server;
let target: string;

function handler<I extends DescMessage, O extends DescMessage>(
  method: DescMethodUnary<I, O>,
  answer: () => unknown,
): grpc.UntypedServiceImplementation[string] {
  return ((call: grpc.ServerUnaryCall<unknown, unknown>, done: grpc.sendUnaryData<unknown>) => {
    seen.set(method.name, [...(seen.get(method.name) ?? []), call.metadata]);
    const failing = failNext.get(method.name) ?? 0;
    if (failing > 0) {
      failNext.set(method.name, failing - 1);
      done({ code: grpc.status.UNAVAILABLE, details: "the replica restarts" });
    } else done(null, answer());
  }) as grpc.UntypedServiceImplementation[string];
}

function definition<I extends DescMessage, O extends DescMessage>(method: DescMethodUnary<I, O>) {
  return {
    path: `/${method.parent.typeName}/${method.name}`,
    requestStream: false,
    responseStream: false,
    requestSerialize: (v: never) => Buffer.from(toBinary(method.input, v)),
    requestDeserialize: (b: Buffer) => fromBinary(method.input, b),
    responseSerialize: (v: never) => Buffer.from(toBinary(method.output, v)),
    responseDeserialize: (b: Buffer) => fromBinary(method.output, b),
  };
}

before(async () => {
  server = new grpc.Server();
  const methods = [
    [AdminService.method.getEpoch, () => create(GetEpochResponseSchema, { epoch: 1n })],
    [WorkerService.method.claimNext, () => create(ClaimResponseSchema, { outcome: Outcome.NO_READY_TASK })],
    [TaskService.method.createTask, () => create(CreateTaskResponseSchema, { task: { taskId: "t-1" } })],
    [TaskService.method.getTask, () => create(GetTaskResponseSchema, { task: { taskId: "t-1" } })],
    [
      WorkerService.method.claim,
      () =>
        create(ClaimResponseSchema, {
          outcome: Outcome.CLAIMED,
          fence: { taskId: "t-1", attemptId: "a1-x", claimGeneration: 7n, schedulerEpoch: 1n },
          attempt: 1,
          ttlSeconds: 30n,
          leaseRemaining: { seconds: 30n },
        }),
    ],
    [WorkerService.method.commit, () => create(CommitResponseSchema, { outcome: Outcome.COMMITTED })],
  ] as const;
  for (const [method, answer] of methods) {
    server.addService({ [method.name]: definition(method as never) } as grpc.ServiceDefinition, {
      [method.name]: handler(method as never, answer),
    });
  }
  const port = await new Promise<number>((ok, fail) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? fail(e) : ok(p))),
  );
  target = `127.0.0.1:${port}`;
});

after(() => {
  server.forceShutdown();
});

function clientOf(budgetSeconds = 5): WorkerClient {
  return new WorkerClient({
    target,
    principal: "w",
    env: {},
    retry: { budgetSeconds, timeoutSeconds: 2, initialBackoffSeconds: 0.01, maxBackoffSeconds: 0.05 },
  });
}

test("a claim retried after UNAVAILABLE sends its one idempotency key on every try, a new one per call", async () => {
  const client = clientOf();
  try {
    seen.delete("ClaimNext");
    failNext.set("ClaimNext", 2);
    assert.ok((await client.claimNext("q", { ttlSeconds: 5 })) instanceof ClaimRefused);
    await client.claimNext("q", { ttlSeconds: 5 });
    const keys = (seen.get("ClaimNext") ?? []).map((m) => m.get("idempotency-key")[0]);
    assert.equal(keys.length, 4); // two failed tries and the answer, then the next call
    assert.equal(new Set(keys.slice(0, 3)).size, 1);
    assert.notEqual(keys[3], keys[0]);
    const ids = (seen.get("ClaimNext") ?? []).map((m) => m.get("x-request-id")[0]);
    assert.equal(new Set(ids.slice(0, 3)).size, 1); // one request id per logical call too
    assert.equal((seen.get("ClaimNext") ?? [])[0]?.get("x-coordinator-principal")[0], "w");
  } finally {
    client.close();
  }
});

test("a call whose every try may have landed is OutcomeUnknown, naming what to repeat", async () => {
  const client = clientOf(0.3);
  try {
    failNext.set("ClaimNext", 1000);
    await assert.rejects(client.claimNext("q", { ttlSeconds: 5 }), (e: unknown) => {
      assert.ok(e instanceof OutcomeUnknown, String(e));
      assert.equal(e.code, "UNAVAILABLE");
      assert.match(e.message, /outcome unknown, not failed/);
      return true;
    });
  } finally {
    failNext.set("ClaimNext", 0);
    client.close();
  }
});

test("a read whose tries reached a coordinator has no unknown outcome: it changed nothing", async () => {
  const client = clientOf(0.3);
  try {
    failNext.set("GetTask", 1000);
    await assert.rejects(client.getTask("t-1"), (e: unknown) => {
      assert.ok(e instanceof TransportError && !(e instanceof OutcomeUnknown), String(e));
      assert.equal(e.message, "UNAVAILABLE: the replica restarts; a read, nothing changed: repeat it");
      return true;
    });
  } finally {
    failNext.set("GetTask", 0);
    client.close();
  }
});

test("a create is retried only with a task id or an idempotency key", async () => {
  const client = clientOf();
  try {
    seen.delete("CreateTask");
    failNext.set("CreateTask", 1);
    await assert.rejects(client.createTask({ queue: "q" }), (e: unknown) => {
      assert.ok(e instanceof OutcomeUnknown, String(e));
      assert.match(e.message, /idempotencyKey/);
      return true;
    });
    assert.equal(seen.get("CreateTask")?.length, 1); // one try: a retry could create a second task
    failNext.set("CreateTask", 1);
    assert.equal((await client.createTask({ queue: "q", idempotencyKey: "k-1" })).taskId, "t-1");
    const keyed = (seen.get("CreateTask") ?? []).slice(1).map((m) => m.get("idempotency-key")[0]);
    assert.deepEqual(keyed, ["k-1", "k-1"]);
  } finally {
    client.close();
  }
});

test("a commit is retried past what the local clock says is left of the lease", async () => {
  // It stopped when the local lease view ran out: an outage longer than what was left threw a
  // finished result away although etcd still held the lease. The fence decides.
  const client = clientOf();
  try {
    const claim = await client.claim("t-1", { ttlSeconds: 30 });
    assert.ok(claim instanceof Claim, String(claim));
    Object.defineProperty(claim, "remainingSeconds", { value: () => 0.02 });
    failNext.set("Commit", 5);
    const outcome = await claim.commit("done");
    assert.ok(outcome.committed);
    assert.equal(failNext.get("Commit"), 0);
  } finally {
    failNext.set("Commit", 0);
    client.close();
  }
});
