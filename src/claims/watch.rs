//! Live claims: watches (kube-runtime `watcher`, no polling) projected into concurrent stores.
//!
//! Each watch keeps only the small projection of each object (non-GPU pods are not stored at
//! all). A relist (watch restart, 410 Gone) buffers keys and prunes what the new list no longer
//! holds, so the stores never show ghosts or duplicates.
//!
//! Each watch also keeps its health ([`WatchHealth`]): a watch whose stream keeps failing (for
//! example 403 after the initial list) leaves its store frozen, and [`Stores::broken`] names it
//! once it has been failing past a bound, so `serve` can report the source down, fail
//! readiness and hold culling back.

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::discovery::ApiResource;
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::kinds::{self, Scope, Source, Visit, Watched};
use super::{dra, kueue, project};
use crate::k8s;
use crate::ledger::claims::{Claims, DaemonPod, StatefulSetInfo};
use crate::ledger::kueue::DeviceClassMapping;
use crate::ledger::units::ResourceNames;
use crate::spawn::Spawn;

/// Bound of one API call made besides the watches (notebook discovery, a StatefulSet GET).
pub const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest quiet gap between two errors of one failing watch: kube-runtime's default backoff
/// waits at most 60 s between attempts (30 s plus up to 100 % jitter), and an attempt itself is
/// bounded by the client's connect timeout. A watch that has not failed for longer than this has
/// reconnected (a successful re-watch emits nothing until an object changes).
pub const MAX_ERROR_GAP: Duration = Duration::from_secs(90);

