//! The settings the modes hand to the library, from the flags: the live usage source's window and
//! the culling policy and configuration.

use super::error::AppError;
use crate::config::{
    CullArgs, CullModeFlag, CullPolicyArgs, CullWhenFlag, LedgerArgs, WebhookFormatFlag,
};
use crate::cull::registry::Targets;
use crate::cull::{CullConfig, CullMode, CullPolicy, CullWhen};
use crate::ledger::Policy;
use crate::ledger::usage::Window;
use crate::usage::live::LiveSettings;

/// The idle window of the live paths (`interval`: the DCGM sample spacing assumed where the samples
/// cannot show theirs, `--scrape-interval`).
pub(super) fn window_of(args: &LedgerArgs, interval: chrono::Duration) -> Window {
    Window {
        length: args.window,
        interval,
        idle_threshold: args.idle_threshold,
        max_staleness: args.max_staleness,
    }
}

/// Settings of the live usage source.
pub(super) fn live_settings(args: &LedgerArgs) -> LiveSettings {
    let interval = args
        .scrape_interval
        .unwrap_or(chrono::Duration::seconds(30));
    LiveSettings {
        scheme: args.label_scheme,
        window: window_of(args, interval),
        history_lookback: args.history_lookback,
        min_coverage: args.min_coverage,
    }
}

pub(super) fn cull_mode(flag: CullModeFlag) -> CullMode {
    match flag {
        CullModeFlag::Off => CullMode::Off,
        CullModeFlag::DryRun => CullMode::DryRun,
        CullModeFlag::On => CullMode::On,
    }
}

/// The culling rules from the command line, with coverage and staleness from the ledger policy;
/// an unknown `--cull-targets` name is a configuration error.
pub(super) fn cull_policy(args: &CullPolicyArgs, ledger: &Policy) -> Result<CullPolicy, AppError> {
    let listed = |v: &[String]| v.iter().filter(|s| !s.is_empty()).cloned().collect();
    let targets =
        Targets::named(&args.cull_targets).map_err(|e| AppError::Config(e.to_string()))?;
    Ok(CullPolicy {
        idle_after: args.cull_idle_after,
        min_runtime: args.cull_min_runtime,
        min_coverage: ledger.min_coverage,
        max_staleness: ledger.max_staleness,
        max_per_cycle: args.cull_max_per_cycle,
        namespaces: listed(&args.cull_namespaces),
        exclude_namespaces: listed(&args.cull_exclude_namespaces),
        notice: args.cull_notice,
        max_snooze: args.cull_max_snooze,
        when: match args.cull_when {
            CullWhenFlag::Idle => CullWhen::Idle,
            CullWhenFlag::Demand => CullWhen::Demand,
        },
        respect_activity: args.cull_respect_activity,
        targets,
        ..CullPolicy::default()
    })
}

/// The culling configuration from the command line.
pub(super) fn cull_config(args: &CullArgs, ledger: &Policy) -> Result<CullConfig, AppError> {
    // Resolved once: the Lease and a kill switch named without a namespace live here.
    let lease_namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(crate::cull::own_namespace);
    Ok(CullConfig {
        mode: cull_mode(args.mode),
        policy: cull_policy(&args.policy, ledger)?,
        namespace_selector: args
            .cull_namespace_selector
            .clone()
            .filter(|s| !s.trim().is_empty()),
        lease_name: args.lease_name.clone(),
        kill_switch: args
            .cull_kill_switch
            .as_ref()
            .map(|k| k.resolve(&lease_namespace)),
        lease_namespace: Some(lease_namespace),
        notice_webhook: args.cull_notice_webhook_url_file.clone().map(|file| {
            let format = match args.cull_notice_webhook_format {
                WebhookFormatFlag::Alertmanager => {
                    crate::cull::webhook::WebhookFormat::Alertmanager
                }
                WebhookFormatFlag::Slack => crate::cull::webhook::WebhookFormat::Slack,
            };
            (file, format)
        }),
        ..CullConfig::default()
    })
}
