//! Showback rendering: the table, CSV and JSON of a [`Showback`] the ledger computed
//! (`crate::ledger::showback`, docs/showback.md), and the warning a partial or unknown one
//! starts with.

use std::fmt::Write as _;

use crate::ledger::showback::{Row, Showback, Status};

/// Hours with two decimals; unknown is `?`.
fn hours_cell(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |h| format!("{h:.2}"))
}

/// "6h", "1d2h", "45m".
fn length(seconds: i64) -> String {
    super::cells::humanise_seconds(seconds)
}

/// The aligned table: one row per group, then the total, then the period, coverage and gaps.
pub fn render_table(s: &Showback, priced: bool) -> String {
    let mut header = vec![
        s.group_by.to_uppercase(),
        "GPU-HOURS".into(),
        "BUSY".into(),
        "IDLE".into(),
        "UNKNOWN".into(),
        "IDLE %".into(),
        "PEAK GPUS".into(),
    ];
    if priced {
        header.push("COST".into());
    }
    let cells = |r: &Row| {
        let mut c = vec![
            r.group.clone(),
            hours_cell(r.gpu_hours_claimed),
            hours_cell(r.gpu_hours_busy),
            hours_cell(r.gpu_hours_idle),
            hours_cell(r.gpu_hours_unknown),
            r.idle_share
                .map_or_else(|| "?".into(), super::cells::percent),
            r.peak_gpus.map_or_else(|| "?".into(), super::cells::gpus),
        ];
        if priced {
            c.push(r.cost.map_or_else(|| "?".into(), |v| format!("{v:.2}")));
        }
        c
    };
    let mut lines: Vec<Vec<String>> = vec![header];
    lines.extend(s.groups.iter().map(cells));
    lines.push(cells(&s.total));
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    if let Some(w) = warning(s) {
        out.push_str(&w);
        out.push_str("\n\n");
    }
    for l in &lines {
        let mut line = String::new();
        for (i, (cell, w)) in l.iter().zip(&widths).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            if i == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "\nperiod {} .. {}; gpu-ledger reported for {:.1}% of it ({}; --min-coverage {:.1}%)",
        s.since.to_rfc3339(),
        s.until.to_rfc3339(),
        s.coverage * 100.0,
        s.status.as_str(),
        s.min_coverage * 100.0
    );
    for g in &s.gaps {
        let _ = writeln!(
            out,
            "gap: no gpu-ledger counters from {} for {} (use unknown there, not zero)",
            g.start.to_rfc3339(),
            length(g.seconds)
        );
    }
    if !s.unpriced_models.is_empty() {
        let _ = writeln!(
            out,
            "no price for: {} (cost unknown where they held GPU-hours)",
            s.unpriced_models.join(", ")
        );
    }
    for r in &s.rejected_values {
        let _ = writeln!(out, "rejected from Prometheus (shown as ?): {r}");
    }
    out
}

/// The one-line warning a partial or unknown showback starts with (also on stderr).
pub fn warning(s: &Showback) -> Option<String> {
    match s.status {
        Status::Complete => None,
        Status::Partial => Some(format!(
            "PARTIAL: gpu-ledger reported for only {:.1}% of the period (--min-coverage {:.1}%): \
             the hours are what was counted, a lower bound; use in the gaps is unknown{}",
            s.coverage * 100.0,
            s.min_coverage * 100.0,
            retention_hint(s)
        )),
        Status::Unknown => Some(format!(
            "UNKNOWN: no gpu-ledger series in Prometheus for this period: use is unknown, not zero{}",
            retention_hint(s)
        )),
    }
}

/// A gap from the period's start suggests Prometheus no longer keeps it.
fn retention_hint(s: &Showback) -> &'static str {
    if s.gaps.first().is_some_and(|g| g.start == s.since) {
        " (nothing from the period's start: is Prometheus' retention shorter than the period? \
         a month needs 32 days; see docs/showback.md)"
    } else {
        ""
    }
}

/// A CSV field, quoted when it holds a separator, quote or line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A number for CSV; unknown is an empty field.
fn csv_number(v: Option<f64>) -> String {
    v.map(|v| format!("{}", (v * 1e6).round() / 1e6))
        .unwrap_or_default()
}

