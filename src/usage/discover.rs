//! Finding the cluster's Prometheus when `report` has a kubeconfig and no `--prometheus-url`:
//! the Service named by `--prometheus-service`, else the well-known Services of
//! kube-prometheus-stack, the Prometheus Operator and the prometheus-community chart
//! ([`candidates`], pure) in an allow-list of namespaces ([`DEFAULT_NAMESPACES`] or
//! `--prometheus-namespace`) only: anyone who can create a Service in their own namespace could
//! otherwise choose the Prometheus a report believes. It is reached through the API server's
//! service proxy (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/…`, as kubectl plugins do)
//! behind a loopback listener ([`ServiceProxy`]), so the one Prometheus client works with
//! whatever credentials the kubeconfig holds (token, client certificate, exec plugin).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use subtle::ConstantTimeEq as _;
use tokio_util::sync::CancellationToken;

use crate::usage::prom::{Header, MAX_ANSWER_BYTES};

/// Largest request the loopback proxy forwards (a PromQL form body is a few KiB).
const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Bound of listing (or reading) Services.
const LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The namespaces searched without `--prometheus-namespace`, in order of preference: where
/// kube-prometheus installs its Prometheus (`monitoring`, also the namespace most
/// kube-prometheus-stack and prometheus-community chart installs use) and `prometheus`. Only a
/// cluster administrator usually creates namespaces, so no tenant can put a Service there.
/// OpenShift's `openshift-monitoring` is left out on purpose: its Prometheus and Thanos querier
/// answer only through kube-rbac-proxy with a bearer token, which the service proxy does not
/// pass on (docs/install.md: use the `thanos-querier` route with `--prometheus-url`).
pub const DEFAULT_NAMESPACES: &[&str] = &["monitoring", "prometheus"];

/// What is looked for, in order, for the error that lists it when nothing matches.
pub const TRIED: &str = "Services named prometheus-operated or labelled operated-prometheus=true \
    (Prometheus Operator, kube-prometheus-stack), named <release>-kube-prometheus-prometheus or \
    labelled app=kube-prometheus-stack-prometheus (kube-prometheus-stack), named \
    prometheus-server (prometheus-community chart), labelled app.kubernetes.io/name=prometheus \
    or app=prometheus";

/// Why no Prometheus could be found or reached.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("listing Services to find Prometheus")]
    List(#[source] kube::Error),
    #[error(
        "asking the API server for Services to find Prometheus timed out after {LIST_TIMEOUT:?}"
    )]
    ListTimeout,
    #[error(
        "no Prometheus found among {services} Services in namespaces {}{}: tried {TRIED}; name \
         it with --prometheus-service NAMESPACE/NAME[:PORT] or --prometheus-namespace, or pass \
         --prometheus-url",
        namespaces.join(", "),
        forbidden_note(forbidden)
    )]
    NoneFound {
        services: usize,
        namespaces: Vec<String>,
        /// Namespaces whose Services the kubeconfig's user may not list.
        forbidden: Vec<String>,
    },
    #[error("reading Service {0} named by --prometheus-service")]
    Get(String, #[source] kube::Error),
    #[error(
        "Service {0} has no port gpu-ledger recognises as Prometheus' (named web, http-web or \
         http, or 9090, or the only one): name it, --prometheus-service {0}:PORT"
    )]
    NoPort(String),
    #[error("starting the loopback proxy to Prometheus")]
    Listen(#[source] std::io::Error),
    #[error("the loopback proxy address {0} is no URL")]
    Url(String),
    #[error("no random token for the loopback proxy (the system's random source failed)")]
    Random,
    #[error("--prometheus-header {0}: not a valid HTTP header")]
    Header(String),
}

fn forbidden_note(forbidden: &[String]) -> String {
    if forbidden.is_empty() {
        String::new()
    } else {
        format!(
            " (not allowed to list Services in {})",
            forbidden.join(", ")
        )
    }
}

/// A name the API server would accept as a namespace, Service or port name (an RFC 1123
/// label): it goes into the service proxy's URL path, so nothing else may pass.
fn check_label(what: &str, value: &str) -> Result<(), String> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {value:?}: expected a Kubernetes name (lower-case letters, digits and -, at most 63)"
        ))
    }
}

/// A `--prometheus-namespace` value, checked as a namespace name.
pub fn namespace_name(value: &str) -> Result<String, String> {
    check_label("namespace", value)?;
    Ok(value.to_string())
}

