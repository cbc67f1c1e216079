//! Culling annotations that are present but not understood fail closed, end to end through the
//! binary: `gpu-ledger report --from <homelab copy> --cull-dry-run` on the homelab dumps with a
//! malformed `gpu-ledger.io/snooze-until` (or `gpu-ledger.io/stopped-at`) on the idle notebook
//! `team-ml/alice-nb` lists no stop, and says why (`invalid_annotation`) in the table, the JSON
//! and the metrics. Without the annotation, or with a well-formed one in the past, alice-nb is
//! the one stop (so the fixture can show a stop at all). With `--cull-notice` alice-nb gets a
//! notice first, and a notebook under a notice shows when it stops and how to snooze.

use std::path::Path;
use std::process::{Command, Output};

const HOMELAB_FILES: [&str; 6] = [
    "pods.json",
    "nodes.json",
    "notebooks.json",
    "quotas.json",
    "statefulsets.json",
    "dcgm.prom",
];

/// The homelab dumps in a temporary directory, with `annotations` added to Notebook alice-nb.
fn homelab_with(annotations: &[(&str, &str)]) -> tempfile::TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/homelab");
    let dir = tempfile::tempdir().expect("temp dir");
    for f in HOMELAB_FILES {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy homelab dump");
    }
    let path = dir.path().join("notebooks.json");
    let mut list: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read notebooks"))
            .expect("notebooks JSON");
    let alice = list["items"]
        .as_array_mut()
        .expect("items")
        .iter_mut()
        .find(|nb| nb["metadata"]["name"] == "alice-nb")
        .expect("alice-nb in the homelab");
    for (k, v) in annotations {
        alice["metadata"]["annotations"][*k] = serde_json::Value::String((*v).to_string());
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&list).expect("JSON")).expect("write");
    dir
}

fn report(dir: &Path, extra: &[&str]) -> String {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .arg("report")
        .arg("--from")
        .arg(dir)
        .arg("--cull-dry-run")
        .args(extra)
        .output()
        .expect("run gpu-ledger");
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8 stdout")
}

fn stops(table: &str) -> Vec<&str> {
    table
        .lines()
        .filter(|l| l.trim_start().starts_with("STOP "))
        .collect()
}

/// alice-nb's skip reason in the JSON plan, and how many stops the plan makes.
fn alice_in_json(dir: &Path) -> (Option<String>, usize) {
    let v: serde_json::Value =
        serde_json::from_str(&report(dir, &["-o", "json"])).expect("one JSON document");
    let cull = &v["cull"];
    let reason = cull["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .find(|s| s["pod"] == "alice-nb-0")
        .and_then(|s| s["reason"].as_str())
        .map(str::to_string);
    (
        reason,
        cull["would_stop"].as_array().expect("would_stop").len(),
    )
}

#[test]
fn a_malformed_snooze_is_no_licence_to_stop() {
    // The control: a snooze that has run out does not hold alice-nb back.
    let past = homelab_with(&[("gpu-ledger.io/snooze-until", "2026-11-01T00:00:00Z")]);
    let table = report(past.path(), &[]);
    assert_eq!(stops(&table).len(), 1, "{table}");
    assert!(stops(&table)[0].contains("team-ml/alice-nb"), "{table}");

    // A date alone, a time without a zone, prose: present but not understood.
    for value in ["2026-12-24", "2026-12-24T10:00:00", "next week"] {
        let dir = homelab_with(&[("gpu-ledger.io/snooze-until", value)]);
        let table = report(dir.path(), &[]);
        assert!(
            stops(&table).is_empty(),
            "snooze-until={value:?} must hold alice-nb back:\n{table}"
        );
        assert!(
            table.contains("invalid_annotation=1"),
            "the skip says why ({value:?}):\n{table}"
        );
        assert_eq!(
            alice_in_json(dir.path()),
            (Some("invalid_annotation".to_string()), 0),
            "{value:?}"
        );
        let metrics = report(dir.path(), &["-o", "metrics"]);
        assert!(
            metrics.contains("gpu_ledger_cull_skips_total{reason=\"invalid_annotation\"} 1"),
            "{value:?}: {metrics}"
        );
        assert!(
            metrics.contains("\ngpu_ledger_cull_would_stop 0\n"),
            "{metrics}"
        );
    }
}

#[test]
fn a_malformed_stopped_at_holds_back_too() {
    // Our own history annotation decides the restart grace: unreadable means hold back.
    let dir = homelab_with(&[("gpu-ledger.io/stopped-at", "2026-11-28 08:30")]);
    let table = report(dir.path(), &[]);
    assert!(stops(&table).is_empty(), "{table}");
    assert_eq!(
        alice_in_json(dir.path()),
        (Some("invalid_annotation".to_string()), 0)
    );
    // Well-formed and long ago: no restart grace, alice-nb is stopped.
    let old = homelab_with(&[("gpu-ledger.io/stopped-at", "2026-08-01T00:00:00Z")]);
    assert_eq!(stops(&report(old.path(), &[])).len(), 1);
}

#[test]
fn a_notice_shows_when_the_stop_comes_and_how_to_snooze() {
    // With --cull-notice, the idle alice-nb first gets a notice, not a stop.
    let plain = homelab_with(&[]);
    let table = report(plain.path(), &["--cull-notice", "30m"]);
    assert!(stops(&table).is_empty(), "a notice comes first:\n{table}");
    assert!(
        table
            .lines()
            .any(|l| l.trim_start().starts_with("NOTICE  team-ml/alice-nb")
                && l.contains("unless used or snoozed")),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_str(&report(
        plain.path(),
        &["--cull-notice", "30m", "-o", "json"],
    ))
    .expect("JSON");
    let notices = v["cull"]["notices"].as_array().expect("notices");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["kind"], "schedule");
    assert_eq!(notices[0]["notebook"], "alice-nb");

    // Under a notice that has not run out: no stop, no second notice, and the table says when
    // the stop comes with the exact command to snooze (a day past it).
    let noticed = homelab_with(&[("gpu-ledger.io/stop-scheduled-at", "2099-01-01T09:00:00Z")]);
    let table = report(noticed.path(), &["--cull-notice", "30m"]);
    assert!(stops(&table).is_empty(), "{table}");
    assert!(table.contains("notice_pending=1"), "{table}");
    assert!(!table.contains("NOTICE  "), "{table}");
    assert!(
        table.contains("stops at 2099-01-01T09:00:00Z unless used or snoozed"),
        "{table}"
    );
    assert!(
        table.contains(
            "kubectl annotate --overwrite notebook -n team-ml -- alice-nb gpu-ledger.io/snooze-until=2099-01-02T09:00:00Z"
        ),
        "{table}"
    );
    let html = report(noticed.path(), &["--cull-notice", "30m", "-o", "html"]);
    assert!(
        html.contains("stops at 2099-01-01T09:00:00Z unless used or snoozed"),
        "the page shows it too"
    );
    // Without --cull-notice the annotation delays nothing (and is still shown).
    let table = report(noticed.path(), &[]);
    assert_eq!(stops(&table).len(), 1, "{table}");
}
