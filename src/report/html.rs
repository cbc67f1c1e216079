//! The page at `/` of `serve`, and `report -o html`: one self-contained HTML document rendered
//! from a [`Ledger`].
//!
//! The server renders the whole page (it works with JavaScript off, including sorting and
//! filtering through the query string); the inline script (`page/page.js`) then re-renders the
//! same markup from the embedded ledger JSON, sorts and filters in place, and — when served —
//! refreshes from `api/v1/ledger`. No external assets: CSS and script are inline and pinned by a
//! Content-Security-Policy with their hashes. Every string from the API is escaped here and set
//! with `textContent` by the script.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::LazyLock;

use base64::Engine;
use serde::Deserialize;

use crate::ledger::{Ledger, NodeRow, PodRow};

use super::advice::{self, Hint};
use super::cells::{Summary, gpus, idle_for, note, percent, queue_cells, quota_cells};
use super::table::quota_cell;

const CSS: &str = include_str!("page/page.css");
const SCRIPT: &str = include_str!("page/page.js");

/// `'sha256-…'` of a text, for the Content-Security-Policy.
fn csp_hash(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
    )
}

static HASHES: LazyLock<(String, String)> = LazyLock::new(|| (csp_hash(SCRIPT), csp_hash(CSS)));

/// The Content-Security-Policy of the page: nothing but its own inline style and script, and,
/// when served, requests to its own origin (the refresh).
pub fn content_security_policy(live: bool) -> String {
    let (script, style) = &*HASHES;
    let connect = if live { "'self'" } else { "'none'" };
    format!(
        "default-src 'none'; script-src {script}; style-src {style}; connect-src {connect}; img-src 'self'; base-uri 'none'; form-action 'self'"
    )
}

/// How the viewer asked to see the pods (the page's query string).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct View {
    /// Only this namespace (empty or absent: all).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Only this node.
    #[serde(default)]
    pub node: Option<String>,
    /// Sort key: one of [`SORT_KEYS`]; default `namespace`.
    #[serde(default)]
    pub sort: Option<String>,
    /// `desc` for descending.
    #[serde(default)]
    pub dir: Option<String>,
}

/// Sortable pod columns: (key, header, numeric).
pub const SORT_KEYS: [(&str, &str, bool); 8] = [
    ("namespace", "Namespace", false),
    ("pod", "Pod", false),
    ("node", "Node", false),
    ("state", "State", false),
    ("gpus", "GPUs", true),
    ("util", "Utilisation", true),
    ("idle", "Idle for", true),
    ("notebook", "Notebook", false),
];

impl View {
    fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref().filter(|s| !s.is_empty())
    }
    fn node(&self) -> Option<&str> {
        self.node.as_deref().filter(|s| !s.is_empty())
    }
    fn sort_key(&self) -> &str {
        let key = self.sort.as_deref().unwrap_or("namespace");
        if SORT_KEYS.iter().any(|(k, _, _)| *k == key) {
            key
        } else {
            "namespace"
        }
    }
    fn descending(&self) -> bool {
        self.dir.as_deref() == Some("desc")
    }
    fn shows_pod(&self, p: &PodRow) -> bool {
        self.namespace().is_none_or(|ns| p.namespace == ns)
            && self.node().is_none_or(|n| p.node.as_deref() == Some(n))
    }
}

/// What the page is for.
#[derive(Debug, Clone, Default)]
pub struct PageOptions {
    /// Served by `serve`: refreshes itself and links to the API; else a static file.
    pub live: bool,
    pub view: View,
    /// Said under the header, one paragraph each (an optional API not found yet).
    pub notes: Vec<String>,
}

/// The page `serve` shows before its first snapshot: what it waits for (`state`) and why, never
/// an empty ledger that reads like a cluster without GPU pods. It reloads itself (a meta
/// refresh: no script, so the Content-Security-Policy needs no hash for it).
pub fn render_waiting_page(state: &str, reason: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\"><title>gpu-ledger: {state}</title></head>\
         <body><h1>gpu-ledger: {state}</h1><p>No ledger yet: {reason}.</p>\
         <p>This page reloads every 5 s.</p></body></html>\n",
        state = escape(state),
        reason = escape(reason),
    )
}

