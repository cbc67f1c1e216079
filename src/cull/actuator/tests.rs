//! Actuator tests against an in-memory [`CullApi`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use chrono::TimeZone;
use kube::core::Status;

use super::*;
use crate::cull::lease::StaticLeadership;
use crate::ledger::claims::{NotebookInfo, STOP_ANNOTATION, STOP_SCHEDULED_AT_ANNOTATION};

/// Records every call; notebooks live in a map and patches apply as merge patches.
pub(crate) struct FakeApi {
    pub notebooks: Mutex<BTreeMap<(String, String), NotebookInfo>>,
    pub patches: Mutex<Vec<(String, String, serde_json::Value, bool)>>,
    pub events: Mutex<Vec<(TargetRef, EventSpec)>>,
    /// HTTP status the next patch fails with.
    pub patch_status: Mutex<Option<u16>>,
    pub kill: Mutex<Result<Option<String>, u16>>,
    pub selected: Mutex<Result<BTreeSet<String>, u16>>,
    pub gets: Mutex<usize>,
    /// Calls that never answer (a hung API server), by name: `get`, `patch`, `kill_switch`, ...
    pub hang: Mutex<BTreeSet<&'static str>>,
    /// Notebook names whose every patch is refused with 403 (RBAC `resourceNames`).
    pub forbidden: Mutex<BTreeSet<String>>,
}

pub(crate) fn api_error(code: u16) -> kube::Error {
    let reason = match code {
        409 => "Conflict",
        404 => "NotFound",
        403 => "Forbidden",
        _ => "InternalError",
    };
    kube::Error::Api(Box::new(Status::failure("fake", reason).with_code(code)))
}

impl Default for FakeApi {
    fn default() -> Self {
        FakeApi {
            notebooks: Mutex::default(),
            patches: Mutex::default(),
            events: Mutex::default(),
            patch_status: Mutex::default(),
            kill: Mutex::new(Ok(None)),
            selected: Mutex::new(Ok(BTreeSet::new())),
            gets: Mutex::default(),
            hang: Mutex::default(),
            forbidden: Mutex::default(),
        }
    }
}

impl FakeApi {
    pub fn with_notebook(nb: NotebookInfo) -> Self {
        let api = FakeApi::default();
        api.notebooks
            .lock()
            .expect("lock")
            .insert((nb.namespace.clone(), nb.name.clone()), nb);
        api
    }

    pub fn patch_count(&self) -> usize {
        self.patches.lock().expect("lock").len()
    }

    /// Completes, unless `call` was told to hang: then never.
    pub async fn maybe_hang(&self, call: &'static str) {
        let hangs = self.hang.lock().expect("lock").contains(call);
        if hangs {
            futures::future::pending::<()>().await;
        }
    }

    pub fn event_reasons(&self) -> Vec<&'static str> {
        self.events
            .lock()
            .expect("lock")
            .iter()
            .map(|(_, e)| e.reason)
            .collect()
    }
}

impl CullApi for FakeApi {
    fn get<'a>(
        &'a self,
        _target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<TargetInfo>, kube::Error>> {
        *self.gets.lock().expect("lock") += 1;
        let nb = self
            .notebooks
            .lock()
            .expect("lock")
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        Box::pin(async move {
            self.maybe_hang("get").await;
            Ok(nb)
        })
    }

