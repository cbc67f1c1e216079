//! The admin server with TLS and API authentication, as users run it: the real `gpu-ledger
//! serve` against a real kube-apiserver (testkit tier A, shared), a real TLS client (reqwest,
//! rustls) trusting only the test CA (`testkit::certs::ClusterPki`).
//!
//! * `tls_and_token_file`: HTTPS works and plain HTTP does not; `/metrics`, `/healthz`, `/livez`,
//!   `/readyz` need no token; `/api/v1/ledger` is 401 without or with a wrong token, 200 with the
//!   token; a rotated token file and a rotated certificate are picked up without a restart, and a
//!   broken key/cert pair keeps the previous certificate.
//! * `kubernetes_token_review`: `--api-auth=kubernetes` accepts a ServiceAccount token whose user
//!   the chart's `api-reader` ClusterRole is bound to, forbids an authenticated user without it
//!   (403: every authenticated user may get `/api/*` through `system:discovery`, so the review is
//!   of the virtual resource `gpu-ledger.io/ledger`), and refuses an unknown token (401); the
//!   ServiceAccount running gpu-ledger holds the chart's `system:auth-delegator` binding.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gpu_ledger_testkit::ControlPlane;
use gpu_ledger_testkit::certs::ClusterPki;
use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::process::run_ok;
use gpu_ledger_testkit::stack::apply_rbac;
use gpu_ledger_testkit::util::free_port;
use serde_json::{Value, json};

const READ_ONLY_RBAC: &str = include_str!("../deploy/kustomize/base/rbac.yaml");

/// Writes `contents` to `path` atomically (write, then rename), as a Secret volume updates.
fn replace_file(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// An HTTPS client trusting only `ca_pem`, without connection reuse (each request handshakes).
fn https_client(ca_pem: &str) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes())?)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?)
}

async fn status(client: &reqwest::Client, url: &str, token: Option<&str>) -> Result<u16> {
    let mut req = client.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    Ok(req.send().await?.status().as_u16())
}

/// `gpu-ledger serve` as token user `gpu-ledger` (no Prometheus: usage is unknown, the server
/// and the watches are what is under test), waiting until `ready_url` answers 200.
struct Serve {
    guard: ChildGuard,
    base: String,
}

