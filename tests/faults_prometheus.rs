//! Prometheus misbehaving in front of a real `gpu-ledger serve` with culling on: answering 500,
//! answering malformed JSON, and answering slower than `--prometheus-timeout`. Each time users
//! must see allocation keep flowing, utilisation become unknown (absent, never 0), the source-up
//! gauge drop, `/readyz` stay ready and nothing culled; once Prometheus behaves, the ledger
//! recovers within a few refreshes (and the idle notebook is then stopped, which shows the
//! outage — not a broken culler — is what held it back).
//!
//! **Test double:** [`FaultProxy`] is a small HTTP proxy in front of the real Prometheus that
//! injects the faults; no real component answers 500 or truncated JSON on demand, nor adds a
//! sample stamped a day after the query time to an answer (`FUTURE_ONCE`, issue 22 item 10).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::stack::{
    GpuLedgerProcess, Notebook, metric_value, spawn_notebook_stop_rule,
};
use serde_json::Value;
use support::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const NS: &str = "team-ml";
const WAIT: Duration = Duration::from_secs(60);

const PASS: u8 = 0;
const ERROR_500: u8 = 1;
const MALFORMED: u8 = 2;
const SLOW: u8 = 3;
/// Forward, add one sample stamped a day after each series' newest to the next matrix answer,
/// then back to `PASS`.
const FUTURE_ONCE: u8 = 4;

/// One request per connection: read it, then forward it or inject the current fault.
struct FaultProxy {
    addr: std::net::SocketAddr,
    mode: Arc<AtomicU8>,
    /// Answers `FUTURE_ONCE` has changed.
    injected: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    async fn start(upstream: &str) -> Self {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let mode = Arc::new(AtomicU8::new(PASS));
        let injected = Arc::new(AtomicUsize::new(0));
        let (m, inj) = (mode.clone(), injected.clone());
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (m, inj, up) = (m.clone(), inj.clone(), upstream.clone());
                tokio::spawn(async move {
                    let mode = m.load(Ordering::SeqCst);
                    if mode == FUTURE_ONCE {
                        let _ = inject_future(sock, &up, &m, &inj).await;
                    } else {
                        let _ = handle(sock, &up, mode).await;
                    }
                });
            }
        });
        FaultProxy {
            addr,
            mode,
            injected,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_request(sock: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(buf);
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
                return Ok(buf);
            }
        }
    }
}

async fn handle(mut sock: TcpStream, upstream: &str, mode: u8) -> std::io::Result<()> {
    let request = read_request(&mut sock).await?;
    let reply = |status: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    match mode {
        ERROR_500 => {
            let body = r#"{"status":"error","errorType":"internal","error":"injected fault"}"#;
            sock.write_all(reply("500 Internal Server Error", body).as_bytes())
                .await?;
        }
        MALFORMED => {
            sock.write_all(
                reply(
                    "200 OK",
                    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":"#,
                )
                .as_bytes(),
            )
            .await?;
        }
        SLOW => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            sock.write_all(
                reply(
                    "200 OK",
                    r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                )
                .as_bytes(),
            )
            .await?;
        }
        _ => {
            // Forward with `Connection: close` so every request sees the mode of its time.
            let text = String::from_utf8_lossy(&request).into_owned();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            let head: Vec<&str> = head
                .lines()
                .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                .collect();
            let forwarded = format!("{}\r\nConnection: close\r\n\r\n{body}", head.join("\r\n"));
            let mut up = TcpStream::connect(upstream).await?;
            up.write_all(forwarded.as_bytes()).await?;
            let mut response = Vec::new();
            up.read_to_end(&mut response).await?;
            sock.write_all(&response).await?;
        }
    }
    sock.shutdown().await
}

async fn row(gl: &GpuLedgerProcess, pod: &str) -> Option<Value> {
    gl.pod_row(NS, pod).await
}

async fn stopped(admin: &kube::Client, name: &str) -> bool {
    support::notebook_stopped(admin, NS, name).await
}

