//! Culler facade tests: leadership gating, mode, kill switch, selector, follow-up metrics.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::Duration;

use super::actuator::tests::{FakeApi, notebook, now};
use super::*;
use crate::ledger::claims::NotebookInfo;
use crate::ledger::{Attribution, OwnedBy, PodRow, PodState};

fn idle_pod() -> PodRow {
    PodRow {
        gpus: 1.0,
        ..PodRow::new("team-a", "nb-0")
            .running_on("gpu-1")
            .attributed(Attribution::Exclusive)
            .stop_candidate(now(), Duration::hours(5), Duration::hours(3))
            .with_uid("pod-uid")
    }
    .of_notebook(notebook())
}

fn ledger_with(pods: Vec<PodRow>, at: chrono::DateTime<Utc>) -> Ledger {
    let mut l = Ledger::empty(at);
    l.usage_available = true;
    l.pods = pods;
    l
}

fn culler(api: &Arc<FakeApi>, mode: CullMode, leader: bool) -> (Culler, Arc<StaticLeadership>) {
    let leadership = Arc::new(StaticLeadership::new(leader));
    let config = CullConfig {
        mode,
        ..CullConfig::default()
    };
    let api: Arc<dyn CullApi> = api.clone();
    let c = Culler::with_api(
        Some(api),
        config,
        CullMetrics::unregistered().expect("metrics"),
        leadership.clone(),
    );
    (c, leadership)
}

async fn cycle(c: &mut Culler, l: &Ledger, at: chrono::DateTime<Utc>) -> CycleReport {
    let mut yes = |_: &Action| async { Ok::<_, RecheckError>(true) };
    c.cycle(l, true, at, &mut yes).await
}

#[test]
fn mode_parses_and_displays() {
    for (s, m) in [
        ("off", CullMode::Off),
        ("dry-run", CullMode::DryRun),
        ("on", CullMode::On),
    ] {
        assert_eq!(s.parse::<CullMode>().expect("mode"), m);
        assert_eq!(m.to_string(), s);
    }
    assert_eq!(
        "DRY-RUN".parse::<CullMode>().expect("mode"),
        CullMode::DryRun
    );
    assert!("maybe".parse::<CullMode>().is_err());
    assert_eq!(CullMode::default(), CullMode::Off);
    assert_eq!(CullConfig::default().mode, CullMode::Off);
}

#[tokio::test]
async fn only_the_leader_acts() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, leadership) = culler(&api, CullMode::On, false);
    let l = ledger_with(vec![idle_pod()], now());
    let r = cycle(&mut c, &l, now()).await;
    assert!(!r.leader && !r.acted);
    assert_eq!(r.plan.actions.len(), 1, "followers still plan and export");
    assert_eq!(c.metrics.would_stop.get(), 1);
    assert_eq!(c.metrics.leader.get(), 0);
    assert_eq!(api.patch_count(), 0);
    leadership.set(true);
    let r = cycle(&mut c, &l, now()).await;
    assert!(r.leader && r.acted);
    assert_eq!(r.outcomes[0].result, StopResult::Stopped);
    assert_eq!(api.patch_count(), 1);
    assert_eq!(c.metrics.leader.get(), 1);
    assert_eq!(c.metrics.stops.with_label_values(&["stopped"]).get(), 1);
}

#[tokio::test]
async fn off_mode_never_touches_the_api() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::Off, true);
    let r = cycle(&mut c, &ledger_with(vec![idle_pod()], now()), now()).await;
    assert!(!r.acted);
    assert_eq!(c.metrics.candidates.get(), 1);
    assert_eq!(*api.gets.lock().expect("lock"), 0);
    assert!(api.events.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn kill_switch_and_unreadable_kill_switch_hold_back() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::On, true);
    c.config.kill_switch = Some(("ops".into(), "gpu-ledger-cull".into()));
    let l = ledger_with(vec![idle_pod()], now());
    *api.kill.lock().expect("lock") = Ok(Some("off".into()));
    let r = cycle(&mut c, &l, now()).await;
    assert_eq!(r.held_back, Some(HoldBack::KillSwitch));
    assert_eq!(
        c.metrics
            .held_back
            .with_label_values(&["kill_switch"])
            .get(),
        1
    );
    *api.kill.lock().expect("lock") = Err(500);
    let r = cycle(&mut c, &l, now()).await;
    assert_eq!(r.held_back, Some(HoldBack::KillSwitchUnreadable));
    assert_eq!(
        c.metrics
            .held_back
            .with_label_values(&["kill_switch"])
            .get(),
        0
    );
    assert_eq!(
        c.metrics
            .held_back
            .with_label_values(&["kill_switch_unreadable"])
            .get(),
        1
    );
    assert_eq!(api.patch_count(), 0);
    *api.kill.lock().expect("lock") = Ok(None);
    let r = cycle(&mut c, &l, now()).await;
    assert!(r.acted && r.held_back.is_none());
    assert_eq!(api.patch_count(), 1);
    for reason in HoldBack::ALL {
        assert_eq!(
            c.metrics
                .held_back
                .with_label_values(&[reason.as_str()])
                .get(),
            0,
            "{reason}"
        );
    }
}

