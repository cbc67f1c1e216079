//! The binary as users run it: the README's first command, the JSON contract, culling dry-run
//! against the homelab, bad input (clear message naming the input, exit code 2, no panic), and
//! CLI habits: what-to-do hints, `-o wide`, clean machine-readable stdout, `--namespaces`
//! offline, flags scoped to their subcommand, `--context`/`--kubeconfig`, colour rules,
//! `--version`, completions, JSON fatal errors, the self-metrics of `serve`, and live `report`'s
//! exit codes and one-line errors against the shared tier A control plane (testkit).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;

fn gpu_ledger() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
}

fn homelab() -> String {
    format!("{}/examples/homelab", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn readme_first_command_prints_the_table() {
    let out = gpu_ledger()
        .args(["report", "--from", &homelab()])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf8");
    for needle in [
        "GPUs: 4 allocatable, 4 claimed, 3 proven idle, 1 pending, 0 free",
        "Who holds what",
        "alice-nb-0",
        "stuck terminating",
        "Insufficient nvidia.com/gpu",
        "Nodes",
        "TOTAL",
        "What to do",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn json_follows_the_contract() {
    let out = gpu_ledger()
        .args(["report", "--from", &homelab(), "-o", "json"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    for key in [
        "generated_at",
        "pods",
        "nodes",
        "namespaces",
        "unclaimed_busy",
    ] {
        assert!(v.get(key).is_some(), "missing top-level {key}");
    }
    let pod_keys = [
        "namespace",
        "pod",
        "node",
        "state",
        "gpus",
        "resources",
        "attribution",
        "utilization",
        "memory_used_bytes",
        "idle",
        "idle_seconds",
        "terminating_seconds",
        "stuck",
        "pending_seconds",
        "notebook",
    ];
    for pod in v["pods"].as_array().expect("pods array") {
        for key in pod_keys {
            assert!(
                pod.get(key).is_some(),
                "pod {} lacks {key} (unknown must be null, never omitted)",
                pod["pod"]
            );
        }
    }
    let pending = v["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["state"] == "pending")
        .expect("a pending pod");
    assert!(pending["utilization"].is_null() && pending["node"].is_null());
}

#[test]
fn metrics_output_is_exposition_text() {
    let out = gpu_ledger()
        .args(["report", "--from", &homelab(), "-o", "metrics"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf8");
    assert!(text.contains("# TYPE gpu_ledger_pod_gpus gauge"), "{text}");
    assert!(text.contains("gpu_ledger_pod_stuck_terminating{namespace=\"team-ml\",pod=\"bob-nb-0\",node=\"lab-2\"} 1"), "{text}");
}

#[test]
fn metrics_output_passes_promtool_lint() {
    let out = gpu_ledger()
        .args(["report", "--from", &homelab(), "-o", "metrics"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let (code, report) = gpu_ledger_testkit::prometheus::promtool_check_metrics(&out.stdout);
    assert!(code == 0, "promtool check metrics: {report}");
}

/// The homelab's team-ml holds two idle owners (Notebook alice-nb, RayCluster ray-sweep): one
/// stop per namespace per cycle, the RayCluster first (equal idleness: the owner without a
/// notebook sorts first); limited to notebooks, the plan stops exactly alice-nb.
#[test]
fn cull_dry_run_lists_exactly_the_idle_owners() {
    let stops_of = |extra: &[&str]| {
        let out = gpu_ledger()
            .args(["report", "--from", &homelab(), "--cull-dry-run"])
            .args(extra)
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf8");
        let stops: Vec<String> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("STOP"))
            .map(str::to_string)
            .collect();
        (text, stops)
    };
    let (text, stops) = stops_of(&[]);
    assert_eq!(stops.len(), 1, "{text}");
    assert!(
        stops[0].contains("team-ml/ray-sweep  pod=ray-sweep-gpu-worker-t6kzr"),
        "{text}"
    );
    assert!(
        text.contains("per_namespace_cap=1"),
        "alice-nb waits: {text}"
    );
    let (text, stops) = stops_of(&["--cull-targets", "notebook"]);
    assert_eq!(stops.len(), 1, "{text}");
    assert!(stops[0].contains("team-ml/alice-nb"), "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.contains("STOP") && l.contains("bob-nb")),
        "a stopped notebook is never stopped again"
    );
}

#[test]
fn bad_input_exits_2_naming_the_input() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("pods.json"), "{ not json").expect("write");
    std::fs::write(
        dir.path().join("nodes.json"),
        r#"{"kind":"List","items":[]}"#,
    )
    .expect("write");
    std::fs::write(
        dir.path().join("dcgm.prom"),
        "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-a\"} 1\n",
    )
    .expect("write");
    let out = gpu_ledger()
        .args(["report", "--from"])
        .arg(dir.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pods.json") && err.contains("not valid JSON"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let out = gpu_ledger()
        .args(["report", "--from", &homelab(), "--at", "yesterday"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RFC 3339"));

    let out = gpu_ledger()
        .args(["report", "--from", "/nonexistent/dir"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--from /nonexistent/dir: no such directory")
    );

    // serve rejects a kill switch that cannot name a ConfigMap before touching any cluster.
    let out = gpu_ledger()
        .args(["serve", "--cull", "on", "--cull-kill-switch", "ops/cull/x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cull-kill-switch") && err.contains("ops/cull/x"),
        "{err}"
    );
}

#[test]
fn help_documents_every_subcommand() {
    let out = gpu_ledger().arg("--help").output().expect("run");
    let text = String::from_utf8(out.stdout).expect("utf8");
    assert!(text.contains("serve") && text.contains("report"), "{text}");
    let out = gpu_ledger()
        .args(["report", "--help"])
        .output()
        .expect("run");
    let text = String::from_utf8(out.stdout).expect("utf8");
    assert!(
        text.contains("--from") && text.contains("GPU_LEDGER_WINDOW"),
        "{text}"
    );
}

#[test]
fn impossible_durations_exit_2_without_a_panic() {
    // `--window 0s` used to panic (exit 101) in the window arithmetic.
    for args in [
        ["--window", "0s"],
        ["--scrape-interval", "0s"],
        ["--history-lookback", "0s"],
        ["--window", "9999d"],
        ["--min-coverage", "0"],
    ] {
        let out = gpu_ledger()
            .args(["report", "--from", &homelab()])
            .args(args)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(args[0]), "{args:?} names the flag: {err}");
    }
}

fn run(args: &[&str]) -> Output {
    gpu_ledger().args(args).output().expect("run gpu-ledger")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf8 stdout")
}

#[test]
fn report_says_what_to_do_with_exact_commands() {
    let text = stdout(&run(&["report", "--from", &homelab()]));
    let todo = text
        .split("\nWhat to do\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no What to do section in\n{text}"));
    // The idle notebook: Kubeflow's stop annotation, valued at the ledger's time (UTC, seconds).
    assert!(
        todo.contains("kubectl annotate notebook -n team-ml -- alice-nb kubeflow-resource-stopped=2026-11-28T09:00:00Z"),
        "{todo}"
    );
    // The idle RayCluster's GPU worker: suspend the cluster (KubeRay deletes its pods).
    assert!(
        todo.contains(
            "kubectl patch raycluster -n team-ml --type merge -p '{\"spec\":{\"suspend\":true}}' -- ray-sweep"
        ),
        "{todo}"
    );
    // The stuck pod of the stopped notebook: a storage finalizer holds it on a Ready node, so
    // its finalizers are cleared (with a warning), and no force delete (which would not clear
    // them) is offered.
    let patch = "kubectl patch pod -n team-ml --type=merge -p '{\"metadata\":{\"finalizers\":null}}' -- bob-nb-0";
    let force = "kubectl delete pod -n team-ml --grace-period=0 --force -- bob-nb-0";
    assert!(todo.contains(patch), "{todo}");
    assert!(
        todo.contains("storage.example.com/unmount-protection protects storage"),
        "{todo}"
    );
    assert!(!todo.contains(force), "{todo}");
    // Its node unreachable (Ready Unknown): both remedies hold, neither conditional.
    let dir = support::homelab_copy();
    let nodes = dir.path().join("nodes.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&nodes).expect("nodes")).expect("json");
    for n in doc["items"].as_array_mut().expect("items") {
        if n["metadata"]["name"] == "lab-2" {
            for c in n["status"]["conditions"]
                .as_array_mut()
                .expect("conditions")
            {
                if c["type"] == "Ready" {
                    c["status"] = "Unknown".into();
                }
            }
        }
    }
    std::fs::write(&nodes, doc.to_string()).expect("write");
    let down = stdout(&run(&[
        "report",
        "--from",
        dir.path().to_str().expect("utf-8"),
    ]));
    assert!(down.contains(patch) && down.contains(force), "{down}");
    assert!(!down.contains("# if "), "nothing conditional: {down}");
    // Namespaces without a GPU quota get one at today's demand; `bench` has one already.
    assert!(
        todo.contains("kubectl create quota gpu-quota -n team-ml --hard=requests.nvidia.com/gpu=3"),
        "{todo}"
    );
    assert!(
        todo.contains("kubectl create quota gpu-quota -n trials --hard=requests.nvidia.com/gpu=1"),
        "{todo}"
    );
    assert!(!todo.contains("-n bench"), "{todo}");
    // A stopped notebook is never told to stop again.
    assert!(
        !todo.contains("annotate notebook -n team-ml bob-nb"),
        "{todo}"
    );
}

#[test]
fn idle_bounded_by_history_reads_at_least() {
    let text = stdout(&run(&["report", "--from", &homelab()]));
    let alice = text
        .lines()
        .find(|l| l.contains("alice-nb-0"))
        .expect("alice row");
    assert!(alice.contains("≥2h0m"), "{alice}");
    let v: serde_json::Value = serde_json::from_str(&stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "json",
    ])))
    .expect("json");
    let pods = v["pods"].as_array().expect("pods");
    let alice = pods
        .iter()
        .find(|p| p["pod"] == "alice-nb-0")
        .expect("alice");
    assert_eq!(alice["idle_bounded_by_history"], true, "{alice}");
    assert_eq!(alice["idle_seconds"], 7200.0, "{alice}");
    let busy = pods
        .iter()
        .find(|p| p["pod"] == "llm-bench-7f9c")
        .expect("busy pod");
    assert_eq!(busy["idle_bounded_by_history"], false, "{busy}");
    let bob = pods.iter().find(|p| p["pod"] == "bob-nb-0").expect("bob");
    assert_eq!(bob["notebook_stopped"], true, "{bob}");
    assert_eq!(alice["notebook_stopped"], false, "{alice}");
}

#[test]
fn wide_output_adds_devices_attribution_and_memory() {
    let wide = stdout(&run(&["report", "--from", &homelab(), "-o", "wide"]));
    let header = wide
        .lines()
        .find(|l| l.starts_with("NAMESPACE  POD"))
        .expect("header");
    for col in ["ATTRIBUTION", "MEMORY", "DEVICES"] {
        assert!(header.contains(col), "{header}");
    }
    let alice = wide
        .lines()
        .find(|l| l.contains("alice-nb-0"))
        .expect("alice");
    assert!(
        alice.contains("GPU-3f6c1a2e-9d41-4b7a-8e2f-51c0a9d7b311") && alice.contains("exclusive"),
        "{alice}"
    );
    let table = stdout(&run(&["report", "--from", &homelab()]));
    assert!(!table.contains("GPU-3f6c1a2e"), "UUIDs only in wide output");
}

/// The homelab dumps with a one-sample DCGM file: the report warns (no history).
fn homelab_without_history() -> tempfile::TempDir {
    // Every dump of the homelab; its dcgm.prom is replaced below.
    let dir = support::homelab_copy();
    std::fs::write(
        dir.path().join("dcgm.prom"),
        "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-3f6c1a2e-9d41-4b7a-8e2f-51c0a9d7b311\",Hostname=\"lab-1\",pod=\"alice-nb-0\",namespace=\"team-ml\"} 0\n",
    )
    .expect("write dcgm");
    dir
}

#[test]
fn json_stdout_is_only_json_with_the_cull_plan_inside() {
    let out = run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "json",
        "--cull-dry-run",
    ]);
    let text = stdout(&out);
    let v: serde_json::Value = serde_json::from_str(&text).expect("stdout is one JSON document");
    let cull = &v["cull"];
    assert_eq!(cull["candidates"], 2, "{cull}");
    assert!(cull["circuit"].is_null(), "{cull}");
    let stops = cull["would_stop"].as_array().expect("would_stop");
    assert_eq!(stops.len(), 1, "{cull}");
    assert_eq!(stops[0]["notebook"], "ray-sweep");
    assert_eq!(stops[0]["pod"], "ray-sweep-gpu-worker-t6kzr");
    assert_eq!(stops[0]["stop_value"], "2026-11-28T09:00:00Z");
    let skipped = cull["skipped"].as_array().expect("skipped");
    assert!(
        skipped
            .iter()
            .any(|s| s["pod"] == "bob-nb-0" && s["reason"] == "already_stopped"),
        "{cull}"
    );
    assert!(
        skipped
            .iter()
            .any(|s| s["pod"] == "alice-nb-0" && s["reason"] == "per_namespace_cap"),
        "{cull}"
    );
    // The ledger's own fields come first, in their documented order.
    assert!(
        text.trim_start().starts_with("{\n  \"generated_at\""),
        "{text}"
    );
    assert!(
        !text.contains("CULL PLAN"),
        "the text plan never reaches JSON stdout"
    );

    // Warnings go to stderr; stdout stays one JSON document.
    let dir = homelab_without_history();
    let out = gpu_ledger()
        .args(["report", "-o", "json", "--from"])
        .arg(dir.path())
        .output()
        .expect("run");
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&out)).expect("stdout is JSON despite the warning");
    assert!(
        v.get("cull").is_none(),
        "no cull object without --cull-dry-run"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: dcgm.prom: one sample per series"),
        "{err}"
    );
}

#[test]
fn metrics_stdout_is_only_exposition_with_the_cull_families() {
    let out = run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "metrics",
        "--cull-dry-run",
    ]);
    let text = stdout(&out);
    let (code, report) = gpu_ledger_testkit::prometheus::promtool_check_metrics(text.as_bytes());
    assert_eq!(code, 0, "promtool check metrics: {report}\n{text}");
    assert!(text.contains("\ngpu_ledger_cull_would_stop 1\n"), "{text}");
    assert!(text.contains("\ngpu_ledger_cull_candidates 2\n"), "{text}");
    assert!(
        text.contains("gpu_ledger_cull_skips_total{reason=\"already_stopped\"} 1"),
        "{text}"
    );
    assert!(!text.contains("STOP"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("STOP  team-ml/ray-sweep"),
        "the plan goes to stderr: {err}"
    );

    let dir = homelab_without_history();
    let out = gpu_ledger()
        .args(["report", "-o", "metrics", "--from"])
        .arg(dir.path())
        .output()
        .expect("run");
    let text = stdout(&out);
    let (code, report) = gpu_ledger_testkit::prometheus::promtool_check_metrics(text.as_bytes());
    assert_eq!(code, 0, "{report}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning:"));
}

#[test]
fn namespaces_filter_the_offline_report() {
    let v: serde_json::Value = serde_json::from_str(&stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "json",
        "--namespaces",
        "trials,bench",
    ])))
    .expect("json");
    let pods: Vec<&str> = v["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .map(|p| p["namespace"].as_str().expect("ns"))
        .collect();
    assert_eq!(pods, ["bench", "trials"], "{v}");
    let namespaces: Vec<&str> = v["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .map(|n| n["namespace"].as_str().expect("ns"))
        .collect();
    assert_eq!(namespaces, ["bench", "trials"]);
    // As live: nodes still count only the pods watched.
    let claimed: f64 = v["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["gpus_claimed"].as_f64().expect("claimed"))
        .sum();
    assert_eq!(claimed, 1.0, "{v}");
}

#[test]
fn report_refuses_flags_that_only_serve_reads() {
    for flag in [
        &["--listen", "127.0.0.1:9"][..],
        &["--refresh-interval", "5s"],
        &["--shard", "1"],
        &["--total-shards", "2"],
        &["--cull", "on"],
        &["--cull-kill-switch", "ops/cull"],
        &["--lease-name", "x"],
        &["--lease-namespace", "x"],
        &["--cull-namespace-selector", "a=b"],
    ] {
        let lab = homelab();
        let mut args = vec!["report", "--from", lab.as_str()];
        args.extend_from_slice(flag);
        let out = gpu_ledger().args(&args).output().expect("run");
        assert_eq!(
            out.status.code(),
            Some(2),
            "report {flag:?} must be refused"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unexpected argument") && err.contains(flag[0]),
            "{err}"
        );
    }
    // The dry-run's own rules are accepted.
    stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "--cull-dry-run",
        "--cull-idle-after",
        "1h",
        "--cull-exclude-namespaces",
        "bench",
    ]));
    // And serve refuses report's.
    let out = run(&["serve", "--from", "x"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_groups_flags_under_headings() {
    let text = stdout(&run(&["report", "--help"]));
    for heading in [
        "Offline input:",
        "Output:",
        "Kubernetes:",
        "Prometheus:",
        "Idle evidence:",
        "Claims:",
        "Culling:",
        "Logging:",
    ] {
        assert!(text.contains(heading), "missing {heading} in\n{text}");
    }
    let offline = text.split("Offline input:").nth(1).expect("section");
    let offline = offline.split("\n\n").next().unwrap_or(offline);
    assert!(
        offline.contains("--from") && !offline.contains("--window"),
        "{offline}"
    );
    let serve = stdout(&run(&["serve", "--help"]));
    assert!(
        serve.contains("Server:") && serve.contains("--listen"),
        "{serve}"
    );
    let capture = stdout(&run(&["capture", "--help"]));
    assert!(
        capture.contains("--out") && capture.contains("--history-lookback"),
        "{capture}"
    );
    assert!(
        !capture.contains("--idle-threshold"),
        "capture takes no ledger policy: {capture}"
    );
}

const KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster:
    server: https://127.0.0.1:9
contexts:
- name: lab
  context:
    cluster: nowhere
    user: u
current-context: lab
users:
- name: u
  user:
    token: not-a-real-token
";

#[test]
fn kubeconfig_and_context_flags_choose_the_cluster() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = dir.path().join("kubeconfig");
    std::fs::write(&kc, KUBECONFIG).expect("write kubeconfig");
    let kc = kc.to_str().expect("utf8 path");
    let base = ["report", "--prometheus-url", "http://127.0.0.1:9"];

    let out = gpu_ledger()
        .args(base)
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");

    let out = gpu_ledger()
        .args(base)
        .args(["--kubeconfig", kc, "--context", "elsewhere"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("elsewhere"), "{err}");

    // The right context is taken: the client then fails to reach its server (exit 3,
    // unreachable, while listing).
    let out = gpu_ledger()
        .args(base)
        .args(["--kubeconfig", kc, "--context", "lab"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listing pods"), "{err}");

    // The same through $KUBECONFIG and the env var of --context.
    let out = gpu_ledger()
        .args(base)
        .env("KUBECONFIG", kc)
        .env("GPU_LEDGER_CONTEXT", "elsewhere")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("elsewhere"));
}

/// Runs `gpu-ledger args` under a pseudo-terminal (util-linux `script`), returning what the
/// terminal showed.
fn on_a_terminal(args: &[&str], no_color: bool) -> String {
    let bin = env!("CARGO_BIN_EXE_gpu-ledger");
    let command: Vec<String> = std::iter::once(bin)
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect();
    let command = command.join(" ");
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &command, "/dev/null"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    if no_color {
        cmd.env("NO_COLOR", "1");
    }
    let out = cmd
        .output()
        .expect("util-linux `script` runs (Debian package bsdutils)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    // An invalid log filter makes the report log one WARN line through the logger.
    let args = ["report", "--from", &homelab(), "--log", "not[a(filter"];
    let tty = on_a_terminal(&args, false);
    assert!(tty.contains("invalid log filter"), "{tty}");
    assert!(tty.contains('\u{1b}'), "a terminal gets colour: {tty:?}");
    let no_color = on_a_terminal(&args, true);
    assert!(no_color.contains("invalid log filter"), "{no_color}");
    assert!(!no_color.contains('\u{1b}'), "NO_COLOR: {no_color:?}");
    let piped = gpu_ledger()
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(
        err.contains("invalid log filter") && !err.contains('\u{1b}'),
        "{err:?}"
    );
}

#[test]
fn version_names_the_git_revision() {
    let text = stdout(&run(&["--version"]));
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git");
    let rev = String::from_utf8(rev.stdout).expect("utf8");
    assert_eq!(
        text.trim(),
        format!("gpu-ledger {} ({})", env!("CARGO_PKG_VERSION"), rev.trim())
    );
    let text = stdout(&run(&["report", "--version"]));
    assert!(text.contains(rev.trim()), "{text}");
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "_gpu__ledger()"),
        ("zsh", "#compdef gpu-ledger"),
        ("fish", "complete -c gpu-ledger"),
    ] {
        let text = stdout(&run(&["completions", shell]));
        assert!(text.contains(marker), "{shell}: {text}");
        assert!(
            text.contains("capture") && text.contains("cull-dry-run"),
            "{shell}"
        );
    }
    let out = run(&["completions", "cmd.exe"]);
    assert_eq!(out.status.code(), Some(2));
}

fn last_json_line(stderr: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no stderr output"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

#[test]
fn fatal_errors_are_json_in_the_json_log_format() {
    let out = run(&[
        "--log-format",
        "json",
        "report",
        "--from",
        "/nonexistent/dir",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let v = last_json_line(&out.stderr);
    assert_eq!(v["level"], "ERROR", "{v}");
    assert_eq!(v["exit_code"], 2, "{v}");
    assert!(
        v["error"]
            .as_str()
            .expect("error")
            .contains("/nonexistent/dir: no such directory"),
        "{v}"
    );
    // A command line clap rejects, with the format from a flag or from the environment.
    let out = run(&["report", "--log-format=json", "--window", "ten"]);
    assert_eq!(out.status.code(), Some(2));
    let v = last_json_line(&out.stderr);
    assert!(
        v["error"].as_str().expect("error").contains("--window"),
        "{v}"
    );
    let out = gpu_ledger()
        .args(["report", "--no-such-flag"])
        .env("GPU_LEDGER_LOG_FORMAT", "json")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let v = last_json_line(&out.stderr);
    assert!(
        v["error"]
            .as_str()
            .expect("error")
            .contains("--no-such-flag"),
        "{v}"
    );
    // The plain format stays one line for people.
    let out = run(&["report", "--from", "/nonexistent/dir"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: "), "{err}");
}

/// `serve` answers /metrics before it is ready (here: an apiserver that never answers), with the
/// self-metrics users expect.
#[test]
fn serve_exports_process_and_build_info_metrics() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = dir.path().join("kubeconfig");
    std::fs::write(&kc, KUBECONFIG).expect("write kubeconfig");
    let port = gpu_ledger_testkit::util::free_port().expect("port");
    let mut child = gpu_ledger()
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--kubeconfig",
        ])
        .arg(&kc)
        .env("POD_NAMESPACE", "gpu-ledger")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let got = std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .and_then(|mut s| {
                use std::io::{Read, Write};
                s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
                s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
                    .ok()?;
                let mut body = String::new();
                s.read_to_string(&mut body).ok()?;
                body.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
            });
        if let Some(body) = got.filter(|b| b.contains("gpu_ledger_build_info")) {
            break body;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve did not answer /metrics within 60 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            text.contains(&format!("\n{family} ")),
            "{family} missing:\n{text}"
        );
    }
    let rustc = text
        .lines()
        .find(|l| l.starts_with("gpu_ledger_build_info{"))
        .expect("build_info sample");
    assert!(
        rustc.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && rustc.contains("revision=\"")
            && rustc.contains("rustc=\"1.")
            && rustc.ends_with("} 1"),
        "{rustc}"
    );
    assert!(
        !rustc.contains("revision=\"unknown\""),
        "built from git: {rustc}"
    );
    let (code, report) = gpu_ledger_testkit::prometheus::promtool_check_metrics(text.as_bytes());
    assert_eq!(code, 0, "promtool check metrics: {report}");
}

/// `serve` or live `report` with a kubeconfig that does not exist: whatever gets past the
/// configuration checks fails connecting to the API (exit 1), so exit 2 means "refused".
fn without_cluster(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = gpu_ledger();
    c.args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("GPU_LEDGER_PROMETHEUS_ALLOW_INSECURE_TOKEN");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run")
}

/// A bearer token (or URL credentials) is never sent to an `http://` Prometheus unless
/// `--prometheus-allow-insecure-token` (or its env var) says so: refused at start-up, exit 2.
#[test]
fn token_over_plain_http_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    std::fs::write(&token, "secret-token-value").expect("token");
    let token = token.to_str().expect("utf8 path");
    for mode in ["serve", "report"] {
        let out = without_cluster(
            &[
                mode,
                "--prometheus-url",
                "http://127.0.0.1:9/",
                "--prometheus-bearer-token-file",
                token,
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode}: {stderr}");
        assert!(
            stderr.contains("--prometheus-bearer-token-file with an http:// --prometheus-url")
                && stderr.contains("--prometheus-allow-insecure-token"),
            "{mode}: {stderr}"
        );
        assert!(
            !stderr.contains("secret-token-value"),
            "token leaked: {stderr}"
        );
    }
    let out = without_cluster(
        &["serve", "--prometheus-url", "http://user:pw@127.0.0.1:9/"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("credentials in --prometheus-url"),
        "{stderr}"
    );
    assert!(!stderr.contains("pw@"), "password leaked: {stderr}");

    // Allowed (flag or env), or https: the check passes and the run fails later, at the API.
    let allowed = [
        (
            vec![
                "serve",
                "--prometheus-url",
                "http://127.0.0.1:9/",
                "--prometheus-bearer-token-file",
                token,
                "--prometheus-allow-insecure-token",
            ],
            vec![],
        ),
        (
            vec![
                "serve",
                "--prometheus-url",
                "http://127.0.0.1:9/",
                "--prometheus-bearer-token-file",
                token,
            ],
            vec![("GPU_LEDGER_PROMETHEUS_ALLOW_INSECURE_TOKEN", "true")],
        ),
        (
            vec![
                "serve",
                "--prometheus-url",
                "https://127.0.0.1:9/",
                "--prometheus-bearer-token-file",
                token,
            ],
            vec![],
        ),
    ];
    for (args, env) in allowed {
        let out = without_cluster(&args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("connecting to the Kubernetes API"),
            "{args:?}: {stderr}"
        );
    }
}

/// The flags of one help section (`Heading:` up to the next blank line before a heading).
fn help_section<'a>(help: &'a str, heading: &str) -> &'a str {
    let after = help
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {heading} section in\n{help}"));
    let end = after
        .match_indices("\n\n")
        .map(|(i, _)| i)
        .find(|i| {
            after[i + 2..]
                .lines()
                .next()
                .is_some_and(|l| !l.starts_with(' '))
        })
        .unwrap_or(after.len());
    &after[..end]
}

/// Issue 23: --tls-*, --api-* under "Server" (not "Culling"), --max-dump-size under "Offline
/// input", and the exit codes after every command's help.
#[test]
fn help_headings_are_where_the_flags_belong_and_exit_codes_are_listed() {
    let serve = stdout(&run(&["serve", "--help"]));
    let server = help_section(&serve, "Server:");
    let culling = help_section(&serve, "Culling:");
    for flag in [
        "--tls-cert-file",
        "--tls-key-file",
        "--api-token-file",
        "--api-auth",
    ] {
        assert!(server.contains(flag), "{flag} not under Server:\n{serve}");
        assert!(!culling.contains(flag), "{flag} under Culling:\n{serve}");
    }
    let report = stdout(&run(&["report", "--help"]));
    assert!(
        help_section(&report, "Offline input:").contains("--max-dump-size"),
        "{report}"
    );
    assert!(
        !help_section(&report, "Culling:").contains("--max-dump-size"),
        "{report}"
    );
    assert!(
        help_section(&report, "Output:").contains("-n, --namespace"),
        "{report}"
    );
    for help in [&serve, &report, &stdout(&run(&["--help"]))] {
        assert!(
            help.contains("Exit codes:") && help.contains("2  usage or bad input"),
            "{help}"
        );
    }
}

/// Issue 23: `-o yaml` carries exactly the JSON document's data.
#[test]
fn yaml_output_is_the_json_document() {
    let json = stdout(&run(&["report", "--from", &homelab(), "-o", "json"]));
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    let yaml = stdout(&run(&["report", "--from", &homelab(), "-o", "yaml"]));
    assert!(
        !yaml.trim_start().starts_with('{'),
        "YAML, not JSON:\n{yaml}"
    );
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml).expect("valid YAML");
    assert_eq!(from_yaml, json, "YAML:\n{yaml}");
    // With the culling plan too, whose document flattens the ledger beside `cull`.
    let json = stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "json",
        "--cull-dry-run",
    ]));
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    let yaml = stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "yaml",
        "--cull-dry-run",
    ]));
    let from_yaml: serde_json::Value = serde_saphyr::from_str(&yaml).expect("valid YAML");
    assert_eq!(from_yaml, json, "YAML:\n{yaml}");
    assert!(
        yaml.starts_with("generated_at:"),
        "field order as in the JSON:\n{yaml}"
    );
    assert!(json["pods"].as_array().is_some_and(|p| !p.is_empty()));
}