    fn patch<'a>(
        &'a self,
        _target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
        body: &'a serde_json::Value,
        dry_run: bool,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        let status = self.patch_status.lock().expect("lock").take().or_else(|| {
            self.forbidden
                .lock()
                .expect("lock")
                .contains(name)
                .then_some(403)
        });
        Box::pin(async move {
            self.maybe_hang("patch").await;
            if let Some(code) = status {
                return Err(api_error(code));
            }
            self.patches.lock().expect("lock").push((
                namespace.into(),
                name.into(),
                body.clone(),
                dry_run,
            ));
            if !dry_run {
                let mut nbs = self.notebooks.lock().expect("lock");
                if let Some(nb) = nbs.get_mut(&(namespace.to_string(), name.to_string())) {
                    let ann = &body["metadata"]["annotations"];
                    if let Some(v) = ann.get(STOP_ANNOTATION) {
                        nb.stopped = v.as_str().map(str::to_string);
                    }
                    if let Some(v) = ann.get(STOP_SCHEDULED_AT_ANNOTATION) {
                        nb.stop_scheduled_at = v
                            .as_str()
                            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                            .map(|t| t.with_timezone(&Utc));
                    }
                }
            }
            Ok(())
        })
    }

    fn publish_event<'a>(
        &'a self,
        _target: &'a dyn Target,
        object: &'a TargetRef,
        event: &'a EventSpec,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        self.events
            .lock()
            .expect("lock")
            .push((object.clone(), event.clone()));
        Box::pin(async { Ok(()) })
    }

    fn kill_switch<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, kube::Error>> {
        let v = self.kill.lock().expect("lock").clone().map_err(api_error);
        Box::pin(async move {
            self.maybe_hang("kill_switch").await;
            v
        })
    }

    fn namespaces_matching<'a>(
        &'a self,
        _selector: &'a str,
    ) -> BoxFuture<'a, Result<BTreeSet<String>, kube::Error>> {
        let v = self
            .selected
            .lock()
            .expect("lock")
            .clone()
            .map_err(api_error);
        Box::pin(async move {
            self.maybe_hang("namespaces_matching").await;
            v
        })
    }
}

pub(crate) fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 31, 12, 0, 0)
        .single()
        .expect("time")
}

pub(crate) fn notebook() -> NotebookInfo {
    NotebookInfo::new("team-a", "nb")
        .with_uid("nb-uid")
        .at_version("43")
}

pub(crate) fn stop_action() -> Action {
    Action::notebook_stop("team-a", "nb")
        .with_uid("nb-uid")
        .at_version("42")
        .of_pod("nb-0", "pod-uid")
        .idle_for(3.0 * 3600.0 + 12.0 * 60.0, Some(0.008))
        .stopping_at("2026-01-31T12:00:00Z")
}

async fn run(
    api: &Arc<FakeApi>,
    mode: CullMode,
    server_dry_run: bool,
    confirm: Result<bool, &'static str>,
) -> Outcome {
    let actuator = Actuator::new(api.clone(), server_dry_run, Duration::hours(1));
    let mut recheck = |_: &Action| async move { confirm.map_err(RecheckError::from) };
    let leader = StaticLeadership::new(true);
    let mut out = actuator
        .execute(&[stop_action()], mode, now(), &mut recheck, &leader)
        .await;
    assert_eq!(out.len(), 1);
    out.remove(0)
}

#[test]
fn patch_body_is_exactly_the_documented_merge_patch() {
    let body = stop_patch(&stop_action(), "43");
    let expected = json!({"metadata":{"resourceVersion":"43","annotations":{
        "kubeflow-resource-stopped":"2026-01-31T12:00:00Z",
        "gpu-ledger.io/stopped-by":"gpu-ledger",
        "gpu-ledger.io/stopped-at":"2026-01-31T12:00:00Z",
        "gpu-ledger.io/stop-reason":"GPU idle for 3h12m (peak utilisation 0.8% over the window)"}}});
    assert_eq!(body, expected);
    // Nothing is removed (no nulls) and nothing under notebooks.kubeflow.org/ is written.
    let text = body.to_string();
    assert!(!text.contains("null") && !text.contains("notebooks.kubeflow.org/"));
}

#[tokio::test]
async fn on_mode_patches_once_with_fresh_resource_version_and_emits_event() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let o = run(&api, CullMode::On, false, Ok(true)).await;
    assert_eq!(o.result, StopResult::Stopped, "{}", o.detail);
    let patches = api.patches.lock().expect("lock").clone();
    assert_eq!(patches.len(), 1);
    let (ns, name, body, dry) = &patches[0];
    assert_eq!((ns.as_str(), name.as_str(), *dry), ("team-a", "nb", false));
    assert_eq!(
        body["metadata"]["resourceVersion"], "43",
        "the re-read version is the precondition"
    );
    assert_eq!(api.event_reasons(), [REASON_STOPPED]);
    let events = api.events.lock().expect("lock");
    assert!(!events[0].1.warning);
    assert_eq!(events[0].0.uid, "nb-uid");
    assert!(
        events[0].1.note.contains("GPU idle for 3h12m"),
        "{}",
        events[0].1.note
    );
}

