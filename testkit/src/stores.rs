//! Shared metrics stores holding several clusters' series, as users run them past one Prometheus:
//! real Thanos (sidecars + querier, built from its Go module by `scripts/build-thanos.sh`) and
//! real VictoriaMetrics (Debian's `victoria-metrics`, fed by Prometheus remote write).
//!
//! [`TwoClusters`] stands up the shape the multi-cluster tests need: per cluster one DCGM test
//! double ([`ReplayExporter`]) scraped by its own Debian Prometheus whose `external_labels` carry
//! `cluster: <name>`; Thanos sidecars over both Prometheus instances behind one `thanos query`;
//! and one VictoriaMetrics receiving both instances' remote writes (which add the external
//! labels, as in a real fleet).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::dcgm::ReplayExporter;
use crate::process::ChildGuard;
use crate::prometheus::Prometheus;
use crate::util::{answers_ready, free_port, free_ports};

/// The Thanos binary: `$THANOS_BIN`, else `scripts/build-thanos.sh`'s cache entry.
pub fn thanos_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("THANOS_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("THANOS_BIN={} is not a file", p.display());
    }
    let p = crate::bins::cache_root().join("thanos-0.41.0-slicelabels/bin/thanos");
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} not found: run scripts/build-thanos.sh (the README's test command does) or set THANOS_BIN",
            p.display()
        )
    }
}

/// `$VICTORIA_METRICS_BIN` or Debian's `/usr/bin/victoria-metrics`.
pub fn victoria_metrics_bin() -> Result<PathBuf> {
    let p = std::env::var_os("VICTORIA_METRICS_BIN")
        .map_or_else(|| PathBuf::from("/usr/bin/victoria-metrics"), PathBuf::from);
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} not found (apt-get install victoria-metrics, or set VICTORIA_METRICS_BIN)",
            p.display()
        )
    }
}

