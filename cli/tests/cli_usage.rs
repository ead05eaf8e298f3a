//! The command line as a new user meets it: what surprised one, each pinned
//! by a test. Store URLs (mem: refused, parameters, a missing parent
//! directory), a counting lease's limit, durations, errors that name the
//! flag, payload previews, wall-clock times, exit codes 126/127, holder
//! labels, output that cannot be written, help, completions, the man page,
//! the drain rule and the progress line.

#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::Stdio;
use std::time::{Duration, SystemTime};

#[path = "support/cli.rs"]
mod cli;
use cli::{code, Dir};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn mem_store_is_refused_with_the_reason() {
    let d = Dir::new("u-mem");
    let out = d
        .cmd()
        .args(["lock", "acquire", "k", "--ttl", "5s"])
        .env("LEASEHOLD_STORE", "mem:")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("one process"), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "no token handed out");
}

#[test]
fn a_counting_leases_limit_belongs_to_the_key() {
    let d = Dir::new("u-limit");
    for _ in 0..2 {
        d.json(&["lock", "acquire", "pool", "--ttl", "30s", "--limit", "2"]);
    }
    let third = d.run(&["lock", "acquire", "pool", "--ttl", "30s", "--limit", "3"]);
    assert_eq!(code(&third), 1, "{}", stderr(&third));
    let msg = stderr(&third);
    assert!(
        msg.contains("--limit") && msg.contains('2') && msg.contains('3'),
        "{msg}"
    );
    let held = d.run(&["lock", "acquire", "pool", "--ttl", "30s", "--limit", "2"]);
    assert_eq!(code(&held), 75, "full at its own limit");
    let s = d.json(&["lock", "status", "pool"]);
    assert_eq!(s["limit"].as_u64(), Some(2));
    assert_eq!(s["holders"].as_array().unwrap().len(), 2);
}

#[test]
fn durations_take_the_humantime_grammar() {
    let d = Dir::new("u-dur");
    for (ttl, ms) in [
        ("1.5s", 1500),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("250ms", 250),
    ] {
        let v = d.json(&["lock", "acquire", &format!("k{ms}"), "--ttl", ttl]);
        assert_eq!(v["ttl_ms"].as_u64(), Some(ms), "{ttl}");
    }
    let over = d.run(&["lock", "acquire", "k", "--ttl", "99999999999999999999999s"]);
    assert_eq!(code(&over), 2);
    assert!(stderr(&over).contains("overflow"), "{}", stderr(&over));
    let unit = d.run(&["lock", "acquire", "k", "--ttl", "5parsecs"]);
    assert_eq!(code(&unit), 2);
    assert!(stderr(&unit).contains("--ttl"), "{}", stderr(&unit));
}

#[test]
fn errors_name_the_flag_the_user_typed() {
    let d = Dir::new("u-flag");
    let zero = d.run(&["queue", "list", "q", "--limit", "0"]);
    assert_eq!(code(&zero), 2);
    assert!(stderr(&zero).contains("--limit"), "{}", stderr(&zero));
    assert!(!stderr(&zero).contains("batch"), "{}", stderr(&zero));
    let ttl = d.run(&["lock", "acquire", "k", "--ttl", "0s"]);
    assert_eq!(code(&ttl), 1);
    assert!(stderr(&ttl).contains("invalid --ttl"), "{}", stderr(&ttl));
    let unique = d.run(&["queue", "push", "q", "--payload", "x", "--unique", ""]);
    assert_eq!(code(&unique), 1);
    assert!(stderr(&unique).contains("--unique"), "{}", stderr(&unique));
}

