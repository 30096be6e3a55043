/**
 * Side effects against a real coordinator: sent once and skipped after, a takeover reconciles
 * an earlier attempt's send instead of sending again, a slot bound to another payload is never
 * sent with ours, and a refused send may be sent again with the same key.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Claim,
  type Downstream,
  DownstreamRefused,
  type DownstreamResult,
  DownstreamUncertain,
  type WorkerClient,
} from "../dist/index.js";
import { type Server, clientOf, eventually, startServer, unique } from "./server.js";

let server: Server;
let client: WorkerClient;

before(async () => {
  server = await startServer();
  client = clientOf(server, "effects");
});

after(async () => {
  client.close();
  await server.stop();
});

/** A downstream that dedupes on the key, as a real one must, and counts what it was sent. */
class Outbox implements Downstream {
  readonly sent = new Map<string, string>();
  sends = 0;
  lookups = 0;
  /** Perform the send, then never answer (the sender is paused or its answer is lost). */
  hangAfterSend = false;
  /** Refuse the next send (a definite 4xx: nothing performed). */
  refuseNext = false;
  /** Perform the next send and lose its answer (a timeout after the request left). */
  loseNext = false;

  async execute(key: string, _generation: bigint, payload: Uint8Array): Promise<DownstreamResult> {
    this.sends += 1;
    if (this.refuseNext) {
      this.refuseNext = false;
      throw new DownstreamRefused("400 bad request");
    }
    if (!this.sent.has(key)) this.sent.set(key, new TextDecoder().decode(payload));
    if (this.loseNext) {
      this.loseNext = false;
      throw new DownstreamUncertain("the response was lost: timeout");
    }
    if (this.hangAfterSend) return new Promise(() => undefined);
    return { externalRef: `msg-${key.slice(0, 8)}` };
  }

  async lookup(key: string): Promise<DownstreamResult | null> {
    this.lookups += 1;
    return this.sent.has(key) ? { externalRef: `msg-${key.slice(0, 8)}` } : null;
  }
}

async function claimOne(on: WorkerClient, ttlSeconds: number): Promise<Claim> {
  const queue = unique("q");
  await on.createTask({ queue });
  const claim = await on.claimNext(queue, { ttlSeconds });
  assert.ok(claim instanceof Claim, String(claim));
  return claim;
}

test("an effect is sent once, and skipped when asked again", async () => {
  const outbox = new Outbox();
  const claim = await claimOne(client, 10);
  const first = await claim.effect("notify", "welcome", "hello", outbox);
  assert.equal(first.status, "executed");
  assert.ok(first.sent && first.recorded && first.done);
  const again = await claim.effect("notify", "welcome", "hello", outbox);
  assert.equal(again.status, "skipped");
  assert.equal(again.effectId, first.effectId);
  assert.equal(again.sent, false);
  assert.equal(outbox.sends, 1);
  await claim.commit("ok");
});

test("a takeover reconciles the earlier attempt's send and never sends twice", async () => {
  const outbox = new Outbox();
  const paused = clientOf(server, "effects");
  const claim = await claimOne(paused, 1);
  outbox.hangAfterSend = true;
  void claim.effect("notify", "invoice", "pay 10", outbox); // sent; its record never comes
  await eventually(() => outbox.sends === 1, 20, "the first send");
  paused.keepalive.close(); // the worker stops: its lease runs out
  const taken = await eventually(async () => {
    const won = await client.claim(claim.taskId, { ttlSeconds: 10 });
    return won instanceof Claim ? won : undefined;
  }, 30, "the takeover");
  outbox.hangAfterSend = false;
  const outcome = await taken.effect("notify", "invoice", "pay 10", outbox);
  assert.equal(outcome.status, "reconciled");
  assert.equal(outcome.sent, false);
  assert.equal(outbox.sends, 1);
  assert.equal(outbox.lookups, 1);
  assert.equal((await taken.commit("ok")).committed, true);
  paused.close();
});

test("a slot bound to another payload is never sent with ours (PAYLOAD_CONFLICT)", async () => {
  const outbox = new Outbox();
  const claim = await claimOne(client, 10);
  await claim.effect("notify", "welcome", "hello Ada", outbox);
  const other = await claim.effect("notify", "welcome", "hello Grace", outbox);
  assert.equal(other.conflict, true);
  assert.equal(other.status, "skipped"); // the original is committed: nothing to send
  assert.equal(other.sent, false);
  assert.equal(outbox.sends, 1);
  assert.deepEqual([...outbox.sent.values()], ["hello Ada"]);
  await claim.commit("ok");
});

test("a refused send is recorded ABSENT and the next attempt sends it, with the same key", async () => {
  const outbox = new Outbox();
  const claim = await claimOne(client, 10);
  outbox.refuseNext = true;
  const refused = await claim.effect("notify", "sms", "code 1234", outbox);
  assert.equal(refused.status, "not_performed");
  assert.equal(refused.recorded, true);
  // Within one attempt a key is never sent twice (as in the Python SDK): the retry is the
  // next attempt's.
  assert.equal((await claim.release("retry the sms")).released, true);
  const next = await client.claim(claim.taskId, { ttlSeconds: 10 });
  assert.ok(next instanceof Claim);
  const sent = await next.effect("notify", "sms", "code 1234", outbox);
  assert.equal(sent.status, "executed");
  assert.equal(sent.effectId, refused.effectId);
  assert.equal(outbox.sends, 2);
  assert.equal(outbox.sent.size, 1);
  await next.commit("ok");
});

test("an answer lost downstream is UNKNOWN, and asking again looks it up instead of resending", async () => {
  const outbox = new Outbox();
  const claim = await claimOne(client, 10);
  outbox.loseNext = true;
  const lost = await claim.effect("notify", "webhook", "event 7", outbox);
  assert.equal(lost.status, "uncertain");
  assert.equal(lost.done, false);
  const again = await claim.effect("notify", "webhook", "event 7", outbox);
  assert.equal(again.status, "reconciled");
  assert.equal(again.sent, false);
  assert.equal(outbox.sends, 1);
  await claim.commit("ok");
});