/// HTML-escapes text for element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The ledger JSON for a `<script type="application/json">` block: `<`, `>` and `&` are written
/// as `\u003c`… (valid JSON, and no `</script>` or `<!--` can end the block early).
fn embedded_json(ledger: &Ledger) -> String {
    let json = serde_json::to_string(ledger).unwrap_or_else(|_| "null".into());
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// A number with exactly two decimals, halves away from zero (as the script writes it).
fn fixed2(x: f64) -> String {
    // Saturating cast, and `unsigned_abs`: `i64::MIN.abs()` overflows.
    let h = (x * 100.0).round() as i64;
    let sign = if h < 0 { "-" } else { "" };
    let a = h.unsigned_abs();
    format!("{sign}{}.{:02}", a / 100, a % 100)
}

/// The value a pod sorts by under `key`; unknown numbers sort below every known one.
enum SortValue<'a> {
    Text(&'a str),
    Number(f64),
}

fn sort_value<'a>(p: &'a PodRow, key: &str) -> SortValue<'a> {
    match key {
        "pod" => SortValue::Text(&p.pod),
        "node" => SortValue::Text(p.node.as_deref().unwrap_or("")),
        "state" => SortValue::Text(p.state.as_str()),
        "notebook" => SortValue::Text(p.notebook.as_deref().unwrap_or("")),
        "gpus" => SortValue::Number(p.gpus),
        "util" => SortValue::Number(p.utilization.unwrap_or(f64::NEG_INFINITY)),
        "idle" => SortValue::Number(match (p.idle, p.idle_seconds) {
            (Some(false), _) => 0.0,
            (_, Some(s)) => s,
            (_, None) => f64::NEG_INFINITY,
        }),
        _ => SortValue::Text(&p.namespace),
    }
}

fn compare(a: &PodRow, b: &PodRow, key: &str, descending: bool) -> Ordering {
    let primary = match (sort_value(a, key), sort_value(b, key)) {
        (SortValue::Text(x), SortValue::Text(y)) => x.cmp(y),
        (SortValue::Number(x), SortValue::Number(y)) => x.total_cmp(&y),
        _ => Ordering::Equal,
    };
    let primary = if descending {
        primary.reverse()
    } else {
        primary
    };
    primary.then_with(|| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)))
}

/// GPU equivalents in use on a node (each pod's GPUs times its utilisation, where known), and
/// GPU equivalents held with unknown utilisation.
fn node_use(ledger: &Ledger, node: &str) -> (f64, f64) {
    let (mut used, mut unknown) = (0.0, 0.0);
    for p in ledger
        .pods
        .iter()
        .filter(|p| p.state.holds() && p.node.as_deref() == Some(node))
    {
        match p.utilization {
            Some(u) => used += p.gpus * u,
            None => unknown += p.gpus,
        }
    }
    (used, unknown)
}

