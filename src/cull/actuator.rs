//! The actuator: performs a plan's [`Action`]s against the API, leader-only, and returns
//! [`Outcome`]s as data.
//!
//! Every action and notice names its target (a [`Target`], set by the plan from the pod's owner);
//! right before each stop it re-GETs the target object and re-checks it, asks the
//! caller to re-check the usage evidence, then sends ONE JSON merge patch carrying the re-read
//! `resourceVersion` as a precondition. It never removes annotations other than its own notice,
//! never Updates, scales or deletes anything.
//!
//! Every API call is bounded by [`API_TIMEOUT`], the evidence re-check by [`RECHECK_TIMEOUT`], and
//! leadership is asked again immediately before every write (the patch and the Event): a replica
//! whose claim ran out while it was re-checking does not write.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::sync::Mutex;
use tracing::{info, warn};

use super::lease::{API_TIMEOUT, Leadership};
use super::plan::{Action, CullMode, CullPolicy, Notice, activity_text, rfc3339};
use super::target::{Target, TargetInfo, TargetRef};
use crate::ledger::claims::{
    CULL_OPT_OUT_ANNOTATION, STOP_NOTICE_REASON_ANNOTATION, STOP_REASON_ANNOTATION,
    STOP_SCHEDULED_AT_ANNOTATION, STOPPED_AT_ANNOTATION, STOPPED_BY_ANNOTATION,
};
use crate::ledger::names::snooze_command;

/// Value of `gpu-ledger.io/stopped-by`, the Event reporter and the field manager.
pub const MANAGER: &str = "gpu-ledger";
/// Event reason of a stop.
pub const REASON_STOPPED: &str = "IdleGPUStopped";
/// Event reason of a dry-run stop.
pub const REASON_WOULD_STOP: &str = "IdleGPUWouldStop";
/// Warning Event reason when a stopped target's pod is stuck terminating.
pub const REASON_STOP_STUCK: &str = "IdleGPUStopStuck";
/// Warning Event reason of a notice before a stop (`--cull-notice`).
pub const REASON_STOP_SCHEDULED: &str = "GpuIdleStopScheduled";
/// Normal Event reason when a notice is cancelled (activity, snooze, opt-out).
pub const REASON_STOP_CANCELLED: &str = "GpuIdleStopCancelled";

/// Result of one notice write (the `result` label of `gpu_ledger_cull_notices_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoticeResult {
    /// The annotation was written (schedule) or removed (cancel).
    Written,
    /// The target changed since it was read (HTTP 409); re-planned next cycle.
    Conflict,
    /// The fresh target no longer agrees (replaced, stopped, opted out, already noticed, …).
    Changed,
    /// An API error; nothing was written.
    Error,
    /// Dry-run: reported, not written.
    DryRun,
    /// The leadership claim ran out before the write.
    NotLeader,
}

impl NoticeResult {
    pub const ALL: [NoticeResult; 6] = [
        Self::Written,
        Self::Conflict,
        Self::Changed,
        Self::Error,
        Self::DryRun,
        Self::NotLeader,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Written => "written",
            Self::Conflict => "conflict",
            Self::Changed => "changed",
            Self::Error => "error",
            Self::DryRun => "dry_run",
            Self::NotLeader => "not_leader",
        }
    }
}

/// What happened to one notice.
#[derive(Debug, Clone, PartialEq)]
pub struct NoticeOutcome {
    pub notice: Notice,
    pub result: NoticeResult,
    pub detail: String,
}

/// Result of one stop attempt (the `result` label of `gpu_ledger_cull_stops_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StopResult {
    /// The stop annotation was written.
    Stopped,
    /// The target changed since it was read (HTTP 409); re-planned next cycle.
    Conflict,
    /// The re-check failed: the target or the evidence changed (or the target is gone).
    Changed,
    /// An API or evidence error; nothing was written.
    Error,
    /// Dry-run: everything but the write (optionally a server-side `dryRun=All` patch).
    DryRun,
    /// The leadership claim ran out before the write; nothing was written.
    NotLeader,
}

