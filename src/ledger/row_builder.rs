//! Builders for `PodRow`: a base row from [`PodRow::new`] plus chained setters, so unit tests,
//! integration tests and benchmarks name only what their case is about (they live in the
//! library because integration tests need them too).

use chrono::{DateTime, Duration, Utc};

use super::claims::NotebookInfo;
use super::{Attribution, OwnedBy, Owner, PodRow, PodState};

impl PodRow {
    /// Bound to `node` and running.
    #[must_use]
    pub fn running_on(self, node: impl Into<String>) -> Self {
        self.placed(Some(&node.into()), PodState::Running)
    }

    /// On `node` (`None`: not bound) in `state`.
    #[must_use]
    pub fn placed(mut self, node: Option<&str>, state: PodState) -> Self {
        self.node = node.map(Into::into);
        self.state = state;
        self
    }

    /// Holding `units` of a whole-GPU resource: the claim, its GPU equivalents (one per unit)
    /// and the equivalents by resource (the metrics' `resource` label), added to what the row
    /// already holds.
    #[must_use]
    pub fn holding(mut self, resource: &str, units: u64) -> Self {
        #[allow(clippy::cast_precision_loss)] // a test's unit count
        let gpus = units as f64;
        self.resources.insert(resource.to_string(), units);
        self.gpus += gpus;
        self.gpus_by_resource.push((resource.to_string(), gpus));
        self
    }

    /// Attributed to its devices this way.
    #[must_use]
    pub fn attributed(mut self, attribution: Attribution) -> Self {
        self.attribution = attribution;
        self
    }

    /// Proven idle (`Some(true)`), busy (`Some(false)`) or unknown (`None`).
    #[must_use]
    pub fn with_idle(mut self, idle: Option<bool>) -> Self {
        self.idle = idle;
        self
    }

    /// Proven idle for `seconds`.
    #[must_use]
    pub fn idle_for(mut self, seconds: f64) -> Self {
        self.idle = Some(true);
        self.idle_seconds = Some(seconds);
        self
    }

    /// A culling candidate's evidence at `now`: started and Ready `up` ago, proven idle since
    /// `idle` ago at 0 % (peak 0, newest sample at `now`), one GPU expected and found, fully
    /// covered. Cases about one of these facts change that field afterwards.
    #[must_use]
    pub fn stop_candidate(mut self, now: DateTime<Utc>, up: Duration, idle: Duration) -> Self {
        self.utilization = Some(0.0);
        let e = &mut self.evidence;
        e.started_at = Some(now - up);
        e.ready_since = Some(now - up);
        e.coverage = Some(1.0);
        e.newest_sample_at = Some(now);
        e.peak = Some(0.0);
        e.idle_since = Some(now - idle);
        e.devices_found = 1;
        e.devices_expected = 1;
        self.idle_for(idle.as_seconds_f64())
    }

    /// Busy at `utilization` (0..1): not idle, idle for no seconds.
    #[must_use]
    pub fn busy_at(mut self, utilization: f64) -> Self {
        self.utilization = Some(utilization);
        self.idle = Some(false);
        self.idle_seconds = Some(0.0);
        self
    }

    /// Controlled by an owner of this kind and name.
    #[must_use]
    pub fn owned_by(mut self, kind: &str, name: impl Into<String>) -> Self {
        self.owner = Some(Owner {
            kind: kind.into(),
            name: name.into(),
        });
        self
    }

    /// With this pod uid in its evidence.
    #[must_use]
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.evidence.uid = uid.into();
        self
    }

    /// The pod of this notebook, its StatefulSet chain verified: the row's `notebook` name and
    /// the notebook in its evidence.
    #[must_use]
    pub fn of_notebook(mut self, notebook: NotebookInfo) -> Self {
        self.notebook = Some(notebook.name.clone());
        self.evidence.owner = Some(OwnedBy::notebook(notebook, true));
        self
    }

    /// Terminating for `seconds` and past its deadline by more than `--stuck-after`.
    #[must_use]
    pub fn stuck_for(mut self, seconds: f64) -> Self {
        self.state = PodState::Terminating;
        self.stuck = true;
        self.terminating_seconds = Some(seconds);
        self
    }
}
