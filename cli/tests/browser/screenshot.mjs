// Regenerates docs/ui.png: the queues page of a demo store in which
// workers have been busy for a while (two-second intervals, so the
// "finished per interval" bars fill in about 25 seconds).
//
//   bash scripts/screenshot.sh        (builds the binary, then runs this)

import { join } from "node:path";
import { browser, repo, serve, store } from "./harness.mjs";

const INTERVAL_S = 2;
const QUEUES = { emails: 0.05, thumbnails: 0.0, webhooks: 0.25 };

const s = store();
const push = (queue, payload, ...args) => s.json(["queue", "push", queue, "--payload", payload, ...args]);
try {
  // Ten intervals of work: a varying number of jobs per queue, some failing.
  for (let round = 0; round < 10; round++) {
    const started = Date.now();
    for (const [queue, failing] of Object.entries(QUEUES)) {
      const n = 3 + Math.round(8 * Math.abs(Math.sin(round / 2 + queue.length)));
      for (let i = 0; i < n; i++) {
        const fail = Math.random() < failing;
        push(queue, fail ? "fail" : "ok", "--max-attempts", "1");
      }
      s.lh(["queue", "work", queue, "--drain", "--concurrency", "4", "--", "sh", "-c", 'test "$(cat)" = ok']);
    }
    const left = INTERVAL_S * 1000 - (Date.now() - started);
    if (left > 0) await new Promise((r) => setTimeout(r, left));
  }
  // What is waiting now: ready, scheduled, running.
  for (let i = 0; i < 12; i++) push("emails", `to: user${i}@example.com`, "--priority", String(i % 3));
  for (let i = 0; i < 4; i++) push("thumbnails", `img-${i}.png`, "--delay", "10m");
  push("reports", "monthly");
  push("reports", "quarterly", "--delay", "1h");
  s.start(["queue", "work", "reports", "--lease", "30s", "--", "sleep", "600"]);
  await new Promise((r) => setTimeout(r, 1500));
  const base = await serve(s, ["--interval", `${INTERVAL_S}s`, "--refresh", "0s"]);
  const chrome = await browser();
  const page = await chrome.newPage({ viewport: { width: 1180, height: 330 }, deviceScaleFactor: 1 });
  await page.goto(`${base}/queues`);
  const out = join(repo, "docs", "ui.png");
  await page.screenshot({ path: out, fullPage: true });
  await chrome.close();
  console.log(`wrote ${out}`);
} finally {
  s.cleanup();
}
