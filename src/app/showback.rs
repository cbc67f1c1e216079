//! `gpu-ledger showback`: asks Prometheus for gpu-ledger's counters over a period (a handful
//! of queries, each answered in one evaluation) and prints what `report::showback` makes of them.
//! Also the page's history source (`export::history`): the same counters over 24 h and 7 d.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::AppError;
use crate::config::{ShowbackArgs, ShowbackOutput};
use crate::export::history::{Fetch, HistorySource, Points, Raw, Span};
use crate::report::showback::{
    self, Grouping, Inputs, ModelSeconds, NO_VALUE, Period, Prices, ksm_label,
};
use crate::usage::prom::queries::duration;
use crate::usage::prom::{PromClient, PromError, Sample};

/// Largest price file read.
const MAX_PRICE_FILE_BYTES: u64 = 1 << 20;

/// `metric{matchers}` with the client's extra matchers (`--prometheus-selector`).
fn selector(name: &str, client: &PromClient) -> String {
    format!("{name}{{{}}}", client.matchers().trim_start_matches(','))
}

fn label<'a>(s: &'a Sample, name: &str) -> &'a str {
    s.labels.get(name).map_or("", String::as_str)
}

/// `max by (namespace) (increase(counter[period]))`: restart-safe, and replicas of an HA
/// deployment (each exporting the same counters) count once, as the recording rules do.
async fn increase_by_namespace(
    client: &PromClient,
    counter: &str,
    period: &Period,
) -> Result<BTreeMap<String, f64>, PromError> {
    let q = format!(
        "max by (namespace) (increase({}[{}]))",
        selector(counter, client),
        duration(period.until - period.since)
    );
    Ok(client
        .instant(&q, period.until)
        .await?
        .into_iter()
        .map(|s| (label(&s, "namespace").to_string(), s.value))
        .collect())
}

/// Namespace → group from kube-state-metrics' `metric` (`kube_namespace_labels` or
/// `kube_namespace_annotations`) and its label `key`: the value of the series seen last in the
/// period (a namespace relabelled mid-month goes to its newest group).
async fn groups_from_ksm(
    client: &PromClient,
    metric: &str,
    key: &str,
    period: &Period,
    resolution: chrono::Duration,
) -> Result<BTreeMap<String, String>, PromError> {
    let q = format!(
        "max by (namespace, {key}) (max_over_time(timestamp({})[{}:{}]))",
        selector(metric, client),
        duration(period.until - period.since),
        duration(resolution)
    );
    let mut seen: BTreeMap<String, (f64, String)> = BTreeMap::new();
    for s in client.instant(&q, period.until).await? {
        let value = match label(&s, key) {
            "" => NO_VALUE.to_string(),
            v => v.to_string(),
        };
        let e = seen
            .entry(label(&s, "namespace").to_string())
            .or_insert((f64::NEG_INFINITY, String::new()));
        if s.value > e.0 {
            *e = (s.value, value);
        }
    }
    Ok(seen.into_iter().map(|(ns, (_, g))| (ns, g)).collect())
}

/// Reads everything the showback needs from Prometheus.
async fn inputs(
    client: &PromClient,
    period: &Period,
    grouping: &Grouping,
    resolution: chrono::Duration,
) -> Result<Inputs, PromError> {
    let range = duration(period.until - period.since);
    let step = duration(resolution);
    let claimed =
        increase_by_namespace(client, "gpu_ledger_gpu_seconds_claimed_total", period).await?;
    let idle = increase_by_namespace(client, "gpu_ledger_gpu_seconds_idle_total", period).await?;
    let q = format!(
        "max by (namespace, model, activity) (increase({}[{range}]))",
        selector("gpu_ledger_gpu_seconds_by_model_total", client)
    );
    let by_model = client
        .instant(&q, period.until)
        .await?
        .into_iter()
        .map(|s| ModelSeconds {
            namespace: label(&s, "namespace").to_string(),
            model: label(&s, "model").to_string(),
            activity: label(&s, "activity").to_string(),
            seconds: s.value,
        })
        .collect();
    // The most each namespace held in each step, summed per group in `report::showback`.
    let q = format!(
        "(max by (namespace) (max_over_time({}[{step}])))[{range}:{step}]",
        selector("gpu_ledger_namespace_gpus_claimed", client)
    );
    let held = client
        .instant_matrix(&q, period.until)
        .await?
        .into_iter()
        .map(|s| {
            (
                label(&s, "namespace").to_string(),
                s.time.round() as i64,
                s.value,
            )
        })
        .collect();
    // gpu-ledger reports `last_refresh_timestamp_seconds` whenever it runs, GPUs or not.
    let q = format!(
        "(group(count_over_time({{__name__=~\"gpu_ledger_last_refresh_timestamp_seconds|gpu_ledger_gpu_seconds_claimed_total\"{}}}[{step}])))[{range}:{step}]",
        client.matchers()
    );
    let reported: BTreeSet<i64> = client
        .instant_matrix(&q, period.until)
        .await?
        .into_iter()
        .map(|s| s.time.round() as i64)
        .collect();
    let groups = match grouping {
        Grouping::Namespace => BTreeMap::new(),
        Grouping::Label(key) => {
            groups_from_ksm(
                client,
                "kube_namespace_labels",
                &ksm_label("label_", key),
                period,
                resolution,
            )
            .await?
        }
        Grouping::ProfileOwner => {
            groups_from_ksm(
                client,
                "kube_namespace_annotations",
                &ksm_label("annotation_", "owner"),
                period,
                resolution,
            )
            .await?
        }
    };
    Ok(Inputs {
        claimed,
        idle,
        by_model,
        held,
        reported,
        resolution,
        groups,
    })
}

