//! Leader election on a `coordination.k8s.io/v1` Lease, behind the [`Leadership`] trait.
//!
//! Every replica watches, joins and exports; only the lease holder acts. The elector renews every
//! `lease_duration / 3` with optimistic concurrency on `resourceVersion`; it publishes its claim
//! on a `tokio::sync::watch` channel and flips it to `false` at once when another holder shows up,
//! a write conflicts, or renewals keep failing past the renew deadline (2/3 of the lease
//! duration after the last successful renewal, so we stop acting before anyone may take over).
//! On shutdown [`LeaseElector::release`] clears `holderIdentity` so a successor need not wait.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::claims::project::to_chrono;

/// Whether this replica may act. Cheap, synchronous, and fakeable in tests.
pub trait Leadership: Send + Sync {
    fn is_leader(&self) -> bool;
    /// A receiver that sees every change of the claim.
    fn subscribe(&self) -> watch::Receiver<bool>;
}

/// Fixed (or test-controlled) leadership: a single replica, or a fake.
#[derive(Debug)]
pub struct StaticLeadership {
    tx: watch::Sender<bool>,
}

impl StaticLeadership {
    pub fn new(leader: bool) -> Self {
        StaticLeadership {
            tx: watch::Sender::new(leader),
        }
    }

    /// Flips the claim (tests).
    pub fn set(&self, leader: bool) {
        self.tx.send_replace(leader);
    }
}

