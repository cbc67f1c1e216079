//! Culling of idle GPU notebooks: a pure [`plan`](plan::plan), a leader-only
//! [`actuator`], a Lease-based [`lease`] election and the culling [`metrics`].
//!
//! The app calls [`Culler::cycle`] after every refresh with the new ledger. Every replica plans,
//! logs and exports; only the lease holder acts, and only when the mode is not `off`, the kill
//! switch says `on` or is absent, the claims are fresh and the circuit breaker is closed. See
//! `docs/culling.md`.

mod action_builder;
pub mod actuator;
pub mod backoff;
pub mod demand;
pub mod hold_back;
pub mod lease;
pub mod metrics;
pub mod notebook;
mod notebook_builder;
pub mod plan;
pub mod raycluster;
pub mod registry;
pub mod render;
pub mod target;
pub mod webhook;
pub mod workspace;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::ledger::Ledger;
use crate::spawn::Spawn;

pub use actuator::{
    Actuator, CullApi, KubeCullApi, NoticeOutcome, NoticeResult, Outcome, Recheck, RecheckError,
    StopResult,
};
pub use backoff::Backoff;
pub use demand::CullWhen;
pub use hold_back::{HoldBack, KILL_SWITCH_VALUES, kill_switch_engaged};
pub use lease::{API_TIMEOUT, Leadership, StaticLeadership};
pub use metrics::CullMetrics;
pub use plan::{
    Action, CancelReason, CircuitReason, CullMode, CullPolicy, ModeError, Notice, Plan, Skip,
    SkipReason, plan, plan_with,
};
pub use registry::{TARGETS, Targets};
pub use render::render_plan;
pub use target::{Identity, RbacRule, Target, TargetInfo, TargetRef};

/// Culling setup errors.
#[derive(Debug, thiserror::Error)]
pub enum CullError {
    #[error("registering culling metrics")]
    Metrics(#[source] prometheus::Error),
    #[error("invalid culling lease: {0}")]
    Lease(String),
    #[error("notice webhook")]
    Webhook(#[source] webhook::WebhookError),
}

/// Everything culling needs; the app maps its flags onto it.
#[derive(Debug, Clone, PartialEq)]
pub struct CullConfig {
    /// `--cull`: off (default), dry-run or on.
    pub mode: CullMode,
    /// The candidate rules, caps and circuit breaker (see [`CullPolicy`]).
    pub policy: CullPolicy,
    /// `--cull-namespace-selector`: namespaces whose labels match are never culled. Resolved to
    /// `policy.excluded_namespaces` before every acting cycle; if it cannot be resolved, the
    /// cycle does not act.
    pub namespace_selector: Option<String>,
    /// `--lease-name` (default `gpu-ledger`).
    pub lease_name: String,
    /// `--lease-namespace` (default: the pod's namespace from `POD_NAMESPACE` or the service
    /// account mount, else `default`).
    pub lease_namespace: Option<String>,
    /// Lease validity without renewal (default 15 s; renewed every third of it).
    pub lease_duration: Duration,
    /// Test hook only (`GPU_LEDGER_TEST_LEASE_CLOCK_OFFSET`, debug builds): added to the wall
    /// clock written into the Lease, to show a skewed clock cannot take a live Lease. Zero.
    pub lease_clock_offset: Duration,
    /// Kill switch: `(namespace, ConfigMap name)`; key `cull: "off"` disables acting at once,
    /// `"on"` allows it (see [`kill_switch_engaged`]). A missing `ConfigMap` or key means "not
    /// killed"; an unreadable one or any other value means "do not act this cycle".
    pub kill_switch: Option<(String, String)>,
    /// In dry-run mode, also send the patch with `dryRun=All` (proves RBAC and webhooks).
    pub server_dry_run: bool,
    /// Stop tracking a stopped pod for `time to free` after this long (default 24 h).
    pub track_for: Duration,
    /// `--cull-notice-webhook-url-file` and `--cull-notice-webhook-format`: where notices are
    /// also posted (the URL is read from the file, a mounted Secret, at every post).
    pub notice_webhook: Option<(std::path::PathBuf, webhook::WebhookFormat)>,
}

impl Default for CullConfig {
    fn default() -> Self {
        CullConfig {
            mode: CullMode::Off,
            policy: CullPolicy::default(),
            namespace_selector: None,
            lease_name: "gpu-ledger".into(),
            lease_namespace: None,
            lease_duration: Duration::seconds(15),
            lease_clock_offset: Duration::zero(),
            kill_switch: None,
            server_dry_run: false,
            track_for: Duration::hours(24),
            notice_webhook: None,
        }
    }
}

/// The namespace this pod runs in: `POD_NAMESPACE`, the service account mount, else `default`.
pub fn own_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// What one cycle did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CycleReport {
    pub plan: Plan,
    pub outcomes: Vec<Outcome>,
    pub leader: bool,
    /// Whether the actuator ran.
    pub acted: bool,
    /// Why it did not, when it could have (kill switch, unresolved selector, no client).
    pub held_back: Option<HoldBack>,
    /// Seconds from stop to pod gone, observed this cycle.
    pub freed: Vec<(String, f64)>,
    /// What became of the plan's notices (`--cull-notice`).
    pub notices: Vec<NoticeOutcome>,
}

/// A pod we stopped, followed until it is gone.
#[derive(Debug, Clone)]
struct Tracked {
    /// The kind of the stopped object (the stuck Event is about it).
    target: &'static dyn Target,
    namespace: String,
    notebook: String,
    notebook_uid: String,
    pod: String,
    stopped_at: DateTime<Utc>,
    warned_stuck: bool,
}

/// The facade the app calls every refresh.
pub struct Culler {
    config: CullConfig,
    metrics: CullMetrics,
    leadership: Arc<dyn Leadership>,
    actuator: Option<Actuator>,
    tracked: BTreeMap<String, Tracked>,
    /// Notebooks whose stops failed, sitting out cycles (handed to the plan as data).
    backoff: Backoff,
    was_leader: bool,
    /// The election we started: its cancel token and the signal that it released the Lease.
    lease_task: Option<(CancellationToken, oneshot::Receiver<()>)>,
    /// Where written notices are also posted (`--cull-notice-webhook-url-file`).
    webhook: Option<webhook::Webhook>,
}

impl Culler {
    /// A culler; without a client it only plans, logs and exports.
    pub fn new(
        client: Option<kube::Client>,
        config: CullConfig,
        metrics: CullMetrics,
        leadership: Arc<dyn Leadership>,
    ) -> Self {
        let api = client.map(|c| {
            Arc::new(KubeCullApi::new(c, Some(lease::default_identity()))) as Arc<dyn CullApi>
        });
        Self::with_api(api, config, metrics, leadership)
    }

