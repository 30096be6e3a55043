/**
 * A worker process for test/pool.test.ts: a WorkerPool of two slots over COORDINATOR_TARGET's
 * queue POOL_QUEUE, stopped by SIGTERM within POOL_GRACE seconds (default 1). Its handler prints
 * "running <task>" and works until its signal aborts (it never finishes by itself); on a task
 * whose input is "block" it waits for SIGUSR2, prints "blocking", blocks the event loop until a
 * byte comes on stdin (as CPU-bound work would), and returns "unblocked". Prints "ready" once
 * claiming, each SIGTERM or SIGINT once the pool has taken it, and the report as JSON at exit.
 */
import { readSync } from "node:fs";

import { type Claim, WorkerClient, WorkerPool, stopOnSignals } from "../dist/index.js";

async function block(): Promise<string> {
  await new Promise((ok) => process.once("SIGUSR2", ok));
  process.stdout.write("blocking\n");
  readSync(0, Buffer.alloc(1));
  return "unblocked";
}

function work(claim: Claim, signal: AbortSignal): Promise<string> {
  process.stdout.write(`running ${claim.taskId}\n`);
  if (claim.inputText() === "block") return block();
  return new Promise((_, reject) => {
    signal.addEventListener("abort", () => reject(signal.reason as Error), { once: true });
  });
}

const client = new WorkerClient({ principal: "pool-worker" });
const pool = new WorkerPool(client, work, {
  queues: [process.env.POOL_QUEUE ?? "default"],
  concurrency: 2,
  graceSeconds: Number(process.env.POOL_GRACE ?? 1),
  ttlSeconds: 30,
  longPollSeconds: 5,
});
stopOnSignals(pool);
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.stdout.write(`${signal}\n`));
process.stdout.write("ready\n");
const report = await pool.run();
client.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