/// Errors setting up watches.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("discovering {what}")]
    Discovery {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("discovering {what} timed out after {API_TIMEOUT:?}")]
    DiscoveryTimeout { what: &'static str },
    #[error("reading statefulset {namespace}/{name}")]
    StatefulSet {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading statefulset {namespace}/{name} timed out after {API_TIMEOUT:?}")]
    StatefulSetTimeout { namespace: String, name: String },
}

/// Called with the resource name whenever a watch stream restarts after an error.
pub type RestartHook = Arc<dyn Fn(&'static str) + Send + Sync>;

/// The error history of one watch stream, on the monotonic clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchHealth {
    /// First error of the current run of errors (no event, and no quiet gap, since).
    pub failing_since: Option<Instant>,
    pub last_error: Option<Instant>,
}

impl WatchHealth {
    /// An event arrived: the stream works.
    pub fn on_event(&mut self) {
        self.failing_since = None;
    }

    /// The stream failed at `now`. A run of errors continues while errors follow each other
    /// within [`MAX_ERROR_GAP`].
    pub fn on_error(&mut self, now: Instant) {
        let continues = self.failing_since.is_some()
            && self.last_error.is_some_and(|t| now - t <= MAX_ERROR_GAP);
        if !continues {
            self.failing_since = Some(now);
        }
        self.last_error = Some(now);
    }

    /// Whether the watch has been failing for at least `bound` and still is at `now`.
    pub fn broken(&self, now: Instant, bound: Duration) -> bool {
        let (Some(since), Some(last)) = (self.failing_since, self.last_error) else {
            return false;
        };
        now - last <= MAX_ERROR_GAP && now - since >= bound
    }
}

/// The rows of one watched kind, by key (`namespace/name`, or the name).
pub type Store<K> = DashMap<String, <K as Watched>::Row>;

/// One store per watched kind ([`kinds::for_each_watched`]), filled by its watches, and the
/// few stores that are no table kind's.
#[derive(Clone)]
pub struct Stores {
    /// The [`Store`] of each [`Watched`] kind, by the impl's type (so each entry holds that
    /// kind's rows): [`Stores::of`]. Pod projections are shared (`Arc`) with every build's copy
    /// of the claims ([`Stores::claims_for`]).
    rows: Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// StatefulSets fetched on demand (by uid) to verify notebook ownership.
    pub statefulsets: Arc<DashMap<String, StatefulSetInfo>>,
    /// DaemonSet pods (dcgm-exporter's among them), to resolve a device's node.
    pub daemon_pods: Arc<DashMap<String, DaemonPod>>,
    /// Set once the Notebook watches run.
    pub notebooks_enabled: Arc<AtomicBool>,
    /// Workspace layer: set once the Workspace watches run.
    pub workspaces_enabled: Arc<AtomicBool>,
    /// Set once the DRA watches (`resource.k8s.io/v1`, see [`super::dra`]) run.
    pub dra_enabled: Arc<AtomicBool>,
    /// Set once the Kueue watches (`kueue.x-k8s.io/v1beta2`, see [`super::kueue`]) run.
    pub kueue_enabled: Arc<AtomicBool>,
    /// Set once the RayCluster watches (`ray.io/v1`) run.
    pub rayclusters_enabled: Arc<AtomicBool>,
    /// Kueue's `deviceClassMappings`, re-read from its ConfigMap (`None`: not read).
    pub kueue_mappings: Arc<arc_swap::ArcSwapOption<Vec<DeviceClassMapping>>>,
    /// The optional APIs (Notebook, DRA, Kueue) not found yet and looked for again in the
    /// background ([`rediscover`]), by name, with what that turns off and when the next look is.
    pending_apis: Arc<DashMap<&'static str, PendingApi>>,
    synced: Arc<DashMap<&'static str, bool>>,
    health: Arc<DashMap<&'static str, WatchHealth>>,
    /// The last error of each watch, as text (why a watch has not synced yet).
    last_errors: Arc<DashMap<&'static str, String>>,
    /// Bumped on every applied watch event, so the serve loop can rebuild the ledger from
    /// claims as soon as they change instead of waiting for the next Prometheus refresh.
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl Stores {
    fn new() -> Self {
        /// One empty store per watched kind: the set of kinds is fixed, so the map never
        /// changes after this and reads need no lock.
        struct Make(HashMap<TypeId, Arc<dyn Any + Send + Sync>>);
        impl Visit for Make {
            fn visit<K: Watched>(&mut self) {
                self.0
                    .insert(TypeId::of::<K>(), Arc::new(Store::<K>::new()));
            }
        }
        let mut rows = Make(HashMap::new());
        kinds::for_each_watched(&mut rows);
        Stores {
            rows: Arc::new(rows.0),
            statefulsets: Arc::default(),
            daemon_pods: Arc::default(),
            notebooks_enabled: Arc::new(AtomicBool::new(false)),
            workspaces_enabled: Arc::new(AtomicBool::new(false)),
            dra_enabled: Arc::new(AtomicBool::new(false)),
            kueue_enabled: Arc::new(AtomicBool::new(false)),
            rayclusters_enabled: Arc::new(AtomicBool::new(false)),
            kueue_mappings: Arc::default(),
            pending_apis: Arc::default(),
            synced: Arc::default(),
            health: Arc::default(),
            last_errors: Arc::default(),
            generation: Arc::default(),
        }
    }

    /// The store of kind `K` (`stores.of::<kinds::Pods>()`).
    pub fn of<K: Watched>(&self) -> Arc<Store<K>> {
        // `new` made one `Store<K>` per `Watched` impl, keyed by its type: the lookup and the
        // downcast hold. Were they ever to fail, an empty store is the answer, not a panic.
        self.rows
            .get(&TypeId::of::<K>())
            .and_then(|store| Arc::clone(store).downcast::<Store<K>>().ok())
            .unwrap_or_default()
    }

    /// Whether `source`'s watches run (Core's always do).
    fn served(&self, source: Source) -> bool {
        self.served_flag(source)
            .is_none_or(|flag| flag.load(Ordering::Relaxed))
    }

    /// The flag set once an optional `source`'s watches run; `None` for Core.
    fn served_flag(&self, source: Source) -> Option<&Arc<AtomicBool>> {
        match source {
            Source::Core => None,
            Source::Kubeflow => Some(&self.notebooks_enabled),
            Source::Dra => Some(&self.dra_enabled),
            Source::Kueue => Some(&self.kueue_enabled),
            Source::Workspaces => Some(&self.workspaces_enabled),
            Source::KubeRay => Some(&self.rayclusters_enabled),
        }
    }

    /// The watches (by label, e.g. `pods`, `pods#1`) failing for at least `bound`: their stores
    /// may be frozen.
    pub fn broken(&self, bound: Duration) -> Vec<&'static str> {
        let now = Instant::now();
        let mut out: Vec<&'static str> = self
            .health
            .iter()
            .filter(|e| e.value().broken(now, bound))
            .map(|e| *e.key())
            .collect();
        out.sort_unstable();
        out
    }

    /// The optional APIs not found yet, sorted, each with what that turns off and when they
    /// are looked for again (for `/readyz`): empty once every one was found.
    pub fn pending_apis(&self) -> Vec<String> {
        self.pending_notes(|_| true)
    }

    /// The [`Self::pending_apis`] the page shows: Kubeflow's Notebook (ownership and culling
    /// depend on it) and any API whose discovery failed. Kueue or DRA simply not installed is
    /// the normal case of many clusters and stays off the page.
    pub fn pending_apis_for_page(&self) -> Vec<String> {
        self.pending_notes(|p| p.on_page)
    }

    fn pending_notes(&self, keep: impl Fn(&PendingApi) -> bool) -> Vec<String> {
        let mut out: Vec<String> = self
            .pending_apis
            .iter()
            .filter(|e| keep(e.value()))
            .map(|e| e.value().note.clone())
            .collect();
        out.sort_unstable();
        out
    }

    /// Changes whenever any store may have changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// True once every started watch has delivered its first complete list.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|e| *e.value())
    }

    /// The watches that have not delivered their first complete list yet, sorted, each with
    /// the last error it saw (`None` while its first list is simply under way).
    pub fn unsynced(&self) -> Vec<(&'static str, Option<String>)> {
        let mut out: Vec<(&'static str, Option<String>)> = self
            .synced
            .iter()
            .filter(|e| !*e.value())
            .map(|e| {
                let label = *e.key();
                (
                    label,
                    self.last_errors.get(label).map(|m| m.value().clone()),
                )
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The names a DCGM series' `Hostname` may carry for a device of this shard: its nodes, and
    /// the DaemonSet pods on them (dcgm-exporter without `NODE_NAME` reports its pod's name,
    /// dcgm-exporter#188). Sorted, without duplicates, so the query text is stable.
    pub fn shard_hostnames(&self, shard: u32, total: u32) -> Vec<String> {
        let mut names: Vec<String> = self
            .of::<kinds::Nodes>()
            .iter()
            .filter(|e| crate::ledger::claims::node_in_shard(&e.value().name, shard, total))
            .map(|e| e.value().name.clone())
            .chain(
                self.daemon_pods
                    .iter()
                    .filter(|e| crate::ledger::claims::node_in_shard(&e.value().node, shard, total))
                    .map(|e| e.value().name.clone()),
            )
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// The claims one shard owns, filtered while copying (only what the shard keeps is cloned):
    /// every watched kind's rows through its [`Watched`] binding, then the stores of no table
    /// kind (StatefulSets, DaemonSet pods, Kueue's mappings) and the other shards' node names.
    pub fn claims_for(&self, shard: u32, total: u32) -> Claims {
        struct Copy<'a> {
            stores: &'a Stores,
            claims: Claims,
            shard: u32,
            total: u32,
        }
        impl Visit for Copy<'_> {
            fn visit<K: Watched>(&mut self) {
                let (shard, total) = (self.shard, self.total);
                let rows = self
                    .stores
                    .of::<K>()
                    .iter()
                    .filter(|e| K::in_shard(e.value(), shard, total))
                    .map(|e| e.value().clone())
                    .collect();
                K::store(&mut self.claims, rows);
                if self.stores.served(K::KIND.source) {
                    K::served(&mut self.claims);
                }
            }
        }
        let mut copy = Copy {
            stores: self,
            claims: Claims::default(),
            shard,
            total,
        };
        kinds::for_each_watched(&mut copy);
        let mut claims = copy.claims;
        claims.statefulsets = values(&self.statefulsets);
        claims.daemon_pods = values(&self.daemon_pods);
        claims.kueue.device_class_mappings = self.kueue_mappings.load_full().map(|m| (*m).clone());
        claims.other_shards_nodes = self
            .of::<kinds::Nodes>()
            .iter()
            .filter(|e| !crate::ledger::claims::node_in_shard(&e.value().name, shard, total))
            .map(|e| e.value().name.clone())
            .collect();
        claims
    }

    /// A consistent-enough copy of all stores for one ledger build.
    pub fn claims(&self) -> Claims {
        self.claims_for(0, 1)
    }

    /// Fetches StatefulSets that own GPU pods and are not known yet (only when Notebooks or
    /// Workspaces are on: both own their pods through one).
    pub async fn resolve_statefulsets(&self, client: &Client) -> Result<(), WatchError> {
        if !self.notebooks_enabled.load(Ordering::Relaxed)
            && !self.workspaces_enabled.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        let wanted: Vec<(String, String, String)> = self
            .of::<kinds::Pods>()
            .iter()
            .filter_map(|p| {
                let c = k8s::statefulset_owner(&p)?;
                (!self.statefulsets.contains_key(&c.uid))
                    .then(|| (p.namespace.clone(), c.name.clone(), c.uid.clone()))
            })
            .collect();
        for (namespace, name, uid) in wanted {
            match tokio::time::timeout(API_TIMEOUT, k8s::get_statefulset(client, &namespace, &name))
                .await
            {
                Ok(Ok(Some(sts))) if sts.uid().as_deref() == Some(uid.as_str()) => {
                    self.statefulsets.insert(uid, project::statefulset(&sts));
                }
                Ok(Ok(_)) => debug!(%namespace, %name, "statefulset gone or replaced"),
                Ok(Err(source)) => {
                    return Err(WatchError::StatefulSet {
                        namespace,
                        name,
                        source,
                    });
                }
                Err(_) => return Err(WatchError::StatefulSetTimeout { namespace, name }),
            }
        }
        // Forget StatefulSets no pod refers to any more.
        let live: HashSet<String> = self
            .of::<kinds::Pods>()
            .iter()
            .filter_map(|p| p.controller.as_ref().map(|c| c.uid.clone()))
            .collect();
        self.statefulsets.retain(|uid, _| live.contains(uid));
        Ok(())
    }
}

/// What to watch.
#[derive(Debug, Clone, Default)]
pub struct WatchConfig {
    /// Namespaces to watch pods and quotas in; empty = all.
    pub namespaces: Vec<String>,
    /// Namespaces to watch DaemonSet pods in (where dcgm-exporter runs); empty = all.
    pub exporter_namespaces: Vec<String>,
    pub names: ResourceNames,
    /// Kueue's manager ConfigMap `(namespace, name)`, read for its `deviceClassMappings`.
    pub kueue_config_map: Option<(String, String)>,
}

/// Starts every watch as a task on `tracker`, stopping on `cancel` (unsupervised: for tests and
/// tools; `serve` uses [`start_with`]).
pub async fn start(
    client: Client,
    config: WatchConfig,
    tracker: &tokio_util::task::TaskTracker,
    cancel: CancellationToken,
    on_restart: RestartHook,
) -> Stores {
    let spawn = |_name: String, task: BoxFuture<'static, ()>| {
        tracker.spawn(task);
    };
    start_with(client, config, &spawn, cancel, on_restart).await
}

/// Starts every watch as a task run by `spawn` (named `watch:<label>`), stopping on `cancel`. A
/// watch task ends only on `cancel`, or if its stream ends (which kube-runtime never does).
pub async fn start_with(
    client: Client,
    config: WatchConfig,
    spawn: Spawn<'_>,
    cancel: CancellationToken,
    on_restart: RestartHook,
) -> Stores {
    let stores = Stores::new();
    // The optional APIs are looked for once now (so a cluster that serves them starts with
    // their watches, as before), and when one is not found, again in the background until it
    // is — an API blip or a Kubeflow installed later must not leave ownership and culling off
    // until a restart.
    let optional = Optional {
        client,
        names: config.names.clone(),
        kueue_config_map: config.kueue_config_map.clone(),
        scopes: k8s::scopes(&config.namespaces),
        cancel,
        stores: stores.clone(),
        on_restart,
    };
    start_source(&optional, spawn, Source::Core, None);
    // Not a table kind: Pods again, but DaemonSet pods only (the label is set by the DaemonSet
    // controller alone), in the exporter's namespaces (it usually runs outside the watched
    // ones), into their own store, so it keeps its own watch here.
    let exporter_scopes = k8s::scopes(&config.exporter_namespaces);
    for (i, ns) in exporter_scopes.iter().enumerate() {
        spawn_watch(
            spawn,
            &optional.cancel,
            &stores,
            leak_label("daemonset-pods", i),
            k8s::scoped::<Pod>(&optional.client, ns.as_deref()),
            watcher::Config::default().labels(project::DAEMONSET_POD_LABEL),
            optional.on_restart.clone(),
            |pod: &Pod| project::daemon_pod(pod),
            stores.daemon_pods.clone(),
            |pod: &Pod| kinds::PODS.key(pod),
        );
    }

    for api in OptionalApi::ALL {
        match optional.try_start(api, spawn, true).await {
            Found::Started | Found::Off => {}
            Found::Missing(why) => {
                optional
                    .stores
                    .pending_apis
                    .insert(api.name(), api.pending(&why, REDISCOVER_FIRST));
                let again = optional.clone();
                spawn(
                    format!("discover:{}", api.name()),
                    Box::pin(
                        async move { again.rediscover(api).await }
                            .instrument(info_span!("discover", api = api.name())),
                    ),
                );
            }
        }
    }
    stores
}

/// First wait before an optional API not found at start-up is looked for again; the wait
/// doubles up to [`REDISCOVER_MAX`]. One discovery GET per API and look: cheap for any API
/// server, quick enough for an install.
pub const REDISCOVER_FIRST: Duration = Duration::from_secs(10);
/// Longest wait between two looks for an optional API.
pub const REDISCOVER_MAX: Duration = Duration::from_secs(300);

/// An API gpu-ledger uses when the cluster serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OptionalApi {
    Notebooks,
    Dra,
    Kueue,
    Workspaces,
    RayClusters,
}

impl OptionalApi {
    const ALL: [OptionalApi; 5] = [
        Self::Notebooks,
        Self::Dra,
        Self::Kueue,
        Self::Workspaces,
        Self::RayClusters,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Notebooks => "notebooks",
            Self::Dra => "dra",
            Self::Kueue => "kueue",
            Self::Workspaces => "workspaces",
            Self::RayClusters => "rayclusters",
        }
    }

    /// What `/readyz` (and for some, the page) says while the API is not found.
    fn pending(self, missing: &Missing, next: Duration) -> PendingApi {
        PendingApi {
            note: self.note(&missing.why, next),
            on_page: self == Self::Notebooks || missing.failed,
        }
    }

    fn note(self, why: &str, next: Duration) -> String {
        let (api, off) = match self {
            Self::Notebooks => (
                "kubeflow.org Notebook",
                "notebook ownership and culling are off",
            ),
            Self::Dra => ("resource.k8s.io/v1 (DRA)", "DRA accounting is off"),
            Self::Kueue => ("kueue.x-k8s.io/v1beta2 (Kueue)", "queue rows are off"),
            Self::Workspaces => (
                "kubeflow.org/v1beta1 Workspace",
                "workspace ownership and culling are off",
            ),
            Self::RayClusters => (
                "ray.io/v1 RayCluster (KubeRay)",
                "RayCluster ownership and culling are off",
            ),
        };
        format!("{api}: {why}; {off}; looking again in {}s", next.as_secs())
    }
}

