//! Authentication of the admin server: every path except [`OPEN_PATHS`] (`/metrics` and the
//! probes) needs `Authorization: Bearer <token>`, accepted when it equals the contents of the
//! token file (`--api-token-file`), or when Kubernetes vouches for it (`--api-auth=kubernetes`):
//! a TokenReview authenticates the token, then a SubjectAccessReview asks whether that user may
//! `get` the virtual resource [`REVIEW_RESOURCE`] in group [`REVIEW_GROUP`] (cluster-wide), as
//! kube-rbac-proxy does with its resource attributes. Not the request path as a non-resource
//! URL: the built-in `system:discovery` role lets every authenticated user get `/api/*`. Grant
//! it with `apiGroups: ["gpu-ledger.io"]`, `resources: ["ledger"]`, `verbs: ["get"]`
//! (docs/security.md).
//!
//! No token: 401. A token nobody accepts: 401. Authenticated but not allowed: 403. The API
//! server cannot be asked: 503 (never open).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use subtle::ConstantTimeEq as _;
use tracing::{debug, warn};

/// Served to anyone: Prometheus scrapes `/metrics`, the kubelet probes the rest.
pub const OPEN_PATHS: [&str; 4] = ["/metrics", "/healthz", "/livez", "/readyz"];
/// How long a TokenReview + SubjectAccessReview answer is reused for the same token and request.
pub const REVIEW_CACHE_TTL: Duration = Duration::from_secs(30);
/// Most answers kept (older ones are dropped first when full).
const REVIEW_CACHE_ENTRIES: usize = 1024;
/// API group of the virtual resource a caller must be allowed to `get` (no such API is served).
pub const REVIEW_GROUP: &str = "gpu-ledger.io";
/// The virtual resource: the ledger behind `/api/v1/*`.
pub const REVIEW_RESOURCE: &str = "ledger";
/// Timeout of one review call.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Why authentication could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("--api-token-file {path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--api-token-file {path}: the file is empty")]
    Empty { path: PathBuf },
}

/// The outcome for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Allowed,
    /// No token accepted (401).
    Unauthenticated,
    /// Authenticated, not authorised (403).
    Forbidden,
    /// The API server could not be asked (503).
    Unavailable,
}

/// How the API is protected; cheap to clone.
#[derive(Clone)]
pub struct ApiAuth {
    inner: Arc<Inner>,
}

struct Inner {
    token_file: Option<TokenFile>,
    kubernetes: Option<KubeReviews>,
}

impl ApiAuth {
    /// `None` when neither a token file nor Kubernetes reviews are asked for. The token file is
    /// read now: missing or empty is an error.
    pub fn new(
        token_file: Option<PathBuf>,
        kubernetes: Option<kube::Client>,
    ) -> Result<Option<Self>, AuthError> {
        if token_file.is_none() && kubernetes.is_none() {
            return Ok(None);
        }
        let token_file = token_file.map(TokenFile::new).transpose()?;
        Ok(Some(ApiAuth {
            inner: Arc::new(Inner {
                token_file,
                kubernetes: kubernetes.map(KubeReviews::new),
            }),
        }))
    }

    async fn decide(&self, token: &str, method: &Method, path: &str) -> Decision {
        if let Some(f) = &self.inner.token_file
            && f.matches(token)
        {
            return Decision::Allowed;
        }
        match &self.inner.kubernetes {
            Some(k) => k.decide(token, method, path).await,
            None => Decision::Unauthenticated,
        }
    }
}

/// `router` with authentication in front of every path but [`OPEN_PATHS`] (unchanged when
/// `auth` is `None`).
pub fn protect(router: Router, auth: Option<ApiAuth>) -> Router {
    match auth {
        Some(a) => router.layer(axum::middleware::from_fn_with_state(a, require)),
        None => router,
    }
}

/// True for the paths served without authentication.
pub fn is_open(path: &str) -> bool {
    OPEN_PATHS.contains(&path)
}

async fn require(State(auth): State<ApiAuth>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    if is_open(&path) {
        return next.run(req).await;
    }
    let Some(token) = bearer(req.headers()) else {
        return challenge("a bearer token is required");
    };
    match auth.decide(token, req.method(), &path).await {
        Decision::Allowed => next.run(req).await,
        Decision::Unauthenticated => challenge("the bearer token was not accepted"),
        Decision::Forbidden => (
            StatusCode::FORBIDDEN,
            format!("not allowed to get {path}\n"),
        )
            .into_response(),
        Decision::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot check the bearer token with the Kubernetes API; try again\n",
        )
            .into_response(),
    }
}

fn challenge(why: &'static str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"gpu-ledger\"")],
        format!("{why}\n"),
    )
        .into_response()
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive, as RFC 7235 says).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

// === the token file ===

/// The expected token, re-read when the file's modification time or length changes (rotated
/// Secrets), compared in constant time.
struct TokenFile {
    path: PathBuf,
    cached: Mutex<(Stamp, String)>,
}

type Stamp = (Option<SystemTime>, u64);

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).map_or((None, 0), |m| (m.modified().ok(), m.len()))
}

fn read_token(path: &Path) -> Result<String, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(AuthError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(token)
}

impl TokenFile {
    fn new(path: PathBuf) -> Result<Self, AuthError> {
        let seen = stamp(&path);
        let token = read_token(&path)?;
        Ok(TokenFile {
            path,
            cached: Mutex::new((seen, token)),
        })
    }

