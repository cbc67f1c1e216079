//! Hostile names through every renderer: Prometheus exposition (re-parsed by our parser and by
//! `promtool check metrics`), the JSON report, and the human table; hostile dump files through the
//! offline report (nesting, size, volume of ignored metrics).
//!
//! Names reach gpu-ledger from the API server (DNS-1123 for pods and namespaces, but free text in
//! pending reasons), from offline dumps (anything at all) and from DCGM labels. Whatever they hold,
//! a renderer must not let them forge a sample, a JSON field, or a table row. Whatever a dump
//! holds, the report must refuse it early with a message naming the file and the limit.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use chrono::{DateTime, Utc};
use gpu_ledger::export::collector::Snapshot;
use gpu_ledger::export::render_snapshot;
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
            gpus_free: Some(1.0),
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
    render_snapshot(&Snapshot::new(ledger())).expect("render")
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

// --------------------------------------------------------------------------------------------
// Hostile dump files through the binary (`report --from DIR`)
// --------------------------------------------------------------------------------------------

fn homelab() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/homelab")
}

/// A copy of the homelab dumps in a temp dir, to replace one file with a hostile one.
fn homelab_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    for f in std::fs::read_dir(homelab()).expect("homelab") {
        let f = f.expect("entry").path();
        let name = f.file_name().expect("name").to_owned();
        if f.extension().is_some_and(|x| x == "json") || name == "dcgm.prom" {
            std::fs::copy(&f, dir.path().join(&name)).expect("copy");
        }
    }
    dir
}

fn report(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "--from"])
        .arg(dir)
        .args(["-o", "json"])
        .args(extra)
        .env_remove("GPU_LEDGER_MAX_DUMP_SIZE")
        .output()
        .expect("run gpu-ledger")
}

fn assert_refused(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code; stderr:\n{stderr}");
    assert!(out.stdout.is_empty(), "no report on refusal");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in stderr:\n{stderr}");
    }
}

/// 400 KB of nesting, refused as too deep, naming the file and the limit. Flow sequences are the
/// shape that took serde_norway 79 s (issue 14; quadratic: 10/20/40 KB took it 1.6/4.8/19.9 s in a
/// debug build); block sequences too. No timing assertion: docs/security.md and
/// `scripts/bench-dump-memory.sh` record how long it takes.
#[test]
fn deeply_nested_yaml_dump_is_refused_with_the_limit() {
    let dir = homelab_copy();
    std::fs::remove_file(dir.path().join("pods.json")).expect("rm");
    let flow = format!(
        "apiVersion: v1\nkind: List\nitems: {}",
        "[".repeat(400 * 1024)
    );
    let mut block = String::from("apiVersion: v1\nkind: List\nitems:\n");
    let mut depth = 0;
    while block.len() < 400 * 1024 {
        let _ = writeln!(block, "{}- a:", "  ".repeat(depth));
        depth += 1;
    }
    for yaml in [flow, block] {
        std::fs::write(dir.path().join("pods.yaml"), &yaml).expect("write");
        let out = report(dir.path(), &[]);
        assert_refused(
            &out,
            &[
                "pods.yaml",
                "YAML nested deeper than the limit of 127 levels",
            ],
        );
    }

    // The same in JSON: serde_json's recursion limit, reported the same way.
    std::fs::remove_file(dir.path().join("pods.yaml")).expect("rm");
    let json = format!(
        "{{\"kind\":\"List\",\"items\":[{}",
        "{\"a\":[".repeat(200 * 1024 / 7)
    );
    std::fs::write(dir.path().join("pods.json"), &json).expect("write");
    let out = report(dir.path(), &[]);
    assert_refused(
        &out,
        &[
            "pods.json",
            "JSON nested deeper than the limit of 127 levels",
        ],
    );
}

/// A dump over `--max-dump-size` is refused before it is parsed: exit 2, the file and the limit
/// named; the same files pass with the default limit.
#[test]
fn oversize_dumps_are_refused_with_the_limit() {
    let dir = homelab_copy();
    let ok = report(dir.path(), &[]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let pods_len = std::fs::metadata(dir.path().join("pods.json"))
        .expect("pods.json")
        .len();
    let dcgm_len = std::fs::metadata(dir.path().join("dcgm.prom"))
        .expect("dcgm.prom")
        .len();
    assert!(pods_len > 1000 && dcgm_len > 1000, "{pods_len} {dcgm_len}");
    // Every file is over 100 bytes: the first one read (pods.json) is refused.
    let out = report(dir.path(), &["--max-dump-size", "100"]);
    assert_refused(
        &out,
        &[
            "pods.json",
            "larger than the dump size limit of 100 bytes",
            "--max-dump-size",
        ],
    );
    // A limit between the kubectl dumps and the DCGM dump: the DCGM dump is refused.
    let biggest_kubectl = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| e.metadata().expect("meta").len())
        .max()
        .expect("json files");
    let mut dcgm = std::fs::read_to_string(dir.path().join("dcgm.prom")).expect("dcgm");
    while (dcgm.len() as u64) <= biggest_kubectl {
        dcgm.push_str("# padding comment, ignored by the parser\n");
    }
    std::fs::write(dir.path().join("dcgm.prom"), &dcgm).expect("write");
    let limit = biggest_kubectl.to_string();
    let out = report(dir.path(), &["--max-dump-size", &limit]);
    assert_refused(
        &out,
        &[
            "dcgm.prom",
            &format!("larger than the dump size limit of {limit} bytes"),
        ],
    );
    // The environment variable works as the flag does; units are accepted.
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "--from"])
        .arg(dir.path())
        .env("GPU_LEDGER_MAX_DUMP_SIZE", "1KiB")
        .output()
        .expect("run");
    assert_refused(&out, &["larger than the dump size limit of 1024 bytes"]);
    let out = report(dir.path(), &["--max-dump-size", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a size like"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A DCGM dump that is mostly other metrics (node_exporter-like lines, 20 MB): the few DCGM
/// series are read as from the small dump, and the rest is dropped line by line. Memory is not
/// asserted here (no timing or RSS targets in tests): `scripts/bench-dump-memory.sh` measures it
/// (docs/benchmarks.md).
#[test]
fn dump_of_mostly_ignored_metrics_reads_only_the_dcgm_series() {
    let dir = homelab_copy();
    let small = report(dir.path(), &[]);
    assert!(small.status.success());
    let mut dcgm = std::fs::read_to_string(dir.path().join("dcgm.prom")).expect("dcgm");
    let mut i = 0u64;
    while dcgm.len() < 20 << 20 {
        let _ = writeln!(
            dcgm,
            "node_cpu_seconds_total{{cpu=\"{}\",instance=\"10.0.{}.{}:9100\",job=\"node\",mode=\"idle\"}} {i}.5",
            i % 128,
            i / 65536 % 256,
            i / 256 % 256
        );
        i += 1;
    }
    std::fs::write(dir.path().join("dcgm.prom"), &dcgm).expect("write");
    let big = report(dir.path(), &[]);
    assert!(
        big.status.success(),
        "{}",
        String::from_utf8_lossy(&big.stderr)
    );
    let v = |o: &Output| -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        v["generated_at"] = serde_json::Value::Null;
        v
    };
    assert_eq!(v(&small), v(&big), "ignored metrics changed the ledger");
}
