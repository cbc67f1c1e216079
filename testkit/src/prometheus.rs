//! A real Prometheus (Debian 2.42 `/usr/bin/prometheus`, or `$PROMETHEUS_BIN`) on a free
//! loopback port, optionally over a TSDB backfilled with
//! `promtool tsdb create-blocks-from openmetrics`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process::ChildGuard;
use crate::util::free_port;

/// Minimal config for query-only instances (no scrape jobs).
pub const EMPTY_CONFIG: &str = "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n";

/// A running Prometheus; dropping it stops the process and removes its temp dir.
#[derive(Debug)]
pub struct Prometheus {
    guard: ChildGuard,
    url: String,
    dir: tempfile::TempDir,
}

/// `$PROMETHEUS_BIN` or `/usr/bin/prometheus`.
pub fn prometheus_bin() -> Result<PathBuf> {
    locate("PROMETHEUS_BIN", "/usr/bin/prometheus")
}

/// `$PROMTOOL_BIN` or `/usr/bin/promtool`.
pub fn promtool_bin() -> Result<PathBuf> {
    locate("PROMTOOL_BIN", "/usr/bin/promtool")
}

/// Runs `promtool check metrics` on `text`: (exit code, stdout + stderr). Panics naming the
/// package when promtool is missing: tests that need it must fail loudly, not skip.
pub fn promtool_check_metrics(text: &[u8]) -> (i32, String) {
    use std::io::Write as _;
    use std::process::Stdio;
    let bin = promtool_bin().unwrap_or_else(|e| panic!("{e:#} (apt-get install prometheus)"));
    let mut child = Command::new(&bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    child
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(text)
        .expect("write metrics to promtool");
    let out = child.wait_with_output().expect("promtool output");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn locate(var: &str, default: &str) -> Result<PathBuf> {
    let p = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} not found (set {var} or `apt-get install prometheus`; \
             scripts/build-test-cluster.sh does this as root)",
            p.display()
        )
    }
}

impl Prometheus {
    /// Starts Prometheus with `config_yaml` and an empty TSDB.
    pub async fn start(config_yaml: &str) -> Result<Self> {
        Self::start_on("127.0.0.1", config_yaml).await
    }

    /// [`Prometheus::start`] listening on `host` instead of loopback, e.g. the machine's own
    /// address, which kube-apiserver's service proxy accepts as an endpoint (it refuses
    /// loopback and link-local ones).
    pub async fn start_on(host: &str, config_yaml: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("gpu-ledger-prometheus-")
            .tempdir()?;
        Self::start_in(dir, config_yaml, host).await
    }

    /// Backfills `openmetrics` (OpenMetrics text ending in `# EOF`, timestamps in seconds)
    /// with promtool, then starts Prometheus over it with [`EMPTY_CONFIG`].
    pub async fn start_with_backfill(openmetrics: &str) -> Result<Self> {
        Self::start_with_backfill_and_config(openmetrics, EMPTY_CONFIG).await
    }

