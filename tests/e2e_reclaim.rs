//! Demand-driven culling end to end (`--cull-when=demand`): a real `gpu-ledger serve` with
//! `--cull=on` against a tier B control plane (kube-scheduler, kwok GPU nodes, StatefulSet
//! controller), the fake dcgm-exporter scraped by a real Prometheus, as token user `gpu-ledger`
//! bound to the shipped read-only and culling RBAC.
//!
//! Kubeflow's notebook controller is emulated by its one rule culling relies on
//! ([`gpu_ledger_testkit::stack::spawn_notebook_stop_rule`], as in `tests/e2e_cull.rs`).
//!
//! Three one-card nodes, each held by an idle notebook: `n1` and `n2` carry `pool=train`, `n2`
//! is tainted `dedicated=infer:NoSchedule` once its notebook runs, `n3` carries `pool=infer`.
//! 1. Nothing waits: the three notebooks pass every culling rule (counted as `no_demand`
//!    skips), and none is stopped.
//! 2. A pod asking for one `nvidia.com/gpu` with `nodeSelector: pool=train` and no toleration
//!    arrives: only `n1` would take it, by stopping `idle-nb`. That notebook is stopped, with
//!    the Event naming the pod; the real scheduler binds the pod to the freed card on `n1`; the
//!    notebooks on the tainted node and off the selector are left alone.
//!
//! The third test (issue 36, item 1): a pod held back by a scheduling gate (Kueue's pod
//! integration gates `kueue.x-k8s.io/admission` until it admits the workload) is no demand: the
//! idle notebook whose card it would take is left running, the pod is not counted as
//! reclaimable, and "Who could run" says why; once the gate is removed, the same pod gets the
//! stop and the card.
//!
//! The second test tells the whole story with `--cull-notice`: no notice while nothing waits;
//! when a pod arrives the notebook it needs gets its notice; its owner snoozes it, which cancels
//! the stop; the other notebook gets the notice instead, is stopped once it runs out, and the
//! real scheduler binds the pod to its card; `kubectl describe notebook` tells both stories.

mod support;

use std::time::Duration;

use chrono::{DateTime, Utc};
use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::stack::{
    GpuLedgerProcess, Notebook, STOP_ANNOTATION, Stack, metric_value, spawn_notebook_stop_rule,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use support::eventually;

const NS: &str = "team-ml";
const TRIALS: &str = "trials";
/// Generous: the machine is shared; every step below takes seconds when it is not.
const WAIT: Duration = Duration::from_secs(120);

async fn stopped(admin: &kube::Client, name: &str) -> bool {
    support::notebook_stopped(admin, NS, name).await
}

async fn annotation(admin: &kube::Client, name: &str, key: &str) -> Option<String> {
    support::notebook_annotations(admin, NS, name)
        .await
        .remove(key)
}

fn parse_time(value: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value)
        .expect("RFC 3339 annotation")
        .with_timezone(&Utc)
}

const NOTICE_ANNOTATION: &str = "gpu-ledger.io/stop-scheduled-at";

async fn stop_events(admin: &kube::Client, notebook: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(admin.clone(), NS);
    api.list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("IdleGPUStopped")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(notebook)
        })
        .collect()
}

async fn metric(gl: &GpuLedgerProcess, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric_value(&gl.metrics_text().await.ok()?, family, labels)
}

/// Creates the notebooks (each pinned to its node) and waits for their pods to run.
async fn notebooks_running(stack: &Stack, notebooks: &[Notebook]) {
    for nb in notebooks {
        stack.create_notebook(nb).await.expect("notebook");
    }
    for nb in notebooks {
        stack
            .wait_pod_running(&nb.namespace, &nb.pod_name())
            .await
            .expect("notebook pod Running");
    }
}