fn prices(args: &ShowbackArgs) -> Result<Prices, AppError> {
    let text = match (&args.price, &args.price_file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => {
            let len = std::fs::metadata(path)
                .map_err(|e| AppError::Config(format!("--price-file {}: {e}", path.display())))?
                .len();
            if len > MAX_PRICE_FILE_BYTES {
                return Err(AppError::Config(format!(
                    "--price-file {}: {len} bytes, more than {MAX_PRICE_FILE_BYTES}",
                    path.display()
                )));
            }
            std::fs::read_to_string(path)
                .map_err(|e| AppError::Config(format!("--price-file {}: {e}", path.display())))?
        }
        (None, None) => String::new(),
    };
    Prices::parse(&text).map_err(|e| AppError::Config(e.to_string()))
}

fn period(args: &ShowbackArgs, now: DateTime<Utc>) -> Result<Period, AppError> {
    let p = match (&args.month, args.since) {
        (Some(m), _) => Period::month(m, now),
        (None, Some(since)) => Period::new(since, args.until.unwrap_or(now), now),
        (None, None) => {
            return Err(AppError::Config("showback needs --month or --since".into()));
        }
    };
    p.map_err(|e| AppError::Config(e.to_string()))
}

/// Runs `gpu-ledger showback`.
pub async fn showback(args: ShowbackArgs) -> Result<(), AppError> {
    let now = Utc::now();
    let period = period(&args, now)?;
    let prices = prices(&args)?;
    let grouping = match (&args.group_by_label, args.group_by_profile_owner) {
        (Some(key), _) if key.trim().is_empty() => {
            return Err(AppError::Config(
                "--group-by-label needs a label key".into(),
            ));
        }
        (Some(key), _) => Grouping::Label(key.trim().to_string()),
        (None, true) => Grouping::ProfileOwner,
        (None, false) => Grouping::Namespace,
    };
    // Prometheus evaluates at most 11,000 points per series: a longer period gets a coarser step.
    let min_step = chrono::Duration::seconds(((period.seconds() / 10_000.0).ceil() as i64).max(1));
    let resolution = args.resolution.max(min_step);
    let client = super::prometheus_client(&args.prometheus)?.ok_or_else(|| {
        AppError::Config("showback reads gpu-ledger's counters: set --prometheus-url".into())
    })?;
    let inputs = inputs(&client, &period, &grouping, resolution)
        .await
        .map_err(AppError::Prometheus)?;
    let result = showback::compute(&period, &grouping, &prices, &inputs)
        .map_err(|e| AppError::Config(e.to_string()))?;
    for g in &result.gaps {
        tracing::warn!(
            start = %g.start.to_rfc3339(),
            seconds = g.seconds,
            "gap in gpu-ledger's counters: use there is unknown, not zero"
        );
    }
    if !result.unpriced_models.is_empty() {
        tracing::warn!(
            models = %result.unpriced_models.join(", "),
            "GPU models without a price: cost unknown where they held GPU-hours"
        );
    }
    let text = match args.output {
        ShowbackOutput::Table => showback::render_table(&result, !prices.is_empty()),
        ShowbackOutput::Csv => showback::render_csv(&result),
        ShowbackOutput::Json => showback::render_json(&result)
            .map_err(|e| AppError::Config(format!("encoding the showback as JSON: {e}")))?,
    };
    if let Some(path) = &args.output_file {
        return std::fs::write(path, text.as_bytes())
            .map_err(|e| AppError::OutputFile(format!("--output-file {}", path.display()), e));
    }
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(AppError::Output(e)),
        _ => Ok(()),
    }
}

/// The page's history from gpu-ledger's counters: per namespace and step, the mean GPUs
/// claimed, busy and idle (`rate()` of the GPU-second counters over the step).
struct PromHistory {
    client: Arc<PromClient>,
}

impl PromHistory {
    async fn points(
        &self,
        inner: &str,
        span: Span,
        now: DateTime<Utc>,
    ) -> Result<Points, PromError> {
        let q = format!(
            "({inner})[{}:{}]",
            duration(span.length()),
            duration(span.step())
        );
        Ok(self
            .client
            .instant_matrix(&q, now)
            .await?
            .into_iter()
            .map(|s| {
                (
                    label(&s, "namespace").to_string(),
                    s.time.round() as i64,
                    s.value,
                )
            })
            .collect())
    }

    async fn raw(&self, span: Span, now: DateTime<Utc>) -> Result<Raw, PromError> {
        let step = duration(span.step());
        let c = &*self.client;
        let claimed = format!(
            "max by (namespace) (rate({}[{step}]))",
            selector("gpu_ledger_gpu_seconds_claimed_total", c)
        );
        let idle = format!(
            "max by (namespace) (rate({}[{step}]))",
            selector("gpu_ledger_gpu_seconds_idle_total", c)
        );
        let busy = format!(
            "sum by (namespace) (max by (namespace, model, activity) (rate(gpu_ledger_gpu_seconds_by_model_total{{activity=\"busy\"{}}}[{step}])))",
            c.matchers()
        );
        Ok(Raw {
            claimed: self.points(&claimed, span, now).await?,
            busy: self.points(&busy, span, now).await?,
            idle: self.points(&idle, span, now).await?,
        })
    }
}

impl HistorySource for PromHistory {
    fn fetch(&self, span: Span, now: DateTime<Utc>) -> Fetch<'_> {
        // The chain, since the page shows it: a transport error's cause is its source.
        Box::pin(async move {
            self.raw(span, now)
                .await
                .map_err(|e| crate::telemetry::error_chain(&e))
        })
    }
}

/// The page's history source over `client`.
pub fn prometheus_history(client: Arc<PromClient>) -> Arc<dyn HistorySource> {
    Arc::new(PromHistory { client })
}
