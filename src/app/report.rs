//! `gpu-ledger report`: one ledger, from dump files or from a live cluster, rendered once.
//!
//! Machine-readable output stays machine-readable: with `-o json|yaml|metrics` nothing but
//! the document reaches stdout; warnings (and, for `-o metrics`, the culling plan's text) go to
//! stderr.

use std::io::Write;

use chrono::{DateTime, Utc};

use super::clients::{kube_client, prom_client, prometheus_client};
use super::error::AppError;
use super::offline::{self, OfflineInput};
use super::settings::{cull_policy, live_settings};
use crate::claims;
use crate::claims::kinds;
use crate::config::{Output, ReportArgs};
use crate::cull::plan::Plan;
use crate::cull::render::{CullJson, plan_metrics};
use crate::export;
use crate::ledger::accounting::Snapshot;
use crate::ledger::usage::Usage;
use crate::ledger::{self, Ledger, Policy};
use crate::report::{self, html};
use crate::usage::discover::{self, ServiceProxy};
use crate::usage::live::LiveUsage;
use crate::usage::prom::{PromClient, PromError};

/// `gpu-ledger report`.
pub async fn report(args: ReportArgs) -> Result<(), AppError> {
    let policy = args.ledger.policy();
    // Live, why Prometheus could not be used: the report is still written (the claims are
    // true, utilisation shows as unknown), then the exit code says it is incomplete.
    let (mut ledger, usage_error) = if args.input.offline() {
        (offline_ledger(&args, &policy)?, None)
    } else {
        live_ledger(&args, &policy).await?
    };
    if let Some(ns) = args.namespace.as_deref() {
        only_namespace(&mut ledger, ns);
        warn_if_empty(&ledger, ns);
    }
    let plan = if args.cull_dry_run {
        Some(crate::cull::plan::plan(
            &ledger,
            &cull_policy(&args.cull, &policy)?,
            ledger.generated_at,
        ))
    } else {
        None
    };
    let written = write_report(
        args.output,
        &ledger,
        args.namespace.as_deref(),
        plan.as_ref(),
    );
    match written {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(AppError::Output),
    }?;
    // Exit 3 when Prometheus could not be reached, 1 when it answered with an error
    // (config::EXIT_CODES), never 0 for a report without utilisation.
    match usage_error {
        Some(e) => Err(AppError::UsageUnavailable(e)),
        None => Ok(()),
    }
}