    /// A culler over any [`CullApi`] (tests use a fake).
    pub fn with_api(
        api: Option<Arc<dyn CullApi>>,
        config: CullConfig,
        metrics: CullMetrics,
        leadership: Arc<dyn Leadership>,
    ) -> Self {
        let actuator = api.map(|api| {
            Actuator::new(api, config.server_dry_run, config.policy.min_runtime)
                .with_policy(config.policy.clone())
        });
        Culler {
            config,
            metrics,
            leadership,
            actuator,
            tracked: BTreeMap::new(),
            backoff: Backoff::default(),
            was_leader: false,
            lease_task: None,
            webhook: None,
        }
    }

    /// The same culler, also posting every notice it writes or cancels to `webhook`.
    #[must_use]
    pub fn with_webhook(mut self, webhook: webhook::Webhook) -> Self {
        self.webhook = Some(webhook.with_counter(self.metrics.notice_webhook.clone()));
        self
    }

    /// Wiring for `serve`: metrics on `registry`, and (when culling is not off and a client
    /// exists) a Lease election run as the supervised task `lease` through `spawn`, stopped by
    /// `cancel` or [`Culler::shutdown`].
    pub fn start(
        config: CullConfig,
        client: Option<kube::Client>,
        registry: &prometheus::Registry,
        spawn: Spawn<'_>,
        cancel: &CancellationToken,
    ) -> Result<Self, CullError> {
        let elector = match (&client, config.mode) {
            (Some(c), CullMode::DryRun | CullMode::On) => {
                let lease_config = lease::LeaseConfig {
                    name: config.lease_name.clone(),
                    namespace: config.lease_namespace.clone().unwrap_or_else(own_namespace),
                    identity: lease::default_identity(),
                    duration: config.lease_duration,
                    wall_clock_offset: config.lease_clock_offset,
                };
                lease_config.validate().map_err(CullError::Lease)?;
                info!(lease = %lease_config.name, namespace = %lease_config.namespace, identity = %lease_config.identity, "culling lease election");
                Some(lease::LeaseElector::new(
                    lease::KubeLeaseStore::new(
                        c.clone(),
                        &lease_config.namespace,
                        &lease_config.name,
                    ),
                    lease_config,
                ))
            }
            _ => None,
        };
        let leadership: Arc<dyn Leadership> = match &elector {
            Some(e) => Arc::new(e.handle()),
            None => Arc::new(StaticLeadership::new(false)),
        };
        let metrics =
            CullMetrics::register(registry, leadership.clone()).map_err(CullError::Metrics)?;
        metrics.enabled.set(i64::from(config.mode != CullMode::Off));
        let lease_task = elector.map(|elector| {
            let elector = elector.with_error_counter(metrics.lease_errors.clone());
            let token = cancel.child_token();
            let (released, done) = oneshot::channel();
            let (run_token, parent) = (token.clone(), cancel.clone());
            spawn(
                "lease".to_string(),
                Box::pin(
                    async move {
                        elector.run(run_token).await;
                        let _ = released.send(());
                        // Ending is for shutdown: wait for it, so the supervisor never sees
                        // an early end after `Culler::shutdown`.
                        parent.cancelled().await;
                    }
                    .instrument(info_span!("lease")),
                ),
            );
            (token, done)
        });
        let webhook = match &config.notice_webhook {
            Some((file, format)) => {
                Some(webhook::Webhook::new(file, *format).map_err(CullError::Webhook)?)
            }
            None => None,
        };
        let mut culler = Self::new(client, config, metrics, leadership);
        culler.lease_task = lease_task;
        if let Some(w) = webhook {
            culler = culler.with_webhook(w);
        }
        Ok(culler)
    }