/// While Prometheus misbehaves: allocation flows, utilisation unknown, source down, ready, no stop.
async fn assert_blind_but_safe(gl: &GpuLedgerProcess, admin: &kube::Client, fault: &str) {
    let metrics = eventually(
        &format!("{fault}: prometheus source down"),
        WAIT,
        || async {
            let text = gl.metrics_text().await.ok()?;
            (metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]) == Some(0.0))
                .then_some(text)
        },
    )
    .await;
    assert!(
        metric_value(&metrics, "gpu_ledger_pod_gpus", &[("pod", "busy")]).is_some(),
        "{fault}: allocation must keep flowing"
    );
    assert!(
        metric_value(
            &metrics,
            "gpu_ledger_pod_gpu_utilization_ratio",
            &[("pod", "busy")]
        )
        .is_none(),
        "{fault}: utilisation must be absent (unknown), not 0"
    );
    let busy = row(gl, "busy").await.expect("busy row");
    assert!(
        busy["utilization"].is_null() && busy["idle"].is_null(),
        "{fault}: {busy}"
    );
    assert_eq!(
        gl.status("/readyz").await.expect("readyz"),
        200,
        "{fault}: stays ready"
    );
    // Longer than --cull-idle-after: a blind culler would have acted by now.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !stopped(admin, "idle-nb").await,
        "{fault}: nothing may be culled while blind"
    );
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_faults_blind_but_never_cull() {
    let stack = support::tier_b(
        &[GpuNode::new("n1", 1), GpuNode::new("n2", 1)],
        support::Grants::Culling,
    )
    .await;
    let admin = stack.admin();
    stack.ensure_namespace(NS).await.expect("namespace");
    let _stop_rule = spawn_notebook_stop_rule(admin.clone());
    stack
        .create_gpu_pod(NS, "busy", 1, Some(90.0))
        .await
        .expect("busy pod");
    stack
        .create_notebook(&Notebook::new(NS, "idle-nb").utilization(0.0))
        .await
        .expect("idle notebook");
    stack
        .wait_pod_running(NS, "busy")
        .await
        .expect("busy running");
    stack
        .wait_pod_running(NS, "idle-nb-0")
        .await
        .expect("notebook running");

    // Prometheus is broken from the start: readiness must not depend on it.
    let proxy = FaultProxy::start(stack.prometheus.url()).await;
    proxy.set(ERROR_500);
    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &[
                "--prometheus-url",
                &proxy.url(),
                "--prometheus-timeout",
                "2s",
                "--cull=on",
                "--cull-idle-after",
                "5s",
                "--cull-min-runtime",
                "1s",
            ],
        )
        .await
        .expect("gpu-ledger ready while prometheus answers 500");
    assert_blind_but_safe(&gl, &admin, "HTTP 500").await;

    proxy.set(MALFORMED);
    assert_blind_but_safe(&gl, &admin, "malformed JSON").await;

    proxy.set(SLOW);
    assert_blind_but_safe(&gl, &admin, "slower than the timeout").await;
    let errors = metric_value(
        &gl.metrics_text().await.expect("metrics"),
        "gpu_ledger_prometheus_query_errors_total",
        &[],
    );
    assert!(
        errors.is_some_and(|e| e >= 3.0),
        "errors counted: {errors:?}"
    );

    // Healthy again: recovery within a few refreshes, then the idle notebook is stopped.
    proxy.set(PASS);
    let busy = eventually("utilisation back", WAIT, || async {
        row(&gl, "busy")
            .await
            .filter(|r| r["utilization"].is_number())
    })
    .await;
    assert!(
        (busy["utilization"].as_f64().expect("number") - 0.9).abs() < 0.01,
        "{busy}"
    );
    let text = gl.metrics_text().await.expect("metrics");
    assert_eq!(
        metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]),
        Some(1.0)
    );
    eventually(
        "idle notebook stopped once evidence is back",
        WAIT,
        || async { stopped(&admin, "idle-nb").await.then_some(()) },
    )
    .await;
}