async fn serve(
    cp: &ControlPlane,
    name: &str,
    kubeconfig: &Path,
    https: Option<&reqwest::Client>,
    args: &[&str],
) -> Result<Serve> {
    let port = free_port()?;
    let mut cmd = gpu_ledger_testkit::process::isolated_command(env!("CARGO_BIN_EXE_gpu-ledger"));
    cmd.env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", name)
        .env("POD_NAMESPACE", "gpu-ledger")
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--refresh-interval", "1s"])
        .args(args);
    let guard = ChildGuard::spawn(name, cmd, &cp.dir().join(format!("{name}.log")))?;
    let scheme = if https.is_some() { "https" } else { "http" };
    let base = format!("{scheme}://127.0.0.1:{port}");
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let client = https.unwrap_or(&plain);
    let mut s = Serve { guard, base };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = s.guard.try_exit_status() {
            bail!("{name} exited ({st}):\n{}", s.guard.log_tail(40));
        }
        if matches!(status(client, &s.url("/readyz"), None).await, Ok(200)) {
            return Ok(s);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{name} not ready:\n{}", s.guard.log_tail(40));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Serve {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

async fn poll_until(what: &str, mut ok: impl AsyncFnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ok().await {
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

fn write_pair(dir: &Path, pki: &ClusterPki) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    replace_file(&cert, &pki.serving_cert_pem)?;
    replace_file(&key, &pki.serving_key_pem)?;
    Ok((cert, key))
}

#[allow(clippy::too_many_lines)] // one server, its open paths, token and certificate rotation
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_token_file() -> Result<()> {
    let cp = ControlPlane::shared(false)?;
    let admin = cp.client("admin").await?;
    apply_rbac(&admin, READ_ONLY_RBAC, "gpu-ledger", "gpu-ledger").await?;
    let dir = tempfile::tempdir()?;
    let (first, second) = (ClusterPki::generate()?, ClusterPki::generate()?);
    let (cert, key) = write_pair(dir.path(), &first)?;
    let token_file = dir.path().join("api-token");
    std::fs::write(&token_file, "s3cret-token\n")?;
    let trust_first = https_client(&first.ca_cert_pem)?;

    let server = serve(
        cp,
        "gpu-ledger-tls",
        &cp.kubeconfig_path("gpu-ledger")?,
        Some(&trust_first),
        &[
            "--tls-cert-file",
            cert.to_str().context("path")?,
            "--tls-key-file",
            key.to_str().context("path")?,
            "--api-token-file",
            token_file.to_str().context("path")?,
        ],
    )
    .await?;

    // TLS: a client trusting the CA gets in; another CA, or plain HTTP, does not.
    for open in ["/metrics", "/healthz", "/livez", "/readyz"] {
        assert_eq!(
            status(&trust_first, &server.url(open), None).await?,
            200,
            "{open} is open"
        );
    }
    assert!(
        status(
            &https_client(&second.ca_cert_pem)?,
            &server.url("/healthz"),
            None
        )
        .await
        .is_err(),
        "a client not trusting the serving CA must fail the handshake"
    );
    let plain = server.url("/healthz").replacen("https://", "http://", 1);
    let plain_answer = reqwest::get(&plain).await.map(|r| r.status().as_u16());
    assert!(
        !matches!(plain_answer, Ok(200)),
        "plain HTTP on the TLS port must not be served: {plain_answer:?}"
    );
    let metrics = trust_first
        .get(server.url("/metrics"))
        .send()
        .await?
        .text()
        .await?;
    assert!(metrics.contains("gpu_ledger_build_info"), "{metrics}");

    // The API needs the token.
    let ledger = server.url("/api/v1/ledger");
    let r = trust_first.get(&ledger).send().await?;
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer realm=\"gpu-ledger\"")
    );
    assert_eq!(status(&trust_first, &ledger, Some("wrong")).await?, 401);
    assert_eq!(
        status(&trust_first, &ledger, Some("s3cret-token-and-more")).await?,
        401
    );
    let r = trust_first
        .get(&ledger)
        .bearer_auth("s3cret-token")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await?;
    assert!(v["pods"].is_array(), "{v}");
    // Paths that do not exist are not a way around it: 404 before any token check (they serve
    // nothing, and an unknown path must not cost a review under --api-auth=kubernetes).
    assert_eq!(
        status(&trust_first, &server.url("/api/v1/ledger/"), None).await?,
        404
    );

    // Token rotation: the new token works at once, the old one no more.
    replace_file(&token_file, "rotated-token")?;
    poll_until("the rotated token", async || {
        matches!(
            status(&trust_first, &ledger, Some("rotated-token")).await,
            Ok(200)
        )
    })
    .await?;
    assert_eq!(
        status(&trust_first, &ledger, Some("s3cret-token")).await?,
        401
    );

    // Certificate rotation: a new pair (another CA) is served without a restart.
    write_pair(dir.path(), &second)?;
    // New clients for each check: a client would resume its earlier TLS session, which skips
    // certificate verification.
    let fresh = |ca: &str| https_client(ca).expect("client");
    poll_until("the rotated certificate", async || {
        matches!(
            status(&fresh(&second.ca_cert_pem), &server.url("/healthz"), None).await,
            Ok(200)
        )
    })
    .await
    .with_context(|| server.guard.log_tail(20))?;
    assert!(
        status(&fresh(&first.ca_cert_pem), &server.url("/healthz"), None)
            .await
            .is_err(),
        "the old certificate is no longer served"
    );
    // A broken pair (key of another certificate) is not taken: the current one stays.
    replace_file(&key, &first.serving_key_pem)?;
    tokio::time::sleep(gpu_ledger::export::tls::RELOAD_CHECK * 3).await;
    assert_eq!(
        status(&fresh(&second.ca_cert_pem), &server.url("/healthz"), None).await?,
        200,
        "a mismatched key must not replace the working pair"
    );
    assert!(
        std::fs::read_to_string(server.guard.log_path())?
            .contains("TLS files changed but cannot be loaded"),
        "{}",
        server.guard.log_tail(20)
    );
    Ok(())
}

/// Unusable TLS or token files stop `serve` at start-up with exit code 2, naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_and_token_files_are_refused_at_start() -> Result<()> {
    let cp = ControlPlane::shared(false)?;
    let dir = tempfile::tempdir()?;
    let pki = ClusterPki::generate()?;
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    let empty = dir.path().join("empty-token");
    std::fs::write(&cert, &pki.serving_cert_pem)?;
    std::fs::write(&key, &pki.ca_key_pem)?; // a key, but not this certificate's
    std::fs::write(&empty, "\n")?;
    let p = |x: &Path| x.to_str().map(str::to_string).context("utf8 path");
    let (cert, key, empty) = (p(&cert)?, p(&key)?, p(&empty)?);
    for (args, needle) in [
        (
            vec!["--tls-cert-file", &cert, "--tls-key-file", &key],
            "do not form a usable pair",
        ),
        (
            vec![
                "--tls-cert-file",
                "/nonexistent/tls.crt",
                "--tls-key-file",
                &key,
            ],
            "/nonexistent/tls.crt: cannot read",
        ),
        (
            vec!["--tls-cert-file", &key, "--tls-key-file", &key],
            "no PEM certificate found",
        ),
        (
            vec!["--api-token-file", "/nonexistent/token"],
            "--api-token-file /nonexistent/token: cannot read",
        ),
        (vec!["--api-token-file", &empty], "the file is empty"),
        (vec!["--tls-cert-file", &cert], "--tls-key-file"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .env("KUBECONFIG", cp.kubeconfig_path("gpu-ledger")?)
            .env_remove("GPU_LEDGER_API_TOKEN_FILE")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
    Ok(())
}

/// A kubeconfig for `token` against `cp`.
fn kubeconfig_with_token(cp: &ControlPlane, name: &str, token: &str) -> Result<PathBuf> {
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testkit", "cluster": {
            "server": cp.server_url(),
            "certificate-authority": cp.ca_path(),
        }}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "testkit", "user": name}}],
        "current-context": name,
    });
    let path = cp.dir().join(format!("kubeconfig-{name}.yaml"));
    std::fs::write(&path, kc.to_string())?;
    Ok(path)
}