#[tokio::test]
async fn dry_run_writes_nothing_unless_server_dry_run() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let o = run(&api, CullMode::DryRun, false, Ok(true)).await;
    assert_eq!(o.result, StopResult::DryRun);
    assert_eq!(api.patch_count(), 0);
    assert_eq!(api.event_reasons(), [REASON_WOULD_STOP]);
    let o = run(&api, CullMode::DryRun, true, Ok(true)).await;
    assert_eq!(o.result, StopResult::DryRun);
    let patches = api.patches.lock().expect("lock").clone();
    assert_eq!(patches.len(), 1);
    assert!(patches[0].3, "sent with dryRun=All");
    assert_eq!(
        api.notebooks
            .lock()
            .expect("lock")
            .values()
            .next()
            .expect("nb")
            .stopped,
        None
    );
}

#[tokio::test]
async fn off_mode_does_nothing() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let actuator = Actuator::new(api.clone(), false, Duration::hours(1));
    let mut recheck = |_: &Action| async { Ok::<_, RecheckError>(true) };
    assert!(
        actuator
            .execute(
                &[stop_action()],
                CullMode::Off,
                now(),
                &mut recheck,
                &StaticLeadership::new(true)
            )
            .await
            .is_empty()
    );
    assert_eq!(*api.gets.lock().expect("lock"), 0);
}

#[tokio::test]
async fn conflict_is_reported_not_retried() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    *api.patch_status.lock().expect("lock") = Some(409);
    let o = run(&api, CullMode::On, false, Ok(true)).await;
    assert_eq!(o.result, StopResult::Conflict);
    assert!(api.events.lock().expect("lock").is_empty());
    *api.patch_status.lock().expect("lock") = Some(500);
    assert_eq!(
        run(&api, CullMode::On, false, Ok(true)).await.result,
        StopResult::Error
    );
    *api.patch_status.lock().expect("lock") = Some(404);
    assert_eq!(
        run(&api, CullMode::On, false, Ok(true)).await.result,
        StopResult::Changed
    );
}

#[tokio::test]
async fn fresh_notebook_recheck_blocks_changed_objects() {
    type Change = Box<dyn Fn(&mut NotebookInfo)>;
    let cases: Vec<(&str, Change)> = vec![
        ("uid", Box::new(|n| n.uid = "other".into())),
        (
            "stopped",
            Box::new(|n| n.stopped = Some("odh-notebook-controller-lock".into())),
        ),
        ("deleting", Box::new(|n| n.deleting = true)),
        ("opt-out", Box::new(|n| n.cull_opt_out = true)),
        (
            "snooze",
            Box::new(|n| n.snooze_until = Some(now() + Duration::minutes(5))),
        ),
        (
            "restart grace",
            Box::new(|n| n.last_stopped_by_us = Some(now() - Duration::minutes(5))),
        ),
    ];
    for (name, change) in cases {
        let mut nb = notebook();
        change(&mut nb);
        let api = Arc::new(FakeApi::with_notebook(nb));
        let o = run(&api, CullMode::On, false, Ok(true)).await;
        assert_eq!(o.result, StopResult::Changed, "{name}");
        assert_eq!(api.patch_count(), 0, "{name}");
    }
    let api = Arc::new(FakeApi::default());
    assert_eq!(
        run(&api, CullMode::On, false, Ok(true)).await.result,
        StopResult::Changed,
        "gone"
    );
}

