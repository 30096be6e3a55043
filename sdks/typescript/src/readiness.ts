/**
 * How a WorkerPool says whether it is claiming: a file that exists exactly while it claims, for
 * a probe (`exec: test -f PATH`), as `coordinator worker`'s ready file (sdk/readiness.py). The
 * Helm chart's worker pods get its path in `COORDINATOR_READY_FILE`.
 */
import { renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";

/** A file that exists exactly while the pool claims. */
export class ReadyFile {
  constructor(readonly path: string) {}

  /** Create the file (atomically: a probe never sees it half written) or remove it. */
  set(ready: boolean): void {
    if (!ready) {
      try {
        rmSync(this.path, { force: true });
      } catch (error) {
        console.warn(`coordinator: could not remove the ready file ${this.path}:`, error);
      }
      return;
    }
    const partial = join(dirname(this.path), `.${basename(this.path)}.${process.pid}`);
    writeFileSync(partial, `claiming pid=${process.pid}\n`);
    renameSync(partial, this.path);
  }
}

/** The pool's ready file: `readyFile` if given ("" for none), else `COORDINATOR_READY_FILE`. */
export function readyFileOf(readyFile: string | undefined, env: Readonly<Record<string, string | undefined>>): ReadyFile | undefined {
  const path = readyFile ?? env.COORDINATOR_READY_FILE ?? "";
  return path ? new ReadyFile(path) : undefined;
}
