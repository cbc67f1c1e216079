//! gpu-ledger against a dead API server (issue 23): a loopback listener that reads each request,
//! counts it and closes the connection without an answer, as an API server that died behind its
//! load balancer. (Not a `503`: kube-client's default retry layer retries those inside one
//! request, up to 15 times, which would count the client's retries instead of the watch's.)
//! No control plane is needed: nothing may ever succeed here.
//!
//! * `every_watch_backs_off_against_a_dead_api_server`: the claims watches
//!   (`claims::watch::start`) list at most 6 times each in 25 s (0.8 s doubling, jittered
//!   upwards, gives at most 6 attempts; before the fix the pods watch listed ~20 times, as
//!   kube-runtime's backoff reset on the `Init` event the watcher emits before each list).
//! * `serve_says_it_waits_for_the_first_sync_and_why`: `gpu-ledger serve` answers
//!   `/api/v1/ledger` 503 with `{"state": "first_sync", "reason": …}` naming the watches and the
//!   last error, and the page says "waiting for the first sync", never an empty ledger.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gpu_ledger::claims::watch::{self, WatchConfig};
use gpu_ledger_testkit::process::ChildGuard;
use tokio::io::{AsyncReadExt, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// An API server that is there but never works; it remembers each request line's target.
struct DeadApiServer {
    url: String,
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl DeadApiServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let target = text
                        .lines()
                        .next()
                        .and_then(|l| l.split(' ').nth(1))
                        .unwrap_or("")
                        .to_string();
                    log.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), target));
                    // No answer: the connection closes under the request.
                    let _ = conn.shutdown().await;
                });
            }
        });
        DeadApiServer { url, seen }
    }

    /// Kubeconfig text for this server (plain HTTP, a token user).
    fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster:\n    server: {}\n\
             contexts:\n- name: dead\n  context:\n    cluster: dead\n    user: u\n\
             current-context: dead\nusers:\n- name: u\n  user:\n    token: t\n",
            self.url
        )
    }

    /// List requests (no `watch=`) per path and label selector, e.g. `/api/v1/pods`.
    fn lists(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (_, target) in self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            if query.split('&').any(|kv| kv.starts_with("watch=")) {
                continue;
            }
            let key = match query.split('&').find(|kv| kv.starts_with("labelSelector=")) {
                Some(sel) => format!("{path}?{sel}"),
                None => path.to_string(),
            };
            *out.entry(key).or_insert(0) += 1;
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_backs_off_against_a_dead_api_server() {
    let dead = DeadApiServer::start().await;
    let config = kube::Config::new(dead.url.parse().expect("url"));
    let client = kube::Client::try_from(config).expect("client");
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let _stores = watch::start(
        client,
        WatchConfig::default(),
        &tracker,
        cancel.clone(),
        Arc::new(|_| {}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    let lists = dead.lists();
    // Every watch of the default configuration tried: pods, DaemonSet pods, quotas, nodes.
    for path in ["/api/v1/pods", "/api/v1/resourcequotas", "/api/v1/nodes"] {
        let n = lists.get(path).copied().unwrap_or(0);
        assert!(
            n >= 2,
            "{path} listed {n} times: it retries at all; {lists:?}"
        );
    }
    assert!(
        lists
            .keys()
            .any(|k| k.starts_with("/api/v1/pods?labelSelector=")),
        "{lists:?}"
    );
    // 0.8 s, 1.6 s, 3.2 s, 6.4 s, 12.8 s (each plus up to 100 % jitter): at most 6 lists per
    // retry loop. `/apis` is the first request of every group discovery, and three optional
    // APIs discover their group, each in its own loop with its own backoff (Notebooks and
    // Workspaces in `kubeflow.org`, RayClusters in `ray.io`).
    let loops = |path: &str| if path == "/apis" { 3 } else { 1 };
    for (path, n) in &lists {
        assert!(
            *n <= 6 * loops(path),
            "{path} listed {n} times in 25 s: no backoff; all: {lists:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_says_it_waits_for_the_first_sync_and_why() {
    let dead = DeadApiServer::start().await;
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, dead.kubeconfig()).expect("kubeconfig");
    let port = gpu_ledger_testkit::util::free_port().expect("free port");
    let mut cmd = gpu_ledger_testkit::process::isolated_command(env!("CARGO_BIN_EXE_gpu-ledger"));
    cmd.arg("serve")
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUST_LOG", "info");
    let mut serve = ChildGuard::spawn("gpu-ledger", cmd, &dir.path().join("serve.log"))
        .expect("spawn gpu-ledger serve");
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    // Until a watch has failed once, the reason has no error yet: poll for one that names it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        if let Some(status) = serve.try_exit_status() {
            panic!("serve exited ({status}); log:\n{}", serve.log_tail(40));
        }
        if let Ok(r) = http.get(format!("{base}/api/v1/ledger")).send().await {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            assert_ne!(
                status, 200,
                "an empty ledger answered as if it were the cluster: {text}"
            );
            if text.contains("last error") {
                assert_eq!(status, 503, "{text}");
                break text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "/api/v1/ledger never named the watch error; log:\n{}",
            serve.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert_eq!(v["state"], "first_sync", "{v}");
    assert_eq!(v["message"], "waiting for the first sync", "{v}");
    let reason = v["reason"].as_str().expect("reason");
    assert!(
        reason.contains("pods") && reason.contains("last error ("),
        "{reason}"
    );
    let page = http.get(format!("{base}/")).send().await.expect("GET /");
    assert_eq!(page.status().as_u16(), 503);
    let page = page.text().await.expect("page");
    assert!(
        page.contains("waiting for the first sync") && page.contains("last error ("),
        "{page}"
    );
    assert!(!page.contains("No pod claims a GPU"), "{page}");
    let ready = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status().as_u16(), 503);
    assert!(
        ready
            .text()
            .await
            .unwrap_or_default()
            .contains("waiting for the first sync")
    );
    serve.terminate(Duration::from_secs(10));
}