/// The ledger from dump files (`--from DIR` or one flag per file).
fn offline_ledger(args: &ReportArgs, policy: &Policy) -> Result<Ledger, AppError> {
    let files = &args.input;
    let mut input = if let Some(dir) = &files.from {
        check_dir(dir)?;
        OfflineInput::from_dir(dir)
    } else {
        let mut i = OfflineInput::from_dir(std::path::Path::new("."));
        i.paths = claims::files::DumpPaths::default()
            .with(&kinds::PODS, Some(files.pods.clone().unwrap_or_default()))
            .with(&kinds::NODES, Some(files.nodes.clone().unwrap_or_default()))
            .with(&kinds::NOTEBOOKS, files.notebooks.clone())
            .with(&kinds::QUOTAS, files.quotas.clone())
            .with(&kinds::STATEFULSETS, files.statefulsets.clone());
        i.dcgm = files.dcgm.clone().unwrap_or_default();
        i
    };
    input.at = args.at;
    input.window = args.ledger.window;
    input.scrape_interval = args.ledger.scrape_interval;
    input.scheme = args.ledger.label_scheme;
    input.policy = policy.clone();
    input.namespaces = listed(&args.ledger.namespaces);
    input.max_dump_bytes = args.max_dump_size;
    input
        .selector
        .clone_from(&args.ledger.prometheus.prometheus_selector);
    let offline = offline::load(&input, Utc::now())?;
    if let Some(ns) = args.namespace.as_deref()
        && !offline.namespaces.contains(ns)
    {
        let source = files.from.as_ref().map_or_else(
            || "the dump files".to_string(),
            |d| format!("the dump in {}", d.display()),
        );
        return Err(AppError::Input(format!(
            "-n {ns:?}: namespace {ns:?} is not in {source} (no object of it); namespaces in \
             it: {}",
            offline
                .namespaces
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for w in &offline.warnings {
        eprintln!("warning: {w}");
    }
    Ok(offline.ledger)
}

/// A `--from` that is no directory is named as such, before any file in it is looked for.
fn check_dir(dir: &std::path::Path) -> Result<(), AppError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(AppError::Input(format!(
            "--from {}: not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(AppError::Input(format!(
            "--from {}: no such directory",
            dir.display()
        ))),
        Err(e) => Err(AppError::Input(format!(
            "--from {}: cannot read: {e}",
            dir.display()
        ))),
    }
}

/// `-n NAMESPACE`: only that namespace's pods, namespace row, quota rows, DRA claims outside
/// every quota, and the "who could run" rows of its pending pods. Nodes, unclaimed busy devices
/// and Kueue's ClusterQueues belong to no namespace and stay whole (a node's free GPUs count
/// every pod).
fn only_namespace(ledger: &mut Ledger, namespace: &str) {
    ledger.pods.retain(|p| p.namespace == namespace);
    ledger.namespaces.retain(|n| n.namespace == namespace);
    ledger.reclaim.retain(|r| r.pending.namespace == namespace);
    ledger.quotas.retain(|q| q.namespace == namespace);
    ledger
        .dra_claims_unquotaed
        .retain(|c| c.namespace == namespace);
}

/// After [`only_namespace`]: a namespace that exists but has no GPU pod and no GPU quota is
/// said on stderr, so an empty report is not mistaken for a mistyped name (that one is an
/// error before this).
fn warn_if_empty(ledger: &Ledger, namespace: &str) {
    if ledger.pods.is_empty() && ledger.namespaces.is_empty() {
        eprintln!(
            "warning: namespace {namespace:?} has no GPU pod and no GPU quota: nothing to report"
        );
    }
}

fn listed(v: &[String]) -> Vec<String> {
    v.iter().filter(|s| !s.is_empty()).cloned().collect()
}

/// The ledger from the live API (one list per resource) and Prometheus, as of `--at` or now,
/// and why Prometheus could not be used, if it could not.
async fn live_ledger(
    args: &ReportArgs,
    policy: &Policy,
) -> Result<(Ledger, Option<PromError>), AppError> {
    // Configuration first: a refused Prometheus setting fails before any API call.
    let prom = prom_client(&args.ledger)?;
    let client = kube_client(&args.kube).await?;
    // Without --prometheus-url: the cluster's own Prometheus through the API server's service
    // proxy; the proxy lives until the report is built.
    let (prom, _proxy) = if let Some(prom) = prom {
        (prom, None)
    } else {
        let (prom, proxy) = discovered_prometheus(&client, args).await?;
        (prom, Some(proxy))
    };
    if let Some(ns) = args.namespace.as_deref() {
        check_namespace_exists(&client, ns).await?;
    }
    let claims = claims::list::list_claims(
        &client,
        &policy.names,
        &listed(&args.ledger.namespaces),
        args.ledger.kueue_config_map.resolve().as_ref(),
    )
    .await?;
    let at = args.at.unwrap_or_else(Utc::now);
    let (usage, error) = live_usage(Some(prom), &args.ledger, at).await;
    Ok((ledger::build(&claims, &usage, at, policy), error))
}

/// `-n NS` live: a namespace the API does not know is an error naming it (a typo would
/// otherwise print an empty report). A user who may not read namespaces is warned that the
/// name could not be checked.
async fn check_namespace_exists(client: &kube::Client, namespace: &str) -> Result<(), AppError> {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    match namespaces.get_metadata_opt(namespace).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(AppError::Input(format!(
            "-n {namespace:?}: namespace {namespace:?} not found by the Kubernetes API"
        ))),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            eprintln!(
                "warning: cannot check that namespace {namespace:?} exists (reading namespaces \
                 is forbidden); an empty report may mean a mistyped name"
            );
            Ok(())
        }
        Err(e) => Err(AppError::Kube(e)),
    }
}