/// Issue 23: `-n NAMESPACE` keeps that namespace's rows; nodes stay whole.
#[test]
fn namespace_flag_filters_rows_to_one_namespace() {
    let all = stdout(&run(&["report", "--from", &homelab(), "-o", "json"]));
    let all: serde_json::Value = serde_json::from_str(&all).expect("json");
    let one = stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "json",
        "-n",
        "team-ml",
    ]));
    let one: serde_json::Value = serde_json::from_str(&one).expect("json");
    let pods = one["pods"].as_array().expect("pods");
    assert_eq!(pods.len(), 3, "{one}");
    assert!(pods.iter().all(|p| p["namespace"] == "team-ml"), "{one}");
    let namespaces = one["namespaces"].as_array().expect("namespaces");
    assert!(
        namespaces.len() == 1 && namespaces[0]["namespace"] == "team-ml",
        "{one}"
    );
    assert_eq!(one["nodes"], all["nodes"], "nodes are not namespaced");
    assert!(all["pods"].as_array().expect("pods").len() > pods.len());
    let table = stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "--namespace",
        "bench",
    ]));
    assert!(
        table.contains("llm-bench-7f9c") && !table.contains("alice-nb-0"),
        "{table}"
    );
}

/// Issue 23: a mistyped `--from` says "no such directory" (exit 2), not that a file inside it
/// cannot be read.
#[test]
fn a_missing_from_directory_is_named_as_such() {
    let missing = format!("{}x", homelab());
    let out = run(&["report", "--from", &missing]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no such directory") && err.contains(&missing),
        "{err}"
    );
    assert!(!err.contains("pods.json"), "{err}");
    let file = format!("{}/pods.json", homelab());
    let out = run(&["report", "--from", &file]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not a directory"), "{err}");
}

/// Issue 23: a window longer than the dump's history is diagnosed as such (homelab holds 2 h).
#[test]
fn a_window_longer_than_the_dump_says_how_much_the_dump_holds() {
    let out = run(&["report", "--from", &homelab(), "--window", "3h"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("the dump holds 2h of samples") && err.contains("pass --window 2h or less"),
        "{err}"
    );
    for window in ["2h", "1h"] {
        let out = run(&["report", "--from", &homelab(), "--window", window]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("the dump holds"), "--window {window}: {err}");
    }
}

/// Issue 23: with no cluster at all, `serve` prints the error chain once, each cause once.
#[test]
fn no_cluster_error_names_each_cause_once() {
    let home = tempfile::tempdir().expect("tmp");
    let out = gpu_ledger()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home.path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in\n{err}"));
    assert!(line.contains("connecting to the Kubernetes API"), "{line}");
    for cause in [
        "os error 2",
        "environment variable not found",
        ".kube/config",
        "failed to infer config:",
    ] {
        assert_eq!(
            line.matches(cause).count(),
            1,
            "{cause:?} not once in {line}"
        );
    }
    assert!(line.len() < 400, "{} characters: {line}", line.len());
}

/// Issue 23: an unreachable Prometheus is its own exit code (3, which a script may retry), not
/// a runtime failure (1) nor bad input (2); `--help` documents it.
#[test]
fn an_unreachable_prometheus_exits_3() {
    // A port nothing listens on: connection refused.
    let port = gpu_ledger_testkit::util::free_port().expect("probe port");
    let url = format!("http://127.0.0.1:{port}");
    let out = gpu_ledger()
        .args(["showback", "--month", "2026-11", "--prometheus-url", &url])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("prometheus"), "{err}");
    let help = gpu_ledger()
        .args(["report", "--help"])
        .output()
        .expect("run");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("3  unreachable"), "{help}");
}

