//! Offline input for `report --from DIR`: `kubectl get … -o json|yaml` dumps (claims source) plus
//! a dcgm-exporter exposition dump (usage source), fed through the same `ledger::build` as the
//! live service.
//!
//! [`load`] is pure apart from reading the files: the caller passes the clock as `fallback_now`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};

use crate::claims::files::{self, DumpPaths, FileError};
use crate::ledger::{self, Ledger, Policy};
use crate::usage::LabelScheme;
use crate::usage::dump::{self, DumpError, DumpSettings};
use crate::usage::prom::Selector;
use crate::usage::scheme::SchemeChoice;

/// Default idle window of the offline report.
pub const DEFAULT_WINDOW_MINUTES: i64 = 10;
/// Name of the DCGM dump inside a `--from` directory.
pub const DCGM_FILE: &str = "dcgm.prom";

/// Everything the offline report reads.
#[derive(Debug, Clone)]
pub struct OfflineInput {
    pub paths: DumpPaths,
    /// A dcgm-exporter `/metrics` or Prometheus `/federate` dump (text format or `OpenMetrics`).
    pub dcgm: PathBuf,
    /// Observation instant; `None` = the newest sample timestamp in the DCGM dump, else the clock.
    pub at: Option<DateTime<Utc>>,
    /// Idle window length.
    pub window: Duration,
    /// Sample spacing assumed for a device whose samples cannot show theirs; `None` = 30 s.
    pub scrape_interval: Option<Duration>,
    pub scheme: SchemeChoice,
    pub policy: Policy,
    /// Only pods and quotas of these namespaces (`--namespaces`, as the live lists); empty = all.
    pub namespaces: Vec<String>,
    /// Largest dump file accepted, in bytes (each file; `--max-dump-size`).
    pub max_dump_bytes: u64,
    /// `--prometheus-selector`, applied to the DCGM dump's series.
    pub selector: Option<Selector>,
}

impl OfflineInput {
    /// Defaults for a dump directory: `DIR/{pods,nodes,…}.{json,yaml}` and `DIR/dcgm.prom`,
    /// a 10-minute window, inferred interval and label scheme, default policy.
    pub fn from_dir(dir: &Path) -> Self {
        OfflineInput {
            paths: DumpPaths::from_dir(dir),
            dcgm: dir.join(DCGM_FILE),
            at: None,
            window: Duration::minutes(DEFAULT_WINDOW_MINUTES),
            scrape_interval: None,
            scheme: SchemeChoice::Auto,
            policy: Policy::default(),
            namespaces: Vec::new(),
            max_dump_bytes: dump::DEFAULT_MAX_DUMP_BYTES,
            selector: None,
        }
    }
}

/// The ledger built from files, plus what the caller should tell the user.
#[derive(Debug, Clone)]
pub struct Offline {
    pub ledger: Ledger,
    /// Non-fatal problems, each naming the file ("dcgm.prom: skipped 3 unparsable lines …").
    pub warnings: Vec<String>,
    /// The instant the ledger describes.
    pub at: DateTime<Utc>,
    /// The dump's typical sample spacing (inferred, else the assumed one).
    pub scrape_interval: Duration,
    /// The label scheme used to read workload labels.
    pub scheme: LabelScheme,
    /// Every namespace an object of the dump is in (GPU or not), so `report -n` can tell a
    /// namespace without GPU pods from one that is not in the dump at all.
    pub namespaces: std::collections::BTreeSet<String>,
}

/// Why the offline input could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Claims(#[from] FileError),
    #[error(transparent)]
    Dcgm(#[from] DumpError),
}

/// Loads the dumps and builds the ledger at `input.at`, or the newest DCGM sample, or `fallback_now`.
pub fn load(input: &OfflineInput, fallback_now: DateTime<Utc>) -> Result<Offline, OfflineError> {
    let limits = files::DumpLimits {
        max_bytes: input.max_dump_bytes,
    };
    let loaded = files::load_with_limits(&input.paths, &input.policy.names, limits)?;
    let mut claims = loaded.claims;
    if !input.namespaces.is_empty() {
        let wanted = |ns: &String| input.namespaces.contains(ns);
        claims.pods.retain(|p| wanted(&p.namespace));
        claims.quotas.retain(|q| wanted(&q.namespace));
        // As the live watches: LocalQueues and Workloads of the watched namespaces only.
        claims.kueue.local_queues.retain(|q| wanted(&q.namespace));
        claims.kueue.workloads.retain(|w| wanted(&w.namespace));
    }
    let settings = DumpSettings {
        at: input.at,
        window: input.window,
        scrape_interval: input.scrape_interval,
        scheme: input.scheme,
        idle_threshold: input.policy.idle_threshold,
        max_staleness: input.policy.max_staleness,
        max_bytes: input.max_dump_bytes,
        selector: input.selector.clone(),
    };
    let usage = dump::load(&input.dcgm, &settings, fallback_now)?;
    let ledger = ledger::build(&claims, &usage.usage, usage.at, &input.policy);
    Ok(Offline {
        ledger,
        warnings: loaded.warnings.into_iter().chain(usage.warnings).collect(),
        at: usage.at,
        scrape_interval: usage.scrape_interval,
        scheme: usage.scheme,
        namespaces: loaded.namespaces,
    })
}