impl StopResult {
    pub const ALL: [StopResult; 6] = [
        Self::Stopped,
        Self::Conflict,
        Self::Changed,
        Self::Error,
        Self::DryRun,
        Self::NotLeader,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Conflict => "conflict",
            Self::Changed => "changed",
            Self::Error => "error",
            Self::DryRun => "dry_run",
            Self::NotLeader => "not_leader",
        }
    }
}

/// What happened to one action.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub action: Action,
    pub result: StopResult,
    /// Short explanation (which re-check failed, the API error).
    pub detail: String,
}

/// Error type of a caller's evidence re-check.
pub type RecheckError = Box<dyn std::error::Error + Send + Sync>;

/// Bound of the caller's evidence re-check (a few Prometheus queries, each with its own timeout).
pub const RECHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// A culling API call that failed or did not answer within [`API_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0} timed out after {API_TIMEOUT:?}")]
    Timeout(Cow<'static, str>),
    #[error("{0}")]
    Api(Cow<'static, str>, #[source] kube::Error),
}

impl CallError {
    /// The API status of a failed call, when the server answered.
    pub fn status(&self) -> Option<&kube::core::Status> {
        match self {
            Self::Api(_, kube::Error::Api(s)) => Some(s.as_ref()),
            _ => None,
        }
    }
}

/// Runs one API call within [`API_TIMEOUT`]; `what` names it in the error (`get notebook`).
pub async fn bounded<T>(
    what: impl Into<Cow<'static, str>>,
    call: BoxFuture<'_, Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Api(what.into(), e)),
        Err(_) => Err(CallError::Timeout(what.into())),
    }
}

/// The outcome of a failed patch of a target (a `noun`), in the result type of the write (stop
/// or notice): a 409 is a conflict (re-planned next cycle), a 404 an object that is gone,
/// anything else an error with its cause chain.
fn patch_failure<R>(e: &CallError, noun: &str, conflict: R, gone: R, error: R) -> (R, String) {
    if e.status().is_some_and(kube::core::Status::is_conflict) {
        (conflict, format!("{noun} changed (409)"))
    } else if e.status().is_some_and(kube::core::Status::is_not_found) {
        (gone, format!("{noun} is gone"))
    } else {
        (error, chain(e))
    }
}

/// `error: cause: cause`, each message once (for outcome details, which are logged as text): a
/// cause whose text the message already contains (kube's `ApiError: {status}`) is not repeated.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Re-checks the usage evidence of an action right before acting (the app re-queries
/// Prometheus). `Ok(true)` confirms the stop; `Ok(false)` means the GPUs are no longer proven
/// idle. Implemented for closures `FnMut(&Action) -> impl Future<Output = Result<bool, _>>`.
pub trait Recheck {
    fn recheck(&mut self, action: &Action) -> impl Future<Output = Result<bool, RecheckError>>;
}

impl<F, Fut> Recheck for F
where
    F: FnMut(&Action) -> Fut,
    Fut: Future<Output = Result<bool, RecheckError>>,
{
    fn recheck(&mut self, action: &Action) -> impl Future<Output = Result<bool, RecheckError>> {
        (self)(action)
    }
}

/// An Event to publish on a target object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: &'static str,
    /// What we did, e.g. `Stop`.
    pub action: &'static str,
    pub note: String,
}

/// The API calls culling makes; the real one is [`KubeCullApi`], tests use a fake.
pub trait CullApi: Send + Sync {
    /// GET an object of a target kind, projected; `None` when it is gone.
    fn get<'a>(
        &'a self,
        target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<TargetInfo>, kube::Error>>;
    /// ONE JSON merge patch on an object of a target kind (`dry_run` sends `dryRun=All`).
    fn patch<'a>(
        &'a self,
        target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
        body: &'a serde_json::Value,
        dry_run: bool,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
    /// An Event about `object`, of kind `target`.
    fn publish_event<'a>(
        &'a self,
        target: &'a dyn Target,
        object: &'a TargetRef,
        event: &'a EventSpec,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
    /// Value of key `cull` in the kill-switch `ConfigMap`; `None` when the map or key is absent.
    fn kill_switch<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, kube::Error>>;
    /// Names of the namespaces matching a label selector.
    fn namespaces_matching<'a>(
        &'a self,
        selector: &'a str,
    ) -> BoxFuture<'a, Result<BTreeSet<String>, kube::Error>>;
}