/// Issue 36 item 16: with `-n`, every section follows the filter. The summary line counts the
/// namespace's own claimed, idle and pending GPUs and says so (the cluster's allocatable and
/// free stay, labelled as the cluster's); "Who could run" lists only pending pods of the
/// namespace; quota rows are the namespace's. The homelab: team-ml holds 3 GPUs of the
/// cluster's 4, its quota is `team-ml/compute`, the pending pod is `trials/hp-trial-42`.
#[test]
fn namespace_flag_scopes_every_section() {
    let table = stdout(&run(&["report", "--from", &homelab(), "-n", "team-ml"]));
    let summary = table.lines().nth(1).expect("summary line");
    assert!(
        summary.starts_with("GPUs in namespace team-ml: 3 claimed, 3 proven idle, 0 pending"),
        "the summary counts the namespace's own GPUs and says so: {summary}\n{table}"
    );
    assert!(
        summary.contains("cluster: 4 allocatable, 0 free"),
        "{summary}"
    );
    assert!(
        !table.contains("Who could run") && !table.contains("hp-trial-42"),
        "another namespace's pending pod: {table}"
    );
    assert!(
        !table.contains("bench"),
        "bench's quota row (or anything else of bench): {table}"
    );
    let bench = stdout(&run(&["report", "--from", &homelab(), "-n", "bench"]));
    let quotas = bench
        .split("Quotas and queues")
        .nth(1)
        .expect("bench's own quota row is shown");
    assert!(quotas.contains("bench      nvidia.com/gpu"), "{bench}");

    let json = stdout(&run(&[
        "report",
        "--from",
        &homelab(),
        "-o",
        "json",
        "-n",
        "team-ml",
    ]));
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(json["reclaim"], serde_json::json!([]), "{json}");
    assert_eq!(
        json["quotas"],
        serde_json::json!([]),
        "team-ml's quota names no GPU: no row, and none of another namespace: {json}"
    );

    // The pending pod's own namespace keeps its "Who could run" row.
    let trials = stdout(&run(&["report", "--from", &homelab(), "-n", "trials"]));
    assert!(
        trials.contains("Who could run") && trials.contains("trials/hp-trial-42"),
        "{trials}"
    );
    assert!(
        trials.lines().nth(1).is_some_and(
            |l| l.starts_with("GPUs in namespace trials: 0 claimed, 0 proven idle, 1 pending")
        ),
        "{trials}"
    );
}

