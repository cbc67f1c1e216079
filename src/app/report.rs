//! `gpu-ledger report`: one ledger, from dump files or from a live cluster, rendered once.
//!
//! Machine-readable output stays machine-readable: with `-o json|yaml|metrics` nothing but
//! the document reaches stdout; warnings (and, for `-o metrics`, the culling plan's text) go to
//! stderr.

use std::io::Write;

use chrono::{DateTime, Utc};

use super::offline::{self, OfflineInput};
use super::{AppError, cull_policy, kube_client, live_settings, prom_client};
use crate::claims;
use crate::config::{Output, ReportArgs};
use crate::cull::plan::Plan;
use crate::cull::render::{CullJson, plan_metrics};
use crate::export::{self, Snapshot};
use crate::ledger::usage::Usage;
use crate::ledger::{self, Ledger, Policy};
use crate::report::{self, html};
use crate::usage::discover::{self, ServiceProxy};
use crate::usage::live::LiveUsage;
use crate::usage::prom::PromClient;

/// `gpu-ledger report`.
pub async fn report(args: ReportArgs) -> Result<(), AppError> {
    let policy = args.ledger.policy();
    let mut ledger = if args.input.offline() {
        offline_ledger(&args, &policy)?
    } else {
        live_ledger(&args, &policy).await?
    };
    if let Some(ns) = args.namespace.as_deref() {
        only_namespace(&mut ledger, ns);
    }
    let plan = args.cull_dry_run.then(|| {
        crate::cull::plan::plan(
            &ledger,
            &cull_policy(&args.cull, &policy),
            ledger.generated_at,
        )
    });
    let written = write_report(args.output, &ledger, plan.as_ref());
    match written {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(AppError::Output),
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
        i.paths = claims::files::DumpPaths {
            pods: files.pods.clone().unwrap_or_default(),
            nodes: files.nodes.clone().unwrap_or_default(),
            notebooks: files.notebooks.clone(),
            quotas: files.quotas.clone(),
            statefulsets: files.statefulsets.clone(),
            resource_claims: None,
            resource_slices: None,
            device_classes: None,
            resource_flavors: None,
            cluster_queues: None,
            local_queues: None,
            workloads: None,
        };
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

/// `-n NAMESPACE`: only that namespace's pods and namespace row. Nodes and unclaimed busy
/// devices belong to no namespace and stay whole (a node's free GPUs count every pod).
fn only_namespace(ledger: &mut Ledger, namespace: &str) {
    ledger.pods.retain(|p| p.namespace == namespace);
    ledger.namespaces.retain(|n| n.namespace == namespace);
}

fn listed(v: &[String]) -> Vec<String> {
    v.iter().filter(|s| !s.is_empty()).cloned().collect()
}

/// The ledger from the live API (one list per resource) and Prometheus, as of `--at` or now.
async fn live_ledger(args: &ReportArgs, policy: &Policy) -> Result<Ledger, AppError> {
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
    let claims =
        claims::list::list_claims(&client, &policy.names, &listed(&args.ledger.namespaces)).await?;
    let at = args.at.unwrap_or_else(Utc::now);
    let usage = live_usage(Some(prom), &args.ledger, at).await;
    Ok(ledger::build(&claims, &usage, at, policy))
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
    let prom = super::prometheus_client(&prometheus)?
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
) -> Usage {
    let mut source = LiveUsage::new(prom, live_settings(args));
    let fetched = source.fetch_at(at).await;
    if let Some(e) = &fetched.error {
        warn_unavailable(e);
    }
    fetched.usage
}

fn warn_unavailable(e: &dyn std::error::Error) {
    eprintln!(
        "warning: prometheus did not answer ({}); utilisation is unknown",
        crate::telemetry::error_chain(e)
    );
}

/// The JSON document of `--cull-dry-run`: the ledger's fields in their order, then `cull`.
#[derive(serde::Serialize)]
struct WithCull<'a> {
    #[serde(flatten)]
    ledger: &'a Ledger,
    cull: CullJson,
}

fn write_report(output: Output, ledger: &Ledger, plan: Option<&Plan>) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match output {
        Output::Table | Output::Wide => {
            if output == Output::Wide {
                report::render_wide(ledger, &mut out)?;
            } else {
                report::render_table(ledger, &mut out)?;
            }
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
