//! Rendering a [`Ledger`] for people (aligned plain text) and for programs (the JSON contract).

use std::io::{self, Write};

use crate::ledger::{Ledger, PodRow};

use super::advice::{self, Hint};
use super::cells::{Summary, gpus, has_quotas, idle_for, note, percent, queue_cells, quota_cells};

/// Pretty JSON of the ledger: the contract documented in `docs/report-json.md`.
pub fn render_json(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, ledger)?;
    writeln!(out)
}

/// The human report: summary, who holds what, nodes, namespaces, unclaimed busy GPUs, and what
/// to do about each finding.
pub fn render_table(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    render(ledger, false, out)
}

/// [`render_table`] with device UUIDs, attribution and framebuffer use per pod (`-o wide`).
pub fn render_wide(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    render(ledger, true, out)
}

/// [`render_table`] (or [`render_wide`]) of a ledger cut to one namespace (`report -n`): the
/// summary line counts that namespace's GPUs and says so; the cluster's capacity stays beside it.
pub fn render_table_in(
    ledger: &Ledger,
    wide: bool,
    namespace: Option<&str>,
    out: &mut impl Write,
) -> io::Result<()> {
    render_scoped(ledger, wide, namespace, out)
}

fn render(ledger: &Ledger, wide: bool, out: &mut impl Write) -> io::Result<()> {
    render_scoped(ledger, wide, None, out)
}

fn render_scoped(
    ledger: &Ledger,
    wide: bool,
    namespace: Option<&str>,
    out: &mut impl Write,
) -> io::Result<()> {
    writeln!(
        out,
        "GPU ledger at {}",
        ledger.generated_at.format("%Y-%m-%dT%H:%M:%SZ")
    )?;
    match namespace {
        Some(ns) => writeln!(out, "{}", Summary::namespace_line(ledger, ns))?,
        None => writeln!(out, "{}", Summary::of(ledger).line())?,
    }
    writeln!(out)?;

    writeln!(out, "Who holds what")?;
    if ledger.pods.is_empty() {
        writeln!(out, "  (no pod claims a GPU)")?;
    } else {
        pods_section(ledger, wide, out)?;
    }
    writeln!(out)?;
    nodes_section(ledger, out)?;
    writeln!(out)?;
    namespaces_section(ledger, out)?;
    if !ledger.unclaimed_busy.is_empty() {
        writeln!(out)?;
        unclaimed_section(ledger, out)?;
    }
    if !ledger.reclaim.is_empty() {
        writeln!(out)?;
        reclaim_section(ledger, out)?;
    }
    if has_quotas(ledger) {
        writeln!(out)?;
        quotas_section(ledger, out)?;
    }
    if !ledger.usage_available {
        writeln!(out)?;
        writeln!(
            out,
            "Usage unavailable: utilisation and idleness are unknown for every pod."
        )?;
    }
    todo_section(ledger, out)
}

fn sorted_pods(ledger: &Ledger) -> Vec<&PodRow> {
    let mut pods: Vec<&PodRow> = ledger.pods.iter().collect();
    pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    pods
}

fn pods_section(ledger: &Ledger, wide: bool, out: &mut impl Write) -> io::Result<()> {
    let mut headers = vec![
        ("NAMESPACE", Align::Left),
        ("POD", Align::Left),
        ("NODE", Align::Left),
        ("STATE", Align::Left),
        ("GPUS", Align::Right),
        ("UTIL", Align::Right),
        ("IDLE FOR", Align::Right),
        ("NOTEBOOK", Align::Left),
    ];
    if wide {
        headers.extend([
            ("ATTRIBUTION", Align::Left),
            ("MEMORY", Align::Right),
            ("DEVICES", Align::Left),
        ]);
    }
    headers.push(("NOTE", Align::Left));
    let mut t = Table::new(&headers);
    for p in sorted_pods(ledger) {
        let mut cells = vec![
            p.namespace.clone(),
            p.pod.clone(),
            p.node.clone().unwrap_or_else(|| "-".into()),
            p.state.as_str().into(),
            gpus(p.gpus),
            p.utilization.map_or_else(|| "-".into(), percent),
            idle_for(p),
            p.notebook.clone().unwrap_or_else(|| "-".into()),
        ];
        if wide {
            cells.push(p.attribution.as_str().into());
            cells.push(p.memory_used_bytes.map_or_else(|| "-".into(), gib));
            cells.push(devices(p));
        }
        cells.push(note(p, ledger.usage_available));
        t.row(cells);
    }
    t.write(out)
}

