//! Hostile DCGM input (issue 22, items 3, 9 and 10): impossible and future sample timestamps in an
//! offline dump (`report --from DIR`) and from a live Prometheus, oversized dump lines, and dump
//! paths that are not regular files.
//!
//! Offline cases run the real binary on a copy of `examples/homelab` with one hostile change and
//! compare its report with the untouched copy's. The live case drives the library's live source
//! against [`FakePrometheus`].
//!
//! **Test double:** [`FakePrometheus`] is a minimal HTTP server speaking the Prometheus query API
//! (`POST /api/v1/query`), answering from a scripted sample list. A real Prometheus evaluates a
//! range selector only up to the query time and never returns a sample stamped a day ahead; a
//! backend that does (a federating proxy, a store with a skewed clock) is what this double plays.

mod support;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpu_ledger::ledger::usage::Window;
use gpu_ledger::usage::live::{LiveSettings, LiveUsage};
use gpu_ledger::usage::prom::{PromClient, PromConfig};
use gpu_ledger::usage::scheme::SchemeChoice;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::{homelab, homelab_copy, report_json as report};

/// Runs the report, killing it after `limit` (a hang or a slow refusal is a failure, not a stuck
/// suite). `None` when it had to be killed.
fn report_within(dir: &Path, limit: Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "--from"])
        .arg(dir)
        .args(["-o", "json"])
        .env_remove("GPU_LEDGER_MAX_DUMP_SIZE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpu-ledger");
    let started = Instant::now();
    while started.elapsed() < limit {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json report")
}

