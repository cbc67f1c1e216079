//! The plain-HTTP admin server (the default) under slow and numerous clients, as a real client
//! sees it: `export::tls::serve` over the real router on a loopback port, raw TCP clients.
//!
//! * `half_sent_requests_are_closed_by_the_header_timeout`: 200 clients that send a request
//!   line and stop, one that sends nothing, and one idle keep-alive connection are closed by
//!   the server within the header-read timeout (plus slack for a busy machine).
//! * `livez_answers_while_the_connection_cap_is_reached`: more half-sent connections than the
//!   cap are not all held open (the process holds at most the cap plus the reserve), and a
//!   fresh client's `/livez` is still answered well before the header timeout frees a slot.
//! * `slow_readers_of_large_answers_stay_within_memory`: 300 clients ask for `/` and `/metrics`
//!   of 3,000 GPU pods and never read. The process's resident memory grows by at most the
//!   in-flight cap's worth of answers (it grew by one answer per client before), every slow
//!   client is dropped within the write timeout, and a normal client gets the page meanwhile.
//!
//! No control plane: the server is what is under test.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use arc_swap::ArcSwap;
use chrono::Utc;
use gpu_ledger::export::server::{self, AppState, Probes};
use gpu_ledger::export::tls;
use gpu_ledger::ledger::accounting::Snapshot;
use gpu_ledger::ledger::claims::{Claims, NodeInfo};
use gpu_ledger::ledger::units::ResourceNames;
use gpu_ledger::ledger::usage::Usage;
use gpu_ledger::ledger::{self, Ledger, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The tests count this process's descriptors: one server at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Slack on top of the server's timeouts: the machine runs other tests at the same time.
const SLACK: Duration = Duration::from_secs(20);
const WRITE_TIMEOUT: Duration = tls::DEFAULT_WRITE_TIMEOUT;
const SLOT_WAIT: Duration = server::SLOT_WAIT;
const MAX_INFLIGHT: usize = server::DEFAULT_MAX_INFLIGHT_RESPONSES;

struct AlwaysLive;

impl Probes for AlwaysLive {
    fn live(&self) -> Result<(), String> {
        Ok(())
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The real router on a loopback port, plain HTTP, default limits, serving an empty ledger.
async fn start() -> Result<(std::net::SocketAddr, CancellationToken)> {
    start_with(Ledger::empty(Utc::now())).await
}

/// The real router on a loopback port, plain HTTP, default limits, serving `ledger`.
async fn start_with(ledger: Ledger) -> Result<(std::net::SocketAddr, CancellationToken)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = AppState {
        registry: prometheus::Registry::new(),
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(ledger))),
        probes: Arc::new(AlwaysLive),
        page: Arc::new(gpu_ledger::app::page::HtmlPage),
    };
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tls::serve(
            listener,
            server::router(state),
            None,
            tls::Limits::default(),
            stop,
        )
        .await
    });
    Ok((addr, cancel))
}

/// A connection that sent a request line and nothing more.
async fn half_sent(addr: std::net::SocketAddr) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(b"GET /livez HTTP/1.1\r\n").await?;
    Ok(s)
}

/// Waits until the server closes `s` (EOF or reset), at most `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Result<()> {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => bail!("still open after {within:?}"),
            Ok(Ok(0) | Err(_)) => return Ok(()),
            // A 408 or similar before the close is fine.
            Ok(Ok(_)) => {}
        }
    }
}

/// One `GET /livez` on a fresh connection; the status line.
async fn livez(addr: std::net::SocketAddr) -> Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let text = String::from_utf8_lossy(&out);
    Ok(text.lines().next().unwrap_or_default().to_string())
}

