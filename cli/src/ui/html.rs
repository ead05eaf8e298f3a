//! Building HTML that cannot inject: markup comes only from string
//! literals ([`Html::raw`] takes `&'static str`), and everything else
//! (keys, queue names, labels, payloads, error texts, numbers) goes
//! through [`Html::text`] or [`Html::attr`], which escape it. Links are
//! built by [`Href`], which percent-encodes each parameter.

use std::fmt::Display;

/// An HTML document or fragment being built.
#[derive(Default)]
pub struct Html(String);

/// `text` with `& < > " '` as entities (safe in text and in quoted
/// attribute values alike); a NUL becomes U+FFFD, as a browser would.
pub fn escape(text: &str, out: &mut String) {
    out.reserve(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\0' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
}

impl Html {
    /// Markup written in this program, never data.
    pub fn raw(&mut self, markup: &'static str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    /// Data, escaped.
    pub fn text(&mut self, text: &str) -> &mut Self {
        escape(text, &mut self.0);
        self
    }

    /// A number or other displayable value, escaped like text.
    pub fn show(&mut self, value: impl Display) -> &mut Self {
        self.text(&value.to_string())
    }

    /// ` name="value"`, the value escaped.
    pub fn attr(&mut self, name: &'static str, value: &str) -> &mut Self {
        self.0.push(' ');
        self.0.push_str(name);
        self.0.push_str("=\"");
        escape(value, &mut self.0);
        self.0.push('"');
        self
    }

    /// `<a href="...">text</a>`.
    pub fn link(&mut self, href: &Href, text: &str) -> &mut Self {
        self.raw("<a")
            .attr("href", &href.0)
            .raw(">")
            .text(text)
            .raw("</a>")
    }

    /// `<tag>text</tag>` for a literal tag such as `"td"`.
    pub fn cell(&mut self, open: &'static str, close: &'static str, text: &str) -> &mut Self {
        self.raw(open).text(text).raw(close)
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A link within the dashboard: a path and percent-encoded parameters.
#[derive(Clone)]
pub struct Href(pub String);

impl Href {
    pub fn new(path: &'static str) -> Href {
        Href(path.to_owned())
    }

    /// `/jobs/17`-style paths.
    pub fn path(prefix: &'static str, id: impl Display, suffix: &'static str) -> Href {
        Href(format!("{prefix}{id}{suffix}"))
    }

    /// Add `name=value`, the value percent-encoded (every byte outside
    /// `[A-Za-z0-9_.~-]`).
    pub fn param(mut self, name: &'static str, value: &str) -> Href {
        self.0.push(if self.0.contains('?') { '&' } else { '?' });
        self.0.push_str(name);
        self.0.push('=');
        for &b in value.as_bytes() {
            if b.is_ascii_alphanumeric() || b"_.~-".contains(&b) {
                self.0.push(b as char);
            } else {
                self.0.push_str(&format!("%{b:02X}"));
            }
        }
        self
    }
}

/// A duration for people: `850 ms`, `42 s`, `3 min 20 s`, `1 min`,
/// `5 h 4 min`, `2 d 3 h` (two units at most, a zero second one left out).
pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    let (big, big_unit, small, small_unit) = match ms {
        0..=999 => return format!("{ms} ms"),
        1_000..=59_999 => return format!("{s} s"),
        60_000..=3_599_999 => (s / 60, "min", s % 60, "s"),
        3_600_000..=86_399_999 => (s / 3600, "h", s % 3600 / 60, "min"),
        _ => (s / 86_400, "d", s % 86_400 / 3600, "h"),
    };
    match small {
        0 => format!("{big} {big_unit}"),
        _ => format!("{big} {big_unit} {small} {small_unit}"),
    }
}

/// A size for people: `812 B`, `4.0 KiB`, `16.0 MiB`.
pub fn bytes(n: u64) -> String {
    match n {
        0..=1023 => format!("{n} B"),
        1024..=1_048_575 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_escaped_in_text_and_attributes() {
        let mut h = Html::default();
        let hostile = "<script>alert('x')</script>\"&\0";
        h.raw("<p")
            .attr("title", hostile)
            .raw(">")
            .text(hostile)
            .raw("</p>");
        let out = h.into_string();
        assert!(!out.contains("<script>"), "{out}");
        assert_eq!(
            out,
            "<p title=\"&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;\u{FFFD}\">\
             &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;\u{FFFD}</p>"
        );
    }

    #[test]
    fn link_parameters_are_percent_encoded() {
        let href = Href::new("/jobs")
            .param("queue", "a&b=c/ä \"")
            .param("state", "dead");
        assert_eq!(href.0, "/jobs?queue=a%26b%3Dc%2F%C3%A4%20%22&state=dead");
    }

    #[test]
    fn durations_and_sizes_read_well() {
        let shown: Vec<String> = [0, 999, 1000, 61_000, 3_600_000 + 60_000, 2 * 86_400_000]
            .into_iter()
            .map(duration)
            .collect();
        assert_eq!(
            shown,
            ["0 ms", "999 ms", "1 s", "1 min 1 s", "1 h 1 min", "2 d"]
        );
        assert_eq!(
            [bytes(5), bytes(4096), bytes(16 << 20)],
            ["5 B", "4.0 KiB", "16.0 MiB"]
        );
    }
}