fn alice(report: &Value) -> Value {
    report["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["pod"] == "alice-nb-0")
        .cloned()
        .expect("alice-nb-0 row")
}

/// The newest sample line of `field` for the lab-1 GPU (alice's), and its timestamp.
fn alice_line(dcgm: &str, field: &str) -> (String, i64) {
    let line = dcgm
        .lines()
        .rfind(|l| l.starts_with(field) && l.contains("Hostname=\"lab-1\""))
        .expect("alice's series");
    let (head, ts) = line.rsplit_once(' ').expect("timestamp");
    (head.to_string(), ts.parse().expect("ms timestamp"))
}

// --------------------------------------------------------------------------------------------
// Item 3: impossible timestamps
// --------------------------------------------------------------------------------------------

/// Samples at times that wrap i64 arithmetic (or lie before any DCGM existed) on both of alice's
/// utilisation signals: the idle history must read as before (2 h), not as the pod's whole
/// 104-day life, and no stop may be planned from it.
#[test]
fn impossible_sample_times_change_nothing_and_are_reported() {
    let clean = report(&homelab(), &["--cull-dry-run", "--cull-idle-after", "3h"]);
    let dir = homelab_copy();
    let path = dir.path().join("dcgm.prom");
    let mut dcgm = std::fs::read_to_string(&path).expect("dcgm");
    // One sample each so far back that the distance to the next one overflows i64 (it wrapped:
    // the run reached back past the pod's start, 104 days), and two merely impossible ones.
    let lab2 = |field: &str| {
        dcgm.lines()
            .find(|l| l.starts_with(field) && l.contains("Hostname=\"lab-2\""))
            .and_then(|l| l.rsplit_once(' '))
            .map(|(head, _)| head.to_string())
            .expect("lab-2 series")
    };
    let lines = [
        (
            alice_line(&dcgm, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").0,
            "-9223372036854775000",
        ),
        (
            alice_line(&dcgm, "DCGM_FI_DEV_GPU_UTIL").0,
            "-9223372036854775808",
        ),
        (lab2("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), "-9000000000000000"),
        (lab2("DCGM_FI_DEV_GPU_UTIL"), "0"),
    ];
    for (head, ts) in lines {
        writeln!(dcgm, "{head} {ts}").expect("write to string");
    }
    std::fs::write(&path, dcgm).expect("write");
    let hostile = report(dir.path(), &["--cull-dry-run", "--cull-idle-after", "3h"]);
    let stderr = String::from_utf8_lossy(&hostile.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let (clean, hostile_json) = (json(&clean), json(&hostile));
    assert_eq!(alice(&hostile_json)["idle_seconds"], 7200.0);
    assert_eq!(alice(&hostile_json), alice(&clean));
    assert_eq!(hostile_json["generated_at"], clean["generated_at"]);
    assert_eq!(hostile_json["cull"], clean["cull"], "no stop planned");
    assert!(
        stderr.contains("skipped 4 unparsable lines") && stderr.contains("impossible timestamp"),
        "the rejected lines are reported: {stderr}"
    );
}

// --------------------------------------------------------------------------------------------
// Item 9: oversized lines and files that are not regular
// --------------------------------------------------------------------------------------------

/// One 64 MiB line of NUL bytes (then a value, so it reads as a sample with a bad metric name) in
/// the middle of the dump: skipped without being buffered or echoed; the rest of the dump is read
/// as before.
#[test]
fn an_oversized_dump_line_is_skipped_and_not_echoed() {
    let clean = json(&report(&homelab(), &[]));
    let dir = homelab_copy();
    let path = dir.path().join("dcgm.prom");
    let dcgm = std::fs::read_to_string(&path).expect("dcgm");
    let (first, rest) = dcgm.split_at(dcgm.len() / 2);
    let (first, rest) = {
        let cut = first.len() + rest.find('\n').expect("line end") + 1;
        dcgm.split_at(cut)
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    f.write_all(first.as_bytes()).expect("write");
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..64 {
        f.write_all(&chunk).expect("write");
    }
    f.write_all(b" 1\n").expect("write");
    f.write_all(rest.as_bytes()).expect("write");
    f.into_inner().expect("flush").sync_all().expect("sync");

    let out = report(dir.path(), &[]);
    assert!(
        out.stderr.len() < 4096,
        "stderr must stay short: {} bytes, starting {:?}",
        out.stderr.len(),
        String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(300)])
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("dcgm.prom") && stderr.contains("longer than"),
        "{stderr}"
    );
    let hostile = json(&out);
    assert_eq!(hostile["pods"], clean["pods"]);
    assert_eq!(hostile["generated_at"], clean["generated_at"]);
}

fn assert_refused_not_regular(out: Option<Output>, what: &str) {
    let out = out.unwrap_or_else(|| panic!("{what}: not refused within 20 s"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: exit code; {stderr}");
    assert!(out.stdout.is_empty(), "{what}: no report");
    assert!(
        stderr.contains("dcgm.prom") && stderr.contains("not a regular file"),
        "{what}: {stderr}"
    );
    assert!(stderr.len() < 4096, "{what}: {stderr}");
}

/// `/dev/zero` linked as the dump, and a FIFO nobody writes to: refused at once, naming the file.
#[test]
fn a_dump_that_is_not_a_regular_file_is_refused_before_reading() {
    let dir = homelab_copy();
    let path = dir.path().join("dcgm.prom");
    std::fs::remove_file(&path).expect("rm");
    std::os::unix::fs::symlink("/dev/zero", &path).expect("symlink");
    assert_refused_not_regular(
        report_within(dir.path(), Duration::from_secs(20)),
        "symlink to /dev/zero",
    );

    std::fs::remove_file(&path).expect("rm");
    let made = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
    assert!(made.success());
    assert_refused_not_regular(report_within(dir.path(), Duration::from_secs(20)), "FIFO");
}

// --------------------------------------------------------------------------------------------
// Item 10: samples from the future
// --------------------------------------------------------------------------------------------

/// One sample a day after the dump's newest: the report stays at the dump's time, and a warning
/// says a sample lay beyond it.
#[test]
fn one_future_sample_does_not_move_the_offline_report() {
    let clean = json(&report(&homelab(), &[]));
    let dir = homelab_copy();
    let path = dir.path().join("dcgm.prom");
    let mut dcgm = std::fs::read_to_string(&path).expect("dcgm");
    let (head, newest) = alice_line(&dcgm, "DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    writeln!(dcgm, "{head} {}", newest + 86_400_000).expect("write to string");
    std::fs::write(&path, dcgm).expect("write");
    let out = report(dir.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let hostile = json(&out);
    assert_eq!(hostile["generated_at"], clean["generated_at"], "{stderr}");
    assert_eq!(hostile["pods"], clean["pods"]);
    assert!(
        stderr.contains("dcgm.prom") && stderr.contains("1 sample") && stderr.contains("beyond"),
        "a warning names the future sample: {stderr}"
    );
}

/// A scripted Prometheus: every range-selector query is answered with all scripted samples newer
/// than the range start (including any stamped after the query time); every other query (the
/// start-up history) with an empty vector.
struct FakePrometheus {
    addr: std::net::SocketAddr,
    samples: Arc<Mutex<Vec<(i64, f64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakePrometheus {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let samples: Arc<Mutex<Vec<(i64, f64)>>> = Arc::default();
        let s = samples.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = answer(sock, &s).await;
                });
            }
        });
        FakePrometheus {
            addr,
            samples,
            task,
        }
    }

    fn push(&self, t_ms: i64, v: f64) {
        self.samples.lock().expect("lock").push((t_ms, v));
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Percent-decoding of one form value (`+` is a space).
fn form_value(body: &str, key: &str) -> String {
    let raw = body
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_default();
    let mut out = Vec::new();
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("hex");
                out.push(u8::from_str_radix(hex, 16).expect("hex"));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).expect("utf8")
}

async fn answer(mut sock: TcpStream, samples: &Mutex<Vec<(i64, f64)>>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let body = loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                break String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
            }
        }
    };
    let query = form_value(&body, "query");
    let time: f64 = form_value(&body, "time").parse().expect("time");
    let data = if query.starts_with("{__name__=~") {
        // `…}[600000ms]`
        let range_ms: i64 = query
            .rsplit_once('[')
            .and_then(|(_, r)| r.strip_suffix("ms]"))
            .and_then(|r| r.parse().ok())
            .expect("range in ms");
        let start = (time * 1000.0) as i64 - range_ms;
        let values: Vec<Value> = samples
            .lock()
            .expect("lock")
            .iter()
            .filter(|(t, _)| *t > start)
            .map(|(t, v)| serde_json::json!([*t as f64 / 1000.0, v.to_string()]))
            .collect();
        serde_json::json!({"resultType": "matrix", "result": [{
            "metric": {"__name__": "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "UUID": "GPU-x", "Hostname": "n1"},
            "values": values,
        }]})
    } else {
        serde_json::json!({"resultType": "vector", "result": []})
    };
    let body = serde_json::json!({"status": "success", "data": data}).to_string();
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(reply.as_bytes()).await?;
    sock.shutdown().await
}

/// A 90 %-busy device, then one sample stamped a day ahead: later refreshes still see the device
/// busy (before the fix, the window only took samples newer than the future one, so the device
/// went stale and vanished from `unclaimed_busy` for a day).
#[tokio::test]
async fn a_future_sample_does_not_blind_the_live_window() {
    let fake = FakePrometheus::start().await;
    let client = PromClient::new(PromConfig::new(
        format!("http://{}/", fake.addr).parse().expect("url"),
        Duration::from_secs(30),
    ))
    .expect("client");
    let window = Window {
        length: chrono::Duration::minutes(10),
        interval: chrono::Duration::seconds(30),
        idle_threshold: 0.05,
        max_staleness: chrono::Duration::minutes(2),
    };
    let mut live = LiveUsage::new(
        Some(Arc::new(client)),
        LiveSettings {
            scheme: SchemeChoice::Auto,
            window,
            history_lookback: chrono::Duration::hours(1),
            min_coverage: 0.8,
        },
    );
    let t0: i64 = 1_795_849_200_000;
    let at = |ms: i64| DateTime::<Utc>::from_timestamp_millis(ms).expect("time");
    for k in 0..=20 {
        fake.push(t0 - 600_000 + k * 30_000, 0.9);
    }
    fake.push(t0 + 86_400_000, 0.9);
    let first = live.fetch_at(at(t0)).await;
    assert!(first.error.is_none(), "{:?}", first.error);
    // Ten more minutes of busy samples, refreshed every 30 s as `serve` does.
    for k in 1..=20 {
        let now = t0 + k * 30_000;
        fake.push(now, 0.9);
        let fetched = live.fetch_at(at(now)).await;
        assert!(fetched.error.is_none(), "{:?}", fetched.error);
        let dev = fetched
            .usage
            .devices
            .iter()
            .find(|d| d.key.uuid == "GPU-x")
            .unwrap_or_else(|| panic!("refresh {k}: device gone"));
        assert_eq!(
            dev.utilization,
            Some(0.9),
            "refresh {k}: the device must still read busy"
        );
    }
}
