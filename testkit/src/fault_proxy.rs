//! **A fault-injecting HTTP proxy in front of kube-apiserver — a test double.** No real
//! component hangs or refuses chosen requests on demand, so this one does, and nothing else:
//! every request no rule picks is forwarded unchanged to the real apiserver and its answer
//! streamed back as it arrives (watches included).
//!
//! Clients speak plain HTTP/1.1 to the proxy (their kubeconfig points at
//! `http://127.0.0.1:<port>` with their own bearer token: [`FaultProxy::kubeconfig`]); the proxy
//! talks TLS to the apiserver, trusting the cluster CA, and passes the `Authorization` header
//! through, so authentication and RBAC are the apiserver's own.
//!
//! A [`Rule`] picks requests by method, path suffix and (optionally) "is a watch" and applies a
//! [`Fault`]:
//! * [`Fault::Hang`]: the request is never forwarded and never answered while the rule stands,
//!   as with a wedged apiserver or a black-holed connection; the client sees nothing until its
//!   own timeout. When the rules change, held requests are answered 503 (the client has usually
//!   given up by then).
//! * [`Fault::Forbidden`]: answered `403` with the `Status` body kube-apiserver sends for an
//!   RBAC denial (`reason: Forbidden`, `code: 403`), e.g. for watches only, so the initial list
//!   works and every watch after it fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::watch;

use crate::control_plane::ControlPlane;

/// What a rule does to the requests it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Hold the request unanswered (never forwarded).
    Hang,
    /// Answer 403 Forbidden as kube-apiserver's RBAC does.
    Forbidden,
}

/// Which requests a fault applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// HTTP method (`GET`, `PUT`, ...), or `None` for any.
    pub method: Option<String>,
    /// The request path (without query) ends with this, e.g. `/leases/gpu-ledger-cull`.
    pub path_suffix: String,
    /// Only watch requests (`watch=true` or `watch=1` in the query).
    pub watch_only: bool,
    pub fault: Fault,
}

impl Rule {
    /// `fault` for `method` requests whose path ends with `path_suffix`.
    pub fn new(method: &str, path_suffix: &str, fault: Fault) -> Self {
        Rule {
            method: Some(method.to_string()),
            path_suffix: path_suffix.to_string(),
            watch_only: false,
            fault,
        }
    }

    /// `fault` for watch requests whose path ends with `path_suffix` (`/pods` matches the
    /// cluster-wide and every namespaced pods watch).
    pub fn watches(path_suffix: &str, fault: Fault) -> Self {
        Rule {
            method: Some("GET".into()),
            path_suffix: path_suffix.to_string(),
            watch_only: true,
            fault,
        }
    }

    fn picks(&self, method: &str, path: &str, query: &str) -> bool {
        let watch = query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        self.method.as_deref().is_none_or(|m| m == method)
            && path.ends_with(&self.path_suffix)
            && (!self.watch_only || watch)
    }
}

/// One request the proxy saw, and what it did with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// The fault applied, or `None` when forwarded.
    pub fault: Option<Fault>,
}

struct Shared {
    upstream: String,
    http: reqwest::Client,
    rules: Mutex<Vec<Rule>>,
    /// Bumped on every rule change; held requests wait for it.
    version: watch::Sender<u64>,
    seen: Mutex<Vec<Seen>>,
    held: AtomicUsize,
}