impl Leadership for StaticLeadership {
    fn is_leader(&self) -> bool {
        *self.tx.borrow()
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
}

/// The view of an elector, handed to the culler.
#[derive(Debug, Clone)]
pub struct LeaseHandle {
    rx: watch::Receiver<bool>,
}

impl Leadership for LeaseHandle {
    fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}

/// Lease failures.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another writer changed or created the Lease first (HTTP 409).
    #[error("lease changed concurrently")]
    Conflict,
    #[error("lease api")]
    Api(#[source] kube::Error),
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
    /// Whether someone other than `identity` holds an unexpired claim at `now`.
    pub fn held_by_other(&self, identity: &str, now: DateTime<Utc>) -> bool {
        let Some(holder) = self.holder.as_deref().filter(|h| !h.is_empty()) else {
            return false;
        };
        if holder == identity {
            return false;
        }
        self.renew_time
            .or(self.acquire_time)
            .is_some_and(|t| t + Duration::seconds(i64::from(self.duration_seconds.max(1))) > now)
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
}

impl LeaseConfig {
    /// Renew (and retry) period: a third of the lease duration.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// Give up leadership when no renewal succeeded for this long.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
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

/// The election state machine over a [`LeaseStore`].
pub struct LeaseElector<S> {
    store: S,
    config: LeaseConfig,
    tx: watch::Sender<bool>,
    /// When our last write (create, take-over or renewal) succeeded, while we lead.
    last_renewed: Option<DateTime<Utc>>,
    record: Option<LeaseRecord>,
}

impl<S: LeaseStore> LeaseElector<S> {
    pub fn new(store: S, config: LeaseConfig) -> Self {
        LeaseElector {
            store,
            config,
            tx: watch::Sender::new(false),
            last_renewed: None,
            record: None,
        }
    }

    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            rx: self.tx.subscribe(),
        }
    }

    pub fn is_leader(&self) -> bool {
        *self.tx.borrow()
    }

    fn set_leader(&mut self, leader: bool, why: &'static str) {
        if !leader {
            self.last_renewed = None;
        }
        let before = self.tx.send_replace(leader);
        if before != leader {
            info!(identity = %self.config.identity, lease = %self.config.name, leader, why, "leadership changed");
        }
    }

    fn claim(&self, now: DateTime<Utc>, base: Option<&LeaseRecord>) -> LeaseRecord {
        let ours = base.is_some_and(|r| r.holder.as_deref() == Some(self.config.identity.as_str()));
        LeaseRecord {
            holder: Some(self.config.identity.clone()),
            acquire_time: if ours {
                base.and_then(|r| r.acquire_time)
            } else {
                Some(now)
            },
            renew_time: Some(now),
            duration_seconds: i32::try_from(self.config.duration.num_seconds())
                .unwrap_or(i32::MAX)
                .max(1),
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

    /// On an API failure: keep leading only until the renew deadline.
    fn on_error(&mut self, now: DateTime<Utc>, error: &LeaseError) {
        warn!(error = %error, lease = %self.config.name, "lease request failed");
        if self
            .last_renewed
            .is_some_and(|t| now - t > self.config.renew_deadline())
        {
            self.set_leader(false, "renew deadline passed");
        }
    }

    /// One election round at `now`: acquire, renew or follow. Returns whether we lead.
    pub async fn step(&mut self, now: DateTime<Utc>) -> bool {
        let current = match self.store.get().await {
            Ok(c) => c,
            Err(e) => {
                self.on_error(now, &e);
                return self.is_leader();
            }
        };
        if let Some(rec) = &current
            && rec.held_by_other(&self.config.identity, now)
        {
            self.record = current;
            self.set_leader(false, "held by another replica");
            return false;
        }
        let claim = self.claim(now, current.as_ref());
        let result = match &current {
            None => self.store.create(claim).await,
            Some(_) => self.store.replace(claim).await,
        };
        match result {
            Ok(rec) => {
                self.record = Some(rec);
                self.last_renewed = Some(now);
                self.set_leader(true, "lease acquired or renewed");
            }
            Err(LeaseError::Conflict) => self.set_leader(false, "lease changed concurrently"),
            Err(e) => self.on_error(now, &e),
        }
        self.is_leader()
    }

    /// Vacates the lease if we hold it, so a successor need not wait for expiry.
    pub async fn release(&mut self, now: DateTime<Utc>) {
        let was_leader = self.is_leader();
        self.set_leader(false, "released");
        if !was_leader {
            return;
        }
        let current = match self.store.get().await {
            Ok(Some(rec)) if rec.holder.as_deref() == Some(self.config.identity.as_str()) => rec,
            Ok(_) => return,
            Err(e) => {
                warn!(error = %e, "cannot read the lease to release it");
                return;
            }
        };
        let released = LeaseRecord {
            holder: None,
            renew_time: Some(now),
            duration_seconds: 1,
            ..current
        };
        if let Err(e) = self.store.replace(released).await {
            warn!(error = %e, "cannot release the lease");
        }
    }

    /// Runs rounds every `renew_every` until `cancel`, then releases the lease.
    pub async fn run(mut self, cancel: CancellationToken) {
        let every = self
            .config
            .renew_every()
            .to_std()
            .unwrap_or(std::time::Duration::from_secs(5));
        loop {
            self.step(Utc::now()).await;
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
        }
        self.release(Utc::now()).await;
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

/// Starts the election on the API; the returned handle is what the culler reads.
pub fn spawn(
    client: kube::Client,
    config: LeaseConfig,
    tracker: &tokio_util::task::TaskTracker,
    cancel: CancellationToken,
) -> Arc<dyn Leadership> {
    let store = KubeLeaseStore::new(client, &config.namespace, &config.name);
    let elector = LeaseElector::new(store, config);
    let handle = elector.handle();
    tracker.spawn(elector.run(cancel));
    Arc::new(handle)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use chrono::TimeZone;

    use super::*;

    /// An in-memory Lease with a resourceVersion counter and injectable failures.
    #[derive(Default)]
    struct FakeStore {
        lease: Mutex<Option<LeaseRecord>>,
        rv: Mutex<u64>,
        fail: Mutex<bool>,
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

        fn failing(&self) -> Result<(), LeaseError> {
            if *self.fail.lock().expect("lock") {
                Err(LeaseError::Api(
                    kube::Error::LinesCodecMaxLineLengthExceeded,
                ))
            } else {
                Ok(())
            }
        }
    }

    impl LeaseStore for Arc<FakeStore> {
        fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>> {
            Box::pin(async move {
                self.failing()?;
                Ok(self.current())
            })
        }

        fn create(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
            Box::pin(async move {
                self.failing()?;
                if self.current().is_some() {
                    return Err(LeaseError::Conflict);
                }
                Ok(self.put(record))
            })
        }

        fn replace(&self, record: LeaseRecord) -> BoxFuture<'_, Result<LeaseRecord, LeaseError>> {
            Box::pin(async move {
                self.failing()?;
                if self.current().map(|c| c.resource_version)
                    != Some(record.resource_version.clone())
                {
                    return Err(LeaseError::Conflict);
                }
                Ok(self.put(record))
            })
        }
    }

    fn t(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 31, 12, 0, 0)
            .single()
            .expect("time")
            + Duration::seconds(s)
    }

    fn elector(store: &Arc<FakeStore>, id: &str) -> LeaseElector<Arc<FakeStore>> {
        LeaseElector::new(
            store.clone(),
            LeaseConfig {
                name: "gpu-ledger".into(),
                namespace: "ns".into(),
                identity: id.into(),
                duration: Duration::seconds(15),
            },
        )
    }

    #[tokio::test]
    async fn first_replica_acquires_and_second_follows() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut b = elector(&store, "b");
        let handle = a.handle();
        assert!(!handle.is_leader());
        assert!(a.step(t(0)).await);
        assert!(handle.is_leader());
        assert!(!b.step(t(1)).await);
        assert!(a.step(t(5)).await, "renewal keeps the lease");
        assert!(!b.step(t(19)).await, "renewed at 5: valid until 20");
        let rec = store.current().expect("lease");
        assert_eq!(rec.holder.as_deref(), Some("a"));
        assert_eq!(rec.transitions, 0);
        assert_eq!(rec.acquire_time, Some(t(0)));
        assert_eq!(rec.renew_time, Some(t(5)));
    }

    #[tokio::test]
    async fn expired_lease_is_taken_over_and_old_holder_steps_down() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut b = elector(&store, "b");
        assert!(a.step(t(0)).await);
        assert!(
            b.step(t(16)).await,
            "a did not renew for longer than the lease"
        );
        assert_eq!(store.current().expect("lease").transitions, 1);
        assert!(
            !a.step(t(17)).await,
            "a sees another holder and steps down at once"
        );
        assert!(!a.is_leader());
    }

    #[tokio::test]
    async fn failing_renewals_lose_leadership_at_the_deadline() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut rx = a.handle().subscribe();
        assert!(a.step(t(0)).await);
        assert!(rx.has_changed().expect("open"));
        rx.mark_unchanged();
        *store.fail.lock().expect("lock") = true;
        assert!(a.step(t(5)).await, "within the renew deadline (10 s)");
        assert!(a.step(t(10)).await, "deadline is inclusive");
        assert!(!a.step(t(11)).await, "past the deadline");
        assert!(rx.has_changed().expect("open"));
        assert!(!*rx.borrow_and_update());
        *store.fail.lock().expect("lock") = false;
        assert!(
            a.step(t(12)).await,
            "our own (unexpired) lease is renewed again"
        );
    }