/// Bytes as GiB with one decimal ("2.1Gi").
fn gib(bytes: f64) -> String {
    format!("{:.1}Gi", bytes / (1024.0 * 1024.0 * 1024.0))
}

/// The pod's devices: `UUID` for a whole GPU, `UUID/GI` for a MIG GPU instance; `-` for none.
fn devices(p: &PodRow) -> String {
    if p.devices.is_empty() {
        return "-".into();
    }
    let ids: Vec<String> = p
        .devices
        .iter()
        .map(|d| match &d.gpu_instance {
            Some(gi) => format!("{}/{gi}", d.uuid),
            None => d.uuid.clone(),
        })
        .collect();
    ids.join(",")
}

/// "What to do": one entry per pod or namespace with a hint, each command on its own line.
fn todo_section(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    let mut entries: Vec<(String, Hint)> = Vec::new();
    for p in sorted_pods(ledger) {
        if let Some(h) = advice::pod_hint(p, ledger.generated_at) {
            entries.push((format!("{}/{}", p.namespace, p.pod), h));
        }
    }
    for ns in &ledger.namespaces {
        if let Some(h) = advice::namespace_hint(ns, &ledger.pods) {
            entries.push((format!("namespace {}", ns.namespace), h));
        }
    }
    if entries.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "What to do")?;
    for (subject, hint) in entries {
        writeln!(
            out,
            "  {}: {}",
            escape_cell(&subject),
            escape_cell(&hint.text)
        )?;
        for (when, command) in &hint.commands {
            if when.is_empty() {
                writeln!(out, "    {command}")?;
            } else {
                writeln!(out, "    # {}", escape_cell(when))?;
                writeln!(out, "    {command}")?;
            }
        }
        if let Some(note) = hint.note {
            writeln!(out, "    ({note})")?;
        }
    }
    Ok(())
}

/// "Who could run": per pending GPU pod, every node where it would fit, cheapest first, and
/// what that takes; or why it fits nowhere.
fn reclaim_section(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "Who could run")?;
    let mut t = Table::new(&[
        ("PENDING", Align::Left),
        ("GPUS", Align::Right),
        ("NODE", Align::Left),
        ("TAKES", Align::Left),
    ]);
    for r in &ledger.reclaim {
        let pending = format!("{}/{}", r.pending.namespace, r.pending.pod);
        if r.options.is_empty() {
            t.row(vec![
                pending,
                gpus(r.gpus),
                "-".into(),
                format!(
                    "fits nowhere: {}",
                    r.fits_nowhere.as_deref().unwrap_or("no node")
                ),
            ]);
            continue;
        }
        for (i, o) in r.options.iter().enumerate() {
            // The pod once, on its cheapest option's row.
            let (p, g) = if i == 0 {
                (pending.clone(), gpus(r.gpus))
            } else {
                (String::new(), String::new())
            };
            t.row(vec![p, g, o.node.clone(), advice::reclaim_takes(o, ledger)]);
        }
    }
    t.write(out)
}

