//! Leader election on a `coordination.k8s.io/v1` Lease, behind the [`Leadership`] trait.
//!
//! Every replica watches, plans and exports; only the lease holder acts. The rules that keep two
//! replicas from ever acting at once:
//!
//! * **Our claim is a deadline on the local monotonic clock** (`tokio::time::Instant`): the
//!   instant the winning create/renew request was *sent* plus the renew deadline (2/3 of the lease
//!   duration). [`Leadership::is_leader`] compares it with the monotonic clock at the moment of
//!   asking, so a hung, failing or dead elector loses leadership on time by itself, and the
//!   actuator asks again right before every write.
//! * **Another replica's claim expires `leaseDurationSeconds` after we observed its Lease
//!   change** (a new `resourceVersion`), measured on our monotonic clock. Its `renewTime` is never
//!   compared with our clock, so a replica whose wall clock runs ahead cannot take a live Lease.
//!   The wall clock is only written (`acquireTime`, `renewTime`), for people reading the Lease.
//! * **Every Lease call is bounded** by [`API_TIMEOUT`]; a write that fails, times out or
//!   conflicts never extends the claim. A conflict (someone else wrote first) drops it at once.
//! * **A write started while we lead lands before anyone may take over**: it starts before
//!   `sent + renew_deadline`, takes at most [`API_TIMEOUT`], and
//!   `renew_deadline + API_TIMEOUT < lease duration` ([`LeaseConfig::validate`]), while a
//!   successor waits the full lease duration from when it first saw our last renewal (which was
//!   applied after we sent it).
//!
//! On shutdown [`LeaseElector::release`] clears `holderIdentity` so a successor need not wait.
//!
//! Why not the `kube-lease-manager` crate (0.13, which supports kube 5): it takes a Lease as
//! expired when the holder's `renewTime + leaseDurationSeconds` is past the local *wall* clock
//! (`SystemTime::now()`) — exactly the clock comparison that lets a replica with a skewed clock take
//! a live Lease — and keeps its own claim on `SystemTime` too, so neither guarantee above holds.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use prometheus::IntCounterVec;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::k8s::to_chrono;

/// Bound of every culling API call (Lease GET/PUT, kill switch, target GET/PATCH, Event POST,
/// namespace list). It must stay below `lease duration − renew deadline` (5 s for the default
/// 15 s Lease) so that a write a leader starts lands before a successor may take over.
pub const API_TIMEOUT: StdDuration = StdDuration::from_secs(4);

/// Whether this replica may act right now. Cheap, synchronous, and fakeable in tests.
pub trait Leadership: Send + Sync {
    /// Until when (on the local monotonic clock) this replica's claim holds; `None` when it holds
    /// none.
    fn valid_until(&self) -> Option<Instant>;

    /// Whether the claim holds at this instant. Ask right before acting, never cache it.
    fn is_leader(&self) -> bool {
        self.valid_until().is_some_and(|t| Instant::now() < t)
    }
}

/// Fixed (or test-controlled) leadership: a single replica, or a fake.
#[derive(Debug)]
pub struct StaticLeadership {
    leader: std::sync::atomic::AtomicBool,
}

impl StaticLeadership {
    pub fn new(leader: bool) -> Self {
        StaticLeadership {
            leader: std::sync::atomic::AtomicBool::new(leader),
        }
    }

    /// Flips the claim (tests).
    pub fn set(&self, leader: bool) {
        self.leader
            .store(leader, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Leadership for StaticLeadership {
    fn valid_until(&self) -> Option<Instant> {
        // A claim that never runs out: a day ahead, whenever asked.
        self.leader
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| Instant::now() + StdDuration::from_secs(86_400))
    }
}

/// The view of an elector, handed to the culler. Once the elector is gone (its task ended or
/// panicked) the handle reports no claim.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    rx: watch::Receiver<Option<Instant>>,
}

impl Leadership for LeaseHandle {
    fn valid_until(&self) -> Option<Instant> {
        if self.rx.has_changed().is_err() {
            return None;
        }
        *self.rx.borrow()
    }
}

/// Lease failures.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another writer changed or created the Lease first (HTTP 409).
    #[error("lease changed concurrently")]
    Conflict,
    #[error("lease {0} timed out after {API_TIMEOUT:?}")]
    Timeout(&'static str),
    #[error("lease api")]
    Api(#[source] kube::Error),
}

impl LeaseError {
    /// Every value of [`LeaseError::reason`].
    pub const REASONS: [&'static str; 3] = ["conflict", "timeout", "error"];

    /// The `reason` label of `gpu_ledger_cull_lease_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Conflict => "conflict",
            Self::Timeout(_) => "timeout",
            Self::Api(_) => "error",
        }
    }
}

/// The fields of a Lease the election reads and writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseRecord {
    pub holder: Option<String>,
    pub acquire_time: Option<DateTime<Utc>>,
    pub renew_time: Option<DateTime<Utc>>,
    pub duration_seconds: i32,
    pub transitions: i32,
    /// Precondition for writes; empty on create.
    pub resource_version: String,
}