/// Issue 36 item 16: a namespace the dump does not contain is an error naming it (exit 2: bad
/// input), not an empty report; one that exists but holds no GPU pod is said on stderr.
#[test]
fn namespace_flag_refuses_an_unknown_namespace() {
    let out = run(&["report", "--from", &homelab(), "-n", "team-mll"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {}\nstderr: {err}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("\"team-mll\"") && err.contains("not in the dump"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "no report for a namespace that is not there"
    );

    let out = run(&["report", "--from", &homelab(), "-n", "kube-system"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: namespace \"kube-system\" has no GPU pod and no GPU quota"),
        "{err}"
    );
}

/// Issue 36 item 17: every subcommand's `--help` carries the exit-code block (`capture` and
/// `completions` lacked it). The subcommands are read from the top-level help, so a new one is
/// covered without editing this test.
#[test]
fn every_subcommand_help_lists_the_exit_codes() {
    let top = stdout(&run(&["--help"]));
    let commands: Vec<&str> = help_section(&top, "Commands:")
        .lines()
        // A command's first line is indented by two; wrapped descriptions by more.
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(
        ["serve", "report", "capture", "completions", "showback"]
            .iter()
            .all(|c| commands.contains(c)),
        "{commands:?} from\n{top}"
    );
    for command in commands {
        let help = stdout(&run(&[command, "--help"]));
        assert!(
            help.contains("Exit codes:")
                && help.contains("2  usage or bad input")
                && help.contains("3  unreachable"),
            "`{command} --help` lacks the exit codes:\n{help}"
        );
    }
}

/// A loopback HTTP server that answers every request with `status`, `content_type` and `body`
/// (a web page where a Prometheus API is expected); returns its URL. Serves until the test ends.
fn page_server(status: &str, content_type: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 16 * 1024];
            let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    url
}

/// `gpu-ledger report` against the shared tier A control plane (testkit) as `kubeconfig`
/// says, with `--prometheus-url url`; the log filter at its default.
fn live_report(kubeconfig: &std::path::Path, url: &str) -> Output {
    gpu_ledger()
        .args(["report", "--prometheus-url", url])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("GPU_LEDGER_LOG")
        .env_remove("KUBECONFIG")
        .output()
        .expect("run gpu-ledger")
}

/// The one error line a failed command prints: nothing else on stderr claims an error (kube's
/// client logged its own ERROR line before ours), and the line carries no Debug struct.
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("error") || l.contains("ERROR"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line, not:\n{err}");
    assert!(errors[0].starts_with("error: "), "{err}");
    assert!(!err.contains("kube_client"), "kube's own log line:\n{err}");
    assert!(
        !err.contains("Status {") && !err.contains("Some("),
        "a Debug struct:\n{err}"
    );
    errors[0].to_string()
}

/// Issue 36 item 15: live `report` exits as documented (config::EXIT_CODES) and says why in one
/// line. Prometheus down: the claims are still printed, exit 3 (was 0). A URL that serves a
/// web page: exit 1 with the status, content type and a short excerpt (was the whole page).
/// A 403 from the API: exit 1, the API's message (was `Status { … }`). An API certificate
/// the kubeconfig does not trust: exit 3, "TLS failed" (was 1, after kube's ERROR log line).
#[test]
fn live_report_exit_codes_and_errors_follow_the_docs() {
    let cp = gpu_ledger_testkit::ControlPlane::shared(false).expect("shared tier A control plane");
    let admin = cp.kubeconfig_path("admin").expect("kubeconfig");

    let closed = gpu_ledger_testkit::util::free_port().expect("probe port");
    let out = live_report(&admin, &format!("http://127.0.0.1:{closed}"));
    let line = one_error_line(&out);
    assert_eq!(out.status.code(), Some(3), "{line}");
    assert!(line.contains("prometheus"), "{line}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("Usage unavailable") && table.contains("Nodes"),
        "the claims are still reported:\n{table}"
    );

    // A web page, long, with a secret-looking tail that must not reach the terminal.
    let page = format!(
        "<!DOCTYPE html>\n<html><head><title>Grafana</title></head><body>{}SECRET-TAIL</body></html>",
        "<div>login</div>\n".repeat(200)
    );
    for status in ["200 OK", "404 Not Found"] {
        let url = page_server(status, "text/html; charset=utf-8", &page);
        let out = live_report(&admin, &url);
        let line = one_error_line(&out);
        assert_eq!(out.status.code(), Some(1), "{status}: {line}");
        let code = &status[..3];
        assert!(
            line.contains("not a Prometheus API answer")
                && line.contains(&format!("HTTP {code}"))
                && line.contains("text/html")
                && line.contains("<!DOCTYPE html>"),
            "{line}"
        );
        assert!(
            !line.contains("SECRET-TAIL") && line.len() < 400,
            "{} characters: {line}",
            line.len()
        );
    }

    // A user without any grant: the API answers 403.
    let intruder = cp.kubeconfig_path("intruder").expect("kubeconfig");
    let prometheus = page_server(
        "200 OK",
        "application/json",
        r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
    );
    let out = live_report(&intruder, &prometheus);
    let line = one_error_line(&out);
    assert_eq!(out.status.code(), Some(1), "{line}");
    assert!(
        line.contains("403 Forbidden") && line.contains("cannot list resource"),
        "{line}"
    );

    // The API server's certificate, not signed by a CA the kubeconfig trusts (none given: the
    // system roots).
    let dir = tempfile::tempdir().expect("tmp");
    let untrusted = dir.path().join("kubeconfig");
    std::fs::write(
        &untrusted,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
             current-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
            cp.server_url()
        ),
    )
    .expect("kubeconfig");
    let out = live_report(&untrusted, &prometheus);
    let line = one_error_line(&out);
    assert_eq!(out.status.code(), Some(3), "{line}");
    assert!(line.contains("certificate"), "{line}");
}

