/**
 * Configuration from options or the COORDINATOR_* environment (as the Python SDK and the CLI
 * read it), bearer tokens on the wire, and the pure rules: retry budget, status mapping,
 * renewal batches.
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { outOfTime, retryDeadline, tryTimeout } from "../dist/budget.js";
import { connection } from "../dist/environment.js";
import { batches } from "../dist/keepalive.js";
import { errorOf, neverSent, translate } from "../dist/status.js";
import {
  Claim,
  InvalidArgument,
  NotFound,
  OutcomeUnknown,
  RpcError,
  TransportError,
  Unauthenticated,
  WorkerClient,
} from "../dist/index.js";
import { type Server, startServer, unique } from "./server.js";

let server: Server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server.stop();
});

test("a token from the options, COORDINATOR_TOKEN or the token file authenticates the caller", async () => {
  const file = join(mkdtempSync(join(tmpdir(), "token-")), "token");
  writeFileSync(file, `${server.secure.token}\n`);
  const ways = [
    { token: server.secure.token, env: {} },
    { env: { COORDINATOR_TOKEN: server.secure.token } },
    { env: { COORDINATOR_CLIENT_TOKEN_FILE: file } },
  ];
  for (const way of ways) {
    // The principal named here is ignored: the token says who calls.
    const client = new WorkerClient({ target: server.secure.target, principal: "someone-else", ...way });
    try {
      const queue = unique("q");
      await client.createTask({ queue });
      const claim = await client.claimNext(queue, { ttlSeconds: 5 });
      assert.ok(claim instanceof Claim, String(claim));
      await claim.commit("ok");
      assert.equal((await client.getResult(claim.taskId)).ownerId, "ts-secure");
    } finally {
      client.close();
    }
  }
});

test("mutual TLS from the options or the COORDINATOR_CA / _CLIENT_CERT / _CLIENT_KEY variables", async () => {
  const { target, ca, cert, key } = server.mtls;
  const ways = [
    { tls: { ca, cert, key }, env: {} },
    { env: { COORDINATOR_CA: ca, COORDINATOR_CLIENT_CERT: cert, COORDINATOR_CLIENT_KEY: key } },
  ];
  for (const way of ways) {
    const client = new WorkerClient({ target, principal: "someone-else", ...way });
    try {
      const queue = unique("q");
      await client.createTask({ queue });
      const claim = await client.claimNext(queue, { ttlSeconds: 5 });
      assert.ok(claim instanceof Claim, String(claim));
      await claim.commit("ok");
      assert.equal((await client.getResult(claim.taskId)).ownerId, "ts-mtls"); // the certificate's
    } finally {
      client.close();
    }
  }
});

test("no token, or a wrong one, is UNAUTHENTICATED", async () => {
  for (const token of [undefined, "not-the-token"]) {
    const client = new WorkerClient({ target: server.secure.target, principal: "w", env: {}, ...(token ? { token } : {}) });
    try {
      await assert.rejects(client.getTask("t"), (e: unknown) => e instanceof Unauthenticated && e.code === "UNAUTHENTICATED");
    } finally {
      client.close();
    }
  }
});

test("settings come from the environment unless given, and contradictions name their origins", () => {
  const env = { COORDINATOR_TARGET: "10.0.0.1:7000,10.0.0.2:7000", COORDINATOR_WORKER_ID: "w-env" };
  assert.deepEqual(connection({}, env), {
    targets: ["10.0.0.1:7000", "10.0.0.2:7000"],
    token: undefined,
    tls: undefined,
    principal: "w-env",
  });
  assert.deepEqual(connection({ target: "dns:///c.example:7070", principal: "w" }, env).targets, ["dns:///c.example:7070"]);
  assert.deepEqual(connection({}, {}).targets, ["127.0.0.1:50051"]); // where `coordinator up` listens
  assert.throws(
    () => connection({}, { COORDINATOR_INSECURE: "1", COORDINATOR_TOKEN: "t" }),
    (e: unknown) =>
      e instanceof InvalidArgument && /COORDINATOR_INSECURE/.test(e.message) && /COORDINATOR_TOKEN/.test(e.message),
  );
  assert.throws(() => connection({}, { COORDINATOR_INSECURE: "maybe" }), InvalidArgument);
  assert.throws(
    () => connection({}, { COORDINATOR_CLIENT_CERT: "/c.pem" }),
    (e: unknown) => e instanceof InvalidArgument && /COORDINATOR_CLIENT_CERT/.test(e.message),
  );
  assert.throws(() => connection({}, { COORDINATOR_CLIENT_TOKEN_FILE: "/no/such/file" }), InvalidArgument);
  // A token given wins; the insecure variable is then not read (the caller's choice).
  assert.equal(connection({ token: "t" }, { COORDINATOR_INSECURE: "1", COORDINATOR_TOKEN: "x" }).token, "t");
  const pem = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
  const tls = connection({ tls: { ca: pem } }, {}).tls;
  assert.equal(tls?.ca?.toString(), pem);
  assert.throws(() => connection({ tls: { cert: pem } }, {}), InvalidArgument);
  assert.throws(() => new WorkerClient({ env: {} }), (e: unknown) => e instanceof InvalidArgument && /COORDINATOR_WORKER_ID/.test(e.message));
});

test("the retry budget: the earlier of the budget and the lease, never a try below 0.2 s", () => {
  assert.equal(retryDeadline(100, 100, 15), 115);
  assert.equal(retryDeadline(100, 100, 15, 4), 104); // behind a fence: the lease ends first
  assert.equal(retryDeadline(100, 100, 15, -1), 100);
  assert.equal(retryDeadline(100, 116, 15), 131); // a long poll failed late in its wait
  assert.equal(outOfTime(103.9, 0.1, 104), true);
  assert.equal(outOfTime(103, 0.5, 104), false);
  assert.equal(tryTimeout(103.95, 104, 10), 0.2);
  assert.equal(tryTimeout(100, 115, 10), 10);
});

test("a status becomes the SDK's typed error; a try that may have landed is OutcomeUnknown", () => {
  const keyed = { maybeSent: true, hint: "repeat", keyed: true };
  assert.ok(translate({ code: 5, details: "no task" }, keyed) instanceof NotFound);
  assert.ok(translate({ code: 14, details: "reset" }, keyed) instanceof OutcomeUnknown);
  assert.ok(translate({ code: 10, details: "in flight" }, keyed) instanceof OutcomeUnknown); // ABORTED, keyed
  assert.ok(translate({ code: 10, details: "in flight" }, { ...keyed, keyed: false }) instanceof RpcError);
  const never = translate({ code: 14, details: "No connection established" }, { ...keyed, maybeSent: false });
  assert.ok(never instanceof TransportError && !(never instanceof OutcomeUnknown));
  assert.equal(neverSent({ code: 8, details: "principal_share" }), true); // RESOURCE_EXHAUSTED
  // A coordinator refused every try (a bound): not "is one serving at the target?".
  const refused = translate({ code: 8, details: "write budget spent" }, { ...keyed, maybeSent: false });
  assert.ok(refused instanceof TransportError && !(refused instanceof OutcomeUnknown));
  assert.equal(refused.message, "RESOURCE_EXHAUSTED: write budget spent; refused on every try, nothing ran");
  assert.equal(neverSent({ code: 4, details: "deadline" }), false);
  assert.ok(errorOf("INVALID_ARGUMENT", "bad fence") instanceof InvalidArgument);
  assert.equal(errorOf("DATA_LOSS", "?").code, "DATA_LOSS");
});

test("renewals go in calls of at most 500 claims and 1 MiB", () => {
  const due = (n: number, checkpoint = 0) =>
    Array.from({ length: n }, () => ({ claim: {} as Claim, request: { checkpoint: new Uint8Array(checkpoint) }, timeout: 1 }));
  assert.deepEqual(batches(due(1200)).map((b) => b.length), [500, 500, 200]);
  assert.deepEqual(batches(due(40, 64 * 1024)).map((b) => b.length), [15, 15, 10]);
  assert.deepEqual(batches([]), []);
});