impl LeaseRecord {
    /// The holder, when one is named.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// Storage of one Lease object (the API, or a fake in tests).
pub trait LeaseStore: Send + Sync {
    fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>>;
    /// Creates the Lease; [`LeaseError::Conflict`] when it already exists.
    fn create(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>>;
    /// Replaces the Lease with `record.resource_version` as precondition.
    fn replace(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>>;
}

/// Settings of the election.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    /// Lease object name (`--lease-name`).
    pub name: String,
    /// Lease namespace (`--lease-namespace`, default: the pod's namespace).
    pub namespace: String,
    /// Our identity: env `POD_NAME`, else the hostname.
    pub identity: String,
    /// How long a claim lasts without renewal (default 15 s).
    pub duration: Duration,
    /// Added to the wall clock when writing `acquireTime`/`renewTime`: zero, except under the
    /// test hook that simulates a skewed clock (`GPU_LEDGER_TEST_LEASE_CLOCK_OFFSET`, debug
    /// builds). The election itself never reads the wall clock.
    pub wall_clock_offset: Duration,
}

impl LeaseConfig {
    /// Renew (and retry) period: a third of the lease duration.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// How long a successful renewal keeps us leading: 2/3 of the lease duration, counted from
    /// when the renewal was sent.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// The lease must leave room for one bounded write after the renew deadline.
    pub fn validate(&self) -> Result<(), String> {
        let margin = (self.duration - self.renew_deadline())
            .to_std()
            .unwrap_or_default();
        if margin <= API_TIMEOUT {
            return Err(format!(
                "lease duration {}s leaves {margin:?} after the renew deadline; more than the \
                 {API_TIMEOUT:?} write timeout is needed",
                self.duration.num_seconds()
            ));
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.num_seconds())
            .unwrap_or(i32::MAX)
            .max(1)
    }
}

/// Identity of this replica: `POD_NAME`, else `HOSTNAME`, else the kernel hostname.
pub fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "gpu-ledger".to_string())
}

/// A version of the Lease and when (monotonic) we first saw it.
#[derive(Debug, Clone)]
struct Observed {
    record: LeaseRecord,
    since: Instant,
}

/// The election state machine over a [`LeaseStore`].
pub struct LeaseElector<S> {
    store: S,
    config: LeaseConfig,
    /// Our claim's deadline (monotonic), shared with every [`LeaseHandle`].
    claim: watch::Sender<Option<Instant>>,
    observed: Option<Observed>,
    /// `gpu_ledger_cull_lease_errors_total{reason}`, when registered.
    errors: Option<IntCounterVec>,
}

impl<S: LeaseStore> LeaseElector<S> {
    pub fn new(store: S, config: LeaseConfig) -> Self {
        LeaseElector {
            store,
            config,
            claim: watch::Sender::new(None),
            observed: None,
            errors: None,
        }
    }