/// The whole page.
pub fn render_page(ledger: &Ledger, options: &PageOptions) -> String {
    let mut h = String::with_capacity(16 * 1024 + ledger.pods.len() * 1024);
    let view = &options.view;
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{}\">\n\
         <title>gpu-ledger</title>\n<style>{CSS}</style>\n</head>\n",
        escape(&content_security_policy(options.live))
    );
    let _ = writeln!(
        h,
        "<body data-live=\"{}\">\n<header>\n<h1>gpu-ledger</h1>",
        options.live
    );
    summary(&mut h, ledger);
    let stamp = ledger.generated_at;
    let _ = writeln!(
        h,
        "<p class=\"meta\">Data as of <time id=\"generated-at\" datetime=\"{}\">{}</time> <span id=\"age\"></span> <span id=\"status\" role=\"status\"></span></p>",
        stamp.format("%Y-%m-%dT%H:%M:%SZ"),
        stamp.format("%Y-%m-%d %H:%M:%S UTC")
    );
    let _ = writeln!(
        h,
        "<p id=\"usage-warning\" class=\"warn\"{}>Usage unavailable: utilisation and idleness are unknown for every pod.</p>",
        if ledger.usage_available {
            " hidden"
        } else {
            ""
        }
    );
    for note in &options.notes {
        let _ = writeln!(
            h,
            "<p class=\"warn\" data-note=\"api\">{}</p>",
            escape(note)
        );
    }
    filters(&mut h, ledger, options);
    h.push_str("</header>\n<main>\n");
    pods_table(&mut h, ledger, view, options.live);
    nodes(&mut h, ledger, view);
    namespaces_table(&mut h, ledger, view);
    unclaimed_table(&mut h, ledger, view);
    if options.live {
        history(&mut h);
    }
    reclaim_table(&mut h, ledger, view);
    quotas_tables(&mut h, ledger, view);
    let _ = writeln!(
        h,
        "</main>\n<footer>gpu-ledger {} ({}){}</footer>",
        env!("CARGO_PKG_VERSION"),
        env!("GPU_LEDGER_REVISION"),
        if options.live {
            " · <a href=\"api/v1/ledger\">JSON</a> · <a href=\"metrics\">metrics</a>"
        } else {
            " · written by <code>gpu-ledger report -o html</code>"
        }
    );
    let _ = writeln!(
        h,
        "<script type=\"application/json\" id=\"ledger-data\">{}</script>\n<script>{SCRIPT}</script>\n</body>\n</html>",
        embedded_json(ledger)
    );
    h
}

/// The history chart's place: the script fills it from `/api/v1/history` (claimed, busy and
/// idle over 24 h and 7 d, for the namespace filter or the cluster), or says why it cannot.
fn history(h: &mut String) {
    h.push_str("<section>\n<h2>History</h2>\n<p class=\"legend\">GPUs held over time (the namespace filter applies):<span class=\"swatch claimed\"></span>claimed<span class=\"swatch used\"></span>busy<span class=\"swatch idle\"></span>idle</p>\n<div id=\"history\" data-state=\"none\"><p id=\"history-note\" class=\"note\">The history chart needs JavaScript.</p></div>\n</section>\n");
}

fn summary(h: &mut String, ledger: &Ledger) {
    h.push_str("<ul id=\"summary\" aria-label=\"GPUs in the cluster\">");
    for (n, label) in Summary::of(ledger).parts() {
        let _ = write!(h, "<li><b>{n}</b>{label}</li>");
    }
    h.push_str("</ul>\n");
}

fn options_of<'a>(h: &mut String, values: impl Iterator<Item = &'a str>, selected: Option<&str>) {
    let set: BTreeSet<&str> = values.filter(|v| !v.is_empty()).collect();
    h.push_str("<option value=\"\">all</option>");
    for v in set {
        let sel = if Some(v) == selected { " selected" } else { "" };
        let _ = write!(h, "<option{sel}>{}</option>", escape(v));
    }
}

fn filters(h: &mut String, ledger: &Ledger, options: &PageOptions) {
    let view = &options.view;
    // Without a server to answer the query string, the form only works through the script.
    let hidden = if options.live { "" } else { " hidden" };
    let _ = write!(
        h,
        "<form id=\"filters\" method=\"get\"{hidden}>\n<label>Namespace <select name=\"namespace\">"
    );
    let namespaces = ledger
        .namespaces
        .iter()
        .map(|n| n.namespace.as_str())
        .chain(ledger.pods.iter().map(|p| p.namespace.as_str()));
    options_of(h, namespaces, view.namespace());
    h.push_str("</select></label>\n<label>Node <select name=\"node\">");
    let nodes = ledger
        .nodes
        .iter()
        .map(|n| n.node.as_str())
        .chain(ledger.pods.iter().filter_map(|p| p.node.as_deref()));
    options_of(h, nodes, view.node());
    let _ = writeln!(
        h,
        "</select></label>\n<input type=\"hidden\" name=\"sort\" value=\"{}\"><input type=\"hidden\" name=\"dir\" value=\"{}\">\n<button type=\"submit\" id=\"apply\">Apply</button>\n</form>",
        escape(view.sort_key()),
        if view.descending() { "desc" } else { "asc" }
    );
}

