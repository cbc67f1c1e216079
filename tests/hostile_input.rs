//! Hostile names through every renderer: Prometheus exposition (re-parsed by our parser and by
//! `promtool check metrics`), the JSON report, and the human table; hostile dump files through the
//! offline report (nesting, size, volume of ignored metrics).
//!
//! Names reach gpu-ledger from the API server (DNS-1123 for pods and namespaces, but free text in
//! pending reasons), from offline dumps (anything at all) and from DCGM labels. Whatever they hold,
//! a renderer must not let them forge a sample, a JSON field, or a table row. Whatever a dump
//! holds, the report must refuse it early with a message naming the file and the limit.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpu_ledger::export::render_snapshot;
use gpu_ledger::ledger::accounting::Snapshot;
use gpu_ledger::ledger::{
    Attribution, Ledger, NamespaceRow, NodeRow, PodRow, PodState, UnclaimedBusy,
};
use gpu_ledger::report::html::{PageOptions, render_page};
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
    let state = if pending {
        PodState::Pending
    } else {
        PodState::Running
    };
    PodRow {
        pending_seconds: pending.then_some(60.0),
        notebook: Some(format!("nb-{extra}")),
        pending_reason: pending.then(|| format!("reason {extra}").into()),
        ..PodRow::new(ns, name)
            .placed(Some(&format!("node-{extra}")), state)
            .holding("nvidia.com/gpu", 1)
            .attributed(Attribution::Exclusive)
            .busy_at(0.25)
            .owned_by("StatefulSet", format!("owner-{extra}"))
            .with_uid(format!("uid-{i}"))
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
            model: None,
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
        reclaim: vec![],
        quotas: vec![],
        queues: vec![],
        dra_claims_unquotaed: vec![],
        kueue_available: false,
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

use support::{homelab_copy, report_json as report};

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

// --------------------------------------------------------------------------------------------
// Issue 22: names that read as flags, absurd quantities, duplicates, alias bombs, special files
// --------------------------------------------------------------------------------------------

/// The kubectl commands of the table's "What to do" section, trimmed.
fn table_commands(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl "))
        .map(ToString::to_string)
        .collect()
}

/// The text of every `<code>` element of a page that is a kubectl command (entities undone).
fn page_commands(page: &str) -> Vec<String> {
    page.split("<code>")
        .skip(1)
        .filter_map(|s| s.split("</code>").next())
        .map(|s| {
            s.replace("&quot;", "\"")
                .replace("&#39;", "'")
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&amp;", "&")
        })
        .filter(|s| s.starts_with("kubectl "))
        .collect()
}

/// A pod with an idle notebook (`kubectl annotate`) or stuck terminating (`kubectl patch` and
/// `kubectl delete`), in namespace `ns`.
fn advised_pod(ns: &str, name: &str, notebook: Option<&str>) -> PodRow {
    let mut p = pod(0, ns, name, "x");
    p.node = Some("lab-2".into());
    p.owner = None;
    if let Some(nb) = notebook {
        p.notebook = Some(nb.into());
        p.idle = Some(true);
        p.idle_seconds = Some(7200.0);
        p.utilization = Some(0.0);
    } else {
        p.notebook = None;
        p.state = PodState::Terminating;
        p.stuck = true;
        p.terminating_seconds = Some(3.0 * 86_400.0);
        // A finalizer on a node of unknown readiness: both remedies are offered (the finalizer
        // patch, and the force delete if the node is down), so both commands are checked.
        p.finalizers = vec!["example.com/cleanup".into()];
        p.node_ready = None;
    }
    p
}

fn advice_ledger(pods: Vec<PodRow>) -> Ledger {
    Ledger {
        generated_at: t(),
        pods,
        nodes: vec![],
        namespaces: vec![],
        unclaimed_busy: vec![],
        usage_available: true,
        reclaim: vec![],
        quotas: vec![],
        queues: vec![],
        dra_claims_unquotaed: vec![],
        kueue_available: false,
    }
}

/// A DNS-1123 subdomain, written out here independently of the crate's checks.
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Every suggested command ends its flags with `--` and names one valid object after it; names
/// that are options (`--all`, `-A`), or otherwise not Kubernetes names, get no command at all,
/// in the table and in the HTML page alike.
#[test]
fn suggested_commands_never_take_a_name_as_a_flag() {
    let valid = advice_ledger(vec![
        advised_pod("team-ml", "alice-nb-0", Some("alice-nb")),
        advised_pod("team-ml", "bob-nb-0", None),
    ]);
    let mut out = Vec::new();
    render_table(&valid, &mut out).expect("table");
    let commands = table_commands(&String::from_utf8(out).expect("utf8"));
    let expected = [
        "kubectl annotate notebook -n team-ml -- alice-nb kubeflow-resource-stopped=2026-11-30T12:00:00Z",
        "kubectl patch pod -n team-ml --type=merge -p '{\"metadata\":{\"finalizers\":null}}' -- bob-nb-0",
        "kubectl delete pod -n team-ml --grace-period=0 --force -- bob-nb-0",
    ];
    assert_eq!(commands, expected, "table");
    let page = render_page(&valid, &PageOptions::default());
    assert_eq!(page_commands(&page), expected, "page");

    let flags = [
        "--all",
        "-all",
        "-A",
        "--all-namespaces",
        "-",
        "a-",
        "a..b",
        ".a",
        "Bob",
        "x y",
        "a_b",
        "--dry-run=none",
    ];
    let mut pods = Vec::new();
    for (i, f) in flags.iter().enumerate() {
        pods.push(advised_pod("team-ml", f, None));
        pods.push(advised_pod("team-ml", &format!("nb-{i}-0"), Some(f)));
        pods.push(advised_pod(f, &format!("stuck-{i}"), None));
        pods.push(advised_pod(f, &format!("idle-{i}-0"), Some("nb")));
    }
    let hostile = advice_ledger(pods);
    let mut out = Vec::new();
    render_table(&hostile, &mut out).expect("table");
    let text = String::from_utf8(out).expect("utf8");
    let page = render_page(&hostile, &PageOptions::default());
    for (what, commands) in [
        ("table", table_commands(&text)),
        ("page", page_commands(&page)),
    ] {
        for c in &commands {
            if c.starts_with("kubectl create quota") {
                continue;
            }
            let (flags_part, names) = c
                .split_once(" -- ")
                .unwrap_or_else(|| panic!("{what}: no `--` in {c:?}"));
            let name = names.split(' ').next().unwrap_or_default();
            assert!(plain_name(name), "{what}: {name:?} in {c:?}");
            let ns = flags_part
                .split(" -n ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .unwrap_or_default();
            assert!(plain_name(ns), "{what}: namespace {ns:?} in {c:?}");
        }
    }
    // No command for any of them, and a note says why.
    assert!(table_commands(&text).is_empty(), "{text}");
    assert!(
        text.contains("no command: not a valid Kubernetes name"),
        "{text}"
    );
    assert!(
        page.contains("no command: not a valid Kubernetes name"),
        "page"
    );
}

fn edit_json(dir: &Path, file: &str, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join(file);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).expect("json")).expect("write");
}

