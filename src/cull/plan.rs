//! The pure culling policy: `(ledger, policy, now) -> Plan`. No I/O, no clock.
//!
//! Every GPU pod that holds a GPU is judged once per plan. A notebook becomes a *candidate* only
//! when every rule in [`plan`] holds; candidates become [`Action`]s in longest-idle-first order
//! until the blast-radius caps are reached, passing over those backing off after a failed stop
//! (the culler's [`Backoff`], given as data). A fleet-wide circuit breaker can veto all actions.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Duration, Utc};

use super::backoff::Backoff;
use super::demand::{self, CullWhen};
use super::registry::{OwnerObject, Targets};
use super::target::{Target, TargetInfo};
use crate::ledger::claims::LAST_ACTIVITY_ANNOTATION;
use crate::ledger::{Attribution, Ledger, PodRow, PodState, Sharing};

/// Whether culling acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum CullMode {
    /// Plan, log and export only (the default).
    #[default]
    Off,
    /// Also re-check, publish `IdleGPUWouldStop` Events, optionally a server-side dry-run patch.
    DryRun,
    /// Stop idle notebooks.
    On,
}

impl CullMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::DryRun => "dry-run",
            Self::On => "on",
        }
    }
}

impl fmt::Display for CullMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CullMode {
    type Err = ModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "false" => Ok(Self::Off),
            "dry-run" | "dryrun" | "dry_run" => Ok(Self::DryRun),
            "on" | "true" => Ok(Self::On),
            _ => Err(ModeError(s.to_string())),
        }
    }
}

/// A `--cull` value that is none of the modes.
#[derive(Debug, thiserror::Error)]
#[error("invalid cull mode {0:?} (expected off, dry-run or on)")]
pub struct ModeError(pub String);

/// Knobs of the culling policy. Every duration is inclusive ("at least").
#[derive(Debug, Clone, PartialEq)]
pub struct CullPolicy {
    /// GPUs must be proven idle at least this long (`--cull-idle-after`, default 2h).
    pub idle_after: Duration,
    /// The pod must have been Running + Ready at least this long, counted from the later of pod
    /// start, Ready, and our last stop of the notebook (`--cull-min-runtime`, default 1h; this is
    /// also the restart grace).
    pub min_runtime: Duration,
    /// Lowest acceptable window coverage over the pod's devices (0..1, default 0.9).
    pub min_coverage: f64,
    /// The newest sample of every device must be at most this old (default 2m).
    pub max_staleness: Duration,
    /// At most this many stops per cycle (`--cull-max-per-cycle`, default 3). At most one per
    /// namespace per cycle, always.
    pub max_per_cycle: usize,
    /// Allow list (`--cull-namespaces`): when non-empty, only these namespaces are culled.
    pub namespaces: BTreeSet<String>,
    /// Deny list (`--cull-exclude-namespaces`): never culled.
    pub exclude_namespaces: BTreeSet<String>,
    /// Namespaces excluded by `--cull-namespace-selector`, resolved by the caller (the ledger has
    /// no namespace labels): every namespace whose labels do NOT match the selector.
    pub excluded_namespaces: BTreeSet<String>,
    /// Circuit breaker: open when more than this share of running GPU pods is idle (default 0.8).
    pub max_idle_share: f64,
    /// Circuit breaker: open when more than this share of running GPU pods is unattributed
    /// (default 0.5).
    pub max_unattributed_share: f64,
    /// The share-based breakers only apply with at least this many running GPU pods (default 5).
    pub circuit_min_pods: usize,
    /// ... and only when those pods hold at least this many physical GPUs (default 3): on a
    /// cluster with one or two cards "most GPUs idle" is ordinary, not a metrics failure, even
    /// when time-slicing or MIG puts many pods on them.
    pub circuit_min_gpus: f64,
    /// Notice before a stop (`--cull-notice`, default 0 = none): a candidate is first given a
    /// notice (annotation and Warning Event, see [`Notice`]) and stopped only once it has run
    /// out. Counted from the moment it qualifies, so it never shortens `idle_after`.
    pub notice: Duration,
    /// A snooze counts at most this long after the notebook first qualified, i.e. was idle for
    /// `idle_after` (`--cull-max-snooze`, default 0 = no bound).
    pub max_snooze: Duration,
    /// `--cull-when`: stop whenever idle, or only for a pending pod that needs the GPUs.
    pub when: CullWhen,
    /// The kinds of owner object culling stops, in the order a pod is offered to them (default:
    /// every registered target). A pod none of them owns is skipped as `not_notebook`.
    pub targets: Targets,
    /// Activity veto (`--cull-respect-activity`, default on): an owner whose own controller
    /// recorded activity less than `idle_after` ago is not stopped, however idle its GPUs.
    pub respect_activity: bool,
}