#[tokio::test]
async fn fresh_notebook_with_an_annotation_not_understood_is_not_stopped() {
    use crate::ledger::claims::{
        CULL_OPT_OUT_ANNOTATION, SNOOZE_ANNOTATION, STOPPED_AT_ANNOTATION,
    };
    // Planned on a clean notebook; by the time of the write a user has set a malformed snooze
    // (which reads as no snooze at all).
    for key in [
        SNOOZE_ANNOTATION,
        STOPPED_AT_ANNOTATION,
        CULL_OPT_OUT_ANNOTATION,
    ] {
        let mut nb = notebook();
        nb.invalid_annotations = vec![key];
        let api = Arc::new(FakeApi::with_notebook(nb.clone()));
        let o = run(&api, CullMode::On, false, Ok(true)).await;
        assert_eq!(o.result, StopResult::Changed, "{key}");
        assert!(
            o.detail.contains(key),
            "the detail names {key}: {}",
            o.detail
        );
        assert_eq!(api.patch_count(), 0, "{key}");
        assert!(api.event_reasons().is_empty(), "{key}");
        assert!(verify_fresh(&nb, &stop_action(), Duration::hours(1), now()).is_err());
    }
}

#[tokio::test]
async fn activity_recorded_after_the_plan_cancels_the_write() {
    // Planned on a notebook idle for 3h12m; by the re-read its kernel ran a cell a minute ago.
    let mut nb = notebook();
    nb.last_activity = Some(now() - Duration::minutes(1));
    let api = Arc::new(FakeApi::with_notebook(nb.clone()));
    let o = run(&api, CullMode::On, false, Ok(true)).await;
    assert_eq!(o.result, StopResult::Changed);
    assert!(
        o.detail.contains(
            "recent activity at 2026-01-31T11:59:00Z (notebooks.kubeflow.org/last-activity)"
        ),
        "{}",
        o.detail
    );
    assert_eq!(api.patch_count(), 0);
    // Older than the idle threshold (2h by default): no veto.
    nb.last_activity = Some(now() - Duration::hours(2));
    assert_eq!(
        verify_fresh(&nb, &stop_action(), Duration::hours(1), now()),
        Ok(())
    );
    // With the veto off, recent activity does not hold the write back.
    nb.last_activity = Some(now() - Duration::minutes(1));
    let off = CullPolicy {
        respect_activity: false,
        ..CullPolicy::default()
    };
    assert_eq!(verify_fresh_with(&nb, &stop_action(), &off, now()), Ok(()));
}