fn item_named<'a>(v: &'a mut serde_json::Value, name: &str) -> &'a mut serde_json::Value {
    v["items"]
        .as_array_mut()
        .expect("items")
        .iter_mut()
        .find(|i| i["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in the dump"))
}

/// Replaces `from` by `to` in every file of the dump directory.
fn rename_everywhere(dir: &Path, from: &str, to: &str) {
    for f in std::fs::read_dir(dir).expect("dir") {
        let p = f.expect("entry").path();
        let text = std::fs::read_to_string(&p).expect("read");
        std::fs::write(&p, text.replace(from, to)).expect("write");
    }
}

/// Changes one dump directory.
type DumpEdit = Box<dyn Fn(&Path)>;

/// A dump can hold names the API server refuses. Named like options, the stuck pod and the idle
/// notebook made the report suggest `kubectl delete pod -n team-ml --all --grace-period=0
/// --force`: such a dump is now refused, naming the file and the object, the name escaped and
/// cut short.
#[test]
fn dump_names_that_read_as_flags_are_refused() {
    let cases: Vec<(&str, DumpEdit, Vec<&str>)> = vec![
        (
            "stuck pod named --all",
            Box::new(|d: &Path| {
                edit_json(d, "pods.json", |v| {
                    item_named(v, "bob-nb-0")["metadata"]["name"] = "--all".into();
                });
            }),
            vec!["pods.json", "\"--all\"", "not a valid"],
        ),
        (
            "idle notebook, its set and pod named -all",
            Box::new(|d: &Path| rename_everywhere(d, "\"alice-nb", "\"-all")),
            vec!["pods.json", "\"-all-0\"", "not a valid"],
        ),
        (
            "notebook named --all",
            Box::new(|d: &Path| {
                edit_json(d, "notebooks.json", |v| {
                    item_named(v, "bob-nb")["metadata"]["name"] = "--all".into();
                });
            }),
            vec!["notebooks.json", "\"--all\"", "not a valid"],
        ),
        (
            "namespace named -A",
            Box::new(|d: &Path| {
                edit_json(d, "pods.json", |v| {
                    item_named(v, "bob-nb-0")["metadata"]["namespace"] = "-A".into();
                });
            }),
            vec!["pods.json", "\"-A\"", "namespace", "not a valid"],
        ),
        (
            "node named --all",
            Box::new(|d: &Path| {
                edit_json(d, "nodes.json", |v| {
                    item_named(v, "lab-2")["metadata"]["name"] = "--all".into();
                });
            }),
            vec!["nodes.json", "\"--all\"", "not a valid"],
        ),
    ];
    for (what, edit, needles) in cases {
        let dir = homelab_copy();
        edit(dir.path());
        let out = report(dir.path(), &["-o", "table"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !table_commands(&stdout)
                .iter()
                .any(|c| c.contains(" -all") || c.contains(" --all") || c.contains(" -A")),
            "{what}: a name became a flag:\n{stdout}"
        );
        assert_refused(&out, &needles);
    }

    // A long name with control characters is echoed escaped and cut short.
    let dir = homelab_copy();
    let long = format!("evil\u{1b}[31m\n{}", "a".repeat(100_000));
    edit_json(dir.path(), "pods.json", |v| {
        item_named(v, "bob-nb-0")["metadata"]["name"] = long.into();
    });
    let out = report(dir.path(), &[]);
    assert_refused(&out, &["pods.json", "evil\\u{1b}[31m\\n"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.len() < 2000, "{} bytes of stderr", stderr.len());
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
}

/// Quantities no device plugin can advertise (`u64::MAX` GPUs on one pod, a million and one on
/// a node) are refused, naming the object and the resource; a quota may be that large (it is a
/// limit) and renders as a plain number.
#[test]
fn impossible_gpu_counts_are_refused_and_absurd_numbers_render_plainly() {
    let dir = homelab_copy();
    edit_json(dir.path(), "pods.json", |v| {
        let c = &mut item_named(v, "bob-nb-0")["spec"]["containers"][0]["resources"];
        c["limits"]["nvidia.com/gpu"] = "18446744073709551615".into();
        c["requests"]["nvidia.com/gpu"] = "18446744073709551615".into();
    });
    let out = report(dir.path(), &["-o", "table"]);
    assert_refused(
        &out,
        &[
            "pods.json",
            "pod team-ml/bob-nb-0",
            "nvidia.com/gpu",
            "more than 1000000",
        ],
    );

    let dir = homelab_copy();
    edit_json(dir.path(), "nodes.json", |v| {
        let s = &mut item_named(v, "lab-2")["status"];
        s["allocatable"]["nvidia.com/gpu"] = "1000001".into();
        s["capacity"]["nvidia.com/gpu"] = "1000001".into();
    });
    let out = report(dir.path(), &["-o", "table"]);
    assert_refused(
        &out,
        &[
            "nodes.json",
            "node lab-2",
            "nvidia.com/gpu",
            "more than 1000000",
        ],
    );

    // A million on a node is accepted; a quota of u64::MAX is a limit, shown as a number.
    let dir = homelab_copy();
    edit_json(dir.path(), "nodes.json", |v| {
        let s = &mut item_named(v, "lab-2")["status"];
        s["allocatable"]["nvidia.com/gpu"] = "1000000".into();
        s["capacity"]["nvidia.com/gpu"] = "1000000".into();
    });
    edit_json(dir.path(), "quotas.json", |v| {
        for q in v["items"].as_array_mut().expect("items") {
            if let Some(hard) = q["spec"]["hard"].as_object_mut() {
                for (_, value) in hard.iter_mut() {
                    *value = "18446744073709551615".into();
                }
            }
        }
    });
    let out = report(dir.path(), &["-o", "table"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1000000"), "{text}");
    assert!(!text.contains("92233720368547758"), "{text}");
    assert!(!text.contains(" --1") && !text.contains(".-"), "{text}");
}

/// Ledger numbers far outside any cluster still print as numbers: no `--9…` or `.-8`.
#[test]
fn absurd_ledger_numbers_render_as_numbers() {
    let mut l = advice_ledger(vec![]);
    l.nodes.push(NodeRow {
        node: "lab-1".into(),
        gpus_allocatable: 1.0,
        gpus_claimed: 1.844_674_407_370_955_2e19,
        gpus_free: Some(-1.844_674_407_370_955_2e19),
        gpus_unschedulable: 0.0,
        model: None,
    });
    l.namespaces.push(NamespaceRow {
        namespace: "team-ml".into(),
        gpus_claimed: 1.844_674_407_370_955_2e19,
        gpus_idle: 0.0,
        gpus_pending: 0.0,
        gpu_quota: Some(1.844_674_407_370_955_2e19),
        gpu_quota_keys: BTreeMap::new(),
    });
    let mut out = Vec::new();
    render_table(&l, &mut out).expect("table");
    let text = String::from_utf8(out).expect("utf8");
    assert!(!text.contains(" --1") && !text.contains(".-"), "{text}");
    assert!(!text.contains("92233720368547758"), "{text}");
    assert!(text.contains("-18446744073709552000"), "{text}");
    let page = render_page(&l, &PageOptions::default());
    assert!(!page.contains("92233720368547758"), "page");
}

/// The same pod twice in a dump (same namespace and name, or same uid) counted twice: a node
/// showed -1 free. The first is kept, the others are dropped with a warning naming the file.
#[test]
fn duplicate_pods_in_a_dump_count_once_with_a_warning() {
    let dir = homelab_copy();
    let clean = report(dir.path(), &[]);
    assert!(clean.status.success());
    edit_json(dir.path(), "pods.json", |v| {
        let bob = item_named(v, "bob-nb-0").clone();
        let mut alice = item_named(v, "alice-nb-0").clone();
        alice["metadata"]["name"] = "alice-nb-0-copy".into();
        let items = v["items"].as_array_mut().expect("items");
        items.push(bob);
        items.push(alice);
    });
    let out = report(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json =
        |o: &Output| -> serde_json::Value { serde_json::from_slice(&o.stdout).expect("json") };
    assert_eq!(json(&clean), json(&out), "duplicates changed the ledger");
    for needle in [
        "pods.json",
        "duplicate",
        "pod team-ml/bob-nb-0",
        "pod team-ml/alice-nb-0-copy",
        "uid \"9cc58561-474b-4d5d-a254-8e163ecfd5aa\"",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in\n{stderr}");
    }
}

/// Runs the report with a deadline, optionally under an address-space limit (`prlimit`).
fn report_within(dir: &Path, address_space: Option<u64>, deadline: Duration) -> Output {
    let bin = env!("CARGO_BIN_EXE_gpu-ledger");
    let mut cmd = match address_space {
        Some(bytes) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--as={bytes}")).arg("--").arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = cmd
        .args(["report", "-o", "json", "--from"])
        .arg(dir)
        .env_remove("GPU_LEDGER_MAX_DUMP_SIZE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpu-ledger");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "report still running after {deadline:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// 2 GiB of address space: the homelab report runs in it; before the alias limit a YAML dump
/// whose 1 MiB anchored scalar is referenced 20,000 times (with filler anchors to satisfy the
/// alias/anchor ratio) grew to 5.7 GB and aborted.
#[test]
fn yaml_alias_bomb_is_refused_within_bounded_memory() {
    const LIMIT: u64 = 2 << 30;
    let dir = homelab_copy();
    let ok = report_within(dir.path(), Some(LIMIT), Duration::from_secs(120));
    assert!(
        ok.status.success(),
        "the plain report must fit the limit: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    std::fs::remove_file(dir.path().join("pods.json")).expect("rm");
    let mut yaml = String::from("apiVersion: v1\nkind: List\nfiller:\n");
    for i in 0..2_100 {
        let _ = writeln!(yaml, "- &f{i} {i}");
    }
    let _ = writeln!(yaml, "big: &big {}", "A".repeat(1 << 20));
    yaml.push_str("items:\n");
    for _ in 0..20_000 {
        yaml.push_str("- *big\n");
    }
    std::fs::write(dir.path().join("pods.yaml"), &yaml).expect("write");
    let out = report_within(dir.path(), Some(LIMIT), Duration::from_secs(300));
    assert_refused(&out, &["pods.yaml", "alias", "limit of 0"]);
}

/// A dump that is not a regular file (a FIFO, `/dev/zero`) is refused before it is read: it
/// blocked forever, or grew to the size limit (2.7 GB RSS) before the refusal.
#[test]
fn dumps_that_are_not_regular_files_are_refused_unread() {
    let dir = homelab_copy();
    std::fs::remove_file(dir.path().join("pods.json")).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("pods.json")).expect("symlink");
    let out = report_within(dir.path(), Some(2 << 30), Duration::from_secs(60));
    assert_refused(&out, &["pods.json", "not a regular file"]);

    let dir = homelab_copy();
    std::fs::remove_file(dir.path().join("pods.json")).expect("rm");
    let mkfifo = Command::new("mkfifo")
        .arg(dir.path().join("pods.json"))
        .status()
        .expect("mkfifo");
    assert!(mkfifo.success());
    let out = report_within(dir.path(), None, Duration::from_secs(60));
    assert_refused(&out, &["pods.json", "not a regular file"]);

    // An optional dump is refused too, not skipped.
    let dir = homelab_copy();
    std::fs::remove_file(dir.path().join("notebooks.json")).expect("rm");
    let mkfifo = Command::new("mkfifo")
        .arg(dir.path().join("notebooks.json"))
        .status()
        .expect("mkfifo");
    assert!(mkfifo.success());
    let out = report_within(dir.path(), None, Duration::from_secs(60));
    assert_refused(&out, &["notebooks.json", "not a regular file"]);
}
