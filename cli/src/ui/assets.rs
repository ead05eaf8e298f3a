//! The dashboard's script and style sheet, served from the binary (no
//! build step). The script only refreshes `<main>` in place: every few
//! seconds it asks the server for the same page's `<main>` (header
//! `X-Leasehold-Fragment`) and swaps it in, unless the tab is hidden,
//! someone is selecting text or typing, or a refresh is still running.
//! A failed refresh marks the page stale and is tried again next time.

pub const JS: &str = r#"// leasehold ui: refresh <main> in place.
(function () {
  "use strict";
  const main = document.getElementById("main");
  const every = main ? Number(main.dataset.refresh || 0) : 0;
  if (!every) return;
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    const selection = window.getSelection();
    if (selection && selection.toString()) return;
    const active = document.activeElement;
    if (active && main.contains(active) && active.matches("input, select, textarea")) return;
    busy = true;
    try {
      const answer = await fetch(location.href, {
        headers: { "X-Leasehold-Fragment": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (!answer.ok) throw new Error(String(answer.status));
      main.innerHTML = await answer.text();
      main.dataset.refreshed = String(Date.now());
      document.body.classList.remove("stale");
    } catch (e) {
      document.body.classList.add("stale");
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, every);
})();
"#;

pub const CSS: &str = r#":root { --fg: #1d2330; --muted: #6b7385; --line: #e3e6ec; --bg: #f7f8fa;
  --accent: #2455c3; --bad: #c0392b; --ok: #2e8b57; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .7em 1.5em; background: #fff; border-bottom: 1px solid var(--line); }
header .brand { font-weight: 700; color: var(--fg); text-decoration: none; }
header nav a { margin-right: 1em; color: var(--muted); text-decoration: none; }
header nav a.on { color: var(--accent); font-weight: 600; }
header .store { margin-left: auto; color: var(--muted); font-family: ui-monospace, monospace; font-size: 12px; }
.badge { background: #fde9c8; color: #7a4b00; border-radius: 3px; padding: 0 .5em; font-size: 12px; }
body.stale header::after { content: "refresh failed"; color: var(--bad); font-size: 12px; }
main { padding: 1em 1.5em 3em; max-width: 1200px; }
h1 { font-size: 20px; margin: .3em 0 .8em; }
h2 { font-size: 16px; margin: 1.5em 0 .5em; }
a { color: var(--accent); }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: .45em .7em; border-bottom: 1px solid var(--line); vertical-align: top; }
thead th { font-size: 12px; text-transform: uppercase; letter-spacing: .03em; color: var(--muted); }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.err, pre.err { color: var(--bad); white-space: pre-wrap; word-break: break-word; margin: 0; }
code, pre { font-family: ui-monospace, monospace; font-size: 12px; }
code.payload { white-space: pre-wrap; word-break: break-all; }
pre.payload { background: #fff; border: 1px solid var(--line); padding: .7em; white-space: pre-wrap; word-break: break-all; max-height: 30em; overflow: auto; }
.size, .rel, .id { color: var(--muted); font-size: 12px; }
.spark { display: inline-flex; align-items: flex-end; gap: 2px; height: 22px; vertical-align: middle; }
.spark b { display: inline-flex; flex-direction: column-reverse; width: 6px; height: 22px; border-bottom: 1px solid var(--line); }
.spark i { display: block; background: var(--ok); }
.spark i.x { background: var(--bad); }
.spark i.h0 { height: 0; } .spark i.h1 { height: 2px; } .spark i.h2 { height: 4px; }
.spark i.h3 { height: 6px; } .spark i.h4 { height: 8px; } .spark i.h5 { height: 10px; } .spark i.h6 { height: 12px; }
.spark i.h7 { height: 14px; } .spark i.h8 { height: 16px; } .spark i.h9 { height: 18px; } .spark i.h10 { height: 20px; }
td.zero a { color: var(--muted); text-decoration: none; }
td[data-state="dead"]:not(.zero) a { color: var(--bad); }
.last { color: var(--muted); font-size: 12px; }
.tabs { margin: .8em 0; display: flex; gap: .3em; flex-wrap: wrap; }
.tabs a { padding: .3em .8em; border: 1px solid var(--line); border-radius: 4px; background: #fff; text-decoration: none; color: var(--fg); }
.tabs a.on { border-color: var(--accent); color: var(--accent); font-weight: 600; }
.tabs .n { color: var(--muted); }
.filter { display: flex; gap: .5em; align-items: center; }
dl.job { display: grid; grid-template-columns: 10em 1fr; gap: .3em 1em; background: #fff; border: 1px solid var(--line); padding: 1em; }
dl.job dt { color: var(--muted); } dl.job dd { margin: 0; }
.state { font-size: 13px; padding: .1em .6em; border-radius: 3px; background: var(--line); vertical-align: middle; }
.state[data-state="dead"] { background: #f7d6d2; color: var(--bad); }
.state[data-state="done"] { background: #d5efe0; color: var(--ok); }
.button, button { display: inline-block; padding: .4em 1em; border: 1px solid var(--accent); border-radius: 4px; background: #fff; color: var(--accent); text-decoration: none; cursor: pointer; font: inherit; }
.danger { border-color: var(--bad); color: var(--bad); }
.notice { background: #e6f0ff; border: 1px solid #b9cff5; padding: .5em .8em; border-radius: 4px; }
.error { color: var(--bad); }
.empty { color: var(--muted); }
.pages { margin-top: 1em; }
.label { font-weight: 600; }
form.confirm { margin-top: 1em; display: flex; gap: .8em; align-items: center; flex-wrap: wrap; }
"#;

/// A small mark for the browser's tab.
pub const ICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#2455c3"/><path d="M5 3v10h6" stroke="#fff" stroke-width="2" fill="none"/></svg>"##;
