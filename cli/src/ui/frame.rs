//! The frame every page is drawn in: the document around its content
//! (navigation, the store's name, read-only badge, self-refresh), the
//! notice an action leaves, the confirmation before a change, and the
//! error page. Like the pages, everything shown goes through
//! [`Html::text`] or [`Html::attr`] (the error page through [`escape`]).

use super::html::{escape, Href, Html};
use super::Ui;
use axum::http::StatusCode;

/// Which section a page belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Queues,
    Jobs,
    Leases,
}

/// How a page is asked for.
pub struct Frame<'a> {
    pub ui: &'a Ui,
    /// Only `<main>`'s content (a refresh), not the whole document.
    pub fragment: bool,
    pub nav: Nav,
    /// Whether the page refreshes itself.
    pub live: bool,
}

/// The document around a page's content (or the content alone).
pub fn layout(frame: &Frame<'_>, title: &str, body: impl FnOnce(&mut Html)) -> String {
    let mut h = Html::default();
    if frame.fragment {
        body(&mut h);
        return h.into_string();
    }
    h.raw("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
        .raw("<title>")
        .text(title)
        .raw(" · leasehold</title><link rel=\"stylesheet\" href=\"/static/app.css\">")
        .raw("<link rel=\"icon\" href=\"/static/icon.svg\" type=\"image/svg+xml\">")
        .raw("<script src=\"/static/app.js\" defer></script></head><body><header>")
        .raw("<a class=\"brand\" href=\"/queues\">leasehold</a><nav>");
    for (nav, href, name) in [
        (Nav::Queues, "/queues", "Queues"),
        (Nav::Jobs, "/jobs", "Jobs"),
        (Nav::Leases, "/leases", "Leases"),
    ] {
        h.raw("<a").attr("href", href);
        if nav == frame.nav {
            h.raw(" class=\"on\"");
        }
        h.raw(">").text(name).raw("</a>");
    }
    h.raw("</nav><span class=\"store\">")
        .text(&frame.ui.store_name)
        .raw("</span>");
    if frame.ui.read_only {
        h.raw("<span class=\"badge\">read-only</span>");
    }
    h.raw("</header><main id=\"main\"");
    if frame.live && frame.ui.refresh_ms > 0 {
        h.attr("data-refresh", &frame.ui.refresh_ms.to_string());
    }
    h.raw(">");
    body(&mut h);
    h.raw("</main></body></html>");
    h.into_string()
}

/// What an action did, shown once after its redirect (a fixed text per
/// code: a link cannot make the dashboard say anything else).
pub fn notice(h: &mut Html, done: Option<&str>, n: Option<u64>) {
    let text = match done {
        Some("retry") => "Retried: the job is ready again.".to_owned(),
        Some("cancel") => "Cancel requested.".to_owned(),
        Some("purge") => format!("Purged {} finished job(s).", n.unwrap_or(0)),
        Some("pause") => "Paused: no worker starts its jobs until it is resumed.".to_owned(),
        Some("resume") => "Resumed: workers start its jobs again.".to_owned(),
        _ => return,
    };
    h.raw("<p class=\"notice\" role=\"status\">")
        .text(&text)
        .raw("</p>");
}

/// A confirmation: what will happen, and the form that does it (POST,
/// with the CSRF token).
pub fn confirm(h: &mut Html, ui: &Ui, c: &Confirm<'_>) {
    h.raw("<h1>")
        .text(c.title)
        .raw("</h1><p>")
        .text(&c.what)
        .raw("</p>");
    h.raw("<form class=\"confirm\" method=\"post\"")
        .attr("action", &c.action.0)
        .raw(">");
    h.raw("<input type=\"hidden\" name=\"csrf\"")
        .attr("value", ui.guard.csrf())
        .raw(">");
    for (name, value) in &c.hidden {
        h.raw("<input type=\"hidden\"")
            .attr("name", name)
            .attr("value", value)
            .raw(">");
    }
    if let Some((label, name, value)) = &c.input {
        h.raw("<label>")
            .text(label)
            .raw(" <input required")
            .attr("name", name);
        h.attr("value", value).raw("></label> ");
    }
    h.raw("<button class=\"danger\" data-confirm>")
        .text(&c.button)
        .raw("</button> ");
    h.link(&c.back, "Back").raw("</form>");
}

/// What a confirmation page shows.
pub struct Confirm<'a> {
    pub title: &'a str,
    pub what: String,
    pub action: Href,
    pub hidden: Vec<(&'static str, String)>,
    /// A field to fill in: label, name, value.
    pub input: Option<(&'static str, &'static str, String)>,
    pub button: String,
    pub back: Href,
}

/// A page that says what went wrong; with `sign_in`, the form that takes
/// the token.
pub fn error_page(status: StatusCode, message: &str, sign_in: bool) -> String {
    let mut out = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>leasehold</title>\
         <link rel=\"stylesheet\" href=\"/static/app.css\"></head><body><main><h1>",
    );
    escape(&status.to_string(), &mut out);
    out.push_str("</h1><p class=\"error\" role=\"alert\">");
    escape(message, &mut out);
    out.push_str("</p>");
    if sign_in {
        out.push_str(
            "<form method=\"get\" action=\"/login\"><label>Token <input type=\"password\" \
             name=\"token\" required autofocus></label> <button>Sign in</button></form>",
        );
    } else {
        out.push_str("<p><a href=\"/queues\">Queues</a></p>");
    }
    out.push_str("</main></body></html>");
    out
}
