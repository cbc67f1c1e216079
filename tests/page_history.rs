//! The page's history chart in a real headless Chromium (Debian's package), served by the real
//! router (`export::server::router_with_history`) with the real Prometheus history source
//! (`app::prometheus_history`) over a REAL Prometheus 2.42 holding a week of gpu-ledger's
//! counters (`promtool tsdb create-blocks-from openmetrics`):
//!
//! * with data: a chart per span (24 h, 7 d), claimed / busy / idle lines, broken where
//!   gpu-ledger was down (no data is not zero), the namespace filter's lines on `?namespace=`,
//!   a sharded namespace's shards added and its HA replicas counted once;
//! * with Prometheus unreachable: no chart, "history unavailable: <why>", and the rest of the
//!   page still renders.
//!
//! SYNTHETIC counters shaped like gpu-ledger's exposition (docs/metrics.md). Never skips: a
//! missing Prometheus or Chromium fails with what to install.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use chrono::Utc;
use gpu_ledger::export::history::HistoryState;
use gpu_ledger::export::server::{self, AppState, Probes};
use gpu_ledger::export::tls;
use gpu_ledger::ledger::Ledger;
use gpu_ledger::ledger::accounting::Snapshot;
use gpu_ledger::usage::prom::{PromClient, PromConfig};
use gpu_ledger_testkit::Prometheus;
use gpu_ledger_testkit::chromium::Browser;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const SCRAPE: i64 = 300;
const HOUR: i64 = 3_600;
const WAIT: Duration = Duration::from_secs(60);

struct AlwaysLive;

impl Probes for AlwaysLive {
    fn live(&self) -> Result<(), String> {
        Ok(())
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

fn client(url: &str) -> Arc<PromClient> {
    Arc::new(
        PromClient::new(PromConfig::new(
            url.parse().expect("prometheus url"),
            Duration::from_secs(30),
        ))
        .expect("client"),
    )
}

/// The real router with an empty ledger and `history`, plain HTTP on a loopback port.
async fn serve(history: HistoryState) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = AppState {
        registry: prometheus::Registry::new(),
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(Ledger::empty(
            Utc::now(),
        )))),
        probes: Arc::new(AlwaysLive),
        page: Arc::new(gpu_ledger::app::page::HtmlPage),
    };
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tls::serve(
            listener,
            server::router_with_history(state, history),
            None,
            tls::Limits::default(),
            stop,
        )
        .await
    });
    (format!("http://{addr}"), cancel)
}