    /// Counts failed Lease calls on `errors` (label `reason`: timeout, error, conflict).
    #[must_use]
    pub fn with_error_counter(mut self, errors: IntCounterVec) -> Self {
        self.errors = Some(errors);
        self
    }

    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            rx: self.claim.subscribe(),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.claim.borrow().is_some_and(|t| Instant::now() < t)
    }

    /// Our claim's deadline, if we hold one (it may already have passed).
    fn deadline(&self) -> Option<Instant> {
        *self.claim.borrow()
    }

    fn grant(&self, until: Instant) {
        let before = self.claim.send_replace(Some(until));
        if before.is_none_or(|t| Instant::now() >= t) {
            info!(identity = %self.config.identity, lease = %self.config.name, leader = true, "leadership changed: lease acquired");
        }
    }

    fn drop_claim(&self, why: &'static str) {
        let before = self.claim.send_replace(None);
        if before.is_some_and(|t| Instant::now() < t) {
            info!(identity = %self.config.identity, lease = %self.config.name, leader = false, why, "leadership changed");
        }
    }

    /// Drops a claim whose deadline has passed (it already reads as "not leader"; this makes the
    /// log say so). Returns whether we lead.
    fn expire_if_due(&self) -> bool {
        if let Some(t) = self.deadline()
            && Instant::now() >= t
        {
            self.claim.send_replace(None);
            warn!(identity = %self.config.identity, lease = %self.config.name, leader = false, "leadership changed: renew deadline passed without a successful renewal");
        }
        self.is_leader()
    }

    /// Runs one Lease call within [`API_TIMEOUT`], counting failures.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: BoxFuture<'_, Result<T, LeaseError>>,
    ) -> Result<T, LeaseError> {
        let result = match tokio::time::timeout(API_TIMEOUT, call).await {
            Ok(r) => r,
            Err(_) => Err(LeaseError::Timeout(operation)),
        };
        if let Err(e) = &result {
            if let Some(errors) = &self.errors {
                errors.with_label_values(&[e.reason()]).inc();
            }
            if !matches!(e, LeaseError::Conflict) {
                warn!(error = e as &dyn std::error::Error, operation, lease = %self.config.name, "lease request failed");
            }
        }
        result
    }

    /// Remembers `current` and, when its version is new to us, the instant we first saw it.
    fn observe(&mut self, current: Option<&LeaseRecord>, at: Instant) {
        let Some(current) = current else {
            self.observed = None;
            return;
        };
        let unchanged = self.observed.as_ref().is_some_and(|o| {
            !current.resource_version.is_empty()
                && o.record.resource_version == current.resource_version
        });
        if !unchanged {
            self.observed = Some(Observed {
                record: current.clone(),
                since: at,
            });
        }
    }

    /// Whether another replica's claim is live at `now`: the Lease names another holder and has
    /// not changed for less than its duration, by our monotonic clock since we saw it change.
    fn held_by_other(&self, now: Instant) -> bool {
        let Some(o) = &self.observed else {
            return false;
        };
        let Some(holder) = o.record.holder() else {
            return false;
        };
        if holder == self.config.identity {
            return false;
        }
        let secs = u64::try_from(o.record.duration_seconds.max(1)).unwrap_or(1);
        now < o.since + StdDuration::from_secs(secs)
    }

    fn claim_record(&self, base: Option<&LeaseRecord>) -> LeaseRecord {
        let wall = Utc::now() + self.config.wall_clock_offset;
        let ours = base.and_then(LeaseRecord::holder) == Some(self.config.identity.as_str());
        LeaseRecord {
            holder: Some(self.config.identity.clone()),
            acquire_time: if ours {
                base.and_then(|r| r.acquire_time)
            } else {
                Some(wall)
            },
            renew_time: Some(wall),
            duration_seconds: self.config.lease_duration_seconds(),
            transitions: base.map_or(0, |r| {
                if ours {
                    r.transitions
                } else {
                    r.transitions.saturating_add(1)
                }
            }),
            resource_version: base.map(|r| r.resource_version.clone()).unwrap_or_default(),
        }
    }

    /// One election round: read the Lease, then acquire, renew or follow. Returns whether we
    /// lead. Takes at most two [`API_TIMEOUT`]s.
    pub async fn step(&mut self) -> bool {
        // On a failed read our claim (if any) runs out at its own deadline; nothing is extended.
        let Ok(current) = self.bounded("get", self.store.get()).await else {
            return self.expire_if_due();
        };
        self.observe(current.as_ref(), Instant::now());
        if self.held_by_other(Instant::now()) {
            self.drop_claim("held by another replica");
            return false;
        }
        let claim = self.claim_record(current.as_ref());
        let sent = Instant::now();
        let result = match &current {
            None => self.bounded("create", self.store.create(claim)).await,
            Some(_) => self.bounded("replace", self.store.replace(claim)).await,
        };
        match result {
            Ok(rec) => {
                self.observed = Some(Observed {
                    record: rec,
                    since: Instant::now(),
                });
                let keep = self.config.renew_deadline().to_std().unwrap_or_default();
                self.grant(sent + keep);
            }
            Err(LeaseError::Conflict) => self.drop_claim("lease changed concurrently"),
            Err(_) => {}
        }
        self.expire_if_due()
    }

    /// Gives up the claim and vacates the Lease if it still names us, so a successor need not
    /// wait for expiry.
    pub async fn release(&mut self) {
        self.drop_claim("released");
        let current = match self.bounded("get", self.store.get()).await {
            Ok(Some(rec)) if rec.holder() == Some(self.config.identity.as_str()) => rec,
            _ => return,
        };
        let released = LeaseRecord {
            holder: None,
            renew_time: Some(Utc::now() + self.config.wall_clock_offset),
            duration_seconds: 1,
            ..current
        };
        if self
            .bounded("release", self.store.replace(released))
            .await
            .is_ok()
        {
            info!(identity = %self.config.identity, lease = %self.config.name, "lease released");
        }
    }

    /// Runs rounds every `renew_every` until `cancel`, then releases the Lease. Between rounds
    /// it also wakes at the claim's deadline, so a lost claim is logged when it is lost.
    pub async fn run(mut self, cancel: CancellationToken) {
        let every = self
            .config
            .renew_every()
            .to_std()
            .unwrap_or(StdDuration::from_secs(5));
        'rounds: loop {
            tokio::select! {
                () = cancel.cancelled() => break 'rounds,
                _ = self.step() => {}
            }
            crate::test_hooks::panic_point("lease");
            let next = Instant::now() + every;
            loop {
                let wake = self.deadline().filter(|d| *d < next).unwrap_or(next);
                tokio::select! {
                    () = cancel.cancelled() => break 'rounds,
                    () = tokio::time::sleep_until(wake) => {}
                }
                self.expire_if_due();
                if Instant::now() >= next {
                    break;
                }
            }
        }
        self.release().await;
    }
}

