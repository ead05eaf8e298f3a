//! The routes: pages (and their fragments), confirmations and actions.
//! The JSON API, `/metrics` and the assets are in [`super::api`].
//!
//! An action is two requests: a GET that shows what will happen and a
//! form, and that form's POST, which needs the CSRF token and is refused
//! in read-only mode; the POST answers with a redirect to the page that
//! shows the result (so reloading it repeats nothing).

use super::api;
use super::frame::{self, Confirm, Frame, Nav};
use super::html::Href;
use super::pages;
use super::read::{blocking, Reader};
use super::{guard, Ui, UiError};
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html as Page, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use leasehold::core::JobCursor;
use leasehold::{JobId, JobState};
use serde::Deserialize;
use std::sync::Arc;

/// Jobs per page.
pub const JOBS_PAGE: usize = 50;

pub fn router(ui: Arc<Ui>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/queues") }))
        .route("/login", get(|| async { Redirect::to("/queues") }))
        .route("/queues", get(queues_page))
        .route("/jobs", get(jobs_page))
        .route("/jobs/{id}", get(job_page))
        .route("/jobs/{id}/{action}", get(confirm_job).post(act_on_job))
        .route("/purge", get(confirm_purge).post(purge))
        .route(
            "/pause",
            get(|s, h, q| confirm_pause(s, h, q, true)).post(|s, f| pause(s, f, true)),
        )
        .route(
            "/resume",
            get(|s, h, q| confirm_pause(s, h, q, false)).post(|s, f| pause(s, f, false)),
        )
        .route("/leases", get(leases_page))
        .merge(api::routes())
        .fallback(|| async { UiError::NotFound("no such page".to_owned()) })
        .layer(axum::middleware::from_fn_with_state(
            ui.clone(),
            guard::protect,
        ))
        .with_state(ui)
}

/// Run `f` on the store's reader, off the async threads.
pub async fn read<T: Send + 'static>(
    ui: &Arc<Ui>,
    f: impl FnOnce(&Reader) -> Result<T, UiError> + Send + 'static,
) -> Result<T, UiError> {
    let ui = ui.clone();
    blocking(move || f(&ui.reader)).await
}

/// How a page was asked for: a refresh asks for `<main>` alone.
fn frame<'a>(ui: &'a Ui, headers: &HeaderMap, nav: Nav, live: bool) -> Frame<'a> {
    Frame {
        ui,
        fragment: headers.contains_key("x-leasehold-fragment"),
        nav,
        live,
    }
}

/// An action's result, shown after its redirect.
#[derive(Deserialize, Default)]
struct Done {
    done: Option<String>,
    n: Option<u64>,
}

#[derive(Deserialize)]
struct After {
    after: Option<String>,
    #[serde(flatten)]
    done: Done,
}

async fn queues_page(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<After>,
) -> Result<Page<String>, UiError> {
    let after = q.after.unwrap_or_default();
    let view = read(&ui, move |r| r.overview(&after)).await?;
    let f = frame(&ui, &headers, Nav::Queues, true);
    Ok(Page(frame::layout(&f, "Queues", |h| {
        frame::notice(h, q.done.done.as_deref(), q.done.n);
        pages::queues(h, &ui, &view);
    })))
}

#[derive(Deserialize)]
pub struct JobsQuery {
    pub queue: Option<String>,
    pub state: Option<String>,
    pub after: Option<String>,
    pub limit: Option<String>,
}

impl JobsQuery {
    /// The state (default ready), the cursor and the limit, checked.
    pub fn parse(&self) -> Result<(JobState, Option<JobCursor>, usize), UiError> {
        let bad = |e: leasehold::Error| UiError::BadRequest(e.to_string());
        let state = match self.state.as_deref() {
            None | Some("") => JobState::Ready,
            Some(s) => JobState::parse(s).map_err(bad)?,
        };
        let after = match self.after.as_deref() {
            None | Some("") => None,
            Some(a) => Some(JobCursor::parse(a).map_err(bad)?),
        };
        let limit = match self.limit.as_deref() {
            None | Some("") => JOBS_PAGE,
            Some(l) => l.parse().map_err(|_| {
                UiError::BadRequest(format!("invalid limit: {l:?} is not a whole number"))
            })?,
        };
        Ok((state, after, limit))
    }
}

