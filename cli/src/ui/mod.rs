//! `leasehold ui`: a web dashboard served by the binary itself.
//!
//! # Design
//! - **State**: one [`Ui`] per process, shared by every request: how to
//!   read the store ([`read::Reader`]), who may ask ([`guard::Guard`]:
//!   token, CSRF token, host names) and the options. Nothing else lives
//!   between requests: every answer is read fresh from the store.
//! - **Answers**: pages rendered on the server ([`pages`], in the frame
//!   of [`frame`]); the same
//!   page's `<main>` alone when its script asks for a refresh (header
//!   `X-Leasehold-Fragment`); the JSON API under `/api` (the same reads,
//!   the CLI's JSON shapes); actions (POST, after a confirmation page);
//!   `/metrics`; the script and style sheet ([`assets`]).
//! - **Invariants**: the async threads never call the store
//!   ([`read::blocking`]); a store transaction ends before anything is
//!   rendered; data reaches HTML only escaped ([`html::Html`]); a POST
//!   changes something only with the CSRF token and not `--read-only`;
//!   off loopback every request carries the token, on loopback every
//!   request names a loopback host.

mod api;
mod assets;
mod frame;
mod guard;
mod html;
mod pages;
mod read;
mod routes;

use crate::defaults;
use crate::out::{parse_duration, say, Level};
use crate::{client_for, CliResult, Fail, PolicyArgs, EXIT_ERROR, EXIT_USAGE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use clap::Args;
use leasehold::core::SummaryOptions;
use leasehold::{Error, Store};
use serde_json::json;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct UiArgs {
    /// Address to listen on. Anything but a loopback address needs
    /// --auth-token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// A token every request must carry (`Authorization: Bearer TOKEN`,
    /// or the cookie that opening /login?token=TOKEN sets). Required off
    /// loopback.
    #[arg(long, env = "LEASEHOLD_UI_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Show only: no retry, cancel or purge.
    #[arg(long)]
    read_only: bool,
    /// How often pages refresh themselves (0s: never).
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    refresh: Duration,
    #[arg(long, help = defaults::INTERVAL_HELP.as_str(), value_parser = parse_duration, default_value = defaults::INTERVAL.as_str())]
    interval: Duration,
    /// Count each state of a queue up to this many jobs (more shows as
    /// N+): what bounds a refresh's cost with millions of jobs.
    #[arg(long, default_value_t = defaults::count_cap(), value_parser = clap::value_parser!(u64).range(1..))]
    count_cap: u64,
}

/// The dashboard: what every request shares.
pub struct Ui {
    reader: read::Reader,
    guard: guard::Guard,
    read_only: bool,
    refresh_ms: u64,
    /// The store, as people should see it named.
    store_name: String,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// Why a request was not answered as asked.
#[derive(Debug)]
pub enum UiError {
    Store(Error),
    BadRequest(String),
    NotFound(String),
    Forbidden(String),
    Unauthorized,
    Internal(String),
}

impl From<Error> for UiError {
    fn from(e: Error) -> Self {
        UiError::Store(e)
    }
}

impl UiError {
    /// The status and the message for people.
    pub fn status(&self) -> (StatusCode, String) {
        match self {
            UiError::Store(e) => {
                let status = match e {
                    Error::NotFound(_) => StatusCode::NOT_FOUND,
                    Error::InvalidState { .. } => StatusCode::CONFLICT,
                    Error::Invalid { .. } => StatusCode::BAD_REQUEST,
                    e if e.is_transient() || matches!(e, Error::Busy { .. }) => {
                        StatusCode::SERVICE_UNAVAILABLE
                    }
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                (status, e.to_string())
            }
            UiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m.clone()),
            UiError::NotFound(m) => (StatusCode::NOT_FOUND, m.clone()),
            UiError::Forbidden(m) => (StatusCode::FORBIDDEN, m.clone()),
            UiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "this dashboard needs its token: sign in, or send Authorization: Bearer TOKEN"
                    .to_owned(),
            ),
            UiError::Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, m.clone()),
        }
    }
}

impl IntoResponse for UiError {
    /// A page that says what went wrong (the JSON API answers its own way).
    fn into_response(self) -> Response {
        let (status, message) = self.status();
        let page = frame::error_page(status, &message, matches!(self, UiError::Unauthorized));
        (status, axum::response::Html(page)).into_response()
    }
}