/// `--prometheus-service NAMESPACE/NAME[:PORT]`: the Service to use, nothing searched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    /// By name or number; `None`: the Service's Prometheus port, looked up.
    pub port: Option<String>,
}

impl std::str::FromStr for ServiceRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (namespace, rest) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected NAMESPACE/NAME[:PORT]"))?;
        let (name, port) = match rest.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (rest, None),
        };
        check_label("namespace", namespace)?;
        check_label("Service name", name)?;
        if let Some(port) = port {
            check_label("port", port)?;
        }
        Ok(ServiceRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            port: port.map(str::to_string),
        })
    }
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        match &self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// A Service that looks like the cluster's Prometheus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub namespace: String,
    pub name: String,
    /// The Service port, by name when it has one (the service proxy accepts either).
    pub port: String,
    /// Which convention matched (said on stderr).
    pub why: &'static str,
    /// Lower is a better match.
    rank: u8,
}

impl Candidate {
    /// A Service named by the user (`--prometheus-service`).
    pub fn named(namespace: &str, name: &str, port: &str) -> Candidate {
        Candidate {
            namespace: namespace.to_string(),
            name: name.to_string(),
            port: port.to_string(),
            why: "named by --prometheus-service",
            rank: 0,
        }
    }

    /// The API server path of the service proxy, without a trailing slash.
    pub fn proxy_path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/services/{}:{}/proxy",
            self.namespace, self.name, self.port
        )
    }
}

/// The Services that look like Prometheus, best match first (then by namespace and name).
/// Callers pass only Services of the namespaces they trust ([`find`]): names and labels are
/// anyone's to set in their own namespace.
/// Conventions, from the charts' own templates:
/// * Prometheus Operator: the governing Service `prometheus-operated`, label
///   `operated-prometheus: "true"`, port `web` (prometheus-operator
///   pkg/prometheus/statefulset.go, `makeStatefulSetService`);
/// * kube-prometheus-stack: `<release>-kube-prometheus-prometheus`, label
///   `app: kube-prometheus-stack-prometheus`, port `http-web` 9090 (its
///   templates/prometheus/service.yaml);
/// * prometheus-community `prometheus` chart: `<release>-server` (`prometheus-server` for the
///   usual release name), labels `app.kubernetes.io/name: prometheus`,
///   `app.kubernetes.io/component: server`, port `http` 80 (its templates/service.yaml);
/// * anything else labelled `app.kubernetes.io/name=prometheus` or `app=prometheus`.
pub fn candidates(services: &[Service]) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = services
        .iter()
        .filter_map(|svc| {
            let meta = &svc.metadata;
            let name = meta.name.as_deref()?;
            let namespace = meta.namespace.as_deref().unwrap_or("default");
            let empty = BTreeMap::new();
            let labels = meta.labels.as_ref().unwrap_or(&empty);
            let label = |k: &str| labels.get(k).map(String::as_str);
            let (rank, why) =
                if name == "prometheus-operated" || label("operated-prometheus") == Some("true") {
                    (0, "Prometheus Operator's prometheus-operated Service")
                } else if name.ends_with("-kube-prometheus-prometheus")
                    || label("app") == Some("kube-prometheus-stack-prometheus")
                {
                    (1, "kube-prometheus-stack's Prometheus Service")
                } else if name == "prometheus-server"
                    || (label("app.kubernetes.io/name") == Some("prometheus")
                        && label("app.kubernetes.io/component") == Some("server"))
                {
                    (2, "prometheus-community chart's prometheus-server Service")
                } else if label("app.kubernetes.io/name") == Some("prometheus")
                    || label("app") == Some("prometheus")
                {
                    (3, "a Service labelled as Prometheus")
                } else {
                    return None;
                };
            Some(Candidate {
                namespace: namespace.to_string(),
                name: name.to_string(),
                port: web_port(svc)?,
                why,
                rank,
            })
        })
        .collect();
    out.sort_by(|a, b| (a.rank, &a.namespace, &a.name).cmp(&(b.rank, &b.namespace, &b.name)));
    out
}

/// Prometheus' HTTP port of a Service: named `web` or `http-web`, else 9090, else named
/// `http`, else the only port. `None` when the Service has no port at all, or several and none
/// of these (a guess would proxy to the wrong server).
fn web_port(svc: &Service) -> Option<String> {
    let ports = svc.spec.as_ref()?.ports.as_ref()?;
    let named = |n: &str| {
        ports
            .iter()
            .any(|p| p.name.as_deref() == Some(n))
            .then(|| n.to_string())
    };
    let label = |p: &k8s_openapi::api::core::v1::ServicePort| {
        p.name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| p.port.to_string())
    };
    named("web")
        .or_else(|| named("http-web"))
        .or_else(|| ports.iter().find(|p| p.port == 9090).map(label))
        .or_else(|| named("http"))
        .or_else(|| (ports.len() == 1).then(|| label(&ports[0])))
}

