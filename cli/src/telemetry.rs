//! Logs and metrics for the command line: `--log text|json` prints the
//! library's tracing events on stderr (quiet without it; `json` turns
//! leasehold's own notes and errors into JSON lines too, see
//! [`crate::out::say`]), and
//! `queue work --metrics ADDR` serves the library's metrics as Prometheus
//! text over HTTP (`leasehold ui` serves them at `/metrics` through the
//! same recorder).

use crate::out::{self, Level};
use crate::{Fail, EXIT_USAGE};
use clap::{Args, ValueEnum};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// How `--log` prints events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

/// The logging flags (global).
#[derive(Args)]
pub struct LogArgs {
    /// Print the library's events (leases granted, jobs claimed, failed...)
    /// on stderr, as text or JSON lines. Quiet without it.
    #[arg(
        long,
        value_enum,
        env = "LEASEHOLD_LOG",
        global = true,
        help_heading = "Logging"
    )]
    log: Option<LogFormat>,
    /// Which events `--log` prints, in `RUST_LOG` syntax (e.g. `debug`,
    /// `leasehold::job=trace`); default: `RUST_LOG`, else `info`.
    #[arg(
        long,
        env = "LEASEHOLD_LOG_FILTER",
        global = true,
        help_heading = "Logging"
    )]
    log_filter: Option<String>,
}

/// Whether a command line clap refused asked for `--log json`: the flag
/// among leasehold's arguments (not CMD's, after `--`), else
/// `LEASEHOLD_LOG`.
fn json_requested(args: impl IntoIterator<Item = OsString>) -> bool {
    let mut args = args.into_iter().skip(1);
    let mut given = None;
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--") => break,
            Some("--log") => given = args.next(),
            Some(a) => {
                if let Some(value) = a.strip_prefix("--log=") {
                    given = Some(value.into());
                }
            }
            None => {}
        }
    }
    given.or_else(|| std::env::var_os("LEASEHOLD_LOG")) == Some("json".into())
}

/// A command line clap refused: said as clap says it, or under `--log
/// json` as an error event; the exit code (help and version go to
/// stdout: 0). Neither panics when it cannot be written.
pub fn usage_error(e: &clap::Error) -> u8 {
    if !e.use_stderr() {
        let _ = e.print();
        return 0;
    }
    if !json_requested(std::env::args_os()) {
        let _ = e.print();
        return EXIT_USAGE;
    }
    out::notes_as_json();
    let text = e.to_string();
    let text = text.trim();
    let message = text.strip_prefix("error: ").unwrap_or(text);
    let kind = format!("{:?}", e.kind());
    let fields = [("kind", json!(kind)), ("exit_code", json!(EXIT_USAGE))];
    out::say(Level::Error, message, &fields);
    EXIT_USAGE
}

/// Install the subscriber `--log` asks for; under `json`, leasehold's own
/// notes, errors and panics are JSON lines from here on.
pub fn init_logging(args: &LogArgs) -> Result<(), Fail> {
    let Some(format) = args.log else {
        return Ok(());
    };
    if format == LogFormat::Json {
        out::notes_as_json();
        std::panic::set_hook(Box::new(|info| {
            out::say(Level::Error, &format!("internal error: {info}"), &[]);
        }));
    }
    let filter = args
        .log_filter
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok().filter(|f| !f.is_empty()))
        .unwrap_or_else(|| "info".to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| Fail::new(EXIT_USAGE, format!("invalid --log-filter {filter:?}: {e}")))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|e| Fail::new(crate::EXIT_ERROR, format!("installing the logger: {e}")))
}

/// Install the Prometheus recorder: the library's metrics (and the
/// dashboard's gauges) are kept from now on; the handle renders them as
/// Prometheus text.
pub fn install_recorder() -> Result<PrometheusHandle, Fail> {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| {
        Fail::new(
            crate::EXIT_ERROR,
            format!("installing the metrics recorder: {e}"),
        )
    })?;
    Ok(handle)
}

/// Install the Prometheus recorder and serve its text at `addr` (any path;
/// `/metrics` by convention) from a thread of its own.
pub fn serve_metrics(addr: &str) -> Result<(), Fail> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        Fail::new(
            EXIT_USAGE,
            format!("--metrics {addr:?}: cannot listen: {e}"),
        )
    })?;
    let handle = install_recorder()?;
    let bound = listener
        .local_addr()
        .map_or_else(|_| addr.to_owned(), |a| a.to_string());
    let url = format!("http://{bound}/metrics");
    out::say(
        Level::Info,
        &format!("metrics at {url}"),
        &[("url", json!(url))],
    );
    std::thread::Builder::new()
        .name("leasehold-metrics".to_owned())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let text = handle.render();
                let _ = answer(stream, &text);
            }
        })
        .map_err(|e| {
            Fail::new(
                crate::EXIT_ERROR,
                format!("starting the metrics server: {e}"),
            )
        })?;
    Ok(())
}

/// Read one request's head and answer it with `body`.
fn answer(stream: TcpStream, body: &str) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