/// CSV with a header line: one line per group, then `total`. Every line carries the period, its
/// coverage and the status (`complete`, `partial`, `unknown`), so a mailed file says itself
/// when gpu-ledger was not counting.
pub fn render_csv(s: &Showback) -> String {
    let mut out = String::from(
        "group,namespaces,gpu_hours_claimed,gpu_hours_busy,gpu_hours_idle,gpu_hours_unknown,idle_share,peak_gpus,cost,since,until,coverage,status\n",
    );
    for r in s.groups.iter().chain(std::iter::once(&s.total)) {
        let fields = [
            csv_field(&r.group),
            csv_field(&r.namespaces.join(" ")),
            csv_number(r.gpu_hours_claimed),
            csv_number(r.gpu_hours_busy),
            csv_number(r.gpu_hours_idle),
            csv_number(r.gpu_hours_unknown),
            csv_number(r.idle_share),
            csv_number(r.peak_gpus),
            csv_number(r.cost),
            s.since.to_rfc3339(),
            s.until.to_rfc3339(),
            csv_number(Some(s.coverage)),
            s.status.as_str().to_string(),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// The JSON document (docs/showback.md); unknown values are `null`.
pub fn render_json(s: &Showback) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(s).map(|mut j| {
        j.push('\n');
        j
    })
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Duration, Utc};

    use super::*;
    use crate::ledger::showback::{Grouping, Inputs, ModelSeconds, Period, Prices, compute};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("valid")
            .with_timezone(&Utc)
    }

    fn period() -> Period {
        Period::new(
            at("2026-11-01T00:00:00Z"),
            at("2026-11-02T00:00:00Z"),
            at("2026-12-01T00:00:00Z"),
        )
        .expect("period")
    }

    #[test]
    fn no_data_is_unknown_and_too_little_is_partial() {
        let p = period();
        let empty = Inputs {
            resolution: Duration::minutes(5),
            ..Inputs::default()
        };
        let s = compute(
            &p,
            &Grouping::Namespace,
            &Prices::parse("A100=2").expect("price"),
            &empty,
            0.95,
        )
        .expect("compute");
        assert_eq!(s.status, Status::Unknown);
        assert_eq!(s.total.gpu_hours_claimed, None, "nothing known is not zero");
        assert_eq!(s.total.cost, None);
        assert_eq!(s.total.peak_gpus, None);
        assert!(
            render_table(&s, true).starts_with("UNKNOWN: "),
            "{}",
            render_table(&s, true)
        );
        assert!(
            render_csv(&s)
                .lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("total,,,,,,,,,") && l.ends_with(",0,unknown")),
            "{}",
            render_csv(&s)
        );
        // Reported for the second half of the day only.
        let start = p.since.timestamp();
        let half = Inputs {
            claimed: [("a".to_string(), 3600.0)].into(),
            reported: (145..=288).map(|i| start + i * 300).collect(),
            resolution: Duration::minutes(5),
            ..Inputs::default()
        };
        let s =
            compute(&p, &Grouping::Namespace, &Prices::default(), &half, 0.95).expect("compute");
        assert_eq!(s.status, Status::Partial);
        assert!((s.coverage - 0.5).abs() < 1e-12, "{}", s.coverage);
        assert_eq!(s.total.gpu_hours_claimed, Some(1.0), "what was counted");
        let table = render_table(&s, false);
        assert!(
            table.starts_with("PARTIAL: gpu-ledger reported for only 50.0%"),
            "{table}"
        );
        assert!(
            table.contains("a month needs 32 days"),
            "the gap from the start hints at retention: {table}"
        );
        assert!(
            render_csv(&s)
                .lines()
                .skip(1)
                .all(|l| l.ends_with(",partial")),
            "{}",
            render_csv(&s)
        );
        let json = render_json(&s).expect("json");
        assert!(json.contains("\"status\": \"partial\""), "{json}");
        let s = compute(&p, &Grouping::Namespace, &Prices::default(), &half, 0.5).expect("compute");
        assert_eq!(s.status, Status::Complete, "at the minimum is enough");
    }

    #[test]
    fn untrusted_values_are_unknown_and_unknown_spreads_to_sums() {
        let p = period();
        let inputs = Inputs {
            claimed: [
                ("a".to_string(), 7200.0),
                ("b".to_string(), f64::NAN),
                ("c".to_string(), -5.0),
            ]
            .into(),
            idle: [("a".to_string(), 3600.0), ("b".to_string(), 0.0)].into(),
            by_model: vec![ModelSeconds {
                namespace: "a".into(),
                model: "NVIDIA-A100-SXM4-80GB".into(),
                activity: "busy".into(),
                seconds: 1800.0,
            }],
            resolution: Duration::minutes(5),
            ..Inputs::default()
        };
        let s =
            compute(&p, &Grouping::Namespace, &Prices::default(), &inputs, 0.95).expect("compute");
        let a = s.groups.iter().find(|r| r.group == "a").expect("a");
        assert_eq!(a.gpu_hours_claimed, Some(2.0));
        assert_eq!(a.gpu_hours_busy, Some(0.5));
        assert_eq!(a.gpu_hours_unknown, Some(0.5));
        assert_eq!(a.idle_share, Some(0.5));
        let b = s.groups.iter().find(|r| r.group == "b").expect("b");
        assert_eq!(b.gpu_hours_claimed, None, "NaN is unknown, not zero");
        assert_eq!(b.gpu_hours_busy, None, "no per-model series: busy unknown");
        assert_eq!(s.total.gpu_hours_claimed, None);
        assert_eq!(s.rejected_values.len(), 2, "{:?}", s.rejected_values);
        let table = render_table(&s, false);
        assert!(table.contains("claimed GPU-seconds of b: NaN"), "{table}");
    }
    #[test]
    fn csv_quotes_and_leaves_unknown_empty() {
        let p = period();
        let inputs = Inputs {
            claimed: [("a,b".to_string(), f64::INFINITY)].into(),
            resolution: Duration::minutes(5),
            ..Inputs::default()
        };
        let s =
            compute(&p, &Grouping::Namespace, &Prices::default(), &inputs, 0.95).expect("compute");
        let csv = render_csv(&s);
        let line = csv.lines().nth(1).expect("row");
        assert!(line.starts_with("\"a,b\",\"a,b\",,,,"), "{csv}");
    }
}