/// The Services in `namespaces` (in that order of preference) that look like Prometheus: the
/// first namespace holding a match first, by [`candidates`]' order within a namespace. An error
/// naming what was tried, and where, when there is none. A namespace whose Services the user
/// may not list is skipped (and named if nothing is found).
pub async fn find(
    client: &kube::Client,
    namespaces: &[String],
) -> Result<Vec<Candidate>, DiscoverError> {
    let mut found = Vec::new();
    let mut services = 0usize;
    let mut forbidden = Vec::new();
    for namespace in namespaces {
        let api: Api<Service> = Api::namespaced(client.clone(), namespace);
        let listed = tokio::time::timeout(LIST_TIMEOUT, api.list(&ListParams::default()))
            .await
            .map_err(|_| DiscoverError::ListTimeout)?;
        let list = match listed {
            Ok(list) => list,
            Err(kube::Error::Api(status)) if status.code == 403 => {
                forbidden.push(namespace.clone());
                continue;
            }
            Err(e) => return Err(DiscoverError::List(e)),
        };
        services = services.saturating_add(list.items.len());
        // The API answers for the namespace asked; a Service claiming another is not counted.
        let here: Vec<Service> = list
            .items
            .into_iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .collect();
        found.extend(candidates(&here));
    }
    if found.is_empty() {
        return Err(DiscoverError::NoneFound {
            services,
            namespaces: namespaces.to_vec(),
            forbidden,
        });
    }
    Ok(found)
}

/// The Service named by `--prometheus-service`: as given with a port; else read, and its
/// Prometheus port chosen as [`candidates`] would.
pub async fn named(
    client: &kube::Client,
    service: &ServiceRef,
) -> Result<Candidate, DiscoverError> {
    if let Some(port) = &service.port {
        return Ok(Candidate::named(&service.namespace, &service.name, port));
    }
    let api: Api<Service> = Api::namespaced(client.clone(), &service.namespace);
    let svc = tokio::time::timeout(LIST_TIMEOUT, api.get(&service.name))
        .await
        .map_err(|_| DiscoverError::ListTimeout)?
        .map_err(|e| DiscoverError::Get(service.to_string(), e))?;
    let port = web_port(&svc).ok_or_else(|| DiscoverError::NoPort(service.to_string()))?;
    Ok(Candidate::named(&service.namespace, &service.name, &port))
}

/// The Prometheus endpoints the loopback proxy forwards: the ones [`crate::usage::prom::PromClient`]
/// asks (it posts every question to `/api/v1/query`). Anything else, Prometheus' admin API
/// included, is refused before it reaches the API server.
pub const FORWARDED_PATHS: &[&str] = &["/api/v1/query"];

/// Random bytes of the proxy's path token (hex in the URL): unguessable by another local process.
const TOKEN_BYTES: usize = 32;

