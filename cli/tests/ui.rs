//! `leasehold ui` over real HTTP: the JSON API and the pages against what
//! the store holds, and the safety rules (the token off loopback, host
//! names on loopback, CSRF, read-only, POST-only actions, escaping of
//! hostile payloads, keys, labels, queue names and error texts). The
//! same dashboard in a real browser: `tests/browser`.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // real processes, sockets, time

use leasehold::core::{self};
use leasehold::{HolderId, JobId, JobSpec, QueuePolicy, SqliteStore, StoreExt};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};

#[path = "support/cli.rs"]
mod cli;
use cli::{code, Dir};

/// A running `leasehold ui`, stopped when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(d: &Dir, args: &[&str]) -> Server {
        let mut all = vec!["ui", "--listen", "127.0.0.1:0"];
        all.extend(args);
        Server::spawn(d.cmd(), &all)
    }

    /// Run `cmd` with `args`; the address from its first line on stderr.
    fn spawn(mut cmd: std::process::Command, args: &[&str]) -> Server {
        let mut child = cmd
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Server { child, addr }
    }

    fn get(&self, path: &str) -> Answer {
        self.ask("GET", path, &[], "")
    }

    /// One request on its own connection; the whole answer.
    fn ask(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
            head += &format!("Host: {}\r\n", self.addr);
        }
        for (name, value) in headers {
            head += &format!("{name}: {value}\r\n");
        }
        if method == "POST" {
            head += "Content-Type: application/x-www-form-urlencoded\r\n";
        }
        head += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
        s.write_all(head.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        Answer::parse(&String::from_utf8_lossy(&raw))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        cli::signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn parse(raw: &str) -> Answer {
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
        let mut lines = head.lines();
        let status = lines.next().unwrap_or("").split(' ').nth(1).unwrap_or("0");
        let headers = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
            .collect();
        Answer {
            status: status.parse().unwrap_or(0),
            headers,
            body: dechunk(body),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.body);
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// A chunked body's content (axum chunks bodies of unknown length).
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((size, after)) = rest.split_once("\r\n") else {
            return body.to_owned();
        };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            return body.to_owned();
        };
        if n == 0 {
            return out;
        }
        out += &after[..n.min(after.len())];
        rest = after.get(n + 2..).unwrap_or("");
    }
}

const HOSTILE: &str = "<script>alert(\"x\")</script><img src=x onerror='y'>&amp;";

/// A store with a ready, a dead (hostile error text) and a done job in a
/// hostile queue, one in "plain", and a hostile key with a hostile label.
/// Returns (dead job, done job).
fn seed(d: &Dir) -> (JobId, JobId) {
    let store = SqliteStore::open(d.0.join("test.db")).unwrap();
    let policy = QueuePolicy::default();
    let push = |queue: &str, spec: JobSpec| {
        store
            .txn(|tx| core::job::enqueue(tx, queue, &spec, &policy))
            .unwrap()
            .id
    };
    let one_try = JobSpec {
        max_attempts: 1,
        ..JobSpec::new(HOSTILE)
    };
    let dead = push(HOSTILE, one_try.clone());
    let done = push(HOSTILE, one_try);
    push(HOSTILE, JobSpec::new(HOSTILE));
    push("plain", JobSpec::new(vec![0xff, 0xfe, 0x00]));
    let me = HolderId(7);
    let claimed = store
        .txn(|tx| core::job::claim(tx, HOSTILE, me, 60_000, 2, &policy))
        .unwrap();
    let token = |id: JobId| claimed.iter().find(|j| j.id == id).unwrap().last_token;
    store
        .txn(|tx| core::job::fail(tx, dead, me, token(dead), HOSTILE, &policy))
        .unwrap();
    let progress = core::job::Progress::new(0.5, HOSTILE).unwrap();
    store
        .txn(|tx| {
            core::job::record_progress(tx.jobs()?, me, &[(done, token(done), progress.clone())])?;
            core::job::complete(tx, done, me, token(done))
        })
        .unwrap();
    d.json(&[
        "lock", "acquire", HOSTILE, "--ttl", "10m", "--label", HOSTILE,
    ]);
    (dead, done)
}