/// `gpu-ledger serve` culling on demand (short timings), with `extra` flags.
async fn start_demand_culling(stack: &Stack, extra: &[&str]) -> GpuLedgerProcess {
    let mut args = vec![
        "--cull=on",
        "--cull-when=demand",
        "--lease-name",
        "gpu-ledger",
        "--cull-idle-after",
        "15s",
        "--cull-min-runtime",
        "5s",
    ];
    args.extend_from_slice(extra);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    stack
        .start_gpu_ledger(bin, "gpu-ledger", &args)
        .await
        .expect("gpu-ledger")
}

/// Waits until a plan skipped at least `notebooks` candidates for no demand and kept none.
async fn no_demand_skips(gl: &GpuLedgerProcess, notebooks: f64) {
    eventually(
        "every notebook skipped for no demand in one plan",
        WAIT,
        || async {
            let skipped = metric(
                gl,
                "gpu_ledger_cull_skips_total",
                &[("reason", "no_demand")],
            )
            .await?;
            let candidates = metric(gl, "gpu_ledger_cull_candidates", &[]).await?;
            (skipped >= notebooks && candidates == 0.0).then_some(())
        },
    )
    .await;
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_notebook_is_stopped_only_for_a_pod_that_fits_by_it() {
    let nodes = [
        GpuNode::new("n1", 1).label("pool", "train"),
        GpuNode::new("n2", 1).label("pool", "train"),
        GpuNode::new("n3", 1).label("pool", "infer"),
    ];
    let stack = support::tier_b(&nodes, support::Grants::Culling).await;
    let admin = stack.admin();
    let _controller = AbortOnDrop(spawn_notebook_stop_rule(admin.clone()));

    let notebooks = [
        Notebook::new(NS, "idle-nb").node("n1"),
        Notebook::new(NS, "tainted-nb").node("n2"),
        Notebook::new(NS, "infer-nb").node("n3"),
    ];
    notebooks_running(&stack, &notebooks).await;
    // NoSchedule keeps new pods off n2 and leaves its running notebook alone.
    Api::<Node>::all(admin.clone())
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"taints": [
                {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}})),
        )
        .await
        .expect("taint n2");

    let gl = start_demand_culling(&stack, &[]).await;

    // 1. Nothing waits: every notebook qualifies, none is stopped.
    no_demand_skips(&gl, 3.0).await;
    // A few more cycles (1 s refresh) with candidates and no demand.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for nb in ["idle-nb", "tainted-nb", "infer-nb"] {
        assert!(
            !stopped(&admin, nb).await,
            "{nb} stopped while nothing waits"
        );
    }
    assert_eq!(
        metric(&gl, "gpu_ledger_cull_stops_total", &[("result", "stopped")]).await,
        Some(0.0)
    );

    // 2. A pod that fits only on n1 arrives.
    support::namespace(&admin, TRIALS, &[]).await;
    let trials: Api<Pod> = Api::namespaced(admin.clone(), TRIALS);
    trials
        .create(&PostParams::default(), &trial_pod())
        .await
        .expect("create trial");

    // The real scheduler places the pod on the card the stop freed.
    idle_nb_stopped_for_trial_and_trial_bound_to_n1(&admin, &trials).await;
    stack
        .wait_pod_running(TRIALS, "trial-1")
        .await
        .expect("trial-1 Running");
    // The tainted node's and the other pool's notebooks were never needed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for nb in ["tainted-nb", "infer-nb"] {
        assert!(!stopped(&admin, nb).await, "{nb} must not be stopped");
        assert!(stop_events(&admin, nb).await.is_empty(), "{nb} stop Event");
    }
    assert_eq!(stop_events(&admin, "idle-nb").await.len(), 1, "one stop");
}

/// The pending pod: one `nvidia.com/gpu` on a `pool=train` node, no toleration.
fn trial_pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "trial-1"},
        "spec": {
            "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "nodeSelector": {"pool": "train"},
            "terminationGracePeriodSeconds": 1
        }
    }))
    .expect("pod")
}