    #[tokio::test]
    async fn concurrent_write_flips_leadership_off() {
        // Someone else bumps the resourceVersion between our get and replace: simulate by a
        // store whose replace always conflicts.
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
        let mut a = elector(&store, "a");
        assert!(a.step(t(0)).await);
        let mut c = LeaseElector {
            store: Conflicting(store.clone()),
            config: a.config.clone(),
            tx: a.tx.clone(),
            last_renewed: Some(t(0)),
            record: None,
        };
        assert!(!c.step(t(5)).await);
        assert!(!a.is_leader(), "the shared channel flipped");
    }

    #[tokio::test]
    async fn release_clears_holder_so_successor_acquires_at_once() {
        let store = Arc::new(FakeStore::default());
        let mut a = elector(&store, "a");
        let mut b = elector(&store, "b");
        assert!(a.step(t(0)).await);
        a.release(t(1)).await;
        assert!(!a.is_leader());
        assert_eq!(store.current().expect("lease").holder, None);
        assert!(b.step(t(2)).await, "no need to wait for expiry");
        // Releasing as a follower does not touch the lease.
        a.release(t(3)).await;
        assert_eq!(store.current().expect("lease").holder.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn run_stops_and_releases_on_cancel() {
        let store = Arc::new(FakeStore::default());
        let a = elector(&store, "a");
        let handle = a.handle();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(a.run(cancel.clone()));
        let mut rx = handle.subscribe();
        tokio::time::timeout(std::time::Duration::from_secs(5), rx.wait_for(|l| *l))
            .await
            .expect("acquired")
            .expect("open");
        cancel.cancel();
        task.await.expect("joined");
        assert!(!handle.is_leader());
        assert_eq!(store.current().expect("lease").holder, None);
    }

    #[test]
    fn static_leadership_is_settable() {
        let l = StaticLeadership::new(false);
        assert!(!l.is_leader());
        l.set(true);
        assert!(l.is_leader());
        assert!(*l.subscribe().borrow());
    }
}