/// Waiting jobs have their own list (when each was pushed) and count,
/// and a job page links what it runs after.
#[test]
fn waiting_jobs_are_listed_counted_and_linked() {
    let d = Dir::new("ui-waiting");
    let store = SqliteStore::open(d.0.join("test.db")).unwrap();
    let policy = QueuePolicy::default();
    let push = |spec: JobSpec| {
        store
            .txn(|tx| core::job::enqueue(tx, "deps", &spec, &policy))
            .unwrap()
            .id
    };
    let parent = push(JobSpec::new("parent"));
    let child = push(JobSpec {
        after: vec![parent],
        ..JobSpec::new("child")
    });
    let ui = Server::start(&d, &[]);
    let list = ui.get("/jobs?queue=deps&state=waiting").body;
    assert!(
        list.contains(&format!("data-job=\"{}\"", child.0)),
        "{list}"
    );
    assert!(list.contains("<th>Pushed</th>"), "{list}");
    assert!(
        !list.contains("1970"),
        "a waiting job's instant is its push: {list}"
    );
    let page = ui.get(&format!("/jobs/{}", child.0)).body;
    assert!(page.contains("<dd data-after>"), "{page}");
    assert!(page.contains(&format!("/jobs/{}", parent.0)), "{page}");
    assert!(page.contains("waiting for 1"), "{page}");
    let api = ui.get("/api/queues").json();
    assert_eq!(api["queues"][0]["waiting"], 1, "{api}");
}

/// The hostile text never comes back as markup, on any page.
#[test]
fn hostile_text_is_escaped_everywhere() {
    let d = Dir::new("ui-escape");
    let (dead, done) = seed(&d);
    let ui = Server::start(&d, &[]);
    let q =
        "%3Cscript%3Ealert(%22x%22)%3C%2Fscript%3E%3Cimg%20src%3Dx%20onerror%3D%27y%27%3E%26amp%3B";
    let pages = [
        "/queues".to_owned(),
        format!("/jobs/{}", done.0),
        format!("/jobs?queue={q}&state=ready"),
        format!("/jobs?queue={q}&state=dead"),
        format!("/jobs/{}", dead.0),
        format!("/jobs/{}/retry", dead.0),
        format!("/purge?queue={q}"),
        "/leases".to_owned(),
    ];
    let escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=&#39;y&#39;&gt;&amp;amp;";
    for path in &pages {
        let page = ui.get(path);
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(
            !page.body.contains("<script>alert"),
            "{path}: {}",
            page.body
        );
        assert!(!page.body.contains("<img src=x"), "{path}: {}", page.body);
        assert!(
            page.body.contains(escaped),
            "{path} shows the text: {}",
            page.body
        );
    }
    let page = ui.get(&format!("/jobs/{}", done.0)).body;
    assert!(
        page.contains(
            "<dd data-progress><progress max=\"10000\" value=\"5000\"></progress> 50% &lt;script"
        ),
        "the job page shows its progress: {page}"
    );
    let csp = ui.get("/queues");
    let csp = csp.header("content-security-policy").unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    // A binary payload is shown as base64.
    let plain = ui.get("/jobs?queue=plain&state=ready");
    assert!(
        plain.body.contains("//4A") && plain.body.contains("base64"),
        "{}",
        plain.body
    );
}

#[test]
fn the_api_answers_what_the_store_holds() {
    let d = Dir::new("ui-api");
    let (dead, done) = seed(&d);
    let ui = Server::start(&d, &[]);
    let api = ui.get("/api/queues").json();
    let cli_queues = d.lines(&["queue", "queues"]);
    for (api, cli) in api["queues"].as_array().unwrap().iter().zip(&cli_queues) {
        for field in [
            "queue",
            "ready",
            "scheduled",
            "running",
            "done",
            "dead",
            "cancelled",
        ] {
            assert_eq!(api[field], cli[field], "{field}");
        }
    }
    assert_eq!(api["queues"].as_array().unwrap().len(), cli_queues.len());
    let q =
        "%3Cscript%3Ealert(%22x%22)%3C%2Fscript%3E%3Cimg%20src%3Dx%20onerror%3D%27y%27%3E%26amp%3B";
    let jobs = ui.get(&format!("/api/jobs?queue={q}&state=dead")).json();
    assert_eq!(jobs["jobs"][0]["id"].as_u64(), Some(dead.0));
    assert_eq!(jobs["jobs"][0]["last_error"].as_str(), Some(HOSTILE));
    assert_eq!(jobs["next"], Value::Null);
    let job = ui.get(&format!("/api/jobs/{}", done.0)).json();
    assert_eq!(
        (job["state"].as_str(), job["payload_preview"].as_str()),
        (Some("done"), Some(HOSTILE))
    );
    assert_eq!(
        (
            job["progress"]["fraction"].as_f64(),
            job["progress"]["message"].as_str()
        ),
        (Some(0.5), Some(HOSTILE)),
        "kept with the job once done"
    );
    let leases = ui.get("/api/leases").json();
    let cli_leases = d.lines(&["lock", "list"]);
    assert_eq!(leases["leases"].as_array().unwrap().len(), cli_leases.len());
    assert_eq!(
        leases["leases"][0]["holders"][0]["label"].as_str(),
        Some(HOSTILE)
    );
    // Bad input: a typed answer naming the cause, never a crash.
    let bad = ui.get("/api/jobs?queue=plain&state=sleeping");
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("sleeping"), "{}", bad.body);
    assert_eq!(ui.get("/api/jobs/999999").status, 404);
    assert_eq!(ui.get("/api/jobs?queue=plain&after=x.y").status, 400);
    // Metrics: the library's, and the queues' gauges.
    let metrics = ui.get("/metrics");
    assert!(
        metrics
            .body
            .contains("leasehold_queue_jobs{queue=\"plain\",state=\"ready\"} 1"),
        "{}",
        metrics.body
    );
    // A refresh gets <main>'s content alone.
    let fragment = ui.ask("GET", "/queues", &[("X-Leasehold-Fragment", "1")], "");
    assert!(
        fragment.body.starts_with("<h1>Queues</h1>"),
        "{}",
        fragment.body
    );
}