/// A loopback HTTP listener forwarding Prometheus queries to a Service through the API server's
/// service proxy with the kubeconfig's credentials; stops when dropped.
///
/// Every local process can connect to a loopback port, and a web page can reach it through a
/// name rebound to 127.0.0.1, while the kubeconfig's credentials are the user's: so a request is
/// forwarded only when its path starts with a random token that only [`Self::url`] holds, its
/// Host is the listener's own address, its method GET or POST and the rest of its path one of
/// [`FORWARDED_PATHS`]. Answers are streamed, cut one byte past [`MAX_ANSWER_BYTES`] (the
/// client then refuses them as too large), never buffered whole.
pub struct ServiceProxy {
    /// `http://127.0.0.1:PORT/TOKEN/`: the base URL to give the Prometheus client (a secret:
    /// never logged).
    pub url: reqwest::Url,
    stop: CancellationToken,
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Target {
    client: kube::Client,
    base: String,
    token: String,
    /// `127.0.0.1:PORT`, the only Host accepted.
    host: String,
    /// `--prometheus-header`, added to every forwarded request.
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl ServiceProxy {
    /// Starts the listener for `candidate`; `headers` (`--prometheus-header`) go with every
    /// forwarded request.
    pub async fn start(
        client: kube::Client,
        candidate: &Candidate,
        headers: &[Header],
    ) -> Result<ServiceProxy, DiscoverError> {
        let headers = headers
            .iter()
            .map(|h| {
                let name = HeaderName::from_bytes(h.name.as_bytes())
                    .map_err(|_| DiscoverError::Header(h.name.clone()))?;
                let mut value = HeaderValue::from_str(&h.value)
                    .map_err(|_| DiscoverError::Header(h.name.clone()))?;
                value.set_sensitive(true);
                Ok((name, value))
            })
            .collect::<Result<Vec<_>, DiscoverError>>()?;
        let mut random = [0u8; TOKEN_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random)
            .map_err(|_| DiscoverError::Random)?;
        let token = random
            .iter()
            .fold(String::with_capacity(2 * TOKEN_BYTES), |mut hex, b| {
                use std::fmt::Write as _;
                // Writing to a String cannot fail.
                let _ = write!(hex, "{b:02x}");
                hex
            });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(DiscoverError::Listen)?;
        let addr = listener.local_addr().map_err(DiscoverError::Listen)?;
        let url = reqwest::Url::parse(&format!("http://{addr}/{token}/"))
            .map_err(|_| DiscoverError::Url(addr.to_string()))?;
        let target = Arc::new(Target {
            client,
            base: candidate.proxy_path(),
            token,
            host: addr.to_string(),
            headers,
        });
        let app = axum::Router::new().fallback(forward).with_state(target);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "loopback proxy to Prometheus stopped"
                );
            }
        });
        Ok(ServiceProxy { url, stop })
    }
}

/// The path after the token, when the request may be forwarded; else the refusal.
fn allowed<'r>(
    target: &Target,
    parts: &'r axum::http::request::Parts,
) -> Result<&'r str, (StatusCode, &'static str)> {
    let host = parts.headers.get(header::HOST).map(HeaderValue::as_bytes);
    if host != Some(target.host.as_bytes()) {
        return Err((StatusCode::FORBIDDEN, "wrong Host"));
    }
    let path = parts.uri.path();
    let after_slash = path.strip_prefix('/').unwrap_or(path);
    // `rest` keeps its leading slash: `/api/v1/query`.
    let (token, rest) = after_slash.split_at(after_slash.find('/').unwrap_or(after_slash.len()));
    // Constant time: the answer's timing tells nothing about how much of a guess was right.
    if !bool::from(token.as_bytes().ct_eq(target.token.as_bytes())) {
        return Err((StatusCode::NOT_FOUND, "not found"));
    }
    if !FORWARDED_PATHS.contains(&rest) {
        return Err((StatusCode::NOT_FOUND, "not a forwarded Prometheus endpoint"));
    }
    if parts.method != Method::GET && parts.method != Method::POST {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "only GET and POST"));
    }
    Ok(rest)
}

/// Forwards one allowed request (method, path and query, content type, body, the configured
/// headers) and streams back the answer's status, content type and body, cut past the answer
/// bound; a failure to reach the API server is a 502 naming it.
async fn forward(State(target): State<Arc<Target>>, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = match allowed(&target, &parts) {
        Ok(path) => path,
        Err(refused) => return refused.into_response(),
    };
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let Ok(body) = axum::body::to_bytes(body, MAX_REQUEST_BYTES).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
    };
    let mut out = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{path}{query}", target.base));
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            out = out.header(name, v);
        }
    }
    for (name, value) in &target.headers {
        out = out.header(name, value);
    }
    let request = match out.body(kube::client::Body::from(body.to_vec())) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let answer = match target.client.send(request).await {
        Ok(a) => a,
        Err(e) => {
            return (StatusCode::BAD_GATEWAY, crate::telemetry::error_chain(&e)).into_response();
        }
    };
    let (head, body) = answer.into_parts();
    let mut response = Response::new(bounded(body));
    *response.status_mut() = head.status;
    if let Some(v) = head.headers.get(header::CONTENT_TYPE) {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, v.clone());
    }
    response
}

/// Where [`bounded`] is in the answer.
enum Cut<S> {
    /// Passing chunks on; bytes passed so far.
    Reading(S, usize),
    Done,
}

