//! `gpu-ledger serve` end to end: the real binary against a tier B control plane (kwok GPU
//! nodes), the fake dcgm-exporter test double scraped by a real Prometheus WITHOUT
//! honor_labels (workload labels arrive as `exported_pod`…), as token user `gpu-ledger` bound to
//! the shipped read-only ClusterRole only. Checks `/readyz`, `/api/v1/ledger`, `/metrics`
//! (including `promtool check metrics`), series removal on pod deletion, and a Prometheus
//! outage (allocation keeps flowing, utilisation becomes unknown, recovery after restart).

mod support;

use std::time::Duration;

use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::prometheus::promtool_check_metrics;
use gpu_ledger_testkit::stack::{GpuLedgerProcess, metric_value};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::Value;
use support::{Grants, eventually, tier_b};

const NS: &str = "team-ml";
const WAIT: Duration = Duration::from_secs(60);

/// promtool lint findings accepted on `/metrics` (documented in docs/metrics.md, "promtool
/// lint"). Empty: the exposition must lint clean.
const PROMTOOL_LINT_ALLOW: &[&str] = &[];

fn pod_row<'a>(ledger: &'a Value, pod: &str) -> Option<&'a Value> {
    ledger["pods"]
        .as_array()?
        .iter()
        .find(|p| p["namespace"] == NS && p["pod"] == pod)
}

async fn ledger_row(gl: &GpuLedgerProcess, pod: &str) -> Option<Value> {
    gl.pod_row(NS, pod).await
}

