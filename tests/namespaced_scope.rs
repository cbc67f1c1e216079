//! A namespaced install (`--namespaces`) against the real stack (tier B, kwok GPU node, the
//! fake dcgm-exporter test double scraped by a real Prometheus): a busy GPU held by a pod of a
//! namespace gpu-ledger does not watch is not reported as unclaimed busy (it would page
//! `GpuLedgerUnclaimedBusyGpu`), and the node's free count is unknown (`null` in the JSON, no
//! `gpu_ledger_node_gpus_free` series) — the ledger cannot see every claim on the node.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::GpuNode;
use serde_json::Value;
use support::{Grants, eventually, tier_b};

const WATCHED: &str = "team-a";
const UNWATCHED: &str = "team-b";
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_gpu_of_an_unwatched_namespace_is_not_unclaimed() {
    let stack = tier_b(&[GpuNode::new("gpu-1", 2)], Grants::ReadOnly).await;
    for ns in [WATCHED, UNWATCHED] {
        stack.ensure_namespace(ns).await.expect("namespace");
    }
    stack
        .create_gpu_pod(WATCHED, "mine", 1, Some(50.0))
        .await
        .expect("watched pod");
    stack
        .create_gpu_pod(UNWATCHED, "theirs", 1, Some(90.0))
        .await
        .expect("unwatched pod");
    for (ns, pod) in [(WATCHED, "mine"), (UNWATCHED, "theirs")] {
        stack.wait_pod_running(ns, pod).await.expect("Running");
    }
    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &["--namespaces", WATCHED],
        )
        .await
        .expect("gpu-ledger serve ready");

    // The unwatched pod's device is busy in Prometheus …
    let http = reqwest::Client::new();
    eventually("the unwatched pod's device series", WAIT, || async {
        let q: Value = http
            .get(format!("{}/api/v1/query", stack.prometheus.url()))
            .query(&[(
                "query",
                format!(
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{exported_namespace=\"{UNWATCHED}\"}} > 0.5"
                ),
            )])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        q["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
            .then_some(())
    })
    .await;
    // … and the watched pod's utilisation, scraped at the same time, reached the ledger.
    eventually("the watched pod's utilisation", WAIT, || async {
        gl.pod_row(WATCHED, "mine")
            .await
            .filter(|r| r["utilization"].is_number())
    })
    .await;
    let l = gl.ledger_json().await.expect("ledger");
    assert!(
        gl.pod_row(UNWATCHED, "theirs").await.is_none(),
        "the unwatched namespace's pod is not listed: {l}"
    );

    // Several refreshes later, still nothing unclaimed and no free count.
    for _ in 0..10 {
        let l = gl.ledger_json().await.expect("ledger");
        assert_eq!(
            l["unclaimed_busy"],
            serde_json::json!([]),
            "a namespaced ledger cannot prove a device unclaimed: {l}"
        );
        let node = l["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["node"] == "gpu-1"))
            .expect("node row");
        assert!(node["gpus_free"].is_null(), "{node}");
        assert_eq!(node["gpus_allocatable"], 2.0, "{node}");
        let text = gl.metrics_text().await.expect("metrics");
        assert!(
            !text.contains("\ngpu_ledger_unclaimed_busy_gpu_utilization_ratio{"),
            "{text}"
        );
        assert!(!text.contains("\ngpu_ledger_node_gpus_free{"), "{text}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