/// An optional API not found yet.
#[derive(Debug, Clone)]
struct PendingApi {
    /// What `/readyz` says: the API, why, what is off, when the next look is.
    note: String,
    /// Whether the page says it too ([`Stores::pending_apis_for_page`]).
    on_page: bool,
}

/// How one look for an optional API went.
enum Found {
    /// Served and readable: its watches run.
    Started,
    /// Not wanted (DRA without `--dra-gpu-drivers`): never looked for again.
    Off,
    /// Not served, not readable, or discovery failed.
    Missing(Missing),
}

/// Why an optional API was not found.
struct Missing {
    why: String,
    /// Discovery itself failed (an error or a timeout), as opposed to "not served".
    failed: bool,
}

impl Missing {
    fn not_served(why: &str) -> Found {
        Found::Missing(Missing {
            why: why.into(),
            failed: false,
        })
    }
}

/// What the discovery of a CRD found ([`crd_resource`]): watches started through `start` when it
/// is served, not served, or failed. Said at info (served, not served) or warn (failed) on the
/// first look and at debug on the background re-looks, so a cluster without the component says
/// so once.
fn crd_found(
    found: Result<Option<ApiResource>, WatchError>,
    what: &str,
    off: &str,
    first_look: bool,
    start: impl FnOnce(&ApiResource),
) -> Found {
    match found {
        Ok(Some(ar)) => {
            info!(version = %ar.version, "watching {what}");
            start(&ar);
            Found::Started
        }
        Ok(None) => {
            if first_look {
                info!("{what} not served: {off}");
            } else {
                debug!("{what} not served: {off}");
            }
            Missing::not_served("not served")
        }
        Err(e) => {
            if first_look {
                warn!(error = &e as &dyn std::error::Error, "{what}: {off}");
            } else {
                debug!(error = &e as &dyn std::error::Error, "{what}: {off}");
            }
            Found::Missing(Missing {
                why: format!("discovery failed ({})", crate::telemetry::error_chain(&e)),
                failed: true,
            })
        }
    }
}