/// The answer's body streamed, ending one byte past [`MAX_ANSWER_BYTES`]: the client refuses
/// an answer over its bound on that byte (with its "larger than" error), and the rest is never
/// read from the API server. The answer's length is not passed on, so a cut answer ends
/// cleanly instead of as a broken connection.
fn bounded(body: kube::client::Body) -> axum::body::Body {
    let data = axum::body::Body::new(body).into_data_stream();
    let stream = futures::stream::unfold(Cut::Reading(data, 0), |state| async move {
        let Cut::Reading(mut data, passed) = state else {
            return None;
        };
        match data.next().await? {
            Err(e) => Some((Err(e), Cut::Done)),
            Ok(mut chunk) => {
                let room = (MAX_ANSWER_BYTES + 1).saturating_sub(passed);
                if chunk.len() < room {
                    let passed = passed.saturating_add(chunk.len());
                    Some((Ok(chunk), Cut::Reading(data, passed)))
                } else {
                    chunk.truncate(room);
                    Some((Ok(chunk), Cut::Done))
                }
            }
        }
    });
    axum::body::Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    fn svc(ns: &str, name: &str, labels: &[(&str, &str)], ports: &[(&str, i32)]) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p)| ServicePort {
                            name: (!n.is_empty()).then(|| (*n).to_string()),
                            port: *p,
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    #[test]
    fn the_operators_service_wins_and_the_web_port_is_chosen() {
        // As kube-prometheus-stack installs them (release `kps` in `monitoring`).
        let services = vec![
            svc(
                "monitoring",
                "kps-kube-prometheus-prometheus",
                &[
                    ("app", "kube-prometheus-stack-prometheus"),
                    ("self-monitor", "true"),
                ],
                &[("http-web", 9090), ("reloader-web", 8080)],
            ),
            svc(
                "monitoring",
                "prometheus-operated",
                &[("operated-prometheus", "true")],
                &[("web", 9090)],
            ),
            svc(
                "monitoring",
                "kps-kube-prometheus-alertmanager",
                &[("app", "kube-prometheus-stack-alertmanager")],
                &[("http-web", 9093)],
            ),
            svc("default", "kubernetes", &[], &[("https", 443)]),
        ];
        let found = candidates(&services);
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|c| (c.name.as_str(), c.port.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("prometheus-operated", "web"),
                ("kps-kube-prometheus-prometheus", "http-web")
            ]
        );
        assert_eq!(
            found[0].proxy_path(),
            "/api/v1/namespaces/monitoring/services/prometheus-operated:web/proxy"
        );
    }

    #[test]
    fn a_named_service_is_checked_before_it_reaches_a_url_path() {
        let named: ServiceRef = "monitoring/prometheus-operated:web".parse().expect("valid");
        assert_eq!(
            (
                named.namespace.as_str(),
                named.name.as_str(),
                named.port.as_deref()
            ),
            ("monitoring", "prometheus-operated", Some("web"))
        );
        assert_eq!(named.to_string(), "monitoring/prometheus-operated:web");
        let no_port: ServiceRef = "prom/prometheus-server".parse().expect("valid");
        assert_eq!(no_port.port, None);
        assert_eq!(
            Candidate::named("prom", "prometheus-server", "9090").proxy_path(),
            "/api/v1/namespaces/prom/services/prometheus-server:9090/proxy"
        );
        for bad in [
            "prometheus-operated",
            "monitoring/",
            "/prometheus",
            "monitoring/prom/../../secrets",
            "monitoring/prom:web/x",
            "Monitoring/prom",
            "monitoring/prom?x=1",
            "monitoring/-prom",
            "monitoring/prom:",
        ] {
            assert!(bad.parse::<ServiceRef>().is_err(), "{bad} accepted");
        }
        assert!(namespace_name("monitoring").is_ok());
        assert!(namespace_name("kube-system/x").is_err());
    }

    #[test]
    fn the_community_chart_and_plain_labels_are_found_and_others_are_not() {
        let services = vec![
            svc(
                "prom",
                "prometheus-server",
                &[
                    ("app.kubernetes.io/name", "prometheus"),
                    ("app.kubernetes.io/component", "server"),
                ],
                &[("http", 80)],
            ),
            svc("other", "my-prom", &[("app", "prometheus")], &[("", 9090)]),
            // Several ports and none Prometheus': no guess.
            svc(
                "other",
                "odd",
                &[("app", "prometheus")],
                &[("a", 1), ("b", 2)],
            ),
            svc(
                "kube-system",
                "kube-dns",
                &[("k8s-app", "kube-dns")],
                &[("dns", 53)],
            ),
        ];
        let found: Vec<(String, String)> = candidates(&services)
            .into_iter()
            .map(|c| (c.name, c.port))
            .collect();
        assert_eq!(
            found,
            [
                ("prometheus-server".to_string(), "http".to_string()),
                ("my-prom".to_string(), "9090".to_string())
            ]
        );
        assert!(candidates(&services[3..]).is_empty());
    }
}