// === impl KubeLeaseStore ===

/// The Lease in the API server.
#[derive(Clone)]
pub struct KubeLeaseStore {
    api: Api<Lease>,
    name: String,
}

impl KubeLeaseStore {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        KubeLeaseStore {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    fn to_lease(&self, r: &LeaseRecord) -> Lease {
        let micro = |t: Option<DateTime<Utc>>| t.and_then(to_jiff).map(MicroTime);
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: Some(r.resource_version.clone()).filter(|v| !v.is_empty()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: r.holder.clone(),
                acquire_time: micro(r.acquire_time),
                renew_time: micro(r.renew_time),
                lease_duration_seconds: Some(r.duration_seconds),
                lease_transitions: Some(r.transitions),
                ..LeaseSpec::default()
            }),
        }
    }
}

fn to_jiff(t: DateTime<Utc>) -> Option<k8s_openapi::jiff::Timestamp> {
    k8s_openapi::jiff::Timestamp::new(
        t.timestamp(),
        i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    )
    .ok()
}

fn from_lease(l: &Lease) -> LeaseRecord {
    let spec = l.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        acquire_time: spec.acquire_time.map(|t| to_chrono(t.0)),
        renew_time: spec.renew_time.map(|t| to_chrono(t.0)),
        duration_seconds: spec.lease_duration_seconds.unwrap_or(1),
        transitions: spec.lease_transitions.unwrap_or(0),
        resource_version: l.metadata.resource_version.clone().unwrap_or_default(),
    }
}

fn map_err(e: kube::Error) -> LeaseError {
    match &e {
        kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() => LeaseError::Conflict,
        _ => LeaseError::Api(e),
    }
}