fn apply(cp: &ControlPlane, objs: &[Value]) -> Result<()> {
    let mut c = cp.kubectl("admin")?;
    c.args([
        "apply",
        "--server-side",
        "--field-manager=server-tls-test",
        "-f",
        "-",
    ]);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objs});
    run_ok(c, Some(&list.to_string()))?;
    Ok(())
}

fn create_token(cp: &ControlPlane, ns: &str, sa: &str) -> Result<String> {
    let mut c = cp.kubectl("admin")?;
    c.args(["create", "token", sa, "-n", ns, "--duration=1h"]);
    Ok(run_ok(c, None)?.trim().to_string())
}

/// The chart's objects for `--api-auth=kubernetes` (release `gl-auth` in `ns`).
fn chart_api_auth_objects(ns: &str) -> Result<Vec<Value>> {
    let helm = gpu_ledger_testkit::binary("helm")?;
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-tls-helm-home");
    let mut c = Command::new(helm);
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .args([
            "template",
            "gl-auth",
            "deploy/helm/gpu-ledger",
            "--namespace",
            ns,
            // The chart's kubeVersion constraint: helm template alone assumes v1.20.
            "--kube-version",
            "v1.36.3",
        ])
        .args([
            "--set",
            "apiAuth.kubernetes=true",
            "--show-only",
            "templates/rbac.yaml",
        ])
        .args(["--show-only", "templates/serviceaccount.yaml"]);
    let yaml = run_ok(c, None)?;
    let mut out = Vec::new();
    for d in serde_norway::Deserializer::from_str(&yaml) {
        let v = <Value as serde::Deserialize>::deserialize(d)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Namespace `NS`, the chart's `--api-auth=kubernetes` objects, ServiceAccounts `reader` (bound
/// to the chart's api-reader role) and `nosy` (not bound); a kubeconfig of gpu-ledger's own
/// ServiceAccount. Idempotent (server-side apply), so tests may share it.
fn kube_auth_setup(cp: &ControlPlane) -> Result<PathBuf> {
    const NS: &str = "gl-auth";
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    apply(cp, &[ns])?;
    let objs = chart_api_auth_objects(NS)?;
    ensure!(
        objs.iter()
            .any(|o| o["roleRef"]["name"] == "system:auth-delegator"),
        "the chart binds the ServiceAccount to system:auth-delegator"
    );
    apply(cp, &objs)?;
    // Two callers: a ServiceAccount bound to the chart's api-reader role, and one without.
    let reader_binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "ledger-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": "gl-auth-gpu-ledger-api-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": NS}],
    });
    let sa = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": NS}})
    };
    apply(cp, &[sa("reader"), sa("nosy"), reader_binding])?;
    let ledger_token = create_token(cp, NS, "gl-auth-gpu-ledger")?;
    kubeconfig_with_token(cp, "gl-auth-gpu-ledger", &ledger_token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_token_review() -> Result<()> {
    const NS: &str = "gl-auth";
    let cp = ControlPlane::shared(false)?;
    let kubeconfig = kube_auth_setup(cp)?;
    let server = serve(
        cp,
        "gpu-ledger-kube-auth",
        &kubeconfig,
        None,
        &["--api-auth", "kubernetes"],
    )
    .await?;
    let http = reqwest::Client::new();
    let ledger = server.url("/api/v1/ledger");

    assert_eq!(status(&http, &server.url("/metrics"), None).await?, 200);
    assert_eq!(status(&http, &ledger, None).await?, 401);
    assert_eq!(
        status(&http, &ledger, Some("not-a-kubernetes-token")).await?,
        401
    );
    let reader = create_token(cp, NS, "reader")?;
    assert_eq!(
        status(&http, &ledger, Some(&reader)).await?,
        200,
        "{}",
        server.guard.log_tail(20)
    );
    let nosy = create_token(cp, NS, "nosy")?;
    assert_eq!(status(&http, &ledger, Some(&nosy)).await?, 403);
    // A static user of the API server (token file authenticator), also without the role.
    assert_eq!(
        status(&http, &ledger, Some(cp.token("intruder")?)).await?,
        403
    );
    // The API server's own verdict: system:masters may read it.
    assert_eq!(status(&http, &ledger, Some(cp.token("admin")?)).await?, 200);
    Ok(())
}

/// Sum of the samples of `family` in a text exposition whose labels contain `labels`.
fn sample_sum(text: &str, family: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && l.contains(labels)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A caller without a valid token cannot make gpu-ledger hold or send much: a huge token is
/// refused without a TokenReview, and a flood of distinct bad tokens is rate-limited (429)
/// after a burst, while a valid caller gets in again a moment later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_token_review_is_bounded() -> Result<()> {
    use gpu_ledger::export::auth::{MAX_TOKEN_BYTES, REVIEW_BURST, REVIEW_RATE};
    const REVIEWS: &str = "gpu_ledger_api_auth_reviews_total";
    const REFUSED: &str = "gpu_ledger_api_auth_refused_total";
    let cp = ControlPlane::shared(false)?;
    let kubeconfig = kube_auth_setup(cp)?;
    let server = serve(
        cp,
        "gpu-ledger-kube-auth-bounded",
        &kubeconfig,
        None,
        &["--api-auth", "kubernetes"],
    )
    .await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let ledger = server.url("/api/v1/ledger");
    let metrics = async || -> Result<String> {
        Ok(http
            .get(server.url("/metrics"))
            .send()
            .await?
            .text()
            .await?)
    };

    // A token of 4 times the bound: 401, and no TokenReview sent.
    let before = metrics().await?;
    let huge = "h".repeat(MAX_TOKEN_BYTES * 4);
    assert_eq!(status(&http, &ledger, Some(&huge)).await?, 401);
    let after = metrics().await?;
    assert_eq!(
        sample_sum(&after, REFUSED, "reason=\"token_too_large\""),
        1.0,
        "{after}"
    );
    assert_eq!(
        sample_sum(&after, REVIEWS, ""),
        sample_sum(&before, REVIEWS, ""),
        "a token over the bound must not be sent for review"
    );

    // A flood of distinct bad tokens: reviews stop after the burst, the rest get 429.
    let started = tokio::time::Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (http, ledger) = (http.clone(), ledger.clone());
        flood.spawn(async move {
            let token = format!("bad-token-{i}-{}", "z".repeat(900));
            http.get(&ledger)
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
    }
    let mut codes = std::collections::BTreeMap::<u16, u32>::new();
    while let Some(r) = flood.join_next().await {
        *codes.entry(r??).or_default() += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after_flood = metrics().await?;
    let reviewed = sample_sum(&after_flood, REVIEWS, "result=\"unauthenticated\"")
        - sample_sum(&after, REVIEWS, "result=\"unauthenticated\"");
    ensure!(
        codes.keys().all(|c| [401, 429].contains(c)),
        "only 401 and 429: {codes:?}"
    );
    ensure!(
        codes.get(&429).copied().unwrap_or(0) > 0,
        "the flood was not rate-limited: {codes:?}"
    );
    ensure!(
        reviewed <= f64::from(REVIEW_BURST) + REVIEW_RATE * (elapsed + 1.0),
        "{reviewed} TokenReviews in {elapsed:.1} s for {codes:?}"
    );
    ensure!(
        sample_sum(&after_flood, REFUSED, "reason=\"rate_limited\"")
            == f64::from(codes.get(&429).copied().unwrap_or(0)),
        "{after_flood}"
    );

    // A valid caller is served again once the bucket refills.
    let reader = create_token(cp, "gl-auth", "reader")?;
    poll_until("the reader after the flood", async || {
        matches!(status(&http, &ledger, Some(&reader)).await, Ok(200))
    })
    .await
    .with_context(|| server.guard.log_tail(20))?;
    Ok(())
}

/// `count` fresh TokenRequest tokens of ServiceAccount `sa` in `ns` (one caller, many tokens).
async fn mint_tokens(cp: &ControlPlane, ns: &str, sa: &str, count: usize) -> Result<Vec<String>> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(cp.client("admin").await?, ns);
    let mut tokens = Vec::with_capacity(count);
    for _ in 0..count {
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let answer = accounts
            .create_token_request(sa, &kube::api::PostParams::default(), &request)
            .await?;
        let token = answer.status.and_then(|s| s.token);
        tokens.push(token.context("TokenRequest answered without a token")?);
    }
    Ok(tokens)
}

/// An authenticated caller cannot make gpu-ledger send reviews without bound either (issue 36:
/// 273 review pairs/s against the documented 5/s). The review asks about the virtual resource
/// `gpu-ledger.io/ledger`, never the path, so the answer is cached by token and verb: one token
/// costs one review pair however many paths it asks for; paths that are not served are 404 and
/// methods not served 405 before any review; and every review pair, allowed or forbidden, draws
/// from the budget, so many tokens of one caller are held to the burst and the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_reviews_are_bounded_for_authenticated_callers() -> Result<()> {
    use gpu_ledger::export::auth::{REVIEW_BURST, REVIEW_RATE};
    const NS: &str = "gl-auth";
    const REVIEWS: &str = "gpu_ledger_api_auth_reviews_total";
    const PATHS: usize = 60;
    const TOKENS: usize = 80;
    let cp = ControlPlane::shared(false)?;
    let kubeconfig = kube_auth_setup(cp)?;
    let server = serve(
        cp,
        "gpu-ledger-kube-auth-callers",
        &kubeconfig,
        None,
        &["--api-auth", "kubernetes"],
    )
    .await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let reviews = async || -> Result<f64> {
        let text = http
            .get(server.url("/metrics"))
            .send()
            .await?
            .text()
            .await?;
        Ok(sample_sum(&text, REVIEWS, ""))
    };

    // One forbidden token, many paths and methods: one review pair, the rest from the cache or
    // refused before a review.
    let nosy = create_token(cp, NS, "nosy")?;
    let before = reviews().await?;
    let mut codes = std::collections::BTreeMap::<(String, u16), u32>::new();
    for i in 0..PATHS {
        for (kind, method, path) in [
            ("unknown path", "GET", format!("/api/v1/ledger/{i}")),
            ("unknown path", "GET", format!("/no-such-page-{i}")),
            ("GET", "GET", "/api/v1/ledger".to_string()),
            ("HEAD", "HEAD", "/".to_string()),
            ("POST", "POST", "/api/v1/ledger".to_string()),
            ("DELETE", "DELETE", "/api/v1/history".to_string()),
        ] {
            let answer = http
                .request(method.parse()?, server.url(&path))
                .bearer_auth(&nosy)
                .send()
                .await?;
            *codes
                .entry((kind.to_string(), answer.status().as_u16()))
                .or_default() += 1;
        }
    }
    // Both halves run before anything is asserted, so a failure shows both.
    let mut problems = Vec::new();
    let reviewed = reviews().await? - before;
    if reviewed > 1.0 {
        problems.push(format!(
            "{reviewed} review pairs for one token over {PATHS} x 6 requests: {codes:?}"
        ));
    }
    let expected: std::collections::BTreeMap<(String, u16), u32> = [
        (("DELETE".to_string(), 405), PATHS as u32),
        (("GET".to_string(), 403), PATHS as u32),
        (("HEAD".to_string(), 403), PATHS as u32),
        (("POST".to_string(), 405), PATHS as u32),
        (("unknown path".to_string(), 404), 2 * PATHS as u32),
    ]
    .into();
    if codes != expected {
        problems.push(format!("answers {codes:?}, expected {expected:?}"));
    }

    // Many tokens of one forbidden caller, one after the other (each review answered before
    // the next request, as the 273 pairs/s were): reviewed up to the burst and the rate, the
    // rest 429.
    let tokens = mint_tokens(cp, NS, "nosy", TOKENS).await?;
    let before = reviews().await?;
    let started = tokio::time::Instant::now();
    let ledger = server.url("/api/v1/ledger");
    let mut codes = std::collections::BTreeMap::<u16, u32>::new();
    for token in &tokens {
        *codes
            .entry(status(&http, &ledger, Some(token)).await?)
            .or_default() += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let reviewed = reviews().await? - before;
    if reviewed > f64::from(REVIEW_BURST) + REVIEW_RATE * (elapsed + 1.0) {
        problems.push(format!(
            "{reviewed} review pairs in {elapsed:.1} s for {TOKENS} tokens of one caller: {codes:?}"
        ));
    }
    if !(codes.keys().all(|c| [403, 429].contains(c)) && codes.contains_key(&429)) {
        problems.push(format!("{TOKENS} tokens of one caller answered {codes:?}"));
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // A reader is served again once the budget refills.
    let reader = create_token(cp, NS, "reader")?;
    poll_until("the reader after the flood", async || {
        matches!(
            status(&http, &server.url("/api/v1/ledger"), Some(&reader)).await,
            Ok(200)
        )
    })
    .await
    .with_context(|| server.guard.log_tail(20))?;
    Ok(())
}