impl Default for CullPolicy {
    fn default() -> Self {
        CullPolicy {
            idle_after: Duration::hours(2),
            min_runtime: Duration::hours(1),
            min_coverage: 0.9,
            max_staleness: Duration::minutes(2),
            max_per_cycle: 3,
            namespaces: BTreeSet::new(),
            exclude_namespaces: BTreeSet::new(),
            excluded_namespaces: BTreeSet::new(),
            max_idle_share: 0.8,
            max_unattributed_share: 0.5,
            circuit_min_pods: 5,
            circuit_min_gpus: 3.0,
            notice: Duration::zero(),
            max_snooze: Duration::zero(),
            when: CullWhen::Idle,
            targets: Targets::default(),
            respect_activity: true,
        }
    }
}

impl CullPolicy {
    /// Whether culling may touch `namespace` at all (allow list, deny list, selector).
    pub fn namespace_allowed(&self, namespace: &str) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(namespace))
            && !self.exclude_namespaces.contains(namespace)
            && !self.excluded_namespaces.contains(namespace)
    }

    /// Whether a `gpu-ledger.io/snooze-until` holds a pod back now: the time is in the future
    /// and, with `max_snooze`, the pod has qualified (been idle for `idle_after`) for less than
    /// `max_snooze`. Measured from a point the data fixes (not from `now`, which would make the
    /// bound slide with the clock); activity restarts it with the idle time.
    pub fn snooze_holds(
        &self,
        snooze_until: Option<DateTime<Utc>>,
        idle_seconds: Option<f64>,
        now: DateTime<Utc>,
    ) -> bool {
        if snooze_until.is_none_or(|t| t <= now) {
            return false;
        }
        if self.max_snooze <= Duration::zero() {
            return true;
        }
        match idle_seconds {
            Some(idle) if idle.is_finite() => {
                idle - seconds(self.idle_after) < seconds(self.max_snooze)
            }
            // No idle time known: the pod cannot qualify anyway.
            _ => true,
        }
    }

    /// The activity that vetoes a stop now, if any: `last_activity` is newer than `now -
    /// idle_after` (activity exactly `idle_after` ago no longer counts, as idleness of exactly
    /// `idle_after` qualifies). Always `None` with the veto off.
    pub fn activity_veto(
        &self,
        last_activity: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        last_activity.filter(|at| self.respect_activity && *at > now - self.idle_after)
    }

    /// The owner's annotations that are present but not understood and hold it back. With the
    /// veto off the activity annotation is not read, so a bad value of it holds nothing back.
    pub fn blocking_annotations<'a>(&self, nb: &'a TargetInfo) -> Vec<&'a str> {
        nb.invalid_annotations
            .iter()
            .copied()
            .filter(|k| self.respect_activity || *k != LAST_ACTIVITY_ANNOTATION)
            .collect()
    }
}

fn seconds(d: Duration) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// Why a GPU pod is not (or not now) stopped. A bounded set: safe as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SkipReason {
    /// The pod belongs to no culling target (no owner object of a registered kind).
    NotNotebook,
    /// The pod → owner object chain (for a notebook: pod → `StatefulSet` → uid) could not be
    /// verified.
    UnverifiedOwner,
    /// The owner object has a deletionTimestamp.
    Deleting,
    /// Another controller manages the owner object's lifecycle (a RayCluster of a RayJob or
    /// RayService): it is stopped through that parent, never directly.
    ManagedByParent,
    /// The owner object is stopped: its stop marker is present (any value, including the ODH
    /// lock on a notebook).
    AlreadyStopped,
    /// A culling annotation is present but not understood (a snooze that is not RFC 3339 with
    /// a zone, a `gpu-ledger.io/cull` value other than `"true"`/`"false"`, a malformed
    /// `gpu-ledger.io/stopped-at`): fail closed.
    InvalidAnnotation,
    /// `gpu-ledger.io/cull: "false"`.
    OptedOut,
    /// Allow list, deny list or namespace selector excludes the namespace.
    NamespaceExcluded,
    /// `gpu-ledger.io/snooze-until` is in the future.
    Snoozed,
    /// The pod is not Running and Ready (or is terminating).
    NotReady,
    /// Running + Ready for less than `min_runtime`.
    TooYoung,
    /// We stopped this notebook less than `min_runtime` ago.
    RestartGrace,
    /// A time-sliced or otherwise shared GPU: per-pod idleness is not provable.
    SharedGpu,
    /// No DCGM series names the pod's GPUs.
    Unattributed,
    /// Some device's window coverage is below `min_coverage`, or devices are missing.
    PartialCoverage,
    /// Some device's newest sample is older than `max_staleness`.
    StaleData,
    /// The GPUs are in use.
    NotIdle,
    /// Idleness is unknown (no verdict from the ledger).
    IdleUnknown,
    /// Idle, but for less than `idle_after`.
    IdleTooShort,
    /// Another pod of the same notebook holds a GPU that is not a stop candidate: a notebook is
    /// idle only when all of its pods are.
    NotebookPodBusy,
    /// A candidate left for a later cycle: `max_per_cycle` reached.
    PerCycleCap,
    /// A candidate left for a later cycle: its namespace already has a stop this cycle.
    PerNamespaceCap,
    /// A candidate held back by the circuit breaker.
    CircuitOpen,
    /// A candidate sitting out cycles after a failed stop (see [`Backoff`]); it takes neither
    /// the per-cycle nor the per-namespace cap.
    Backoff,
    /// A candidate under notice (`--cull-notice`) whose notice has not run out: stopped later,
    /// unless used or snoozed meanwhile.
    NoticePending,
    /// `--cull-when=demand`: no pending pod would fit by stopping this notebook.
    NoDemand,
    /// An MPS client: dcgm-exporter cannot attribute readings to MPS clients, so nothing proves
    /// it idle (checked first: whatever owns it).
    MpsSharer,
    /// A KAI-Scheduler reservation pod: its card is its fraction users', never its own to give.
    KaiReservation,
    /// Idle GPUs, but the owner's own controller recorded activity less than `idle_after` ago
    /// (`--cull-respect-activity`); the skip's detail names the time and where it was read.
    RecentActivity,
}