async fn jobs_page(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<JobsQuery>,
) -> Result<Page<String>, UiError> {
    let (state, after, limit) = q.parse()?;
    let queue = q.queue.filter(|s| !s.is_empty());
    let view = read(&ui, move |r| r.jobs(queue.as_deref(), state, after, limit)).await?;
    let f = frame(&ui, &headers, Nav::Jobs, true);
    Ok(Page(frame::layout(&f, "Jobs", |h| {
        pages::jobs(h, &view, after)
    })))
}

fn job_id(text: &str) -> Result<JobId, UiError> {
    text.parse()
        .map(JobId)
        .map_err(|_| UiError::NotFound(format!("{text:?} is not a job id")))
}

async fn job_page(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(done): Query<Done>,
) -> Result<Page<String>, UiError> {
    let id = job_id(&id)?;
    let view = read(&ui, move |r| r.job(id)).await?;
    let f = frame(&ui, &headers, Nav::Jobs, true);
    let title = format!("Job {id}");
    Ok(Page(frame::layout(&f, &title, |h| {
        pages::job(h, &ui, &view, done.done.as_deref())
    })))
}

async fn leases_page(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<After>,
) -> Result<Page<String>, UiError> {
    let after = q.after.unwrap_or_default();
    let shown = after.clone();
    let view = read(&ui, move |r| r.leases(&after)).await?;
    let f = frame(&ui, &headers, Nav::Leases, true);
    Ok(Page(frame::layout(&f, "Leases", |h| {
        pages::leases(h, &view, &shown)
    })))
}

/// The job actions there are.
#[derive(Clone, Copy)]
enum JobAction {
    Retry,
    Cancel,
}

impl JobAction {
    /// The action `name` names; refused in read-only mode.
    fn named(ui: &Ui, name: &str) -> Result<JobAction, UiError> {
        if ui.read_only {
            return Err(read_only());
        }
        match name {
            "retry" => Ok(JobAction::Retry),
            "cancel" => Ok(JobAction::Cancel),
            _ => Err(UiError::NotFound(format!(
                "no action {name:?} (retry, cancel)"
            ))),
        }
    }

    /// Its path after the job's, its title, what it does, its button.
    fn words(self) -> (&'static str, &'static str, &'static str, &'static str) {
        match self {
            JobAction::Retry => (
                "/retry",
                "Retry this job?",
                "Retrying makes it ready now, with a fresh attempt budget.",
                "Retry",
            ),
            JobAction::Cancel => (
                "/cancel",
                "Cancel this job?",
                "A waiting job is cancelled at once; a running one is asked to stop (its worker sees it at its next heartbeat).",
                "Cancel",
            ),
        }
    }
}

fn read_only() -> UiError {
    UiError::Forbidden("this dashboard is read-only (--read-only)".to_owned())
}

async fn confirm_job(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
) -> Result<Page<String>, UiError> {
    let id = job_id(&id)?;
    let action = JobAction::named(&ui, &action)?;
    let job = read(&ui, move |r| r.job(id)).await?.peek.job;
    let (suffix, title, what, button) = action.words();
    let c = Confirm {
        title,
        what: format!(
            "Job {id} of queue “{}” is {}. {what}",
            &*job.queue, job.state
        ),
        action: Href::path("/jobs/", id, suffix),
        hidden: Vec::new(),
        input: None,
        button: format!("{button} job {id}"),
        back: Href::path("/jobs/", id, ""),
    };
    let f = frame(&ui, &headers, Nav::Jobs, false);
    Ok(Page(frame::layout(&f, title, |h| {
        frame::confirm(h, &ui, &c)
    })))
}

/// The queue a queue action names (`?queue=NAME`, or the form's field).
fn queue_named(queue: Option<String>) -> Result<String, UiError> {
    queue
        .filter(|s| !s.is_empty())
        .ok_or_else(|| UiError::BadRequest("which queue? (?queue=NAME)".to_owned()))
}

