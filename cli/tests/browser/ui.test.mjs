// `leasehold ui` in a real browser (Debian's chromium, headless): every
// page against what the CLI says the store holds, a dead job retried
// through its button and confirmation, hostile text shown as text, and
// the page refreshing itself without a reload.
//
//   cargo build --bin leasehold && (cd cli/tests/browser && npm ci && npm test)

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  HOSTILE_KEY, HOSTILE_LABEL, HOSTILE_PAYLOAD, HOSTILE_QUEUE,
  browser, seed, serve, store, until,
} from "./harness.mjs";

const STATES = ["ready", "scheduled", "running", "done", "dead", "cancelled"];

let s, ids, base, chrome, page;
const trouble = []; // dialogs (an injected alert) and script errors

before(async () => {
  s = store();
  ids = seed(s);
  await until("the worker to claim the running job", () =>
    s.json(["queue", "get", String(ids.running)]).state === "running");
  base = await serve(s, ["--refresh", "1s"]);
  chrome = await browser();
  page = await chrome.newPage();
  page.on("dialog", (d) => { trouble.push(`dialog: ${d.message()}`); d.dismiss(); });
  page.on("pageerror", (e) => trouble.push(`page error: ${e.message}`));
  page.on("console", (m) => { if (m.type() === "error") trouble.push(`console: ${m.text()}`); });
});

after(async () => {
  await chrome?.close();
  s?.cleanup();
});

/** What injected markup would have set; and what went wrong on the page. */
async function assertClean() {
  assert.equal(await page.evaluate(() => window.__pwned), undefined, "no injected code ran");
  assert.deepEqual(trouble, []);
}

test("the queues page shows every queue's counts as the store has them", async () => {
  await page.goto(`${base}/queues`);
  const queues = s.lines(["queue", "queues"]);
  assert.deepEqual(queues.map((q) => q.queue).sort(), ["emails", "reports", HOSTILE_QUEUE].sort());
  for (const q of queues) {
    const row = page.locator(`tr[data-queue="${q.queue.replace(/["\\]/g, "\\$&")}"]`);
    await row.waitFor();
    assert.equal(await row.locator("th").innerText(), q.queue, "the name, as text");
    for (const state of STATES) {
      const cell = await row.locator(`td[data-state="${state}"]`).innerText();
      assert.equal(cell, String(q[state]), `${q.queue} ${state}`);
    }
  }
  const emails = queues.find((q) => q.queue === "emails");
  assert.deepEqual(STATES.map((st) => emails[st]), [2, 1, 0, 2, 1, 1]);
  const done = page.locator('tr[data-queue="emails"] [data-window-done]');
  assert.equal(await done.innerText(), "2 done", "both finished within the last ten minutes");
  const failed = page.locator('tr[data-queue="emails"] [data-window-failed]');
  assert.equal(await failed.innerText(), "1 failed");
  await assertClean();
});

test("the jobs page lists one state's jobs, hostile payloads as text", async () => {
  await page.goto(`${base}/jobs?queue=emails&state=ready`);
  const listed = s.lines(["queue", "list", "emails", "--state", "ready"]).map((j) => String(j.id));
  const rows = await page.locator("tr[data-job]").evaluateAll((rs) => rs.map((r) => r.dataset.job));
  assert.deepEqual(rows.sort(), listed.sort());
  const preview = page.locator(`tr[data-job="${ids.hostile}"] [data-payload]`);
  assert.equal(await preview.innerText(), HOSTILE_PAYLOAD.slice(0, 64), "the payload's text, escaped");
  assert.equal(await page.locator("main script, main img").count(), 0, "no markup from data");
  await page.locator('[data-tab="dead"]').click();
  await page.waitForURL(/state=dead/);
  const dead = await page.locator("tr[data-job]").evaluateAll((rs) => rs.map((r) => r.dataset.job));
  assert.deepEqual(dead, [String(ids.dead)]);
  // The hostile queue's own page: its name in the selector, as text.
  await page.goto(`${base}/jobs?queue=${encodeURIComponent(HOSTILE_QUEUE)}`);
  assert.equal(await page.locator("select[name=queue] option[selected]").innerText(), HOSTILE_QUEUE);
  assert.equal(await page.locator("tr[data-job]").count(), 1);
  await assertClean();
});