/// The report of a dump dir under `tests/fixtures/` (`-o json --cull-dry-run`), as JSON.
fn fixture_report(dir: &str) -> serde_json::Value {
    let path = format!("{}/tests/fixtures/{dir}", env!("CARGO_MANIFEST_DIR"));
    let out = gpu_ledger()
        .args(["report", "-o", "json", "--cull-dry-run", "--from", &path])
        .env_remove("GPU_LEDGER_KAI_RESERVATION_NAMESPACES")
        .output()
        .expect("run");
    serde_json::from_str(&stdout(&out)).expect("report JSON")
}

/// The row of `pod` (any namespace) in a report's `key` list.
fn row_of<'a>(
    v: &'a serde_json::Value,
    key: &str,
    field: &str,
    name: &str,
) -> &'a serde_json::Value {
    v[key]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r[field] == name))
        .unwrap_or_else(|| panic!("{name} listed in {key}: {v}"))
}

fn close(v: &serde_json::Value, want: f64) -> bool {
    v.as_f64().is_some_and(|g| (g - want).abs() < 1e-9)
}

/// KAI-Scheduler fractions offline (`tests/fixtures/kai`, see its README): each reservation pod's
/// card is handed to its users in their own namespaces (by `gpu-fraction`, or `gpu-memory` over
/// the node's `nvidia.com/gpu.memory`), the reservation pod keeps the rest, a share that cannot
/// be known is said so, an idle card proves its users idle, a busy one proves nothing, and neither
/// the reservation pods nor the pending fraction are planned or culled.
#[test]
fn kai_fractions_hand_the_reserved_card_to_its_users() {
    let v = fixture_report("kai");
    let pod = |name: &str| row_of(&v, "pods", "pod", name);
    for (name, gpus, idle) in [
        ("nb-half", 0.5, Some(true)),
        ("infer-mem", 0.25, Some(true)),
        ("gpu-reservation-3f9a1c2e", 0.25, Some(true)),
        ("old-frac", 0.3, None),
        ("mem-unknown", 0.0, None),
        ("gpu-reservation-kai-2-x7k2p", 0.7, None),
        ("pending-frac", 0.5, None),
    ] {
        let r = pod(name);
        assert!(close(&r["gpus"], gpus), "{name}: gpus {gpus}: {r}");
        if name != "gpu-reservation-kai-2-x7k2p" {
            assert_eq!(r["idle"].as_bool(), idle, "{name}: {r}");
        }
    }
    let s = &pod("nb-half")["sharing"];
    assert_eq!(s["layer"], "kai-fraction", "{s}");
    assert!(close(&s["share"], 0.5), "{s}");
    assert_eq!(
        s["uuids"],
        serde_json::json!(["GPU-3b8f9e2d-6a41-4c7e-9f0b-2d5e8a1c4f63"])
    );
    assert_eq!(pod("nb-half")["attribution"], "shared");
    assert_eq!(pod("infer-mem")["sharing"]["gpu_memory_mib"], 6141);
    // The old namespace's card is joined by the UUID its reservation pod recorded (no series
    // names a pod there), and busy: its users are not proven idle, nor called busy.
    assert_eq!(pod("old-frac")["attribution"], "shared");
    assert_eq!(
        pod("old-frac")["devices"][0]["uuid"],
        "GPU-8983c66a-23df-e63b-4c2f-afcae9ec79b3"
    );
    let unknown = &pod("mem-unknown")["sharing"];
    assert!(unknown["share"].is_null(), "{unknown}");
    assert!(
        unknown["unknown"]
            .as_str()
            .is_some_and(|u| u.contains("nvidia.com/gpu.memory")),
        "{unknown}"
    );
    let res = &pod("gpu-reservation-3f9a1c2e")["sharing"];
    assert_eq!(res["layer"], "kai-reservation", "{res}");
    assert_eq!(res["users"], 2);
    assert!(close(&res["unassigned"], 0.25), "{res}");
    assert_eq!(pod("gpu-reservation-kai-2-x7k2p")["sharing"]["users"], 2);
    // Nodes hold one card each, counted once; namespaces count the users' shares.
    for node in ["kai-1", "kai-2"] {
        let n = row_of(&v, "nodes", "node", node);
        assert!(close(&n["gpus_claimed"], 1.0), "{n}");
    }
    for (ns, claimed, idle, pending) in [
        ("team-a", 0.8, 0.5, 0.0),
        ("team-b", 0.25, 0.25, 0.5),
        ("kai-resource-reservation", 0.25, 0.25, 0.0),
        ("runai-reservation", 0.7, 0.0, 0.0),
    ] {
        let n = row_of(&v, "namespaces", "namespace", ns);
        assert!(close(&n["gpus_claimed"], claimed), "{ns} claimed: {n}");
        assert!(close(&n["gpus_idle"], idle), "{ns} idle: {n}");
        assert!(close(&n["gpus_pending"], pending), "{ns} pending: {n}");
    }
    assert_eq!(v["unclaimed_busy"], serde_json::json!([]), "{v}");
    assert!(
        v["reclaim"]
            .as_array()
            .is_none_or(|r| r.iter().all(|p| p["pending"]["pod"] != "pending-frac")),
        "KAI places fractions, not the scheduler: {}",
        v["reclaim"]
    );
    let skipped = v["cull"]["skipped"].as_array().expect("skipped");
    for name in ["gpu-reservation-3f9a1c2e", "gpu-reservation-kai-2-x7k2p"] {
        assert!(
            skipped
                .iter()
                .any(|s| s["pod"] == name && s["reason"] == "kai_reservation"),
            "{name}: {skipped:?}"
        );
    }
    // The table says what each row is.
    let path = format!("{}/tests/fixtures/kai", env!("CARGO_MANIFEST_DIR"));
    let table = stdout(&run(&["report", "--from", &path]));
    for needle in [
        "KAI fraction 0.5 of a card",
        "KAI fraction (8192 MiB asked): share unknown",
        "KAI reservation pod for 2 fraction user(s): holds only the unassigned 0.25",
    ] {
        assert!(table.contains(needle), "missing {needle:?} in\n{table}");
    }
}

