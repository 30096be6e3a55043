/** The bytes a task's input, result, checkpoint or effect payload is given as, and their
 * digest. */
import { createHash } from "node:crypto";

/** Bytes, or text (sent as UTF-8). */
export type Payload = Uint8Array | string;

/** The bytes of a payload. */
export function bytesOf(payload: Payload): Uint8Array {
  return typeof payload === "string" ? new TextEncoder().encode(payload) : payload;
}

/** "sha256:" + hex, the digest every wire field of that name carries. */
export function digestOf(data: Uint8Array): string {
  return `sha256:${createHash("sha256").update(data).digest("hex")}`;
}