/// What starting watches needs, the optional APIs' included (all shared, cheap to clone).
#[derive(Clone)]
struct Optional {
    client: Client,
    names: ResourceNames,
    kueue_config_map: Option<(String, String)>,
    scopes: Vec<Option<String>>,
    cancel: CancellationToken,
    stores: Stores,
    on_restart: RestartHook,
}

// === impl Optional ===

impl Optional {
    /// Looks for `api` once and, when found, starts its watches through `spawn`.
    /// `first_look` is the look at start-up; the background re-looks log their misses at debug.
    async fn try_start(&self, api: OptionalApi, spawn: Spawn<'_>, first_look: bool) -> Found {
        let (client, scopes) = (&self.client, &self.scopes);
        match api {
            OptionalApi::Notebooks => crd_found(
                crd_resource("kubeflow.org notebooks", k8s::notebook_resource(client)).await,
                "kubeflow.org Notebook",
                "notebook ownership is off",
                first_look,
                |ar| start_notebooks(ar, self, spawn),
            ),
            OptionalApi::Workspaces => crd_found(
                crd_resource(
                    "kubeflow.org/v1beta1 workspaces",
                    k8s::workspace::workspace_resource(client),
                )
                .await,
                "kubeflow.org/v1beta1 Workspace",
                "workspace ownership is off",
                first_look,
                |ar| start_source(self, spawn, Source::Workspaces, Some(ar)),
            ),
            OptionalApi::Dra if self.names.dra_drivers.is_empty() => {
                info!("no --dra-gpu-drivers: DRA accounting is off");
                Found::Off
            }
            OptionalApi::Dra => {
                if !dra::available(
                    client,
                    scopes,
                    &kinds::watched_refs(Source::Dra),
                    first_look,
                )
                .await
                {
                    return Missing::not_served("not served or not readable");
                }
                start_dra(self, spawn);
                Found::Started
            }
            OptionalApi::Kueue => {
                if !kueue::available(
                    client,
                    scopes,
                    &kinds::watched_refs(Source::Kueue),
                    first_look,
                )
                .await
                {
                    return Missing::not_served("not served or not readable");
                }
                start_kueue(self, spawn);
                Found::Started
            }
            OptionalApi::RayClusters => crd_found(
                crd_resource("ray.io/v1 rayclusters", k8s::raycluster::resource(client)).await,
                "ray.io/v1 RayCluster",
                "RayCluster ownership is off",
                first_look,
                |ar| start_source(self, spawn, Source::KubeRay, Some(ar)),
            ),
        }
    }