/// MPS offline (`tests/fixtures/mps`, see its README): the strategy label makes the clients
/// MPS sharers whether or not the product carries `-SHARED`; each holds 1/replicas of a card
/// with its caps shown; idle cards prove no client idle; nothing is culled; model names lose
/// the suffix.
#[test]
fn mps_clients_are_shared_capped_and_never_proven_idle() {
    let v = fixture_report("mps");
    let pod = |name: &str| row_of(&v, "pods", "pod", name);
    let t4 = pod("mps-t4");
    assert!(close(&t4["gpus"], 0.25), "{t4}");
    assert_eq!(
        t4["sharing"],
        serde_json::json!({"layer": "mps", "replicas": 4, "memory_cap_bytes": null,
            "compute_cap_percent": 25.0})
    );
    let rtx = pod("mps-rtx");
    assert!(close(&rtx["gpus"], 0.5), "{rtx}");
    assert_eq!(
        rtx["sharing"],
        serde_json::json!({"layer": "mps", "replicas": 2,
            "memory_cap_bytes": 24564_u64 * 1024 * 1024 / 2, "compute_cap_percent": 50.0})
    );
    for p in [t4, rtx] {
        assert!(p["idle"].is_null(), "no per-client readings under MPS: {p}");
        assert!(p["utilization"].is_null(), "{p}");
    }
    for (node, alloc) in [("t4-mps", 4.0), ("rtx-mps", 1.0)] {
        let n = row_of(&v, "nodes", "node", node);
        assert!(close(&n["gpus_allocatable"], alloc), "{n}");
    }
    let skipped = v["cull"]["skipped"].as_array().expect("skipped");
    for name in ["mps-t4", "mps-rtx"] {
        assert!(
            skipped
                .iter()
                .any(|s| s["pod"] == name && s["reason"] == "mps_sharer"),
            "{name}: {skipped:?}"
        );
    }
    let path = format!("{}/tests/fixtures/mps", env!("CARGO_MANIFEST_DIR"));
    let table = stdout(&run(&["report", "--from", &path]));
    assert!(
        table.contains("MPS client, 1/2 of a card: memory cap 12.0Gi, compute cap 50%"),
        "{table}"
    );
}