#[tokio::test]
async fn evidence_recheck_gates_the_patch() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    assert_eq!(
        run(&api, CullMode::On, false, Ok(false)).await.result,
        StopResult::Changed
    );
    assert_eq!(
        run(&api, CullMode::On, false, Err("prometheus down"))
            .await
            .result,
        StopResult::Error
    );
    assert_eq!(api.patch_count(), 0);
    assert!(api.events.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn leadership_is_asked_right_before_the_write() {
    // The claim runs out while the evidence is re-checked (after the Notebook GET, before the
    // patch): nothing is written, neither the patch nor the Event.
    for mode in [CullMode::On, CullMode::DryRun] {
        let api = Arc::new(FakeApi::with_notebook(notebook()));
        let actuator = Actuator::new(api.clone(), true, Duration::hours(1));
        let leader = StaticLeadership::new(true);
        let mut recheck = |_: &Action| {
            leader.set(false);
            async { Ok::<_, RecheckError>(true) }
        };
        let out = actuator
            .execute(&[stop_action()], mode, now(), &mut recheck, &leader)
            .await;
        assert_eq!(
            out[0].result,
            StopResult::NotLeader,
            "{mode}: {}",
            out[0].detail
        );
        assert_eq!(
            *api.gets.lock().expect("lock"),
            1,
            "{mode}: the read happened"
        );
        assert_eq!(api.patch_count(), 0, "{mode}");
        assert!(api.events.lock().expect("lock").is_empty(), "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn hung_api_calls_time_out_and_write_nothing() {
    for call in ["get", "patch"] {
        let api = Arc::new(FakeApi::with_notebook(notebook()));
        api.hang.lock().expect("lock").insert(call);
        let started = tokio::time::Instant::now();
        let o = run(&api, CullMode::On, false, Ok(true)).await;
        assert_eq!(o.result, StopResult::Error, "{call}");
        assert!(o.detail.contains("timed out"), "{call}: {}", o.detail);
        assert_eq!(started.elapsed(), API_TIMEOUT, "{call}");
        assert!(api.events.lock().expect("lock").is_empty(), "{call}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_hung_recheck_is_bounded() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let actuator = Actuator::new(api.clone(), false, Duration::hours(1));
    let mut recheck = |_: &Action| async {
        futures::future::pending::<()>().await;
        Ok::<_, RecheckError>(true)
    };
    let out = actuator
        .execute(
            &[stop_action()],
            CullMode::On,
            now(),
            &mut recheck,
            &StaticLeadership::new(true),
        )
        .await;
    assert_eq!(out[0].result, StopResult::Error);
    assert!(out[0].detail.contains("timed out"), "{}", out[0].detail);
    assert_eq!(api.patch_count(), 0);
}

#[test]
fn errors_are_reported_with_their_cause_once() {
    let e = CallError::Api("get notebook".into(), api_error(500));
    let text = chain(&e);
    assert!(text.starts_with("get notebook: ApiError: "), "{text}");
    assert_eq!(text.matches("fake: InternalError").count(), 1, "{text}");
}

#[test]
fn stop_results_have_documented_labels() {
    let labels: Vec<&str> = StopResult::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        labels,
        [
            "stopped",
            "conflict",
            "changed",
            "error",
            "dry_run",
            "not_leader"
        ]
    );
}

// === notice before a stop ===

/// The stop the notices of these tests come before: `team-a/nb` (uid `nb-uid`), idle 3h.
fn noticed_stop() -> Action {
    Action::notebook_stop("team-a", "nb")
        .with_uid("nb-uid")
        .idle_for(3.0 * 3600.0, Some(0.008))
}

fn schedule_notice() -> Notice {
    noticed_stop().notice(now() + Duration::minutes(10))
}

fn cancel_notice(why: crate::cull::plan::CancelReason) -> Notice {
    noticed_stop().notice_cancelled(now() + Duration::minutes(10), why)
}

fn notice_actuator(api: &Arc<FakeApi>) -> Actuator {
    Actuator::new(api.clone(), false, Duration::hours(1)).with_policy(CullPolicy {
        notice: Duration::minutes(10),
        ..CullPolicy::default()
    })
}

#[tokio::test]
async fn a_notice_is_an_annotation_and_a_warning_event_with_the_snooze_command() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let leader = StaticLeadership::new(true);
    let out = notice_actuator(&api)
        .notify(&[schedule_notice()], CullMode::On, now(), &leader)
        .await;
    assert_eq!(out[0].result, NoticeResult::Written, "{}", out[0].detail);
    let patches = api.patches.lock().expect("lock").clone();
    assert_eq!(
        patches[0].2,
        json!({"metadata":{"resourceVersion":"43","annotations":{
            "gpu-ledger.io/stop-scheduled-at":"2026-01-31T12:10:00Z",
            "gpu-ledger.io/stop-notice-reason":"GPU idle for 3h0m (peak utilisation 0.8% over the window)"}}})
    );
    let events = api.events.lock().expect("lock").clone();
    let (target, event) = &events[0];
    assert_eq!(target.uid, "nb-uid");
    assert!(event.warning);
    assert_eq!(event.reason, REASON_STOP_SCHEDULED);
    assert!(
        event.note.contains("stop this notebook at 2026-01-31T12:10:00Z unless it is used or snoozed")
            && event.note.contains(
                "kubectl annotate --overwrite notebook -n team-a -- nb gpu-ledger.io/snooze-until=2026-02-01T12:10:00Z"
            ),
        "{}",
        event.note
    );
    // A second schedule of the same notebook finds the notice and writes nothing.
    let again = notice_actuator(&api)
        .notify(&[schedule_notice()], CullMode::On, now(), &leader)
        .await;
    assert_eq!(again[0].result, NoticeResult::Changed);
    assert_eq!(api.patch_count(), 1);
}

#[tokio::test]
async fn a_cancel_removes_the_notice_with_a_normal_event() {
    let api = Arc::new(FakeApi::with_notebook(NotebookInfo {
        stop_scheduled_at: Some(now() + Duration::minutes(10)),
        ..notebook()
    }));
    let leader = StaticLeadership::new(true);
    let out = notice_actuator(&api)
        .notify(
            &[cancel_notice(crate::cull::plan::CancelReason::Activity)],
            CullMode::On,
            now(),
            &leader,
        )
        .await;
    assert_eq!(out[0].result, NoticeResult::Written, "{}", out[0].detail);
    let body = api.patches.lock().expect("lock")[0].2.clone();
    assert_eq!(
        body,
        json!({"metadata":{"resourceVersion":"43","annotations":{
            "gpu-ledger.io/stop-scheduled-at":null,
            "gpu-ledger.io/stop-notice-reason":null}}})
    );
    let events = api.events.lock().expect("lock").clone();
    assert!(!events[0].1.warning);
    assert_eq!(events[0].1.reason, REASON_STOP_CANCELLED);
    assert!(
        events[0]
            .1
            .note
            .contains("cancelled: the GPU is in use again"),
        "{}",
        events[0].1.note
    );
}

#[tokio::test]
async fn dry_run_and_lost_leadership_write_no_notice() {
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let out = notice_actuator(&api)
        .notify(
            &[schedule_notice()],
            CullMode::DryRun,
            now(),
            &StaticLeadership::new(true),
        )
        .await;
    assert_eq!(out[0].result, NoticeResult::DryRun);
    let out = notice_actuator(&api)
        .notify(
            &[schedule_notice()],
            CullMode::On,
            now(),
            &StaticLeadership::new(false),
        )
        .await;
    assert_eq!(out[0].result, NoticeResult::NotLeader);
    assert_eq!(api.patch_count(), 0);
    assert!(api.event_reasons().is_empty());
}

#[tokio::test]
async fn with_a_notice_the_stop_waits_for_it_and_clears_it() {
    let leader = StaticLeadership::new(true);
    let mut recheck = |_: &Action| async move { Ok::<bool, RecheckError>(true) };
    // No notice on the fresh Notebook (removed since the plan): no stop.
    let api = Arc::new(FakeApi::with_notebook(notebook()));
    let out = notice_actuator(&api)
        .execute(&[stop_action()], CullMode::On, now(), &mut recheck, &leader)
        .await;
    assert_eq!(out[0].result, StopResult::Changed, "{}", out[0].detail);
    // A notice that runs a minute longer: no stop yet.
    let api = Arc::new(FakeApi::with_notebook(NotebookInfo {
        stop_scheduled_at: Some(now() + Duration::minutes(1)),
        ..notebook()
    }));
    let out = notice_actuator(&api)
        .execute(&[stop_action()], CullMode::On, now(), &mut recheck, &leader)
        .await;
    assert_eq!(out[0].result, StopResult::Changed, "{}", out[0].detail);
    assert_eq!(api.patch_count(), 0);
    // Run out: the stop, and the spent notice goes with it.
    let api = Arc::new(FakeApi::with_notebook(NotebookInfo {
        stop_scheduled_at: Some(now()),
        ..notebook()
    }));
    let out = notice_actuator(&api)
        .execute(&[stop_action()], CullMode::On, now(), &mut recheck, &leader)
        .await;
    assert_eq!(out[0].result, StopResult::Stopped, "{}", out[0].detail);
    let body = api.patches.lock().expect("lock")[0].2.clone();
    let ann = &body["metadata"]["annotations"];
    assert_eq!(ann["kubeflow-resource-stopped"], "2026-01-31T12:00:00Z");
    assert!(ann["gpu-ledger.io/stop-scheduled-at"].is_null());
    assert!(
        ann.as_object()
            .is_some_and(|a| a.contains_key("gpu-ledger.io/stop-scheduled-at"))
    );
}
