/** The bytes a task's input, result, checkpoint or effect payload is given as, and their
 * digest. */
import { createHash } from "node:crypto";

import { InvalidArgument } from "./errors.js";

/** Bytes, or text (sent as UTF-8). */
export type Payload = Uint8Array | string;

/** The bytes of a payload. */
export function bytesOf(payload: Payload): Uint8Array {
  return typeof payload === "string" ? new TextEncoder().encode(payload) : payload;
}

/** The largest input and result the coordinator accepts (its own limits, checked here first:
 * a message past gRPC's limit would come back RESOURCE_EXHAUSTED, which reads as a busy replica
 * and is retried for the whole retry budget). */
export const MAX_INPUT_BYTES = 256 * 1024;
export const MAX_RESULT_BYTES = 512 * 1024;
/** The largest checkpoint and progress marker (characters) a renewal may carry: past them the
 * coordinator refuses the renewal, and the claim with it, so they are refused when recorded. */
export const MAX_CHECKPOINT_BYTES = 64 * 1024;
export const MAX_TEXT_CHARS = 1024;

/** A text field of at most `limit` characters (code points, as the coordinator counts). */
export function limitedText(field: string, text: string, limit: number): string {
  const chars = [...text].length;
  if (chars > limit) throw new InvalidArgument(`${field} is ${chars} characters, the limit is ${limit}`);
  return text;
}

/** The bytes of a payload, refused as the coordinator would if past `limit`. */
export function limitedBytes(field: string, payload: Payload, limit: number): Uint8Array {
  const bytes = bytesOf(payload);
  if (bytes.length > limit) throw new InvalidArgument(`${field} is ${bytes.length} bytes, the limit is ${limit}`);
  return bytes;
}

/** "sha256:" + hex, the digest every wire field of that name carries. */
export function digestOf(data: Uint8Array): string {
  return `sha256:${createHash("sha256").update(data).digest("hex")}`;
}