async fn confirm_pause(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<Posted>,
    paused: bool,
) -> Result<Page<String>, UiError> {
    if ui.read_only {
        return Err(read_only());
    }
    let queue = queue_named(q.queue)?;
    let (title, what, verb) = if paused {
        (
            "Pause this queue?",
            format!("No worker anywhere starts a job of queue “{queue}” until it is resumed. Running jobs finish; pushes are still accepted."),
            "Pause",
        )
    } else {
        (
            "Resume this queue?",
            format!(
                "Workers start the jobs of queue “{queue}” again; idle workers are woken at once."
            ),
            "Resume",
        )
    };
    let c = Confirm {
        title,
        what,
        action: Href::new(if paused { "/pause" } else { "/resume" }),
        hidden: vec![("queue", queue.clone())],
        input: None,
        button: format!("{verb} {queue}"),
        back: Href::new("/queues"),
    };
    let f = frame(&ui, &headers, Nav::Queues, false);
    Ok(Page(frame::layout(&f, verb, |h| {
        frame::confirm(h, &ui, &c)
    })))
}

async fn pause(
    State(ui): State<Arc<Ui>>,
    Form(form): Form<Posted>,
    paused: bool,
) -> Result<Response, UiError> {
    if ui.read_only {
        return Err(read_only());
    }
    check_csrf(&ui, &form)?;
    let queue = queue_named(form.queue)?;
    read(&ui, move |r| r.set_paused(&queue, paused)).await?;
    let to = format!("/queues?done={}", if paused { "pause" } else { "resume" });
    Ok((StatusCode::SEE_OTHER, [(axum::http::header::LOCATION, to)]).into_response())
}

/// A POST's form: the CSRF token and whatever the action needs.
#[derive(Deserialize)]
struct Posted {
    csrf: Option<String>,
    queue: Option<String>,
    older_than: Option<String>,
}

fn check_csrf(ui: &Ui, form: &Posted) -> Result<(), UiError> {
    match &form.csrf {
        Some(token) if ui.guard.check_csrf(token) => Ok(()),
        _ => Err(UiError::Forbidden(
            "missing or wrong CSRF token: use the dashboard's own form".to_owned(),
        )),
    }
}

async fn act_on_job(
    State(ui): State<Arc<Ui>>,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<Posted>,
) -> Result<Response, UiError> {
    let id = job_id(&id)?;
    let action = JobAction::named(&ui, &action)?;
    check_csrf(&ui, &form)?;
    let done = match action {
        JobAction::Retry => read(&ui, move |r| r.retry(id)).await.map(|()| "retry")?,
        JobAction::Cancel => read(&ui, move |r| r.cancel(id)).await.map(|_| "cancel")?,
    };
    let to = format!("/jobs/{id}?done={done}");
    Ok((StatusCode::SEE_OTHER, [(axum::http::header::LOCATION, to)]).into_response())
}

async fn confirm_purge(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<Posted>,
) -> Result<Page<String>, UiError> {
    if ui.read_only {
        return Err(read_only());
    }
    let queue = queue_named(q.queue)?;
    let c = Confirm {
        title: "Purge finished jobs?",
        what: format!(
            "Delete the {} jobs of queue “{queue}” that finished longer ago than this (e.g. 7d, 12h, 30m). Nothing else is touched.",
            crate::defaults::states_text(JobState::is_terminal, "and")
        ),
        action: Href::new("/purge"),
        hidden: vec![("queue", queue.clone())],
        input: Some(("Older than", "older_than", q.older_than.unwrap_or_else(|| "7d".to_owned()))),
        button: format!("Purge {queue}"),
        back: Href::new("/queues"),
    };
    let f = frame(&ui, &headers, Nav::Queues, false);
    Ok(Page(frame::layout(&f, "Purge", |h| {
        frame::confirm(h, &ui, &c)
    })))
}

async fn purge(State(ui): State<Arc<Ui>>, Form(form): Form<Posted>) -> Result<Response, UiError> {
    if ui.read_only {
        return Err(read_only());
    }
    check_csrf(&ui, &form)?;
    let queue = form.queue.filter(|s| !s.is_empty()).ok_or_else(|| {
        UiError::BadRequest("which queue? (the form's queue field is missing)".to_owned())
    })?;
    let text = form.older_than.unwrap_or_default();
    let older_than = crate::out::parse_duration(&text)
        .map_err(|e| UiError::BadRequest(format!("invalid older than: {e}")))?;
    let n = read(&ui, move |r| r.purge(&queue, older_than)).await?;
    let to = format!("/queues?done=purge&n={n}");
    Ok((StatusCode::SEE_OTHER, [(axum::http::header::LOCATION, to)]).into_response())
}
