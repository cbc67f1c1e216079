//! Scale benchmark, gpu-ledger versus kube-state-metrics on the same tier-B cluster (issue 7).
//! Driven by `scripts/bench-scale.sh`; by hand:
//!
//! ```sh
//! cargo run --release -p gpu-ledger-testkit --example scale_bench -- \
//!     --gpu-ledger target/release/gpu-ledger [--nodes 500] [--refresh-interval 10s] [--out results.md]
//! ```
//!
//! Builds N kwok nodes × 8 GPUs, GPU pods of 4/2/1 GPUs on most cards (notebook StatefulSets on
//! some nodes, Terminating pods held by a finalizer, Pending pods), at least as many non-GPU
//! pods, the fake DCGM exporter scraped by a real Prometheus, then runs `gpu-ledger serve` and
//! kube-state-metrics (`--resources=pods,nodes,resourcequotas`) and measures both: time to the
//! first complete export, peak/steady RSS, CPU over a steady window, /metrics latency and size,
//! event-to-metric latency (gpu-ledger), refresh cost, PromQL join cost versus precomputed
//! series, and RSS slope per extra GPU / non-GPU pod. Prints a Markdown report.
//!
//! `--dra`: every node also gets the ResourceSlice NVIDIA's DRA driver would publish for its
//! cards 6 and 7 ([`gpu_ledger_testkit::dra`]), and the 1-GPU pods and notebooks get their GPU
//! through a ResourceClaim from a template instead of `nvidia.com/gpu` (placed by the real
//! kube-scheduler, which allocates the claims; the resourceclaim controller makes them).
//! `--no-ksm`: skip kube-state-metrics (its columns are `–`), e.g. to compare gpu-ledger with and
//! without DRA where KSM is not built.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpu_ledger_testkit::dra::{ClaimSource, NvidiaSlice, pod_claim_fields};
use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::util::{free_port, poll_until};
use gpu_ledger_testkit::{
    ControlPlane, FakeDcgmExporter, GpuNode, Prometheus, Tier, TierBOptions, binary,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

const HOLD_FINALIZER: &str = "gpu-ledger.bench/hold";
const GPU_NAMESPACES: usize = 20;
const SVC_NAMESPACES: usize = 10;

struct Args {
    nodes: usize,
    ledger_bin: PathBuf,
    refresh: String,
    out: Option<PathBuf>,
    concurrency: usize,
    scrapes: usize,
    deletions: usize,
    extra_pods: usize,
    /// Build the cluster and telemetry, print how to reach them, and wait for Ctrl-C (profiling).
    hold_cluster: bool,
    /// 1-GPU pods and notebooks through DRA claims (see the module docs).
    dra: bool,
    /// Do not run kube-state-metrics.
    no_ksm: bool,
    /// Run this many gpu-ledger shards (`--shard i --total-shards K`) instead of one replica and
    /// measure each (see [`run_sharded`]); implies `--no-ksm`. 0 (no `--shards`): one replica
    /// beside KSM; `--shards 1` measures one replica the sharded way, the baseline for K > 1.
    shards: u32,
}

fn args() -> Result<Args> {
    let mut a = Args {
        nodes: 500,
        ledger_bin: PathBuf::from("target/release/gpu-ledger"),
        refresh: "10s".into(),
        out: None,
        concurrency: 48,
        scrapes: 100,
        deletions: 100,
        extra_pods: 3000,
        hold_cluster: false,
        dra: false,
        no_ksm: false,
        shards: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => a.nodes = val()?.parse()?,
            "--gpu-ledger" => a.ledger_bin = PathBuf::from(val()?),
            "--refresh-interval" => a.refresh = val()?,
            "--out" => a.out = Some(PathBuf::from(val()?)),
            "--concurrency" => a.concurrency = val()?.parse()?,
            "--scrapes" => a.scrapes = val()?.parse()?,
            "--deletions" => a.deletions = val()?.parse()?,
            "--extra-pods" => a.extra_pods = val()?.parse()?,
            "--hold" => a.hold_cluster = true,
            "--dra" => a.dra = true,
            "--no-ksm" => a.no_ksm = true,
            "--shards" => {
                a.shards = val()?.parse()?;
                if a.shards == 0 {
                    bail!("--shards needs at least 1");
                }
                a.no_ksm = true;
            }
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(a)
}

fn log(msg: &str) {
    eprintln!(
        "[{:>8.1?}] {msg}",
        START.get_or_init(Instant::now).elapsed()
    );
}
static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

#[derive(Clone)]
struct PodPlan {
    ns: String,
    name: String,
    node: Option<String>,
    gpus: u32,
    hold: bool,
    util: u32,
    selector_none: bool,
    /// The GPU comes from a claim made from [`DRA_TEMPLATE`]; the scheduler places the pod.
    dra: bool,
}

/// The ResourceClaimTemplate (one whole GPU) DRA pods use, in every GPU namespace.
const DRA_TEMPLATE: &str = "bench-gpu";
/// Cards of each node the DRA driver hands out under `--dra` (the device plugin's pods use 0–5).
const DRA_CARDS: [u32; 2] = [6, 7];

fn pod_object(p: &PodPlan) -> Pod {
    let mut limits = serde_json::Map::new();
    limits.insert("cpu".into(), json!("100m"));
    if p.gpus > 0 && !p.dra {
        limits.insert("nvidia.com/gpu".into(), json!(p.gpus.to_string()));
    }
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.ns, "labels": {"app": "bench"},
            "annotations": {"gpu-ledger.test/utilization": p.util.to_string()}},
        "spec": {"containers": [{"name": "main", "image": "bench", "resources": {"limits": limits.clone(), "requests": limits}}],
            "terminationGracePeriodSeconds": 0}
    });
    match (&p.node, p.dra) {
        (Some(n), false) => v["spec"]["nodeName"] = json!(n),
        // The scheduler must allocate the claim: select the node instead of binding to it.
        (Some(n), true) => v["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": n}),
        (None, _) => {}
    }
    if p.dra {
        let (claims, resources) = pod_claim_fields(ClaimSource::Template(DRA_TEMPLATE));
        v["spec"]["resourceClaims"] = claims;
        v["spec"]["containers"][0]["resources"]["claims"] = resources["claims"].clone();
    }
    if p.hold {
        v["metadata"]["finalizers"] = json!([HOLD_FINALIZER]);
    }
    if p.selector_none {
        v["spec"]["nodeSelector"] = json!({"gpu-ledger.bench/none": "true"});
    }
    serde_json::from_value(v).expect("valid pod")
}

