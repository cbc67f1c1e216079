//! Culling end to end: real `gpu-ledger serve` processes with `--cull=on` / `--cull=dry-run`
//! against a tier B control plane (kwok GPU nodes, StatefulSet controller), the fake
//! dcgm-exporter test double scraped by a real Prometheus, as token user `gpu-ledger` bound to
//! the shipped read-only and culling RBAC (parsed from `deploy/kustomize`).
//!
//! **Kubeflow's notebook controller is emulated, not run.** Culling relies on exactly one of
//! its rules: a Notebook carrying `kubeflow-resource-stopped` has its StatefulSet scaled to 0.
//! [`gpu_ledger_testkit::stack::spawn_notebook_stop_rule`] implements only that rule (a loop
//! over Notebooks that scales the controller-owned StatefulSet to 0 when the annotation is
//! present); kube-controller-manager then deletes the pod and kwok removes it. Notebooks and
//! their StatefulSets are created the way Kubeflow writes them
//! ([`gpu_ledger_testkit::stack::Notebook`]).
//!
//! One stack, phases in order:
//! 1. two `--cull=on` replicas on one Lease: exactly one leads; while the kill-switch ConfigMap
//!    says `cull: off` the leader plans the stop but writes nothing; once it is deleted the idle
//!    notebook is stopped
//!    once (annotation, one Event, StatefulSet 0, pod gone, card free); busy, opted-out,
//!    time-sliced and telemetry-less notebooks are not; a `--cull=dry-run` replica (own Lease,
//!    own namespace) publishes `IdleGPUWouldStop` and writes nothing;
//! 2. SIGTERM the leader: the Lease is released and the other replica takes over;
//! 3. Prometheus outage before a new notebook's idle period elapses: nobody is stopped.
//!
//! The activity veto rides on phase 1: `typing-nb`'s GPU is as idle as `idle-nb`'s, but its
//! `notebooks.kubeflow.org/last-activity` is kept fresh the way Kubeflow's culler keeps it while
//! a kernel is busy (the culler itself needs a live Jupyter server, so a task writes the
//! annotation, RFC 3339 seconds as the culler does, every 2 s); it is not stopped while the
//! activity is fresh, and is stopped once the annotation is older than `--cull-idle-after`.
//!
//! `notice_before_a_stop_and_a_snooze_that_cancels_it` (a stack of its own, `--cull-notice`):
//! two idle notebooks get the notice annotation and a Warning Event first; one is stopped only
//! once its notice has run out, the other is snoozed during its notice, which cancels the stop
//! with a Normal Event; both stories read as `kubectl describe notebook` shows them.

mod support;

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::stack::{
    GpuLedgerProcess, LEDGER_NAMESPACE, Notebook, STOP_ANNOTATION, metric_value,
    spawn_notebook_stop_rule,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::Value;
use support::{CULLING_RBAC, annotate_notebook, eventually, notebook_annotations};

const NS: &str = "team-ml";
const DRY_NS: &str = "team-dry";
const WAIT: Duration = Duration::from_secs(60);
/// The Lease the shipped culling RBAC may get and update (`resourceNames`).
const LEASE: &str = "gpu-ledger";
/// The kill-switch ConfigMap the shipped culling RBAC may read (in [`LEDGER_NAMESPACE`]).
const KILL_SWITCH: &str = "gpu-ledger-cull";
const CULL_TIMINGS: [&str; 4] = ["--cull-idle-after", "15s", "--cull-min-runtime", "5s"];
/// Kubeflow's culler's record of kernel activity (the activity veto reads it).
const LAST_ACTIVITY: &str = "notebooks.kubeflow.org/last-activity";

/// `t` as Kubeflow's culler writes it: RFC 3339, seconds, UTC.
fn kubeflow_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Emulates Kubeflow's culler for a notebook whose kernel stays busy: `last-activity` = now,
/// every 2 s (its own period is a minute; the test's idle threshold is 15 s).
fn spawn_busy_kernel(admin: kube::Client, ns: &'static str, nb: &'static str) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        loop {
            annotate_notebook(&admin, ns, nb, LAST_ACTIVITY, &kubeflow_time(Utc::now())).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }))
}