impl SkipReason {
    /// Every reason, for pre-initialising metric label values.
    pub const ALL: [SkipReason; 29] = [
        Self::NotNotebook,
        Self::UnverifiedOwner,
        Self::Deleting,
        Self::ManagedByParent,
        Self::AlreadyStopped,
        Self::InvalidAnnotation,
        Self::OptedOut,
        Self::NamespaceExcluded,
        Self::Snoozed,
        Self::NotReady,
        Self::TooYoung,
        Self::RestartGrace,
        Self::SharedGpu,
        Self::Unattributed,
        Self::PartialCoverage,
        Self::StaleData,
        Self::NotIdle,
        Self::IdleUnknown,
        Self::IdleTooShort,
        Self::NotebookPodBusy,
        Self::PerCycleCap,
        Self::PerNamespaceCap,
        Self::CircuitOpen,
        Self::Backoff,
        Self::NoticePending,
        Self::NoDemand,
        Self::MpsSharer,
        Self::KaiReservation,
        Self::RecentActivity,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotNotebook => "not_notebook",
            Self::UnverifiedOwner => "unverified_owner",
            Self::Deleting => "deleting",
            Self::ManagedByParent => "managed_by_parent",
            Self::AlreadyStopped => "already_stopped",
            Self::InvalidAnnotation => "invalid_annotation",
            Self::OptedOut => "opted_out",
            Self::NamespaceExcluded => "namespace_excluded",
            Self::Snoozed => "snoozed",
            Self::NotReady => "not_ready",
            Self::TooYoung => "too_young",
            Self::RestartGrace => "restart_grace",
            Self::SharedGpu => "shared_gpu",
            Self::Unattributed => "unattributed",
            Self::PartialCoverage => "partial_coverage",
            Self::StaleData => "stale_data",
            Self::NotIdle => "not_idle",
            Self::IdleUnknown => "idle_unknown",
            Self::IdleTooShort => "idle_too_short",
            Self::NotebookPodBusy => "notebook_pod_busy",
            Self::PerCycleCap => "per_cycle_cap",
            Self::PerNamespaceCap => "per_namespace_cap",
            Self::CircuitOpen => "circuit_open",
            Self::Backoff => "backoff",
            Self::NoticePending => "notice_pending",
            Self::NoDemand => "no_demand",
            Self::MpsSharer => "mps_sharer",
            Self::KaiReservation => "kai_reservation",
            Self::RecentActivity => "recent_activity",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the circuit breaker blocks every action of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CircuitReason {
    /// The utilisation source is down: nothing can be proven idle.
    UsageUnavailable,
    /// Implausibly many running GPU pods look idle at once (usually a metrics problem).
    IdleShare,
    /// Too many running GPU pods have no attributable series (exporter or relabelling problem).
    UnattributedShare,
    /// A claims watch has been failing past its bound: the store may be frozen (a restarted
    /// pod would keep its old start time). Set by the caller ([`open_circuit`]), not by [`plan`].
    ClaimsStale,
}

impl CircuitReason {
    /// Every reason, for pre-initialising metric label values.
    pub const ALL: [CircuitReason; 4] = [
        Self::UsageUnavailable,
        Self::IdleShare,
        Self::UnattributedShare,
        Self::ClaimsStale,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::UsageUnavailable => "usage_unavailable",
            Self::IdleShare => "idle_share",
            Self::UnattributedShare => "unattributed_share",
            Self::ClaimsStale => "claims_stale",
        }
    }
}

impl std::fmt::Display for CircuitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A side effect the actuator should perform.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Stop the owner object (a notebook: by adding its stop annotation; see `cull::Target`).
    Stop {
        /// The kind of the owner object: how the actuator reads, verifies and stops it.
        target: &'static dyn Target,
        namespace: String,
        notebook: String,
        notebook_uid: String,
        /// The owner object's resourceVersion the plan evaluated.
        resource_version: String,
        pod: String,
        pod_uid: String,
        idle_seconds: f64,
        /// Highest utilisation (0..1) over the pod's devices in the window, when known.
        peak_utilization: Option<f64>,
        /// Value written to the stop and stopped-at annotations: UTC `YYYY-MM-DDTHH:MM:SSZ`.
        stop_value: String,
        /// With `--cull-when=demand`: the pending pod (`namespace/pod`) the stop makes room for.
        for_pending: Option<String>,
    },
}

