/**
 * The checked-in generated code (src/gen) is what `npm run generate` makes from protos/ now: a
 * .proto change without regenerating fails here (tests/test_protos_fresh.py does the same for
 * the Python code). And the version the SDK sends is its package's.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";

import { SDK_VERSION } from "../dist/index.js";
import { ROOT } from "./server.js";

const PACKAGE = resolve(ROOT, "sdks/typescript");

function files(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isFile()) {
      const path = join(entry.parentPath, entry.name);
      out.set(path.slice(dir.length), readFileSync(path, "utf8"));
    }
  }
  return out;
}

test("src/gen is what npm run generate makes from protos/", () => {
  const out = mkdtempSync(join(tmpdir(), "gen-"));
  try {
    execFileSync(
      resolve(PACKAGE, "node_modules/.bin/buf"),
      ["generate", resolve(ROOT, "protos"), "--template", "buf.gen.yaml", "-o", out],
      { cwd: PACKAGE, env: { ...process.env, PATH: `${resolve(PACKAGE, "node_modules/.bin")}:${process.env.PATH}` } },
    );
    const fresh = files(join(out, "src/gen"));
    const checkedIn = files(resolve(PACKAGE, "src/gen"));
    assert.deepEqual([...checkedIn.keys()].sort(), [...fresh.keys()].sort());
    for (const [name, text] of fresh) {
      assert.equal(checkedIn.get(name), text, `src/gen${name} is stale: run npm run generate`);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

test("the SDK sends its package's version", () => {
  const pkg = JSON.parse(readFileSync(resolve(PACKAGE, "package.json"), "utf8")) as { version: string };
  assert.equal(SDK_VERSION, pkg.version);
});