async fn events(admin: &kube::Client, ns: &str, notebook: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(admin.clone(), ns);
    api.list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(notebook)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Notebook")
        })
        .collect()
}

async fn metric(gl: &GpuLedgerProcess, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric_value(&gl.metrics_text().await.ok()?, family, labels)
}

async fn ledger_row(gl: &GpuLedgerProcess, ns: &str, pod: &str) -> Option<Value> {
    gl.pod_row(ns, pod).await
}

/// Asserts none of `notebooks` (in `ns`) carries the stop annotation or a stop Event.
async fn assert_not_stopped(admin: &kube::Client, ns: &str, notebooks: &[&str], when: &str) {
    for nb in notebooks {
        let a = notebook_annotations(admin, ns, nb).await;
        assert!(
            !a.contains_key(STOP_ANNOTATION),
            "{ns}/{nb} must not be stopped ({when}): {a:?}"
        );
        assert!(
            events(admin, ns, nb, "IdleGPUStopped").await.is_empty(),
            "{ns}/{nb} has a stop Event ({when})"
        );
    }
}

// One scenario on one stack: phases build on each other and a stack costs ~10 s to start.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn culling_end_to_end() {
    let mut nodes: Vec<GpuNode> = (1..=7).map(|i| GpuNode::new(&format!("n{i}"), 1)).collect();
    nodes.push(GpuNode::new("shared-1", 1).time_slicing(2));
    let mut stack = support::tier_b(&nodes, support::Grants::Culling).await;
    let admin = stack.admin();
    let _controller = AbortOnDrop(spawn_notebook_stop_rule(admin.clone()));

    let notebooks = [
        Notebook::new(NS, "idle-nb").node("n1"),
        Notebook::new(NS, "busy-nb").node("n2").utilization(90.0),
        Notebook::new(NS, "optout-nb")
            .node("n3")
            .annotation("gpu-ledger.io/cull", "false"),
        Notebook::new(NS, "shared-nb").node("shared-1"),
        Notebook::new(NS, "blind-nb").node("n4").no_telemetry(),
        Notebook::new(DRY_NS, "dry-nb").node("n5"),
        Notebook::new(NS, "typing-nb")
            .node("n7")
            .annotation(LAST_ACTIVITY, &kubeflow_time(Utc::now())),
    ];
    for nb in &notebooks {
        stack.create_notebook(nb).await.expect("notebook");
    }
    let mut busy_kernel = spawn_busy_kernel(admin.clone(), NS, "typing-nb");
    for nb in &notebooks {
        stack
            .wait_pod_running(&nb.namespace, &nb.pod_name())
            .await
            .expect("notebook pod Running");
    }

    // Culling starts killed: the kill switch says off.
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), LEDGER_NAMESPACE);
    let kill: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": KILL_SWITCH},
        "data": {"cull": "off"}
    }))
    .expect("configmap");
    config_maps
        .create(&PostParams::default(), &kill)
        .await
        .expect("kill switch");

    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    let mut on_args = vec![
        "--cull=on",
        "--cull-kill-switch",
        KILL_SWITCH,
        "--lease-name",
        LEASE,
        "--cull-exclude-namespaces",
        DRY_NS,
    ];
    on_args.extend(CULL_TIMINGS);
    let mut replicas = vec![
        stack
            .start_gpu_ledger(bin, "gpu-ledger", &on_args)
            .await
            .expect("replica a"),
        stack
            .start_gpu_ledger(bin, "gpu-ledger", &on_args)
            .await
            .expect("replica b"),
    ];
    // Its own Lease: the shipped RBAC names one Lease per namespace, so it elects in DRY_NS.
    gpu_ledger_testkit::stack::apply_rbac(&admin, CULLING_RBAC, "gpu-ledger", DRY_NS)
        .await
        .expect("culling RBAC for the dry-run Lease");
    let mut dry_args = vec![
        "--cull=dry-run",
        "--lease-namespace",
        DRY_NS,
        "--cull-namespaces",
        DRY_NS,
    ];
    dry_args.extend(CULL_TIMINGS);
    let dry = stack
        .start_gpu_ledger(bin, "gpu-ledger", &dry_args)
        .await
        .expect("dry-run replica");

    // Exactly one of the two `on` replicas leads.
    let leader = eventually("exactly one cull leader", WAIT, || async {
        let a = metric(&replicas[0], "gpu_ledger_cull_leader", &[]).await?;
        let b = metric(&replicas[1], "gpu_ledger_cull_leader", &[]).await?;
        match (a, b) {
            (1.0, 0.0) => Some(0),
            (0.0, 1.0) => Some(1),
            _ => None,
        }
    })
    .await;
    let follower = 1 - leader;

    // Killed: the leader's plan wants idle-nb stopped, yet nothing is written.
    eventually(
        "the leader plans a stop",
        Duration::from_secs(90),
        || async {
            metric(&replicas[leader], "gpu_ledger_cull_would_stop", &[])
                .await
                .filter(|v| *v >= 1.0)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_not_stopped(&admin, NS, &["idle-nb"], "while the kill switch is off").await;
    let attempted = metric(
        &replicas[leader],
        "gpu_ledger_cull_stops_total",
        &[("result", "stopped")],
    )
    .await
    .unwrap_or(0.0);
    assert!(attempted == 0.0, "no stop while killed, got {attempted}");
    config_maps
        .delete(KILL_SWITCH, &DeleteParams::default())
        .await
        .expect("lift the kill switch");

    // The idle notebook is stopped, once, by the leader.
    let ann = eventually("idle-nb stopped", Duration::from_secs(90), || async {
        let a = notebook_annotations(&admin, NS, "idle-nb").await;
        a.contains_key(STOP_ANNOTATION).then_some(a)
    })
    .await;
    let stamp = &ann[STOP_ANNOTATION];
    assert!(
        stamp.len() == 20 && NaiveDateTime::parse_from_str(stamp, "%Y-%m-%dT%H:%M:%SZ").is_ok(),
        "kubeflow-resource-stopped must be YYYY-MM-DDTHH:MM:SSZ, got {stamp:?}"
    );
    assert_eq!(ann["gpu-ledger.io/stopped-by"], "gpu-ledger", "{ann:?}");
    assert_eq!(&ann["gpu-ledger.io/stopped-at"], stamp, "{ann:?}");
    assert!(ann["gpu-ledger.io/stop-reason"].contains("idle"), "{ann:?}");
    let stop_event = eventually("IdleGPUStopped Event", WAIT, || async {
        events(&admin, NS, "idle-nb", "IdleGPUStopped")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(
        stop_event.reporting_instance.as_deref(),
        Some(replicas[leader].name()),
        "the leader made the stop: {stop_event:?}"
    );
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), NS);
    eventually("idle-nb StatefulSet scaled to 0", WAIT, || async {
        let s = sets.get("idle-nb").await.ok()?;
        (s.spec?.replicas == Some(0)).then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    eventually("idle-nb-0 gone", WAIT, || async {
        pods.get_opt("idle-nb-0")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    eventually("n1's card free in the ledger", WAIT, || async {
        let l = replicas[leader].ledger_json().await.ok()?;
        let n1 = l["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node"] == "n1")?
            .clone();
        (n1["gpus_free"].as_f64() == Some(1.0) && ledger_row_absent(&l, NS, "idle-nb-0"))
            .then_some(())
    })
    .await;

    // The others have had as long as idle-nb; give them a few more cycles and make sure the
    // rules (not luck) kept them: opted-out and dry-run notebooks are proven idle past
    // --cull-idle-after, and the skip reasons were counted.
    eventually("optout-nb idle past --cull-idle-after", WAIT, || async {
        let r = ledger_row(&replicas[leader], NS, "optout-nb-0").await?;
        (r["idle_seconds"].as_f64()? >= 18.0).then_some(())
    })
    .await;
    for reason in ["opted_out", "not_idle", "shared_gpu", "unattributed"] {
        eventually(&format!("skip reason {reason} counted"), WAIT, || async {
            let v = metric(
                &replicas[leader],
                "gpu_ledger_cull_skips_total",
                &[("reason", reason)],
            )
            .await?;
            (v > 0.0).then_some(())
        })
        .await;
    }
    let blind = ledger_row(&replicas[leader], NS, "blind-nb-0")
        .await
        .expect("blind-nb-0 listed");
    assert_eq!(blind["attribution"], "unattributed", "{blind}");
    assert!(
        blind["idle"].is_null(),
        "no telemetry is never idle: {blind}"
    );
    assert_not_stopped(
        &admin,
        NS,
        &["busy-nb", "optout-nb", "shared-nb", "blind-nb"],
        "after idle-nb was stopped",
    )
    .await;
    assert_eq!(
        events(&admin, NS, "idle-nb", "IdleGPUStopped").await.len(),
        1,
        "exactly one stop Event: only the leader acts"
    );
    assert_eq!(
        metric(
            &replicas[follower],
            "gpu_ledger_cull_stops_total",
            &[("result", "stopped")]
        )
        .await
        .unwrap_or(0.0),
        0.0,
        "the follower never stops"
    );

    // Dry-run: Events, never an annotation.
    let would = eventually("IdleGPUWouldStop on dry-nb", WAIT, || async {
        let e = events(&admin, DRY_NS, "dry-nb", "IdleGPUWouldStop").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        would[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .starts_with("Would stop"),
        "{would:?}"
    );
    assert_eq!(
        metric(
            &dry,
            "gpu_ledger_cull_stops_total",
            &[("result", "dry_run")]
        )
        .await
        .map(|v| v > 0.0),
        Some(true)
    );
    let dry_ann = notebook_annotations(&admin, DRY_NS, "dry-nb").await;
    assert!(
        !dry_ann
            .keys()
            .any(|k| k == STOP_ANNOTATION || k.starts_with("gpu-ledger.io/")),
        "dry-run writes no annotation: {dry_ann:?}"
    );
    assert_not_stopped(&admin, DRY_NS, &["dry-nb"], "dry-run").await;

    // Activity veto: typing-nb's GPU is idle past --cull-idle-after, its kernel is not.
    eventually("typing-nb idle past --cull-idle-after", WAIT, || async {
        let r = ledger_row(&replicas[leader], NS, "typing-nb-0").await?;
        (r["idle_seconds"].as_f64()? >= 18.0).then_some(())
    })
    .await;
    eventually("skip reason recent_activity counted", WAIT, || async {
        let v = metric(
            &replicas[leader],
            "gpu_ledger_cull_skips_total",
            &[("reason", "recent_activity")],
        )
        .await?;
        (v > 0.0).then_some(())
    })
    .await;
    assert_not_stopped(&admin, NS, &["typing-nb"], "while its kernel is busy").await;
    // The kernel goes quiet and the culler's record ages past the threshold: stopped.
    busy_kernel.0.abort();
    let _ = (&mut busy_kernel.0).await;
    // A patch it sent just before may still land: let the apiserver take it first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let quiet_since = kubeflow_time(Utc::now() - chrono::Duration::minutes(5));
    annotate_notebook(&admin, NS, "typing-nb", LAST_ACTIVITY, &quiet_since).await;
    let typing = eventually("typing-nb stopped", Duration::from_secs(90), || async {
        let a = notebook_annotations(&admin, NS, "typing-nb").await;
        a.contains_key(STOP_ANNOTATION).then_some(a)
    })
    .await;
    assert_eq!(typing[LAST_ACTIVITY], quiet_since, "{typing:?}");

    // SIGTERM the leader: it releases the Lease and the other replica takes over.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), LEDGER_NAMESPACE);
    replicas[leader].terminate(Duration::from_secs(15));
    let exit = replicas[leader].try_exit_status().expect("leader exited");
    assert!(
        exit.success(),
        "leader exit status {exit}: {}",
        replicas[leader].log_tail(20)
    );
    let holder = leases
        .get(LEASE)
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(
        holder.is_empty() || holder == replicas[follower].name(),
        "lease must be released or taken over at once, holder {holder:?}"
    );
    let took_over = tokio::time::Instant::now();
    eventually(
        "follower becomes leader",
        Duration::from_secs(20),
        || async {
            (metric(&replicas[follower], "gpu_ledger_cull_leader", &[]).await? == 1.0).then_some(())
        },
    )
    .await;
    assert!(
        took_over.elapsed() < Duration::from_secs(12),
        "takeover took {:?}",
        took_over.elapsed()
    );
    let new_leader = replicas.remove(follower);
    drop(replicas);

    // Prometheus outage before a fresh idle notebook's idle period elapses: nobody is stopped.
    let outage = Notebook::new(NS, "outage-nb").node("n6");
    stack
        .create_notebook(&outage)
        .await
        .expect("outage notebook");
    stack
        .wait_pod_running(NS, "outage-nb-0")
        .await
        .expect("outage-nb-0 Running");
    eventually("outage-nb-0 attributed", WAIT, || async {
        let r = ledger_row(&new_leader, NS, "outage-nb-0").await?;
        (r["attribution"] == "exclusive").then_some(())
    })
    .await;
    let outage_started = tokio::time::Instant::now();
    stack.prometheus.stop(Duration::from_secs(5));
    eventually("circuit open: usage_unavailable", WAIT, || async {
        let v = metric(
            &new_leader,
            "gpu_ledger_cull_circuit_open",
            &[("reason", "usage_unavailable")],
        )
        .await?;
        (v == 1.0).then_some(())
    })
    .await;
    // Past --cull-idle-after (15 s) plus slack, counted from the stop of Prometheus.
    while outage_started.elapsed() < Duration::from_secs(22) {
        assert_not_stopped(&admin, NS, &["outage-nb"], "during the Prometheus outage").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        metric(&new_leader, "gpu_ledger_cull_leader", &[]).await,
        Some(1.0),
        "a leader was there to act"
    );
    assert_eq!(
        metric(
            &new_leader,
            "gpu_ledger_source_up",
            &[("source", "prometheus")]
        )
        .await,
        Some(0.0)
    );
    assert_not_stopped(
        &admin,
        NS,
        &["outage-nb", "busy-nb", "optout-nb", "shared-nb", "blind-nb"],
        "end of outage",
    )
    .await;

    stack
        .prometheus
        .restart()
        .await
        .expect("prometheus restart");
    eventually("prometheus source back", WAIT, || async {
        let v = metric(
            &new_leader,
            "gpu_ledger_source_up",
            &[("source", "prometheus")],
        )
        .await?;
        (v == 1.0).then_some(())
    })
    .await;
    assert_not_stopped(
        &admin,
        NS,
        &["busy-nb", "optout-nb", "shared-nb", "blind-nb"],
        "at the end",
    )
    .await;
    assert_eq!(
        events(&admin, NS, "idle-nb", "IdleGPUStopped").await.len(),
        1,
        "still exactly one stop Event for idle-nb"
    );
}

/// The notice annotation's due time, once the notebook has one.
async fn notice_due(admin: &kube::Client, nb: &str) -> Option<DateTime<Utc>> {
    let a = notebook_annotations(admin, NS, nb).await;
    let due = DateTime::parse_from_rfc3339(a.get(NOTICE_ANNOTATION)?).expect("RFC 3339 notice");
    assert!(
        !a.contains_key(STOP_ANNOTATION),
        "the notice comes before the stop: {a:?}"
    );
    assert!(
        a.get("gpu-ledger.io/stop-notice-reason")
            .is_some_and(|r| r.contains("GPU idle for")),
        "the notice says why: {a:?}"
    );
    Some(due.with_timezone(&Utc))
}

const NOTICE_ANNOTATION: &str = "gpu-ledger.io/stop-scheduled-at";

// A stack of its own: the notice changes every stop, so it cannot share the first one.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notice_before_a_stop_and_a_snooze_that_cancels_it() {
    let nodes: Vec<GpuNode> = (1..=2).map(|i| GpuNode::new(&format!("n{i}"), 1)).collect();
    let stack = support::tier_b(&nodes, support::Grants::Culling).await;
    let admin = stack.admin();
    let _controller = AbortOnDrop(spawn_notebook_stop_rule(admin.clone()));
    let notebooks = [
        Notebook::new(NS, "notice-nb").node("n1"),
        Notebook::new(NS, "snooze-nb").node("n2"),
    ];
    for nb in &notebooks {
        stack.create_notebook(nb).await.expect("notebook");
    }
    for nb in &notebooks {
        stack
            .wait_pod_running(&nb.namespace, &nb.pod_name())
            .await
            .expect("notebook pod Running");
    }
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    // 20 s of notice: long enough to snooze by hand in the test, short enough to wait out.
    let mut args = vec!["--cull=on", "--lease-name", LEASE, "--cull-notice", "20s"];
    args.extend(CULL_TIMINGS);
    let gl = stack
        .start_gpu_ledger(bin, "gpu-ledger", &args)
        .await
        .expect("serve");

    // The owner of snooze-nb sees the notice and snoozes it at once.
    let snooze_due = eventually("snooze-nb notice", Duration::from_secs(120), || {
        notice_due(&admin, "snooze-nb")
    })
    .await;
    let until = support::snooze_for_an_hour(&admin, NS, "snooze-nb").await;
    assert!(
        Utc::now() < snooze_due,
        "snoozed within the notice (due {snooze_due})"
    );

    // notice-nb had its notice too, and is stopped only once it has run out.
    let due = eventually("notice-nb notice", WAIT, || notice_due(&admin, "notice-nb")).await;
    let scheduled = events(&admin, NS, "notice-nb", "GpuIdleStopScheduled").await;
    let warning = eventually("GpuIdleStopScheduled Event", WAIT, || async {
        events(&admin, NS, "notice-nb", "GpuIdleStopScheduled")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert!(scheduled.len() <= 1, "one notice Event: {scheduled:?}");
    assert_eq!(warning.type_.as_deref(), Some("Warning"), "{warning:?}");
    let note = warning.note.clone().unwrap_or_default();
    assert!(
        note.contains("unless it is used or snoozed")
            && note.contains(&format!(
                "kubectl annotate --overwrite notebook -n {NS} -- notice-nb gpu-ledger.io/snooze-until="
            )),
        "{note}"
    );
    let ann = eventually("notice-nb stopped", Duration::from_secs(120), || async {
        let a = notebook_annotations(&admin, NS, "notice-nb").await;
        if a.contains_key(STOP_ANNOTATION) {
            assert!(
                Utc::now() >= due,
                "stopped before the notice ran out ({due}): {a:?}"
            );
            return Some(a);
        }
        None
    })
    .await;
    let stamp = DateTime::parse_from_rfc3339(&ann[STOP_ANNOTATION]).expect("stop stamp");
    assert!(
        stamp >= due,
        "the stop ({stamp}) comes after the notice ran out ({due})"
    );
    assert!(
        !ann.contains_key(NOTICE_ANNOTATION),
        "the spent notice is removed with the stop: {ann:?}"
    );

    // The snooze cancelled snooze-nb's notice, with a Normal Event, and it is not stopped.
    eventually("snooze-nb notice removed", WAIT, || async {
        (!notebook_annotations(&admin, NS, "snooze-nb")
            .await
            .contains_key(NOTICE_ANNOTATION))
        .then_some(())
    })
    .await;
    let cancelled = eventually("GpuIdleStopCancelled Event", WAIT, || async {
        events(&admin, NS, "snooze-nb", "GpuIdleStopCancelled")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(cancelled.type_.as_deref(), Some("Normal"), "{cancelled:?}");
    assert!(
        cancelled
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&format!("snoozed until {until}"))),
        "{cancelled:?}"
    );
    // Past the cancelled notice's due time, with slack for a few refreshes.
    while Utc::now() < snooze_due + chrono::Duration::seconds(5) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_not_stopped(&admin, NS, &["snooze-nb"], "snoozed during its notice").await;

    // The whole story, as `kubectl describe notebook` shows it.
    support::assert_notice_story(
        &stack,
        NS,
        "notice-nb",
        "IdleGPUStopped",
        "GpuIdleStopCancelled",
    )
    .await;
    support::assert_notice_story(
        &stack,
        NS,
        "snooze-nb",
        "GpuIdleStopCancelled",
        "IdleGPUStopped",
    )
    .await;
    for (kind, at_least) in [("schedule", 2.0), ("cancel", 1.0)] {
        let n = metric(
            &gl,
            "gpu_ledger_cull_notices_total",
            &[("kind", kind), ("result", "written")],
        )
        .await
        .unwrap_or(0.0);
        assert!(n >= at_least, "{kind} notices written: {n}");
    }
}

/// **Emulates the one rule of the Workspace controller that pausing relies on**
/// (`workspace_controller.go`: `replicas := 1; if workspace.Spec.Paused { replicas = 0 }`, and
/// `status.pauseTime` set once, in milliseconds, with `state: Paused`). The controller is not
/// served as a Go module here, so it cannot run; nothing else of it is emulated (no activity
/// probe: the test writes the status). Polls every 300 ms until aborted.
fn spawn_workspace_pause_rule(admin: kube::Client) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let workspaces: Api<kube::api::DynamicObject> =
            Api::all_with(admin.clone(), &support::workspace_api());
        loop {
            for ws in workspaces
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let paused = ws.data.pointer("/spec/paused") == Some(&Value::Bool(true));
                let (Some(ns), Some(name), Some(uid)) = (
                    ws.metadata.namespace.as_deref(),
                    ws.metadata.name.as_deref(),
                    ws.metadata.uid.as_deref(),
                ) else {
                    continue;
                };
                if !paused {
                    continue;
                }
                let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), ns);
                let owned = sets
                    .list(
                        &ListParams::default()
                            .labels(&format!("notebooks.kubeflow.org/workspace-name={name}")),
                    )
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                for sts in owned {
                    if let Some(sts_name) = sts.metadata.name.as_deref() {
                        let _ = gpu_ledger_testkit::stack::scale_owned_statefulset(
                            &admin, ns, sts_name, uid, 0,
                        )
                        .await;
                    }
                }
                if ws.data.pointer("/status/pauseTime").and_then(Value::as_i64) == Some(0) {
                    let pause = serde_json::json!({"status": {
                        "pauseTime": Utc::now().timestamp_millis(), "state": "Paused",
                        "stateMessage": "Workspace is paused"}});
                    let _ = Api::<kube::api::DynamicObject>::namespaced_with(
                        admin.clone(),
                        ns,
                        &support::workspace_api(),
                    )
                    .patch_status(
                        name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(pause),
                    )
                    .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }))
}

/// Workspaces (Kubeflow Notebooks 2.0) on the shipped RBAC: the published Workspace CRD
/// (tests/fixtures/workspace), a WorkspaceKind whose first `activityRules` entry exempts its
/// `exempt_gpu` podConfig (`pauseWorkspace: false`) before a catch-all that pauses. Both
/// Workspaces' GPUs are idle; `idle-ws` is paused (`spec.paused: true`, its StatefulSet scaled to
/// 0 by the emulated rule, its pod gone), `exempt-ws` is not (`opted_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_are_paused_unless_their_kind_exempts_them() {
    let nodes: Vec<GpuNode> = (1..=2).map(|i| GpuNode::new(&format!("n{i}"), 1)).collect();
    let stack = support::tier_b(&nodes, support::Grants::Culling).await;
    let admin = stack.admin();
    support::install_workspace_crds(&stack.cp).await;
    support::create_workspace_kind(&admin).await;
    support::create_workspace(&admin, NS, "idle-ws", "big_gpu", "n1").await;
    support::create_workspace(&admin, NS, "exempt-ws", "exempt_gpu", "n2").await;
    let _controller = spawn_workspace_pause_rule(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod_of = |ws: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(
                &ListParams::default()
                    .labels(&format!("notebooks.kubeflow.org/workspace-name={ws}")),
            )
            .await
            .ok()?
            .items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .and_then(|p| p.metadata.name)
        }
    };
    let idle_pod = eventually("idle-ws pod Running", WAIT, || pod_of("idle-ws")).await;
    let exempt_pod = eventually("exempt-ws pod Running", WAIT, || pod_of("exempt-ws")).await;

    // A one-shot `report` lists Workspaces and WorkspaceKinds too, as the watches do: the plan
    // names each pod's Workspace.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    let kubeconfig = stack.cp.kubeconfig_path("gpu-ledger").expect("kubeconfig");
    let out = gpu_ledger_testkit::process::isolated_command(bin)
        .arg("report")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--prometheus-url", stack.prometheus.url()])
        .args(["-o", "json", "--cull-dry-run"])
        .output()
        .expect("run report");
    assert!(
        out.status.success(),
        "live report: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    for (pod, ws) in [(&idle_pod, "idle-ws"), (&exempt_pod, "exempt-ws")] {
        let cull = &report["cull"];
        let named = ["would_stop", "skipped"].iter().any(|list| {
            cull[list].as_array().into_iter().flatten().any(|e| {
                e["pod"].as_str() == Some(pod.as_str()) && e["notebook"].as_str() == Some(ws)
            })
        });
        assert!(named, "{pod} planned as {ws}'s: {cull:#}");
    }
    // And `capture` writes them, for `report --from`.
    let dir = tempfile::tempdir().expect("tmp");
    let out = gpu_ledger_testkit::process::isolated_command(bin)
        .arg("capture")
        .arg("--out")
        .arg(dir.path())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--prometheus-url", stack.prometheus.url()])
        .output()
        .expect("run capture");
    assert!(
        out.status.success(),
        "capture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (file, name) in [
        ("workspaces.json", "idle-ws"),
        ("workspacekinds.json", "big_gpu"),
    ] {
        let text = std::fs::read_to_string(dir.path().join(file))
            .unwrap_or_else(|e| panic!("capture wrote {file}: {e}"));
        assert!(text.contains(name), "{file} names {name}: {text}");
    }

    let mut args = vec!["--cull=on", "--lease-name", LEASE];
    args.extend(CULL_TIMINGS);
    let gl = stack
        .start_gpu_ledger(bin, "gpu-ledger", &args)
        .await
        .expect("serve");

    let workspaces: Api<kube::api::DynamicObject> =
        Api::namespaced_with(admin.clone(), NS, &support::workspace_api());
    let paused = eventually("idle-ws paused", Duration::from_secs(120), || async {
        let ws = workspaces.get("idle-ws").await.ok()?;
        (ws.data.pointer("/spec/paused") == Some(&Value::Bool(true))).then_some(ws)
    })
    .await;
    let ann = paused.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann["gpu-ledger.io/stopped-by"], "gpu-ledger", "{ann:?}");
    assert!(
        !ann.contains_key(STOP_ANNOTATION),
        "a Workspace is paused by spec, not by Kubeflow's v1 annotation: {ann:?}"
    );
    eventually(&format!("{idle_pod} gone"), WAIT, || async {
        pods.get_opt(&idle_pod).await.ok()?.is_none().then_some(())
    })
    .await;
    let stopped = eventually("IdleGPUStopped Event on the Workspace", WAIT, || async {
        let api: Api<Event> = Api::namespaced(admin.clone(), NS);
        api.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("IdleGPUStopped")
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Workspace")
            })
    })
    .await;
    assert_eq!(
        stopped.regarding.and_then(|r| r.name).as_deref(),
        Some("idle-ws")
    );

    // The exempt Workspace was idle as long, and its kind's rule kept it.
    eventually("exempt-ws idle past --cull-idle-after", WAIT, || async {
        let r = ledger_row(&gl, NS, &exempt_pod).await?;
        (r["idle_seconds"].as_f64()? >= 18.0).then_some(())
    })
    .await;
    eventually("skip reason opted_out counted", WAIT, || async {
        let v = metric(
            &gl,
            "gpu_ledger_cull_skips_total",
            &[("reason", "opted_out")],
        )
        .await?;
        (v > 0.0).then_some(())
    })
    .await;
    let exempt = workspaces.get("exempt-ws").await.expect("exempt-ws");
    assert_eq!(
        exempt.data.pointer("/spec/paused"),
        Some(&Value::Bool(false)),
        "exempt by its WorkspaceKind's activityRules"
    );
}

fn ledger_row_absent(ledger: &Value, ns: &str, pod: &str) -> bool {
    ledger["pods"]
        .as_array()
        .is_some_and(|pods| !pods.iter().any(|p| p["namespace"] == ns && p["pod"] == pod))
}

/// Aborts the emulated controller task when the test ends (also on panic).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