impl Action {
    /// The kind of object the action is about.
    pub fn target(&self) -> &'static dyn Target {
        match self {
            Self::Stop { target, .. } => *target,
        }
    }

    pub fn namespace(&self) -> &str {
        match self {
            Self::Stop { namespace, .. } => namespace,
        }
    }

    pub fn notebook(&self) -> &str {
        match self {
            Self::Stop { notebook, .. } => notebook,
        }
    }

    /// Human-readable evidence, e.g. "GPU idle for 3h12m (peak utilisation 0.8% over the window)".
    pub fn reason_text(&self) -> String {
        match self {
            Self::Stop {
                idle_seconds,
                peak_utilization,
                for_pending,
                ..
            } => {
                let evidence = evidence_text(*idle_seconds, *peak_utilization);
                match for_pending {
                    Some(whom) => format!("{evidence}; needed by pending pod {whom}"),
                    None => evidence,
                }
            }
        }
    }
}

/// "GPU idle for 3h12m (peak utilisation 0.8% over the window)".
fn evidence_text(idle_seconds: f64, peak_utilization: Option<f64>) -> String {
    let idle = human_duration(idle_seconds);
    match peak_utilization {
        Some(p) => format!(
            "GPU idle for {idle} (peak utilisation {:.1}% over the window)",
            p * 100.0
        ),
        None => format!("GPU idle for {idle}"),
    }
}

/// Why a notice is cancelled (the Normal Event says so). A bounded set: safe as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CancelReason {
    /// The GPUs are in use again (or idle for less than `idle_after` since).
    Activity,
    /// A snooze that counts (see [`CullPolicy::snooze_holds`]).
    Snoozed,
    /// `gpu-ledger.io/cull: "false"`.
    OptedOut,
    /// Stopped by someone else, or its namespace is no longer culled.
    NotEligible,
    /// `--cull-when=demand`: no pending pod waits for its GPUs any more.
    NoDemand,
    /// Its controller recorded activity within `idle_after` (the activity veto).
    RecentActivity,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Activity => "activity",
            Self::Snoozed => "snoozed",
            Self::OptedOut => "opted_out",
            Self::NotEligible => "not_eligible",
            Self::NoDemand => "no_demand",
            Self::RecentActivity => "recent_activity",
        }
    }

    /// The skip reasons that cancel a notice; any other (missing data, a pod not Ready) keeps
    /// it: missing data is never activity, and the stop re-checks everything when it is due.
    fn of(reason: SkipReason) -> Option<Self> {
        match reason {
            SkipReason::NotIdle | SkipReason::IdleTooShort | SkipReason::NotebookPodBusy => {
                Some(Self::Activity)
            }
            SkipReason::Snoozed => Some(Self::Snoozed),
            SkipReason::OptedOut => Some(Self::OptedOut),
            SkipReason::AlreadyStopped | SkipReason::NamespaceExcluded => Some(Self::NotEligible),
            SkipReason::NoDemand => Some(Self::NoDemand),
            SkipReason::RecentActivity => Some(Self::RecentActivity),
            _ => None,
        }
    }
}

/// A notice side effect (`--cull-notice`): written by the leader like a stop.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// Annotate `gpu-ledger.io/stop-scheduled-at` (and the reason), Warning Event
    /// `GpuIdleStopScheduled`.
    Schedule {
        /// The kind of the owner object the notice is written on.
        target: &'static dyn Target,
        namespace: String,
        notebook: String,
        notebook_uid: String,
        pod: String,
        /// When the stop is due: `now + notice`.
        stop_at: DateTime<Utc>,
        idle_seconds: f64,
        peak_utilization: Option<f64>,
    },
    /// Remove the notice annotations, Normal Event `GpuIdleStopCancelled`.
    Cancel {
        /// The kind of the owner object the notice is removed from.
        target: &'static dyn Target,
        namespace: String,
        notebook: String,
        notebook_uid: String,
        pod: String,
        /// The stop that no longer happens.
        stop_at: DateTime<Utc>,
        why: CancelReason,
        /// The snooze, when that is why.
        snooze_until: Option<DateTime<Utc>>,
    },
}