#[test]
fn kill_switch_values_are_parsed_strictly() {
    assert_eq!(
        kill_switch_engaged(None),
        Ok(false),
        "no ConfigMap or no key"
    );
    assert_eq!(kill_switch_engaged(Some("on")), Ok(false));
    assert_eq!(kill_switch_engaged(Some("off")), Ok(true));
    assert_eq!(kill_switch_engaged(Some("off\n")), Ok(true), "--from-file");
    assert_eq!(kill_switch_engaged(Some("  on ")), Ok(false));
    for bad in [
        "false", "true", "0", "1", "disabled", "no", "Off", "ON", "", "of", "off;on",
    ] {
        let e = kill_switch_engaged(Some(bad)).expect_err(bad);
        assert!(e.contains("neither \"off\" nor \"on\""), "{bad}: {e}");
    }
}

#[tokio::test]
async fn an_unrecognised_kill_switch_holds_culling_back_visibly() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::On, true);
    c.config.kill_switch = Some(("ops".into(), "gpu-ledger-cull".into()));
    let l = ledger_with(vec![idle_pod()], now());
    for bad in ["false", "0", "disabled", "garbage"] {
        *api.kill.lock().expect("lock") = Ok(Some(bad.into()));
        let r = cycle(&mut c, &l, now()).await;
        assert_eq!(r.held_back, Some(HoldBack::KillSwitchInvalid), "{bad}");
        assert!(!r.acted, "{bad}");
        assert_eq!(
            c.metrics
                .held_back
                .with_label_values(&["kill_switch_invalid"])
                .get(),
            1,
            "{bad}"
        );
    }
    assert_eq!(api.patch_count(), 0, "fail closed");
    *api.kill.lock().expect("lock") = Ok(Some("on".into()));
    let r = cycle(&mut c, &l, now()).await;
    assert!(r.acted, "\"on\" lets culling act");
    assert_eq!(api.patch_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hung_kill_switch_read_is_bounded_and_holds_back() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::On, true);
    c.config.kill_switch = Some(("ops".into(), "gpu-ledger-cull".into()));
    api.hang.lock().expect("lock").insert("kill_switch");
    let started = tokio::time::Instant::now();
    let r = cycle(&mut c, &ledger_with(vec![idle_pod()], now()), now()).await;
    assert_eq!(r.held_back, Some(HoldBack::KillSwitchUnreadable));
    assert_eq!(started.elapsed(), API_TIMEOUT);
    assert_eq!(api.patch_count(), 0);
}

#[tokio::test]
async fn stale_claims_open_the_circuit() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::On, true);
    let l = ledger_with(vec![idle_pod()], now());
    let mut yes = |_: &Action| async { Ok::<_, RecheckError>(true) };
    let r = c.cycle(&l, false, now(), &mut yes).await;
    assert_eq!(r.plan.circuit, Some(CircuitReason::ClaimsStale));
    assert!(!r.acted && r.plan.actions.is_empty());
    assert_eq!(api.patch_count(), 0);
    assert_eq!(
        c.metrics
            .circuit_open
            .with_label_values(&["claims_stale"])
            .get(),
        1
    );
    let r = cycle(&mut c, &l, now()).await;
    assert!(r.acted, "fresh again: acts");
    assert_eq!(
        c.metrics
            .circuit_open
            .with_label_values(&["claims_stale"])
            .get(),
        0
    );
}

#[tokio::test]
async fn with_culling_off_the_circuit_never_reads_open() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::Off, true);
    let mut l = ledger_with(vec![idle_pod()], now());
    l.usage_available = false;
    let r = cycle(&mut c, &l, now()).await;
    assert_eq!(
        r.plan.circuit,
        Some(CircuitReason::UsageUnavailable),
        "planned"
    );
    for reason in CircuitReason::ALL {
        assert_eq!(
            c.metrics
                .circuit_open
                .with_label_values(&[reason.as_str()])
                .get(),
            0,
            "{reason}"
        );
    }
    let (mut on, _) = culler(&api, CullMode::DryRun, true);
    cycle(&mut on, &l, now()).await;
    assert_eq!(
        on.metrics
            .circuit_open
            .with_label_values(&["usage_unavailable"])
            .get(),
        1
    );
}