/// `FUTURE_ONCE`: forwards the request as HTTP/1.0 (so the answer is not chunked); when the
/// answer is a matrix and no other request got there first, adds one sample a day after each
/// series' newest (value 0.9) and switches the proxy back to `PASS`.
async fn inject_future(
    mut sock: TcpStream,
    upstream: &str,
    mode: &AtomicU8,
    injected: &AtomicUsize,
) -> std::io::Result<()> {
    let request = read_request(&mut sock).await?;
    let text = String::from_utf8_lossy(&request).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines: Vec<String> = head
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .map(str::to_string)
        .collect();
    if let Some(first) = lines.first_mut() {
        *first = first.replace("HTTP/1.1", "HTTP/1.0");
    }
    let forwarded = format!("{}\r\nConnection: close\r\n\r\n{body}", lines.join("\r\n"));
    let mut up = TcpStream::connect(upstream).await?;
    up.write_all(forwarded.as_bytes()).await?;
    let mut response = Vec::new();
    up.read_to_end(&mut response).await?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(response.len(), |i| i + 4);
    let mut answer: Option<Value> = serde_json::from_slice(&response[split..]).ok();
    let is_matrix = answer
        .as_ref()
        .is_some_and(|a| a["data"]["resultType"] == "matrix");
    let reply = match answer.as_mut() {
        Some(a)
            if is_matrix
                && mode
                    .compare_exchange(FUTURE_ONCE, PASS, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() =>
        {
            for series in a["data"]["result"].as_array_mut().into_iter().flatten() {
                let Some(values) = series["values"].as_array_mut() else {
                    continue;
                };
                let newest = values
                    .last()
                    .and_then(|v| v[0].as_f64())
                    .unwrap_or_default();
                values.push(serde_json::json!([newest + 86_400.0, "0.9"]));
            }
            injected.fetch_add(1, Ordering::SeqCst);
            let body = a.to_string();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
        _ => response,
    };
    sock.write_all(&reply).await?;
    sock.shutdown().await
}

/// Issue 22 item 10: one sample stamped a day ahead in an answer must not blind a busy GPU. The
/// sample is dropped before the window and counted; the busy pod keeps reading 90 % on every
/// refresh after it (before the fix the window refused every later sample of the series, and the
/// pod's utilisation went unknown within the 5 s staleness limit, for a day).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_sample_in_an_answer_does_not_blind_a_busy_gpu() {
    let stack = support::tier_b(&[GpuNode::new("n1", 1)], support::Grants::ReadOnly).await;
    stack.ensure_namespace(NS).await.expect("namespace");
    stack
        .create_gpu_pod(NS, "busy", 1, Some(90.0))
        .await
        .expect("busy pod");
    stack
        .wait_pod_running(NS, "busy")
        .await
        .expect("busy running");
    let proxy = FaultProxy::start(stack.prometheus.url()).await;
    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &["--prometheus-url", &proxy.url()],
        )
        .await
        .expect("gpu-ledger ready");
    let busy = |r: &Value| {
        r["utilization"]
            .as_f64()
            .is_some_and(|u| (u - 0.9).abs() < 0.01)
    };
    eventually("busy pod reads 90 %", WAIT, || async {
        row(&gl, "busy").await.filter(|r| busy(r))
    })
    .await;

    proxy.set(FUTURE_ONCE);
    eventually("a future sample injected", WAIT, || async {
        (proxy.injected.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    // Longer than the window (10 s) plus the staleness limit (5 s), one look per refresh.
    for second in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = row(&gl, "busy").await.expect("busy row");
        assert!(
            busy(&r),
            "{second} s after the future sample: {r}\n{}",
            gl.log_tail(20)
        );
    }
    let text = gl.metrics_text().await.expect("metrics");
    let rejected = metric_value(
        &text,
        "gpu_ledger_prometheus_samples_rejected_total",
        &[("reason", "future")],
    );
    assert!(rejected.is_some_and(|n| n >= 1.0), "counted: {rejected:?}");
    assert_eq!(
        metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]),
        Some(1.0)
    );
}

const FAKE_PASS: u8 = 0;
const FAKE_WARNINGS: u8 = 1;
const FAKE_HUGE_LABEL: u8 = 2;