/// The CSRF token of a confirmation form.
fn csrf_of(page: &Answer) -> String {
    let at = page
        .body
        .find("name=\"csrf\" value=\"")
        .expect("a CSRF field")
        + 19;
    page.body[at..].split('"').next().unwrap().to_owned()
}

#[test]
fn actions_need_a_post_with_the_csrf_token() {
    let d = Dir::new("ui-csrf");
    let (dead, _) = seed(&d);
    let ui = Server::start(&d, &[]);
    let id = dead.0.to_string();
    let state = || d.json(&["queue", "get", &id])["state"].clone();
    let path = format!("/jobs/{id}/retry");
    let confirm = ui.get(&path);
    assert_eq!(
        (confirm.status, state()),
        (200, Value::from("dead")),
        "a GET changes nothing"
    );
    for body in ["", "csrf=", "csrf=0000"] {
        let refused = ui.ask("POST", &path, &[], body);
        assert_eq!(refused.status, 403, "{body:?}: {}", refused.body);
        assert_eq!(state(), "dead");
    }
    let body = format!("csrf={}", csrf_of(&confirm));
    let done = ui.ask("POST", &path, &[], &body);
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(
        done.header("location"),
        Some(format!("/jobs/{id}?done=retry").as_str())
    );
    assert_eq!(state(), "ready");
    // Cancel, then purge what finished (0s: all of it).
    let cancel = ui.ask("POST", &format!("/jobs/{id}/cancel"), &[], &body);
    assert_eq!((cancel.status, state()), (303, Value::from("cancelled")));
    let purge_body = format!("{body}&queue=plain&older_than=0s");
    assert_eq!(ui.ask("POST", "/purge", &[], &purge_body).status, 303);
    let bad = ui.ask(
        "POST",
        "/purge",
        &[],
        &format!("{body}&queue=plain&older_than=soon"),
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(
        ui.ask("POST", "/queues", &[], &body).status,
        405,
        "pages are GET only"
    );
    assert_eq!(ui.ask("GET", "/jobs/1/explode", &[], "").status, 404);
}

#[test]
fn limits_and_concurrency_keys_are_shown() {
    let d = Dir::new("ui-limits");
    d.json(&[
        "queue",
        "limit",
        "set",
        "exports",
        "--concurrency",
        "3",
        "--per-key",
        "1",
        "--per-key-rate",
        "1/10s",
    ]);
    d.json(&["queue", "limit", "set", "plain", "--rate", "100/1m"]);
    let a = d.json(&[
        "queue",
        "push",
        "exports",
        "--payload",
        "a",
        "--key",
        "acme",
    ]);
    d.json(&[
        "queue",
        "push",
        "exports",
        "--payload",
        "b",
        "--key",
        "acme",
    ]);
    d.json(&["queue", "push", "plain", "--payload", "p"]);
    let ui = Server::start(&d, &[]);
    let page = ui.get("/queues");
    assert!(
        page.body
            .contains("at most 3 running, 1 per key, 1/10s per key started"),
        "{}",
        page.body
    );
    assert!(page.body.contains("100/1m started"), "{}", page.body);
    assert_eq!(
        page.body.matches("data-limits").count(),
        2,
        "exports and plain are limited"
    );
    let api = ui.get("/api/queues");
    assert!(api.body.contains("\"concurrency\":3"), "{}", api.body);
    assert!(api.body.contains("\"per_key\":1"), "{}", api.body);
    assert!(
        api.body.contains("\"per_key_rate\":\"1/10s\""),
        "{}",
        api.body
    );
    assert!(api.body.contains("\"rate\":\"100/1m\""), "{}", api.body);
    let job = ui.get(&format!("/jobs/{}", a["id"]));
    assert!(job.body.contains("Concurrency key"), "{}", job.body);
    assert!(job.body.contains("acme"), "{}", job.body);
}

#[test]
fn pause_and_resume_are_confirmed_posts_with_the_csrf_token() {
    let d = Dir::new("ui-pause");
    seed(&d);
    let ui = Server::start(&d, &[]);
    let paused = || d.json(&["queue", "stats", "plain"])["paused"].clone();
    let queues = ui.get("/queues");
    assert!(
        queues.body.contains("/pause?queue=plain"),
        "{}",
        queues.body
    );
    let confirm = ui.get("/pause?queue=plain");
    assert_eq!(
        (confirm.status, paused()),
        (200, Value::from(false)),
        "a GET changes nothing"
    );
    assert!(confirm.body.contains("Pause plain"), "{}", confirm.body);
    for body in ["queue=plain", "csrf=0000&queue=plain"] {
        let refused = ui.ask("POST", "/pause", &[], body);
        assert_eq!(refused.status, 403, "{body:?}: {}", refused.body);
        assert_eq!(paused(), false);
    }
    let body = format!("csrf={}&queue=plain", csrf_of(&confirm));
    let done = ui.ask("POST", "/pause", &[], &body);
    assert_eq!(done.status, 303, "{}", done.body);
    assert_eq!(done.header("location"), Some("/queues?done=pause"));
    assert_eq!(paused(), true);
    let page = ui.get("/queues?done=pause");
    assert!(page.body.contains("data-paused"), "{}", page.body);
    assert!(page.body.contains("/resume?queue=plain"), "{}", page.body);
    let api = ui.get("/api/queues");
    assert!(api.body.contains("\"paused\":true"), "{}", api.body);
    let resume = ui.get("/resume?queue=plain");
    assert!(resume.body.contains("Resume plain"), "{}", resume.body);
    let body = format!("csrf={}&queue=plain", csrf_of(&resume));
    assert_eq!(ui.ask("POST", "/resume", &[], &body).status, 303);
    assert_eq!(paused(), false);
    assert_eq!(
        ui.ask("POST", "/pause", &[], &format!("csrf={}", csrf_of(&resume)))
            .status,
        400,
        "no queue named"
    );
}

#[test]
fn read_only_shows_no_actions_and_refuses_them() {
    let d = Dir::new("ui-ro");
    let (dead, _) = seed(&d);
    let ui = Server::start(&d, &["--read-only"]);
    let page = ui.get(&format!("/jobs/{}", dead.0));
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("data-action"), "{}", page.body);
    assert!(!ui.get("/queues").body.contains("/purge"));
    assert!(!ui.get("/queues").body.contains("/pause"));
    assert_eq!(
        ui.ask("POST", "/pause", &[], "csrf=x&queue=plain").status,
        403
    );
    let path = format!("/jobs/{}/retry", dead.0);
    assert_eq!(ui.get(&path).status, 403);
    assert_eq!(ui.ask("POST", &path, &[], "csrf=x").status, 403);
    assert_eq!(
        ui.ask("POST", "/purge", &[], "queue=plain&older_than=0s")
            .status,
        403
    );
    assert_eq!(
        d.json(&["queue", "get", &dead.0.to_string()])["state"],
        "dead"
    );
}