/// A running proxy; dropping it stops accepting and releases held requests.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `cp`'s apiserver, with no rules.
    pub async fn start(cp: &ControlPlane) -> Result<Self> {
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(cp.ca_pem().as_bytes())?)
            .no_proxy()
            .build()
            .context("upstream client")?;
        let shared = Arc::new(Shared {
            upstream: cp.server_url().trim_end_matches('/').to_string(),
            http,
            rules: Mutex::default(),
            version: watch::Sender::new(0),
            seen: Mutex::default(),
            held: AtomicUsize::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fault proxy")?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(FaultProxy {
            addr,
            shared,
            stop: Some(stop),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the rules (an empty list forwards everything). Held requests are released.
    pub fn set_rules(&self, rules: Vec<Rule>) {
        *self
            .shared
            .rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = rules;
        self.shared.version.send_modify(|v| *v += 1);
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Requests held by [`Fault::Hang`] rules so far (released or not).
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::Relaxed)
    }

    /// Writes a kubeconfig for `user` (same bearer token as [`ControlPlane::kubeconfig_path`])
    /// that talks to the apiserver through this proxy, to `path`.
    pub fn kubeconfig(&self, cp: &ControlPlane, user: &str, path: &Path) -> Result<PathBuf> {
        let kc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fault-proxy", "cluster": {"server": self.url()}}],
            "users": [{"name": user, "user": {"token": cp.token(user)?}}],
            "contexts": [{"name": user, "context": {"cluster": "fault-proxy", "user": user}}],
            "current-context": user,
        });
        std::fs::write(path, serde_norway::to_string(&kc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path.to_path_buf())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set_rules(Vec::new());
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the HTTP stacks set themselves.
fn forwardable(name: &HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if forwardable(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// The body kube-apiserver answers an RBAC denial with.
fn forbidden(method: &str, path: &str) -> Response {
    let resource = path.rsplit('/').next().unwrap_or_default();
    let verb = if method == "GET" { "watch" } else { "access" };
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{resource} is forbidden: User cannot {verb} resource \"{resource}\" (fault proxy)"),
        "reason": "Forbidden",
        "details": {"kind": resource},
        "code": 403
    });
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let uri = req
        .uri()
        .path_and_query()
        .map_or_else(|| path.clone(), |pq| pq.as_str().to_string());
    let (fault, version) = {
        let rules = shared.rules.lock().unwrap_or_else(PoisonError::into_inner);
        let fault = rules
            .iter()
            .find(|r| r.picks(&method, &path, &query))
            .map(|r| r.fault);
        (fault, *shared.version.borrow())
    };
    shared
        .seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Seen {
            method: method.clone(),
            uri: uri.clone(),
            fault,
        });
    match fault {
        Some(Fault::Forbidden) => return forbidden(&method, &path),
        Some(Fault::Hang) => {
            shared.held.fetch_add(1, Ordering::Relaxed);
            let mut rx = shared.version.subscribe();
            let _ = rx.wait_for(|v| *v != version).await;
            return (StatusCode::SERVICE_UNAVAILABLE, "fault proxy: released").into_response();
        }
        None => {}
    }
    forward(&shared, req, &method, &uri)
        .await
        .unwrap_or_else(|e| {
            (StatusCode::BAD_GATEWAY, format!("fault proxy: {e:#}")).into_response()
        })
}

async fn forward(shared: &Shared, req: Request, method: &str, uri: &str) -> Result<Response> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20)
        .await
        .context("reading the request body")?;
    let mut headers = reqwest::header::HeaderMap::new();
    copy_headers(&parts.headers, &mut headers);
    let upstream = shared
        .http
        .request(
            reqwest::Method::from_bytes(method.as_bytes())?,
            format!("{}{uri}", shared.upstream),
        )
        .headers(headers)
        .body(body)
        .send()
        .await
        .context("forwarding to kube-apiserver")?;
    let status = upstream.status();
    let mut out_headers = HeaderMap::new();
    copy_headers(upstream.headers(), &mut out_headers);
    // Stream the answer chunk by chunk: a watch never ends while it works.
    let chunks = futures::stream::unfold(Some(upstream), |state| async move {
        let mut resp = state?;
        match resp.chunk().await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some(resp))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    });
    let mut response = Response::new(Body::from_stream(chunks));
    *response.status_mut() = status;
    *response.headers_mut() = out_headers;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pick_by_method_path_and_watch() {
        let lease = Rule::new("PUT", "/leases/gpu-ledger-cull", Fault::Hang);
        let path = "/apis/coordination.k8s.io/v1/namespaces/gpu-ledger/leases/gpu-ledger-cull";
        assert!(lease.picks("PUT", path, ""));
        assert!(!lease.picks("GET", path, ""));
        assert!(!lease.picks(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/other",
            ""
        ));
        let pods = Rule::watches("/pods", Fault::Forbidden);
        assert!(pods.picks("GET", "/api/v1/pods", "watch=true&resourceVersion=5"));
        assert!(pods.picks("GET", "/api/v1/namespaces/a/pods", "&watch=1"));
        assert!(
            !pods.picks("GET", "/api/v1/pods", "limit=500"),
            "the list passes"
        );
        assert!(!pods.picks("GET", "/api/v1/nodes", "watch=true"));
    }
}
