//! Who may talk to the dashboard, and what its answers allow a browser.
//!
//! - **Token** (`--auth-token`, required off loopback): every request
//!   carries it, as `Authorization: Bearer TOKEN` or in the cookie a
//!   login sets (any URL with `?token=TOKEN`, `/login?token=TOKEN` for
//!   instance, which redirects to the same URL without it). Without it:
//!   401 (a sign-in form for pages).
//! - **Host** (no token, so loopback only): the `Host` header must name a
//!   loopback address, so a web page whose name an attacker points at
//!   127.0.0.1 (DNS rebinding) cannot read the dashboard.
//! - **CSRF**: every POST carries the per-process token the dashboard
//!   puts in its forms ([`Guard::check_csrf`], in the action handlers).
//! - **Headers**: a Content-Security-Policy that runs only the
//!   dashboard's own script and style (no inline code: an escaped value
//!   that slipped through still could not run), no framing, no referrer
//!   (a token in a URL does not leak), no caching.

use super::{Ui, UiError};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;
use std::sync::Arc;

/// The cookie that carries the token after a login.
const COOKIE: &str = "leasehold_ui";

/// Headers on every answer.
const HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
];

/// The access rules of one dashboard process.
pub struct Guard {
    token: Option<String>,
    csrf: String,
    /// The host names a request may use when there is no token.
    hosts: Vec<String>,
}

/// Equal, in time that does not depend on where `a` and `b` differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Guard {
    /// The rules for a dashboard listening on `ip`, with `token` if given.
    pub fn new(token: Option<String>, ip: IpAddr) -> Guard {
        let mut hosts = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "[::1]".to_owned(),
        ];
        hosts.push(match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        });
        let csrf = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        Guard { token, csrf, hosts }
    }

    /// The token forms carry.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether a POST's token is this process's.
    pub fn check_csrf(&self, presented: &str) -> bool {
        same(presented, &self.csrf)
    }

    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        // Strip the port: after the last ':' unless inside an IPv6 literal.
        let name = match host.rfind(':') {
            Some(i) if !host[i..].contains(']') => &host[..i],
            _ => host,
        };
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
    }

    fn presented_token<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        bearer.or_else(|| {
            headers
                .get_all(header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        })
    }
}

/// The token a `?token=...` login presents, and where to go without it
/// (the same path and other parameters; `/login` leads to the queues).
fn login(req: &Request) -> Option<(String, String)> {
    #[derive(serde::Deserialize)]
    struct Login {
        token: String,
    }
    let login = axum::extract::Query::<Login>::try_from_uri(req.uri()).ok()?;
    let rest: Vec<&str> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("token="))
        .collect();
    let path = match req.uri().path() {
        "/login" | "/" => "/queues",
        path => path,
    };
    let to = if rest.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", rest.join("&"))
    };
    Some((login.0.token, to))
}

/// Apply the rules to every request, and the headers to every answer.
pub async fn protect(State(ui): State<Arc<Ui>>, req: Request, next: Next) -> Response {
    let mut answer = check(&ui, req, next).await;
    for (name, value) in HEADERS {
        answer
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    answer
}

async fn check(ui: &Ui, req: Request, next: Next) -> Response {
    let guard = &ui.guard;
    let Some(token) = &guard.token else {
        if !guard.host_allowed(req.headers()) {
            return UiError::Forbidden(
                "this dashboard answers only to a loopback host name (localhost, 127.0.0.1, [::1])"
                    .to_owned(),
            )
            .into_response();
        }
        return next.run(req).await;
    };
    if let Some((presented, to)) = login(&req) {
        if same(&presented, token) {
            return signed_in(token, &to);
        }
        return UiError::Unauthorized.into_response();
    }
    match guard.presented_token(req.headers()) {
        Some(t) if same(t, token) => next.run(req).await,
        _ => UiError::Unauthorized.into_response(),
    }
}

/// The login's answer: the cookie, and a redirect to `to` (without the token).
fn signed_in(token: &str, to: &str) -> Response {
    let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
    let mut answer = (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        answer.headers_mut().insert(header::SET_COOKIE, value);
    }
    answer
}
