//! The pre-stop re-check: right before the culler writes a stop, the pod's evidence is judged
//! again through the refresh's own path, with the history of the refresh being acted on: the
//! same window read, decoder and reduction (`usage::live::fetch_window_in`, over the devices the
//! refresh asks for, [`query_scope`]), then the hub's ledger rule on the claims as the watches
//! hold them now (`hub::rebuild_from_claims`), then `cull::plan::still_a_stop`. Anything short
//! of "still a candidate" cancels the stop.
//!
//! The whole ledger is rebuilt, not just the pod's part: with `--cull-when=demand` the verdict
//! reads every pending pod and every node (the reclaim planner), and even without it the pod's
//! attribution and the time-sliced rule read its node's other pods and the exporter pods, so a
//! narrower build would be a second ledger rule to keep equal to the first.

use std::future::Future;
use std::sync::Arc;

use chrono::Utc;

use super::hub::rebuild_from_claims;
use crate::claims::watch::Stores;
use crate::cull;
use crate::cull::actuator::RecheckError;
use crate::cull::plan::{Action, CullPolicy};
use crate::ledger::Policy;
use crate::ledger::usage::Usage;
use crate::usage::history::History;
use crate::usage::live::{LiveSettings, Scope};
use crate::usage::prom::PromClient;

/// The devices this replica asks Prometheus for: all of them unsharded (or without a scope
/// label), else those whose `label` names one of the shard's nodes or exporter pods.
pub(super) fn query_scope(
    stores: &Stores,
    (shard, total): (u32, u32),
    label: Option<&str>,
) -> Scope {
    match label {
        Some(label) if total > 1 => Scope::Named {
            label: label.to_string(),
            values: stores.shard_hostnames(shard, total),
        },
        _ => Scope::All,
    }
}

/// What a pre-stop re-check needs besides the history of the refresh being acted on.
pub(super) struct RecheckContext {
    pub(super) client: Option<Arc<PromClient>>,
    pub(super) settings: LiveSettings,
    pub(super) stores: Stores,
    pub(super) policy: Policy,
    pub(super) cull_policy: CullPolicy,
    pub(super) shard: (u32, u32),
    pub(super) scope_label: Option<String>,
}

impl RecheckContext {
    pub(super) fn with_history(&self, history: Option<Arc<History>>) -> Rechecker<'_> {
        Rechecker { ctx: self, history }
    }
}

/// Re-checks a planned stop right before acting: a fresh Prometheus read, fresh claims from the
/// stores, the same history, the refresh's and the hub's rules. Anything short of "still a
/// candidate" cancels the stop.
pub(super) struct Rechecker<'a> {
    ctx: &'a RecheckContext,
    history: Option<Arc<History>>,
}

impl Rechecker<'_> {
    pub(super) fn run(
        &mut self,
        action: &Action,
    ) -> impl Future<Output = Result<bool, RecheckError>> + use<> {
        let client = self.ctx.client.clone();
        let mut history = self.history.as_deref().cloned();
        let (settings, policy, cull_policy) = (
            self.ctx.settings,
            self.ctx.policy.clone(),
            self.ctx.cull_policy.clone(),
        );
        let (stores, shard) = (self.ctx.stores.clone(), self.ctx.shard);
        let scope = query_scope(
            &self.ctx.stores,
            self.ctx.shard,
            self.ctx.scope_label.as_deref(),
        );
        let Action::Stop { pod_uid, .. } = action;
        let pod_uid = pod_uid.clone();
        async move {
            let Some(client) = client else {
                return Ok(false);
            };
            let now = Utc::now();
            let devices = crate::usage::live::fetch_window_in(
                &client,
                &settings,
                &scope,
                history.as_mut(),
                now,
            )
            .await?;
            let usage = Usage {
                devices,
                available: true,
                partial: false,
                // HAMi sharers are never stop candidates (shared attribution): not re-read.
                hami: Vec::new(),
                gpu_health: Vec::new(),
            };
            let ledger = rebuild_from_claims(&stores, &usage, &policy, shard);
            Ok(cull::plan::still_a_stop(
                &ledger,
                &cull_policy,
                now,
                &pod_uid,
            ))
        }
    }
}