/// Where to listen, and whether every address it names is loopback.
fn listen_addr(listen: &str) -> Result<(SocketAddr, bool), Fail> {
    let addrs: Vec<SocketAddr> = listen
        .to_socket_addrs()
        .map_err(|e| {
            Fail::new(
                EXIT_USAGE,
                format!(
                    "invalid --listen {listen:?}: {e} (expected HOST:PORT, e.g. 127.0.0.1:8080)"
                ),
            )
        })?
        .collect();
    let first = addrs.first().copied().ok_or_else(|| {
        Fail::new(
            EXIT_USAGE,
            format!("invalid --listen {listen:?}: names no address"),
        )
    })?;
    Ok((first, addrs.iter().all(|a| a.ip().is_loopback())))
}

/// The token's rules: required off loopback, and made of characters a
/// header and a cookie carry as they are.
fn check_token(token: Option<&str>, loopback: bool, listen: &str) -> Result<(), Fail> {
    let Some(token) = token else {
        if loopback {
            return Ok(());
        }
        return Err(Fail::new(
            EXIT_USAGE,
            format!("--listen {listen} is not a loopback address: give --auth-token TOKEN (or LEASEHOLD_UI_TOKEN) so that only those who have it can use the dashboard"),
        ));
    };
    let fits = |c: char| c.is_ascii_graphic() && !"\";,\\".contains(c);
    if token.is_empty() || !token.chars().all(fits) {
        return Err(Fail::new(
            EXIT_USAGE,
            "invalid --auth-token: use printable ASCII without spaces, quotes, ';', ',' or '\\'"
                .to_owned(),
        ));
    }
    if token.len() < 16 {
        say(
            Level::Warn,
            "--auth-token is shorter than 16 characters: easy to guess",
            &[],
        );
    }
    Ok(())
}

pub fn ui(store: Arc<dyn Store>, policy: &PolicyArgs, args: UiArgs) -> CliResult {
    let (addr, loopback) = listen_addr(&args.listen)?;
    let longest = defaults::interval_max();
    if args.interval < Duration::from_millis(1) || args.interval > longest {
        return Err(Fail::new(
            EXIT_USAGE,
            format!("invalid --interval: {}", *defaults::INTERVAL_BOUNDS),
        ));
    }
    check_token(args.auth_token.as_deref(), loopback, &args.listen)?;
    let metrics = crate::telemetry::install_recorder()?;
    let client = client_for(store.clone(), policy, None, Some("leasehold ui".to_owned()))?;
    let ui = Arc::new(Ui {
        reader: read::Reader {
            policy: *client.policy(),
            store: store.clone(),
            client,
            summary: SummaryOptions {
                count_cap: args.count_cap,
                bucket_ms: crate::out::ms(args.interval),
                ..SummaryOptions::default()
            },
        },
        guard: guard::Guard::new(args.auth_token.clone(), addr.ip()),
        read_only: args.read_only,
        refresh_ms: crate::out::ms(args.refresh),
        store_name: store.describe(),
        metrics,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
        .map_err(|e| Fail::new(EXIT_ERROR, format!("starting the web server: {e}")))?;
    runtime.block_on(serve(ui, addr, args))
}

async fn serve(ui: Arc<Ui>, addr: SocketAddr, args: UiArgs) -> CliResult {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        Fail::new(
            EXIT_ERROR,
            format!("--listen {}: cannot listen: {e}", args.listen),
        )
    })?;
    let bound = listener.local_addr().map_or(addr, |a| a);
    let mode = match (&args.auth_token, args.read_only) {
        (Some(_), true) => " (token required, read-only)",
        (Some(_), false) => " (token required)",
        (None, true) => " (read-only)",
        (None, false) => "",
    };
    let url = format!("http://{bound}/");
    let fields = [
        ("url", json!(url)),
        ("store", json!(ui.store_name)),
        ("token_required", json!(args.auth_token.is_some())),
        ("read_only", json!(args.read_only)),
    ];
    say(
        Level::Info,
        &format!("dashboard of {} at {url}{mode}", ui.store_name),
        &fields,
    );
    axum::serve(listener, routes::router(ui))
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| Fail::new(EXIT_ERROR, format!("serving the dashboard: {e}")))?;
    Ok(0)
}

/// SIGTERM or SIGINT.
async fn stopped() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
