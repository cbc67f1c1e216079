//! `gpu-ledger report`: one ledger, from dump files or from a live cluster, rendered once.

use std::io::Write;

use chrono::Utc;
use kube::Client;

use super::offline::{self, OfflineInput};
use super::{AppError, cull_policy, live_settings, prom_client};
use crate::claims;
use crate::config::{Output, ReportArgs};
use crate::export::{self, Snapshot};
use crate::ledger::{self, Ledger, Policy};
use crate::report;
use crate::usage::live::LiveUsage;

/// `gpu-ledger report`.
pub async fn report(args: ReportArgs) -> Result<(), AppError> {
    let policy = args.ledger.policy();
    let ledger = if args.from.is_some() || args.pods.is_some() {
        offline_ledger(&args, &policy)?
    } else {
        live_ledger(&args, &policy).await?
    };
    let written = write_report(&args, &ledger, &policy);
    match written {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(AppError::Output),
    }
}

/// The ledger from dump files (`--from DIR` or one flag per file).
fn offline_ledger(args: &ReportArgs, policy: &Policy) -> Result<Ledger, AppError> {
    let mut input = if let Some(dir) = &args.from {
        OfflineInput::from_dir(dir)
    } else {
        let mut i = OfflineInput::from_dir(std::path::Path::new("."));
        i.paths = claims::files::DumpPaths {
            pods: args.pods.clone().unwrap_or_default(),
            nodes: args.nodes.clone().unwrap_or_default(),
            notebooks: args.notebooks.clone(),
            quotas: args.quotas.clone(),
            statefulsets: args.statefulsets.clone(),
            resource_claims: None,
            resource_slices: None,
            device_classes: None,
        };
        i.dcgm = args.dcgm.clone().unwrap_or_default();
        i
    };
    input.at = args.at;
    input.window = args.ledger.window;
    input.scrape_interval = args.ledger.scrape_interval;
    input.scheme = args.ledger.label_scheme;
    input.policy = policy.clone();
    let offline = offline::load(&input, Utc::now())?;
    for w in &offline.warnings {
        eprintln!("warning: {w}");
    }
    Ok(offline.ledger)
}

/// The ledger from the live API (one list per resource) and Prometheus.
async fn live_ledger(args: &ReportArgs, policy: &Policy) -> Result<Ledger, AppError> {
    if args.ledger.prometheus_url.is_none() {
        return Err(AppError::Config(
            "report needs --from DIR (or --pods/--nodes/--dcgm files), or a live cluster with --prometheus-url".into(),
        ));
    }
    let client = Client::try_default().await.map_err(AppError::Kube)?;
    let claims = claims::list::list_claims(&client, &policy.names, &args.ledger.namespaces).await?;
    let mut source = LiveUsage::new(prom_client(&args.ledger)?, live_settings(&args.ledger));
    let fetched = source.fetch().await;
    if let Some(e) = &fetched.error {
        eprintln!(
            "warning: prometheus did not answer ({}); utilisation is unknown",
            error_chain(e)
        );
    }
    Ok(ledger::build(&claims, &fetched.usage, Utc::now(), policy))
}

/// "a: b: c" for an error and its sources.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn write_report(args: &ReportArgs, ledger: &Ledger, policy: &Policy) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.output {
        Output::Table => report::table::render_table(ledger, &mut out)?,
        Output::Json => report::table::render_json(ledger, &mut out)?,
        Output::Metrics => {
            let text = export::render_snapshot(&Snapshot::new(ledger.clone()), &policy.names)
                .map_err(std::io::Error::other)?;
            out.write_all(text.as_bytes())?;
        }
    }
    if args.cull_dry_run {
        let plan = crate::cull::plan::plan(
            ledger,
            &cull_policy(&args.cull, policy),
            ledger.generated_at,
        );
        crate::cull::render_plan(&plan, &mut out)?;
    }
    out.flush()
}