    pub fn config(&self) -> &CullConfig {
        &self.config
    }

    /// Stops the election (if we started it) and waits for the lease to be released.
    pub async fn shutdown(&mut self) {
        if let Some((token, released)) = self.lease_task.take() {
            token.cancel();
            // A release is one bounded GET and one bounded PUT.
            if tokio::time::timeout(
                API_TIMEOUT * 2 + std::time::Duration::from_secs(1),
                released,
            )
            .await
            .is_err()
            {
                warn!("lease release timed out");
            }
        }
        self.metrics.leader.set(0);
    }

    /// One culling cycle on a fresh ledger: follow up earlier stops, plan, log, export, and
    /// (leader only, mode not off) act. `claims_fresh` false (a claims watch broken past its
    /// bound) opens the circuit breaker with reason `claims_stale`.
    pub async fn cycle<R: Recheck + ?Sized>(
        &mut self,
        ledger: &Ledger,
        claims_fresh: bool,
        now: DateTime<Utc>,
        recheck: &mut R,
    ) -> CycleReport {
        let leader = self.leadership.is_leader();
        self.metrics.leader.set(i64::from(leader));
        if leader != self.was_leader {
            info!(leader, mode = %self.config.mode, "culling leadership changed");
            self.was_leader = leader;
        }
        let freed = self.follow_up(ledger, now).await;

        let enabled = self.config.mode != CullMode::Off;
        let wants_to_act = leader && enabled;
        let mut held_back = None;
        if wants_to_act {
            held_back = self.prepare().await;
        }

        // Gone or re-created notebooks start afresh; then one more cycle sat out by the others.
        self.backoff
            .retain_present(ledger, self.config.policy.targets);
        let mut plan = plan::plan_with(ledger, &self.config.policy, &self.backoff, now);
        self.backoff.tick();
        if !claims_fresh {
            plan::open_circuit(&mut plan, CircuitReason::ClaimsStale);
        }
        self.metrics.observe_plan(&plan, enabled);
        self.metrics.observe_held_back(held_back);
        log_plan(&plan, self.config.mode);

        let mut outcomes = Vec::new();
        let mut notices = Vec::new();
        let may_act = wants_to_act && held_back.is_none();
        if may_act
            && !plan.notices.is_empty()
            && let Some(actuator) = &self.actuator
        {
            notices = actuator
                .notify(
                    &plan.notices,
                    self.config.mode,
                    now,
                    self.leadership.as_ref(),
                )
                .await;
            for n in &notices {
                self.metrics
                    .notices
                    .with_label_values(&[n.notice.kind(), n.result.as_str()])
                    .inc();
                // In the background: a slow receiver never holds the cycle (or a stop) back.
                if n.result == NoticeResult::Written
                    && let Some(hook) = &self.webhook
                {
                    drop(hook.post(&n.notice, now));
                }
            }
        }
        let acted = may_act && !plan.actions.is_empty();
        if acted && let Some(actuator) = &self.actuator {
            outcomes = actuator
                .execute(
                    &plan.actions,
                    self.config.mode,
                    now,
                    recheck,
                    self.leadership.as_ref(),
                )
                .await;
        }
        for o in &outcomes {
            self.metrics.observe_stop(o.result);
            self.observe_backoff(o, now);
            if o.result == StopResult::Stopped {
                let Action::Stop {
                    target,
                    namespace,
                    notebook,
                    notebook_uid,
                    pod,
                    pod_uid,
                    ..
                } = &o.action;
                self.tracked.insert(
                    pod_uid.clone(),
                    Tracked {
                        target: *target,
                        namespace: namespace.clone(),
                        notebook: notebook.clone(),
                        notebook_uid: notebook_uid.clone(),
                        pod: pod.clone(),
                        stopped_at: now,
                        warned_stuck: false,
                    },
                );
            }
        }
        self.metrics
            .backoff
            .set(i64::try_from(self.backoff.len()).unwrap_or(i64::MAX));
        CycleReport {
            plan,
            outcomes,
            leader,
            acted,
            held_back,
            freed,
            notices,
        }
    }