/// A second idle notebook, `team-b/ok-nb`, idle for less time than `idle_pod()`'s.
fn allowed_pod() -> (PodRow, NotebookInfo) {
    let nb = NotebookInfo {
        namespace: "team-b".into(),
        name: "ok-nb".into(),
        uid: "ok-uid".into(),
        ..notebook()
    };
    let mut row = idle_pod();
    row.namespace = "team-b".into();
    row.pod = "ok-nb-0".into();
    row.notebook = Some("ok-nb".into());
    row.idle_seconds = Some(2.5 * 3600.0);
    row.evidence.uid = "ok-pod-uid".into();
    row.evidence.owner = Some(OwnedBy::notebook(nb.clone(), true));
    (row, nb)
}

#[tokio::test]
async fn a_forbidden_stop_backs_off_and_does_not_starve_the_others() {
    // `team-a/nb` (the longest idle) may not be patched (403); `team-b/ok-nb` may. One stop per
    // cycle. Without a backoff team-a/nb is retried first every cycle and ok-nb never reached.
    let (allowed, ok_nb) = allowed_pod();
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    api.notebooks
        .lock()
        .expect("lock")
        .insert(("team-b".into(), "ok-nb".into()), ok_nb);
    api.forbidden.lock().expect("lock").insert("nb".into());
    let (mut c, _) = culler(&api, CullMode::On, true);
    c.config.policy.max_per_cycle = 1;
    let tried = |r: &CycleReport| -> Vec<(String, StopResult)> {
        r.outcomes
            .iter()
            .map(|o| (o.action.notebook().to_string(), o.result))
            .collect()
    };
    // Both notebooks as a refresh at `at` sees them (samples fresh).
    let at_time = |rows: &[&PodRow], at: chrono::DateTime<Utc>| {
        let rows = rows
            .iter()
            .map(|r| {
                let mut r = (*r).clone();
                r.evidence.newest_sample_at = Some(at);
                r
            })
            .collect();
        ledger_with(rows, at)
    };
    let forbidden = idle_pod();
    let mut at = now();
    let l = at_time(&[&forbidden, &allowed], at);
    let r = cycle(&mut c, &l, at).await;
    assert_eq!(tried(&r), [("nb".to_string(), StopResult::Error)]);
    assert!(
        r.outcomes[0].detail.contains("403") || r.outcomes[0].detail.contains("Forbidden"),
        "{:?}",
        r.outcomes
    );

    // Next cycle: nb sits out, ok-nb takes the slot.
    at += Duration::seconds(30);
    let r = cycle(&mut c, &at_time(&[&forbidden, &allowed], at), at).await;
    assert_eq!(
        tried(&r),
        [("ok-nb".to_string(), StopResult::Stopped)],
        "{:?}",
        r.plan
    );
    assert!(
        r.plan
            .skips
            .iter()
            .any(|s| s.notebook.as_deref() == Some("nb") && s.reason == SkipReason::Backoff),
        "{:?}",
        r.plan.skips
    );
    assert_eq!(c.metrics.skips.with_label_values(&["backoff"]).get(), 1);
    assert_eq!(api.patches.lock().expect("lock")[0].1, "ok-nb");

    // ok-nb is stopped now; nb is retried after one cycle, fails again and sits out two.
    let mut stopped = allowed;
    if let Some(OwnedBy { info: nb, .. }) = stopped.evidence.owner.as_mut() {
        nb.stopped = Some("2026-01-31T12:00:30Z".into());
    }
    let mut results = Vec::new();
    for _ in 0..4 {
        at += Duration::seconds(30);
        let l = at_time(&[&forbidden, &stopped], at);
        let r = cycle(&mut c, &l, at).await;
        results.push((tried(&r), c.metrics.backoff.get()));
    }
    let failed = vec![("nb".to_string(), StopResult::Error)];
    assert_eq!(
        results,
        [
            (failed.clone(), 1),
            (Vec::new(), 1),
            (Vec::new(), 1),
            (failed, 1)
        ]
    );
    // A notebook that is gone is forgotten.
    at += Duration::seconds(30);
    cycle(&mut c, &ledger_with(Vec::new(), at), at).await;
    assert_eq!(c.metrics.backoff.get(), 0);
}