/// "Quotas and queues": ResourceQuota GPU keys and Kueue queues against the evidence, and the
/// DRA claims no quota names.
fn quotas_section(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "Quotas and queues")?;
    if !ledger.quotas.is_empty() {
        let mut t = Table::new(&[
            ("NAMESPACE", Align::Left),
            ("RESOURCE", Align::Left),
            ("HARD", Align::Right),
            ("USED", Align::Right),
            ("BUSY", Align::Right),
            ("IDLE", Align::Right),
        ]);
        for q in &ledger.quotas {
            t.row(quota_cells(q).to_vec());
        }
        t.write(out)?;
    }
    if !ledger.queues.is_empty() {
        let mut t = Table::new(&[
            ("CLUSTER QUEUE", Align::Left),
            ("COHORT", Align::Left),
            ("FLAVOR", Align::Left),
            ("RESOURCE", Align::Left),
            ("NOMINAL", Align::Right),
            ("BORROW", Align::Right),
            ("LEND", Align::Right),
            ("ADMITTED", Align::Right),
            ("BUSY", Align::Right),
            ("IDLE", Align::Right),
            ("PENDING", Align::Right),
            ("OLDEST", Align::Right),
            ("COHORT VIEW", Align::Left),
        ]);
        for r in &ledger.queues {
            t.row(queue_cells(r).to_vec());
        }
        t.write(out)?;
    }
    if !ledger.kueue_available {
        writeln!(out, "  Kueue not found: no queue rows")?;
    }
    if !ledger.dra_claims_unquotaed.is_empty() {
        // A table, not a line: names come from the API and are escaped per cell.
        let mut t = Table::new(&[
            ("DRA CLAIM OUTSIDE EVERY QUOTA", Align::Left),
            ("DEVICE CLASSES", Align::Left),
        ]);
        for c in &ledger.dra_claims_unquotaed {
            t.row(vec![
                format!("{}/{}", c.namespace, c.claim),
                c.device_classes.join(", "),
            ]);
        }
        t.write(out)?;
    }
    Ok(())
}

fn nodes_section(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "Nodes")?;
    if ledger.nodes.is_empty() {
        writeln!(out, "  (no node offers a GPU)")?;
    } else {
        // The column appears only when some node has GPUs the scheduler cannot use.
        let unschedulable_any = ledger.nodes.iter().any(|n| n.gpus_unschedulable > 0.0);
        let mut columns = vec![
            ("NODE", Align::Left),
            ("ALLOCATABLE", Align::Right),
            ("CLAIMED", Align::Right),
            ("FREE", Align::Right),
        ];
        if unschedulable_any {
            columns.push(("UNSCHEDULABLE", Align::Right));
        }
        let mut t = Table::new(&columns);
        let (mut alloc, mut claimed, mut free, mut lost) = (0.0, 0.0, Some(0.0), 0.0);
        for n in &ledger.nodes {
            let mut row = vec![
                n.node.clone(),
                gpus(n.gpus_allocatable),
                gpus(n.gpus_claimed),
                n.gpus_free.map_or_else(|| "?".into(), gpus),
            ];
            if unschedulable_any {
                row.push(gpus(n.gpus_unschedulable));
            }
            t.row(row);
            alloc += n.gpus_allocatable;
            claimed += n.gpus_claimed;
            free = free.zip(n.gpus_free).map(|(a, b)| a + b);
            lost += n.gpus_unschedulable;
        }
        let mut total = vec![
            "TOTAL".into(),
            gpus(alloc),
            gpus(claimed),
            free.map_or_else(|| "?".into(), gpus),
        ];
        if unschedulable_any {
            total.push(gpus(lost));
        }
        t.row(total);
        t.write(out)?;
        if unschedulable_any {
            writeln!(
                out,
                "  {} GPU(s) present but not schedulable: see docs/runbooks/GpuLedgerGpusUnschedulable.md",
                gpus(lost)
            )?;
        }
    }
    Ok(())
}

/// The GPU QUOTA cell: the tightest limit, `none (!)` when GPUs are claimed without one.
pub fn quota_cell(n: &crate::ledger::NamespaceRow) -> String {
    match n.gpu_quota {
        Some(q) => gpus(q),
        None if n.gpus_claimed > 0.0 || n.gpus_pending > 0.0 => "none (!)".into(),
        None => "none".into(),
    }
}

