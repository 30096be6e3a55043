/**
 * Several endpoints and server-only TLS over the wire: a client given replicas (in the options
 * or COORDINATOR_TARGET, comma-separated as the Python SDK reads it) gets past one that is down
 * and keeps renewing a claim through another when its replica goes away; a client given only
 * the CA of the server's certificate connects, and one given a wrong CA fails with a clear error.
 */
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, test } from "node:test";

import { Claim, TransportError, WorkerClient, type WorkerClientOptions } from "../dist/index.js";
import { type Server, eventually, startServer, unique } from "./server.js";

let server: Server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server.stop();
});

/** A loopback address nothing listens on (a port just bound and closed again). */
async function closedPort(): Promise<string> {
  const listener = createServer();
  await new Promise<void>((ok) => listener.listen(0, "127.0.0.1", ok));
  const { port } = listener.address() as { port: number };
  await new Promise<void>((ok) => listener.close(() => ok()));
  return `127.0.0.1:${port}`;
}

/** A client that starts on its first endpoint: the SDK picks a random one (to spread a pool
 * over the replicas), so Math.random is pinned while it is built. */
function firstEndpointClient(options: WorkerClientOptions): WorkerClient {
  const random = Math.random;
  Math.random = () => 0;
  try {
    return new WorkerClient({ principal: "ts-endpoints", ...options });
  } finally {
    Math.random = random;
  }
}

test("a client whose first endpoint is down reaches the second, from the options or COORDINATOR_TARGET", async () => {
  const down = await closedPort();
  const ways: WorkerClientOptions[] = [
    { target: [down, server.target], env: {} },
    { target: `${down},${server.target}`, env: {} },
    { env: { COORDINATOR_TARGET: `${down}, ${server.target}` } },
  ];
  for (const way of ways) {
    const client = firstEndpointClient(way);
    try {
      const queue = unique("q");
      // With a taskId a create is safe to retry, so its first try (the closed port) is retried.
      const task = await client.createTask({ taskId: unique("t"), queue, input: "x" });
      const claim = await client.claimNext(queue, { ttlSeconds: 10 });
      assert.ok(claim instanceof Claim, String(claim));
      assert.equal(claim.taskId, task.taskId);
      assert.equal((await claim.commit("ok")).committed, true);
      assert.equal(new TextDecoder().decode((await client.getResult(task.taskId)).result), "ok");
    } finally {
      client.close();
    }
  }
});

test("a claim whose replica goes away is renewed through the other one and commits", async () => {
  const [first, second] = server.replicas as [string, string];
  const client = firstEndpointClient({ target: [first, second], env: {} });
  try {
    const queue = unique("q");
    await client.createTask({ queue });
    const claim = await client.claimNext(queue, { ttlSeconds: 3 }); // granted by the first
    assert.ok(claim instanceof Claim, String(claim));
    await server.stopReplica(0);
    const before = claim.renewals;
    // Two renewals after the stop: the lease (3 s) has been restored past its original end.
    await eventually(() => claim.renewals >= before + 2, 20, "renewals through the second replica");
    assert.ok(claim.isHeld(), `lost: ${JSON.stringify(claim.lostReason)}`);
    assert.equal(claim.signal.aborted, false);
    assert.equal((await claim.commit("ok")).committed, true);
  } finally {
    client.close();
  }
});

test("server-only TLS: the CA alone connects, from the options or COORDINATOR_CA", async () => {
  const { target, ca } = server.tls;
  const ways: WorkerClientOptions[] = [
    { target, tls: { ca }, env: {} },
    { env: { COORDINATOR_TARGET: target, COORDINATOR_CA: ca } },
  ];
  for (const way of ways) {
    const client = new WorkerClient({ principal: "ts-tls", ...way });
    try {
      const queue = unique("q");
      await client.createTask({ queue });
      const claim = await client.claimNext(queue, { ttlSeconds: 5 });
      assert.ok(claim instanceof Claim, String(claim));
      assert.equal((await claim.commit("ok")).committed, true);
      assert.equal((await client.getResult(claim.taskId)).ownerId, "ts-tls"); // no token: as named
    } finally {
      client.close();
    }
  }
});

test("server-only TLS with a wrong CA fails with a TransportError that names the certificate", async () => {
  const client = new WorkerClient({
    target: server.tls.target,
    principal: "ts-tls",
    tls: { ca: server.mtls.ca }, // another CA: the server's certificate does not verify
    retry: { budgetSeconds: 1 },
    env: {},
  });
  try {
    await assert.rejects(client.getTask("any"), (e: unknown) => {
      assert.ok(e instanceof TransportError, String(e));
      assert.match(e.message, /certificate/i, e.message);
      return true;
    });
  } finally {
    client.close();
  }
});
