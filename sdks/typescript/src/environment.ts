/**
 * Where a client connects and how it authenticates: the same `COORDINATOR_*` environment the
 * Python SDK and the CLI read (coordinator/sdk/environment.py).
 *
 * - `COORDINATOR_TARGET`: `host:port`, replicas (comma-separated), or a gRPC URI such as
 *   `dns:///coordinator.example:7070`; unset: DEFAULT_TARGET.
 * - `COORDINATOR_TOKEN`: a bearer token. Unset: the contents of the file
 *   `COORDINATOR_CLIENT_TOKEN_FILE` names (a mounted Kubernetes Secret).
 * - `COORDINATOR_CA`: PEM CA of the server's certificate (TLS).
 * - `COORDINATOR_CLIENT_CERT` and `COORDINATOR_CLIENT_KEY`: a client certificate and its key
 *   (mutual TLS).
 * - `COORDINATOR_INSECURE`: send no credentials (`coordinator up --print-env` sets it).
 * - `COORDINATOR_WORKER_ID`: the principal a client names itself as when none is given (the
 *   server ignores it when a token authenticates the caller).
 *
 * An option given wins over its variable; settings that contradict each other (no credentials
 * and a token, a certificate without its key) are refused naming where each came from.
 */
import { readFileSync } from "node:fs";

import { InvalidArgument } from "./errors.js";

export const TARGET = "COORDINATOR_TARGET";
export const TOKEN = "COORDINATOR_TOKEN";
export const CLIENT_TOKEN_FILE = "COORDINATOR_CLIENT_TOKEN_FILE";
export const CA = "COORDINATOR_CA";
export const CLIENT_CERT = "COORDINATOR_CLIENT_CERT";
export const CLIENT_KEY = "COORDINATOR_CLIENT_KEY";
export const INSECURE = "COORDINATOR_INSECURE";
export const WORKER_ID = "COORDINATOR_WORKER_ID";

/** `coordinator up`'s and `serve`'s default listen address. */
export const DEFAULT_TARGET = "127.0.0.1:50051";

// click's spelling of booleans, so a variable means the same here as to the CLI.
const TRUE = new Set(["1", "true", "t", "yes", "y", "on"]);
const FALSE = new Set(["0", "false", "f", "no", "n", "off"]);

/** TLS material: PEM contents or paths of PEM files. */
export interface TlsOptions {
  /** The CA that signed the server's certificate (system roots when absent). */
  ca?: string | Buffer;
  /** A client certificate and its key, for mutual TLS (both or neither). */
  cert?: string | Buffer;
  key?: string | Buffer;
}

/** A client's connection settings, each given or read from the environment. */
export interface Connection {
  targets: string[];
  token: string | undefined;
  tls: { ca: Buffer | undefined; cert: Buffer | undefined; key: Buffer | undefined } | undefined;
  principal: string | undefined;
}

interface Setting {
  value: string;
  origin: string;
}

type Env = Readonly<Record<string, string | undefined>>;

function fromEnv(name: string, env: Env): Setting | undefined {
  const value = env[name] ?? "";
  return value ? { value, origin: `the environment variable ${name}` } : undefined;
}

function tokenFromEnv(env: Env): Setting | undefined {
  const token = fromEnv(TOKEN, env);
  if (token) return token;
  const path = fromEnv(CLIENT_TOKEN_FILE, env);
  if (!path) return undefined;
  try {
    const value = readFileSync(path.value, "utf8").trim();
    return { value, origin: `the file ${CLIENT_TOKEN_FILE} names (${path.value})` };
  } catch (error) {
    throw new InvalidArgument(`${path.origin}: cannot read ${JSON.stringify(path.value)}: ${error}`);
  }
}

function isSet(setting: Setting | undefined): boolean {
  if (!setting) return false;
  const text = setting.value.trim().toLowerCase();
  if (!TRUE.has(text) && !FALSE.has(text)) {
    throw new InvalidArgument(`${setting.origin}: ${JSON.stringify(setting.value)} is not a boolean (1 or 0)`);
  }
  return TRUE.has(text);
}

