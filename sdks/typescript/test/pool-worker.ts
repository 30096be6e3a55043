/**
 * A worker process for test/pool.test.ts: a WorkerPool over COORDINATOR_TARGET's queue
 * POOL_QUEUE whose handler works until its signal aborts (it never finishes by itself), stopped
 * by SIGTERM within a short grace. Prints "ready" once claiming and the report as JSON at exit.
 */
import { WorkerClient, WorkerPool, stopOnSignals } from "../dist/index.js";

const client = new WorkerClient({ principal: "pool-worker" });
const pool = new WorkerPool(
  client,
  (claim, signal) =>
    new Promise((_, reject) => {
      process.stdout.write(`running ${claim.taskId}\n`);
      signal.addEventListener("abort", () => reject(signal.reason as Error), { once: true });
    }),
  { queues: [process.env.POOL_QUEUE ?? "default"], concurrency: 2, graceSeconds: 1, ttlSeconds: 30, longPollSeconds: 5 },
);
stopOnSignals(pool);
process.stdout.write("ready\n");
const report = await pool.run();
client.close();
process.stdout.write(`${JSON.stringify(report)}\n`);