#[test]
fn opt_out_annotation_is_parsed_strictly() {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    let opted_out = |value: Option<&str>| {
        let annotations: BTreeMap<String, String> = value
            .map(|v| {
                (
                    crate::ledger::claims::CULL_OPT_OUT_ANNOTATION.to_string(),
                    v.to_string(),
                )
            })
            .into_iter()
            .collect();
        crate::k8s::notebook(&ObjectMeta {
            name: Some("nb".into()),
            namespace: Some("team-a".into()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        })
        .cull_opt_out
    };
    assert!(!opted_out(None), "no annotation: culling allowed");
    assert!(!opted_out(Some("true")), "\"true\": allowed");
    assert!(opted_out(Some("false")), "\"false\": opted out");
    // Anything else is not understood: fail closed, as opted out (and named as invalid, so the
    // skip reason is invalid_annotation).
    for v in ["False", "TRUE", "no", "0", "yes", "", " true", "disabled"] {
        assert!(opted_out(Some(v)), "{v:?} is treated as opted out");
    }
}

#[tokio::test]
async fn namespace_selector_is_resolved_before_acting() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::On, true);
    c.config.namespace_selector = Some("gpu-ledger.io/cull=false".into());
    *api.selected.lock().expect("lock") = Ok(BTreeSet::from(["team-a".to_string()]));
    let l = ledger_with(vec![idle_pod()], now());
    let r = cycle(&mut c, &l, now()).await;
    assert!(r.plan.actions.is_empty());
    assert_eq!(r.plan.skips[0].reason, SkipReason::NamespaceExcluded);
    *api.selected.lock().expect("lock") = Err(403);
    let r = cycle(&mut c, &l, now()).await;
    assert_eq!(r.held_back, Some(HoldBack::SelectorUnresolved));
    assert_eq!(api.patch_count(), 0);
}

#[tokio::test]
async fn time_to_free_is_observed_and_stuck_pods_warned_once() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let (mut c, _) = culler(&api, CullMode::On, true);
    let r = cycle(&mut c, &ledger_with(vec![idle_pod()], now()), now()).await;
    assert_eq!(r.outcomes[0].result, StopResult::Stopped);
    // Next refresh: the notebook is stopped, its pod is stuck terminating.
    let mut terminating = idle_pod();
    terminating.state = PodState::Terminating;
    terminating.stuck = true;
    if let Some(OwnedBy { info: nb, .. }) = terminating.evidence.owner.as_mut() {
        nb.stopped = Some("2026-01-31T12:00:00Z".into());
    }
    let t1 = now() + Duration::minutes(10);
    for _ in 0..2 {
        let r = cycle(&mut c, &ledger_with(vec![terminating.clone()], t1), t1).await;
        assert!(r.plan.actions.is_empty());
        assert!(r.freed.is_empty());
    }
    assert_eq!(
        api.event_reasons(),
        [actuator::REASON_STOPPED, actuator::REASON_STOP_STUCK]
    );
    // Then it is gone.
    let t2 = now() + Duration::minutes(15);
    let r = cycle(&mut c, &ledger_with(Vec::new(), t2), t2).await;
    assert_eq!(r.freed, [("pod-uid".to_string(), 900.0)]);
    assert_eq!(c.metrics.time_to_free.get_sample_count(), 1);
    assert!((c.metrics.time_to_free.get_sample_sum() - 900.0).abs() < 1e-9);
}

#[tokio::test]
async fn without_client_culler_only_plans() {
    let leadership = Arc::new(StaticLeadership::new(true));
    let config = CullConfig {
        mode: CullMode::On,
        ..CullConfig::default()
    };
    let mut c = Culler::new(
        None,
        config,
        CullMetrics::unregistered().expect("metrics"),
        leadership,
    );
    let r = cycle(&mut c, &ledger_with(vec![idle_pod()], now()), now()).await;
    assert_eq!(r.held_back, Some(HoldBack::NoClient));
    assert_eq!(r.plan.actions.len(), 1);
    c.shutdown().await;
}

#[test]
fn render_plan_lists_stops_and_skip_counts() {
    let p = plan::plan(
        &ledger_with(vec![idle_pod()], now()),
        &CullPolicy::default(),
        now(),
    );
    let mut out = Vec::new();
    render_plan(&p, &mut out).expect("render");
    let text = String::from_utf8(out).expect("utf8");
    assert!(
        text.contains("CULL PLAN  candidates=1  would_stop=1  circuit=closed"),
        "{text}"
    );
    assert!(
        text.contains("STOP  team-a/nb  pod=nb-0  GPU idle for 3h0m"),
        "{text}"
    );
}