    /// A successful stop (or dry-run stop) clears the notebook's backoff; a failed one (API
    /// error such as a 403, conflict, re-check that no longer agrees) makes it sit out cycles,
    /// so that it does not take the per-cycle cap from the others every cycle. A stop not made
    /// because leadership ran out says nothing about the notebook.
    fn observe_backoff(&mut self, o: &Outcome, now: DateTime<Utc>) {
        let Action::Stop {
            target,
            namespace,
            notebook,
            notebook_uid,
            ..
        } = &o.action;
        match o.result {
            StopResult::Stopped | StopResult::DryRun => {
                self.backoff.succeeded(*target, namespace, notebook);
            }
            StopResult::Error | StopResult::Conflict | StopResult::Changed => {
                let e = self
                    .backoff
                    .failed(*target, namespace, notebook, notebook_uid, now);
                info!(%namespace, %notebook, failures = e.failures, cycles = e.cycles_left, "stop failed; notebook backs off");
            }
            StopResult::NotLeader => {}
        }
    }

    /// Before acting: an actuator exists, the kill switch allows it, the selector resolves.
    /// Every call is bounded by [`API_TIMEOUT`].
    async fn prepare(&mut self) -> Option<HoldBack> {
        let Some(actuator) = &self.actuator else {
            return Some(HoldBack::NoClient);
        };
        let api = actuator.api().clone();
        if let Some((ns, name)) = &self.config.kill_switch {
            match actuator::bounded("read kill switch", api.kill_switch(ns, name)).await {
                Ok(value) => match kill_switch_engaged(value.as_deref()) {
                    Ok(false) => {}
                    Ok(true) => {
                        info!(namespace = %ns, configmap = %name, "culling disabled by kill switch");
                        return Some(HoldBack::KillSwitch);
                    }
                    Err(why) => {
                        warn!(namespace = %ns, configmap = %name, problem = %why, accepted = ?KILL_SWITCH_VALUES, "invalid kill switch; not acting");
                        return Some(HoldBack::KillSwitchInvalid);
                    }
                },
                Err(e) => {
                    warn!(namespace = %ns, configmap = %name, error = &e as &dyn std::error::Error, "cannot read kill switch; not acting");
                    return Some(HoldBack::KillSwitchUnreadable);
                }
            }
        }
        if let Some(selector) = &self.config.namespace_selector {
            match actuator::bounded("list namespaces", api.namespaces_matching(selector)).await {
                Ok(set) => self.config.policy.excluded_namespaces = set,
                Err(e) => {
                    warn!(%selector, error = &e as &dyn std::error::Error, "cannot resolve namespace selector; not acting");
                    return Some(HoldBack::SelectorUnresolved);
                }
            }
        }
        None
    }