async fn create_pods(client: &kube::Client, plans: Vec<PodPlan>, concurrency: usize) -> Result<()> {
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut set = JoinSet::new();
    for p in plans {
        let permit = sem.clone().acquire_owned().await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), &p.ns);
        set.spawn(async move {
            let _permit = permit;
            let obj = pod_object(&p);
            for attempt in 0..5 {
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => return Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
                    Err(e) if attempt == 4 => return Err(anyhow::anyhow!("{}: {e}", p.name)),
                    Err(_) => tokio::time::sleep(Duration::from_millis(200 << attempt)).await,
                }
            }
            Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

async fn count_pods(client: &kube::Client) -> Result<(usize, usize)> {
    let api: Api<Pod> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    let running = list
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    Ok((list.items.len(), running))
}

fn proc_status(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// RSS readings per slope point: one reading can land inside a refresh (tens of MiB of decoded
/// answers), so each point is the median of this many 1 s samples.
const SLOPE_SAMPLES: usize = 30;

/// Median `VmRSS` (KiB) of two processes over `n` samples 1 s apart.
async fn median_rss(a: u32, b: u32, n: usize) -> (u64, u64) {
    let (mut xs, mut ys) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        xs.push(proc_status(a).0 as f64);
        ys.push(proc_status(b).0 as f64);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (pct(&mut xs, 0.5) as u64, pct(&mut ys, 0.5) as u64)
}

/// utime + stime in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // fields after ")": state=0 … utime=11 stime=12
    (ticks(11) + ticks(12)) / 100.0
}

/// [`cpu_seconds`] of KSM, NaN when it does not run (pid 0).
fn ksm_cpu(pid: u32) -> f64 {
    if pid == 0 { f64::NAN } else { cpu_seconds(pid) }
}

/// [`proc_status`] of KSM, zeros when it does not run (pid 0).
fn ksm_status(pid: u32) -> (u64, u64) {
    if pid == 0 { (0, 0) } else { proc_status(pid) }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

async fn get_text(http: &reqwest::Client, url: &str) -> Result<String> {
    let r = http.get(url).send().await?.error_for_status()?;
    Ok(r.text().await?)
}

fn count_prefix(text: &str, prefix: &str) -> usize {
    text.lines().filter(|l| l.starts_with(prefix)).count()
}

fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

struct Scrape {
    p50_ms: f64,
    p99_ms: f64,
    bytes: usize,
}

async fn scrape_latency(http: &reqwest::Client, url: &str, n: usize) -> Result<Scrape> {
    let mut lat = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let t = Instant::now();
        let body = get_text(http, url).await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes = body.len();
    }
    Ok(Scrape {
        p50_ms: pct(&mut lat.clone(), 0.5),
        p99_ms: pct(&mut lat, 0.99),
        bytes,
    })
}

/// Median wall time (ms) of an instant query over 5 runs, and the series it returned.
/// One instant query over the HTTP API; an error unless Prometheus answers `success`.
async fn instant_query(http: &reqwest::Client, prom: &str, q: &str) -> Result<serde_json::Value> {
    let v: serde_json::Value = http
        .get(format!("{prom}/api/v1/query"))
        .query(&[("query", q)])
        .send()
        .await?
        .json()
        .await?;
    if v["status"] != "success" {
        bail!("query {q} failed: {v}");
    }
    Ok(v)
}

async fn query_time(http: &reqwest::Client, prom: &str, q: &str) -> Result<(f64, usize)> {
    let mut t = Vec::new();
    let mut n = 0;
    for _ in 0..5 {
        let s = Instant::now();
        let v = instant_query(http, prom, q).await?;
        t.push(s.elapsed().as_secs_f64() * 1000.0);
        n = v["data"]["result"].as_array().map_or(0, Vec::len);
    }
    Ok((pct(&mut t, 0.5), n))
}

/// The metric names gpu-ledger's refresh selects (`SPELLINGS` in src/usage/fields.rs:
/// the three fields in the current, `--use-old-namespace` and 1.x spellings).
const FIELD_SPELLINGS: &[&str] = &[
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "dcgm_fi_prof_gr_engine_active",
    "dcgm_fi_dev_gpu_util",
    "dcgm_fi_dev_fb_used",
    "dcgm_gpu_utilization",
    "dcgm_fb_used",
];

/// Whole seconds of a `10s` / `2m` flag value.
fn seconds_of(v: &str) -> Option<u64> {
    let (n, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        _ => None,
    }
}

/// CPU seconds per second a process spends over `over` while the bench asks it nothing (its own
/// scrapes and loops): subtracted from what a measured phase costs it.
async fn idle_cpu_rate(pid: u32, over: Duration) -> f64 {
    let (c0, t0) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(over).await;
    (cpu_seconds(pid) - c0) / t0.elapsed().as_secs_f64()
}

/// Prometheus CPU seconds one evaluation of `queries` costs (each query once, as one refresh or
/// one evaluation of a rule group would): `rounds` evaluations back to back, minus Prometheus'
/// CPU rate over the 15 s just before (its scrapes and gpu-ledger's own refreshes go on in both).
async fn prometheus_cpu_per_eval(
    http: &reqwest::Client,
    prom: &str,
    pid: u32,
    queries: &[String],
    rounds: usize,
) -> Result<f64> {
    let idle_rate = idle_cpu_rate(pid, Duration::from_secs(15)).await;
    let (c1, t1) = (cpu_seconds(pid), Instant::now());
    for _ in 0..rounds {
        for q in queries {
            instant_query(http, prom, q).await?;
        }
    }
    let spent = cpu_seconds(pid) - c1 - idle_rate * t1.elapsed().as_secs_f64();
    Ok(spent / rounds as f64)
}

/// What [`run_sharded`] needs from the set-up.
struct Sharded<'a> {
    kubeconfig: &'a std::path::Path,
    logdir: &'a std::path::Path,
    prom: &'a Prometheus,
    http: &'a reqwest::Client,
    gpu_pods: usize,
    setup: String,
}

