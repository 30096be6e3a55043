/**
 * A real coordinator for the tests (test/server.py: etcd, store, gRPC server), and the waits
 * the tests use instead of sleeps.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { WorkerClient, type WorkerClientOptions } from "../dist/index.js";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository's root (this file runs from sdks/typescript/dist-test). */
export const ROOT = resolve(here, "../../..");
/** The repo's venv python, where the coordinator is installed. */
export const PYTHON = process.env.COORDINATOR_PYTHON ?? resolve(ROOT, ".venv/bin/python");

/** A running coordinator. */
export interface Server {
  target: string;
  metrics: string;
  /** A server over the same store that demands bearer tokens; `token` is "ts-secure"'s. */
  secure: { target: string; token: string };
  /** A server that demands a client certificate: its CA, and "ts-mtls"'s certificate and key. */
  mtls: { target: string; ca: string; cert: string; key: string };
  /** A server over server-only TLS (no token, no client certificate) and its CA. */
  tls: { target: string; ca: string };
  /** Two more plain servers over the same store, which stopReplica takes away. */
  replicas: string[];
  process: ChildProcess;
  /** Stop replica `index` (its port closed, calls in flight failed) and resolve once it is. */
  stopReplica(index: number): Promise<void>;
  stop(): Promise<void>;
}

/** Start a coordinator; it stops when `stop()` closes its stdin, or when this process dies. */
export async function startServer(): Promise<Server> {
  const child = spawn(PYTHON, [resolve(ROOT, "sdks/typescript/test/server.py")], {
    // The repo on the path: the server borrows the Python tests' certificate authority.
    env: { ...process.env, PYTHONPATH: ROOT },
    stdio: ["pipe", "pipe", process.env.COORDINATOR_TEST_LOGS ? "inherit" : "ignore"],
  });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  const first = await new Promise<string>((ok, fail) => {
    lines.once("line", ok);
    child.once("exit", (code) => fail(new Error(`test/server.py exited ${code} before serving`)));
  });
  const address = JSON.parse(first) as Pick<Server, "target" | "metrics" | "secure" | "mtls" | "tls" | "replicas">;
  return {
    ...address,
    process: child,
    stopReplica: (index) =>
      new Promise<void>((ok) => {
        const done = (line: string): void => {
          if (line !== `stopped ${index}`) return;
          lines.off("line", done);
          ok();
        };
        lines.on("line", done);
        child.stdin?.write(`stop ${index}\n`);
      }),
    stop: () =>
      new Promise<void>((ok) => {
        child.once("exit", () => ok());
        child.stdin?.end();
      }),
  };
}

/** A client of `server` as `principal`, with no `COORDINATOR_*` variable of the caller's. */
export function clientOf(server: Server, principal = "ts-worker", options: WorkerClientOptions = {}): WorkerClient {
  return new WorkerClient({ target: server.target, principal, env: {}, ...options });
}

/** A name no other test uses. */
export function unique(prefix: string): string {
  return `${prefix}-${randomBytes(4).toString("hex")}`;
}

/** Wait until `condition` gives a truthy value (polling), failing after `timeoutSeconds`. */
export async function eventually<T>(
  condition: () => T | Promise<T>,
  timeoutSeconds = 20,
  what = "the condition",
): Promise<NonNullable<T>> {
  const end = performance.now() + timeoutSeconds * 1000;
  for (;;) {
    const value = await condition();
    if (value) return value as NonNullable<T>;
    if (performance.now() > end) throw new Error(`${what} did not hold within ${timeoutSeconds}s`);
    await new Promise((ok) => setTimeout(ok, 50));
  }
}

/** The value of the server's first Prometheus sample that starts with `prefix` (0: none). */
export async function metricOf(server: Server, prefix: string, label = ""): Promise<number> {
  const text = await (await fetch(server.metrics)).text();
  const line = text.split("\n").find((l) => l.startsWith(prefix) && l.includes(label));
  return line ? Number(line.split(" ").at(-1)) : 0;
}

/** How many calls of `method` ("RenewMany") the server answered. */
export function callsOf(server: Server, method: string): Promise<number> {
  return metricOf(server, "coordinator_rpc_duration_seconds_count{", `/${method}"`);
}
