// What the browser test and the screenshot script share: the leasehold
// binary on a store of its own, a store with jobs in every state and a few
// leases (made with the CLI, as an operator would), `leasehold ui` running
// on it, and Debian's chromium driven by playwright-core.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, "..", "..", "..");

/** The binary under test: LEASEHOLD_BIN, else the debug build. */
export const bin = process.env.LEASEHOLD_BIN || join(repo, "target", "debug", "leasehold");

/** The payload whose rendering must stay text. */
export const HOSTILE_PAYLOAD =
  `<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">"quoted" & 'single'`;
export const HOSTILE_QUEUE = `q"<b>'&`;
export const HOSTILE_KEY = `<script>window.__pwned = 3</script>`;
export const HOSTILE_LABEL = `"><img src=x onerror="window.__pwned = 4">`;

/** A fresh store in a temporary directory; `lh(args)` runs the CLI on it. */
export function store() {
  const dir = mkdtempSync(join(tmpdir(), "leasehold-ui-"));
  const url = `sqlite:${join(dir, "ui.db")}`;
  const env = { ...process.env, LEASEHOLD_STORE: url };
  const lh = (args, input) =>
    execFileSync(bin, args, { env, cwd: dir, input, encoding: "utf8" });
  const json = (args, input) => JSON.parse(lh(args, input));
  const lines = (args) =>
    lh(args).split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const children = [];
  const start = (args) => {
    const child = spawn(bin, args, { env, cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
    children.push(child);
    return child;
  };
  const cleanup = () => {
    for (const c of children) c.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  };
  return { dir, url, env, lh, json, lines, start, cleanup };
}

/** Jobs in every state and a few leases. Returns the ids that matter. */
export function seed(s) {
  const push = (queue, ...args) => s.json(["queue", "push", queue, ...args]).id;
  // Done and dead: a worker drains them (payload "ok" succeeds).
  push("emails", "--payload", "ok");
  push("emails", "--payload", "ok");
  const dead = push("emails", "--payload", "fail", "--max-attempts", "1");
  s.lh(["queue", "work", "emails", "--drain", "--", "sh", "-c", 'test "$(cat)" = ok']);
  const cancelled = push("emails", "--payload", "never mind");
  s.lh(["queue", "cancel", String(cancelled)]);
  push("emails", "--payload", "later", "--delay", "1h");
  const hostile = push("emails", "--payload", HOSTILE_PAYLOAD);
  push("emails", "--payload", "to: ops@example.com", "--priority", "5");
  push(HOSTILE_QUEUE, "--payload", "x");
  // Running: a worker holds it (and announces itself).
  const running = push("reports", "--payload", "monthly");
  s.start(["queue", "work", "reports", "--lease", "30s", "--", "sleep", "600"]);
  // Leases: a mutex, a counting lease with two of three taken, a hostile key.
  s.lh(["lock", "acquire", "nightly-etl", "--ttl", "10m", "--label", "etl@box-1"]);
  s.lh(["lock", "acquire", "pool", "--ttl", "10m", "--limit", "3", "--label", "pool-a"]);
  s.lh(["lock", "acquire", "pool", "--ttl", "10m", "--limit", "3", "--label", "pool-b"]);
  s.lh(["lock", "acquire", HOSTILE_KEY, "--ttl", "10m", "--label", HOSTILE_LABEL]);
  return { dead, cancelled, hostile, running };
}

/** Wait until `check()` is truthy (polling), or fail after `ms`. */
export async function until(what, check, ms = 10_000) {
  const end = Date.now() + ms;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** `leasehold ui` on the store; resolves to its base URL once it listens. */
export async function serve(s, extra = []) {
  const ui = s.start(["ui", "--listen", "127.0.0.1:0", ...extra]);
  let err = "";
  ui.stderr.on("data", (d) => (err += d));
  const url = await until("leasehold ui to listen", () => {
    const m = err.match(/at (http:\/\/127\.0\.0\.1:\d+)\//);
    if (!m && ui.exitCode !== null) throw new Error(`leasehold ui exited: ${err}`);
    return m && m[1];
  });
  return url;
}

/** Debian's chromium (no browser download), headless. */
export async function browser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
}
