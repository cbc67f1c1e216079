//! Golden tests of the offline report on `examples/homelab`, the homelab story itself, and bad
//! input through the library. Regenerate the golden files with `UPDATE_GOLDEN=1 cargo test`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use gpu_ledger::app::offline::{self, OfflineInput};
use gpu_ledger::ledger::{Ledger, PodRow, PodState};
use gpu_ledger::report::{render_json, render_table};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn homelab() -> PathBuf {
    root().join("examples/homelab")
}

/// A clock far from the dump: the report must not depend on it when the dump has timestamps.
fn wall_clock() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

fn at() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-28T09:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

fn load_homelab() -> offline::Offline {
    offline::load(&OfflineInput::from_dir(&homelab()), wall_clock()).expect("homelab loads")
}

fn pod<'a>(ledger: &'a Ledger, name: &str) -> &'a PodRow {
    ledger
        .pods
        .iter()
        .find(|p| p.pod == name)
        .unwrap_or_else(|| panic!("pod {name} in ledger"))
}

fn check_golden(name: &str, actual: &str) {
    let path = root().join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir golden");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let diff_at = expected
            .lines()
            .zip(actual.lines())
            .position(|(e, a)| e != a);
        panic!(
            "{} differs from the rendered output (first differing line: {:?}); rerun with UPDATE_GOLDEN=1 if intended\n--- actual ---\n{actual}",
            path.display(),
            diff_at.map(|i| i + 1)
        );
    }
}