    /// Time to free for pods we stopped; a Warning Event once if one is stuck terminating.
    async fn follow_up(&mut self, ledger: &Ledger, now: DateTime<Utc>) -> Vec<(String, f64)> {
        let mut freed = Vec::new();
        let mut stuck = Vec::new();
        let track_for = self.config.track_for;
        self.tracked.retain(|uid, t| {
            if now - t.stopped_at > track_for {
                warn!(namespace = %t.namespace, notebook = %t.notebook, pod = %t.pod, "stopped pod still present; no longer tracked");
                return false;
            }
            match ledger.pods.iter().find(|p| &p.evidence.uid == uid) {
                None if ledger.generated_at >= t.stopped_at => {
                    let secs = (ledger.generated_at - t.stopped_at).num_milliseconds() as f64 / 1000.0;
                    info!(namespace = %t.namespace, notebook = %t.notebook, pod = %t.pod, seconds = secs, "GPU freed after stop");
                    freed.push((uid.clone(), secs));
                    false
                }
                Some(row) if row.stuck && !t.warned_stuck => {
                    t.warned_stuck = true;
                    stuck.push(t.clone());
                    true
                }
                _ => true,
            }
        });
        for (_, secs) in &freed {
            self.metrics.time_to_free.observe(*secs);
        }
        for t in stuck {
            warn!(namespace = %t.namespace, notebook = %t.notebook, pod = %t.pod, "stopped notebook's pod is stuck terminating");
            // The Event is a write: leader only, asked right before it.
            if let Some(actuator) = &self.actuator
                && self.leadership.is_leader()
            {
                let target = t.target;
                let object = TargetRef {
                    namespace: t.namespace.clone(),
                    name: t.notebook.clone(),
                    uid: t.notebook_uid.clone(),
                };
                let event = actuator::EventSpec {
                    warning: true,
                    reason: actuator::REASON_STOP_STUCK,
                    action: "Stop",
                    note: format!(
                        "Pod {} is stuck terminating after gpu-ledger stopped the {}; its GPU is not free.",
                        t.pod,
                        target.identity().noun
                    ),
                };
                if let Err(e) = actuator::bounded(
                    "publish event",
                    actuator.api().publish_event(target, &object, &event),
                )
                .await
                {
                    warn!(namespace = %t.namespace, notebook = %t.notebook, error = &e as &dyn std::error::Error, "cannot publish event");
                }
            }
        }
        freed
    }
}

fn log_plan(plan: &Plan, mode: CullMode) {
    if let Some(reason) = plan.circuit {
        // With culling off the breaker blocks nothing: not worth a warning.
        if mode == CullMode::Off {
            debug!(
                reason = reason.as_str(),
                candidates = plan.candidates,
                "culling circuit breaker would be open (culling is off)"
            );
        } else {
            warn!(
                reason = reason.as_str(),
                candidates = plan.candidates,
                "culling circuit breaker open; no stops"
            );
        }
    }
    for a in &plan.actions {
        let Action::Stop {
            namespace,
            notebook,
            pod,
            ..
        } = a;
        info!(%namespace, %notebook, %pod, mode = %mode, reason = %a.reason_text(), "idle notebook selected for stop");
    }
    for n in &plan.notices {
        let (namespace, notebook, _) = n.object();
        info!(%namespace, %notebook, kind = n.kind(), mode = %mode, reason = %n.reason_text(), "cull notice planned");
    }
    for s in &plan.skips {
        let notebook = s.notebook.as_deref().unwrap_or("");
        match s.reason {
            // With culling off nothing is held back: the caps and the breaker block nothing.
            SkipReason::PerCycleCap
            | SkipReason::PerNamespaceCap
            | SkipReason::CircuitOpen
            | SkipReason::Backoff
                if mode != CullMode::Off =>
            {
                info!(namespace = %s.namespace, pod = %s.pod, notebook, reason = s.reason.as_str(), "idle notebook held back");
            }
            SkipReason::RecentActivity if mode != CullMode::Off => {
                let detail = s.detail.as_deref().unwrap_or_default();
                info!(namespace = %s.namespace, pod = %s.pod, notebook, reason = s.reason.as_str(), detail, "idle GPUs but recent activity; not stopped");
            }
            // A user's annotation that fails closed: say so where it would otherwise be silent.
            SkipReason::InvalidAnnotation if mode != CullMode::Off => {
                info!(namespace = %s.namespace, pod = %s.pod, notebook, reason = s.reason.as_str(), "culling annotation not understood; notebook held back");
            }
            _ => {
                debug!(namespace = %s.namespace, pod = %s.pod, notebook, reason = s.reason.as_str(), "not culled");
            }
        }
    }
}

#[cfg(test)]
mod tests;