fn namespaces_section(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "Namespaces")?;
    if ledger.namespaces.is_empty() {
        writeln!(out, "  (no namespace claims a GPU or has a GPU quota)")?;
    } else {
        let mut t = Table::new(&[
            ("NAMESPACE", Align::Left),
            ("CLAIMED", Align::Right),
            ("IDLE", Align::Right),
            ("PENDING", Align::Right),
            ("GPU QUOTA", Align::Left),
        ]);
        for n in &ledger.namespaces {
            t.row(vec![
                n.namespace.clone(),
                gpus(n.gpus_claimed),
                gpus(n.gpus_idle),
                gpus(n.gpus_pending),
                quota_cell(n),
            ]);
        }
        t.write(out)?;
    }
    Ok(())
}

fn unclaimed_section(ledger: &Ledger, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "Unclaimed busy GPUs (work outside the scheduler)")?;
    let mut t = Table::new(&[
        ("NODE", Align::Left),
        ("UUID", Align::Left),
        ("GPU INSTANCE", Align::Left),
        ("UTIL", Align::Right),
    ]);
    for u in &ledger.unclaimed_busy {
        let node = u.node.clone().unwrap_or_else(|| "-".into());
        let instance = u.gpu_instance.clone().unwrap_or_else(|| "-".into());
        t.row(vec![node, u.uuid.clone(), instance, percent(u.utilization)]);
    }
    t.write(out)
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// Columns padded to the widest cell; the last column is never padded (no trailing blanks).
struct Table {
    headers: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[(&'static str, Align)]) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; control and bidi-override characters in cells are escaped, so a newline in a
    /// pod name (possible in an offline dump) cannot forge a row or reorder the terminal line.
    fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| escape_cell(&c)).collect());
    }

    fn write(&self, out: &mut impl Write) -> io::Result<()> {
        let mut widths: Vec<usize> = self
            .headers
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let header: Vec<String> = self.headers.iter().map(|(h, _)| (*h).to_string()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            let last = cells.len().saturating_sub(1);
            for (i, ((cell, width), (_, align))) in
                cells.iter().zip(&widths).zip(&self.headers).enumerate()
            {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = width.saturating_sub(cell.chars().count());
                match align {
                    Align::Right => {
                        line.push_str(&" ".repeat(pad));
                        line.push_str(cell);
                    }
                    Align::Left if i == last => line.push_str(cell),
                    Align::Left => {
                        line.push_str(cell);
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// `c` with control characters (`\n`, `\r`, NUL, ESC...), line/paragraph separators and bidi
/// overrides written as Rust escapes (`\n`, `\u{202e}`); other text, including Unicode, as is.
pub(crate) fn escape_cell(c: &str) -> String {
    let hostile = |ch: char| {
        ch.is_control()
            || matches!(ch, '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !c.contains(hostile) {
        return c.to_string();
    }
    let mut out = String::with_capacity(c.len() + 8);
    for ch in c.chars() {
        if hostile(ch) {
            out.extend(ch.escape_default());
        } else {
            out.push(ch);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_escape_control_characters() {
        assert_eq!(escape_cell("plain-ü"), "plain-ü");
        assert_eq!(
            escape_cell("a\nb\r\0\u{1b}[31m"),
            "a\\nb\\r\\u{0}\\u{1b}[31m"
        );
        assert_eq!(escape_cell("x\u{202e}y"), "x\\u{202e}y");
        let mut t = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        t.row(vec!["evil\nforged".into(), "x".into()]);
        let mut out = Vec::new();
        t.write(&mut out).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.lines().any(|l| l.starts_with("forged")), "{text}");
    }

    #[test]
    fn table_aligns_without_trailing_blanks() {
        let mut t = Table::new(&[
            ("A", Align::Left),
            ("NUM", Align::Right),
            ("NOTE", Align::Left),
        ]);
        t.row(vec!["long-name".into(), "1".into(), String::new()]);
        t.row(vec!["x".into(), "0.43".into(), "hello".into()]);
        let mut out = Vec::new();
        t.write(&mut out).expect("write");
        let text = String::from_utf8(out).expect("utf8");
        assert_eq!(
            text,
            "A           NUM  NOTE\nlong-name     1\nx          0.43  hello\n"
        );
    }
}