/// `?…` of a sort link: the current filters, this key, and the direction a click selects.
fn sort_href(view: &View, key: &str) -> String {
    let dir = if view.sort_key() == key && !view.descending() {
        "desc"
    } else {
        "asc"
    };
    let mut q = format!("?sort={key}&dir={dir}");
    for (name, value) in [("namespace", view.namespace()), ("node", view.node())] {
        if let Some(v) = value {
            q.push('&');
            q.push_str(name);
            q.push('=');
            q.push_str(&percent_encode(v));
        }
    }
    q
}

/// Percent-encodes a query value (everything but unreserved characters).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn pods_table(h: &mut String, ledger: &Ledger, view: &View, live: bool) {
    h.push_str("<section>\n<h2>Who holds which GPU</h2>\n<table id=\"pods\">\n<thead><tr>");
    let (key, desc) = (view.sort_key(), view.descending());
    for (k, label, numeric) in SORT_KEYS {
        let class = if numeric { " class=\"num\"" } else { "" };
        let sort = if k == key {
            if desc {
                " aria-sort=\"descending\""
            } else {
                " aria-sort=\"ascending\""
            }
        } else {
            ""
        };
        let _ = write!(
            h,
            "<th data-key=\"{k}\"{class}{sort}><a href=\"{}\">{label}</a></th>",
            escape(&sort_href(view, k))
        );
    }
    h.push_str("<th>What to do</th></tr></thead>\n<tbody>\n");
    let mut pods: Vec<&PodRow> = ledger.pods.iter().filter(|p| view.shows_pod(p)).collect();
    pods.sort_by(|a, b| compare(a, b, key, desc));
    for p in &pods {
        pod_row(h, p, ledger);
    }
    h.push_str("</tbody>\n</table>\n");
    let _ = writeln!(
        h,
        "<p class=\"empty\" id=\"pods-empty\"{}>No pod claims a GPU{}.</p>\n</section>",
        if pods.is_empty() { "" } else { " hidden" },
        if live { " here" } else { "" }
    );
}

fn pod_row(h: &mut String, p: &PodRow, ledger: &Ledger) {
    let mut class = format!("pod state-{}", p.state.as_str());
    if p.idle == Some(true) {
        class.push_str(" idle");
    }
    if p.stuck {
        class.push_str(" stuck");
    }
    let dash = |s: Option<&str>| escape(s.unwrap_or("-"));
    let _ = write!(
        h,
        "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"state\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num idle-for\">{}</td><td>{}</td><td class=\"todo\">",
        escape(&p.namespace),
        escape(&p.pod),
        dash(p.node.as_deref()),
        p.state.as_str(),
        gpus(p.gpus),
        p.utilization.map_or_else(|| "-".into(), percent),
        escape(&idle_for(p)),
        dash(p.notebook.as_deref()),
    );
    if let Some(hint) = advice::pod_hint(p, ledger.generated_at) {
        hint_html(h, &hint);
    } else {
        let n = note(p, ledger.usage_available);
        if !n.is_empty() {
            let _ = write!(h, "<span class=\"note\">{}</span>", escape(&n));
        }
    }
    h.push_str("</td></tr>\n");
}

