//! Culling leadership under faults, with real `gpu-ledger serve` processes on a real control
//! plane (testkit), two replicas on one Lease:
//!
//! * `hung_lease_renewal_never_lets_two_replicas_write`: tier B with kwok GPU nodes, the fake
//!   dcgm-exporter scraped by a real Prometheus, an audit log of every write to Events,
//!   Notebooks, ConfigMaps and Leases. Two `--cull=dry-run` replicas; the leader talks to the
//!   apiserver through the [`FaultProxy`] test double, which then hangs every Lease PUT (its
//!   renewals never arrive, never fail). Dry-run leaders write an `IdleGPUWouldStop` Event for
//!   each idle notebook every cycle, so the audit log shows who writes when. Proven: the old
//!   leader stops writing (its claim runs out on its monotonic clock), the other takes over
//!   only after a full lease duration without a change, and in the apiserver's own order of
//!   writes the old leader's last write comes before the new leader's first: never two writers.
//! * `a_skewed_clock_does_not_take_a_live_lease`: tier A. A second replica whose wall clock runs
//!   30 s ahead (test hook `GPU_LEDGER_TEST_LEASE_CLOCK_OFFSET`, debug builds; it shifts only
//!   the times the replica writes into the Lease) must not take the live Lease of the first,
//!   however long it watches; once the first leaves, it takes over at once and its renewTime
//!   shows the skew.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use gpu_ledger_testkit::process::ChildGuard;
use gpu_ledger_testkit::stack::{
    GpuLedgerProcess, LEDGER_NAMESPACE, LedgerOptions, Notebook, metric_value,
};
use gpu_ledger_testkit::{ControlPlane, Fault, FaultProxy, GpuNode, Rule, TierBOptions};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use support::{CULLING_RBAC, eventually, grant_shipped_read_only, namespace};

const WAIT: Duration = Duration::from_secs(60);

async fn metric(gl: &GpuLedgerProcess, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric_value(&gl.metrics_text().await.ok()?, family, labels)
}

/// One write the apiserver audited: who (the replica named in gpu-ledger's User-Agent), when
/// the apiserver received it, what.
#[derive(Debug, Clone)]
struct Write {
    replica: String,
    at: DateTime<Utc>,
    what: String,
}

/// The writes to Events and Notebooks made by gpu-ledger replicas, in the apiserver's order.
fn culling_writes(cp: &ControlPlane) -> Vec<Write> {
    let mut out: Vec<Write> = cp
        .audit_events()
        .expect("audit log")
        .iter()
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .filter(|e| {
            matches!(
                e["objectRef"]["resource"].as_str(),
                Some("events" | "notebooks")
            )
        })
        .filter_map(|e| {
            // "gpu-ledger/0.1.0 (gpu-ledger-3)" → "gpu-ledger-3".
            let ua = e["userAgent"].as_str()?;
            let replica = ua.strip_prefix("gpu-ledger/")?.split_once(" (")?.1;
            let at = DateTime::parse_from_rfc3339(e["requestReceivedTimestamp"].as_str()?)
                .ok()?
                .with_timezone(&Utc);
            Some(Write {
                replica: replica.trim_end_matches(')').to_string(),
                at,
                what: format!(
                    "{} {}/{}",
                    e["verb"].as_str().unwrap_or_default(),
                    e["objectRef"]["resource"].as_str().unwrap_or_default(),
                    e["objectRef"]["namespace"].as_str().unwrap_or_default()
                ),
            })
        })
        .collect();
    out.sort_by_key(|w| w.at);
    out
}

fn count_by(writes: &[Write], replica: &str) -> usize {
    writes.iter().filter(|w| w.replica == replica).count()
}