    fn matches(&self, presented: &str) -> bool {
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = stamp(&self.path);
        if now != cached.0 {
            match read_token(&self.path) {
                Ok(t) => *cached = (now, t),
                // Unreadable or empty after a change: accept nothing until it is fixed.
                Err(e) => {
                    warn!(
                        error = &e as &dyn std::error::Error,
                        "API token file changed and is unusable"
                    );
                    cached.0 = now;
                    cached.1.clear();
                }
            }
        }
        !cached.1.is_empty() && bool::from(cached.1.as_bytes().ct_eq(presented.as_bytes()))
    }
}

// === Kubernetes reviews ===

/// TokenReview + SubjectAccessReview, with a short cache keyed by (token, verb, path) (the path
/// is not part of the review today; keyed by it so a per-path review needs no cache change).
struct KubeReviews {
    client: kube::Client,
    cache: Mutex<ReviewCache>,
}

/// (token, verb, path) → when it was decided, and how.
type ReviewCache = HashMap<(String, String, String), (Instant, Decision)>;

/// The RBAC verb of an HTTP method (as the API server maps them for non-resource URLs).
fn verb(method: &Method) -> String {
    match *method {
        Method::GET | Method::HEAD => "get".into(),
        Method::POST => "create".into(),
        Method::PUT => "update".into(),
        Method::PATCH => "patch".into(),
        Method::DELETE => "delete".into(),
        ref other => other.as_str().to_ascii_lowercase(),
    }
}

impl KubeReviews {
    fn new(client: kube::Client) -> Self {
        KubeReviews {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReviewCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn decide(&self, token: &str, method: &Method, path: &str) -> Decision {
        let key = (token.to_string(), verb(method), path.to_string());
        if let Some((at, d)) = self.lock().get(&key)
            && at.elapsed() < REVIEW_CACHE_TTL
        {
            return *d;
        }
        let decision = self.review(&key.0, &key.1, &key.2).await;
        if decision != Decision::Unavailable {
            let mut cache = self.lock();
            if cache.len() >= REVIEW_CACHE_ENTRIES {
                cache.retain(|_, (at, _)| at.elapsed() < REVIEW_CACHE_TTL);
                if cache.len() >= REVIEW_CACHE_ENTRIES {
                    cache.clear();
                }
            }
            cache.insert(key, (Instant::now(), decision));
        }
        decision
    }

    async fn review(&self, token: &str, verb: &str, path: &str) -> Decision {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            reviews.create(&PostParams::default(), &review),
        )
        .await;
        let status = match answer {
            Ok(Ok(r)) => r.status.unwrap_or_default(),
            Ok(Err(e)) => {
                warn!(error = &e as &dyn std::error::Error, "TokenReview failed");
                return Decision::Unavailable;
            }
            Err(_) => {
                warn!("TokenReview timed out");
                return Decision::Unavailable;
            }
        };
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            debug!(%path, "bearer token not authenticated");
            return Decision::Unauthenticated;
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                resource_attributes: Some(ResourceAttributes {
                    group: Some(REVIEW_GROUP.to_string()),
                    resource: Some(REVIEW_RESOURCE.to_string()),
                    verb: Some(verb.to_string()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let accesses: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            accesses.create(&PostParams::default(), &access),
        )
        .await;
        match answer {
            Ok(Ok(r)) if r.status.as_ref().is_some_and(|s| s.allowed) => Decision::Allowed,
            Ok(Ok(_)) => {
                debug!(user = user.username.as_deref().unwrap_or(""), %path, %verb, "not authorised");
                Decision::Forbidden
            }
            Ok(Err(e)) => {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "SubjectAccessReview failed"
                );
                Decision::Unavailable
            }
            Err(_) => {
                warn!("SubjectAccessReview timed out");
                Decision::Unavailable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_token_is_read_from_the_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(bearer(&h), Some("abc"));
        for bad in ["Basic abc", "Bearer", "Bearer ", "abc"] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(bad));
            assert_eq!(bearer(&h), None, "{bad}");
        }
    }

    #[test]
    fn only_metrics_and_probes_are_open() {
        for p in OPEN_PATHS {
            assert!(is_open(p));
        }
        for p in [
            "/",
            "/api/v1/ledger",
            "/api",
            "/metrics/",
            "/METRICS",
            "/healthz/x",
            "",
        ] {
            assert!(!is_open(p), "{p}");
        }
    }

    #[test]
    fn token_file_is_reread_when_it_changes() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").expect("write");
        let f = TokenFile::new(path.clone()).expect("token file");
        assert!(f.matches("first"));
        assert!(!f.matches("firs") && !f.matches("first!") && !f.matches(""));
        std::fs::write(&path, "second-token").expect("write");
        assert!(f.matches("second-token"), "length changed: re-read");
        assert!(!f.matches("first"));
        std::fs::write(&path, "").expect("write");
        assert!(!f.matches(""), "an emptied file accepts nothing");
        assert!(matches!(TokenFile::new(path), Err(AuthError::Empty { .. })));
    }

    #[test]
    fn verbs_follow_the_api_server() {
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::HEAD), "get");
        assert_eq!(verb(&Method::POST), "create");
        assert_eq!(verb(&Method::DELETE), "delete");
    }
}