/// A week of counters every 5 minutes up to an hour ago, with gpu-ledger down from 10 h to 8 h
/// ago: team-a holds 2 GPUs (1 busy, 1 idle), team-b half a GPU (a time-slice share), busy.
fn week(now: i64) -> String {
    let end = now - now.rem_euclid(SCRAPE) - HOUR;
    let start = end - 7 * 24 * HOUR - HOUR;
    let times: Vec<i64> = (start..=end)
        .step_by(SCRAPE as usize)
        .filter(|t| !(end - 9 * HOUR..end - 7 * HOUR).contains(t))
        .collect();
    let mut families: Vec<(&str, String)> = Vec::new();
    let mut series = |name: &'static str, labels: &str, rate: f64| {
        let mut body = String::new();
        for t in &times {
            writeln!(body, "{name}{{{labels}}} {} {t}", rate * (t - start) as f64).expect("write");
        }
        match families.iter_mut().find(|(n, _)| *n == name) {
            Some((_, b)) => b.push_str(&body),
            None => families.push((name, body)),
        }
    };
    series(
        "gpu_ledger_gpu_seconds_claimed_total",
        "namespace=\"team-a\"",
        2.0,
    );
    series(
        "gpu_ledger_gpu_seconds_claimed_total",
        "namespace=\"team-b\"",
        0.5,
    );
    series(
        "gpu_ledger_gpu_seconds_idle_total",
        "namespace=\"team-a\"",
        1.0,
    );
    series(
        "gpu_ledger_gpu_seconds_idle_total",
        "namespace=\"team-b\"",
        0.0,
    );
    series(
        "gpu_ledger_gpu_seconds_by_model_total",
        "namespace=\"team-a\",model=\"NVIDIA-A100-SXM4-80GB\",activity=\"busy\"",
        1.0,
    );
    series(
        "gpu_ledger_gpu_seconds_by_model_total",
        "namespace=\"team-a\",model=\"NVIDIA-A100-SXM4-80GB\",activity=\"idle\"",
        1.0,
    );
    series(
        "gpu_ledger_gpu_seconds_by_model_total",
        "namespace=\"team-b\",model=\"NVIDIA-RTX-A1000\",activity=\"busy\"",
        0.5,
    );
    // team-s under `--total-shards 2`: each shard counts half a GPU of it (the pods on its own
    // nodes), shard 0 run by two HA replicas that export the same numbers. It held 1 GPU: the
    // shards add, the replicas count once.
    for (labels, rate) in [
        ("namespace=\"team-s\",shard=\"0\",instance=\"a\"", 0.5),
        ("namespace=\"team-s\",shard=\"0\",instance=\"b\"", 0.5),
        ("namespace=\"team-s\",shard=\"1\",instance=\"c\"", 0.5),
    ] {
        series("gpu_ledger_gpu_seconds_claimed_total", labels, rate);
    }
    let mut out = String::new();
    for (name, body) in families {
        writeln!(out, "# TYPE {name} gauge").expect("write");
        out.push_str(&body);
    }
    out.push_str("# EOF\n");
    out
}