    /// Like [`Prometheus::start_with_backfill`] with a custom config.
    pub async fn start_with_backfill_and_config(
        openmetrics: &str,
        config_yaml: &str,
    ) -> Result<Self> {
        if !openmetrics.trim_end().ends_with("# EOF") {
            bail!("OpenMetrics backfill input must end with `# EOF`");
        }
        let dir = tempfile::Builder::new()
            .prefix("gpu-ledger-prometheus-")
            .tempdir()?;
        let input = dir.path().join("backfill.om");
        std::fs::write(&input, openmetrics)?;
        let tsdb = dir.path().join("tsdb");
        std::fs::create_dir_all(&tsdb)?;
        let out = Command::new(promtool_bin()?)
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&input)
            .arg(&tsdb)
            .output()
            .context("running promtool tsdb create-blocks-from openmetrics")?;
        if !out.status.success() {
            bail!(
                "promtool tsdb create-blocks-from openmetrics failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Self::start_in(dir, config_yaml, "127.0.0.1").await
    }

    async fn start_in(dir: tempfile::TempDir, config_yaml: &str, host: &str) -> Result<Self> {
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_yaml)?;
        let tsdb = dir.path().join("tsdb");
        std::fs::create_dir_all(&tsdb)?;
        // A free port can be taken by a parallel test between our probe and Prometheus' bind:
        // try again on another port when that is why it exited.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::spawn_on_free_port(&dir, &config, &tsdb, host).await {
                Err(e) if attempt < 4 && format!("{e:#}").contains("address already in use") => {}
                Err(e) => return Err(e),
                Ok((guard, url)) => return Ok(Self { guard, url, dir }),
            }
        }
    }

    async fn spawn_on_free_port(
        dir: &tempfile::TempDir,
        config: &Path,
        tsdb: &Path,
        host: &str,
    ) -> Result<(ChildGuard, String)> {
        let bin = prometheus_bin()?;
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={host}:{port}"))
            .arg("--storage.tsdb.retention.time=100y")
            .arg("--web.enable-lifecycle");
        let mut guard = ChildGuard::spawn("prometheus", cmd, &dir.path().join("prometheus.log"))?;
        let url = format!("http://{host}:{port}");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let timeout = crate::util::start_timeout();
        let start = Instant::now();
        loop {
            if let Some(status) = guard.try_exit_status() {
                bail!(
                    "prometheus exited ({status}); last 40 log lines:\n{}",
                    guard.log_tail(40)
                );
            }
            if let Ok(r) = client.get(format!("{url}/-/ready")).send().await
                && r.status().is_success()
            {
                break;
            }
            if start.elapsed() > timeout {
                bail!(
                    "prometheus not ready at {url} after {timeout:?}; last 40 log lines:\n{}",
                    guard.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((guard, url))
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Temp dir holding config, TSDB and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PID of the prometheus process.
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Last `n` lines of the Prometheus log.
    pub fn log_tail(&self, n: usize) -> String {
        self.guard.log_tail(n)
    }

    /// Stops the Prometheus process (SIGTERM, then SIGKILL after `grace`), keeping its port,
    /// config and TSDB so [`Prometheus::restart`] can bring the same instance back. Simulates
    /// an outage of the utilisation source.
    pub fn stop(&mut self, grace: Duration) {
        self.guard.terminate(grace);
    }

    /// Starts Prometheus again on the same port, config and TSDB (after [`Prometheus::stop`])
    /// and waits until it is ready. A running instance is stopped first.
    pub async fn restart(&mut self) -> Result<()> {
        self.guard.terminate(Duration::from_secs(5));
        let (host, port) = self
            .url
            .trim_start_matches("http://")
            .rsplit_once(':')
            .context("host and port of the prometheus url")?;
        let port: u16 = port.parse().context("port of the prometheus url")?;
        let dir = self.dir.path();
        let mut cmd = Command::new(prometheus_bin()?);
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={host}:{port}"))
        .arg("--storage.tsdb.retention.time=100y")
        .arg("--web.enable-lifecycle");
        let restarts = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(std::result::Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("prometheus-restart")
                    })
                    .count()
            })
            .unwrap_or(0);
        let log = dir.join(format!("prometheus-restart-{}.log", restarts + 1));
        self.guard = ChildGuard::spawn("prometheus", cmd, &log)?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let timeout = crate::util::start_timeout();
        let start = Instant::now();
        loop {
            if let Some(status) = self.guard.try_exit_status() {
                bail!(
                    "restarted prometheus exited ({status}); last 40 log lines:\n{}",
                    self.guard.log_tail(40)
                );
            }
            if let Ok(r) = client.get(format!("{}/-/ready", self.url)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!(
                    "restarted prometheus not ready at {} after {timeout:?}; last 40 log lines:\n{}",
                    self.url,
                    self.guard.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
