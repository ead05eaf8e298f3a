//! The pages, rendered on the server from what [`super::read`] returned
//! (the store transaction is over by then). Everything from the store
//! goes through [`Html::text`] or [`Html::attr`]; rows and cells carry
//! `data-` attributes (queue, job, key, state) for scripts and tests.

use super::frame::notice;
use super::html::{bytes, duration, Href, Html};
use super::read::{JobView, JobsView, LeasesView, Overview};
use super::Ui;
use crate::out::Times;
use leasehold::core::{JobCursor, JobPeek, QueueSummary};
use leasehold::{JobRecord, JobState};

/// A store that keeps leases only says so, and points to them.
fn leases_only(h: &mut Html, why: Option<&str>) -> bool {
    let Some(why) = why else { return false };
    h.raw("<p class=\"empty\" data-leases-only>")
        .text(why)
        .raw(". Its leases: ");
    h.link(&Href::new("/leases"), "Leases").raw("</p>");
    true
}

fn count_text(s: &QueueSummary, state: JobState) -> String {
    let n = s.counts.get(state);
    if s.is_capped(state) {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

fn jobs_href(queue: &str, state: JobState) -> Href {
    Href::new("/jobs")
        .param("queue", queue)
        .param("state", state.as_str())
}

/// The queues page's content.
pub fn queues(h: &mut Html, ui: &Ui, view: &Overview) {
    h.raw("<h1>Queues</h1>");
    if leases_only(h, view.leases_only.as_deref()) {
        return;
    }
    if view.queues.is_empty() {
        h.raw("<p class=\"empty\">No queues yet. Push a job: <code>leasehold queue push QUEUE --payload TEXT</code></p>");
        return;
    }
    h.raw("<table class=\"queues\"><thead><tr><th>Queue</th><th>Status</th>");
    for state in JobState::ALL {
        h.raw("<th class=\"num\">")
            .text(state.as_str())
            .raw("</th>");
    }
    let per = duration(ui.reader.summary.bucket_ms);
    h.raw("<th class=\"num\">Oldest ready</th><th>Finished per ")
        .text(&per)
        .raw(" (last ")
        .text(&duration(
            ui.reader.summary.bucket_ms * ui.reader.summary.buckets as u64,
        ))
        .raw(")</th>");
    if !ui.read_only {
        h.raw("<th></th>");
    }
    h.raw("</tr></thead><tbody>");
    for (name, s) in &view.queues {
        queue_row(h, ui, name, s);
    }
    h.raw("</tbody></table>");
    if let Some(next) = &view.next {
        h.raw("<p class=\"pages\">")
            .link(&Href::new("/queues").param("after", next), "Next queues →")
            .raw("</p>");
    }
}

fn queue_row(h: &mut Html, ui: &Ui, name: &str, s: &QueueSummary) {
    h.raw("<tr")
        .attr("data-queue", name)
        .raw("><th scope=\"row\">");
    h.link(&jobs_href(name, JobState::Ready), name).raw("</th>");
    // Whether workers start its jobs (F2).
    h.raw("<td data-status>");
    if s.paused {
        h.raw("<span class=\"badge\" data-paused>paused</span>");
    } else {
        h.raw("active");
    }
    // Its concurrency and rate limits (F1, F4), where set.
    let limits = [
        s.limits.concurrency.map(|n| format!("at most {n} running")),
        s.limits.per_key.map(|n| format!("{n} per key")),
        s.limits.rate.map(|r| format!("{r} started")),
        s.limits
            .per_key_rate
            .map(|r| format!("{r} per key started")),
    ];
    let limits: Vec<String> = limits.into_iter().flatten().collect();
    if !limits.is_empty() {
        h.raw("<br><span class=\"limits\" data-limits>")
            .text(&limits.join(", "))
            .raw("</span>");
    }
    h.raw("</td>");
    for state in JobState::ALL {
        let zero = s.counts.get(state) == 0;
        h.raw(if zero {
            "<td class=\"num zero\""
        } else {
            "<td class=\"num\""
        });
        h.attr("data-state", state.as_str()).raw(">");
        h.link(&jobs_href(name, state), &count_text(s, state))
            .raw("</td>");
    }
    let wait = s.oldest_ready_wait_ms().map_or("–".to_owned(), duration);
    h.raw("<td class=\"num\" data-oldest-ready>")
        .text(&wait)
        .raw("</td><td>");
    throughput(h, s);
    h.raw("</td>");
    if !ui.read_only {
        let (path, verb) = if s.paused {
            ("/resume", "Resume…")
        } else {
            ("/pause", "Pause…")
        };
        h.raw("<td>")
            .link(&Href::new(path).param("queue", name), verb)
            .raw(" ")
            .link(&Href::new("/purge").param("queue", name), "Purge…")
            .raw("</td>");
    }
    h.raw("</tr>");
}

/// One bar per interval, done below failed (dead), each segment's height
/// quantized to a class (the style sheet allows no inline style), then
/// the window's totals.
fn throughput(h: &mut Html, s: &QueueSummary) {
    let done = |c: &leasehold::StateCounts| c.get(JobState::Done) + c.get(JobState::Cancelled);
    let failed = |c: &leasehold::StateCounts| c.get(JobState::Dead);
    let peak = s
        .finished
        .iter()
        .map(|c| done(c) + failed(c))
        .max()
        .unwrap_or(0)
        .max(1);
    let level = |n: u64| (n * 10).div_ceil(peak).min(10);
    let t = Times::new(s.now_ms);
    h.raw("<span class=\"spark\">");
    for (i, c) in s.finished.iter().enumerate() {
        let from_ms = s.from_ms + s.bucket_ms * i as u64;
        let counts: Vec<String> = JobState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(|s| format!("{} {s}", c.get(s)))
            .collect();
        let title = format!("from {}: {}", t.at(from_ms), counts.join(", "));
        h.raw("<b").attr("title", &title).raw("><i");
        h.attr("class", &format!("h{}", level(done(c))))
            .raw("></i><i");
        h.attr("class", &format!("x h{}", level(failed(c))))
            .raw("></i></b>");
    }
    let total = |state| s.finished.iter().map(|c| c.get(state)).sum::<u64>();
    h.raw("</span> <span class=\"last\"><span data-window-done>")
        .show(total(JobState::Done))
        .raw(" done</span> · <span data-window-failed>")
        .show(total(JobState::Dead))
        .raw(" failed</span></span>");
}

/// The jobs page's content.
pub fn jobs(h: &mut Html, view: &JobsView, after: Option<JobCursor>) {
    h.raw("<h1>Jobs</h1>");
    if leases_only(h, view.leases_only.as_deref()) {
        return;
    }
    let Some(queue) = &view.queue else {
        h.raw("<p class=\"empty\">No queues yet.</p>");
        return;
    };
    h.raw("<form class=\"filter\" method=\"get\" action=\"/jobs\"><label>Queue <select name=\"queue\">");
    for name in &view.queues {
        h.raw("<option").attr("value", name);
        if name == queue {
            h.raw(" selected");
        }
        h.raw(">").text(name).raw("</option>");
    }
    h.raw("</select></label><input type=\"hidden\" name=\"state\"")
        .attr("value", view.state.as_str())
        .raw("><button>Show</button></form><nav class=\"tabs\">");
    for state in JobState::ALL {
        h.raw("<a")
            .attr("href", &jobs_href(queue, state).0)
            .attr("data-tab", state.as_str());
        if state == view.state {
            h.raw(" class=\"on\"");
        }
        h.raw(">").text(state.as_str());
        if let Some(s) = &view.summary {
            h.raw(" <span class=\"n\">")
                .text(&count_text(s, state))
                .raw("</span>");
        }
        h.raw("</a>");
    }
    h.raw("</nav>");
    jobs_table(h, view);
    h.raw("<p class=\"pages\">");
    if after.is_some() {
        h.link(&jobs_href(queue, view.state), "← First page")
            .raw(" ");
    }
    if let Some(next) = view.next {
        let href = jobs_href(queue, view.state).param("after", &next.to_string());
        h.link(&href, "Next page →");
    }
    h.raw("</p>");
}

fn jobs_table(h: &mut Html, view: &JobsView) {
    if view.jobs.is_empty() {
        h.raw("<p class=\"empty\">No ")
            .text(view.state.as_str())
            .raw(" jobs.</p>");
        return;
    }
    let when = match view.state {
        JobState::Ready | JobState::Scheduled => "Run at",
        JobState::Running => "Lease until",
        JobState::Waiting => "Pushed",
        _ => "Finished",
    };
    h.raw("<table class=\"jobs\"><thead><tr><th>Job</th><th class=\"num\">Priority</th>")
        .raw("<th class=\"num\">Attempts</th><th>")
        .text(when)
        .raw("</th><th>Payload</th><th>")
        .text(match view.state {
            JobState::Running => "Progress / last error",
            _ => "Last error",
        })
        .raw("</th></tr></thead><tbody>");
    let t = Times::new(view.now_ms);
    for peek in &view.jobs {
        let j = &peek.job;
        h.raw("<tr")
            .attr("data-job", &j.id.to_string())
            .raw("><td>");
        h.link(&Href::path("/jobs/", j.id, ""), &j.id.to_string())
            .raw("</td>");
        h.cell("<td class=\"num\">", "</td>", &j.priority.to_string());
        h.cell(
            "<td class=\"num\">",
            "</td>",
            &format!("{} of {}", j.attempts, j.max_attempts),
        );
        // A waiting job is listed by id: show when it was pushed.
        let at = match j.state {
            JobState::Waiting => j.created_at_ms,
            _ => JobCursor::of(j).at_ms,
        };
        h.raw("<td>");
        instant(h, &t, at);
        h.raw("</td><td>");
        payload(h, peek, false);
        h.raw("</td>");
        match (&j.progress, view.state) {
            (Some(p), JobState::Running) => {
                h.cell("<td data-progress>", "</td>", &p.to_string());
            }
            _ => {
                h.cell(
                    "<td class=\"err\">",
                    "</td>",
                    j.last_error.as_deref().unwrap_or(""),
                );
            }
        }
        h.raw("</tr>");
    }
    h.raw("</tbody></table>");
}

/// A store instant as wall-clock time, with how far from now.
fn instant(h: &mut Html, t: &Times, at_ms: u64) {
    let rel = if at_ms >= t.now_ms {
        format!("in {}", duration(at_ms - t.now_ms))
    } else {
        format!("{} ago", duration(t.now_ms - at_ms))
    };
    wall(h, t, at_ms);
    h.raw(" <span class=\"rel\">").text(&rel).raw("</span>");
}

/// A store instant as wall-clock time.
fn wall(h: &mut Html, t: &Times, at_ms: u64) {
    let wall = t.at(at_ms);
    h.raw("<time").attr("datetime", &wall).raw(">");
    h.text(&wall.replace('T', " ")).raw("</time>");
}

/// Time left until `at_ms`, and when that is.
fn remaining(h: &mut Html, t: &Times, at_ms: u64) {
    h.text(&duration(t.until(at_ms)))
        .raw(" left <span class=\"rel\">until ");
    wall(h, t, at_ms);
    h.raw("</span>");
}

/// A payload preview as text (escaped) or base64, with its size.
fn payload(h: &mut Html, peek: &JobPeek, block: bool) {
    let v = crate::out::peek_json(peek, &Times::new(0));
    let encoding = v["payload_encoding"].as_str().unwrap_or("");
    let text = v["payload_preview"].as_str().unwrap_or("");
    let cut = (peek.job.payload.len() as u64) < peek.payload_bytes;
    let (open, close) = if block {
        ("<pre class=\"payload\" data-payload>", "</pre>")
    } else {
        ("<code class=\"payload\" data-payload>", "</code>")
    };
    h.raw(open)
        .text(text)
        .raw(close)
        .raw(" <span class=\"size\">");
    h.text(&bytes(peek.payload_bytes));
    h.raw(if encoding == "base64" {
        ", base64"
    } else {
        ", text"
    });
    if cut {
        h.raw(", first ")
            .text(&bytes(peek.job.payload.len() as u64))
            .raw(" shown");
    }
    h.raw("</span>");
}

/// The job page's content.
pub fn job(h: &mut Html, ui: &Ui, view: &JobView, done: Option<&str>) {
    let j = &view.peek.job;
    let t = Times::new(view.now_ms);
    h.raw("<h1>Job ")
        .show(j.id)
        .raw(" <span class=\"state\" data-state=\"");
    h.text(j.state.as_str())
        .raw("\">")
        .text(j.state.as_str())
        .raw("</span></h1>");
    notice(h, done, None);
    h.raw("<dl class=\"job\"><dt>Queue</dt><dd>");
    h.link(&jobs_href(&j.queue, j.state), &j.queue).raw("</dd>");
    let concurrency_key = match (&j.key, j.parked) {
        (Some(key), true) => format!("{key} (waiting: its key is at the queue's per-key limit)"),
        (Some(key), false) => key.to_string(),
        (None, _) => "–".to_owned(),
    };
    let fields: [(&'static str, String); 5] = [
        ("Priority", j.priority.to_string()),
        ("Attempts", format!("{} of {}", j.attempts, j.max_attempts)),
        ("Expired claims", j.expiries.to_string()),
        (
            "Unique key",
            j.unique_key.as_deref().unwrap_or("–").to_owned(),
        ),
        ("Concurrency key", concurrency_key),
    ];
    for (name, value) in fields {
        h.raw("<dt>")
            .text(name)
            .raw("</dt><dd>")
            .text(&value)
            .raw("</dd>");
    }
    let times = [
        ("Created", Some(j.created_at_ms)),
        ("Run at", Some(j.run_at_ms)),
        ("Finished", j.finished_at_ms),
    ];
    for (name, at) in times {
        h.raw("<dt>").text(name).raw("</dt><dd>");
        match at {
            Some(at) => instant(h, &t, at),
            None => {
                h.raw("–");
            }
        }
        h.raw("</dd>");
    }
    if let Some(after) = &j.after {
        h.raw("<dt>Runs after</dt><dd data-after>");
        for (i, id) in after.iter().enumerate() {
            if i > 0 {
                h.raw(", ");
            }
            h.link(&Href::path("/jobs/", *id, ""), &id.to_string());
        }
        let how = match j.after_any {
            true => " (once they all ended, however)",
            false => " (once they are all done)",
        };
        h.text(how);
        if j.state == JobState::Waiting {
            h.raw(" <span class=\"waiting\">waiting for ")
                .text(&j.waiting_on.to_string())
                .raw("</span>");
        }
        h.raw("</dd>");
    }
    if let Some(p) = &j.progress {
        h.raw("<dt>Progress</dt><dd data-progress><progress max=\"10000\" value=\"")
            .text(&p.permyriad.to_string())
            .raw("\"></progress> ")
            .text(&p.to_string())
            .raw("</dd>");
    }
    if j.cancel_requested {
        h.raw("<dt>Cancel</dt><dd>requested: the worker stops at its next heartbeat</dd>");
    }
    h.raw("<dt>Last error</dt><dd><pre class=\"err\" data-last-error>")
        .text(j.last_error.as_deref().unwrap_or(""))
        .raw("</pre></dd></dl>");
    claim(h, j, view.worker.as_deref(), &t);
    h.raw("<h2>Payload</h2>");
    payload(h, &view.peek, true);
    if !ui.read_only {
        job_actions(h, j);
    }
}

fn claim(h: &mut Html, j: &JobRecord, worker: Option<&str>, t: &Times) {
    let Some(c) = j.claim else { return };
    h.raw("<h2>Current claim</h2><dl class=\"job claim\"><dt>Worker</dt><dd data-worker>");
    match worker {
        Some(label) => h.text(label),
        None => h.raw("<span class=\"rel\">no label (the worker did not announce itself)</span>"),
    };
    h.raw("</dd><dt>Holder</dt><dd><code>")
        .show(c.holder)
        .raw("</code></dd>");
    h.raw("<dt>Token</dt><dd>")
        .show(c.token)
        .raw("</dd><dt>Lease</dt><dd data-lease-remaining>");
    remaining(h, t, c.lease_until_ms);
    h.raw("</dd></dl>");
}

fn job_actions(h: &mut Html, j: &JobRecord) {
    let retry = j.state.is_retryable();
    let cancel = !j.state.is_terminal() && !j.cancel_requested;
    if !(retry || cancel) {
        return;
    }
    h.raw("<p class=\"actions\">");
    if retry {
        h.raw("<a class=\"button\" data-action=\"retry\"")
            .attr("href", &Href::path("/jobs/", j.id, "/retry").0)
            .raw(">Retry…</a> ");
    }
    if cancel {
        h.raw("<a class=\"button danger\" data-action=\"cancel\"")
            .attr("href", &Href::path("/jobs/", j.id, "/cancel").0)
            .raw(">Cancel…</a>");
    }
    h.raw("</p>");
}

/// The leases page's content.
pub fn leases(h: &mut Html, view: &LeasesView, after: &str) {
    h.raw("<h1>Leases</h1>");
    let t = Times::new(view.now_ms);
    if view.page.leases.is_empty() {
        h.raw("<p class=\"empty\">No held keys here.</p>");
    } else {
        h.raw("<table class=\"leases\"><thead><tr><th>Key</th><th class=\"num\">Held</th>")
            .raw("<th>Holder</th><th class=\"num\">Token</th><th>Time left</th></tr></thead>");
        for (key, info) in &view.page.leases {
            h.raw("<tbody").attr("data-key", key).raw(">");
            for (i, holder) in info.holders.iter().enumerate() {
                h.raw("<tr>");
                if i == 0 {
                    let rows = info.holders.len().to_string();
                    h.raw("<th scope=\"row\"")
                        .attr("rowspan", &rows)
                        .raw("><code>")
                        .text(key);
                    h.raw("</code></th><td class=\"num\" data-held")
                        .attr("rowspan", &rows)
                        .raw(">");
                    h.text(&format!("{} of {}", info.holders.len(), info.limit.max(1)))
                        .raw("</td>");
                }
                h.raw("<td><span class=\"label\" data-label>")
                    .text(holder.holder.label.as_deref().unwrap_or("–"))
                    .raw("</span><br><code class=\"id\">")
                    .show(holder.holder.id)
                    .raw("</code></td><td class=\"num\" data-token>")
                    .show(holder.token)
                    .raw("</td><td data-remaining>");
                remaining(h, &t, holder.expires_at_ms);
                h.raw("</td></tr>");
            }
            h.raw("</tbody>");
        }
        h.raw("</table>");
    }
    h.raw("<p class=\"pages\">");
    if !after.is_empty() {
        h.link(&Href::new("/leases"), "← First page").raw(" ");
    }
    if let Some(next) = &view.page.next {
        h.link(&Href::new("/leases").param("after", next), "Next page →");
    }
    h.raw("</p>");
}