    /// Looks for `api` again with a doubling wait ([`REDISCOVER_FIRST`] to [`REDISCOVER_MAX`])
    /// until it is found, then runs its watches on this task until shutdown. Ends only on
    /// cancel, or when one of those watches ends (which the supervisor treats as a failure,
    /// as for any watch).
    async fn rediscover(self, api: OptionalApi) {
        let mut wait = REDISCOVER_FIRST;
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let started: std::sync::Mutex<Vec<BoxFuture<'static, ()>>> =
                std::sync::Mutex::default();
            let collect = |_name: String, task: BoxFuture<'static, ()>| {
                started
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(task);
            };
            match self.try_start(api, &collect, false).await {
                Found::Started => {
                    self.stores.pending_apis.remove(api.name());
                    info!(
                        api = api.name(),
                        "found after start-up: its watches run now"
                    );
                    let watches = started
                        .into_inner()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if watches.is_empty() {
                        self.cancel.cancelled().await;
                        return;
                    }
                    tokio::select! {
                        () = self.cancel.cancelled() => {}
                        _ = futures::future::select_all(watches) => {
                            warn!(api = api.name(), "a watch ended");
                        }
                    }
                    return;
                }
                Found::Off => {
                    self.stores.pending_apis.remove(api.name());
                    self.cancel.cancelled().await;
                    return;
                }
                Found::Missing(why) => {
                    wait = wait.saturating_mul(2).min(REDISCOVER_MAX);
                    self.stores
                        .pending_apis
                        .insert(api.name(), api.pending(&why, wait));
                }
            }
        }
    }
}

/// Marks `source` served and starts the watches of each of its watched kinds
/// ([`kinds::for_each_watched`]); `discovered` is the served version of a discovered CRD.
fn start_source(
    ctx: &Optional,
    spawn: Spawn<'_>,
    source: Source,
    discovered: Option<&ApiResource>,
) {
    struct Start<'a, 'b> {
        ctx: &'a Optional,
        spawn: Spawn<'b>,
        source: Source,
        discovered: Option<&'a ApiResource>,
    }
    impl Visit for Start<'_, '_> {
        fn visit<K: Watched>(&mut self) {
            if K::KIND.source != self.source {
                return;
            }
            if let Some(resource) = K::resource(self.discovered) {
                watch_kind::<K>(self.ctx, self.spawn, &resource);
            }
        }
    }
    if let Some(flag) = ctx.stores.served_flag(source) {
        flag.store(true, Ordering::Relaxed);
    }
    kinds::for_each_watched(&mut Start {
        ctx,
        spawn,
        source,
        discovered,
    });
}

