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
//!
//! What a caller can make the process hold or send is bounded, whether or not its token is
//! valid: only the routes the server serves are checked (any other path is 404 and any method
//! but GET and HEAD 405 before a review); tokens over [`MAX_TOKEN_BYTES`] are
//! refused (401) without a review; answers are cached by a SHA-256 of (token, verb), which is
//! everything the review depends on (the reviewed resource is fixed, the path is not part of
//! it), at most [`REVIEW_CACHE_ENTRIES`] of them; requests with the same token wait for one
//! review in flight rather than each sending their own; and every review (a TokenReview and
//! its SubjectAccessReview), whatever its answer, draws from one token bucket ([`REVIEW_BURST`],
//! refilled at [`REVIEW_RATE`] per second), and an empty bucket answers 429.

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
use prometheus::{IntCounterVec, Opts, Registry};
use subtle::ConstantTimeEq as _;
use tracing::{debug, warn};

/// Served to anyone: Prometheus scrapes `/metrics`, the kubelet probes the rest.
pub const OPEN_PATHS: [&str; 4] = ["/metrics", "/healthz", "/livez", "/readyz"];
/// How long a TokenReview + SubjectAccessReview answer is reused for the same token and request.
pub const REVIEW_CACHE_TTL: Duration = Duration::from_secs(30);
/// Most answers kept (expired ones, then the oldest, are dropped first when full).
pub const REVIEW_CACHE_ENTRIES: usize = 1024;
/// Longest bearer token sent for review: Kubernetes ServiceAccount tokens are about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Reviews (TokenReview + SubjectAccessReview, whatever their answer) that may be sent at once
/// after a quiet spell.
pub const REVIEW_BURST: u32 = 20;
/// Reviews per second, sustained, for all callers together.
pub const REVIEW_RATE: f64 = 5.0;
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
    #[error("registering the API authentication metrics")]
    Metrics(#[source] prometheus::Error),
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
    /// Too many reviews lately (429).
    RateLimited,
    /// A method the routes do not serve (405), refused without a review.
    MethodNotAllowed,
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
    /// read now: missing or empty is an error. With Kubernetes reviews, their metrics are
    /// registered in `registry`.
    pub fn new(
        token_file: Option<PathBuf>,
        kubernetes: Option<kube::Client>,
        registry: &Registry,
    ) -> Result<Option<Self>, AuthError> {
        if token_file.is_none() && kubernetes.is_none() {
            return Ok(None);
        }
        let token_file = token_file.map(TokenFile::new).transpose()?;
        let kubernetes = match kubernetes {
            Some(client) => Some(KubeReviews::new(
                client,
                ReviewMetrics::register(registry).map_err(AuthError::Metrics)?,
            )),
            None => None,
        };
        Ok(Some(ApiAuth {
            inner: Arc::new(Inner {
                token_file,
                kubernetes,
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

/// `router` with authentication in front of every route but [`OPEN_PATHS`] (unchanged when
/// `auth` is `None`). A route layer: a path the router does not serve is 404, and a method a
/// route does not serve 405, before any token is looked at, so arbitrary paths and methods
/// cannot mint reviews.
pub fn protect(router: Router, auth: Option<ApiAuth>) -> Router {
    match auth {
        Some(a) => router.route_layer(axum::middleware::from_fn_with_state(a, require)),
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
        Decision::RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "too many bearer token reviews lately; try again\n",
        )
            .into_response(),
        Decision::MethodNotAllowed => (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "GET, HEAD")],
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

/// TokenReview + SubjectAccessReview, with a short cache keyed by a hash of (token, verb): the
/// review asks about the fixed virtual resource, so nothing else in the request can change its
/// answer. One review in flight per key, and every review draws from one rate limit.
struct KubeReviews {
    client: kube::Client,
    cache: Mutex<ReviewCache>,
    bucket: Mutex<TokenBucket>,
    /// Reviews being made, by key: a second request with the same token waits for the answer.
    /// An entry lives only while a request for it is in flight ([`InFlight`] removes it).
    in_flight: Mutex<HashMap<CacheKey, Arc<tokio::sync::OnceCell<Decision>>>>,
    metrics: ReviewMetrics,
}

/// Counters of `--api-auth=kubernetes` (bounded labels).
struct ReviewMetrics {
    /// TokenReviews sent, by outcome.
    reviews: IntCounterVec,
    /// Requests refused without a review, by reason.
    refused: IntCounterVec,
}

impl ReviewMetrics {
    fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let reviews = IntCounterVec::new(
            Opts::new(
                "gpu_ledger_api_auth_reviews_total",
                "TokenReviews sent for API callers (--api-auth=kubernetes), by outcome: allowed, forbidden, unauthenticated, unavailable.",
            ),
            &["result"],
        )?;
        let refused = IntCounterVec::new(
            Opts::new(
                "gpu_ledger_api_auth_refused_total",
                "API requests refused without a TokenReview (--api-auth=kubernetes), by reason: token_too_large (401), rate_limited (429: every review draws from one budget).",
            ),
            &["reason"],
        )?;
        for r in ["allowed", "forbidden", "unauthenticated", "unavailable"] {
            reviews.with_label_values(&[r]);
        }
        for r in ["token_too_large", "rate_limited"] {
            refused.with_label_values(&[r]);
        }
        registry.register(Box::new(reviews.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        Ok(ReviewMetrics { reviews, refused })
    }
}

/// SHA-256 of (token, verb): what the cache keeps instead of the caller's text.
type CacheKey = [u8; 32];

fn cache_key(token: &str, verb: &str) -> CacheKey {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    // Lengths first, so no two different pairs hash the same bytes.
    for part in [token, verb] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part.as_bytes());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

/// Answers by key, for [`REVIEW_CACHE_TTL`], at most `cap` of them: a fixed size per entry, so
/// the cache's memory is bounded whatever callers send.
#[derive(Debug)]
struct ReviewCache {
    entries: HashMap<CacheKey, (Instant, Decision)>,
    cap: usize,
}

impl ReviewCache {
    fn new(cap: usize) -> Self {
        ReviewCache {
            entries: HashMap::with_capacity(cap.min(REVIEW_CACHE_ENTRIES)),
            cap: cap.max(1),
        }
    }

    fn get(&self, key: &CacheKey, now: Instant) -> Option<Decision> {
        self.entries
            .get(key)
            .filter(|(at, _)| now.saturating_duration_since(*at) < REVIEW_CACHE_TTL)
            .map(|(_, d)| *d)
    }

    /// Keeps `decision` for `key`; when full, expired answers go first, then the oldest.
    fn insert(&mut self, key: CacheKey, decision: Decision, now: Instant) {
        if self.entries.len() >= self.cap && !self.entries.contains_key(&key) {
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < REVIEW_CACHE_TTL);
            while self.entries.len() >= self.cap {
                let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| *k)
                else {
                    break;
                };
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (now, decision));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A token bucket: `capacity` draws at once, refilled at `per_second`.
#[derive(Debug)]
struct TokenBucket {
    capacity: f64,
    per_second: f64,
    available: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(capacity: u32, per_second: f64, now: Instant) -> Self {
        TokenBucket {
            capacity: f64::from(capacity),
            per_second,
            available: f64::from(capacity),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.available = (self.available + elapsed * self.per_second).min(self.capacity);
        self.at = now;
    }

    /// Takes one draw if there is one.
    fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.available >= 1.0 {
            self.available -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The RBAC verb of an HTTP method: `get` for GET and HEAD, the only methods the routes serve;
/// `None` for any other, refused with 405 before a review (so invented methods cannot mint
/// reviews or cache entries either).
fn verb(method: &Method) -> Option<&'static str> {
    matches!(*method, Method::GET | Method::HEAD).then_some("get")
}

/// Removes its in-flight entry when the request that made it ends (answered or dropped).
struct InFlight<'a> {
    map: &'a Mutex<HashMap<CacheKey, Arc<tokio::sync::OnceCell<Decision>>>>,
    key: CacheKey,
    cell: Arc<tokio::sync::OnceCell<Decision>>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut map = lock(self.map);
        if map
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.cell))
        {
            map.remove(&self.key);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl KubeReviews {
    fn new(client: kube::Client, metrics: ReviewMetrics) -> Self {
        KubeReviews {
            client,
            cache: Mutex::new(ReviewCache::new(REVIEW_CACHE_ENTRIES)),
            bucket: Mutex::new(TokenBucket::new(REVIEW_BURST, REVIEW_RATE, Instant::now())),
            in_flight: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    async fn decide(&self, token: &str, method: &Method, path: &str) -> Decision {
        if token.len() > MAX_TOKEN_BYTES {
            self.metrics
                .refused
                .with_label_values(&["token_too_large"])
                .inc();
            debug!(bytes = token.len(), "bearer token too large for a review");
            return Decision::Unauthenticated;
        }
        let Some(verb) = verb(method) else {
            return Decision::MethodNotAllowed;
        };
        let key = cache_key(token, verb);
        if let Some(d) = lock(&self.cache).get(&key, Instant::now()) {
            return d;
        }
        let cell = lock(&self.in_flight).entry(key).or_default().clone();
        let _in_flight = InFlight {
            map: &self.in_flight,
            key,
            cell: cell.clone(),
        };
        *cell
            .get_or_init(|| self.review_once(token, verb, path, key))
            .await
    }

    /// One review under the rate limit, counted and cached.
    async fn review_once(&self, token: &str, verb: &str, path: &str, key: CacheKey) -> Decision {
        if let Some(d) = lock(&self.cache).get(&key, Instant::now()) {
            return d;
        }
        // Every review draws, allowed and forbidden too: any authenticated caller can mint
        // tokens, so a draw given back let one caller send reviews without bound.
        if !lock(&self.bucket).try_take(Instant::now()) {
            self.metrics
                .refused
                .with_label_values(&["rate_limited"])
                .inc();
            return Decision::RateLimited;
        }
        let decision = self.review(token, verb, path).await;
        let result = match decision {
            Decision::Allowed => "allowed",
            Decision::Forbidden => "forbidden",
            Decision::Unauthenticated => "unauthenticated",
            Decision::Unavailable | Decision::RateLimited | Decision::MethodNotAllowed => {
                "unavailable"
            }
        };
        self.metrics.reviews.with_label_values(&[result]).inc();
        if decision != Decision::Unavailable {
            lock(&self.cache).insert(key, decision, Instant::now());
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
    use std::fmt::Write as _;

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
    fn review_cache_stays_within_its_cap_whatever_the_tokens() {
        let mut cache = ReviewCache::new(64);
        let start = Instant::now();
        let mut token = String::new();
        for i in 0..10_000u32 {
            // Large, distinct tokens: the cache keeps 32 bytes of each, not the text.
            token.clear();
            let _ = write!(token, "{i:08}-{}", "x".repeat(4096));
            cache.insert(
                cache_key(&token, "get"),
                Decision::Unauthenticated,
                start + Duration::from_millis(u64::from(i)),
            );
            assert!(cache.len() <= 64, "{} entries after {i}", cache.len());
        }
        // The newest answers are kept, the oldest went first.
        let now = start + Duration::from_secs(10);
        let newest = format!("{:08}-{}", 9_999, "x".repeat(4096));
        let oldest = format!("{:08}-{}", 0, "x".repeat(4096));
        assert_eq!(
            cache.get(&cache_key(&newest, "get"), now),
            Some(Decision::Unauthenticated)
        );
        assert_eq!(cache.get(&cache_key(&oldest, "get"), now), None);
        // Expired answers are not served.
        assert_eq!(
            cache.get(&cache_key(&newest, "get"), now + REVIEW_CACHE_TTL),
            None
        );
    }

    #[test]
    fn cache_keys_tell_tokens_and_verbs_apart() {
        let k = cache_key("ab", "get");
        assert_ne!(k, cache_key("a", "bget"));
        assert_ne!(k, cache_key("ab", "create"));
        assert_eq!(k, cache_key("ab", "get"));
    }

    #[test]
    fn token_bucket_limits_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3, 2.0, t0);
        assert!(b.try_take(t0) && b.try_take(t0) && b.try_take(t0));
        assert!(!b.try_take(t0), "burst spent");
        assert!(!b.try_take(t0 + Duration::from_millis(400)));
        assert!(b.try_take(t0 + Duration::from_millis(500)), "2 per second");
        assert!(!b.try_take(t0 + Duration::from_millis(500)));
        // Never more than the burst, however long the pause.
        let later = t0 + Duration::from_secs(3600);
        assert!((0..3).all(|_| b.try_take(later)));
        assert!(!b.try_take(later));
    }

    #[test]
    fn verbs_follow_the_api_server() {
        assert_eq!(verb(&Method::GET), Some("get"));
        assert_eq!(verb(&Method::HEAD), Some("get"));
        assert_eq!(verb(&Method::POST), None);
        assert_eq!(verb(&Method::DELETE), None);
        let invented = Method::from_bytes(b"MINT1").expect("extension method");
        assert_eq!(verb(&invented), None);
    }
}