impl Notice {
    /// The kind of object the notice is about.
    pub fn target(&self) -> &'static dyn Target {
        match self {
            Self::Schedule { target, .. } | Self::Cancel { target, .. } => *target,
        }
    }

    /// The object the notice is about: (namespace, name, uid).
    pub fn object(&self) -> (&str, &str, &str) {
        match self {
            Self::Schedule {
                namespace,
                notebook,
                notebook_uid,
                ..
            }
            | Self::Cancel {
                namespace,
                notebook,
                notebook_uid,
                ..
            } => (namespace, notebook, notebook_uid),
        }
    }

    /// `schedule` or `cancel` (the `kind` label of `gpu_ledger_cull_notices_total`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Schedule { .. } => "schedule",
            Self::Cancel { .. } => "cancel",
        }
    }

    /// The evidence of a schedule, the cause of a cancel (for annotations, Events, logs).
    pub fn reason_text(&self) -> String {
        match self {
            Self::Schedule {
                idle_seconds,
                peak_utilization,
                ..
            } => evidence_text(*idle_seconds, *peak_utilization),
            Self::Cancel {
                why, snooze_until, ..
            } => match (why, snooze_until) {
                (CancelReason::Activity, _) => "the GPU is in use again".into(),
                (CancelReason::Snoozed, Some(t)) => format!("snoozed until {}", rfc3339(*t)),
                (CancelReason::Snoozed, None) => "snoozed".into(),
                (CancelReason::OptedOut, _) => "opted out (gpu-ledger.io/cull=false)".into(),
                (CancelReason::NotEligible, _) => "no longer eligible for culling".into(),
                (CancelReason::NoDemand, _) => "no pending pod waits for its GPUs any more".into(),
                (CancelReason::RecentActivity, _) => {
                    "its controller recorded recent activity".into()
                }
            },
        }
    }
}

/// UTC `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, what the notice annotation holds).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The notice a pod's owner object `nb` is under, if it is current: it was due after the pod
/// started running (a notice left from before a restart, or from before our own stop, is stale).
pub fn current_notice(row: &PodRow, nb: &TargetInfo) -> Option<DateTime<Utc>> {
    let at = nb.stop_scheduled_at?;
    let started = row.evidence.started_at.max(row.evidence.ready_since);
    let stale = nb.last_stopped_by_us.is_some_and(|s| s >= at) || started.is_some_and(|s| s >= at);
    (!stale).then_some(at)
}

/// `3h12m`, `45m`, `2d3h`: minutes precision, never negative.
pub fn human_duration(seconds: f64) -> String {
    let total_min = (seconds.max(0.0) / 60.0).floor() as u64;
    let (d, h, m) = (total_min / 1440, (total_min / 60) % 24, total_min % 60);
    if d > 0 {
        format!("{d}d{h}h{m}m")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else {
        format!("{m}m")
    }
}

/// A GPU pod that is not stopped this cycle, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub namespace: String,
    pub pod: String,
    pub notebook: Option<String>,
    pub reason: SkipReason,
    /// What the reason alone does not say, e.g. for [`SkipReason::RecentActivity`] "recent
    /// activity at 2026-12-05T01:00:00Z (notebooks.kubeflow.org/last-activity)".
    pub detail: Option<String>,
}

/// The outcome of one plan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Notebooks that met every rule (before caps and the circuit breaker).
    pub candidates: usize,
    pub skips: Vec<Skip>,
    /// Set when the circuit breaker blocks every action.
    pub circuit: Option<CircuitReason>,
    /// Notices to write or cancel (`--cull-notice`; always empty without it).
    pub notices: Vec<Notice>,
}

