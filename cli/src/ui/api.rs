//! The JSON API behind the pages (the same reads, in the CLI's JSON
//! shapes: `queue queues`, `queue list`, `lock list`), `/metrics`, and the
//! dashboard's script and style sheet.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/queues?after=NAME` | `{"queues": [summary...], "next": NAME?}` |
//! | `GET /api/jobs?queue=Q&state=S&after=CURSOR&limit=N` | `{"queue", "state", "jobs": [job...], "next": CURSOR?}` |
//! | `GET /api/jobs/ID` | the job (payload: its first 4 KiB), with `worker_label` |
//! | `GET /api/leases?after=KEY` | `{"leases": [lock status...], "next": KEY?}` |
//! | `GET /metrics` | Prometheus text: the library's metrics, and `leasehold_queue_jobs` per queue and state |
//!
//! Errors answer `{"error": MESSAGE}` with the status a page would have.

use super::assets;
use super::read::QUEUES_PAGE;
use super::routes::{read, JobsQuery};
use super::{Ui, UiError};
use crate::out::{self, Times};
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use leasehold::core::JobCursor;
use leasehold::{JobId, JobState};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

pub fn routes() -> Router<Arc<Ui>> {
    Router::new()
        .route("/api/queues", get(queues))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{id}", get(job))
        .route("/api/leases", get(leases))
        .route("/metrics", get(metrics))
        .route(
            "/static/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", assets::JS) }),
        )
        .route(
            "/static/app.css",
            get(|| async { asset("text/css; charset=utf-8", assets::CSS) }),
        )
        .route(
            "/static/icon.svg",
            get(|| async { asset("image/svg+xml", assets::ICON) }),
        )
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(CONTENT_TYPE, kind)], body).into_response()
}

/// An error, as JSON.
pub struct ApiError(UiError);

impl From<UiError> for ApiError {
    fn from(e: UiError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = self.0.status();
        (status, Json(json!({ "error": message }))).into_response()
    }
}

type Answer = Result<Json<Value>, ApiError>;

#[derive(Deserialize)]
struct After {
    after: Option<String>,
}

async fn queues(State(ui): State<Arc<Ui>>, Query(q): Query<After>) -> Answer {
    let after = q.after.unwrap_or_default();
    let view = read(&ui, move |r| r.overview(&after)).await?;
    let queues: Vec<Value> = view
        .queues
        .iter()
        .map(|(name, s)| out::summary_json(name, s))
        .collect();
    let mut v = json!({ "queues": queues, "next": view.next });
    if let Some(why) = view.leases_only {
        v["leases_only"] = json!(why);
    }
    Ok(Json(v))
}

async fn jobs(State(ui): State<Arc<Ui>>, Query(q): Query<JobsQuery>) -> Answer {
    let (state, after, limit) = q.parse()?;
    let queue = q.queue.filter(|s| !s.is_empty());
    let view = read(&ui, move |r| r.jobs(queue.as_deref(), state, after, limit)).await?;
    let t = Times::new(view.now_ms);
    let jobs: Vec<Value> = view.jobs.iter().map(|p| out::peek_json(p, &t)).collect();
    Ok(Json(json!({
        "queue": view.queue,
        "state": view.state.as_str(),
        "jobs": jobs,
        "next": view.next.map(|c: JobCursor| c.to_string()),
    })))
}

async fn job(State(ui): State<Arc<Ui>>, Path(id): Path<String>) -> Answer {
    let id: u64 = id
        .parse()
        .map_err(|_| UiError::NotFound(format!("{id:?} is not a job id")))?;
    let view = read(&ui, move |r| r.job(JobId(id))).await?;
    let mut v = out::peek_json(&view.peek, &Times::new(view.now_ms));
    v["worker_label"] = json!(view.worker);
    Ok(Json(v))
}

async fn leases(State(ui): State<Arc<Ui>>, Query(q): Query<After>) -> Answer {
    let after = q.after.unwrap_or_default();
    let view = read(&ui, move |r| r.leases(&after)).await?;
    let leases: Vec<Value> = view
        .page
        .leases
        .iter()
        .map(|(key, info)| out::status_json(key, info))
        .collect();
    Ok(Json(json!({ "leases": leases, "next": view.page.next })))
}

/// The recorder's text, after setting the queues' gauges from the store
/// (the first page of queues; a store that keeps no jobs has none).
async fn metrics(State(ui): State<Arc<Ui>>) -> Response {
    if let Ok(view) = read(&ui, |r| r.overview("")).await {
        debug_assert!(view.queues.len() <= QUEUES_PAGE);
        for (name, s) in &view.queues {
            for state in JobState::ALL {
                let gauge = metrics::gauge!(
                    "leasehold_queue_jobs",
                    "queue" => name.clone(),
                    "state" => state.as_str()
                );
                gauge.set(s.counts.get(state) as f64);
            }
        }
    }
    asset_text(ui.metrics.render())
}

fn asset_text(body: String) -> Response {
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}