/// The Prometheus Service named by `--prometheus-service`, else the best match in the
/// allow-listed namespaces, behind a loopback proxy; which one is said on stderr (with the
/// other matches, if any).
async fn discovered_prometheus(
    client: &kube::Client,
    report: &ReportArgs,
) -> Result<(std::sync::Arc<PromClient>, ServiceProxy), AppError> {
    let args = &report.ledger;
    let found = match &report.prometheus_service {
        Some(service) => vec![discover::named(client, service).await?],
        None => discover::find(client, &report.prometheus_namespace).await?,
    };
    let Some((best, rest)) = found.split_first() else {
        return Err(discover::DiscoverError::NoneFound {
            services: 0,
            namespaces: report.prometheus_namespace.clone(),
            forbidden: Vec::new(),
        }
        .into());
    };
    let others: Vec<String> = rest
        .iter()
        .map(|c| format!("{}/{}", c.namespace, c.name))
        .collect();
    let also = if others.is_empty() {
        String::new()
    } else {
        format!(
            " (also found: {}; --prometheus-url overrides)",
            others.join(", ")
        )
    };
    eprintln!(
        "using Prometheus {}/{} port {} ({}) through the API server's service proxy{also}",
        best.namespace, best.name, best.port, best.why
    );
    let proxy =
        ServiceProxy::start(client.clone(), best, &args.prometheus.prometheus_header).await?;
    let mut prometheus = args.prometheus.clone();
    prometheus.prometheus_url = Some(proxy.url.clone());
    // The proxy adds them to what it forwards; it passes on no header of the request.
    prometheus.prometheus_header.clear();
    let prom = prometheus_client(&prometheus)?
        .ok_or_else(|| AppError::Config("the discovered Prometheus gave no client".into()))?;
    Ok((prom, proxy))
}

/// One refresh of the live usage source as of `at`: the idle history rebuilt over the lookback,
/// then the window merged into it, exactly as `serve`'s first refresh (a report may ask for an
/// earlier instant).
async fn live_usage(
    prom: Option<std::sync::Arc<crate::usage::prom::PromClient>>,
    args: &crate::config::LedgerArgs,
    at: DateTime<Utc>,
) -> (Usage, Option<PromError>) {
    let mut source = LiveUsage::new(prom, live_settings(args));
    source.read_gpu_health(args.dcgm_health);
    let fetched = source.fetch_at(at).await;
    (fetched.usage, fetched.error)
}

/// The JSON document of `--cull-dry-run`: the ledger's fields in their order, then `cull`.
#[derive(serde::Serialize)]
struct WithCull<'a> {
    #[serde(flatten)]
    ledger: &'a Ledger,
    cull: CullJson,
}

/// Writes the report; `namespace` is `-n`'s (the ledger is already cut to it).
fn write_report(
    output: Output,
    ledger: &Ledger,
    namespace: Option<&str>,
    plan: Option<&Plan>,
) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match output {
        Output::Table | Output::Wide => {
            report::render_table_in(ledger, output == Output::Wide, namespace, &mut out)?;
            if let Some(plan) = plan {
                crate::cull::render_plan(plan, &mut out)?;
            }
        }
        Output::Json => match plan {
            Some(plan) => {
                let doc = WithCull {
                    ledger,
                    cull: CullJson::of(plan),
                };
                serde_json::to_writer_pretty(&mut out, &doc)?;
                writeln!(out)?;
            }
            None => report::render_json(ledger, &mut out)?,
        },
        Output::Metrics => {
            let mut text = export::render_snapshot(&Snapshot::new(ledger.clone()))
                .map_err(std::io::Error::other)?;
            if let Some(plan) = plan {
                text.push_str(&plan_metrics(plan).map_err(std::io::Error::other)?);
                // Which notebooks would stop is no metric: the plan's text goes to stderr.
                crate::cull::render_plan(plan, &mut std::io::stderr().lock())?;
            }
            out.write_all(text.as_bytes())?;
        }
        Output::Yaml => {
            // The JSON document's data, in the same field order (tests/cli.rs compares both).
            let text = match plan {
                Some(plan) => serde_saphyr::to_string(&WithCull {
                    ledger,
                    cull: CullJson::of(plan),
                }),
                None => serde_saphyr::to_string(ledger),
            }
            .map_err(std::io::Error::other)?;
            out.write_all(text.as_bytes())?;
        }
        Output::Html => {
            let page = html::render_page(ledger, &html::PageOptions::default());
            out.write_all(page.as_bytes())?;
            if let Some(plan) = plan {
                crate::cull::render_plan(plan, &mut std::io::stderr().lock())?;
            }
        }
    }
    out.flush()
}