/// Judges one pod: `Ok(())` when it is a candidate, else the first rule that fails.
///
/// Rule order matters only for the reported reason; a candidate must pass every rule.
pub fn judge(row: &PodRow, policy: &CullPolicy, now: DateTime<Utc>) -> Result<(), SkipReason> {
    match row.sharing {
        Sharing::Mps { .. } => return Err(SkipReason::MpsSharer),
        Sharing::KaiReservation { .. } => return Err(SkipReason::KaiReservation),
        _ => {}
    }
    let Some(OwnerObject {
        object: nb,
        verified,
        ..
    }) = policy.targets.owner(row)
    else {
        return Err(SkipReason::NotNotebook);
    };
    if !verified {
        return Err(SkipReason::UnverifiedOwner);
    }
    if nb.deleting {
        return Err(SkipReason::Deleting);
    }
    if nb.managed_by.is_some() {
        return Err(SkipReason::ManagedByParent);
    }
    if nb.stopped.is_some() {
        return Err(SkipReason::AlreadyStopped);
    }
    // Before the opt-out and the snooze: a value not understood must not read as "go ahead".
    if !policy.blocking_annotations(nb).is_empty() {
        return Err(SkipReason::InvalidAnnotation);
    }
    if nb.cull_opt_out {
        return Err(SkipReason::OptedOut);
    }
    if !policy.namespace_allowed(&row.namespace) || !policy.namespace_allowed(&nb.namespace) {
        return Err(SkipReason::NamespaceExcluded);
    }
    if policy.snooze_holds(nb.snooze_until, row.idle_seconds, now) {
        return Err(SkipReason::Snoozed);
    }
    if row.state != PodState::Running || row.evidence.uid.is_empty() {
        return Err(SkipReason::NotReady);
    }
    let Some(ready_since) = row.evidence.ready_since else {
        return Err(SkipReason::NotReady);
    };
    // Running since the later of pod start and Ready; an unknown start is covered by Ready.
    let running_since = row
        .evidence
        .started_at
        .map_or(ready_since, |s| s.max(ready_since));
    if now - running_since < policy.min_runtime {
        return Err(SkipReason::TooYoung);
    }
    if nb
        .last_stopped_by_us
        .is_some_and(|t| now - t < policy.min_runtime)
    {
        return Err(SkipReason::RestartGrace);
    }
    match row.attribution {
        Attribution::Exclusive | Attribution::Mig => {}
        Attribution::Shared => return Err(SkipReason::SharedGpu),
        Attribution::Unattributed | Attribution::None => return Err(SkipReason::Unattributed),
    }
    if row.idle == Some(false) {
        return Err(SkipReason::NotIdle);
    }
    let ev = &row.evidence;
    let covered = ev.coverage.is_some_and(|c| c >= policy.min_coverage);
    if !covered || ev.devices_expected == 0 || ev.devices_found < ev.devices_expected {
        return Err(SkipReason::PartialCoverage);
    }
    match ev.newest_sample_at {
        Some(t) if now - t <= policy.max_staleness => {}
        _ => return Err(SkipReason::StaleData),
    }
    if row.idle != Some(true) {
        return Err(SkipReason::IdleUnknown);
    }
    let idle_after = policy.idle_after.num_milliseconds() as f64 / 1000.0;
    match row.idle_seconds {
        Some(s) if s.is_finite() && s >= idle_after => {}
        _ => return Err(SkipReason::IdleTooShort),
    }
    // Last: the veto is news only for a pod that would otherwise be stopped.
    if policy.activity_veto(nb.last_activity, now).is_some() {
        return Err(SkipReason::RecentActivity);
    }
    Ok(())
}

/// The circuit breaker over the whole ledger.
pub fn circuit(ledger: &Ledger, policy: &CullPolicy) -> Option<CircuitReason> {
    if !ledger.usage_available {
        return Some(CircuitReason::UsageUnavailable);
    }
    let running: Vec<&PodRow> = ledger
        .pods
        .iter()
        .filter(|p| p.state == PodState::Running)
        .collect();
    let gpus: f64 = running
        .iter()
        .map(|p| p.gpus)
        .filter(|g| g.is_finite() && *g > 0.0)
        .sum();
    if running.len() < policy.circuit_min_pods.max(1) || gpus < policy.circuit_min_gpus {
        return None;
    }
    let share = |n: usize| n as f64 / running.len() as f64;
    let idle = running.iter().filter(|p| p.idle == Some(true)).count();
    if share(idle) > policy.max_idle_share {
        return Some(CircuitReason::IdleShare);
    }
    let unattributed = running
        .iter()
        .filter(|p| p.attribution == Attribution::Unattributed)
        .count();
    if share(unattributed) > policy.max_unattributed_share {
        return Some(CircuitReason::UnattributedShare);
    }
    None
}

/// Plans the stops of one cycle. Pure and deterministic: the same input gives the same plan,
/// whatever the order of `ledger.pods`.
///
/// A notebook is a candidate only when ALL hold (see [`judge`]): its pod is verified as the
/// owner object's; the owner is not deleting, not stopped (any value), not opted out, not in an
/// excluded namespace, not snoozed; the pod is Running + Ready for at least `min_runtime` since
/// the later of start/Ready, and we did not stop the notebook within `min_runtime`; every GPU is
/// attributed `exclusive` or `mig`; coverage is full and fresh; and it is idle for at least
/// `idle_after`; no culling annotation of it is present but not understood. Candidates are
/// taken longest-idle first, at most `max_per_cycle` and one per namespace; nothing is taken
/// while the circuit breaker is open. Pending pods are ignored.
pub fn plan(ledger: &Ledger, policy: &CullPolicy, now: DateTime<Utc>) -> Plan {
    plan_with(ledger, policy, &Backoff::default(), now)
}