fn hint_html(h: &mut String, hint: &Hint) {
    let _ = write!(h, "<span class=\"hint\">{}</span>", escape(&hint.text));
    for (when, command) in &hint.commands {
        h.push_str("<div class=\"cmd\">");
        if !when.is_empty() {
            let _ = write!(h, "<span class=\"when\">{}:</span>", escape(when));
        }
        let _ = write!(h, "<code>{}</code></div>", escape(command));
    }
    if let Some(note) = hint.note {
        let _ = write!(h, "<div class=\"cmd note\">{}</div>", escape(note));
    }
}

fn nodes(h: &mut String, ledger: &Ledger, view: &View) {
    h.push_str("<section>\n<h2>Nodes</h2>\n<p class=\"legend\">GPUs per node:<span class=\"swatch alloc\"></span>allocatable<span class=\"swatch claimed\"></span>claimed<span class=\"swatch used\"></span>in use (claimed × utilisation)</p>\n<div id=\"nodes\">\n");
    let shown: Vec<&NodeRow> = ledger
        .nodes
        .iter()
        .filter(|n| view.node().is_none_or(|v| n.node == v))
        .collect();
    for n in &shown {
        let (used, unknown) = node_use(ledger, &n.node);
        let scale = n
            .gpus_allocatable
            .max(n.gpus_claimed)
            .max(f64::MIN_POSITIVE);
        let width = |x: f64| fixed2((x / scale * 100.0).clamp(0.0, 100.0));
        let mut nums = format!(
            "{} allocatable · {} claimed · {} in use · {} free",
            gpus(n.gpus_allocatable),
            gpus(n.gpus_claimed),
            gpus(used),
            n.gpus_free.map_or_else(|| "?".into(), gpus)
        );
        if unknown > 0.0 {
            let _ = write!(nums, " · {} unknown", gpus(unknown));
        }
        if n.gpus_unschedulable > 0.0 {
            let _ = write!(nums, " · {} not schedulable", gpus(n.gpus_unschedulable));
        }
        let _ = writeln!(
            h,
            "<div class=\"node\"><div class=\"node-name\">{}</div><svg class=\"bar\" viewBox=\"0 0 100 10\" preserveAspectRatio=\"none\" aria-hidden=\"true\"><rect class=\"alloc\" x=\"0\" y=\"0\" height=\"10\" width=\"{}\"></rect><rect class=\"claimed\" x=\"0\" y=\"0\" height=\"10\" width=\"{}\"></rect><rect class=\"used\" x=\"0\" y=\"2.5\" height=\"5\" width=\"{}\"></rect></svg><div class=\"node-nums\">{nums}</div></div>",
            escape(&n.node),
            width(n.gpus_allocatable),
            width(n.gpus_claimed),
            width(used),
        );
    }
    let _ = writeln!(
        h,
        "</div>\n<p class=\"empty\" id=\"nodes-empty\"{}>No node offers a GPU.</p>\n</section>",
        if shown.is_empty() { "" } else { " hidden" }
    );
}

fn namespaces_table(h: &mut String, ledger: &Ledger, view: &View) {
    h.push_str("<section>\n<h2>Namespaces</h2>\n<table id=\"namespaces\">\n<thead><tr><th>Namespace</th><th class=\"num\">Claimed</th><th class=\"num\">Idle</th><th class=\"num\">Pending</th><th>GPU quota</th><th>What to do</th></tr></thead>\n<tbody>\n");
    let mut any = false;
    for n in ledger
        .namespaces
        .iter()
        .filter(|n| view.namespace().is_none_or(|v| n.namespace == v))
    {
        any = true;
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"todo\">",
            escape(&n.namespace),
            gpus(n.gpus_claimed),
            gpus(n.gpus_idle),
            gpus(n.gpus_pending),
            escape(&quota_cell(n)),
        );
        if let Some(hint) = advice::namespace_hint(n, &ledger.pods) {
            hint_html(h, &hint);
        }
        h.push_str("</td></tr>\n");
    }
    let _ = writeln!(
        h,
        "</tbody>\n</table>\n<p class=\"empty\" id=\"namespaces-empty\"{}>No namespace claims a GPU or has a GPU quota.</p>\n</section>",
        if any { " hidden" } else { "" }
    );
}