#[allow(clippy::too_many_lines)] // one scenario, in order: two replicas, the hang, the takeover, the audit
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_lease_renewal_never_lets_two_replicas_write() {
    // The one Lease the shipped RBAC grants.
    const LEASE: &str = "gpu-ledger";
    let started = Instant::now();
    let stack = support::tier_b_with(
        &[GpuNode::new("n1", 1), GpuNode::new("n2", 1)],
        TierBOptions {
            audit: true,
            ..TierBOptions::default()
        },
        support::Grants::Culling,
    )
    .await;
    for nb in [
        Notebook::new("team-a", "idle-a").node("n1"),
        Notebook::new("team-b", "idle-b").node("n2"),
    ] {
        stack.create_notebook(&nb).await.expect("notebook");
        stack
            .wait_pod_running(&nb.namespace, &nb.pod_name())
            .await
            .expect("notebook pod Running");
    }

    let proxy = FaultProxy::start(&stack.cp).await.expect("fault proxy");
    let dir = tempfile::tempdir().expect("temp dir");
    let via_proxy = proxy
        .kubeconfig(&stack.cp, "gpu-ledger", &dir.path().join("kubeconfig"))
        .expect("proxy kubeconfig");
    let bin = Path::new(env!("CARGO_BIN_EXE_gpu-ledger"));
    let args = [
        "--cull=dry-run",
        "--lease-name",
        LEASE,
        "--cull-idle-after",
        "5s",
        "--cull-min-runtime",
        "5s",
    ];
    let a = stack
        .start_gpu_ledger_with(
            bin,
            "gpu-ledger",
            &args,
            &LedgerOptions {
                kubeconfig: Some(via_proxy),
                ..LedgerOptions::default()
            },
        )
        .await
        .expect("replica a (through the fault proxy)");
    eventually("a leads", WAIT, || async {
        (metric(&a, "gpu_ledger_cull_leader", &[]).await? == 1.0).then_some(())
    })
    .await;
    let b = stack
        .start_gpu_ledger(bin, "gpu-ledger", &args)
        .await
        .expect("replica b");
    let (name_a, name_b) = (a.name().to_string(), b.name().to_string());
    eventually(
        "a writes dry-run Events, b follows",
        Duration::from_secs(90),
        || async {
            let writes = culling_writes(&stack.cp);
            let b_follows = metric(&b, "gpu_ledger_cull_leader", &[]).await? == 0.0;
            (count_by(&writes, &name_a) >= 4 && b_follows).then_some(())
        },
    )
    .await;

    // a's renewals hang from now on: never forwarded, never answered.
    proxy.set_rules(vec![Rule::new(
        "PUT",
        &format!("/leases/{LEASE}"),
        Fault::Hang,
    )]);
    let hung = Instant::now();
    eventually("b takes over", Duration::from_secs(90), || async {
        (metric(&b, "gpu_ledger_cull_leader", &[]).await? == 1.0).then_some(())
    })
    .await;
    let took_over_after = hung.elapsed();
    eventually("b writes dry-run Events", WAIT, || async {
        (count_by(&culling_writes(&stack.cp), &name_b) >= 4).then_some(())
    })
    .await;
    // A few more cycles, in which a must stay silent.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The apiserver's order of writes: all of a's, then all of b's.
    let writes = culling_writes(&stack.cp);
    let last_a = writes
        .iter()
        .rfind(|w| w.replica == name_a)
        .expect("a wrote while it led")
        .clone();
    let first_b = writes
        .iter()
        .find(|w| w.replica == name_b)
        .expect("b wrote once it led")
        .clone();
    let interleaved: Vec<&Write> = writes
        .iter()
        .filter(|w| w.replica == name_a && w.at >= first_b.at)
        .collect();
    assert!(
        interleaved.is_empty() && last_a.at < first_b.at,
        "two replicas wrote in the same period: a's last write {last_a:?}, b's first {first_b:?}, \
         a's writes after b started ({}): {:?}",
        interleaved.len(),
        interleaved.iter().take(5).collect::<Vec<_>>()
    );

    // a knows it lost: it says so, and counted its timed-out renewals.
    assert!(
        proxy.held() >= 1,
        "a's Lease PUTs were hung: {}",
        proxy.held()
    );
    assert_eq!(
        metric(&a, "gpu_ledger_cull_leader", &[]).await,
        Some(0.0),
        "a is a follower"
    );
    let timeouts = metric(
        &a,
        "gpu_ledger_cull_lease_errors_total",
        &[("reason", "timeout")],
    )
    .await
    .expect("lease errors counter");
    assert!(
        timeouts >= 1.0,
        "a counted its timed-out renewals: {timeouts}"
    );
    let leases: Api<Lease> = Api::namespaced(stack.admin(), LEDGER_NAMESPACE);
    let holder = leases
        .get(LEASE)
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(name_b.as_str()));
    eprintln!(
        "hung lease PUT: b led {took_over_after:?} after the hang; gap between a's last write ({}) and b's first ({}): {} ms; \
         writes a={} b={}; {} PUTs held; took {:?}",
        last_a.what,
        first_b.what,
        (first_b.at - last_a.at).num_milliseconds(),
        count_by(&writes, &name_a),
        count_by(&writes, &name_b),
        proxy.held(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------

/// `gpu-ledger serve --cull=on` as token user `gpu-ledger` on a tier A cluster (no Prometheus:
/// nothing is ever idle, so only the election runs), logging to `<dir>/<pod>.log`.
fn spawn_serve(
    cp: &ControlPlane,
    dir: &Path,
    port: u16,
    pod: &str,
    env: &[(&str, &str)],
) -> ChildGuard {
    let mut cmd = support::gpu_ledger_command();
    cmd.arg("serve")
        .arg(format!("--listen=127.0.0.1:{port}"))
        .args([
            "--refresh-interval=1s",
            "--cull=on",
            "--lease-name=gpu-ledger",
            "--lease-namespace=default",
            "--namespaces=skew",
        ])
        .env(
            "KUBECONFIG",
            cp.kubeconfig_path("gpu-ledger").expect("kubeconfig"),
        )
        .env("POD_NAME", pod)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied());
    ChildGuard::spawn(pod, cmd, &dir.join(format!("{pod}.log"))).expect("spawn gpu-ledger serve")
}

async fn leader_metric(port: u16) -> Option<f64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metric_value(&text, "gpu_ledger_cull_leader", &[])
}