/// The re-check right before a stop, on a ledger built from fresh claims and a fresh query: the
/// pod still passes every rule of [`judge`] and, with `--cull-when=demand`, a pending pod still
/// waits for it (a pending pod that went away, or now fits elsewhere, takes its reason with it).
pub fn still_a_stop(
    ledger: &Ledger,
    policy: &CullPolicy,
    now: DateTime<Utc>,
    pod_uid: &str,
) -> bool {
    let Some(row) = ledger.pods.iter().find(|p| p.evidence.uid == pod_uid) else {
        return false;
    };
    if judge(row, policy, now).is_err() {
        return false;
    }
    match policy.when {
        CullWhen::Idle => true,
        CullWhen::Demand => {
            let candidates = ledger
                .pods
                .iter()
                .filter(|p| p.state.holds() && judge(p, policy, now).is_ok())
                .map(|p| (p.namespace.as_str(), p.pod.as_str()))
                .collect();
            demand::needed(&ledger.reclaim, &candidates)
                .contains_key(&(row.namespace.clone(), row.pod.clone()))
        }
    }
}

/// [`plan`] with the notebooks backing off after failed stops (the culler's state): a held
/// candidate is skipped as [`SkipReason::Backoff`] and takes neither cap, so the next candidate
/// is chosen in its place.
pub fn plan_with(
    ledger: &Ledger,
    policy: &CullPolicy,
    backoff: &Backoff,
    now: DateTime<Utc>,
) -> Plan {
    let mut out = Plan {
        circuit: circuit(ledger, policy),
        ..Plan::default()
    };
    let mut candidates: Vec<&PodRow> = Vec::new();
    // Notebooks (namespace, uid) with a GPU-holding pod that is not a candidate.
    let mut not_all_idle: BTreeSet<(&str, &str)> = BTreeSet::new();
    let notice_on = policy.notice > Duration::zero();
    // Notebooks (namespace, uid) given a notice action this plan: one per notebook.
    let mut noticed: BTreeSet<(String, String)> = BTreeSet::new();
    for row in ledger.pods.iter().filter(|p| p.state.holds()) {
        match judge(row, policy, now) {
            Ok(()) => candidates.push(row),
            Err(reason) => {
                if let Some(owner) = policy.targets.owner(row) {
                    not_all_idle.insert((row.namespace.as_str(), owner.object.uid.as_str()));
                }
                if notice_on {
                    cancel_notice(row, reason, policy.targets, &mut noticed, &mut out.notices);
                }
                out.skips.push(skip(row, reason, policy.targets));
            }
        }
    }
    // A notebook is idle only when every pod of it is (a second idle pod of one notebook is
    // held back by the per-namespace cap below: one stop per notebook).
    candidates.retain(|row| {
        let busy_sibling = policy.targets.owner(row).is_some_and(|owner| {
            not_all_idle.contains(&(row.namespace.as_str(), owner.object.uid.as_str()))
        });
        if busy_sibling {
            if notice_on {
                let reason = SkipReason::NotebookPodBusy;
                cancel_notice(row, reason, policy.targets, &mut noticed, &mut out.notices);
            }
            out.skips
                .push(skip(row, SkipReason::NotebookPodBusy, policy.targets));
        }
        !busy_sibling
    });
    // Demand: only the candidates a pending pod waits for (the reclaim planner's answer).
    let wanted = match policy.when {
        CullWhen::Idle => None,
        CullWhen::Demand => {
            let ids = candidates
                .iter()
                .map(|r| (r.namespace.as_str(), r.pod.as_str()))
                .collect();
            Some(demand::needed(&ledger.reclaim, &ids))
        }
    };
    if let Some(wanted) = &wanted {
        candidates.retain(|row| {
            let needed = wanted.contains_key(&(row.namespace.clone(), row.pod.clone()));
            if !needed {
                // A notice given for a pod that no longer waits is taken back.
                if notice_on {
                    let reason = SkipReason::NoDemand;
                    cancel_notice(row, reason, policy.targets, &mut noticed, &mut out.notices);
                }
                out.skips
                    .push(skip(row, SkipReason::NoDemand, policy.targets));
            }
            needed
        });
    }
    out.candidates = candidates.len();
    candidates.sort_by(|a, b| {
        let idle = |r: &PodRow| r.idle_seconds.unwrap_or_default();
        idle(b).total_cmp(&idle(a)).then_with(|| {
            (&a.namespace, &a.notebook, &a.pod, &a.evidence.uid).cmp(&(
                &b.namespace,
                &b.notebook,
                &b.pod,
                &b.evidence.uid,
            ))
        })
    });
    let stop_value = now.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut per_namespace: BTreeMap<&str, usize> = BTreeMap::new();
    for row in candidates {
        let Some(OwnerObject {
            target, object: nb, ..
        }) = policy.targets.owner(row)
        else {
            continue;
        };
        // Notice first: a candidate without a current notice is given one (not while the
        // breaker doubts the evidence); one whose notice has not run out waits.
        let notice_reason = if notice_on {
            match current_notice(row, nb) {
                None if out.circuit.is_none() => {
                    if noticed.insert((row.namespace.clone(), nb.uid.clone())) {
                        out.notices.push(Notice::Schedule {
                            target,
                            namespace: row.namespace.clone(),
                            notebook: nb.name.clone(),
                            notebook_uid: nb.uid.clone(),
                            pod: row.pod.clone(),
                            stop_at: now + policy.notice,
                            idle_seconds: row.idle_seconds.unwrap_or_default(),
                            peak_utilization: row.evidence.peak,
                        });
                    }
                    Some(SkipReason::NoticePending)
                }
                Some(at) if at > now => Some(SkipReason::NoticePending),
                _ => None,
            }
        } else {
            None
        };
        let reason = if notice_reason.is_some() {
            notice_reason
        } else if out.circuit.is_some() {
            Some(SkipReason::CircuitOpen)
        } else if backoff.holds(target, &row.namespace, &nb.name, &nb.uid, now) {
            // Checked before the caps, so a notebook whose stops keep failing uses neither.
            Some(SkipReason::Backoff)
        } else if per_namespace.contains_key(row.namespace.as_str()) {
            Some(SkipReason::PerNamespaceCap)
        } else if out.actions.len() >= policy.max_per_cycle {
            Some(SkipReason::PerCycleCap)
        } else {
            None
        };
        if let Some(reason) = reason {
            out.skips.push(skip(row, reason, policy.targets));
            continue;
        }
        *per_namespace.entry(row.namespace.as_str()).or_default() += 1;
        out.actions.push(Action::Stop {
            target,
            namespace: row.namespace.clone(),
            notebook: nb.name.clone(),
            notebook_uid: nb.uid.clone(),
            resource_version: nb.resource_version.clone(),
            pod: row.pod.clone(),
            pod_uid: row.evidence.uid.clone(),
            idle_seconds: row.idle_seconds.unwrap_or_default(),
            peak_utilization: row.evidence.peak,
            stop_value: stop_value.clone(),
            for_pending: wanted
                .as_ref()
                .and_then(|w| w.get(&(row.namespace.clone(), row.pod.clone())).cloned()),
        });
    }
    out
}