#[test]
fn homelab_json_matches_golden() {
    let off = load_homelab();
    let mut out = Vec::new();
    render_json(&off.ledger, &mut out).expect("render json");
    let text = String::from_utf8(out).expect("utf8");
    check_golden("homelab.json", &text);
    // The contract: unknown values are null, never omitted.
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let pending = v["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["pod"] == "hp-trial-42")
        .expect("pending pod");
    for key in [
        "node",
        "utilization",
        "memory_used_bytes",
        "idle",
        "idle_seconds",
        "terminating_seconds",
        "notebook",
    ] {
        assert!(
            pending.get(key).is_some_and(serde_json::Value::is_null),
            "{key} must be present and null: {pending}"
        );
    }
}

#[test]
fn homelab_table_matches_golden() {
    let off = load_homelab();
    let mut out = Vec::new();
    render_table(&off.ledger, &mut out).expect("render table");
    check_golden("homelab.txt", &String::from_utf8(out).expect("utf8"));
}

#[test]
fn homelab_tells_the_story() {
    let off = load_homelab();
    assert!(off.warnings.is_empty(), "{:?}", off.warnings);
    assert_eq!(off.at, at(), "at defaults to the newest DCGM sample");
    assert_eq!(off.scrape_interval, chrono::Duration::seconds(30));
    let l = &off.ledger;
    assert_eq!(l.generated_at, at());
    assert!(l.usage_available);

    let alice = pod(l, "alice-nb-0");
    assert_eq!(alice.state, PodState::Running);
    assert_eq!(alice.idle, Some(true));
    assert!(
        alice.idle_seconds.is_some_and(|s| s >= 7000.0),
        "2 h of proven idleness: {:?}",
        alice.idle_seconds
    );
    assert_eq!(alice.notebook.as_deref(), Some("alice-nb"));
    assert_eq!(alice.utilization, Some(0.0));
    let mem = alice.memory_used_bytes.expect("framebuffer known");
    assert!(
        (2.0..2.2).contains(&(mem / f64::from(1u32 << 30))),
        "~2.1 GiB held: {mem}"
    );

    let bob = pod(l, "bob-nb-0");
    assert_eq!(bob.state, PodState::Terminating);
    assert!(bob.stuck);
    assert!(
        bob.terminating_seconds.is_some_and(|s| s >= 3.0 * 86_400.0),
        "{:?}",
        bob.terminating_seconds
    );
    assert_eq!(bob.notebook.as_deref(), Some("bob-nb"));
    let lab2 = l.nodes.iter().find(|n| n.node == "lab-2").expect("lab-2");
    assert!(
        (lab2.gpus_claimed - 1.0).abs() < 1e-9 && lab2.gpus_free.is_some_and(|f| f.abs() < 1e-9),
        "{lab2:?}"
    );
    assert!(
        l.nodes
            .iter()
            .all(|n| n.gpus_free.is_some_and(|f| f.abs() < 1e-9)),
        "every card is held: {:?}",
        l.nodes
    );

    let bench = pod(l, "llm-bench-7f9c");
    assert_eq!(bench.idle, Some(false));
    assert_eq!(bench.idle_seconds, Some(0.0));
    assert!(
        bench.utilization.is_some_and(|u| u > 0.9),
        "{:?}",
        bench.utilization
    );

    // KubeRay's RayCluster team-ml/ray-sweep: its GPU worker on lab-4 is proven idle and owned
    // (ownerReference and label agree), its head holds no GPU and is not a row.
    let worker = pod(l, "ray-sweep-gpu-worker-t6kzr");
    assert_eq!(worker.state, PodState::Running);
    assert_eq!(worker.node.as_deref(), Some("lab-4"));
    assert_eq!(worker.idle, Some(true));
    assert!(
        worker.idle_seconds.is_some_and(|s| s >= 7000.0),
        "2 h of proven idleness: {:?}",
        worker.idle_seconds
    );
    assert_eq!(worker.notebook, None);
    let owner = worker
        .owner
        .as_ref()
        .expect("the RayCluster owns its worker");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("RayCluster", "ray-sweep")
    );
    assert!(
        l.pods.iter().all(|p| p.pod != "ray-sweep-head-8x4qn"),
        "the GPU-less head is no GPU row"
    );

    let trial = pod(l, "hp-trial-42");
    assert_eq!(trial.state, PodState::Pending);
    assert!(trial.node.is_none());
    assert!(
        trial
            .pending_seconds
            .is_some_and(|s| (2400.0 - 1.0..=2400.0 + 1.0).contains(&s)),
        "{:?}",
        trial.pending_seconds
    );
    assert!(
        trial.pending_reason.as_deref().is_some_and(
            |r| r.starts_with("0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
        ),
        "{:?}",
        trial.pending_reason
    );

    let ns = |name: &str| {
        l.namespaces
            .iter()
            .find(|n| n.namespace == name)
            .unwrap_or_else(|| panic!("namespace {name}"))
    };
    assert_eq!(
        ns("team-ml").gpu_quota,
        None,
        "cpu/memory quota is no GPU quota"
    );
    assert!((ns("team-ml").gpus_claimed - 3.0).abs() < 1e-9);
    assert!((ns("team-ml").gpus_idle - 3.0).abs() < 1e-9);
    assert_eq!(ns("bench").gpu_quota, Some(1.0));
    assert!(
        (ns("trials").gpus_pending - 1.0).abs() < 1e-9 && ns("trials").gpus_claimed.abs() < 1e-9
    );
    assert!(l.unclaimed_busy.is_empty(), "{:?}", l.unclaimed_busy);
    assert_eq!(l.pods.len(), 5, "only GPU pods are listed");
}

/// Issue 40: the homelab's idle RayCluster is in "What to do" with the exact command that
/// suspends it (KubeRay then deletes its pods and keeps the object).
#[test]
fn homelab_what_to_do_suspends_the_idle_raycluster() {
    let off = load_homelab();
    let mut out = Vec::new();
    render_table(&off.ledger, &mut out).expect("render table");
    let table = String::from_utf8(out).expect("utf8");
    let todo = table
        .split("\nWhat to do\n")
        .nth(1)
        .expect("a What to do section");
    let lines: Vec<&str> = todo.lines().collect();
    let at = lines
        .iter()
        .position(|l| {
            *l == "  team-ml/ray-sweep-gpu-worker-t6kzr: idle ≥2h0m: suspend raycluster \
                   team-ml/ray-sweep (KubeRay deletes its pods and keeps the cluster; resume with \
                   spec.suspend: false)"
        })
        .unwrap_or_else(|| panic!("no RayCluster advice in What to do:\n{todo}"));
    assert_eq!(
        lines.get(at + 1).copied(),
        Some(
            "    kubectl patch raycluster -n team-ml --type merge -p '{\"spec\":{\"suspend\":true}}' \
             -- ray-sweep"
        ),
        "the exact command follows the advice:\n{todo}"
    );
}

#[test]
fn explicit_at_overrides_newest_sample() {
    let mut input = OfflineInput::from_dir(&homelab());
    let earlier = at() - chrono::Duration::minutes(30);
    input.at = Some(earlier);
    let off = offline::load(&input, wall_clock()).expect("loads");
    assert_eq!(off.at, earlier);
    assert_eq!(off.ledger.generated_at, earlier);
    let trial = pod(&off.ledger, "hp-trial-42");
    assert!(
        trial
            .pending_seconds
            .is_some_and(|s| (s - 600.0).abs() < 1.0),
        "{:?}",
        trial.pending_seconds
    );
}

/// Regression: current holders are taken from each series' newest sample at or before `--at`, so
/// an `--at` inside the dump keeps attribution.
#[test]
fn explicit_at_inside_the_dump_keeps_attribution() {
    let mut input = OfflineInput::from_dir(&homelab());
    input.at = Some(at() - chrono::Duration::minutes(30));
    let off = offline::load(&input, wall_clock()).expect("loads");
    // Half an hour earlier there is 1.5 h of history: idleness proven back to its start.
    let alice = pod(&off.ledger, "alice-nb-0");
    assert_eq!(alice.attribution.as_str(), "exclusive");
    assert!(
        alice.idle_seconds.is_some_and(|s| (s - 5400.0).abs() < 1.0),
        "{:?}",
        alice.idle_seconds
    );
}

/// A copy of the homelab in a temporary directory, with `replace` files overwritten.
fn homelab_with(replace: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    for entry in std::fs::read_dir(homelab()).expect("read homelab") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        if Path::new(&name)
            .extension()
            .is_some_and(|e| e == "json" || e == "prom")
        {
            std::fs::copy(entry.path(), dir.path().join(&name)).expect("copy");
        }
    }
    for (name, text) in replace {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

fn load_err(dir: &tempfile::TempDir) -> String {
    let err =
        offline::load(&OfflineInput::from_dir(dir.path()), wall_clock()).expect_err("bad input");
    // The whole cause chain, as the binary prints it.
    format!("{:#}", anyhow::Error::new(err))
}

#[test]
fn malformed_json_names_the_file() {
    let dir = homelab_with(&[("pods.json", "{\"kind\": \"List\", \"items\": [")]);
    let msg = load_err(&dir);
    assert!(
        msg.contains("pods.json") && msg.contains("not valid JSON"),
        "{msg}"
    );
}

#[test]
fn list_of_wrong_kind_names_the_file() {
    let nodes = std::fs::read_to_string(homelab().join("nodes.json")).expect("nodes");
    let dir = homelab_with(&[("quotas.json", &nodes)]);
    let msg = load_err(&dir);
    assert!(
        msg.contains("quotas.json") && msg.contains("expected kind ResourceQuota, found Node"),
        "{msg}"
    );
}

#[test]
fn fractional_gpu_quantity_names_the_file_and_pod() {
    let pods = std::fs::read_to_string(homelab().join("pods.json")).expect("pods");
    let needle = "\"nvidia.com/gpu\": \"1\"";
    assert!(pods.contains(needle));
    let dir = homelab_with(&[(
        "pods.json",
        &pods.replace(needle, "\"nvidia.com/gpu\": \"0.5\""),
    )]);
    let msg = load_err(&dir);
    assert!(
        msg.contains("pods.json") && msg.contains("fractional") && msg.contains("nvidia.com/gpu"),
        "{msg}"
    );
}

#[test]
fn dcgm_dump_without_dcgm_series_is_an_error() {
    let dir = homelab_with(&[(
        "dcgm.prom",
        "# HELP up Target up.\n# TYPE up gauge\nup{job=\"node\"} 1\nnode_load1 0.3\n",
    )]);
    let msg = load_err(&dir);
    assert!(
        msg.contains("dcgm.prom") && msg.contains("no DCGM_FI_* series found"),
        "{msg}"
    );
    let dir = homelab_with(&[("dcgm.prom", "")]);
    let msg = load_err(&dir);
    assert!(
        msg.contains("dcgm.prom") && msg.contains("no DCGM_FI_* series found"),
        "{msg}"
    );
    let dir = homelab_with(&[("dcgm.prom", "DCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-a\"} 40\n")]);
    let msg = load_err(&dir);
    assert!(
        msg.contains("dcgm.prom") && msg.contains("none of DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
        "{msg}"
    );
}

#[test]
fn missing_dcgm_dump_is_an_error() {
    let dir = homelab_with(&[]);
    std::fs::remove_file(dir.path().join("dcgm.prom")).expect("rm");
    let msg = load_err(&dir);
    assert!(
        msg.contains("dcgm.prom") && msg.contains("cannot read DCGM dump"),
        "{msg}"
    );
}

#[test]
fn garbage_lines_are_a_warning_not_an_error() {
    let text = std::fs::read_to_string(homelab().join("dcgm.prom")).expect("dcgm");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(10, "this is not a sample");
    lines.insert(
        20,
        "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-x\"} not-a-number 1795849200000",
    );
    lines.insert(30, "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-x\" 3");
    let dir = homelab_with(&[("dcgm.prom", &(lines.join("\n") + "\n"))]);
    let off =
        offline::load(&OfflineInput::from_dir(dir.path()), wall_clock()).expect("still a ledger");
    assert_eq!(off.warnings.len(), 1, "{:?}", off.warnings);
    let w = &off.warnings[0];
    assert!(
        w.starts_with("dcgm.prom: skipped 3 unparsable lines (first: line 11: "),
        "{w}"
    );
    assert_eq!(pod(&off.ledger, "alice-nb-0").idle, Some(true));
}

#[test]
fn snapshot_without_timestamps_uses_the_clock_and_never_proves_idle() {
    let text = "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-3f6c1a2e-9d41-4b7a-8e2f-51c0a9d7b311\",Hostname=\"lab-1\",exported_pod=\"alice-nb-0\",exported_namespace=\"team-ml\",pod=\"nvidia-dcgm-exporter-4xk2p\",namespace=\"gpu-operator\"} 0\n";
    let dir = homelab_with(&[("dcgm.prom", text)]);
    let off = offline::load(&OfflineInput::from_dir(dir.path()), wall_clock()).expect("loads");
    assert_eq!(off.at, wall_clock());
    assert!(
        off.warnings.iter().any(|w| w.contains("no history")),
        "{:?}",
        off.warnings
    );
    let alice = pod(&off.ledger, "alice-nb-0");
    assert_eq!(alice.utilization, Some(0.0));
    assert_eq!(alice.idle, None, "one sample proves nothing");
    assert_eq!(
        pod(&off.ledger, "llm-bench-7f9c").attribution.as_str(),
        "unattributed"
    );
}

/// docs/report-json.md documents every field the JSON has, and its example is the real output
/// (abridged: each pod, node and namespace it shows equals the golden one of the same name).
#[test]
fn report_json_doc_matches_the_output() {
    let doc = std::fs::read_to_string(root().join("docs/report-json.md")).expect("doc");
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/golden/homelab.json")).expect("golden"),
    )
    .expect("json");
    let documented = |field: &str| {
        doc.lines()
            .any(|l| l.starts_with(&format!("| `{field}` |")))
    };
    for (section, rows) in [
        ("pods", &golden["pods"]),
        ("nodes", &golden["nodes"]),
        ("namespaces", &golden["namespaces"]),
    ] {
        for row in rows.as_array().expect("array") {
            for field in row.as_object().expect("object").keys() {
                assert!(
                    documented(field),
                    "{section}.{field} is not in docs/report-json.md"
                );
            }
        }
    }
    for field in golden.as_object().expect("object").keys() {
        assert!(documented(field), "{field} is not in docs/report-json.md");
    }
    let example = doc
        .split("```json\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("an example block");
    let example: serde_json::Value = serde_json::from_str(example).expect("example is JSON");
    assert_eq!(example["generated_at"], golden["generated_at"]);
    for (section, key) in [
        ("pods", "pod"),
        ("nodes", "node"),
        ("namespaces", "namespace"),
    ] {
        for row in example[section].as_array().expect("array") {
            let real = golden[section]
                .as_array()
                .expect("array")
                .iter()
                .find(|g| g[key] == row[key])
                .unwrap_or_else(|| panic!("example {section} {} is not in the output", row[key]));
            assert_eq!(
                row, real,
                "docs/report-json.md example {section} {}",
                row[key]
            );
        }
    }
}

/// The README's sample output is the real one: its lines are lines of the golden table, in order
/// (abridged, never invented), and it follows the README's first command.
#[test]
fn readme_sample_is_the_golden_table() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let first = readme.find("```sh\n").expect("a command block");
    let commands = &readme[first..];
    assert!(
        commands
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("cargo run -- report --from examples/homelab")),
        "the README starts with the bundled example"
    );
    let sample = readme
        .split("The first prints")
        .nth(1)
        .and_then(|r| r.split("```\n").nth(1))
        .expect("the sample block after the first command");
    let golden = std::fs::read_to_string(root().join("tests/golden/homelab.txt")).expect("golden");
    let mut golden_lines = golden.lines();
    for line in sample.lines() {
        assert!(
            golden_lines.any(|g| g == line),
            "README sample line not in the golden table (in order): {line:?}"
        );
    }
    assert!(sample.lines().count() > 20, "{sample}");
}

/// The homelab's DCGM dump as an exporter emitting DCGM 4.7's canonical names writes it
/// (`tests/fixtures/dcgm-renamed/rename.py`: utilisation as a 0–1 ratio, framebuffer in bytes).
fn renamed_dump() -> String {
    std::fs::read_to_string(root().join("tests/fixtures/dcgm-renamed/dcgm.prom"))
        .expect("renamed dump")
}

fn rendered(dir: &Path) -> (String, String) {
    let off = offline::load(&OfflineInput::from_dir(dir), wall_clock()).expect("dump loads");
    let mut json = Vec::new();
    render_json(&off.ledger, &mut json).expect("render json");
    let mut table = Vec::new();
    render_table(&off.ledger, &mut table).expect("render table");
    (
        String::from_utf8(json).expect("utf8"),
        String::from_utf8(table).expect("utf8"),
    )
}

#[test]
fn dcgm_canonical_names_give_the_same_report() {
    let dir = homelab_with(&[("dcgm.prom", &renamed_dump())]);
    let (json, table) = rendered(dir.path());
    let (legacy_json, legacy_table) = rendered(&homelab());
    assert_eq!(json, legacy_json, "JSON report of the canonical-name dump");
    assert_eq!(
        table, legacy_table,
        "table report of the canonical-name dump"
    );
}

/// The node of `line`'s series and its sample time (ms), if it is a sample line.
fn host_and_time(line: &str) -> Option<(&str, i64)> {
    let host = line.split("Hostname=\"").nth(1)?.split('"').next()?;
    let time = line.rsplit(' ').next()?.parse().ok()?;
    Some((host, time))
}

/// A rolling dcgm-exporter upgrade: `lab-1`'s exporter emits the legacy names for the first half
/// of the dump and the canonical names (other units) after; the other nodes stay legacy.
fn rolling_upgrade_dump() -> String {
    let legacy = std::fs::read_to_string(homelab().join("dcgm.prom")).expect("dcgm");
    let renamed = renamed_dump();
    // 2026-11-28T08:00:00Z: the middle of the two hours.
    let upgraded_at = at().timestamp_millis() - 3_600_000;
    let mut out: Vec<&str> = legacy
        .lines()
        .filter(|l| host_and_time(l).is_none_or(|(h, t)| h != "lab-1" || t < upgraded_at))
        .collect();
    out.extend(
        renamed
            .lines()
            .filter(|l| host_and_time(l).is_some_and(|(h, t)| h == "lab-1" && t >= upgraded_at)),
    );
    assert!(out.len() > 3000 && out.len() < legacy.lines().count() + 10);
    out.join("\n") + "\n"
}

#[test]
fn rolling_exporter_upgrade_mid_window_reads_as_one_device() {
    let dir = homelab_with(&[("dcgm.prom", &rolling_upgrade_dump())]);
    let (json, table) = rendered(dir.path());
    let (legacy_json, legacy_table) = rendered(&homelab());
    // Same verdicts (alice-nb-0 on lab-1 proven idle for the whole two hours), same numbers.
    assert_eq!(json, legacy_json, "JSON report across the upgrade");
    assert_eq!(table, legacy_table, "table report across the upgrade");
}
