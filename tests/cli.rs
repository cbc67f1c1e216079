//! The binary as users run it: the README's first command, the JSON contract, culling dry-run
//! against the homelab, and bad input (clear message naming the input, exit code 2, no panic).

use std::process::Command;

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
        "Who holds what",
        "alice-nb-0",
        "stuck terminating",
        "Insufficient nvidia.com/gpu",
        "Nodes",
        "TOTAL",
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

#[test]
fn cull_dry_run_lists_exactly_the_idle_notebook() {
    let out = gpu_ledger()
        .args(["report", "--from", &homelab(), "--cull-dry-run"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf8");
    let stops: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("STOP"))
        .collect();
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
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dir/pods.json"));

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