// One scenario on one stack: a stack costs ~10 s to start, the steps build on each other.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_end_to_end_with_prometheus_outage() {
    // `broken`: GFD says three GPUs, the device plugin advertises none ("three GPUs, zero
    // schedulable").
    let mut stack = tier_b(
        &[
            GpuNode::new("gpu-1", 1),
            GpuNode::new("gpu-2", 1),
            GpuNode::new("broken", 0).label("nvidia.com/gpu.count", "3"),
        ],
        Grants::ReadOnly,
    )
    .await;
    let admin = stack.admin();
    stack.ensure_namespace(NS).await.expect("namespace");
    stack
        .create_gpu_pod(NS, "busy", 1, Some(90.0))
        .await
        .expect("busy pod");
    stack
        .create_gpu_pod(NS, "idle", 1, Some(0.0))
        .await
        .expect("idle pod");
    // Both nodes are full: this one stays Pending (Insufficient nvidia.com/gpu).
    stack
        .create_gpu_pod(NS, "waiting", 1, None)
        .await
        .expect("pending pod");
    stack
        .wait_pod_running(NS, "busy")
        .await
        .expect("busy Running");
    stack
        .wait_pod_running(NS, "idle")
        .await
        .expect("idle Running");

    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &[],
        )
        .await
        .expect("gpu-ledger serve ready");
    assert_eq!(gl.status("/readyz").await.expect("readyz"), 200);

    // Busy: exclusive, utilisation ≈ 0.9, attributed through `exported_pod`.
    let busy = eventually("busy pod attributed with utilisation", WAIT, || async {
        ledger_row(&gl, "busy")
            .await
            .filter(|r| r["attribution"] == "exclusive" && r["utilization"].is_number())
    })
    .await;
    let u = busy["utilization"].as_f64().expect("utilization");
    assert!((u - 0.9).abs() < 0.01, "busy utilisation {u}: {busy}");
    assert_eq!(busy["state"], "running");
    assert_eq!(busy["idle"], false, "{busy}");

    // The scrape renamed the workload labels: Prometheus holds `exported_pod="busy"` and the
    // exporter's own `pod` label, so attribution above went through `exported_pod`.
    let q: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/query", stack.prometheus.url()))
        .query(&[(
            "query",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_pod=\"busy\"}",
        )])
        .send()
        .await
        .expect("query prometheus")
        .json()
        .await
        .expect("json");
    let series = &q["data"]["result"][0]["metric"];
    assert_eq!(series["exported_namespace"], NS, "{q}");
    assert_eq!(series["pod"], "nvidia-dcgm-exporter-x7k2p", "{q}");

    // Idle: proven idle once a full 10 s window of samples exists.
    let idle = eventually("idle pod proven idle", WAIT, || async {
        ledger_row(&gl, "idle").await.filter(|r| r["idle"] == true)
    })
    .await;
    assert_eq!(idle["attribution"], "exclusive", "{idle}");
    assert!(idle["utilization"].as_f64().expect("utilization") < 0.01);
    let waiting = ledger_row(&gl, "waiting")
        .await
        .expect("pending pod listed");
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert_eq!(waiting["attribution"], "none", "{waiting}");

    // /metrics.
    let text = gl.metrics_text().await.expect("metrics");
    for (pod, state, attribution) in [
        ("busy", "running", "exclusive"),
        ("idle", "running", "exclusive"),
        ("waiting", "pending", "none"),
    ] {
        let v = metric_value(
            &text,
            "gpu_ledger_pod_gpus",
            &[
                ("namespace", NS),
                ("pod", pod),
                ("state", state),
                ("attribution", attribution),
                ("resource", "nvidia.com/gpu"),
            ],
        );
        assert_eq!(v, Some(1.0), "gpu_ledger_pod_gpus for {pod} in:\n{text}");
    }
    assert_eq!(
        metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]),
        Some(1.0)
    );
    for (node, lost) in [("broken", 3.0), ("gpu-1", 0.0), ("gpu-2", 0.0)] {
        assert_eq!(
            metric_value(
                &text,
                "gpu_ledger_node_gpus_unschedulable",
                &[("node", node)]
            ),
            Some(lost),
            "unschedulable GPUs of {node} in:\n{text}"
        );
    }
    let ledger = gl.ledger_json().await.expect("ledger");
    let broken = ledger["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node"] == "broken"))
        .unwrap_or_else(|| panic!("node broken listed: {ledger}"));
    assert_eq!(
        (&broken["gpus_allocatable"], &broken["gpus_unschedulable"]),
        (&serde_json::json!(0.0), &serde_json::json!(3.0)),
        "{broken}"
    );
    let (code, out) = promtool_check_metrics(text.as_bytes());
    match code {
        0 => {}
        3 => {
            for line in out.lines().filter(|l| !l.trim().is_empty()) {
                assert!(
                    PROMTOOL_LINT_ALLOW.iter().any(|a| line.contains(a)),
                    "promtool lint finding not in the allow-list: {line}\n{out}"
                );
            }
        }
        _ => panic!("promtool check metrics failed ({code}):\n{out}\n--- metrics:\n{text}"),
    }

    // Deleting a pod takes its series out of /metrics within a few refreshes.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    pods.delete("idle", &DeleteParams::default())
        .await
        .expect("delete idle pod");
    eventually("idle pod's series gone from /metrics", WAIT, || async {
        let t = gl.metrics_text().await.ok()?;
        (!t.contains("pod=\"idle\"")).then_some(())
    })
    .await;

    // Prometheus outage: claims keep flowing, utilisation becomes unknown (absent, not 0),
    // source_up{prometheus} 0, still ready.
    stack.prometheus.stop(Duration::from_secs(5));
    let text = eventually("source_up{prometheus} 0", WAIT, || async {
        let t = gl.metrics_text().await.ok()?;
        (metric_value(&t, "gpu_ledger_source_up", &[("source", "prometheus")]) == Some(0.0))
            .then_some(t)
    })
    .await;
    // Let several refreshes (1 s each) run on the outage.
    let ledger = eventually("several refreshes during the outage", WAIT, || async {
        let before = metric_value(&text, "gpu_ledger_last_refresh_timestamp_seconds", &[])?;
        let t = gl.metrics_text().await.ok()?;
        let now = metric_value(&t, "gpu_ledger_last_refresh_timestamp_seconds", &[])?;
        if now - before < 3.0 {
            return None;
        }
        Some((t, gl.ledger_json().await.ok()?))
    })
    .await;
    let (text, ledger) = ledger;
    assert_eq!(
        metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]),
        Some(0.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "gpu_ledger_pod_gpus",
            &[("namespace", NS), ("pod", "busy"), ("state", "running")]
        ),
        Some(1.0),
        "allocation keeps flowing during the outage:\n{text}"
    );
    assert!(
        metric_value(
            &text,
            "gpu_ledger_pod_gpu_utilization_ratio",
            &[("namespace", NS), ("pod", "busy")]
        )
        .is_none(),
        "utilisation must be absent (unknown) during the outage, not 0:\n{text}"
    );
    assert_eq!(ledger["usage_available"], false, "{ledger}");
    let busy = pod_row(&ledger, "busy").expect("busy listed");
    assert!(busy["utilization"].is_null(), "unknown, never 0: {busy}");
    assert!(busy["idle"].is_null(), "{busy}");
    assert_eq!(gl.status("/readyz").await.expect("readyz"), 200);

    // Recovery: same port and TSDB.
    stack
        .prometheus
        .restart()
        .await
        .expect("prometheus restart");
    eventually("recovered after the outage", WAIT, || async {
        let t = gl.metrics_text().await.ok()?;
        let up = metric_value(&t, "gpu_ledger_source_up", &[("source", "prometheus")]);
        let u = metric_value(
            &t,
            "gpu_ledger_pod_gpu_utilization_ratio",
            &[("namespace", NS), ("pod", "busy")],
        )?;
        (up == Some(1.0) && (u - 0.9).abs() < 0.01).then_some(())
    })
    .await;
    assert_eq!(gl.status("/readyz").await.expect("readyz"), 200);
}