/// The merge-patch body of a stop: the action's target's stop fields plus our own audit
/// annotations, with the evaluated `resourceVersion` as precondition. Only adds keys; never
/// removes any.
pub fn stop_patch(action: &Action, resource_version: &str) -> serde_json::Value {
    let Action::Stop {
        target, stop_value, ..
    } = action;
    let mut body = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {
                STOPPED_BY_ANNOTATION: MANAGER,
                STOPPED_AT_ANNOTATION: stop_value,
                STOP_REASON_ANNOTATION: action.reason_text(),
            }
        }
    });
    merge_into(&mut body, target.stop_fields(stop_value));
    body
}

/// Merges `part` into `body` as JSON merge patches compose: objects key by key, anything else
/// replaced.
fn merge_into(body: &mut serde_json::Value, part: serde_json::Value) {
    match (body, part) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(&k) {
                    Some(slot) => merge_into(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, part) => *slot = part,
    }
}

/// Re-checks a freshly read target object against the action: same object, still not stopped,
/// not deleting, no culling annotation that is not understood, not opted out, not snoozed, not
/// within the restart grace, and the action's target's own checks. The error says which check
/// failed.
pub fn verify_fresh(
    nb: &TargetInfo,
    action: &Action,
    restart_grace: Duration,
    now: DateTime<Utc>,
) -> Result<(), String> {
    let policy = CullPolicy {
        min_runtime: restart_grace,
        ..CullPolicy::default()
    };
    verify_fresh_with(nb, action, &policy, now)
}

/// [`verify_fresh`] under a policy: the restart grace is `min_runtime`, a snooze counts as
/// [`CullPolicy::snooze_holds`] says, and with a notice the stop must be under one that has run
/// out (a notice removed or moved since the plan holds the stop back).
pub fn verify_fresh_with(
    nb: &TargetInfo,
    action: &Action,
    policy: &CullPolicy,
    now: DateTime<Utc>,
) -> Result<(), String> {
    let Action::Stop {
        target,
        notebook_uid,
        idle_seconds,
        ..
    } = action;
    verify_target(*target, nb, notebook_uid, Some(*idle_seconds), policy, now)?;
    if policy.notice > Duration::zero() {
        match nb.stop_scheduled_at {
            Some(t) if t <= now => {}
            Some(t) => return Err(format!("notice runs until {}", rfc3339(t))),
            None => return Err("notice was cancelled or removed".into()),
        }
    }
    Ok(())
}

/// The checks a fresh target object must pass before any culling write about it.
fn verify_target(
    target: &dyn Target,
    nb: &TargetInfo,
    uid: &str,
    idle_seconds: Option<f64>,
    policy: &CullPolicy,
    now: DateTime<Utc>,
) -> Result<(), String> {
    let restart_grace = policy.min_runtime;
    let noun = target.identity().noun;
    if nb.uid != uid {
        return Err(format!("{noun} was replaced (uid changed)"));
    }
    if nb.stopped.is_some() {
        return Err(format!("{noun} is already stopped"));
    }
    if nb.deleting {
        return Err(format!("{noun} is being deleted"));
    }
    // A malformed snooze reads as no snooze: it must hold the stop back, not let it through.
    let not_understood = policy.blocking_annotations(nb);
    if !not_understood.is_empty() {
        return Err(format!(
            "{noun} has annotations that are not understood: {}",
            not_understood.join(", ")
        ));
    }
    if nb.cull_opt_out {
        return Err(format!("{noun} opted out"));
    }
    if policy.snooze_holds(nb.snooze_until, idle_seconds, now) {
        return Err(format!("{noun} is snoozed"));
    }
    if nb
        .last_stopped_by_us
        .is_some_and(|t| now - t < restart_grace)
    {
        return Err(format!(
            "{noun} was restarted after our stop (restart grace)"
        ));
    }
    // Activity recorded between the plan and this re-read cancels the write.
    if let Some(at) = policy.activity_veto(nb.last_activity, now) {
        return Err(format!("{noun} shows {}", activity_text(target, at)));
    }
    target.verify_fresh(nb)
}