#[test]
fn render_plan_names_the_activity_that_vetoes_a_stop() {
    let mut nb = notebook();
    nb.last_activity = Some(now() - Duration::minutes(7));
    let pod = PodRow {
        gpus: 1.0,
        ..idle_pod()
    }
    .of_notebook(nb);
    let p = plan::plan(
        &ledger_with(vec![pod], now()),
        &CullPolicy::default(),
        now(),
    );
    let mut out = Vec::new();
    render_plan(&p, &mut out).expect("render");
    let text = String::from_utf8(out).expect("utf8");
    assert!(
        text.contains(
            "HELD  team-a/nb  pod=nb-0  recent_activity: recent activity at \
             2026-01-31T11:53:00Z (notebooks.kubeflow.org/last-activity)"
        ),
        "{text}"
    );
    let json = serde_json::to_value(render::CullJson::of(&p)).expect("json");
    assert_eq!(
        json["skipped"][0]["detail"],
        "recent activity at 2026-01-31T11:53:00Z (notebooks.kubeflow.org/last-activity)"
    );
    // Other skips carry no detail key at all (the JSON stays as it was).
    let busy = PodRow {
        idle: Some(false),
        ..idle_pod()
    };
    let p = plan::plan(
        &ledger_with(vec![busy], now()),
        &CullPolicy::default(),
        now(),
    );
    let json = serde_json::to_value(render::CullJson::of(&p)).expect("json");
    assert!(json["skipped"][0].get("detail").is_none(), "{json}");
}

#[tokio::test]
async fn a_notice_first_then_the_stop_once_it_has_run_out_and_the_webhook_hears_of_it() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let leadership = Arc::new(StaticLeadership::new(true));
    let config = CullConfig {
        mode: CullMode::On,
        policy: CullPolicy {
            notice: Duration::minutes(10),
            ..CullPolicy::default()
        },
        ..CullConfig::default()
    };
    let (url, mut received) = super::webhook::tests::receiver(axum::http::StatusCode::OK).await;
    let file = super::webhook::tests::url_file(&url);
    let hook =
        webhook::Webhook::new(file.path(), webhook::WebhookFormat::Alertmanager).expect("webhook");
    let dyn_api: Arc<dyn CullApi> = api.clone();
    let mut c = Culler::with_api(
        Some(dyn_api),
        config,
        CullMetrics::unregistered().expect("metrics"),
        leadership,
    )
    .with_webhook(hook);

    // First cycle: the notice (annotation, Warning Event, webhook), no stop.
    let r = cycle(&mut c, &ledger_with(vec![idle_pod()], now()), now()).await;
    assert!(r.outcomes.is_empty(), "{r:?}");
    assert_eq!(r.notices.len(), 1, "{r:?}");
    assert_eq!(r.notices[0].result, NoticeResult::Written);
    assert_eq!(api.event_reasons(), [actuator::REASON_STOP_SCHEDULED]);
    let due = now() + Duration::minutes(10);
    let annotated = api.notebooks.lock().expect("lock").values().next().cloned();
    assert_eq!(
        annotated.as_ref().and_then(|n| n.stop_scheduled_at),
        Some(due)
    );
    let body = tokio::time::timeout(std::time::Duration::from_secs(10), received.recv())
        .await
        .expect("the webhook is posted")
        .expect("body");
    assert_eq!(body["status"], "firing");
    assert_eq!(
        body["alerts"][0]["annotations"]["stop_at"],
        "2026-01-31T12:10:00Z"
    );
    assert_eq!(
        c.metrics
            .notices
            .with_label_values(&["schedule", "written"])
            .get(),
        1
    );

    // The ledger sees the notice; before it runs out nothing more happens.
    let mut noticed = idle_pod();
    noticed.evidence.owner = annotated.map(|nb| OwnedBy::notebook(nb, true));
    let soon = now() + Duration::minutes(5);
    noticed.evidence.newest_sample_at = Some(soon);
    let r = cycle(&mut c, &ledger_with(vec![noticed.clone()], soon), soon).await;
    assert!(r.outcomes.is_empty() && r.notices.is_empty(), "{r:?}");
    assert_eq!(r.plan.skips[0].reason, SkipReason::NoticePending, "{r:?}");
    assert_eq!(api.patch_count(), 1);

    // Run out: the stop, which also removes the spent notice.
    noticed.evidence.newest_sample_at = Some(due);
    let r = cycle(&mut c, &ledger_with(vec![noticed], due), due).await;
    assert_eq!(r.outcomes.len(), 1, "{r:?}");
    assert_eq!(r.outcomes[0].result, StopResult::Stopped, "{r:?}");
    let nb = api.notebooks.lock().expect("lock").values().next().cloned();
    assert!(
        nb.as_ref()
            .is_some_and(|n| n.stopped.is_some() && n.stop_scheduled_at.is_none())
    );
}