/** The replicas a target names: a gRPC URI stays whole; `a:1,b:2` (or a list) is one each. */
export function splitTargets(target: string | readonly string[]): string[] {
  const given = typeof target === "string" ? [target] : [...target];
  if (given.length === 1 && /^(dns|ipv4|ipv6|unix|unix-abstract|vsock):/.test(given[0] ?? "")) {
    return [given[0] as string];
  }
  const parts = given.flatMap((t) => t.split(",")).map((p) => p.trim()).filter(Boolean);
  if (parts.length === 0) throw new InvalidArgument("no coordinator address given");
  return parts;
}

function pem(value: string | Buffer | undefined, what: string, origin: string): Buffer | undefined {
  if (value === undefined) return undefined;
  if (Buffer.isBuffer(value)) return value;
  if (value.includes("-----BEGIN")) return Buffer.from(value);
  try {
    return readFileSync(value);
  } catch (error) {
    throw new InvalidArgument(`cannot read the ${what} (${origin}): ${error}`);
  }
}

/** The options a client takes that the environment can supply. */
export interface ConnectionOptions {
  target?: string | readonly string[];
  token?: string;
  tls?: TlsOptions;
  principal?: string;
}

/**
 * A client's target, token, TLS and principal: each option given, else its variable. Throws
 * InvalidArgument naming the variables when those read contradict each other.
 */
export function connection(options: ConnectionOptions, env: Env = process.env): Connection {
  const target = options.target ?? fromEnv(TARGET, env)?.value ?? DEFAULT_TARGET;
  const token = options.token !== undefined ? undefined : tokenFromEnv(env);
  const tlsGiven = options.tls !== undefined;
  const cert = tlsGiven ? undefined : fromEnv(CLIENT_CERT, env);
  const key = tlsGiven ? undefined : fromEnv(CLIENT_KEY, env);
  // Read only when no credential was passed: one passed is the caller's choice.
  const insecure = options.token !== undefined || tlsGiven ? undefined : fromEnv(INSECURE, env);
  const credentials = [token, cert].filter((s): s is Setting => s !== undefined);
  if (insecure && isSet(insecure) && credentials.length > 0) {
    const names = credentials.map((s) => s.origin).join(" and ");
    throw new InvalidArgument(
      `${insecure.origin} says to send no credentials, but ${names} gives some: drop one of them`,
    );
  }
  const half = [cert, key].filter((s): s is Setting => s !== undefined);
  if (half.length === 1) {
    throw new InvalidArgument(
      `a client certificate and its key go together, but only ${half[0]?.origin} is set`,
    );
  }
  return {
    targets: splitTargets(target),
    token: options.token ?? token?.value,
    tls: tlsOf(options.tls, fromEnv(CA, env), cert, key),
    principal: options.principal ?? fromEnv(WORKER_ID, env)?.value,
  };
}

function tlsOf(
  given: TlsOptions | undefined,
  ca: Setting | undefined,
  cert: Setting | undefined,
  key: Setting | undefined,
): Connection["tls"] {
  if (given !== undefined) {
    if ((given.cert === undefined) !== (given.key === undefined)) {
      throw new InvalidArgument("tls.cert and tls.key go together (mutual TLS needs both)");
    }
    return {
      ca: pem(given.ca, "CA", "tls.ca"),
      cert: pem(given.cert, "client certificate", "tls.cert"),
      key: pem(given.key, "client key", "tls.key"),
    };
  }
  if (!ca && !cert) return undefined;
  return {
    ca: pem(ca?.value, "CA", ca?.origin ?? ""),
    cert: pem(cert?.value, "client certificate", cert?.origin ?? ""),
    key: pem(key?.value, "client key", key?.origin ?? ""),
  };
}