#[test]
fn off_loopback_a_token_is_required_and_checked() {
    let d = Dir::new("ui-token");
    let refused = d.run(&["ui", "--listen", "0.0.0.0:0"]);
    assert_eq!(code(&refused), 2);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("--auth-token") && err.contains("loopback"),
        "{err}"
    );
    let bad = d.run(&["ui", "--listen", "127.0.0.1:0", "--auth-token", "has space"]);
    assert_eq!(code(&bad), 2, "{}", String::from_utf8_lossy(&bad.stderr));

    let token = "s3cret-token-for-the-test";
    let ui = Server::start(&d, &["--auth-token", token]);
    for path in ["/queues", "/api/queues", "/metrics", "/static/app.js"] {
        assert_eq!(ui.get(path).status, 401, "{path}");
    }
    let wrong = ui.ask(
        "GET",
        "/api/queues",
        &[("Authorization", "Bearer nope")],
        "",
    );
    assert_eq!(wrong.status, 401);
    let bearer = format!("Bearer {token}");
    let right = ui.ask("GET", "/api/queues", &[("Authorization", &bearer)], "");
    assert_eq!(right.status, 200);
    assert_eq!(ui.get("/login?token=nope").status, 401);
    let login = ui.get(&format!("/login?token={token}"));
    assert_eq!(
        (login.status, login.header("location")),
        (303, Some("/queues"))
    );
    let cookie = login.header("set-cookie").unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let cookie = cookie.split(';').next().unwrap();
    let page = ui.ask("GET", "/queues", &[("Cookie", cookie)], "");
    assert_eq!(page.status, 200);
    // Any page opened with ?token= signs in, and leads to itself.
    let deep = ui.get(&format!("/jobs?queue=q&token={token}&state=dead"));
    assert_eq!(deep.status, 303);
    assert_eq!(deep.header("location"), Some("/jobs?queue=q&state=dead"));
    // With a token, any host name will do (the token is the guard).
    let other = ui.ask(
        "GET",
        "/queues",
        &[("Cookie", cookie), ("Host", "dash.example")],
        "",
    );
    assert_eq!(other.status, 200);
    // The token may come from the environment, off loopback too.
    let mut env = d.cmd();
    env.env("LEASEHOLD_UI_TOKEN", token);
    let mut off = Server::spawn(env, &["ui", "--listen", "0.0.0.0:0"]);
    let port = off.addr.rsplit(':').next().unwrap().to_owned();
    off.addr = format!("127.0.0.1:{port}");
    assert_eq!(off.get("/api/queues").status, 401);
    let ok = off.ask("GET", "/api/queues", &[("Authorization", &bearer)], "");
    assert_eq!(ok.status, 200);
}