fn unclaimed_table(h: &mut String, ledger: &Ledger, view: &View) {
    h.push_str("<section>\n<h2>Unclaimed busy devices</h2>\n<table id=\"unclaimed\">\n<thead><tr><th>Node</th><th>UUID</th><th>GPU instance</th><th class=\"num\">Utilisation</th></tr></thead>\n<tbody>\n");
    let mut any = false;
    for u in ledger
        .unclaimed_busy
        .iter()
        .filter(|u| view.node().is_none_or(|v| u.node.as_deref() == Some(v)))
    {
        any = true;
        let node = u.node.as_deref().unwrap_or("-");
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            escape(node),
            escape(&u.uuid),
            escape(u.gpu_instance.as_deref().unwrap_or("-")),
            percent(u.utilization)
        );
    }
    let _ = writeln!(
        h,
        "</tbody>\n</table>\n<p class=\"empty\" id=\"unclaimed-empty\"{}>No busy device outside the scheduler.</p>\n</section>",
        if any { " hidden" } else { "" }
    );
}

/// "Who could run": per pending GPU pod, every node where it would fit, cheapest first (the
/// page's script renders the same cells from `reclaim` of the embedded JSON).
fn reclaim_table(h: &mut String, ledger: &Ledger, view: &View) {
    h.push_str("<section>\n<h2>Who could run</h2>\n<table id=\"reclaim\">\n<thead><tr><th>Pending pod</th><th class=\"num\">GPUs</th><th>Node</th><th>Takes</th></tr></thead>\n<tbody>\n");
    let mut any = false;
    for r in ledger
        .reclaim
        .iter()
        .filter(|r| view.namespace().is_none_or(|v| r.pending.namespace == v))
    {
        any = true;
        let pending = format!("{}/{}", r.pending.namespace, r.pending.pod);
        if r.options.is_empty() {
            let why = format!(
                "fits nowhere: {}",
                r.fits_nowhere.as_deref().unwrap_or("no node")
            );
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"num\">{}</td><td>-</td><td>{}</td></tr>",
                escape(&pending),
                gpus(r.gpus),
                escape(&why)
            );
        }
        for o in &r.options {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                escape(&pending),
                gpus(r.gpus),
                escape(&o.node),
                escape(&advice::reclaim_takes(o, ledger))
            );
        }
    }
    let _ = writeln!(
        h,
        "</tbody>\n</table>\n<p class=\"empty\" id=\"reclaim-empty\"{}>No GPU pod is pending.</p>\n</section>",
        if any { " hidden" } else { "" }
    );
}