/// Kueue's scheduling gate on the pods of a workload it has not admitted yet
/// (kubernetes-sigs/kueue, `pkg/controller/jobs/pod`).
const KUEUE_GATE: &str = "kueue.x-k8s.io/admission";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduling_gated_pod_stops_nothing_until_its_gate_is_removed() {
    let nodes = [GpuNode::new("n1", 1).label("pool", "train")];
    let stack = support::tier_b(&nodes, support::Grants::Culling).await;
    let admin = stack.admin();
    let _controller = AbortOnDrop(spawn_notebook_stop_rule(admin.clone()));
    notebooks_running(&stack, &[Notebook::new(NS, "idle-nb").node("n1")]).await;
    let gl = start_demand_culling(&stack, &[]).await;
    no_demand_skips(&gl, 1.0).await;

    // 1. The gated pod arrives: the scheduler leaves it alone (condition SchedulingGated).
    support::namespace(&admin, TRIALS, &[]).await;
    let trials: Api<Pod> = Api::namespaced(admin.clone(), TRIALS);
    let mut gated = trial_pod();
    gated.spec.as_mut().expect("spec").scheduling_gates =
        Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
            name: KUEUE_GATE.into(),
        }]);
    trials
        .create(&PostParams::default(), &gated)
        .await
        .expect("create gated trial");
    let planned = || async {
        let l = gl.ledger_json().await.ok()?;
        l["reclaim"]
            .as_array()?
            .iter()
            .find(|r| r["pending"]["pod"] == "trial-1")
            .map(|r| (r["options"].clone(), r["fits_nowhere"].clone()))
    };
    eventually("the gated pod in the planner's answer", WAIT, planned).await;
    // Several plans with the gated pod in the ledger, each skipping the notebook for no demand.
    let skips = || {
        metric(
            &gl,
            "gpu_ledger_cull_skips_total",
            &[("reason", "no_demand")],
        )
    };
    let seen = skips().await.expect("skips counted");
    eventually(
        "three more plans without demand, or a stop",
        WAIT,
        || async {
            if stopped(&admin, "idle-nb").await {
                return Some(());
            }
            (skips().await? >= seen + 3.0).then_some(())
        },
    )
    .await;
    assert!(
        !stopped(&admin, "idle-nb").await,
        "idle-nb stopped for a pod the scheduler does not consider"
    );
    assert!(stop_events(&admin, "idle-nb").await.is_empty());
    assert_eq!(
        planned().await,
        Some((
            serde_json::json!([]),
            serde_json::json!(format!("scheduling gated: {KUEUE_GATE}"))
        )),
        "a gated pod has no option: no node takes it whatever is freed"
    );
    assert_eq!(
        metric(
            &gl,
            "gpu_ledger_pending_reclaimable_gpus",
            &[("namespace", TRIALS)]
        )
        .await,
        Some(0.0),
        "a gated pod is not reclaimable demand"
    );

    // 2. The gate is removed (as Kueue does on admission): now the pod is demand, the notebook
    //    is stopped for it and the real scheduler binds it to the freed card.
    trials
        .patch(
            "trial-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"schedulingGates": null}})),
        )
        .await
        .expect("remove the gate");
    idle_nb_stopped_for_trial_and_trial_bound_to_n1(&admin, &trials).await;
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_for_the_pod_that_waits_a_snooze_and_the_stop_that_follows() {
    let nodes = [
        GpuNode::new("n1", 1).label("pool", "train"),
        GpuNode::new("n2", 1).label("pool", "train"),
    ];
    let stack = support::tier_b(&nodes, support::Grants::Culling).await;
    let admin = stack.admin();
    let _controller = AbortOnDrop(spawn_notebook_stop_rule(admin.clone()));
    let notebooks = [
        Notebook::new(NS, "a-nb").node("n1"),
        Notebook::new(NS, "b-nb").node("n2"),
    ];
    notebooks_running(&stack, &notebooks).await;
    let gl = start_demand_culling(&stack, &["--cull-notice", "20s"]).await;

    // 1. Nothing waits: both qualify, neither is warned.
    no_demand_skips(&gl, 2.0).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    for nb in ["a-nb", "b-nb"] {
        assert_eq!(
            annotation(&admin, nb, NOTICE_ANNOTATION).await,
            None,
            "{nb} warned while nothing waits"
        );
    }

    // 2. The pod arrives: the notebook it would take gets the notice (one notebook: one card).
    support::namespace(&admin, TRIALS, &[]).await;
    let trials: Api<Pod> = Api::namespaced(admin.clone(), TRIALS);
    trials
        .create(&PostParams::default(), &trial_pod())
        .await
        .expect("create trial");
    let (first, due) = eventually("a notice on one notebook", WAIT, || async {
        for nb in ["a-nb", "b-nb"] {
            if let Some(at) = annotation(&admin, nb, NOTICE_ANNOTATION).await {
                return Some((nb, parse_time(&at)));
            }
        }
        None
    })
    .await;
    let (second, second_node) = if first == "a-nb" {
        ("b-nb", "n2")
    } else {
        ("a-nb", "n1")
    };

    // 3. Its owner snoozes it within the notice: the stop is cancelled.
    support::snooze_for_an_hour(&admin, NS, first).await;
    assert!(Utc::now() < due, "snoozed within the notice (due {due})");

    // 4. The other notebook gets the notice instead and is stopped once it has run out, for the
    //    pod; the real scheduler binds the pod to the card that frees.
    let second_due = eventually("a notice on the other notebook", WAIT, || async {
        annotation(&admin, second, NOTICE_ANNOTATION)
            .await
            .map(|at| parse_time(&at))
    })
    .await;
    let stopped_at = eventually("the other notebook stopped", WAIT, || async {
        annotation(&admin, second, STOP_ANNOTATION)
            .await
            .map(|at| parse_time(&at))
    })
    .await;
    assert!(
        stopped_at >= second_due,
        "stopped at {stopped_at}, before its notice ran out at {second_due}"
    );
    let event = eventually("IdleGPUStopped Event", WAIT, || async {
        stop_events(&admin, second).await.into_iter().next()
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("needed by pending pod trials/trial-1"),
        "the Event says for whom: {note:?}"
    );
    let placed = eventually("trial-1 bound", WAIT, || async {
        let p = trials.get("trial-1").await.ok()?;
        p.spec?.node_name.filter(|n| !n.is_empty())
    })
    .await;
    assert_eq!(placed, second_node);

    // 5. Both stories, as `kubectl describe notebook` shows them.
    support::assert_notice_story(&stack, NS, second, "IdleGPUStopped", "GpuIdleStopCancelled")
        .await;
    support::assert_notice_story(&stack, NS, first, "GpuIdleStopCancelled", "IdleGPUStopped").await;
    assert_eq!(annotation(&admin, first, STOP_ANNOTATION).await, None);
    assert_eq!(annotation(&admin, first, NOTICE_ANNOTATION).await, None);
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits until `idle-nb` is stopped with an Event naming `trials/trial-1` as the pod it was
/// stopped for, then until the real scheduler binds `trial-1` to `n1`, the card the stop freed.
async fn idle_nb_stopped_for_trial_and_trial_bound_to_n1(admin: &kube::Client, trials: &Api<Pod>) {
    eventually("idle-nb stopped", WAIT, || async {
        stopped(admin, "idle-nb").await.then_some(())
    })
    .await;
    let event = eventually("IdleGPUStopped Event on idle-nb", WAIT, || async {
        stop_events(admin, "idle-nb").await.into_iter().next()
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("needed by pending pod trials/trial-1"),
        "the Event says for whom: {note:?}"
    );
    let placed = eventually("trial-1 bound to n1", WAIT, || async {
        let p = trials.get("trial-1").await.ok()?;
        p.spec?.node_name.filter(|n| !n.is_empty())
    })
    .await;
    assert_eq!(placed, "n1");
}