fn open_fds() -> Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_by_the_header_timeout() -> Result<()> {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (addr, cancel) = start().await?;
    let mut slow = Vec::new();
    for _ in 0..200 {
        slow.push(half_sent(addr).await?);
    }
    let mut silent = TcpStream::connect(addr).await?;
    // An idle keep-alive connection: one full request answered, then nothing.
    let mut idle = TcpStream::connect(addr).await?;
    idle.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .context("the keep-alive request is answered")??;
    ensure!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );

    let within = tls::HEADER_READ_TIMEOUT + SLACK;
    for (i, s) in slow.iter_mut().enumerate() {
        closed_within(s, within)
            .await
            .with_context(|| format!("half-sent connection {i}"))?;
    }
    closed_within(&mut idle, within)
        .await
        .context("idle keep-alive connection")?;
    closed_within(&mut silent, within)
        .await
        .context("connection that sent nothing")?;
    cancel.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_answers_while_the_connection_cap_is_reached() -> Result<()> {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (addr, cancel) = start().await?;
    let cap = tls::Limits::default().max_connections;
    let extra = 400;
    let before = open_fds()?;
    let mut slow = Vec::new();
    for _ in 0..cap + tls::RESERVE_CONNECTIONS + extra {
        slow.push(half_sent(addr).await?);
    }
    let started = tokio::time::Instant::now();
    // A fresh client is answered long before the header timeout frees a capped slot.
    let mut answered = None;
    let within = tls::HEADER_READ_TIMEOUT.saturating_sub(Duration::from_secs(3));
    while started.elapsed() < within {
        match tokio::time::timeout(Duration::from_secs(2), livez(addr)).await {
            Ok(Ok(line)) if line.starts_with("HTTP/1.1 200") => {
                answered = Some(started.elapsed());
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let held = open_fds()?
        .saturating_sub(before)
        .saturating_sub(slow.len());
    ensure!(
        answered.is_some(),
        "/livez not answered within {within:?} with {} half-sent connections open",
        slow.len()
    );
    // Our side holds one descriptor per client; the server at most cap + reserve (+ a few).
    ensure!(
        held <= cap + tls::RESERVE_CONNECTIONS + 16,
        "the server holds {held} connections; cap {cap} + reserve {}",
        tls::RESERVE_CONNECTIONS
    );
    cancel.cancel();
    Ok(())
}

/// GPU pods of the large ledger: the size of the cluster the issue measured.
const GPU_PODS: usize = 3_000;

/// `GPU_PODS` running single-GPU pods on 8-GPU nodes, projected as the pod watch projects them.
fn large_ledger() -> Result<Ledger> {
    let names = ResourceNames::default();
    let node_count = GPU_PODS.div_ceil(8);
    let mut pods = Vec::with_capacity(GPU_PODS);
    for i in 0..GPU_PODS {
        let (node, gpu) = (i / 8, i % 8);
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": format!("train-{node:04}-{gpu}"), "namespace": format!("team-{:02}", i % 20),
                "uid": format!("6f1c2d3e-{i:08}"), "creationTimestamp": "2026-09-21T10:00:00Z",
                "labels": {"app": "train"},
            },
            "spec": {
                "nodeName": format!("gpu-node-{node:04}"),
                "containers": [{"name": "main", "image": "train",
                    "resources": {"limits": {"nvidia.com/gpu": "1"},
                                  "requests": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running", "startTime": "2026-09-21T10:00:05Z"},
        }))?;
        let claim = gpu_ledger::claims::project::pod(&names, &pod)?
            .context("a GPU pod projects to a claim")?;
        pods.push(Arc::new(claim));
    }
    let nodes = (0..node_count)
        .map(|n| NodeInfo {
            hami: gpu_ledger::ledger::hami_inputs::HamiNode::default(),
            name: format!("gpu-node-{n:04}"),
            labels: std::collections::BTreeMap::default(),
            allocatable: [("nvidia.com/gpu".to_string(), 8)].into(),
            replicas: 1,
            product: Some("NVIDIA-H100-80GB-HBM3".into()),
            gpu_labels: std::collections::BTreeMap::default(),
            taints: Vec::new(),
            ready: Some(true),
        })
        .collect();
    let claims = Claims {
        pods,
        nodes,
        ..Claims::default()
    };
    let usage = Usage {
        hami: Vec::new(),
        devices: Vec::new(),
        available: true,
        partial: false,
        ..Usage::default()
    };
    Ok(ledger::build(
        &claims,
        &usage,
        Utc::now(),
        &Policy::default(),
    ))
}

/// This process's resident memory in bytes (`VmRSS` of /proc/self/status).
fn rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/self/status")?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib.saturating_mul(1024))
}

/// One `GET path` on a fresh connection, read to the end: the status line and the body length.
async fn get(addr: std::net::SocketAddr, path: &str) -> Result<(String, usize)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of the response head")?;
    let text = String::from_utf8_lossy(&out[..head_end]);
    let status = text.lines().next().unwrap_or_default().to_string();
    Ok((status, out.len() - head_end - 4))
}

/// A client that asks for `path` and never reads. A small receive buffer and an Ethernet-sized
/// segment: on loopback's 64 KiB segments the kernel would grow the server's send buffer to
/// megabytes and take the answer off the process, which a client over a real network does not.
async fn never_reads(addr: std::net::SocketAddr, path: &str) -> Result<TcpStream> {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_tcp_mss(1460)?;
    socket.set_recv_buffer_size(4096)?;
    socket.set_nonblocking(true)?;
    let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
    let mut s = socket.connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await?;
    Ok(s)
}

/// What a slow reader received by the time the server closed its connection.
enum Got {
    /// 503: no slot for a large answer.
    Busy,
    /// A 200 whose body stops before its Content-Length.
    CutShort,
    /// A whole answer (its status line).
    Whole(String),
}

/// Reads `s` until the server closes it (EOF or reset; 5 s at most, the server closed it
/// already) and says what it held.
async fn read_until_closed(mut s: TcpStream) -> Result<Got> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Err(_) => bail!("still open after 5 s of reading"),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("{} bytes without a whole response head", out.len()))?;
    let head = String::from_utf8_lossy(&out[..head_end]).to_ascii_lowercase();
    let status = head.lines().next().unwrap_or_default().to_string();
    if status.starts_with("http/1.1 503") {
        return Ok(Got::Busy);
    }
    ensure!(status.starts_with("http/1.1 200"), "{status}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .context("a 200 without Content-Length")?
        .trim()
        .parse()?;
    if out.len() - head_end - 4 < length {
        Ok(Got::CutShort)
    } else {
        Ok(Got::Whole(status))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_of_large_answers_stay_within_memory() -> Result<()> {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (addr, cancel) = start_with(large_ledger()?).await?;
    // One normal read of each first: their sizes, and a baseline that holds one render's
    // worth of allocator pages already.
    let (page_status, page_len) = get(addr, "/").await?;
    let (metrics_status, metrics_len) = get(addr, "/metrics").await?;
    ensure!(page_status.starts_with("HTTP/1.1 200"), "/: {page_status}");
    ensure!(
        metrics_status.starts_with("HTTP/1.1 200"),
        "/metrics: {metrics_status}"
    );
    let largest = page_len.max(metrics_len) as u64;
    let baseline = rss_bytes()?;
    let fds_before = open_fds()?;

    let peak = Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let sampling = CancellationToken::new();
    let sampler = {
        let (peak, stop) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(now) = rss_bytes() {
                    peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let clients = 300;
    let mut slow = Vec::with_capacity(clients);
    for i in 0..clients {
        let path = if i % 2 == 0 { "/" } else { "/metrics" };
        slow.push(never_reads(addr, path).await?);
    }

    // A normal client is served meanwhile: /livez at once, the page once a slot is free.
    let started = tokio::time::Instant::now();
    let (livez_status, _) = tokio::time::timeout(Duration::from_secs(10), get(addr, "/livez"))
        .await
        .context("/livez while slow readers hold the server")??;
    ensure!(
        livez_status.starts_with("HTTP/1.1 200"),
        "/livez: {livez_status}"
    );
    let within = WRITE_TIMEOUT + SLOT_WAIT + SLACK;
    let mut page = None;
    while started.elapsed() < within {
        if let Ok(Ok((status, len))) =
            tokio::time::timeout(Duration::from_secs(10), get(addr, "/")).await
            && status.starts_with("HTTP/1.1 200")
        {
            page = Some(len);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(
        page == Some(page_len),
        "a normal client got no complete page within {within:?} ({page:?} of {page_len} bytes)"
    );

    // Every slow reader is dropped by the server (its descriptor closed) without reading: all
    // of them, since reading one still held would let it finish.
    let mut held = usize::MAX;
    while started.elapsed() < within {
        held = open_fds()?
            .saturating_sub(fds_before)
            .saturating_sub(slow.len());
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sampling.cancel();
    sampler.await?;
    let grown = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(baseline);
    let mib = |b: u64| b / (1024 * 1024);
    eprintln!(
        "{clients} slow readers of / ({page_len} B) and /metrics ({metrics_len} B): RSS {} MiB -> peak +{} MiB; server still holds {held} of them after {:?}",
        mib(baseline),
        mib(grown),
        started.elapsed()
    );
    // Each answer in flight: the rendered body plus the renderer's transients; then slack
    // for allocator pages and the connections' own buffers.
    let bound = (MAX_INFLIGHT as u64) * 4 * largest + 64 * 1024 * 1024;
    ensure!(
        grown <= bound,
        "RSS grew by {} MiB with {clients} slow readers; bound {} MiB ({MAX_INFLIGHT} answers of at most {largest} bytes in flight)",
        mib(grown),
        mib(bound)
    );
    ensure!(
        held == 0,
        "the server still holds {held} slow readers after {within:?}"
    );
    // What the slow readers got, now read: a 503 (no slot) or a 200 cut short (dropped by the
    // write timeout); never a whole answer the server kept in memory until it was read.
    let mut readers = tokio::task::JoinSet::new();
    for s in slow {
        readers.spawn(read_until_closed(s));
    }
    let (mut refused, mut cut_short) = (0, 0);
    while let Some(got) = readers.join_next().await {
        match got?? {
            Got::Busy => refused += 1,
            Got::CutShort => cut_short += 1,
            Got::Whole(status) => bail!("a slow reader got a whole answer: {status}"),
        }
    }
    eprintln!("slow readers: {refused} answered 503, {cut_short} dropped mid-answer");
    ensure!(cut_short > 0, "no slow reader was given a slot");
    cancel.cancel();
    Ok(())
}