fn event_note(action: &Action, dry_run: bool) -> String {
    let Action::Stop { target, pod, .. } = action;
    let verb = if dry_run { "Would stop" } else { "Stopped" };
    format!(
        "{verb} by gpu-ledger: {} (pod {pod}). {}; opt out with annotation {CULL_OPT_OUT_ANNOTATION}=false.",
        action.reason_text(),
        target.restart_hint()
    )
}

/// Performs stop actions (and notices) through a [`CullApi`], each on the target it names.
#[derive(Clone)]
pub struct Actuator {
    api: Arc<dyn CullApi>,
    /// In dry-run mode, also send the patch with `dryRun=All` to prove RBAC and webhooks.
    pub server_dry_run: bool,
    /// Restart grace re-checked on the fresh object (the policy's `min_runtime`).
    pub restart_grace: Duration,
    /// The rules re-checked on the fresh object besides the restart grace: the notice and the
    /// snooze bound (default: none).
    pub policy: CullPolicy,
}

impl Actuator {
    pub fn new(api: Arc<dyn CullApi>, server_dry_run: bool, restart_grace: Duration) -> Self {
        Actuator {
            api,
            server_dry_run,
            restart_grace,
            policy: CullPolicy::default(),
        }
    }

    /// The same actuator re-checking `policy`'s notice and snooze bound.
    #[must_use]
    pub fn with_policy(mut self, policy: CullPolicy) -> Self {
        self.policy = policy;
        self
    }

    fn fresh_policy(&self) -> CullPolicy {
        CullPolicy {
            min_runtime: self.restart_grace,
            ..self.policy.clone()
        }
    }

    pub fn api(&self) -> &Arc<dyn CullApi> {
        &self.api
    }

    /// Executes `actions` in order. `mode` must be `DryRun` or `On` (`Off` returns nothing).
    /// `leadership` is asked right before every write.
    pub async fn execute<R: Recheck + ?Sized>(
        &self,
        actions: &[Action],
        mode: CullMode,
        now: DateTime<Utc>,
        recheck: &mut R,
        leadership: &dyn Leadership,
    ) -> Vec<Outcome> {
        if mode == CullMode::Off {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(actions.len());
        for action in actions {
            let (result, detail) = self.stop(action, mode, now, recheck, leadership).await;
            let Action::Stop {
                namespace,
                notebook,
                ..
            } = action;
            match result {
                StopResult::Stopped | StopResult::DryRun => {
                    info!(%namespace, %notebook, result = result.as_str(), reason = %action.reason_text(), "cull");
                }
                _ => {
                    warn!(%namespace, %notebook, result = result.as_str(), %detail, "cull not performed");
                }
            }
            out.push(Outcome {
                action: action.clone(),
                result,
                detail,
            });
        }
        out
    }

    async fn stop<R: Recheck + ?Sized>(
        &self,
        action: &Action,
        mode: CullMode,
        now: DateTime<Utc>,
        recheck: &mut R,
        leadership: &dyn Leadership,
    ) -> (StopResult, String) {
        let Action::Stop {
            target,
            namespace,
            notebook,
            notebook_uid,
            ..
        } = action;
        let target = *target;
        let noun = target.identity().noun;
        let fresh = match bounded(
            format!("get {noun}"),
            self.api.get(target, namespace, notebook),
        )
        .await
        {
            Ok(Some(nb)) => nb,
            Ok(None) => return (StopResult::Changed, format!("{noun} is gone")),
            Err(e) => return (StopResult::Error, chain(&e)),
        };
        if let Err(why) = verify_fresh_with(&fresh, action, &self.fresh_policy(), now) {
            return (StopResult::Changed, why);
        }
        match tokio::time::timeout(RECHECK_TIMEOUT, recheck.recheck(action)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                return (
                    StopResult::Changed,
                    "evidence no longer proves idleness".into(),
                );
            }
            Ok(Err(e)) => {
                return (
                    StopResult::Error,
                    format!("evidence re-check: {}", chain(e.as_ref())),
                );
            }
            Err(_) => {
                return (
                    StopResult::Error,
                    format!("evidence re-check timed out after {RECHECK_TIMEOUT:?}"),
                );
            }
        }
        let dry_run = mode != CullMode::On;
        let patched = !dry_run || self.server_dry_run;
        if patched {
            if !leadership.is_leader() {
                return (
                    StopResult::NotLeader,
                    "leadership ran out before the patch".into(),
                );
            }
            let mut body = stop_patch(action, &fresh.resource_version);
            if fresh.stop_scheduled_at.is_some() {
                // The notice is spent: a stale one must not skip the next notice after a restart.
                clear_notice(&mut body);
            }
            if let Err(e) = bounded(
                format!("patch {noun}"),
                self.api.patch(target, namespace, notebook, &body, dry_run),
            )
            .await
            {
                return patch_failure(
                    &e,
                    noun,
                    StopResult::Conflict,
                    StopResult::Changed,
                    StopResult::Error,
                );
            }
        }
        let result = if dry_run {
            StopResult::DryRun
        } else {
            StopResult::Stopped
        };
        if !leadership.is_leader() {
            // The Event is a write too. A real stop stays a stop (the patch landed while we led).
            warn!(%namespace, %notebook, "leadership ran out before the event; not published");
            if patched && !dry_run {
                return (result, "event not published: leadership ran out".into());
            }
            return (
                StopResult::NotLeader,
                "leadership ran out before the event".into(),
            );
        }
        let object = TargetRef {
            namespace: namespace.clone(),
            name: notebook.clone(),
            uid: notebook_uid.clone(),
        };
        let event = EventSpec {
            warning: false,
            reason: if dry_run {
                REASON_WOULD_STOP
            } else {
                REASON_STOPPED
            },
            action: "Stop",
            note: event_note(action, dry_run),
        };
        if let Err(e) = bounded(
            "publish event",
            self.api.publish_event(target, &object, &event),
        )
        .await
        {
            warn!(%namespace, %notebook, error = &e as &dyn std::error::Error, "cannot publish event");
        }
        (result, String::new())
    }
}