/// The refresh query of a shard owning `hosts` (src/usage/live.rs `Scope`,
/// src/usage/prom/queries.rs `scope_matcher`: node names are plain, only `.` needs escaping),
/// over the steady range; all devices without `hosts`.
fn shard_refresh_query(hosts: Option<&[String]>, refresh_secs: u64) -> String {
    let scope = hosts.map_or(String::new(), |h| {
        let names: Vec<String> = h.iter().map(|n| n.replace('.', "\\\\.")).collect();
        format!(",Hostname=~\"{}\"", names.join("|"))
    });
    format!(
        "{{__name__=~\"{}\"{scope}}}[{}s]",
        FIELD_SPELLINGS.join("|"),
        refresh_secs + 2 * 15
    )
}

/// Prometheus CPU seconds per evaluation of `query` (as [`prometheus_cpu_per_eval`], sent as a
/// form POST like gpu-ledger sends it: a shard's node list does not fit a URL well), and the
/// series it returns.
async fn prometheus_cpu_per_post(
    http: &reqwest::Client,
    prom: &Prometheus,
    query: &str,
    rounds: usize,
) -> Result<(f64, usize)> {
    let pid = prom.pid();
    let idle_rate = idle_cpu_rate(pid, Duration::from_secs(15)).await;
    let (c1, t1) = (cpu_seconds(pid), Instant::now());
    let mut series = 0;
    for _ in 0..rounds {
        let v: serde_json::Value = http
            .post(format!("{}/api/v1/query", prom.url()))
            .form(&[("query", query)])
            .send()
            .await?
            .json()
            .await?;
        if v["status"] != "success" {
            bail!("shard query failed: {v}");
        }
        series = v["data"]["result"].as_array().map_or(0, Vec::len);
    }
    let spent = cpu_seconds(pid) - c1 - idle_rate * t1.elapsed().as_secs_f64();
    Ok((spent / rounds as f64, series))
}

/// The `devices=N` of the last `refreshed` line of a gpu-ledger log (what its last refresh read).
fn last_refresh_devices(log: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.contains("refreshed"))
        .and_then(|l| l.split("devices=").nth(1))
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|v| v.parse().ok())
}