/// Waits until `url` answers 2xx with `expect` as its body (Thanos and VictoriaMetrics
/// both answer `OK`), failing early if the child exits.
async fn wait_ready(guard: &mut ChildGuard, url: &str, what: &str, expect: &str) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let timeout = crate::util::start_timeout();
    let start = Instant::now();
    loop {
        if let Some(status) = guard.try_exit_status() {
            bail!(
                "{what} exited ({status}); last 40 log lines:\n{}",
                guard.log_tail(40)
            );
        }
        if answers_ready(&client, url, expect).await {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!(
                "{what} not ready at {url} after {timeout:?}; last 40 log lines:\n{}",
                guard.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `thanos query` over one `thanos sidecar` per Prometheus.
pub struct Thanos {
    sidecars: Vec<Option<ChildGuard>>,
    query: ChildGuard,
    url: String,
    _dir: tempfile::TempDir,
}

impl Thanos {
    /// Starts a sidecar next to each of `prometheus` (each must carry `external_labels`, which
    /// the sidecar requires) and one querier over all sidecars, with Thanos' defaults: partial
    /// responses allowed (a store that does not answer is a warning, not an error).
    pub async fn start(prometheus: &[&Prometheus]) -> Result<Self> {
        let bin = thanos_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("gpu-ledger-thanos-")
            .tempdir()?;
        let mut sidecars = Vec::new();
        let mut endpoints = Vec::new();
        for (i, p) in prometheus.iter().enumerate() {
            let [grpc, http] = free_ports(2)?[..] else {
                bail!("two free ports");
            };
            let mut cmd = Command::new(&bin);
            cmd.arg("sidecar")
                .arg(format!("--prometheus.url={}", p.url()))
                .arg(format!("--grpc-address=127.0.0.1:{grpc}"))
                .arg(format!("--http-address=127.0.0.1:{http}"));
            let mut guard = ChildGuard::spawn(
                "thanos-sidecar",
                cmd,
                &dir.path().join(format!("sidecar-{i}.log")),
            )?;
            wait_ready(
                &mut guard,
                &format!("http://127.0.0.1:{http}/-/ready"),
                "thanos sidecar",
                "OK",
            )
            .await?;
            sidecars.push(Some(guard));
            endpoints.push(format!("127.0.0.1:{grpc}"));
        }
        let [http, grpc] = free_ports(2)?[..] else {
            bail!("two free ports");
        };
        let mut cmd = Command::new(&bin);
        cmd.arg("query")
            .arg(format!("--http-address=127.0.0.1:{http}"))
            .arg(format!("--grpc-address=127.0.0.1:{grpc}"));
        for e in &endpoints {
            cmd.arg(format!("--endpoint={e}"));
        }
        let mut query = ChildGuard::spawn("thanos-query", cmd, &dir.path().join("query.log"))?;
        let url = format!("http://127.0.0.1:{http}");
        wait_ready(&mut query, &format!("{url}/-/ready"), "thanos query", "OK").await?;
        Ok(Self {
            sidecars,
            query,
            url,
            _dir: dir,
        })
    }

    /// The querier's HTTP API base, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops sidecar `i` (its store then fails every query: Thanos answers partially).
    pub fn stop_sidecar(&mut self, i: usize) {
        if let Some(mut s) = self.sidecars.get_mut(i).and_then(Option::take) {
            s.terminate(Duration::from_secs(5));
        }
    }

    /// Last lines of the querier's and the sidecars' logs, and whether each sidecar still runs.
    pub fn log_tail(&mut self, n: usize) -> String {
        let mut out = format!("thanos query:\n{}", self.query.log_tail(n));
        for (i, s) in self.sidecars.iter_mut().enumerate() {
            if let Some(s) = s {
                let state = s
                    .try_exit_status()
                    .map_or_else(|| "running".to_string(), |st| format!("exited: {st}"));
                out.push_str(&format!(
                    "\nthanos sidecar {i} ({state}):\n{}",
                    s.log_tail(n)
                ));
            }
        }
        out
    }
}

/// A single-node VictoriaMetrics (Debian 1.79) on a free loopback port.
pub struct VictoriaMetrics {
    _guard: ChildGuard,
    url: String,
    _dir: tempfile::TempDir,
}

impl VictoriaMetrics {
    /// Starts it with recent samples visible at once (`-search.latencyOffset=0s`, the default
    /// hides the newest 30 s) and no response cache, so a test sees what was just written.
    pub async fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("gpu-ledger-vm-")
            .tempdir()?;
        let port = free_port()?;
        let mut cmd = Command::new(victoria_metrics_bin()?);
        cmd.arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg(format!(
                "-storageDataPath={}",
                dir.path().join("data").display()
            ))
            .arg("-retentionPeriod=100y")
            .arg("-search.latencyOffset=0s")
            .arg("-search.disableCache");
        let mut guard = ChildGuard::spawn("victoria-metrics", cmd, &dir.path().join("vm.log"))?;
        let url = format!("http://127.0.0.1:{port}");
        wait_ready(
            &mut guard,
            &format!("{url}/health"),
            "victoria-metrics",
            "OK",
        )
        .await?;
        Ok(Self {
            _guard: guard,
            url,
            _dir: dir,
        })
    }

    /// Base URL, `http://127.0.0.1:<port>`; the Prometheus query API is under it and under
    /// `/prometheus` (the path prefix users put in front of it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The remote-write endpoint for Prometheus' `remote_write`.
    pub fn write_url(&self) -> String {
        format!("{}/api/v1/write", self.url)
    }
}

/// One cluster of [`TwoClusters`]: its DCGM test double and its Prometheus.
pub struct ClusterProm {
    pub name: String,
    pub exporter: ReplayExporter,
    pub prometheus: Prometheus,
}

/// Two clusters' DCGM series in Thanos and in VictoriaMetrics (see the module doc).
pub struct TwoClusters {
    pub clusters: Vec<ClusterProm>,
    pub thanos: Thanos,
    pub vm: VictoriaMetrics,
}

/// Prometheus config for one cluster: scrape `target` every `interval` as a default
/// ServiceMonitor does (`honor_labels: false`), label every series with `cluster`, and
/// remote-write to `write_url` with a short batch deadline.
pub fn cluster_config(cluster: &str, target: &str, interval: &str, write_url: &str) -> String {
    format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n  external_labels:\n    cluster: {cluster}\n\
scrape_configs:\n- job_name: nvidia-dcgm-exporter\n  honor_labels: false\n  scrape_interval: {interval}\n  static_configs:\n  - targets: ['{target}']\n    labels:\n      namespace: gpu-operator\n      pod: nvidia-dcgm-exporter-x7k2p\n      container: nvidia-dcgm-exporter\n\
remote_write:\n- url: {write_url}\n  queue_config:\n    batch_send_deadline: 1s\n    max_samples_per_send: 500\n"
    )
}

impl TwoClusters {
    /// Starts VictoriaMetrics, then per `(cluster, scrape)` an exporter replaying `scrape` and
    /// a Prometheus scraping it every 2 s, then Thanos over both Prometheus instances.
    pub async fn start(scrapes: &[(&str, String)]) -> Result<Self> {
        let vm = VictoriaMetrics::start()
            .await
            .context("starting VictoriaMetrics")?;
        let mut clusters = Vec::new();
        for (name, scrape) in scrapes {
            let exporter = ReplayExporter::start(scrape.clone()).await?;
            let config = cluster_config(name, &exporter.target(), "2s", &vm.write_url());
            let prometheus = Prometheus::start(&config)
                .await
                .with_context(|| format!("starting Prometheus of cluster {name}"))?;
            clusters.push(ClusterProm {
                name: (*name).to_string(),
                exporter,
                prometheus,
            });
        }
        let proms: Vec<&Prometheus> = clusters.iter().map(|c| &c.prometheus).collect();
        let thanos = Thanos::start(&proms).await.context("starting Thanos")?;
        Ok(Self {
            clusters,
            thanos,
            vm,
        })
    }
}

/// Polls `url`'s `/api/v1/query` for `query` until its vector answer has at least `n` series,
/// or `timeout` passes. For waiting until scrapes, remote writes or store discovery landed.
pub async fn wait_for_series(url: &str, query: &str, n: usize, timeout: Duration) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let start = Instant::now();
    let mut last = String::new();
    loop {
        if let Ok(r) = client
            .post(format!("{url}/api/v1/query"))
            .form(&[("query", query)])
            .send()
            .await
            && let Ok(v) = r.json::<serde_json::Value>().await
        {
            let got = v["data"]["result"].as_array().map_or(0, Vec::len);
            if got >= n {
                return Ok(());
            }
            last = v.to_string();
        }
        if start.elapsed() > timeout {
            bail!(
                "{url}: `{query}` did not reach {n} series within {timeout:?}; last answer: {last}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