/// Adds the removal of the target's notice annotations (JSON merge patch `null`) to a patch
/// body.
fn clear_notice(body: &mut serde_json::Value) {
    if let Some(ann) = body
        .pointer_mut("/metadata/annotations")
        .and_then(serde_json::Value::as_object_mut)
    {
        ann.insert(STOP_SCHEDULED_AT_ANNOTATION.into(), serde_json::Value::Null);
        ann.insert(
            STOP_NOTICE_REASON_ANNOTATION.into(),
            serde_json::Value::Null,
        );
    }
}

/// The merge-patch body of a notice on its target: schedule writes the due time and the
/// evidence, cancel removes both; with the re-read `resourceVersion` as precondition. Touches
/// nothing else.
pub fn notice_patch(notice: &Notice, resource_version: &str) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    match notice {
        Notice::Schedule { stop_at, .. } => {
            annotations.insert(
                STOP_SCHEDULED_AT_ANNOTATION.into(),
                rfc3339(*stop_at).into(),
            );
            annotations.insert(
                STOP_NOTICE_REASON_ANNOTATION.into(),
                notice.reason_text().into(),
            );
        }
        Notice::Cancel { .. } => {
            annotations.insert(STOP_SCHEDULED_AT_ANNOTATION.into(), serde_json::Value::Null);
            annotations.insert(
                STOP_NOTICE_REASON_ANNOTATION.into(),
                serde_json::Value::Null,
            );
        }
    }
    json!({"metadata": {"resourceVersion": resource_version, "annotations": annotations}})
}

/// The Event of a notice: what happens when, and how to snooze or opt out (exact commands).
pub fn notice_event(notice: &Notice) -> EventSpec {
    let noun = notice.target().identity().noun;
    match notice {
        Notice::Schedule {
            namespace,
            notebook,
            pod,
            stop_at,
            ..
        } => {
            let at = rfc3339(*stop_at);
            let until = rfc3339(*stop_at + Duration::days(1));
            let how = match snooze_command(noun, namespace, notebook, &until) {
                Some(cmd) => format!(
                    " Snooze: {cmd}. Opt out: kubectl annotate {noun} -n {namespace} -- {notebook} {CULL_OPT_OUT_ANNOTATION}=false."
                ),
                None => String::new(),
            };
            EventSpec {
                warning: true,
                reason: REASON_STOP_SCHEDULED,
                action: "ScheduleStop",
                note: format!(
                    "gpu-ledger will stop this {noun} at {at} unless it is used or snoozed: {} (pod {pod}).{how}",
                    notice.reason_text()
                ),
            }
        }
        Notice::Cancel { stop_at, .. } => EventSpec {
            warning: false,
            reason: REASON_STOP_CANCELLED,
            action: "CancelStop",
            note: format!(
                "The stop scheduled for {} is cancelled: {}.",
                rfc3339(*stop_at),
                notice.reason_text()
            ),
        },
    }
}