impl LeaseStore for KubeLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>> {
        Box::pin(async move {
            self.api
                .get_opt(&self.name)
                .await
                .map(|l| l.as_ref().map(from_lease))
                .map_err(map_err)
        })
    }

    fn create(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
        Box::pin(async move {
            let lease = self.to_lease(&LeaseRecord {
                resource_version: String::new(),
                ..record
            });
            self.api
                .create(&PostParams::default(), &lease)
                .await
                .map(|l| from_lease(&l))
                .map_err(map_err)
        })
    }

    fn replace(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
        Box::pin(async move {
            let lease = self.to_lease(&record);
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
                .map(|l| from_lease(&l))
                .map_err(map_err)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use prometheus::Opts;

    use super::*;

    /// An in-memory Lease with a resourceVersion counter and injectable failures and hangs.
    #[derive(Default)]
    struct FakeStore {
        lease: Mutex<Option<LeaseRecord>>,
        rv: Mutex<u64>,
        fail: AtomicBool,
        hang: AtomicBool,
    }

    impl FakeStore {
        fn put(&self, mut r: LeaseRecord) -> LeaseRecord {
            let mut rv = self.rv.lock().expect("lock");
            *rv += 1;
            r.resource_version = rv.to_string();
            *self.lease.lock().expect("lock") = Some(r.clone());
            r
        }

        fn current(&self) -> Option<LeaseRecord> {
            self.lease.lock().expect("lock").clone()
        }

        async fn fault(&self) -> Result<(), LeaseError> {
            if self.hang.load(Ordering::Relaxed) {
                futures::future::pending::<()>().await;
            }
            if self.fail.load(Ordering::Relaxed) {
                return Err(LeaseError::Api(
                    kube::Error::LinesCodecMaxLineLengthExceeded,
                ));
            }
            Ok(())
        }
    }

    impl LeaseStore for Arc<FakeStore> {
        fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>> {
            Box::pin(async move {
                self.fault().await?;
                Ok(self.current())
            })
        }

        fn create(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
            Box::pin(async move {
                self.fault().await?;
                if self.current().is_some() {
                    return Err(LeaseError::Conflict);
                }
                Ok(self.put(record))
            })
        }

        fn replace(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
            Box::pin(async move {
                self.fault().await?;
                if self.current().map(|c| c.resource_version)
                    != Some(record.resource_version.clone())
                {
                    return Err(LeaseError::Conflict);
                }
                Ok(self.put(record))
            })
        }
    }

    fn config(id: &str) -> LeaseConfig {
        LeaseConfig {
            name: "gpu-ledger".into(),
            namespace: "ns".into(),
            identity: id.into(),
            duration: Duration::seconds(15),
            wall_clock_offset: Duration::zero(),
        }
    }

    fn elector(store: &Arc<FakeStore>, id: &str) -> LeaseElector<Arc<FakeStore>> {
        LeaseElector::new(store.clone(), config(id))
    }

    async fn advance(secs: f64) {
        tokio::time::advance(StdDuration::from_secs_f64(secs)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn first_replica_acquires_and_a_renewing_holder_is_never_taken_over() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut b = elector(&store, "b");
        let handle = a.handle();
        assert!(!handle.is_leader());
        assert!(a.step().await);
        assert!(handle.is_leader());
        assert!(!b.step().await);
        for _ in 0..10 {
            advance(5.0).await;
            assert!(a.step().await, "renewal keeps the lease");
            assert!(!b.step().await, "a renews every 5 s: never expired for b");
        }
        let rec = store.current().expect("lease");
        assert_eq!(rec.holder(), Some("a"));
        assert_eq!(rec.transitions, 0);
        assert!(rec.renew_time > rec.acquire_time, "renewTime moves on");
    }

    #[tokio::test(start_paused = true)]
    async fn takeover_waits_a_full_duration_from_the_last_observed_change() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut b = elector(&store, "b");
        assert!(a.step().await);
        assert!(!b.step().await, "b first sees a's lease now");
        advance(10.0).await;
        assert!(a.step().await, "a renews once more, then goes silent");
        assert!(!b.step().await, "b sees the renewal at 10 s");
        advance(5.0).await;
        assert!(
            !b.step().await,
            "15 s since b first saw the lease, but only 5 s since it saw it change"
        );
        advance(9.9).await;
        assert!(!b.step().await, "14.9 s since the last change");
        advance(0.2).await;
        assert!(b.step().await, "15.1 s without a change: expired");
        assert_eq!(store.current().expect("lease").transitions, 1);
        assert!(!a.step().await, "a sees another holder and follows");
    }

    #[tokio::test(start_paused = true)]
    async fn another_holders_renew_time_is_never_compared_with_our_clock() {
        let store = Arc::new(FakeStore::default());
        // A live holder whose clock is an hour behind ours: by wall time its Lease expired long
        // ago. It must still be respected for a full duration after we see it.
        store.put(LeaseRecord {
            holder: Some("a".into()),
            acquire_time: Some(Utc::now() - Duration::hours(1)),
            renew_time: Some(Utc::now() - Duration::hours(1)),
            duration_seconds: 15,
            ..LeaseRecord::default()
        });
        // And we run 30 s ahead, which only changes what we write.
        let mut b = LeaseElector::new(
            store.clone(),
            LeaseConfig {
                wall_clock_offset: Duration::seconds(30),
                ..config("b")
            },
        );
        assert!(!b.step().await);
        advance(14.9).await;
        assert!(!b.step().await);
        advance(0.2).await;
        assert!(
            b.step().await,
            "unchanged for 15.1 s by our monotonic clock"
        );
        let rec = store.current().expect("lease");
        let written = rec.renew_time.expect("renew time");
        assert!(
            written - Utc::now() > Duration::seconds(25),
            "the offset shows in what we write: {written}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failing_renewals_lose_leadership_at_the_renew_deadline_without_any_step() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let handle = a.handle();
        assert!(a.step().await);
        store.fail.store(true, Ordering::Relaxed);
        advance(5.0).await;
        assert!(a.step().await, "within the renew deadline (10 s)");
        advance(4.9).await;
        assert!(handle.is_leader(), "9.9 s after the last renewal was sent");
        advance(0.2).await;
        assert!(
            !handle.is_leader(),
            "past the deadline: the handle says so without the elector running"
        );
        assert!(!a.step().await);
        store.fail.store(false, Ordering::Relaxed);
        assert!(a.step().await, "our own, unexpired Lease is renewed again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_times_out_and_never_extends_the_claim() {
        let store = Arc::new(FakeStore::default());
        let errors = IntCounterVec::new(Opts::new("e", "e"), &["reason"]).expect("counter");
        let mut a = elector(&store, "a").with_error_counter(errors.clone());
        let handle = a.handle();
        assert!(a.step().await);
        store.hang.store(true, Ordering::Relaxed);
        advance(5.0).await;
        let started = Instant::now();
        assert!(
            a.step().await,
            "the GET times out at 9 s: still within 10 s"
        );
        assert_eq!(started.elapsed(), API_TIMEOUT, "bounded by the API timeout");
        assert!(
            !a.step().await,
            "the next GET times out at 13 s: the claim ran out at 10 s"
        );
        assert!(!handle.is_leader());
        assert_eq!(errors.with_label_values(&["timeout"]).get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_drops_leadership_at_once() {
        struct Conflicting(Arc<FakeStore>);
        impl LeaseStore for Conflicting {
            fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>> {
                self.0.get()
            }
            fn create(&self, r: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
                self.0.create(r)
            }
            fn replace(&self, _r: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
                Box::pin(async { Err(LeaseError::Conflict) })
            }
        }
        let store = Arc::new(FakeStore::default());
        let mut a = LeaseElector::new(Conflicting(store.clone()), config("a"));
        let handle = a.handle();
        assert!(a.step().await, "created");
        advance(5.0).await;
        assert!(!a.step().await, "the renewal conflicted");
        assert!(!handle.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn release_clears_holder_so_a_successor_acquires_at_once() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut b = elector(&store, "b");
        assert!(a.step().await);
        assert!(!b.step().await);
        a.release().await;
        assert!(!a.is_leader());
        assert_eq!(store.current().expect("lease").holder(), None);
        assert!(b.step().await, "no need to wait for expiry");
        // Releasing as a follower does not touch the lease.
        a.release().await;
        assert_eq!(store.current().expect("lease").holder(), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn run_leads_until_cancelled_then_releases() {
        let store = Arc::new(FakeStore::default());
        let a = elector(&store, "a");
        let handle = a.handle();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(a.run(cancel.clone()));
        for _ in 0..100 {
            if handle.is_leader() {
                break;
            }
            tokio::time::sleep(StdDuration::from_millis(100)).await;
        }
        assert!(handle.is_leader(), "acquired");
        // Many rounds later it still leads: renewals keep the claim alive.
        tokio::time::sleep(StdDuration::from_secs(60)).await;
        assert!(handle.is_leader(), "still leading after a minute of rounds");
        cancel.cancel();
        task.await.expect("joined");
        assert!(!handle.is_leader());
        assert_eq!(store.current().expect("lease").holder(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handle_whose_elector_is_gone_reports_no_claim() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let handle = a.handle();
        assert!(a.step().await);
        assert!(handle.is_leader());
        drop(a);
        assert!(!handle.is_leader(), "a dead elector leads nobody");
    }

    #[test]
    fn the_lease_leaves_room_for_one_bounded_write() {
        assert!(config("a").validate().is_ok());
        let short = LeaseConfig {
            duration: Duration::seconds(12),
            ..config("a")
        };
        assert!(
            short.validate().is_err(),
            "4 s margin is not above the 4 s timeout"
        );
    }

    #[test]
    fn static_leadership_is_settable() {
        let l = StaticLeadership::new(false);
        assert!(!l.is_leader());
        l.set(true);
        assert!(l.is_leader());
    }
}
