//! The loopback proxy of Prometheus discovery (`report` without `--prometheus-url`, issue 36
//! item 10), against a fake API server on loopback that records what reaches it and can answer
//! without end. In process, loopback only: what is tested is the proxy between the Prometheus
//! client and the API server's service proxy (tests/prometheus_discovery.rs runs the whole path
//! on a real kube-apiserver).
//!
//! * `an_endless_answer_is_cut_at_the_answer_bound`: the proxy stops reading the API server's
//!   answer at `MAX_ANSWER_BYTES` and the client's error says the answer was too large, where it
//!   used to buffer the whole answer first (2 GiB in 9 s from an endless one). Bytes read are
//!   measured, not time.
//! * `only_the_query_endpoint_with_the_token_is_forwarded`: a request without the proxy's token,
//!   with another method, to another path or with another Host reaches nothing.
//! * `prometheus_headers_reach_the_api_server`: `--prometheus-header` (e.g. Mimir's
//!   `X-Scope-OrgID`) is passed on, as it is without discovery.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use gpu_ledger::usage::discover::{Candidate, ServiceProxy};
use gpu_ledger::usage::prom::{Header, MAX_ANSWER_BYTES, PromClient, PromConfig, PromError};

/// What the fake API server saw: one line per request (`METHOD path?query`) and the headers.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(String, HeaderMap)>>,
    /// Bytes of answer body the fake has produced (handed to its HTTP server to write).
    produced: AtomicU64,
}

/// Answer of the fake: a small valid Prometheus answer, or one without end.
#[derive(Clone, Copy)]
enum Answer {
    Empty,
    Endless,
}

/// Bytes an "endless" answer stops at anyway, so a proxy that buffers everything (the defect)
/// ends instead of exhausting the machine's memory: twice the bound.
const ENDLESS_CAP: u64 = 2 * MAX_ANSWER_BYTES as u64;