async fn lease_spec(leases: &Api<Lease>) -> Option<k8s_openapi::api::coordination::v1::LeaseSpec> {
    leases.get_opt("gpu-ledger").await.ok().flatten()?.spec
}

#[allow(clippy::too_many_lines)] // one scenario: a leads, skewed b watches, a leaves, b leads
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_clock_does_not_take_a_live_lease() {
    let cp = ControlPlane::shared(false).expect("shared tier A control plane");
    let admin = cp.client("admin").await.expect("admin client");
    grant_shipped_read_only(&admin).await;
    gpu_ledger_testkit::stack::apply_rbac(&admin, CULLING_RBAC, "gpu-ledger", "default")
        .await
        .expect("shipped culling RBAC");
    namespace(&admin, "skew", &[]).await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "default");
    let dir = tempfile::tempdir().expect("temp dir");
    let ports = gpu_ledger_testkit::util::free_ports(2).expect("ports");

    let mut a = spawn_serve(cp, dir.path(), ports[0], "skew-a", &[]);
    eventually("skew-a holds the Lease", WAIT, || async {
        let holder = lease_spec(&leases).await?.holder_identity?;
        (holder == "skew-a" && leader_metric(ports[0]).await? == 1.0).then_some(())
    })
    .await;
    let before = lease_spec(&leases).await.expect("lease");

    // b's clock runs 30 s ahead: by its wall clock a's renewTime + 15 s is always in the past.
    let mut b = spawn_serve(
        cp,
        dir.path(),
        ports[1],
        "skew-b",
        &[("GPU_LEDGER_TEST_LEASE_CLOCK_OFFSET", "30")],
    );
    eventually("skew-b serves", WAIT, || async {
        leader_metric(ports[1]).await.map(|_| ())
    })
    .await;
    // Longer than a lease duration (15 s) plus a round: b has had every chance to take over.
    let watching = Instant::now();
    while watching.elapsed() < Duration::from_secs(25) {
        let spec = lease_spec(&leases).await.expect("lease");
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some("skew-a"),
            "the skewed replica took a live Lease after {:?}; its log:\n{}",
            watching.elapsed(),
            b.log_tail(30)
        );
        assert_eq!(spec.lease_transitions, before.lease_transitions);
        assert_eq!(leader_metric(ports[1]).await, Some(0.0), "b follows");
        assert!(a.try_exit_status().is_none() && b.try_exit_status().is_none());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // a leaves (releasing the Lease): b is a working elector and takes over at once, writing
    // its skewed clock.
    a.terminate(Duration::from_secs(15));
    let spec = eventually("skew-b takes the released Lease", WAIT, || async {
        let spec = lease_spec(&leases).await?;
        (spec.holder_identity.as_deref() == Some("skew-b") && leader_metric(ports[1]).await? == 1.0)
            .then_some(spec)
    })
    .await;
    let renewed = spec.renew_time.expect("renewTime").0;
    let ahead = renewed.as_second() - Utc::now().timestamp();
    assert!(
        (20..=40).contains(&ahead),
        "b writes its clock, 30 s ahead: renewTime {renewed} is {ahead} s from now"
    );
    eprintln!("skewed clock: b followed for 25 s, then took over; renewTime {ahead} s ahead");
    b.terminate(Duration::from_secs(15));
    let log = b.log_tail(200);
    assert!(!log.contains("panicked"), "{log}");
}