/// Opens the circuit of a finished plan for a reason only the caller knows (e.g.
/// [`CircuitReason::ClaimsStale`]): every action becomes a [`SkipReason::CircuitOpen`] skip and
/// no notice is scheduled. A circuit that is already open keeps its reason.
pub fn open_circuit(plan: &mut Plan, reason: CircuitReason) {
    plan.circuit.get_or_insert(reason);
    // No new notice on doubtful evidence either; a cancel only takes a warning back.
    plan.notices.retain(|n| matches!(n, Notice::Cancel { .. }));
    for action in plan.actions.drain(..) {
        let Action::Stop {
            namespace,
            notebook,
            pod,
            ..
        } = action;
        plan.skips.push(Skip {
            namespace,
            pod,
            notebook: Some(notebook),
            reason: SkipReason::CircuitOpen,
            detail: None,
        });
    }
}

/// A notice cancelled by `reason` (activity, snooze, opt-out, no longer eligible), once per
/// notebook; other reasons keep it.
fn cancel_notice(
    row: &PodRow,
    reason: SkipReason,
    targets: Targets,
    noticed: &mut BTreeSet<(String, String)>,
    notices: &mut Vec<Notice>,
) {
    let (Some(why), Some(owner)) = (CancelReason::of(reason), targets.owner(row)) else {
        return;
    };
    let nb = owner.object;
    let Some(stop_at) = current_notice(row, nb) else {
        return;
    };
    if noticed.insert((row.namespace.clone(), nb.uid.clone())) {
        notices.push(Notice::Cancel {
            target: owner.target,
            namespace: row.namespace.clone(),
            notebook: nb.name.clone(),
            notebook_uid: nb.uid.clone(),
            pod: row.pod.clone(),
            stop_at,
            why,
            snooze_until: nb.snooze_until.filter(|_| why == CancelReason::Snoozed),
        });
    }
}

fn skip(row: &PodRow, reason: SkipReason, targets: Targets) -> Skip {
    let owner = targets.owner(row);
    let detail = match (reason, owner) {
        (SkipReason::RecentActivity, Some(owner)) => owner
            .object
            .last_activity
            .map(|at| activity_text(owner.target, at)),
        _ => None,
    };
    Skip {
        namespace: row.namespace.clone(),
        pod: row.pod.clone(),
        notebook: owner
            .map(|owner| owner.object.name.clone())
            .or_else(|| row.notebook.clone()),
        reason,
        detail,
    }
}

/// "recent activity at 2026-12-05T01:00:00Z (notebooks.kubeflow.org/last-activity)": the time
/// and where it was read, for the skip and the pre-write re-check.
pub fn activity_text(target: &dyn Target, at: DateTime<Utc>) -> String {
    format!(
        "recent activity at {} ({})",
        rfc3339(at),
        target.activity_source()
    )
}

#[cfg(test)]
mod tests;