/// "Quotas and queues": ResourceQuota rows (filtered by the namespace view), Kueue queue rows
/// (cluster-scoped: never filtered) and DRA claims outside every quota; the page's script renders
/// the same cells from `quotas`, `queues` and `dra_claims_unquotaed` of the embedded JSON.
fn quotas_tables(h: &mut String, ledger: &Ledger, view: &View) {
    h.push_str("<section>\n<h2>Quotas and queues</h2>\n<table id=\"quotas\">\n<thead><tr><th>Namespace</th><th>Resource</th><th class=\"num\">Hard</th><th class=\"num\">Used</th><th class=\"num\">Busy</th><th class=\"num\">Idle</th></tr></thead>\n<tbody>\n");
    let mut any = false;
    for q in ledger
        .quotas
        .iter()
        .filter(|q| view.namespace().is_none_or(|v| q.namespace == v))
    {
        any = true;
        cells_row(h, &quota_cells(q), 2..6);
    }
    let _ = writeln!(
        h,
        "</tbody>\n</table>\n<p class=\"empty\" id=\"quotas-empty\"{}>No ResourceQuota names a GPU resource.</p>",
        if any { " hidden" } else { "" }
    );
    h.push_str("<table id=\"queues\">\n<thead><tr><th>ClusterQueue</th><th>Cohort</th><th>Flavor</th><th>Resource</th><th class=\"num\">Nominal</th><th class=\"num\">Borrow limit</th><th class=\"num\">Lend limit</th><th class=\"num\">Admitted</th><th class=\"num\">Busy</th><th class=\"num\">Idle</th><th class=\"num\">Pending</th><th class=\"num\">Oldest</th><th>Cohort view</th></tr></thead>\n<tbody>\n");
    for r in &ledger.queues {
        cells_row(h, &queue_cells(r), 4..12);
    }
    let _ = writeln!(
        h,
        "</tbody>\n</table>\n<p class=\"empty\" id=\"queues-empty\"{}>{}</p>",
        if ledger.queues.is_empty() {
            ""
        } else {
            " hidden"
        },
        if ledger.kueue_available {
            "No Kueue ClusterQueue has a GPU quota."
        } else {
            "Kueue not found: no queue rows."
        }
    );
    h.push_str("<table id=\"unquotaed\">\n<thead><tr><th>DRA claim outside every quota</th><th>Device classes</th></tr></thead>\n<tbody>\n");
    let mut any = false;
    for c in ledger
        .dra_claims_unquotaed
        .iter()
        .filter(|c| view.namespace().is_none_or(|v| c.namespace == v))
    {
        any = true;
        cells_row(
            h,
            &[
                format!("{}/{}", c.namespace, c.claim),
                c.device_classes.join(", "),
            ],
            0..0,
        );
    }
    let _ = writeln!(
        h,
        "</tbody>\n</table>\n<p class=\"empty\" id=\"unquotaed-empty\"{}>Every DRA GPU claim is under a quota.</p>\n</section>",
        if any { " hidden" } else { "" }
    );
}

/// One table row of escaped cells; the cells in `numeric` are numbers (right-aligned).
fn cells_row(h: &mut String, cells: &[String], numeric: std::ops::Range<usize>) {
    h.push_str("<tr>");
    for (i, c) in cells.iter().enumerate() {
        let class = if numeric.contains(&i) {
            " class=\"num\""
        } else {
            ""
        };
        let _ = write!(h, "<td{class}>{}</td>", escape(c));
    }
    h.push_str("</tr>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }

    #[test]
    fn embedded_json_cannot_close_its_script_block() {
        let mut l = Ledger::empty(chrono::DateTime::UNIX_EPOCH);
        l.unclaimed_busy.push(crate::ledger::UnclaimedBusy {
            node: Some("</script><script>alert(1)</script><!--".into()),
            uuid: "a&b".into(),
            gpu_instance: None,
            utilization: 0.5,
        });
        let page = render_page(&l, &PageOptions::default());
        let data_start = page.find("id=\"ledger-data\">").expect("data block");
        let data = &page[data_start..];
        let end = data.find("</script>").expect("end");
        let block = &data["id=\"ledger-data\">".len()..end];
        assert!(!block.contains('<'), "{block}");
        let v: serde_json::Value = serde_json::from_str(block).expect("still JSON");
        assert_eq!(
            v["unclaimed_busy"][0]["node"],
            "</script><script>alert(1)</script><!--"
        );
        assert!(
            !page.contains("<script>alert(1)"),
            "escaped in the table too"
        );
    }

    #[test]
    fn csp_pins_the_inline_assets() {
        let csp = content_security_policy(true);
        assert!(csp.contains(&csp_hash(SCRIPT)) && csp.contains(&csp_hash(CSS)));
        assert!(csp.starts_with("default-src 'none'"));
        assert!(content_security_policy(false).contains("connect-src 'none'"));
        // The known SHA-256 of the empty string, base64.
        assert_eq!(
            csp_hash(""),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
    }

    #[test]
    fn numbers_in_attributes_have_two_decimals() {
        assert_eq!(fixed2(50.0), "50.00");
        assert_eq!(fixed2(33.333), "33.33");
        assert_eq!(fixed2(0.125), "0.13");
    }
}