#[test]
fn list_shows_a_preview_and_get_the_whole_payload() {
    let d = Dir::new("u-payload");
    let big = "é".repeat(4 << 20); // 8 MiB of two-byte characters
    let mut push = d
        .cmd()
        .args(["queue", "push", "q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    push.stdin
        .take()
        .unwrap()
        .write_all(big.as_bytes())
        .unwrap();
    assert!(push.wait_with_output().unwrap().status.success());
    let binary = d
        .cmd()
        .args(["queue", "push", "q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut binary = binary;
    binary
        .stdin
        .take()
        .unwrap()
        .write_all(&[0xff, 0, 1, 2])
        .unwrap();
    assert!(binary.wait_with_output().unwrap().status.success());
    let out = d.run(&["queue", "list", "q"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.len() < 4096,
        "a short line per job, not {} bytes",
        text.len()
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["payload_bytes"].as_u64(), Some(big.len() as u64));
    assert_eq!(lines[0]["payload_encoding"].as_str(), Some("utf8"));
    let preview = lines[0]["payload_preview"].as_str().unwrap();
    assert!(!preview.is_empty() && big.starts_with(preview) && preview.len() <= 64);
    assert_eq!(lines[1]["payload_encoding"].as_str(), Some("base64"));
    assert_eq!(lines[1]["payload_preview"].as_str(), Some("/wABAg=="));
    let one = d.json(&["queue", "get", "1"]);
    assert_eq!(one["payload"].as_str(), Some(big.as_str()));
    let two = d.json(&["queue", "get", "2"]);
    assert_eq!(two["payload"].as_str(), Some("/wABAg=="));
    assert_eq!(code(&d.run(&["queue", "get", "99"])), 1);
}

fn parse_rfc3339(v: &serde_json::Value) -> SystemTime {
    let text = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn near(t: SystemTime, want: SystemTime, slack: Duration) -> bool {
    match t.duration_since(want) {
        Ok(d) => d <= slack,
        Err(e) => e.duration() <= slack,
    }
}

fn times_are_wall_clock(d: Dir) {
    let now = SystemTime::now();
    let a = d.json(&["lock", "acquire", "t", "--ttl", "1h"]);
    assert!(
        a.get("expires_at_ms").is_none(),
        "no raw store-clock numbers: {a}"
    );
    let exp = parse_rfc3339(&a["expires_at"]);
    assert!(
        near(
            exp,
            now + Duration::from_secs(3600),
            Duration::from_secs(10)
        ),
        "{a}"
    );
    assert!(a["expires_in_ms"].as_u64().unwrap() > 3_590_000);
    let s = d.json(&["lock", "status", "t"]);
    let exp = parse_rfc3339(&s["holders"][0]["expires_at"]);
    assert!(
        near(
            exp,
            now + Duration::from_secs(3600),
            Duration::from_secs(10)
        ),
        "{s}"
    );
}

#[test]
fn sqlite_times_are_wall_clock_instants() {
    let d = Dir::new("u-time");
    let now = SystemTime::now();
    d.json(&["queue", "push", "q", "--payload", "x", "--delay", "2h"]);
    let j = d.json(&["queue", "get", "1"]);
    assert!(
        near(
            parse_rfc3339(&j["created_at"]),
            now,
            Duration::from_secs(10)
        ),
        "{j}"
    );
    let run_at = parse_rfc3339(&j["run_at"]);
    assert!(
        near(
            run_at,
            now + Duration::from_secs(7200),
            Duration::from_secs(10)
        ),
        "{j}"
    );
    let at = humantime::format_rfc3339_seconds(now + Duration::from_secs(86_400)).to_string();
    let id = d.json(&["queue", "push", "q", "--payload", "y", "--at", &at])["id"].to_string();
    let j = d.json(&["queue", "get", &id]);
    let run_at = parse_rfc3339(&j["run_at"]);
    assert!(
        near(
            run_at,
            now + Duration::from_secs(86_400),
            Duration::from_secs(10)
        ),
        "{j}"
    );
    times_are_wall_clock(d);
}

#[test]
fn file_store_times_are_wall_clock_instants() {
    times_are_wall_clock(Dir::new_file("u-time"));
}

#[test]
fn postgres_times_are_wall_clock_instants() {
    if let Some(d) = Dir::new_pg("utime") {
        times_are_wall_clock(d);
    }
}

#[test]
fn commands_that_cannot_run_exit_126_or_127() {
    let d = Dir::new("u-exec");
    let missing = d.run(&["run", "k", "--ttl", "5s", "--", "/no/such/cmd"]);
    assert_eq!(code(&missing), 127, "{}", stderr(&missing));
    assert!(stderr(&missing).contains("/no/such/cmd"));
    let path_missing = d.run(&["run", "k", "--ttl", "5s", "--", "no-such-command-anywhere"]);
    assert_eq!(code(&path_missing), 127);
    let plain = d.0.join("plain.txt");
    std::fs::write(&plain, "not a program").unwrap();
    let not_exec = d.run(&["run", "k", "--ttl", "5s", "--", plain.to_str().unwrap()]);
    assert_eq!(code(&not_exec), 126, "{}", stderr(&not_exec));
    let s = d.json(&["lock", "status", "k"]);
    assert!(s["holders"].as_array().unwrap().is_empty(), "released");
}

#[test]
fn holders_are_labelled_by_their_caller_and_reacquiring_says_renewed() {
    let d = Dir::new("u-label");
    let a = d.json(&["lock", "acquire", "k", "--ttl", "30s"]);
    let label = a["label"].as_str().unwrap();
    let me = std::process::id().to_string();
    assert!(
        label.contains(&me),
        "the default label names the caller (pid {me}): {label}"
    );
    let holder = a["holder"].as_str().unwrap();
    let out = d.run(&["lock", "acquire", "k", "--ttl", "60s", "--holder", holder]);
    assert!(out.status.success());
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["renewed"].as_bool(), Some(true));
    assert_eq!(again["token"], a["token"]);
    assert!(stderr(&out).contains("renewed"), "{}", stderr(&out));
    let b = d.json(&[
        "lock",
        "acquire",
        "j",
        "--ttl",
        "30s",
        "--label",
        "etl box 3",
    ]);
    assert_eq!(b["label"].as_str(), Some("etl box 3"));
    assert_eq!(b["renewed"].as_bool(), Some(false));
}

#[test]
fn file_store_creates_only_the_last_component() {
    let d = Dir::new("u-dirs");
    let typo = d.0.join("no-such-parent").join("leases");
    let out = d
        .cmd()
        .args(["lock", "acquire", "k", "--ttl", "5s"])
        .env("LEASEHOLD_STORE", format!("file:{}", typo.display()))
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("no-such-parent"), "{}", stderr(&out));
    assert!(!d.0.join("no-such-parent").exists(), "nothing created");
    let ok = d.0.join("leases");
    let out = d
        .cmd()
        .args(["lock", "acquire", "k", "--ttl", "5s"])
        .env("LEASEHOLD_STORE", format!("file:{}", ok.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(ok.is_dir());
}

#[test]
fn store_options_travel_as_url_parameters() {
    let d = Dir::new("u-params");
    let with = |url: String, args: &[&str]| {
        d.cmd()
            .args(args)
            .env("LEASEHOLD_STORE", url)
            .output()
            .unwrap()
    };
    let file = format!("file:{}?durable=false", d.0.join("leases").display());
    let out = with(file, &["lock", "acquire", "k", "--ttl", "5s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sqlite = format!("sqlite:{}?synchronous=full", d.0.join("x.db").display());
    let out = with(sqlite, &["queue", "push", "q", "--payload", "p"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bogus = format!("sqlite:{}?synchronus=full", d.0.join("x.db").display());
    let out = with(bogus, &["queue", "stats", "q"]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("synchronus"), "{}", stderr(&out));
    let bad = format!("file:{}?durable=maybe", d.0.join("leases").display());
    let out = with(bad, &["lock", "status", "k"]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("durable"), "{}", stderr(&out));
}

#[test]
fn policy_flags_set_backoff_and_quarantine() {
    let d = Dir::new("u-policy");
    d.json(&[
        "queue",
        "push",
        "q",
        "--payload",
        "x",
        "--max-attempts",
        "3",
    ]);
    let out = d.run(&[
        "--backoff",
        "20ms",
        "--backoff-max",
        "40ms",
        "queue",
        "work",
        "q",
        "--drain",
        "--",
        "sh",
        "-c",
        "[ \"$LEASEHOLD_ATTEMPT\" = 2 ]",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = d.stats("q");
    assert_eq!(s["done"], 1, "retried after a short backoff: {s:?}");
    assert_eq!(
        code(&d.run(&["--quarantine-after", "x", "queue", "stats", "q"])),
        2
    );
}

#[test]
fn output_that_cannot_be_written_is_an_error_never_a_panic() {
    let d = Dir::new("u-full");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full");
    let Ok(full) = full else {
        eprintln!("SKIPPED: no /dev/full");
        return;
    };
    let out = d
        .cmd()
        .args(["queue", "push", "q", "--payload", "x"])
        .stdout(Stdio::from(full.try_clone().unwrap()))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(code(&out), 74, "{}", stderr(&out));
    assert!(stderr(&out).contains("stdout"), "{}", stderr(&out));
    let out = d
        .cmd()
        .args(["queue", "stats", "q"])
        .env("LEASEHOLD_STORE", "sqlite:/no/such/dir/x.db")
        .stderr(Stdio::from(full))
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "an error, reported as well as stderr allows");
}

/// A full disk is reported ("database or disk is full") and loses nothing:
/// every push that said ok is there. Needs root to mount a small tmpfs.
#[test]
fn a_full_disk_loses_nothing() {
    let d = Dir::new("u-disk");
    let mnt = d.0.join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .status();
    if !matches!(mounted, Ok(s) if s.success()) {
        eprintln!("SKIPPED: cannot mount a tmpfs (not root?)");
        return;
    }
    let url = format!("sqlite:{}", mnt.join("x.db").display());
    let payload = "y".repeat(64 * 1024);
    let mut ok = 0;
    let mut refused = None;
    for _ in 0..64 {
        let out = d
            .cmd()
            .args(["queue", "push", "q", "--payload", &payload])
            .env("LEASEHOLD_STORE", &url)
            .output()
            .unwrap();
        if out.status.success() {
            ok += 1;
        } else {
            refused = Some(out);
            break;
        }
    }
    let refused = refused.expect("the disk filled up");
    assert_eq!(code(&refused), 1);
    assert!(stderr(&refused).contains("full"), "{}", stderr(&refused));
    let stats = d
        .cmd()
        .args(["queue", "stats", "q"])
        .env("LEASEHOLD_STORE", &url)
        .output()
        .unwrap();
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    assert!(stats.status.success(), "{}", stderr(&stats));
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(
        v["ready"].as_u64(),
        Some(ok),
        "every acknowledged push is kept"
    );
}

#[test]
fn help_describes_containment_exit_codes_and_durations() {
    let d = Dir::new("u-help");
    let out = d.run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(!help.contains("planned"), "{help}");
    for needle in [
        "postgres://",
        "PID namespace",
        "subreaper",
        "127",
        "126",
        "76",
        "1h30m",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}: {help}");
    }
}

#[test]
fn completions_and_man_page_come_from_the_definitions() {
    let d = Dir::new("u-gen");
    for shell in ["bash", "zsh", "fish"] {
        let out = d.run(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("leasehold") && text.contains("acquire"),
            "{shell}"
        );
    }
    let man = d.run(&["man"]);
    assert!(man.status.success());
    let text = String::from_utf8_lossy(&man.stdout);
    assert!(text.starts_with(".ie") || text.contains(".TH"), "{text}");
    assert!(text.contains("leasehold"));
}

/// The one drain rule: a retry waiting out its backoff holds a draining
/// worker; a job delayed before its first attempt does not, however many
/// of them sort before the retry.
#[test]
fn drain_waits_for_retries_not_for_delayed_jobs() {
    let d = Dir::new("u-drain");
    for _ in 0..3 {
        d.json(&["queue", "push", "q", "--payload", "later", "--delay", "1h"]);
    }
    d.json(&["queue", "push", "q", "--payload", "flaky"]);
    let out = d.run(&[
        "--backoff",
        "300ms",
        "queue",
        "work",
        "q",
        "--drain",
        "--",
        "sh",
        "-c",
        "[ \"$LEASEHOLD_ATTEMPT\" -ge 2 ]",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = d.stats("q");
    assert_eq!((s["done"], s["scheduled"]), (1, 3), "{s:?}");
}

/// On a terminal, `queue work --drain` shows a progress line; with stdout
/// not a terminal, nothing but JSON lines (skipped without script(1)).
#[test]
fn drain_shows_progress_on_a_terminal_only() {
    let d = Dir::new("u-progress");
    for i in 0..20 {
        d.json(&["queue", "push", "q", "--payload", &i.to_string()]);
    }
    let plain = d.run(&["queue", "work", "q", "--drain", "--", "true"]);
    assert!(plain.status.success());
    assert!(!stderr(&plain).contains("jobs "), "{}", stderr(&plain));
    for line in String::from_utf8_lossy(&plain.stdout).lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    for i in 0..20 {
        d.json(&["queue", "push", "q", "--payload", &i.to_string()]);
    }
    let inner = format!(
        "LEASEHOLD_STORE='{}' '{}' queue work q --drain -- sleep 0.05",
        d.store(),
        cli::bin()
    );
    let tty = std::process::Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .current_dir(&d.0)
        .output();
    let Ok(tty) = tty else {
        eprintln!("SKIPPED: no script(1)");
        return;
    };
    assert!(tty.status.success(), "{}", stderr(&tty));
    let shown = String::from_utf8_lossy(&tty.stdout);
    assert!(shown.contains("/20 jobs"), "{shown}");
}

#[test]
fn keep_stdout_makes_the_commands_output_the_jobs_result() {
    let d = Dir::new("u-result");
    let id = d.json(&["queue", "push", "q", "--payload", "hello"])["id"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = d.run(&[
        "queue",
        "work",
        "q",
        "--drain",
        "--keep-stdout",
        "--",
        "tr",
        "a-z",
        "A-Z",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let job = d.json(&["queue", "get", &id]);
    assert_eq!(job["result"], "HELLO");
    assert_eq!(
        (
            job["result_bytes"].as_u64(),
            job["result_encoding"].as_str()
        ),
        (Some(5), Some("utf8"))
    );
    // Without the flag, stdout goes to stderr and the job keeps no result.
    let id = d.json(&["queue", "push", "q", "--payload", "x"])["id"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = d.run(&["queue", "work", "q", "--drain", "--", "echo", "seen"]);
    assert!(stderr(&out).contains("seen"), "{}", stderr(&out));
    assert!(d.json(&["queue", "get", &id]).get("result").is_none());
}