/// team-s's history: at most and mostly 1 GPU (a step at the data's edge holds less), its two
/// shards' halves added (not 0.5) and shard 0's two HA replicas counted once (not 1.5).
#[track_caller]
fn shards_added_replicas_once(history: &Value) {
    let sharded: Vec<f64> = history["namespaces"]["team-s"]["claimed"]
        .as_array()
        .expect("team-s claimed")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(
        sharded.iter().filter(|v| (*v - 1.0).abs() < 1e-6).count() > sharded.len() / 2
            && sharded.iter().all(|v| *v <= 1.0 + 1e-6),
        "two shards' halves added, shard 0's HA replicas once: {sharded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_chart_with_data_and_without_prometheus() {
    let prom = Prometheus::start_with_backfill(&week(Utc::now().timestamp()))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs a real Prometheus 2.42 and promtool (`apt-get install prometheus`): {e:#}"
            )
        });
    let (origin, stop) = serve(HistoryState::new(Some(
        gpu_ledger::app::prometheus_history(client(prom.url())),
    )))
    .await;

    // The API: per namespace and cluster, in GPU equivalents, no data where gpu-ledger was down.
    let day: Value = reqwest::get(format!("{origin}/api/v1/history?range=24h"))
        .await
        .expect("GET history")
        .json()
        .await
        .expect("history JSON");
    assert_eq!(day["available"], true, "{day:#}");
    let claimed = day["cluster"]["claimed"]
        .as_array()
        .expect("cluster claimed");
    let values: Vec<f64> = claimed.iter().filter_map(Value::as_f64).collect();
    assert!(
        values.iter().any(|v| (v - 3.5).abs() < 1e-6),
        "2 + 0.5 + 1 GPUs held: {claimed:?}"
    );
    shards_added_replicas_once(&day);
    assert!(
        claimed.iter().filter(|v| v.is_null()).count() >= 4,
        "the 2 h outage is no data, not 0: {claimed:?}"
    );
    let busy_b: Vec<f64> = day["namespaces"]["team-b"]["busy"]
        .as_array()
        .expect("team-b busy")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(
        busy_b.iter().any(|v| (v - 0.5).abs() < 1e-6),
        "a time-slice share counts 1/2: {busy_b:?}"
    );
    let bad = reqwest::get(format!("{origin}/api/v1/history?range=1y"))
        .await
        .expect("GET history");
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);

    let logs = tempfile::tempdir().expect("tmp");
    let browser = Browser::launch(logs.path())
        .unwrap_or_else(|e| panic!("headless chromium (apt-get install chromium): {e:#}"));
    let page = browser.page(1280, 900, true).expect("tab");
    page.navigate(&format!("{origin}/")).expect("load /");
    page.wait_for(
        "document.getElementById('history').getAttribute('data-state') === 'drawn'",
        WAIT,
    )
    .expect("the chart is drawn");
    let drawn = page
        .evaluate(
            "Array.from(document.querySelectorAll('#history figure')).map(f => ({
               range: f.getAttribute('data-range'),
               caption: f.querySelector('figcaption').innerText,
               claimed: f.querySelectorAll('polyline[data-series=claimed]').length,
               busy: f.querySelectorAll('polyline[data-series=busy]').length,
               idle: f.querySelectorAll('polyline[data-series=idle]').length,
               top: f.querySelector('svg text').textContent}))",
        )
        .expect("figures");
    let figures = drawn.as_array().expect("figures");
    assert_eq!(figures.len(), 2, "24 h and 7 d: {drawn:#}");
    let day_fig = &figures[0];
    assert_eq!(day_fig["range"], "24h");
    assert_eq!(
        day_fig["claimed"], 2,
        "the outage breaks the line in two: {drawn:#}"
    );
    assert!(day_fig["busy"].as_u64() >= Some(1) && day_fig["idle"].as_u64() >= Some(1));
    assert_eq!(day_fig["top"], "3.5 GPUs", "cluster scale: {drawn:#}");
    assert!(
        day_fig["caption"]
            .as_str()
            .is_some_and(|c| c.contains("cluster")),
        "{drawn:#}"
    );
    assert!(
        page.evaluate("document.getElementById('history-note').hidden")
            .expect("note")
            == Value::Bool(true)
    );

    let ns_page = browser.page(1280, 900, true).expect("tab");
    ns_page
        .navigate(&format!("{origin}/?namespace=team-b"))
        .expect("load /?namespace=team-b");
    ns_page
        .wait_for(
            "document.getElementById('history').getAttribute('data-state') === 'drawn'",
            WAIT,
        )
        .expect("the namespace chart is drawn");
    let top = ns_page
        .evaluate("document.querySelector('#history figure figcaption').innerText + ' / ' + document.querySelector('#history figure svg text').textContent")
        .expect("caption");
    assert_eq!(
        top, "Last 24 h · team-b / 1 GPUs",
        "team-b's lines, scaled to at least 1"
    );
    stop.cancel();

    // Prometheus unreachable: a closed port. The page says why and works otherwise.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let dead_url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let (origin, stop) = serve(HistoryState::new(Some(
        gpu_ledger::app::prometheus_history(client(&dead_url)),
    )))
    .await;
    let page = browser.page(1280, 900, true).expect("tab");
    page.navigate(&format!("{origin}/")).expect("load /");
    page.wait_for(
        "document.getElementById('history').getAttribute('data-state') === 'unavailable'",
        WAIT,
    )
    .expect("the chart says it is unavailable");
    let note = page
        .evaluate("document.getElementById('history-note').innerText")
        .expect("note");
    assert!(
        note.as_str()
            .is_some_and(|n| n.starts_with("history unavailable: prometheus transport error")),
        "{note}"
    );
    assert_eq!(
        page.evaluate("document.querySelectorAll('#history figure').length")
            .expect("figures"),
        0
    );
    assert_eq!(
        page.evaluate("document.body.getAttribute('data-rendered')")
            .expect("rendered"),
        "script",
        "the rest of the page renders"
    );
    stop.cancel();
}