/// Size of the label value [`FakePrometheus`] answers in [`FAKE_HUGE_LABEL`] mode: twice the
/// bound gpu-ledger accepts is enough to be refused; 8 MiB makes a copy of it show in RSS.
const HUGE_LABEL_BYTES: usize = 8 << 20;

/// **Test double of Prometheus' HTTP API** (`POST /api/v1/query`), for answers a real Prometheus
/// cannot be made to give. Every query is forwarded to the real Prometheus of the stack, and by
/// mode the answer is:
/// * [`FAKE_PASS`]: passed through unchanged;
/// * [`FAKE_WARNINGS`]: the real answer with `"warnings"` added, as Thanos or Mimir answer when
///   a store did not respond (a partial response; a lone Prometheus only warns when a remote
///   read fails, so it cannot produce one on demand);
/// * [`FAKE_HUGE_LABEL`]: a canned matrix with one series whose `pod` label is
///   [`HUGE_LABEL_BYTES`] long (Prometheus never stores such a label from a sane exporter,
///   but nothing stops a misconfigured or hostile endpoint answering it).
struct FakePrometheus {
    addr: std::net::SocketAddr,
    mode: Arc<AtomicU8>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Clone)]
struct FakeState {
    upstream: String,
    http: reqwest::Client,
    mode: Arc<AtomicU8>,
    huge: Arc<String>,
}

