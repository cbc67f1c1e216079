//! A stop that keeps failing does not starve culling of the others, against the real
//! kube-apiserver (tier B stack: kwok GPU nodes, StatefulSet controller, the fake dcgm-exporter
//! test double scraped by a real Prometheus).
//!
//! Token user `gpu-ledger` gets the shipped read-only RBAC and the shipped culling RBAC with one
//! change: `patch` on Notebooks is limited by `resourceNames` to `allowed-nb`, so every stop of
//! `forbidden-nb` is refused with 403 (as RBAC, an admission webhook or a policy would refuse
//! some notebooks in a real cluster). `--cull-max-per-cycle 1`; `forbidden-nb` is the longer
//! idle (created first, and its namespace sorts first on a tie), so the plan picks it first.
//! Without a per-notebook backoff it was retried first in every cycle and `allowed-nb` was never
//! stopped; with it, the failed notebook sits out cycles (skip reason `backoff`) and the allowed
//! one is stopped within a few cycles.
//!
//! Kubeflow's notebook controller is not needed: the test reads the stop annotation itself.

mod support;

use std::time::Duration;

use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::stack::{GpuLedgerProcess, Notebook, metric_value};
use support::{CULLING_RBAC, eventually, notebook_stopped};

/// Sorts before [`ALLOWED_NS`]: on equal idle time the plan still picks the forbidden one first.
const FORBIDDEN_NS: &str = "cull-a";
const ALLOWED_NS: &str = "cull-b";
/// The shipped rule on Notebooks, replaced below.
const SHIPPED_NOTEBOOK_RULE: &str = "  - apiGroups: [\"kubeflow.org\"]\n    resources: [\"notebooks\"]\n    verbs: [\"get\", \"patch\"]\n";
/// `get` on every Notebook, `patch` on `allowed-nb` only.
const LIMITED_NOTEBOOK_RULES: &str = "  - apiGroups: [\"kubeflow.org\"]\n    resources: [\"notebooks\"]\n    verbs: [\"get\"]\n  - apiGroups: [\"kubeflow.org\"]\n    resources: [\"notebooks\"]\n    resourceNames: [\"allowed-nb\"]\n    verbs: [\"patch\"]\n";
/// Generous: the machine is busy, and the cycles here are 1 s refreshes.
const WAIT: Duration = Duration::from_secs(120);

async fn metric(gl: &GpuLedgerProcess, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric_value(&gl.metrics_text().await.ok()?, family, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_notebook_backs_off_and_the_allowed_one_is_stopped() {
    let stack = support::tier_b(
        &[GpuNode::new("n1", 1), GpuNode::new("n2", 1)],
        support::Grants::ReadOnly,
    )
    .await;
    let admin = stack.admin();
    assert!(
        CULLING_RBAC.contains(SHIPPED_NOTEBOOK_RULE),
        "shipped culling RBAC changed shape; update this test"
    );
    let limited = CULLING_RBAC.replace(SHIPPED_NOTEBOOK_RULE, LIMITED_NOTEBOOK_RULES);
    stack
        .grant_rbac(&limited, "gpu-ledger")
        .await
        .expect("culling RBAC limited to allowed-nb");

    // The forbidden notebook first: it is the longest idle from then on.
    let forbidden = Notebook::new(FORBIDDEN_NS, "forbidden-nb").node("n1");
    stack.create_notebook(&forbidden).await.expect("notebook");
    stack
        .wait_pod_running(FORBIDDEN_NS, &forbidden.pod_name())
        .await
        .expect("forbidden-nb-0 Running");

    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &[
                "--cull=on",
                "--lease-name",
                "gpu-ledger",
                "--cull-max-per-cycle",
                "1",
                "--cull-idle-after",
                "5s",
                "--cull-min-runtime",
                "5s",
            ],
        )
        .await
        .expect("gpu-ledger");

    // The stop of forbidden-nb is tried and refused (403) before allowed-nb exists.
    eventually("a refused stop of forbidden-nb", WAIT, || async {
        (metric(&gl, "gpu_ledger_cull_stops_total", &[("result", "error")]).await? >= 1.0)
            .then_some(())
    })
    .await;
    assert!(!notebook_stopped(&admin, FORBIDDEN_NS, "forbidden-nb").await);

    let allowed = Notebook::new(ALLOWED_NS, "allowed-nb").node("n2");
    stack.create_notebook(&allowed).await.expect("notebook");
    stack
        .wait_pod_running(ALLOWED_NS, &allowed.pod_name())
        .await
        .expect("allowed-nb-0 Running");

    // Within a few cycles of becoming a candidate, allowed-nb gets the one slot of a cycle in
    // which forbidden-nb sits out.
    eventually("allowed-nb stopped", WAIT, || async {
        notebook_stopped(&admin, ALLOWED_NS, "allowed-nb")
            .await
            .then_some(())
    })
    .await;
    assert!(
        !notebook_stopped(&admin, FORBIDDEN_NS, "forbidden-nb").await,
        "RBAC refuses forbidden-nb's stop"
    );
    let backoff_skips = metric(&gl, "gpu_ledger_cull_skips_total", &[("reason", "backoff")])
        .await
        .unwrap_or(0.0);
    assert!(
        backoff_skips >= 1.0,
        "forbidden-nb was skipped as backoff: {backoff_skips}"
    );
    assert_eq!(
        metric(&gl, "gpu_ledger_cull_backoff_notebooks", &[]).await,
        Some(1.0),
        "one notebook backs off: forbidden-nb"
    );
    assert_eq!(
        metric(&gl, "gpu_ledger_cull_stops_total", &[("result", "stopped")]).await,
        Some(1.0)
    );
    // For the log: how often the refused stop was tried (once per cycle without the backoff).
    let errors = metric(&gl, "gpu_ledger_cull_stops_total", &[("result", "error")])
        .await
        .unwrap_or(0.0);
    eprintln!("refused stops of forbidden-nb so far: {errors}");
}
