//! The plain-HTTP admin server (the default) under slow and numerous clients, as a real client
//! sees it: `export::tls::serve` over the real router on a loopback port, raw TCP clients.
//!
//! * `half_sent_requests_are_closed_by_the_header_timeout`: 200 clients that send a request
//!   line and stop, one that sends nothing, and one idle keep-alive connection are closed by
//!   the server within the header-read timeout (plus slack for a busy machine).
//! * `livez_answers_while_the_connection_cap_is_reached`: more half-sent connections than the
//!   cap are not all held open (the process holds at most the cap plus the reserve), and a
//!   fresh client's `/livez` is still answered well before the header timeout frees a slot.
//!
//! No control plane: the server is what is under test.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use arc_swap::ArcSwap;
use chrono::Utc;
use gpu_ledger::export::Snapshot;
use gpu_ledger::export::server::{self, AppState, Probes};
use gpu_ledger::export::tls;
use gpu_ledger::ledger::Ledger;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The tests count this process's descriptors: one server at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Slack on top of the server's timeouts: the machine runs other tests at the same time.
const SLACK: Duration = Duration::from_secs(20);

struct AlwaysLive;

impl Probes for AlwaysLive {
    fn live(&self) -> Result<(), String> {
        Ok(())
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The real router on a loopback port, plain HTTP, default limits.
async fn start() -> Result<(std::net::SocketAddr, CancellationToken)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = AppState {
        registry: prometheus::Registry::new(),
        snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::new(Ledger::empty(
            Utc::now(),
        )))),
        probes: Arc::new(AlwaysLive),
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