impl FakePrometheus {
    async fn start(upstream: &str) -> Self {
        let mode = Arc::new(AtomicU8::new(FAKE_PASS));
        let state = FakeState {
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            mode: mode.clone(),
            huge: Arc::new("x".repeat(HUGE_LABEL_BYTES)),
        };
        let app = axum::Router::new()
            .fallback(fake_prometheus_answer)
            .with_state(state);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        FakePrometheus {
            addr,
            mode,
            stop: Some(stop),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn fake_prometheus_answer(
    axum::extract::State(s): axum::extract::State<FakeState>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (
    axum::http::StatusCode,
    [(&'static str, &'static str); 1],
    String,
) {
    let json = [("content-type", "application/json")];
    let mode = s.mode.load(Ordering::SeqCst);
    if mode == FAKE_HUGE_LABEL {
        let answer = format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","UUID":"GPU-huge","Hostname":"n1","namespace":"{NS}","pod":"{}"}},"values":[[{},"0"]]}}]}}}}"#,
            s.huge,
            chrono::Utc::now().timestamp()
        );
        return (axum::http::StatusCode::OK, json, answer);
    }
    let mut req = s.http.post(format!("{}{uri}", s.upstream)).body(body);
    if let Some(ct) = headers.get("content-type") {
        req = req.header("content-type", ct.as_bytes());
    }
    let Ok(resp) = req.send().await else {
        return (axum::http::StatusCode::BAD_GATEWAY, json, String::new());
    };
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let text = match (mode, serde_json::from_str::<Value>(&text)) {
        (FAKE_WARNINGS, Ok(mut v)) => {
            v["warnings"] = serde_json::json!([
                "fake: store gpu-store-b (10.0.0.7:10901) did not answer: context deadline exceeded"
            ]);
            v.to_string()
        }
        _ => text,
    };
    (
        axum::http::StatusCode::from_u16(status.as_u16()).unwrap_or(axum::http::StatusCode::OK),
        json,
        text,
    )
}

fn counter(text: &str, family: &str) -> f64 {
    metric_value(text, family, &[]).unwrap_or(0.0)
}

/// Issue 22 (item 8 and the `warnings` part of item 12): a Prometheus answer is bounded and a
/// partial one proves nothing idle. Through [`FakePrometheus`]: an idle pod is first proven
/// idle (the double passes answers through); with `warnings` on every answer it is unknown
/// while the busy pod stays busy and the warnings are counted; with one 8 MiB label value the
/// answer is refused as a query error (`source_up` 0, counted, logged as `too_large`), the
/// process lives and keeps its memory; each time the ledger recovers once answers are sane.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_huge_labels_are_refused_and_partial_answers_prove_nothing_idle() {
    let stack = support::tier_b(
        &[GpuNode::new("n1", 1), GpuNode::new("n2", 1)],
        support::Grants::ReadOnly,
    )
    .await;
    stack.ensure_namespace(NS).await.expect("namespace");
    stack
        .create_gpu_pod(NS, "busy", 1, Some(90.0))
        .await
        .expect("busy pod");
    stack
        .create_gpu_pod(NS, "idle", 1, Some(0.0))
        .await
        .expect("idle pod");
    stack.wait_pod_running(NS, "busy").await.expect("busy");
    stack.wait_pod_running(NS, "idle").await.expect("idle");
    let fake = FakePrometheus::start(stack.prometheus.url()).await;
    let gl = stack
        .start_gpu_ledger(
            std::path::Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &["--prometheus-url", &fake.url()],
        )
        .await
        .expect("gpu-ledger");
    let idle_is = |want: Option<bool>| {
        let gl = &gl;
        async move {
            row(gl, "idle")
                .await
                .filter(|r| r["idle"].as_bool() == want)
        }
    };
    eventually("idle pod proven idle through the double", WAIT, || {
        idle_is(Some(true))
    })
    .await;

    // Partial answers: the idle pod is unknown, the busy one still busy, warnings counted.
    fake.set(FAKE_WARNINGS);
    eventually("idle pod unknown on partial answers", WAIT, || {
        idle_is(None)
    })
    .await;
    for _ in 0..6 {
        let idle = row(&gl, "idle").await.expect("idle row");
        assert!(
            idle["idle"].is_null(),
            "partial answers prove nothing: {idle}"
        );
        let busy = row(&gl, "busy").await.expect("busy row");
        assert_eq!(
            busy["idle"],
            Value::Bool(false),
            "busy evidence counts: {busy}\n{}",
            gl.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let text = gl.metrics_text().await.expect("metrics");
    assert!(
        counter(&text, "gpu_ledger_prometheus_warnings_total") >= 1.0,
        "warnings counted"
    );
    assert_eq!(
        metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]),
        Some(1.0),
        "a partial answer is still an answer"
    );
    assert!(
        gl.log_tail(400).contains("did not answer"),
        "warning logged:\n{}",
        gl.log_tail(20)
    );
    fake.set(FAKE_PASS);
    eventually("idle again once answers are complete", WAIT, || {
        idle_is(Some(true))
    })
    .await;

    // A huge label value: refused as a query error, counted, visible, survived.
    let before = gl.metrics_text().await.expect("metrics");
    let errors_before = counter(&before, "gpu_ledger_prometheus_query_errors_total");
    let rss_before = counter(&before, "process_resident_memory_bytes");
    fake.set(FAKE_HUGE_LABEL);
    let text = eventually("prometheus source down on a huge label", WAIT, || async {
        let text = gl.metrics_text().await.ok()?;
        (metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]) == Some(0.0))
            .then_some(text)
    })
    .await;
    assert!(
        counter(&text, "gpu_ledger_prometheus_query_errors_total") > errors_before,
        "the refused answer is a counted query error"
    );
    let idle = row(&gl, "idle").await.expect("idle row");
    assert!(
        idle["idle"].is_null() && idle["utilization"].is_null(),
        "{idle}"
    );
    // Several refused answers in a row: none is kept.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = gl.metrics_text().await.expect("metrics");
    let rss = counter(&text, "process_resident_memory_bytes");
    assert!(
        rss < rss_before + 64.0 * 1024.0 * 1024.0,
        "memory returns after refused answers: {rss_before} -> {rss}"
    );
    assert!(
        gl.log_tail(400).contains("too_large"),
        "the refusal is logged with its kind:\n{}",
        gl.log_tail(20)
    );
    fake.set(FAKE_PASS);
    eventually("source up and idle again", WAIT, || async {
        let text = gl.metrics_text().await.ok()?;
        let up = metric_value(&text, "gpu_ledger_source_up", &[("source", "prometheus")]);
        (up == Some(1.0)).then_some(())?;
        idle_is(Some(true)).await
    })
    .await;
}