/// Starts the Notebook watches (served as `ar`) in every scope.
fn start_notebooks(ar: &ApiResource, ctx: &Optional, spawn: Spawn<'_>) {
    info!(version = %ar.version, "watching kubeflow.org notebooks");
    start_source(ctx, spawn, Source::Kubeflow, Some(ar));
}

/// Starts the Kueue watches on `stores` (once [`kueue::available`] said `kueue.x-k8s.io/v1beta2`
/// is served and readable); LocalQueues and Workloads in `scopes`. Kueue's ConfigMap is no
/// watch: it is re-read now and then ([`start_kueue_config`]).
fn start_kueue(ctx: &Optional, spawn: Spawn<'_>) {
    info!(
        group = kueue::GROUP,
        version = kueue::VERSION,
        "watching Kueue {}",
        kinds::watched_resources(Source::Kueue)
    );
    start_source(ctx, spawn, Source::Kueue, None);
    start_kueue_config(ctx, spawn);
}

/// How often Kueue's ConfigMap is read again: Kueue itself reads it only when it starts, so a
/// change takes a Kueue restart; a few minutes' delay after that is no loss, and one GET per
/// period costs nothing.
const KUEUE_CONFIG_REREAD: Duration = Duration::from_secs(300);

/// Reads Kueue's `deviceClassMappings` from its ConfigMap now and every
/// [`KUEUE_CONFIG_REREAD`] into `stores.kueue_mappings`, until cancelled.
fn start_kueue_config(ctx: &Optional, spawn: Spawn<'_>) {
    let Some((namespace, name)) = ctx.kueue_config_map.clone() else {
        return;
    };
    let (client, cancel) = (ctx.client.clone(), ctx.cancel.clone());
    let mappings = ctx.stores.kueue_mappings.clone();
    spawn(
        "kueue-config".to_string(),
        Box::pin(
            async move {
                let mut first_look = true;
                loop {
                    let read = kueue::read_mappings(&client, &namespace, &name, first_look).await;
                    mappings.store(read.map(Arc::new));
                    first_look = false;
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(KUEUE_CONFIG_REREAD) => {}
                    }
                }
            }
            .instrument(info_span!("kueue-config")),
        ),
    );
}

/// Starts the DRA watches on `stores` (once [`dra::available`] said the API is served and
/// readable); `scopes` are the namespaces claims are watched in (`None`: all).
fn start_dra(ctx: &Optional, spawn: Spawn<'_>) {
    info!(drivers = ?ctx.names.dra_drivers, "watching {}/{} {}", dra::GROUP, dra::VERSION, kinds::watched_resources(Source::Dra));
    start_source(ctx, spawn, Source::Dra, None);
}

/// A copy of every value of a store.
fn values<V: Clone>(store: &DashMap<String, V>) -> Vec<V> {
    store.iter().map(|e| e.value().clone()).collect()
}

