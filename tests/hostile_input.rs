//! Hostile names through every renderer: Prometheus exposition (re-parsed by our parser and by
//! `promtool check metrics`), the JSON report, and the human table.
//!
//! Names reach gpu-ledger from the API server (DNS-1123 for pods and namespaces, but free text in
//! pending reasons), from offline dumps (anything at all) and from DCGM labels. Whatever they hold,
//! a renderer must not let them forge a sample, a JSON field, or a table row.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpu_ledger::export::collector::Snapshot;
use gpu_ledger::export::render_snapshot;
use gpu_ledger::ledger::claims::ResourceNames;
use gpu_ledger::ledger::{
    Attribution, Evidence, Ledger, NamespaceRow, NodeRow, Owner, PodRow, PodState, UnclaimedBusy,
};
use gpu_ledger::report::{render_json, render_table};
use gpu_ledger::usage::exposition;

fn t() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

/// Values an attacker (or a broken dump) might put in a name. Never empty: an empty label value is
/// the same as an absent label in Prometheus, so it cannot round-trip by design.
fn hostile() -> Vec<String> {
    let mut v: Vec<String> = [
        "q\"uote",
        "back\\slash\\",
        "trailing\\",
        "new\nline",
        "crlf\r\nline",
        "evil\"} 1\ninjected_metric 666",
        "brace}",
        "{open",
        "nul\0byte",
        "tab\there",
        "esc\u{1b}[31mred",
        "ünïcödé-名前-🚀",
        "bidi\u{202e}txt.exe",
        "line\u{2028}sep",
        "# HELP gpu_ledger_pod_gpus forged",
        "a=\"b\",c=\"d",
        " leading and trailing ",
        "\\n literal backslash-n",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    v.push("x".repeat(16 * 1024));
    v.push("é\"\\\n".repeat(1024));
    v
}

fn pod(i: usize, ns: &str, name: &str, extra: &str) -> PodRow {
    let pending = !i.is_multiple_of(2);
    PodRow {
        namespace: ns.into(),
        pod: name.into(),
        node: Some(format!("node-{extra}")),
        state: if pending {
            PodState::Pending
        } else {
            PodState::Running
        },
        gpus: 1.0,
        resources: [("nvidia.com/gpu".to_string(), 1)].into(),
        gpus_by_resource: vec![("nvidia.com/gpu".to_string(), 1.0)],
        attribution: Attribution::Exclusive,
        utilization: Some(0.25),
        memory_used_bytes: None,
        idle: Some(false),
        idle_seconds: Some(0.0),
        terminating_seconds: None,
        stuck: false,
        pending_seconds: pending.then_some(60.0),
        notebook: Some(format!("nb-{extra}")),
        owner: Some(Owner {
            kind: "StatefulSet".into(),
            name: format!("owner-{extra}"),
        }),
        devices: vec![],
        pending_reason: pending.then(|| format!("reason {extra}")),
        evidence: Evidence {
            uid: format!("uid-{i}"),
            ..Evidence::default()
        },
    }
}

/// One pod per hostile value, the value in its namespace, name, node, notebook and owner name.
fn ledger() -> Ledger {
    let names = hostile();
    let pods: Vec<PodRow> = names
        .iter()
        .enumerate()
        .map(|(i, h)| pod(i, &format!("ns-{h}"), h, h))
        .collect();
    let nodes = names
        .iter()
        .map(|h| NodeRow {
            node: format!("node-{h}"),
            gpus_allocatable: 2.0,
            gpus_claimed: 1.0,
            gpus_free: 1.0,
            gpus_unschedulable: 0.0,
        })
        .collect();
    let namespaces = names
        .iter()
        .map(|h| NamespaceRow {
            namespace: format!("ns-{h}"),
            gpus_claimed: 1.0,
            gpus_idle: 0.0,
            gpus_pending: 0.0,
            gpu_quota: Some(4.0),
            gpu_quota_keys: BTreeMap::new(),
        })
        .collect();
    let unclaimed_busy = names
        .iter()
        .map(|h| UnclaimedBusy {
            node: Some(format!("node-{h}")),
            uuid: format!("GPU-{h}"),
            gpu_instance: Some(h.clone()),
            utilization: 0.9,
        })
        .collect();
    Ledger {
        generated_at: t(),
        pods,
        nodes,
        namespaces,
        unclaimed_busy,
        usage_available: true,
    }
}

fn exposition_text() -> String {
    render_snapshot(&Snapshot::new(ledger()), &ResourceNames::default()).expect("render")
}

#[test]
fn exposition_reparses_with_identical_label_values() {
    let text = exposition_text();
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(families.contains(&"gpu_ledger_pod_gpus"), "{families:?}");
    let parsed = exposition::parse(&text, &families, t());
    assert_eq!(
        parsed.skipped_lines, 0,
        "first skipped line: {:?}",
        parsed.first_skip
    );
    assert!(
        !text.lines().any(|l| l.starts_with("injected_metric")),
        "a label value forged a sample"
    );
    assert!(
        !parsed.series.iter().any(|s| s.name == "injected_metric"),
        "a label value forged a series"
    );
    let label_set = |family: &str, label: &str| -> Vec<String> {
        let mut v: Vec<String> = parsed
            .series
            .iter()
            .filter(|s| s.name == family)
            .filter_map(|s| s.labels.get(label).cloned())
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let expect = |prefix: &str| {
        let mut v: Vec<String> = hostile().iter().map(|h| format!("{prefix}{h}")).collect();
        v.sort();
        v
    };
    assert_eq!(label_set("gpu_ledger_pod_gpus", "pod"), expect(""));
    assert_eq!(label_set("gpu_ledger_pod_gpus", "namespace"), expect("ns-"));
    assert_eq!(label_set("gpu_ledger_pod_gpus", "node"), expect("node-"));
    let owner_family = families
        .iter()
        .find(|f| {
            parsed
                .series
                .iter()
                .any(|s| s.name == **f && s.labels.contains_key("owner_name"))
        })
        .expect("a family with owner_name");
    assert_eq!(label_set(owner_family, "owner_name"), expect("owner-"));
    assert_eq!(label_set(owner_family, "notebook"), expect("nb-"));
}

/// `promtool` is the reference parser of the text format (same code as the Prometheus scraper).
#[test]
fn exposition_passes_promtool_parser() {
    let text = exposition_text();
    let (_, report) = gpu_ledger_testkit::prometheus::promtool_check_metrics(text.as_bytes());
    // Lint findings (naming conventions) are not our concern here; parse errors are.
    assert!(
        !report.contains("parsing error") && !report.contains("error while linting"),
        "promtool could not parse the exposition: {report}"
    );
}

#[test]
fn json_is_valid_and_round_trips_names() {
    let mut out = Vec::new();
    render_json(&ledger(), &mut out).expect("render json");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
    let pods = v["pods"].as_array().expect("pods array");
    let names = hostile();
    assert_eq!(pods.len(), names.len());
    for (p, h) in pods.iter().zip(&names) {
        assert_eq!(p["pod"].as_str(), Some(h.as_str()));
        assert_eq!(p["namespace"].as_str(), Some(format!("ns-{h}").as_str()));
        assert_eq!(
            p["owner"]["name"].as_str(),
            Some(format!("owner-{h}").as_str())
        );
    }
    let text = String::from_utf8(out).expect("utf8");
    assert!(
        !text.lines().any(|l| l.starts_with("injected_metric")),
        "raw newline in JSON"
    );
}

#[test]
fn table_rows_cannot_be_forged() {
    let mut out = Vec::new();
    render_table(&ledger(), &mut out).expect("render table");
    let text = String::from_utf8(out).expect("utf8");
    for line in text.lines() {
        assert!(
            !line.starts_with("injected_metric")
                && !line.starts_with("line")
                && !line.starts_with("byte"),
            "a name broke a row: {line:?}"
        );
        assert!(
            !line.contains(['\r', '\0', '\u{1b}', '\u{202e}', '\u{2028}']),
            "raw control character in {line:?}"
        );
    }
    // One line per pod between the header and the blank line that ends the section.
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "Who holds what")
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(section.len(), hostile().len(), "{}", section.join("\n"));
    assert!(text.contains("new\\nline"), "escaped newline shown");
}