#[test]
fn on_loopback_only_loopback_host_names_are_answered() {
    let d = Dir::new("ui-host");
    let ui = Server::start(&d, &[]);
    for host in ["localhost:1", "127.0.0.1", "[::1]:8080"] {
        let ok = ui.ask("GET", "/queues", &[("Host", host)], "");
        assert_eq!(ok.status, 200, "{host}");
    }
    for host in [
        "evil.example",
        "evil.example:8080",
        "127.0.0.1.evil.example",
    ] {
        let rebound = ui.ask("GET", "/api/queues", &[("Host", host)], "");
        assert_eq!(rebound.status, 403, "{host}: DNS rebinding is refused");
    }
}

/// A store that keeps leases only: the job pages say so, the leases show.
#[test]
fn on_the_file_store_the_leases_show_and_the_queues_say_why_not() {
    let d = Dir::new_file("ui-file");
    d.json(&[
        "lock", "acquire", "backup", "--ttl", "10m", "--label", "nightly",
    ]);
    let ui = Server::start(&d, &[]);
    for path in ["/queues", "/jobs"] {
        let page = ui.get(path);
        assert_eq!(page.status, 200, "{path}");
        assert!(
            page.body.contains("keeps leases only"),
            "{path}: {}",
            page.body
        );
    }
    let api = ui.get("/api/queues").json();
    assert!(api["leases_only"].as_str().unwrap().contains("leases only"));
    let leases = ui.get("/leases");
    assert!(leases.body.contains("data-key=\"backup\"") && leases.body.contains("nightly"));
    assert_eq!(ui.get("/metrics").status, 200);
}

/// The same reads and an action on PostgreSQL: the driver is only ever
/// called from blocking threads (it would panic on the async ones).
#[test]
fn on_postgres_every_page_answers() {
    let Some(d) = Dir::new_pg("ui") else { return };
    d.json(&[
        "queue",
        "push",
        "q",
        "--payload",
        "x",
        "--max-attempts",
        "1",
    ]);
    let worked = d.run(&["queue", "work", "q", "--drain", "--", "false"]);
    assert_eq!(code(&worked), 0);
    d.json(&["lock", "acquire", "k", "--ttl", "10m"]);
    let ui = Server::start(&d, &[]);
    for path in [
        "/queues",
        "/jobs?queue=q&state=dead",
        "/jobs/1",
        "/leases",
        "/metrics",
    ] {
        assert_eq!(ui.get(path).status, 200, "{path}");
    }
    assert_eq!(ui.get("/api/queues").json()["queues"][0]["dead"], 1);
    let confirm = ui.get("/jobs/1/retry");
    let retried = ui.ask(
        "POST",
        "/jobs/1/retry",
        &[],
        &format!("csrf={}", csrf_of(&confirm)),
    );
    assert_eq!(retried.status, 303);
    assert_eq!(d.json(&["queue", "get", "1"])["state"], "ready");
}