/// Starts the fake API server; its URL and what it saw.
async fn fake_api_server(answer: Answer) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let state = (seen.clone(), answer);
    let app = axum::Router::new()
        .fallback(
            |axum::extract::State((seen, answer)): axum::extract::State<(Arc<Seen>, Answer)>,
             method: Method,
             uri: Uri,
             headers: HeaderMap| async move {
                seen.requests
                    .lock()
                    .expect("lock")
                    .push((format!("{method} {uri}"), headers));
                match answer {
                    Answer::Empty => (
                        [("content-type", "application/json")],
                        r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                    )
                        .into_response(),
                    Answer::Endless => endless(seen).into_response(),
                }
            },
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A JSON answer that never closes its array (up to [`ENDLESS_CAP`]), counting what it hands
/// out.
fn endless(seen: Arc<Seen>) -> Response {
    let head = axum::body::Bytes::from_static(
        br#"{"status":"success","data":{"resultType":"vector","result":["#,
    );
    let filler = axum::body::Bytes::from(
        r#"{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL"},"value":[1,"0"]},"#.repeat(1024),
    );
    let stream = futures::stream::unfold((seen, true), move |(seen, first)| {
        let chunk = if first { head.clone() } else { filler.clone() };
        async move {
            let before = seen.produced.load(Ordering::Relaxed);
            if before >= ENDLESS_CAP {
                return None;
            }
            seen.produced
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            Some((Ok::<_, std::io::Error>(chunk), (seen, false)))
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("response")
}

fn kube_client(url: &str) -> kube::Client {
    let config = kube::Config::new(url.parse().expect("fake API server URL"));
    kube::Client::try_from(config).expect("kube client")
}

fn candidate() -> Candidate {
    Candidate::named("monitoring", "prometheus-operated", "web")
}

fn prom(url: &reqwest::Url, headers: Vec<Header>) -> PromClient {
    PromClient::new(PromConfig {
        headers,
        ..PromConfig::new(url.clone(), Duration::from_secs(300))
    })
    .expect("prometheus client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_cut_at_the_answer_bound() {
    let (api, seen) = fake_api_server(Answer::Endless).await;
    let proxy = ServiceProxy::start(kube_client(&api), &candidate(), &[])
        .await
        .expect("proxy");
    // Generous: a proxy that buffers (the defect) ends at ENDLESS_CAP, within seconds.
    let answer = tokio::time::timeout(
        Duration::from_secs(600),
        prom(&proxy.url, Vec::new()).instant("DCGM_FI_DEV_GPU_UTIL", chrono::Utc::now()),
    )
    .await
    .expect("the answer through the proxy ended within 10 minutes");
    let err = answer.expect_err("an answer without end is refused");
    assert!(
        matches!(err, PromError::BodyTooLarge),
        "expected the answer bound, got: {err}"
    );
    assert!(
        err.to_string().contains("larger than"),
        "the error names the bound: {err}"
    );
    // The proxy stops reading at the bound; what the sockets and HTTP buffers between hold on
    // top is a few MiB (64 MiB allowed). The buffering proxy read all ENDLESS_CAP bytes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = seen.produced.load(Ordering::Relaxed);
    let allowed = MAX_ANSWER_BYTES as u64 + 64 * 1024 * 1024;
    assert!(
        produced <= allowed,
        "the fake API server handed out {produced} bytes before the proxy stopped reading; \
         the bound is {MAX_ANSWER_BYTES} (+ 64 MiB of buffers)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_query_endpoint_with_the_token_is_forwarded() {
    let (api, seen) = fake_api_server(Answer::Empty).await;
    let proxy = ServiceProxy::start(kube_client(&api), &candidate(), &[])
        .await
        .expect("proxy");
    let http = reqwest::Client::new();
    let base = &proxy.url;
    let origin = format!(
        "http://{}:{}",
        base.host_str().expect("host"),
        base.port().expect("port")
    );
    let refused: Vec<(Method, String, Option<&str>)> = vec![
        // No token: the bare query path, and the token-less root.
        (Method::POST, format!("{origin}/api/v1/query"), None),
        (Method::GET, format!("{origin}/api/v1/query?query=up"), None),
        // A wrong token.
        (
            Method::GET,
            format!(
                "{origin}/0000000000000000000000000000000000000000000000000000000000000000/api/v1/query?query=up"
            ),
            None,
        ),
        // The token, but another method.
        (Method::DELETE, format!("{base}api/v1/query"), None),
        (Method::PUT, format!("{base}api/v1/query"), None),
        // The token, but another path: Prometheus' admin API, the API server's own paths.
        (
            Method::POST,
            format!("{base}api/v1/admin/tsdb/delete_series?match[]=up"),
            None,
        ),
        (Method::GET, format!("{base}api/v1/targets"), None),
        (Method::GET, base.to_string(), None),
        // The token and the path, but another Host (a page rebinding a name to 127.0.0.1).
        (
            Method::GET,
            format!("{base}api/v1/query?query=up"),
            Some("evil.example:80"),
        ),
    ];
    for (method, url, host) in &refused {
        let mut req = http.request(method.clone(), url);
        if let Some(h) = host {
            req = req.header("host", *h);
        }
        let status = req.send().await.expect("the proxy answers").status();
        assert!(
            status.is_client_error(),
            "{method} {url} (Host {host:?}) answered {status}, expected a refusal"
        );
    }
    assert!(
        seen.requests.lock().expect("lock").is_empty(),
        "refused requests reached the API server: {:?}",
        seen.requests
            .lock()
            .expect("lock")
            .iter()
            .map(|(r, _)| r.clone())
            .collect::<Vec<_>>()
    );

    // The client's own query goes through, to the service proxy path of the Service.
    let got = prom(&proxy.url, Vec::new())
        .instant("up", chrono::Utc::now())
        .await
        .expect("the query through the proxy");
    assert!(got.is_empty());
    let get = http
        .get(format!("{base}api/v1/query?query=up"))
        .send()
        .await
        .expect("GET query");
    assert_eq!(get.status(), StatusCode::OK);
    let requests: Vec<String> = seen
        .requests
        .lock()
        .expect("lock")
        .iter()
        .map(|(r, _)| r.clone())
        .collect();
    assert_eq!(
        requests,
        [
            "POST /api/v1/namespaces/monitoring/services/prometheus-operated:web/proxy/api/v1/query",
            "GET /api/v1/namespaces/monitoring/services/prometheus-operated:web/proxy/api/v1/query?query=up",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_headers_reach_the_api_server() {
    let (api, seen) = fake_api_server(Answer::Empty).await;
    let headers: Vec<Header> = vec![
        "X-Scope-OrgID: team-a".parse().expect("header"),
        "X-Extra: 1".parse().expect("header"),
    ];
    let proxy = ServiceProxy::start(kube_client(&api), &candidate(), &headers)
        .await
        .expect("proxy");
    prom(&proxy.url, Vec::new())
        .instant("up", chrono::Utc::now())
        .await
        .expect("the query through the proxy");
    let requests = seen.requests.lock().expect("lock");
    let (line, got) = requests.first().expect("the query reached the API server");
    for (name, value) in [("x-scope-orgid", "team-a"), ("x-extra", "1")] {
        assert_eq!(
            got.get(name).and_then(|v| v.to_str().ok()),
            Some(value),
            "{name} on {line}: {got:?}"
        );
    }
}