test("a queue is paused and resumed through its buttons and confirmations", async () => {
  const row = () => page.locator('tr[data-queue="reports"]');
  const paused = () => s.json(["queue", "stats", "reports"]).paused;
  await page.goto(`${base}/queues`);
  assert.equal(await row().locator("[data-status]").innerText(), "active");
  await row().getByRole("link", { name: "Pause…" }).click();
  await page.waitForURL(/\/pause\?queue=reports$/);
  assert.equal(paused(), false, "a GET changes nothing");
  await page.locator("button[data-confirm]").click();
  await page.waitForURL(/\/queues\?done=pause$/);
  assert.equal(paused(), true, "the store agrees");
  assert.equal(await row().locator("[data-paused]").innerText(), "paused");
  assert.equal(await row().locator("th").innerText(), "reports", "the name, as text");
  await row().getByRole("link", { name: "Resume…" }).click();
  await page.waitForURL(/\/resume\?queue=reports$/);
  await page.locator("button[data-confirm]").click();
  await page.waitForURL(/\/queues\?done=resume$/);
  assert.equal(paused(), false);
  assert.equal(await row().locator("[data-status]").innerText(), "active");
  await assertClean();
});

test("a job's page shows its claim, and a dead job is retried through its button", async () => {
  await page.goto(`${base}/jobs/${ids.running}`);
  const worker = s.lines(["lock", "list"]).find((l) => l.key.startsWith("leasehold/worker/"));
  assert.equal(await page.locator("[data-worker]").innerText(), worker.holders[0].label);
  assert.match(await page.locator("[data-lease-remaining]").innerText(), /^\d+ s left until /);

  await page.goto(`${base}/jobs/${ids.dead}`);
  assert.equal(await page.locator("h1 [data-state]").innerText(), "dead");
  assert.equal(await page.locator("[data-last-error]").innerText(), "command exited with status 1");
  await page.locator('[data-action="retry"]').click();
  await page.waitForURL(new RegExp(`/jobs/${ids.dead}/retry$`));
  assert.equal(s.json(["queue", "get", String(ids.dead)]).state, "dead", "a GET changes nothing");
  await page.locator("button[data-confirm]").click();
  await page.waitForURL(new RegExp(`/jobs/${ids.dead}\\?done=retry$`));
  assert.equal(await page.locator("h1 [data-state]").innerText(), "ready");
  assert.equal(s.json(["queue", "get", String(ids.dead)]).state, "ready", "the store agrees");
  await assertClean();
});

test("the leases page shows every held key: holders, labels, tokens, n of limit", async () => {
  await page.goto(`${base}/leases`);
  const held = s.lines(["lock", "list"]);
  const keys = await page.locator("tbody[data-key]").evaluateAll((bs) => bs.map((b) => b.dataset.key));
  assert.deepEqual(keys, held.map((l) => l.key));
  for (const l of held) {
    const body = page.locator("tbody[data-key]").nth(keys.indexOf(l.key));
    assert.equal(await body.locator("th code").innerText(), l.key);
    assert.equal(await body.locator("[data-held]").innerText(), `${l.holder_count} of ${l.limit}`);
    const labels = await body.locator("[data-label]").allInnerTexts();
    assert.deepEqual(labels, l.holders.map((h) => h.label ?? "–"));
    const tokens = await body.locator("[data-token]").allInnerTexts();
    assert.deepEqual(tokens, l.holders.map((h) => String(h.token)));
  }
  assert.ok(keys.includes(HOSTILE_KEY));
  const pool = held.find((l) => l.key === "pool");
  assert.equal(`${pool.holder_count} of ${pool.limit}`, "2 of 3");
  assert.ok(held.some((l) => l.holders.some((h) => h.label === HOSTILE_LABEL)));
  await assertClean();
});

test("pages refresh themselves without a reload", async () => {
  await page.goto(`${base}/queues`);
  await page.evaluate(() => { window.__sameDocument = true; });
  const ready = page.locator('tr[data-queue="emails"] td[data-state="ready"]');
  const before = Number(await ready.innerText());
  s.json(["queue", "push", "emails", "--payload", "one more"]);
  await until("the new job to show", async () => Number(await ready.innerText()) === before + 1);
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "no full reload");
  await assertClean();
});