impl Actuator {
    /// Writes (or, in dry-run, only reports) `notices` in order, leader-only like a stop: re-GET
    /// the target object, check it still agrees, ask leadership, ONE merge patch with the re-read
    /// `resourceVersion`, ask leadership again, the Event.
    pub async fn notify(
        &self,
        notices: &[Notice],
        mode: CullMode,
        now: DateTime<Utc>,
        leadership: &dyn Leadership,
    ) -> Vec<NoticeOutcome> {
        if mode == CullMode::Off {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(notices.len());
        for notice in notices {
            let (result, detail) = self.notice(notice, mode, now, leadership).await;
            let (namespace, notebook, _) = notice.object();
            match result {
                NoticeResult::Written | NoticeResult::DryRun => {
                    info!(%namespace, %notebook, kind = notice.kind(), result = result.as_str(), reason = %notice.reason_text(), "cull notice");
                }
                _ => {
                    warn!(%namespace, %notebook, kind = notice.kind(), result = result.as_str(), %detail, "cull notice not written");
                }
            }
            out.push(NoticeOutcome {
                notice: notice.clone(),
                result,
                detail,
            });
        }
        out
    }

    async fn notice(
        &self,
        notice: &Notice,
        mode: CullMode,
        now: DateTime<Utc>,
        leadership: &dyn Leadership,
    ) -> (NoticeResult, String) {
        let (namespace, notebook, notebook_uid) = notice.object();
        let target = notice.target();
        let noun = target.identity().noun;
        let fresh = match bounded(
            format!("get {noun}"),
            self.api.get(target, namespace, notebook),
        )
        .await
        {
            Ok(Some(nb)) => nb,
            Ok(None) => return (NoticeResult::Changed, format!("{noun} is gone")),
            Err(e) => return (NoticeResult::Error, chain(&e)),
        };
        let agrees = match notice {
            Notice::Schedule { idle_seconds, .. } => verify_target(
                target,
                &fresh,
                notebook_uid,
                Some(*idle_seconds),
                &self.fresh_policy(),
                now,
            )
            .and_then(|()| match fresh.stop_scheduled_at {
                Some(_) => Err("a notice is already scheduled".to_string()),
                None => Ok(()),
            }),
            Notice::Cancel { .. } if fresh.uid != notebook_uid => {
                Err(format!("{noun} was replaced (uid changed)"))
            }
            Notice::Cancel { .. } if fresh.stop_scheduled_at.is_none() => {
                Err("the notice is already gone".to_string())
            }
            Notice::Cancel { .. } => Ok(()),
        };
        if let Err(why) = agrees {
            return (NoticeResult::Changed, why);
        }
        // Dry-run reports what it would write and writes nothing (no annotation, no Event).
        if mode != CullMode::On {
            return (NoticeResult::DryRun, String::new());
        }
        if !leadership.is_leader() {
            return (
                NoticeResult::NotLeader,
                "leadership ran out before the patch".into(),
            );
        }
        let body = notice_patch(notice, &fresh.resource_version);
        if let Err(e) = bounded(
            format!("patch {noun}"),
            self.api.patch(target, namespace, notebook, &body, false),
        )
        .await
        {
            return patch_failure(
                &e,
                noun,
                NoticeResult::Conflict,
                NoticeResult::Changed,
                NoticeResult::Error,
            );
        }
        if !leadership.is_leader() {
            warn!(%namespace, %notebook, "leadership ran out before the event; not published");
            return (
                NoticeResult::Written,
                "event not published: leadership ran out".into(),
            );
        }
        let object = TargetRef {
            namespace: namespace.to_string(),
            name: notebook.to_string(),
            uid: notebook_uid.to_string(),
        };
        let event = notice_event(notice);
        if let Err(e) = bounded(
            "publish event",
            self.api.publish_event(target, &object, &event),
        )
        .await
        {
            warn!(%namespace, %notebook, error = &e as &dyn std::error::Error, "cannot publish event");
        }
        (NoticeResult::Written, String::new())
    }
}

// === impl KubeCullApi ===

/// [`CullApi`] on a live cluster: target objects through their discovered resource (each kind
/// discovered once), `events.k8s.io/v1` Events through a [`Recorder`], `ConfigMaps` and
/// `Namespaces`.
pub struct KubeCullApi {
    client: kube::Client,
    recorder: Recorder,
    /// The served resource of each target kind, by (group, kind), once discovered.
    resources: Mutex<BTreeMap<(&'static str, &'static str), ApiResource>>,
}

impl KubeCullApi {
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_string(),
            instance,
        };
        KubeCullApi {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            resources: Mutex::new(BTreeMap::new()),
        }
    }

    async fn objects(
        &self,
        target: &dyn Target,
        namespace: &str,
    ) -> Result<Api<DynamicObject>, kube::Error> {
        let id = target.identity();
        let mut resources = self.resources.lock().await;
        let ar = if let Some(ar) = resources.get(&(id.group, id.kind)) {
            ar.clone()
        } else {
            let ar = target.discover(&self.client).await?.ok_or_else(|| {
                kube::Error::Discovery(kube::error::DiscoveryError::MissingResource(format!(
                    "{} {}",
                    id.group, id.kind
                )))
            })?;
            resources.insert((id.group, id.kind), ar.clone());
            ar
        };
        Ok(Api::namespaced_with(self.client.clone(), namespace, &ar))
    }

    /// The Event's object: its discovered API version, else the target's first.
    async fn reference(&self, target: &dyn Target, object: &TargetRef) -> ObjectReference {
        let id = target.identity();
        let discovered = self
            .resources
            .lock()
            .await
            .get(&(id.group, id.kind))
            .map(|ar| ar.api_version.clone());
        let api_version = discovered.unwrap_or_else(|| {
            format!(
                "{}/{}",
                id.group,
                id.versions.first().copied().unwrap_or("v1")
            )
        });
        ObjectReference {
            api_version: Some(api_version),
            kind: Some(id.kind.into()),
            name: Some(object.name.clone()),
            namespace: Some(object.namespace.clone()),
            uid: Some(object.uid.clone()),
            ..ObjectReference::default()
        }
    }
}

