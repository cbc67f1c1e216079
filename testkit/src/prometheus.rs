//! A real Prometheus (Debian 2.42 `/usr/bin/prometheus`, or `$PROMETHEUS_BIN`) on a free
//! loopback port, optionally over a TSDB backfilled with
//! `promtool tsdb create-blocks-from openmetrics`, optionally evaluating rule files
//! ([`Prometheus::start_with_rules`]: alerting rules fire in `ALERTS` as they would in a cluster).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process::ChildGuard;
use crate::util::{answers_ready, free_port};

/// What Prometheus' `/-/ready` answers once it serves queries.
const PROMETHEUS_READY: &str = "Prometheus Server is Ready.";

/// Minimal config for query-only instances (no scrape jobs).
pub const EMPTY_CONFIG: &str = "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n";

/// A running Prometheus; dropping it stops the process and removes its temp dir.
#[derive(Debug)]
pub struct Prometheus {
    guard: ChildGuard,
    url: String,
    dir: tempfile::TempDir,
    /// The rule files every config of this instance loads ([`Prometheus::start_with_rules`]).
    rule_files: Vec<PathBuf>,
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

    /// [`Prometheus::start`] with rule files: each `(file name, YAML)` of `rules` is written
    /// beside the config and listed under `rule_files`, so Prometheus evaluates them every
    /// `evaluation_interval` of `config_yaml` (set it short in tests: alerts then reach
    /// `ALERTS{alertstate="firing"}` within seconds of their `for`). `config_yaml` must not
    /// list rule files itself. [`Prometheus::reload`] keeps them.
    pub async fn start_with_rules(config_yaml: &str, rules: &[(&str, &str)]) -> Result<Self> {
        if config_yaml.contains("rule_files:") {
            bail!("pass rule files to start_with_rules, not in the config: it lists them itself");
        }
        let dir = tempfile::Builder::new()
            .prefix("gpu-ledger-prometheus-")
            .tempdir()?;
        let mut paths = Vec::with_capacity(rules.len());
        for (name, yaml) in rules {
            if name.is_empty() || name.contains('/') || *name == "prometheus.yml" {
                bail!("rule file name {name:?}: a plain file name other than prometheus.yml");
            }
            let path = dir.path().join(name);
            std::fs::write(&path, yaml).with_context(|| format!("writing rule file {name}"))?;
            paths.push(path);
        }
        let mut prom = Self::start_in(dir, &with_rule_files(config_yaml, &paths), "127.0.0.1")
            .await
            .context("starting prometheus with rule files (a rule that does not parse ends it)")?;
        prom.rule_files = paths;
        Ok(prom)
    }

    /// Replaces the config with `config_yaml` (plus this instance's rule files) and has
    /// Prometheus reload it (`POST /-/reload`): scrape targets that are gone stop being scraped
    /// and their series go stale, as when an exporter is removed from a cluster.
    pub async fn reload(&self, config_yaml: &str) -> Result<()> {
        std::fs::write(
            self.dir.path().join("prometheus.yml"),
            with_rule_files(config_yaml, &self.rule_files),
        )?;
        let answer = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?
            .post(format!("{}/-/reload", self.url))
            .send()
            .await
            .context("POST /-/reload")?;
        if !answer.status().is_success() {
            let status = answer.status();
            bail!(
                "prometheus refused the new config ({status}): {}; last 20 log lines:\n{}",
                answer.text().await.unwrap_or_default(),
                self.log_tail(20)
            );
        }
        Ok(())
    }

    /// The `data.result` of the instant query `promql` now (a vector's samples as JSON).
    pub async fn query(&self, promql: &str) -> Result<Vec<serde_json::Value>> {
        let answer: serde_json::Value = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await
            .with_context(|| format!("query {promql}"))?
            .json()
            .await
            .with_context(|| format!("answer to {promql}"))?;
        if answer["status"] != "success" {
            bail!("query {promql} failed: {answer}");
        }
        answer["data"]["result"]
            .as_array()
            .cloned()
            .with_context(|| format!("no result list in the answer to {promql}: {answer}"))
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
                Ok((guard, url)) => {
                    return Ok(Self {
                        guard,
                        url,
                        dir,
                        rule_files: Vec::new(),
                    });
                }
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
            if answers_ready(&client, &format!("{url}/-/ready"), PROMETHEUS_READY).await {
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
            if answers_ready(&client, &format!("{}/-/ready", self.url), PROMETHEUS_READY).await {
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

/// `config_yaml` with a `rule_files` section listing `paths` (unchanged without any).
fn with_rule_files(config_yaml: &str, paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return config_yaml.to_string();
    }
    let mut out = config_yaml.trim_end().to_string();
    out.push_str("\nrule_files:\n");
    for p in paths {
        out.push_str(&format!("- '{}'\n", p.display()));
    }
    out
}