/// `--shards K`: K gpu-ledger processes (`--shard i --total-shards K`) side by side, no KSM.
/// Measures the first complete export over all shards, each shard's steady RSS, CPU, refresh
/// and devices read, Prometheus' CPU per evaluation of each shard's refresh query (the nodes a
/// shard owns are read from its `/api/v1/ledger`) against the unsharded query, and Prometheus'
/// CPU over the steady window.
#[allow(clippy::too_many_lines)]
async fn run_sharded(a: &Args, s: &Sharded<'_>) -> Result<String> {
    let k = a.shards;
    let prom_pid = s.prom.pid();
    // Prometheus' own rate (scrapes, rules) before any shard runs.
    let prom_idle_rate = idle_cpu_rate(prom_pid, Duration::from_secs(30)).await;

    let t = Instant::now();
    let mut shards = Vec::new();
    for i in 0..k {
        let port = free_port()?;
        let log = s.logdir.join(format!("gpu-ledger-shard-{i}.log"));
        let mut cmd = Command::new(&a.ledger_bin);
        cmd.env("KUBECONFIG", s.kubeconfig)
            .env("POD_NAMESPACE", "default")
            .env("MIMALLOC_PURGE_DELAY", "0")
            .arg("serve")
            .arg(format!("--prometheus-url={}", s.prom.url()))
            .arg(format!("--listen=127.0.0.1:{port}"))
            .arg(format!("--refresh-interval={}", a.refresh))
            .arg("--scrape-interval=15s")
            .arg(format!("--shard={i}"))
            .arg(format!("--total-shards={k}"))
            // Each shard elects on its own Lease, as the chart sets it.
            .arg(format!("--lease-name=gpu-ledger-{i}"));
        let child = ChildGuard::spawn(&format!("gpu-ledger shard {i}"), cmd, &log)?;
        shards.push((child, format!("http://127.0.0.1:{port}"), log));
    }
    poll_until(
        "all shards complete",
        Duration::from_secs(900),
        Duration::from_millis(200),
        || {
            let urls: Vec<String> = shards
                .iter()
                .map(|(_, u, _)| format!("{u}/metrics"))
                .collect();
            let h = s.http.clone();
            let want = s.gpu_pods;
            async move {
                let mut sum = 0;
                for u in &urls {
                    sum += count_prefix(&get_text(&h, u).await?, "gpu_ledger_pod_owner_info{");
                }
                Ok((sum >= want).then_some(()))
            }
        },
    )
    .await?;
    let first = t.elapsed().as_secs_f64();
    log(&format!("{k} shards complete after {first:.2} s"));
    // Each shard reads its idle history once, after its first refresh: the steady window starts
    // when all have, so it holds refreshes only.
    let logs: Vec<std::path::PathBuf> = shards.iter().map(|(_, _, l)| l.clone()).collect();
    poll_until(
        "every shard's history bootstrap",
        Duration::from_secs(600),
        Duration::from_secs(1),
        || {
            let logs = logs.clone();
            async move {
                let done = logs.iter().all(|l| {
                    std::fs::read_to_string(l)
                        .is_ok_and(|t| t.contains("idle history rebuilt from prometheus"))
                });
                Ok(done.then_some(()))
            }
        },
    )
    .await?;
    log(&format!(
        "{k} history bootstraps done after {:.2} s",
        t.elapsed().as_secs_f64()
    ));

    tokio::time::sleep(Duration::from_secs(20)).await;
    let window = Duration::from_secs(60);
    let pids: Vec<u32> = shards.iter().map(|(c, _, _)| c.pid()).collect();
    let metrics_of = |u: &str| format!("{u}/metrics");
    let mut before = Vec::new();
    for (_, u, _) in &shards {
        before.push(get_text(s.http, &metrics_of(u)).await?);
    }
    let cpu0: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let p0 = cpu_seconds(prom_pid);
    let mut rss: Vec<Vec<f64>> = vec![Vec::new(); pids.len()];
    let ends = Instant::now() + window;
    while Instant::now() < ends {
        for (i, p) in pids.iter().enumerate() {
            rss[i].push(proc_status(*p).0 as f64);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let prom_spent = cpu_seconds(prom_pid) - p0 - prom_idle_rate * window.as_secs_f64();
    let cpu1: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let mut after = Vec::new();
    for (_, u, _) in &shards {
        after.push(get_text(s.http, &metrics_of(u)).await?);
    }

    // Each shard's nodes, from its own ledger; then its refresh query replayed.
    let refresh_secs = seconds_of(&a.refresh).unwrap_or(10);
    let mut owned: Vec<Vec<String>> = Vec::new();
    for (_, u, _) in &shards {
        let v: serde_json::Value = s
            .http
            .get(format!("{u}/api/v1/ledger"))
            .send()
            .await?
            .json()
            .await?;
        let nodes = v["nodes"]
            .as_array()
            .map(|n| {
                n.iter()
                    .filter_map(|x| x["node"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        owned.push(nodes);
    }
    let (all_cpu, all_series) =
        prometheus_cpu_per_post(s.http, s.prom, &shard_refresh_query(None, refresh_secs), 20)
            .await?;
    let mut per_shard_query = Vec::new();
    for nodes in &owned {
        per_shard_query.push(
            prometheus_cpu_per_post(
                s.http,
                s.prom,
                &shard_refresh_query(Some(nodes), refresh_secs),
                20,
            )
            .await?,
        );
    }
    log("shard queries timed");

    let mut r = s.setup.clone();
    let _ = writeln!(
        r,
        "\nfirst complete export over all {k} shards: {first:.2} s\n"
    );
    let _ = writeln!(
        r,
        "| shard | nodes | devices read per refresh | steady RSS (median) | CPU over {} s | refreshes | Prometheus queries sent | mean refresh | Prometheus CPU per evaluation of its refresh query | series returned |",
        window.as_secs()
    );
    let _ = writeln!(
        r,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut total_refreshes = 0.0;
    for i in 0..shards.len() {
        let delta = |name: &str| {
            metric_value(&after[i], name).unwrap_or(0.0)
                - metric_value(&before[i], name).unwrap_or(0.0)
        };
        let refreshes = delta("gpu_ledger_refresh_duration_seconds_count");
        let mean = if refreshes > 0.0 {
            delta("gpu_ledger_refresh_duration_seconds_sum") / refreshes
        } else {
            f64::NAN
        };
        total_refreshes += refreshes;
        let devices =
            last_refresh_devices(&shards[i].2).map_or_else(|| "?".to_string(), |d| d.to_string());
        let _ = writeln!(
            r,
            "| {i} | {} | {devices} | {:.1} MiB | {:.2} s | {refreshes} | {} | {mean:.3} s | {:.1} ms | {} |",
            owned[i].len(),
            pct(&mut rss[i], 0.5) / 1024.0,
            cpu1[i] - cpu0[i],
            delta("gpu_ledger_prometheus_queries_total"),
            per_shard_query[i].0 * 1000.0,
            per_shard_query[i].1
        );
    }
    let shard_sum: f64 = per_shard_query.iter().map(|(c, _)| c).sum();
    let _ = writeln!(
        r,
        "\nPrometheus CPU per evaluation: the {k} shards' refresh queries together {:.1} ms, the unsharded refresh query {:.1} ms ({all_series} series), ratio {:.3}",
        shard_sum * 1000.0,
        all_cpu * 1000.0,
        shard_sum / all_cpu
    );
    let cycles = total_refreshes / f64::from(k);
    let _ = writeln!(
        r,
        "Prometheus CPU over the {} s steady window minus its idle rate: {:.2} s for {total_refreshes} shard refreshes ({:.1} ms per fleet refresh cycle of {k} queries)",
        window.as_secs(),
        prom_spent,
        if cycles > 0.0 {
            prom_spent / cycles * 1000.0
        } else {
            f64::NAN
        }
    );
    drop(shards);
    // The shard logs outlive the cluster's directory, to attribute what the table shows.
    for (i, l) in logs.iter().enumerate() {
        let kept = std::env::temp_dir().join(format!("gpu-ledger-bench-{k}-shards-{i}.log"));
        if std::fs::copy(l, &kept).is_ok() {
            let _ = writeln!(r, "shard {i} log: {}", kept.display());
        }
    }
    Ok(r)
}

#[allow(clippy::too_many_lines)]
#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    log(&format!("tier B with {} nodes x 8 GPUs", a.nodes));
    let cp = ControlPlane::start(Tier::B(TierBOptions {
        kube_api_qps: Some(1000),
        extra_controllers: if a.dra {
            vec!["resourceclaim-controller".into()]
        } else {
            Vec::new()
        },
        ..TierBOptions::default()
    }))
    .await?;
    let admin = cp.client("admin").await?;
    cp.install_notebook_crd().await?;

    // Nodes.
    let t_setup = Instant::now();
    let sem = Arc::new(Semaphore::new(a.concurrency));
    let mut set = JoinSet::new();
    for n in 0..a.nodes {
        let permit = sem.clone().acquire_owned().await?;
        let c = admin.clone();
        set.spawn(async move {
            let _p = permit;
            GpuNode::new(&format!("gpu-node-{n:04}"), 8)
                .create(&c)
                .await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    log(&format!("{} nodes created", a.nodes));
    if a.dra {
        gpu_ledger_testkit::dra::install_device_classes(&admin).await?;
        let mut set = JoinSet::new();
        for n in 0..a.nodes {
            let permit = sem.clone().acquire_owned().await?;
            let c = admin.clone();
            set.spawn(async move {
                let _p = permit;
                NvidiaSlice::new(&format!("gpu-node-{n:04}"))
                    .gpus(DRA_CARDS)
                    .create(&c)
                    .await
            });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
        log(&format!("{} ResourceSlices created", a.nodes));
    }
    let ns_api: Api<Namespace> = Api::all(admin.clone());
    let namespaces: Vec<String> = (0..GPU_NAMESPACES)
        .map(|i| format!("team-{i:02}"))
        .chain((0..SVC_NAMESPACES).map(|i| format!("svc-{i:02}")))
        .collect();
    for ns in &namespaces {
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        let _ = ns_api.create(&PostParams::default(), &obj).await;
        if a.dra && ns.starts_with("team-") {
            Api::<ResourceClaimTemplate>::namespaced(admin.clone(), ns)
                .create(
                    &PostParams::default(),
                    &gpu_ledger_testkit::dra::claim_template(
                        DRA_TEMPLATE,
                        gpu_ledger_testkit::dra::GPU_CLASS,
                        1,
                        &[],
                    ),
                )
                .await?;
        }
    }

    // Notebooks: a Notebook CR plus the StatefulSet Kubeflow would create, on every 10th node.
    let nb_res = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubeflow.org", "v1", "Notebook"),
        "notebooks",
    );
    let mut plans = Vec::new();
    let mut notebooks = 0;
    for n in 0..a.nodes {
        let node = format!("gpu-node-{n:04}");
        let mut sizes: Vec<u32> = vec![4, 2, 1];
        if n % 5 != 0 {
            sizes.push(1);
        }
        for (k, gpus) in sizes.into_iter().enumerate() {
            let ns = format!("team-{:02}", (n + k) % GPU_NAMESPACES);
            if k == 3 && n % 10 == 1 {
                // notebook StatefulSet pinned to this node
                let name = format!("nb-{n:04}");
                let nbs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &nb_res);
                let mut nb = DynamicObject::new(&name, &nb_res);
                nb.data = json!({"spec": {"template": {"spec": {"containers": [{"name": name, "image": "jupyter"}]}}}});
                nbs.create(&PostParams::default(), &nb).await?;
                let mut sts: serde_json::Value = json!({
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"replicas": 1, "serviceName": "", "selector": {"matchLabels": {"notebook-name": name}},
                        "template": {"metadata": {"labels": {"notebook-name": name},
                                "annotations": {"gpu-ledger.test/utilization": "0"}},
                            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                                "containers": [{"name": name, "image": "jupyter",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}}}
                });
                if a.dra {
                    let spec = &mut sts["spec"]["template"]["spec"];
                    let (claims, resources) = pod_claim_fields(ClaimSource::Template(DRA_TEMPLATE));
                    spec["resourceClaims"] = claims;
                    spec["containers"][0]["resources"] = resources;
                    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
                    if let Some(m) = spec.as_object_mut() {
                        m.remove("nodeName");
                    }
                }
                let sts: StatefulSet = serde_json::from_value(sts)?;
                Api::<StatefulSet>::namespaced(admin.clone(), &ns)
                    .create(&PostParams::default(), &sts)
                    .await?;
                notebooks += 1;
                continue;
            }
            plans.push(PodPlan {
                ns,
                name: format!("train-{n:04}-{k}"),
                node: Some(node.clone()),
                gpus,
                hold: n % 20 == 7 && k == 1,
                util: if (n + k) % 3 == 0 { 0 } else { 70 },
                selector_none: false,
                dra: a.dra && gpus == 1,
            });
        }
        for j in 0..5 {
            plans.push(PodPlan {
                ns: format!("svc-{:02}", (n + j) % SVC_NAMESPACES),
                name: format!("web-{n:04}-{j}"),
                node: Some(node.clone()),
                gpus: 0,
                hold: false,
                util: 0,
                selector_none: false,
                dra: false,
            });
        }
    }
    for i in 0..a.nodes / 10 {
        plans.push(PodPlan {
            ns: format!("team-{:02}", i % GPU_NAMESPACES),
            name: format!("queued-{i:04}"),
            node: None,
            gpus: 1 + (i % 2) as u32,
            hold: false,
            util: 0,
            selector_none: true,
            dra: false,
        });
    }
    let gpu_pods = plans.iter().filter(|p| p.gpus > 0).count() + notebooks;
    let dra_pods = plans.iter().filter(|p| p.dra).count() + if a.dra { notebooks } else { 0 };
    let plain_pods = plans.iter().filter(|p| p.gpus == 0).count();
    let held: Vec<PodPlan> = plans.iter().filter(|p| p.hold).cloned().collect();
    let total = plans.len() + notebooks;
    log(&format!(
        "creating {total} pods ({gpu_pods} GPU incl. {notebooks} notebooks, {plain_pods} non-GPU)"
    ));
    create_pods(&admin, plans.clone(), a.concurrency).await?;
    let expected_running = total - a.nodes / 10;
    poll_until(
        "pods created and Running",
        Duration::from_secs(1800),
        Duration::from_secs(5),
        || {
            let c = admin.clone();
            async move {
                let (all, running) = count_pods(&c).await?;
                log(&format!("{all} pods, {running} Running"));
                Ok((all >= total && running >= expected_running).then_some(()))
            }
        },
    )
    .await?;
    for p in &held {
        Api::<Pod>::namespaced(admin.clone(), &p.ns)
            .delete(&p.name, &DeleteParams::default())
            .await?;
    }
    let setup_s = t_setup.elapsed().as_secs_f64();
    log(&format!(
        "cluster ready in {setup_s:.0} s; {} pods Terminating behind a finalizer",
        held.len()
    ));

    // Telemetry: fake DCGM scraped by Prometheus, which also scrapes KSM and gpu-ledger.
    let dcgm = FakeDcgmExporter::start(admin.clone()).await?;
    let (ksm_port, ksm_tel, ledger_port) = (free_port()?, free_port()?, free_port()?);
    let config = format!(
        "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs:\n\
- job_name: nvidia-dcgm-exporter\n  honor_labels: false\n  static_configs:\n  - targets: ['{}']\n    labels:\n      namespace: gpu-operator\n      pod: nvidia-dcgm-exporter-x7k2p\n      container: nvidia-dcgm-exporter\n\
- job_name: kube-state-metrics\n  honor_labels: true\n  static_configs:\n  - targets: ['127.0.0.1:{ksm_port}']\n\
- job_name: gpu-ledger\n  honor_labels: true\n  static_configs:\n  - targets: ['127.0.0.1:{ledger_port}']\n",
        dcgm.target()
    );
    let prom = Prometheus::start(&config).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    poll_until(
        "DCGM series in Prometheus",
        Duration::from_secs(120),
        Duration::from_secs(2),
        || {
            let (h, u) = (http.clone(), prom.url().to_string());
            async move {
                let v: serde_json::Value = h
                    .get(format!("{u}/api/v1/query"))
                    .query(&[("query", "count(DCGM_FI_DEV_GPU_UTIL)")])
                    .send()
                    .await?
                    .json()
                    .await?;
                Ok(v["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty())
                    .then_some(()))
            }
        },
    )
    .await?;
    let kubeconfig = cp.kubeconfig_path("admin")?;
    let logdir = cp.dir().to_path_buf();
    if a.hold_cluster {
        println!(
            "export KUBECONFIG={} POD_NAMESPACE=default PROMETHEUS_URL={}",
            kubeconfig.display(),
            prom.url()
        );
        log("holding the cluster for profiling; Ctrl-C ends");
        tokio::signal::ctrl_c().await?;
        return Ok(());
    }

    if a.shards > 0 {
        let report = run_sharded(
            &a,
            &Sharded {
                kubeconfig: &kubeconfig,
                logdir: &logdir,
                prom: &prom,
                http: &http,
                gpu_pods,
                setup: format!(
                    "nodes: {} × 8 GPUs ({} GPUs); pods: {total} ({gpu_pods} GPU); cluster set-up {setup_s:.0} s; gpu-ledger --refresh-interval {}, {} shards\n",
                    a.nodes,
                    a.nodes * 8,
                    a.refresh,
                    a.shards
                ),
            },
        )
        .await?;
        println!("{report}");
        if let Some(out) = &a.out {
            std::fs::write(out, &report)?;
        }
        return Ok(());
    }

    // kube-state-metrics alone first, then gpu-ledger, so neither's start-up steals the other's CPU.
    let t = Instant::now();
    let ksm_url = format!("http://127.0.0.1:{ksm_port}/metrics");
    let ksm = if a.no_ksm {
        None
    } else {
        let mut cmd = Command::new(binary("kube-state-metrics")?);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--resources=pods,nodes,resourcequotas")
            .arg("--host=127.0.0.1")
            .arg(format!("--port={ksm_port}"))
            .arg("--telemetry-host=127.0.0.1")
            .arg(format!("--telemetry-port={ksm_tel}"));
        let ksm = ChildGuard::spawn("kube-state-metrics", cmd, &logdir.join("ksm.log"))?;
        poll_until(
            "kube-state-metrics complete",
            Duration::from_secs(600),
            Duration::from_millis(200),
            || {
                let (h, u) = (http.clone(), ksm_url.clone());
                async move {
                    let text = get_text(&h, &u).await?;
                    Ok((count_prefix(&text, "kube_pod_info{") >= total).then_some(()))
                }
            },
        )
        .await?;
        Some(ksm)
    };
    // Without KSM every KSM figure is NaN (printed as `–`); pid 0 reads as nothing.
    let ksm_pid = ksm.as_ref().map_or(0, ChildGuard::pid);
    let ksm_first = if ksm.is_some() {
        t.elapsed().as_secs_f64()
    } else {
        f64::NAN
    };
    log(&format!(
        "kube-state-metrics complete after {ksm_first:.2} s"
    ));

    let mut cmd = Command::new(&a.ledger_bin);
    cmd.env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", "default")
        // As the container image sets it (Dockerfile).
        .env("MIMALLOC_PURGE_DELAY", "0")
        .arg("serve")
        .arg(format!("--prometheus-url={}", prom.url()))
        .arg(format!("--listen=127.0.0.1:{ledger_port}"))
        .arg(format!("--refresh-interval={}", a.refresh))
        .arg("--scrape-interval=15s");
    let t = Instant::now();
    let ledger = ChildGuard::spawn("gpu-ledger", cmd, &logdir.join("gpu-ledger.log"))?;
    let ledger_url = format!("http://127.0.0.1:{ledger_port}/metrics");
    poll_until(
        "gpu-ledger complete",
        Duration::from_secs(600),
        Duration::from_millis(200),
        || {
            let (h, u) = (http.clone(), ledger_url.clone());
            async move {
                let text = get_text(&h, &u).await?;
                Ok((count_prefix(&text, "gpu_ledger_pod_owner_info{") >= gpu_pods).then_some(()))
            }
        },
    )
    .await?;
    let ledger_first = t.elapsed().as_secs_f64();
    log(&format!("gpu-ledger complete after {ledger_first:.2} s"));

    // Steady window: both idle apart from their own loops and Prometheus' 15 s scrapes.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let window = Duration::from_secs(60);
    let (k0, l0) = (ksm_cpu(ksm_pid), cpu_seconds(ledger.pid()));
    let text0 = get_text(&http, &ledger_url).await?;
    // RSS sampled every second over the window: one reading could land inside a refresh.
    let (mut ksm_samples, mut led_samples) = (Vec::new(), Vec::new());
    let sampling_ends = Instant::now() + window;
    while Instant::now() < sampling_ends {
        ksm_samples.push(ksm_status(ksm_pid).0 as f64);
        led_samples.push(proc_status(ledger.pid()).0 as f64);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let text1 = get_text(&http, &ledger_url).await?;
    let (k1, l1) = (ksm_cpu(ksm_pid), cpu_seconds(ledger.pid()));
    let (_, ksm_hwm) = ksm_status(ksm_pid);
    let (_, led_hwm) = proc_status(ledger.pid());
    let ksm_rss = pct(&mut ksm_samples, 0.5) as u64;
    let led_rss = pct(&mut led_samples, 0.5) as u64;
    let ksm_rss_max = pct(&mut ksm_samples, 1.0) as u64;
    let led_rss_max = pct(&mut led_samples, 1.0) as u64;
    let refreshes = metric_value(&text1, "gpu_ledger_refresh_duration_seconds_count")
        .unwrap_or(0.0)
        - metric_value(&text0, "gpu_ledger_refresh_duration_seconds_count").unwrap_or(0.0);
    let refresh_sum = metric_value(&text1, "gpu_ledger_refresh_duration_seconds_sum")
        .unwrap_or(0.0)
        - metric_value(&text0, "gpu_ledger_refresh_duration_seconds_sum").unwrap_or(0.0);
    let queries = metric_value(&text1, "gpu_ledger_prometheus_queries_total").unwrap_or(0.0)
        - metric_value(&text0, "gpu_ledger_prometheus_queries_total").unwrap_or(0.0);
    log(&format!(
        "steady: ksm rss {ksm_rss} KiB cpu {:.2}s; gpu-ledger rss {led_rss} KiB cpu {:.2}s; {refreshes} refreshes",
        k1 - k0,
        l1 - l0
    ));

    // Scrape latency (sequential, alternating targets would mix caches; one after the other).
    let ksm_scrape = if ksm.is_some() {
        scrape_latency(&http, &ksm_url, a.scrapes).await?
    } else {
        Scrape {
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
            bytes: 0,
        }
    };
    let led_scrape = scrape_latency(&http, &ledger_url, a.scrapes).await?;
    log("scrape latency measured");

    // PromQL: the peer join over KSM + DCGM versus reading gpu-ledger's precomputed series.
    let running_gpus = r#"kube_pod_container_resource_requests{resource="nvidia_com_gpu"} * on(namespace,pod) group_left() max by (namespace,pod)(kube_pod_status_phase{phase=~"Pending|Running"}==1)"#;
    let dcgm_by_pod = r#"label_replace(label_replace(avg by (exported_namespace,exported_pod)(DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_pod!=""}), "namespace","$1","exported_namespace","(.*)"), "pod","$1","exported_pod","(.*)")"#;
    let queries_cmp = [
        (
            "peer: allocated per namespace (KSM)",
            format!("sum by (namespace)({running_gpus})"),
        ),
        (
            "peer: allocated and idle per namespace (KSM ⨝ DCGM)",
            format!(
                "sum by (namespace)(({running_gpus}) * on(namespace,pod) group_left() (max by (namespace,pod)({dcgm_by_pod}) < bool 0.05))"
            ),
        ),
        (
            "gpu-ledger: claimed per namespace",
            "sum by (namespace)(gpu_ledger_namespace_gpus_claimed)".to_string(),
        ),
        (
            "gpu-ledger: idle per namespace",
            "sum by (namespace)(gpu_ledger_namespace_gpus_idle)".to_string(),
        ),
    ];
    let mut promql = Vec::new();
    for (label, q) in &queries_cmp {
        if ksm.is_none() && label.starts_with("peer") {
            continue;
        }
        let (ms, series) = query_time(&http, prom.url(), q).await?;
        promql.push((*label, ms, series));
    }
    log("PromQL timed");

    // Prometheus CPU per refresh: gpu-ledger's steady refresh query (the raw samples since the
    // previous refresh plus two scrape intervals of overlap: src/usage/live.rs) versus one
    // evaluation of the peer's two recording rules for the same answers.
    let refresh_secs = seconds_of(&a.refresh).unwrap_or(10);
    let ledger_query = vec![format!(
        "{{__name__=~\"{}\"}}[{}s]",
        FIELD_SPELLINGS.join("|"),
        refresh_secs + 2 * 15
    )];
    let ledger_cpu =
        prometheus_cpu_per_eval(&http, prom.url(), prom.pid(), &ledger_query, 20).await?;
    let peer_cpu = if ksm.is_some() {
        let rules: Vec<String> = queries_cmp
            .iter()
            .filter(|(label, _)| label.starts_with("peer"))
            .map(|(_, q)| q.clone())
            .collect();
        prometheus_cpu_per_eval(&http, prom.url(), prom.pid(), &rules, 20).await?
    } else {
        f64::NAN
    };
    log(&format!(
        "prometheus cpu per evaluation: gpu-ledger refresh {:.1} ms, peer rules {:.1} ms",
        ledger_cpu * 1000.0,
        peer_cpu * 1000.0
    ));

    // Event-to-metric: delete running 1-GPU pods (grace 0), poll gpu-ledger until their series go.
    let victims: Vec<PodPlan> = plans
        .iter()
        .filter(|p| p.gpus == 1 && p.node.is_some() && !p.hold)
        .take(a.deletions)
        .cloned()
        .collect();
    let deleted: Arc<std::sync::Mutex<BTreeMap<String, Instant>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (h, u, deleted, done) = (
            http.clone(),
            ledger_url.clone(),
            deleted.clone(),
            done.clone(),
        );
        let n = victims.len();
        tokio::spawn(async move {
            let mut gone: BTreeMap<String, f64> = BTreeMap::new();
            let deadline = Instant::now() + Duration::from_secs(600);
            while gone.len() < n && Instant::now() < deadline {
                let t = Instant::now();
                let Ok(text) = get_text(&h, &u).await else {
                    continue;
                };
                let pending: Vec<(String, Instant)> = deleted
                    .lock()
                    .expect("lock")
                    .iter()
                    .filter(|(k, _)| !gone.contains_key(*k))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                for (name, at) in pending {
                    if !text.contains(&format!("pod=\"{name}\"")) {
                        gone.insert(name, t.saturating_duration_since(at).as_secs_f64());
                    }
                }
                if done.load(std::sync::atomic::Ordering::Relaxed) && gone.len() >= n {
                    break;
                }
            }
            gone
        })
    };
    for v in &victims {
        let api: Api<Pod> = Api::namespaced(admin.clone(), &v.ns);
        deleted
            .lock()
            .expect("lock")
            .insert(v.name.clone(), Instant::now());
        api.delete(&v.name, &DeleteParams::default().grace_period(0))
            .await?;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let gone = poller.await?;
    let mut e2m: Vec<f64> = gone.values().copied().collect();
    log(&format!(
        "event-to-metric: {} of {} observed",
        e2m.len(),
        victims.len()
    ));

    // Memory slope: extra non-GPU pods, then extra (Pending) GPU pods.
    let no_ksm = ksm.is_none();
    let settle = |ksm_expect: usize, ledger_expect: usize| {
        let (h, ku, lu) = (http.clone(), ksm_url.clone(), ledger_url.clone());
        async move {
            poll_until(
                "both exporters caught up",
                Duration::from_secs(900),
                Duration::from_secs(2),
                || {
                    let (h, ku, lu) = (h.clone(), ku.clone(), lu.clone());
                    async move {
                        let k = if no_ksm {
                            usize::MAX
                        } else {
                            count_prefix(&get_text(&h, &ku).await?, "kube_pod_info{")
                        };
                        let l =
                            count_prefix(&get_text(&h, &lu).await?, "gpu_ledger_pod_owner_info{");
                        Ok((k >= ksm_expect && l >= ledger_expect).then_some(()))
                    }
                },
            )
            .await
        }
    };
    let base_total = total - victims.len();
    let base_gpu = gpu_pods - victims.len();
    settle(base_total, base_gpu).await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (k_a, l_a) = median_rss(ksm_pid, ledger.pid(), SLOPE_SAMPLES).await;
    let extra_plain: Vec<PodPlan> = (0..a.extra_pods)
        .map(|i| PodPlan {
            ns: format!("svc-{:02}", i % SVC_NAMESPACES),
            name: format!("extra-web-{i:05}"),
            node: Some(format!("gpu-node-{:04}", i % a.nodes)),
            gpus: 0,
            hold: false,
            util: 0,
            selector_none: false,
            dra: false,
        })
        .collect();
    create_pods(&admin, extra_plain, a.concurrency).await?;
    settle(base_total + a.extra_pods, base_gpu).await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (k_b, l_b) = median_rss(ksm_pid, ledger.pid(), SLOPE_SAMPLES).await;
    let extra_gpu: Vec<PodPlan> = (0..a.extra_pods)
        .map(|i| PodPlan {
            ns: format!("team-{:02}", i % GPU_NAMESPACES),
            name: format!("extra-queued-{i:05}"),
            node: None,
            gpus: 1,
            hold: false,
            util: 0,
            selector_none: true,
            dra: false,
        })
        .collect();
    create_pods(&admin, extra_gpu, a.concurrency).await?;
    settle(base_total + 2 * a.extra_pods, base_gpu + a.extra_pods).await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (k_c, l_c) = median_rss(ksm_pid, ledger.pid(), SLOPE_SAMPLES).await;
    let (_, ksm_hwm2) = ksm_status(ksm_pid);
    let (_, led_hwm2) = proc_status(ledger.pid());
    let per = |from: u64, to: u64| (to as f64 - from as f64) * 1024.0 / a.extra_pods as f64;

    // Report.
    let ratio = |l: f64, k: f64| if k > 0.0 { l / k } else { f64::NAN };
    let mut r = String::new();
    let _ = writeln!(
        r,
        "nodes: {} × 8 GPUs ({} GPUs); pods: {total} ({gpu_pods} GPU incl. {notebooks} notebooks, {} Terminating, {} Pending; {plain_pods} non-GPU){}; cluster set-up {setup_s:.0} s; gpu-ledger --refresh-interval {}\n",
        a.nodes,
        a.nodes * 8,
        held.len(),
        a.nodes / 10,
        if a.dra {
            format!("; DRA: {dra_pods} GPU pods and notebooks hold a ResourceClaim (1 GPU each)")
        } else {
            String::new()
        },
        a.refresh
    );
    let _ = writeln!(
        r,
        "| measure | gpu-ledger | kube-state-metrics | ratio (gpu-ledger / KSM) |"
    );
    let _ = writeln!(r, "| --- | ---: | ---: | ---: |");
    let mib = |k: u64| k as f64 / 1024.0;
    let row = |r: &mut String, name: &str, l: f64, k: f64, unit: &str| {
        if no_ksm {
            let _ = writeln!(r, "| {name} | {l:.2} {unit} | – | – |");
        } else {
            let _ = writeln!(
                r,
                "| {name} | {l:.2} {unit} | {k:.2} {unit} | {:.3} |",
                ratio(l, k)
            );
        }
    };
    row(
        &mut r,
        "time to first complete export",
        ledger_first,
        ksm_first,
        "s",
    );
    row(
        &mut r,
        "peak RSS (VmHWM, before slope phase)",
        mib(led_hwm),
        mib(ksm_hwm),
        "MiB",
    );
    row(
        &mut r,
        "steady RSS (VmRSS, median of 1 s samples over the window)",
        mib(led_rss),
        mib(ksm_rss),
        "MiB",
    );
    row(
        &mut r,
        "highest RSS in the steady window",
        mib(led_rss_max),
        mib(ksm_rss_max),
        "MiB",
    );
    row(
        &mut r,
        &format!("CPU over {} s steady window", window.as_secs()),
        l1 - l0,
        k1 - k0,
        "s",
    );
    row(
        &mut r,
        "/metrics p50",
        led_scrape.p50_ms,
        ksm_scrape.p50_ms,
        "ms",
    );
    row(
        &mut r,
        "/metrics p99",
        led_scrape.p99_ms,
        ksm_scrape.p99_ms,
        "ms",
    );
    row(
        &mut r,
        "bytes per scrape",
        led_scrape.bytes as f64 / 1024.0,
        ksm_scrape.bytes as f64 / 1024.0,
        "KiB",
    );
    row(
        &mut r,
        &format!("RSS per extra non-GPU pod (+{})", a.extra_pods),
        per(l_a, l_b),
        per(k_a, k_b),
        "B",
    );
    row(
        &mut r,
        &format!("RSS per extra GPU pod (+{} Pending)", a.extra_pods),
        per(l_b, l_c),
        per(k_b, k_c),
        "B",
    );
    row(
        &mut r,
        "peak RSS at the end",
        mib(led_hwm2),
        mib(ksm_hwm2),
        "MiB",
    );
    let _ = writeln!(r);
    let n = e2m.len();
    let _ = writeln!(
        r,
        "gpu-ledger event-to-metric (pod deleted with grace 0 → its series gone from /metrics, {n} deletions): p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        pct(&mut e2m, 0.5),
        pct(&mut e2m, 0.99),
        e2m.last().copied().unwrap_or(f64::NAN)
    );
    let _ = writeln!(
        r,
        "gpu-ledger refresh ({} GPUs): {refreshes} refreshes in {} s, mean {:.3} s, {:.1} Prometheus queries per refresh\n",
        a.nodes * 8,
        window.as_secs(),
        if refreshes > 0.0 {
            refresh_sum / refreshes
        } else {
            f64::NAN
        },
        if refreshes > 0.0 {
            queries / refreshes
        } else {
            f64::NAN
        }
    );
    let _ = writeln!(
        r,
        "Prometheus CPU per evaluation (20 back to back, minus its idle rate): gpu-ledger's steady refresh query {:.1} ms, the peer's two recording rules (allocated, allocated and idle per namespace) {:.1} ms, ratio {:.3}\n",
        ledger_cpu * 1000.0,
        peer_cpu * 1000.0,
        ledger_cpu / peer_cpu
    );
    let _ = writeln!(
        r,
        "| instant query (median of 5, HTTP wall time) | ms | series |"
    );
    let _ = writeln!(r, "| --- | ---: | ---: |");
    for (label, ms, series) in &promql {
        let _ = writeln!(r, "| {label} | {ms:.1} | {series} |");
    }
    println!("{r}");
    if let Some(out) = &a.out {
        std::fs::write(out, &r)?;
    }
    drop(ledger);
    drop(ksm);
    drop(prom);
    drop(dcgm);
    drop(cp);
    Ok(())
}