impl CullApi for KubeCullApi {
    fn get<'a>(
        &'a self,
        target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<TargetInfo>, kube::Error>> {
        Box::pin(async move {
            let api = self.objects(target, namespace).await?;
            Ok(api.get_opt(name).await?.map(|o| target.project(&o)))
        })
    }

    fn patch<'a>(
        &'a self,
        target: &'a dyn Target,
        namespace: &'a str,
        name: &'a str,
        body: &'a serde_json::Value,
        dry_run: bool,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            let api = self.objects(target, namespace).await?;
            let mut pp = PatchParams {
                field_manager: Some(MANAGER.to_string()),
                ..PatchParams::default()
            };
            if dry_run {
                pp = pp.dry_run();
            }
            api.patch(name, &pp, &Patch::Merge(body)).await.map(|_| ())
        })
    }

    fn publish_event<'a>(
        &'a self,
        target: &'a dyn Target,
        object: &'a TargetRef,
        event: &'a EventSpec,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            let ev = Event {
                type_: if event.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: event.reason.to_string(),
                note: Some(event.note.clone()),
                action: event.action.to_string(),
                secondary: None,
            };
            let reference = self.reference(target, object).await;
            self.recorder.publish(&ev, &reference).await
        })
    }

    fn kill_switch<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, kube::Error>> {
        Box::pin(async move {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
            Ok(api
                .get_opt(name)
                .await?
                .and_then(|cm| cm.data.and_then(|mut d| d.remove("cull"))))
        })
    }

    fn namespaces_matching<'a>(
        &'a self,
        selector: &'a str,
    ) -> BoxFuture<'a, Result<BTreeSet<String>, kube::Error>> {
        Box::pin(async move {
            let api: Api<Namespace> = Api::all(self.client.clone());
            let list = api
                .list_metadata(&ListParams::default().labels(selector))
                .await?;
            Ok(list
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect())
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