/// Label of the i-th watch of a resource (static strings keep metric labels bounded).
fn leak_label(resource: &'static str, i: usize) -> &'static str {
    if i == 0 {
        resource
    } else {
        Box::leak(format!("{resource}#{i}").into_boxed_str())
    }
}

/// Starts the watches of kind `K` (served as `resource`, `()` for a typed kind) into its store:
/// one per scope for a namespaced kind, one cluster-wide otherwise.
fn watch_kind<K: Watched>(
    ctx: &Optional,
    spawn: Spawn<'_>,
    resource: &<K::Object as Resource>::DynamicType,
) {
    let store = ctx.stores.of::<K>();
    let cluster_wide = [None];
    let scopes = match K::KIND.scope {
        Scope::Namespaced => ctx.scopes.as_slice(),
        Scope::Cluster => &cluster_wide,
    };
    for (i, ns) in scopes.iter().enumerate() {
        let names = ctx.names.clone();
        spawn_watch(
            spawn,
            &ctx.cancel,
            &ctx.stores,
            leak_label(K::KIND.resource, i),
            K::api(&ctx.client, ns.as_deref(), resource),
            watcher::Config::default(),
            ctx.on_restart.clone(),
            move |o: &K::Object| match K::project(&names, o) {
                Ok(row) => row,
                Err(e) => {
                    if let Some(what) = K::INVALID {
                        warn!(error = &e as &dyn std::error::Error, "{what}");
                    }
                    None
                }
            },
            store.clone(),
            |o: &K::Object| K::KIND.key(o),
        );
    }
}

/// A CRD's served resource from `discover` (bounded by [`API_TIMEOUT`]), `None` when its
/// group or kind is absent: kube's discovery answers a discovery error or a 404 for a group that
/// is not served (the component is not installed).
async fn crd_resource(
    what: &'static str,
    discover: impl Future<Output = Result<Option<ApiResource>, kube::Error>>,
) -> Result<Option<ApiResource>, WatchError> {
    match tokio::time::timeout(API_TIMEOUT, discover).await {
        Err(_) => Err(WatchError::DiscoveryTimeout { what }),
        Ok(Ok(ar)) => Ok(ar),
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => Ok(None),
        Ok(Err(kube::Error::Discovery(_))) => Ok(None),
        Ok(Err(source)) => Err(WatchError::Discovery { what, source }),
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn_watch<K, V, P, F>(
    spawn: Spawn<'_>,
    cancel: &CancellationToken,
    stores: &Stores,
    label: &'static str,
    api: Api<K>,
    config: watcher::Config,
    on_restart: RestartHook,
    project: P,
    store: Arc<DashMap<String, V>>,
    key: F,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    V: PartialEq + Send + Sync + 'static,
    P: Fn(&K) -> Option<V> + Send + Sync + 'static,
    F: Fn(&K) -> String + Send + Sync + 'static,
{
    stores.synced.insert(label, false);
    stores.health.insert(label, WatchHealth::default());
    let synced = stores.synced.clone();
    let health = stores.health.clone();
    let last_errors = stores.last_errors.clone();
    let generation = stores.generation.clone();
    let cancel = cancel.clone();
    let span = info_span!("watch", resource = label);
    let task = format!("watch:{label}");
    spawn(
        task.clone(),
        Box::pin(
            async move {
                // Not `WatchStreamExt::default_backoff()`: kube-runtime's StreamBackoff resets its
                // backoff on any `Ok` item (docs.rs/crate/kube-runtime/latest/source/src/utils/
                // stream_backoff.rs), and the watcher emits `Ok(Event::Init)` before every list,
                // so against a dead API server it retried at once, ~20 times in 25 s (issue 23;
                // the same finding: github.com/bitdriftlabs/pulse/pull/52). The same policy
                // (0.8 s doubling to 30 s, jittered), reset only once the API answered.
                let stream = watcher::watcher(api, config);
                futures::pin_mut!(stream);
                let mut backoff = DefaultBackoff::default();
                let mut relist: Option<HashSet<String>> = None;
                loop {
                    let next = tokio::select! {
                        () = cancel.cancelled() => break,
                        next = stream.try_next() => next,
                    };
                    match next {
                        Ok(Some(event)) => {
                            // `Init` only announces a list about to be attempted: it proves
                            // nothing about the API server.
                            if answered(&event) {
                                backoff.reset();
                                if let Some(mut h) = health.get_mut(label) {
                                    h.on_event();
                                }
                            }
                            // Only a change to a projection bumps the generation: status updates of
                            // GPU pods and every event of a non-GPU pod leave the claims as they were
                            // and must not make the serve loop rebuild the ledger.
                            let changed = apply(event, &project, &key, &store, &mut relist, || {
                                synced.insert(label, true);
                            });
                            if changed {
                                generation.fetch_add(1, Ordering::Relaxed);
                            }
                            crate::test_hooks::panic_point(&task);
                        }
                        Ok(None) => {
                            warn!("watch stream ended");
                            return;
                        }
                        Err(e) => {
                            if let Some(mut h) = health.get_mut(label) {
                                h.on_error(Instant::now());
                            }
                            last_errors.insert(label, crate::telemetry::error_chain(&e));
                            let delay = backoff.next();
                            warn!(
                                error = &e as &dyn std::error::Error,
                                backoff_ms =
                                    delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                                "watch failed; restarting with backoff"
                            );
                            on_restart(label);
                            // DefaultBackoff never gives up; `None` would mean retry at once.
                            if let Some(delay) = delay {
                                tokio::select! {
                                    () = cancel.cancelled() => break,
                                    () = tokio::time::sleep(delay) => {}
                                }
                            }
                        }
                    }
                }
                debug!("watch stopped");
            }
            .instrument(span),
        ),
    );
}

/// Whether an event shows the API server answered (a list page, the end of a list, a change):
/// everything but `Init`, which the watcher emits before it even tries to list.
fn answered<K>(event: &Event<K>) -> bool {
    !matches!(event, Event::Init)
}

/// Applies one watch event to `store`; returns whether the store changed.
fn apply<K, V, P, F>(
    event: Event<K>,
    project: &P,
    key: &F,
    store: &DashMap<String, V>,
    relist: &mut Option<HashSet<String>>,
    on_synced: impl FnOnce(),
) -> bool
where
    P: Fn(&K) -> Option<V>,
    F: Fn(&K) -> String,
    V: PartialEq,
    K: Clone,
{
    match event {
        Event::Init => {
            *relist = Some(HashSet::new());
            false
        }
        Event::InitApply(obj) | Event::Apply(obj) => {
            let k = key(&obj);
            if let Some(seen) = relist.as_mut() {
                seen.insert(k.clone());
            }
            match project(&obj) {
                Some(v) => {
                    // The read guard is dropped before the insert (same shard).
                    let changed = store.get(&k).is_none_or(|old| *old != v);
                    if changed {
                        store.insert(k, v);
                    }
                    changed
                }
                None => store.remove(&k).is_some(),
            }
        }
        Event::Delete(obj) => store.remove(&key(&obj)).is_some(),
        Event::InitDone => {
            if let Some(seen) = relist.take() {
                store.retain(|k, _| seen.contains(k));
            }
            on_synced();
            // A (re)list may have changed anything; it is rare.
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::claims::NodeInfo;

    #[test]
    fn only_real_changes_count() {
        let store: DashMap<String, u32> = DashMap::new();
        let mut relist = None;
        // A value of 0 projects to nothing (like a pod without GPUs).
        let project = |v: &(String, u32)| (v.1 > 0).then_some(v.1);
        let key = |v: &(String, u32)| v.0.clone();
        let mut apply_one = |e| apply(e, &project, &key, &store, &mut relist, || {});
        assert!(apply_one(Event::Apply(("a".into(), 1))), "new claim");
        assert!(!apply_one(Event::Apply(("a".into(), 1))), "same projection");
        assert!(
            apply_one(Event::Apply(("a".into(), 2))),
            "changed projection"
        );
        assert!(!apply_one(Event::Apply(("b".into(), 0))), "never a claim");
        assert!(!apply_one(Event::Delete(("b".into(), 0))), "never stored");
        assert!(
            apply_one(Event::Apply(("a".into(), 0))),
            "no longer a claim"
        );
        assert!(!apply_one(Event::Delete(("a".into(), 0))), "already gone");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_is_broken_only_while_it_keeps_failing_past_the_bound() {
        let bound = Duration::from_secs(60);
        let mut h = WatchHealth::default();
        let t0 = Instant::now();
        assert!(!h.broken(t0, bound), "healthy");
        // 403 after the initial list: errors at the backoff's pace (0.8 s, 1.6 s, ... 30 s + jitter).
        let mut at = t0;
        for gap in [0, 1, 2, 4, 7, 13, 26, 45, 55] {
            at += Duration::from_secs(gap);
            h.on_error(at);
        }
        assert_eq!(h.failing_since, Some(t0));
        assert!(h.broken(at, bound), "failing for {:?}", at - t0);
        assert!(!h.broken(t0 + Duration::from_secs(59), bound), "not yet");
        // Quiet for longer than any backoff: it reconnected.
        assert!(!h.broken(at + MAX_ERROR_GAP + Duration::from_secs(1), bound));
        // A later error after such a gap starts a new run.
        let later = at + MAX_ERROR_GAP + Duration::from_secs(5);
        h.on_error(later);
        assert_eq!(h.failing_since, Some(later));
        assert!(!h.broken(later, bound));
        // An event ends the run at once.
        h.on_error(later + Duration::from_secs(70));
        assert!(h.broken(later + Duration::from_secs(70), bound));
        h.on_event();
        assert!(!h.broken(later + Duration::from_secs(70), bound));
    }

    /// A shard's query scope lists its nodes and the DaemonSet pods on them, nothing of the
    /// other shards', sorted and once each; together the shards list every name.
    #[test]
    fn shard_hostnames_are_the_shards_nodes_and_their_exporter_pods() {
        let stores = Stores::new();
        for i in 0..20 {
            let name = format!("gpu-node-{i:02}");
            stores.of::<kinds::Nodes>().insert(
                name.clone(),
                NodeInfo {
                    hami: crate::ledger::hami_inputs::HamiNode::default(),
                    name: name.clone(),
                    allocatable: std::collections::BTreeMap::new(),
                    replicas: 1,
                    product: None,
                    gpu_labels: std::collections::BTreeMap::new(),
                    labels: std::collections::BTreeMap::new(),
                    taints: Vec::new(),
                    ready: Some(true),
                },
            );
            let pod = format!("nvidia-dcgm-exporter-{i:02}");
            stores.daemon_pods.insert(
                format!("gpu-operator/{pod}"),
                DaemonPod {
                    namespace: "gpu-operator".into(),
                    name: pod,
                    node: name,
                    ip: None,
                },
            );
        }
        let mut union = Vec::new();
        for shard in 0..3 {
            let names = stores.shard_hostnames(shard, 3);
            assert!(names.is_sorted(), "{names:?}");
            for n in &names {
                let node = n.replace("nvidia-dcgm-exporter-", "gpu-node-");
                assert!(
                    crate::ledger::claims::node_in_shard(&node, shard, 3),
                    "{n} is not shard {shard}'s"
                );
            }
            union.extend(names);
        }
        union.sort_unstable();
        assert_eq!(union.len(), 40, "every node and exporter pod, once");
        union.dedup();
        assert_eq!(union.len(), 40);
        assert_eq!(stores.shard_hostnames(0, 1).len(), 40, "unsharded: all");
    }

    #[test]
    fn relist_prunes_objects_missing_from_the_new_list() {
        let store: DashMap<String, u32> = DashMap::new();
        let mut relist = None;
        let project = |v: &(String, u32)| Some(v.1);
        let key = |v: &(String, u32)| v.0.clone();
        let mut synced = 0;
        apply(
            Event::Apply(("a".into(), 1)),
            &project,
            &key,
            &store,
            &mut relist,
            || synced += 1,
        );
        apply(
            Event::Apply(("b".into(), 2)),
            &project,
            &key,
            &store,
            &mut relist,
            || synced += 1,
        );
        // Restart: the new list holds only b.
        apply(Event::Init, &project, &key, &store, &mut relist, || {
            synced += 1;
        });
        apply(
            Event::InitApply(("b".into(), 3)),
            &project,
            &key,
            &store,
            &mut relist,
            || synced += 1,
        );
        apply(Event::InitDone, &project, &key, &store, &mut relist, || {
            synced += 1;
        });
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("b").map(|v| *v), Some(3));
        assert_eq!(synced, 1);
        apply(
            Event::Delete(("b".into(), 3)),
            &project,
            &key,
            &store,
            &mut relist,
            || {},
        );
        assert!(store.is_empty());
    }
}
