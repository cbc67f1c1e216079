//! Ledger unit tests with builder fixtures.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};

use super::claims::{
    Deletion, NodeInfo, NotebookInfo, OwnerRef, PodClaim, PodPhase, QuotaInfo, StatefulSetInfo,
};
use super::usage::{DeviceKey, DeviceUsage, Signal, Usage, Workload};
use super::*;

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

struct PodB(PodClaim);

impl PodB {
    fn new(ns: &str, name: &str) -> Self {
        PodB(
            PodClaim::new(ns, name)
                .with_uid(format!("uid-{name}"))
                .created(now() - Duration::hours(3)),
        )
    }
    fn on_node(mut self, n: &str) -> Self {
        self.0.node = Some(n.into());
        self.0.phase = PodPhase::Running;
        self.0.started_at = Some(now() - Duration::hours(2));
        self.0.ready_since = Some(now() - Duration::hours(2));
        self
    }
    fn with(mut self, resource: &str, units: u64) -> Self {
        self.0.resources.insert(resource.into(), units);
        self
    }
    fn gpu(self, units: u64) -> Self {
        self.with("nvidia.com/gpu", units)
    }
    fn deleted(mut self, ago: Duration, grace: i64) -> Self {
        let requested = now() - ago;
        self.0.deletion = Some(Deletion {
            deadline: requested + Duration::seconds(grace),
            grace_seconds: grace,
        });
        self
    }
    fn phase(mut self, phase: PodPhase) -> Self {
        self.0.phase = phase;
        self
    }
    fn owned_by_sts(mut self, name: &str, uid: &str) -> Self {
        self.0.controller = Some(OwnerRef {
            group: "apps".into(),
            kind: "StatefulSet".into(),
            name: name.into(),
            uid: uid.into(),
        });
        self
    }
    fn build(self) -> PodClaim {
        self.0
    }
}

fn node(name: &str, gpus: u64) -> NodeInfo {
    NodeInfo::new(name).allocating("nvidia.com/gpu", gpus)
}

struct DevB(DeviceUsage);

impl DevB {
    fn new(uuid: &str, host: &str) -> Self {
        DevB(DeviceUsage {
            key: DeviceKey {
                uuid: uuid.into(),
                gpu_instance: None,
            },
            hostname: Some(host.into()),
            exporter: None,
            instance: None,
            model: None,
            mig_profile: None,
            mig_uuid: None,
            workloads: Vec::new(),
            per_pod_utilization: Vec::new(),
            per_pod_memory_bytes: Vec::new(),
            per_pod_windows: Vec::new(),
            signal: Some(Signal::GrEngineActive),
            utilization: Some(0.0),
            peak: Some(0.0),
            coverage: 1.0,
            last_sample_at: Some(now() - Duration::seconds(10)),
            memory_used_bytes: Some(1024.0),
            last_active_at: None,
            covered_since: Some(now() - Duration::hours(24)),
        })
    }
    fn held_by(mut self, ns: &str, pod: &str) -> Self {
        self.0.workloads.push(Workload {
            namespace: ns.into(),
            pod: pod.into(),
        });
        self
    }
    fn util(mut self, now_v: f64, peak: f64) -> Self {
        self.0.utilization = Some(now_v);
        self.0.peak = Some(peak);
        self
    }
    fn coverage(mut self, c: f64) -> Self {
        self.0.coverage = c;
        self
    }
    fn unknown(mut self) -> Self {
        self.0.utilization = None;
        self.0.peak = None;
        self.0.coverage = 0.0;
        self
    }
    fn mig(mut self, gi: &str) -> Self {
        self.0.key.gpu_instance = Some(gi.into());
        self.0.mig_profile = Some("3g.40gb".into());
        self
    }
    fn active_at(mut self, t: DateTime<Utc>) -> Self {
        self.0.last_active_at = Some(t);
        self
    }
    fn build(self) -> DeviceUsage {
        self.0
    }
}

fn usage(devices: Vec<DeviceUsage>) -> Usage {
    Usage {
        hami: Vec::new(),
        devices,
        available: true,
        partial: false,
        gpu_health: Vec::new(),
    }
}

fn claims(pods: Vec<PodClaim>, nodes: Vec<NodeInfo>) -> Claims {
    Claims {
        pods: pods.into_iter().map(Into::into).collect(),
        nodes,
        ..Claims::default()
    }
}

fn pod<'a>(l: &'a Ledger, name: &str) -> &'a PodRow {
    l.pods.iter().find(|p| p.pod == name).expect("pod row")
}

#[test]
fn states_and_node_free_count_terminating_pods() {
    let c = claims(
        vec![
            PodB::new("a", "run").on_node("n1").gpu(1).build(),
            PodB::new("a", "term")
                .on_node("n1")
                .gpu(1)
                .deleted(Duration::minutes(20), 30)
                .build(),
            PodB::new("a", "wait").gpu(2).build(),
            PodB::new("a", "done")
                .on_node("n1")
                .gpu(1)
                .phase(PodPhase::Succeeded)
                .build(),
        ],
        vec![node("n1", 4)],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(
        l.pods.len(),
        3,
        "succeeded pods hold nothing and are not listed"
    );
    assert_eq!(pod(&l, "run").state, PodState::Running);
    let t = pod(&l, "term");
    assert_eq!(t.state, PodState::Terminating);
    assert_eq!(t.terminating_seconds, Some(1200.0));
    assert!(
        t.stuck,
        "20 min after request, 30 s grace, 5 min stuck-after"
    );
    let w = pod(&l, "wait");
    assert_eq!(w.state, PodState::Pending);
    assert_eq!(w.pending_seconds, Some(3.0 * 3600.0));
    assert_eq!(w.attribution, Attribution::None);
    assert_eq!(
        l.nodes,
        vec![NodeRow {
            node: "n1".into(),
            gpus_allocatable: 4.0,
            gpus_claimed: 2.0,
            gpus_free: Some(2.0),
            gpus_unschedulable: 0.0,
            model: None,
        }]
    );
    let ns = &l.namespaces[0];
    assert_eq!(
        (ns.gpus_claimed, ns.gpus_pending, ns.gpu_quota),
        (2.0, 2.0, None)
    );
}

/// A pod deleted before it was ever bound (a Pending pod of a removed Job or evicted Kueue
/// workload, still carrying a finalizer) holds nothing on any node and is no demand: it is not
/// listed, so it neither holds GPUs (the model-less `gpu_seconds_by_model{model="unknown"}` grew
/// for it) nor counts as pending.
#[test]
fn a_nodeless_terminating_pod_holds_nothing_and_is_no_demand() {
    let c = claims(
        vec![
            PodB::new("a", "run").on_node("n1").gpu(1).build(),
            PodB::new("a", "gone-before-bound")
                .gpu(2)
                .deleted(Duration::minutes(20), 30)
                .build(),
        ],
        vec![node("n1", 4)],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert!(
        l.pods.iter().all(|p| p.pod != "gone-before-bound"),
        "{:?}",
        l.pods.iter().map(|p| (&p.pod, p.state)).collect::<Vec<_>>()
    );
    assert!(
        l.pods
            .iter()
            .filter(|p| p.state.holds())
            .all(|p| p.node.is_some())
    );
    let ns = &l.namespaces[0];
    assert_eq!((ns.gpus_claimed, ns.gpus_pending), (1.0, 0.0));
}

#[test]
fn not_stuck_before_deadline_plus_slack() {
    let c = claims(
        vec![
            PodB::new("a", "t")
                .on_node("n1")
                .gpu(1)
                .deleted(Duration::seconds(60), 30)
                .build(),
        ],
        vec![node("n1", 1)],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert!(!pod(&l, "t").stuck);
}

#[test]
fn exclusive_idle_requires_full_fresh_coverage() {
    let c = claims(
        vec![
            PodB::new("a", "idle").on_node("n1").gpu(1).build(),
            PodB::new("a", "gappy").on_node("n1").gpu(1).build(),
            PodB::new("a", "busy").on_node("n1").gpu(1).build(),
            PodB::new("a", "nodata").on_node("n1").gpu(1).build(),
        ],
        vec![node("n1", 4)],
    );
    let u = usage(vec![
        DevB::new("GPU-1", "n1")
            .held_by("a", "idle")
            .active_at(now() - Duration::minutes(30))
            .build(),
        DevB::new("GPU-2", "n1")
            .held_by("a", "gappy")
            .coverage(0.5)
            .build(),
        DevB::new("GPU-3", "n1")
            .held_by("a", "busy")
            .util(0.9, 0.95)
            .build(),
        DevB::new("GPU-4", "n1")
            .held_by("a", "nodata")
            .unknown()
            .build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    let idle = pod(&l, "idle");
    assert_eq!(
        (idle.attribution, idle.idle, idle.utilization),
        (Attribution::Exclusive, Some(true), Some(0.0))
    );
    assert_eq!(
        idle.idle_seconds,
        Some(1800.0),
        "since last activity, after pod start"
    );
    assert_eq!(pod(&l, "gappy").idle, None, "partial coverage is unknown");
    assert_eq!(pod(&l, "busy").idle, Some(false));
    assert_eq!(pod(&l, "busy").idle_seconds, Some(0.0));
    let nodata = pod(&l, "nodata");
    assert_eq!(
        (nodata.idle, nodata.utilization),
        (None, None),
        "missing is unknown, never zero"
    );
    assert_eq!(l.namespaces[0].gpus_idle, 1.0);
}

#[test]
fn idle_seconds_bounded_by_pod_start() {
    let c = claims(
        vec![PodB::new("a", "p").on_node("n1").gpu(1).build()],
        vec![node("n1", 1)],
    );
    let u = usage(vec![DevB::new("GPU-1", "n1").held_by("a", "p").build()]);
    let l = build(&c, &u, now(), &Policy::default());
    assert_eq!(pod(&l, "p").idle_seconds, Some(2.0 * 3600.0));
}

#[test]
fn pod_without_series_is_unattributed_and_unknown() {
    let c = claims(
        vec![PodB::new("a", "p").on_node("n1").gpu(1).build()],
        vec![node("n1", 1)],
    );
    let u = usage(vec![DevB::new("GPU-1", "n1").util(0.7, 0.7).build()]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "p");
    assert_eq!(
        (p.attribution, p.idle, p.utilization),
        (Attribution::Unattributed, None, None)
    );
    assert!(
        l.unclaimed_busy.is_empty(),
        "the unattributed holder on n1 may own the busy device: {:?}",
        l.unclaimed_busy
    );
    // The same busy device on a node where every claim is accounted for is unclaimed.
    let c = claims(
        vec![PodB::new("a", "p").on_node("n1").gpu(1).build()],
        vec![node("n1", 1), node("n2", 1)],
    );
    let u = usage(vec![
        DevB::new("GPU-1", "n1").held_by("a", "p").build(),
        DevB::new("GPU-2", "n2").util(0.7, 0.7).build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    assert_eq!(l.unclaimed_busy.len(), 1, "{:?}", l.unclaimed_busy);
    assert_eq!(l.unclaimed_busy[0].uuid, "GPU-2");
    assert_eq!(l.unclaimed_busy[0].node.as_deref(), Some("n2"));
}

#[test]
fn two_gpu_pod_with_one_series_is_not_idle() {
    let c = claims(
        vec![PodB::new("a", "p").on_node("n1").gpu(2).build()],
        vec![node("n1", 2)],
    );
    let u = usage(vec![DevB::new("GPU-1", "n1").held_by("a", "p").build()]);
    let l = build(&c, &u, now(), &Policy::default());
    assert_eq!(pod(&l, "p").idle, None);
}

#[test]
fn mig_pods_use_instance_series_and_sevenths() {
    let c = claims(
        vec![
            PodB::new("a", "m")
                .on_node("n1")
                .with("nvidia.com/mig-3g.40gb", 1)
                .build(),
        ],
        vec![NodeInfo::new("n1").allocating("nvidia.com/mig-3g.40gb", 2)],
    );
    let u = usage(vec![
        DevB::new("GPU-m", "n1")
            .mig("2")
            .held_by("a", "m")
            .util(0.8, 0.9)
            .build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "m");
    assert_eq!(p.attribution, Attribution::Mig);
    assert!((p.gpus - 3.0 / 7.0).abs() < 1e-9);
    assert_eq!(p.utilization, Some(0.8));
    assert!((l.nodes[0].gpus_allocatable - 6.0 / 7.0).abs() < 1e-9);
}

#[test]
fn time_sliced_pods_are_shared_and_never_get_device_values() {
    let mut n = node("n1", 4);
    n.replicas = 4;
    let c = claims(
        vec![
            PodB::new("a", "s1").on_node("n1").gpu(1).build(),
            PodB::new("b", "s2").on_node("n1").gpu(1).build(),
        ],
        vec![n],
    );
    // Device busy, both pods pinned (virtual-GPU copies), no per-process series.
    let u = usage(vec![
        DevB::new("GPU-t", "n1")
            .held_by("a", "s1")
            .held_by("b", "s2")
            .util(0.6, 0.6)
            .build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    for name in ["s1", "s2"] {
        let p = pod(&l, name);
        assert_eq!(p.attribution, Attribution::Shared);
        assert_eq!(p.sharing, Sharing::TimeSliced);
        let json = serde_json::to_value(p).expect("a row serialises");
        assert_eq!(json["sharing"], serde_json::json!({"layer": "time-sliced"}));
        assert_eq!(p.utilization, None, "device-wide value is not the pod's");
        assert_eq!(p.idle, None);
        assert!((p.gpus - 0.25).abs() < 1e-9);
    }
    assert!((l.nodes[0].gpus_allocatable - 1.0).abs() < 1e-9);
    let whole = PodRow::new("a", "whole");
    let json = serde_json::to_value(&whole).expect("a row serialises");
    assert!(json.get("sharing").is_none(), "a card of its own: {json}");
    // With per-process series each sharer gets its own reading.
    let mut d = DevB::new("GPU-t", "n1")
        .held_by("a", "s1")
        .held_by("b", "s2")
        .util(0.6, 0.6)
        .build();
    d.per_pod_utilization = vec![
        (
            Workload {
                namespace: "a".into(),
                pod: "s1".into(),
            },
            0.58,
        ),
        (
            Workload {
                namespace: "b".into(),
                pod: "s2".into(),
            },
            0.0,
        ),
    ];
    let l = build(&c, &usage(vec![d]), now(), &Policy::default());
    assert_eq!(pod(&l, "s1").utilization, Some(0.58));
    assert_eq!(pod(&l, "s1").idle, Some(false));
    assert_eq!(pod(&l, "s2").utilization, Some(0.0));
    assert_eq!(
        pod(&l, "s2").idle,
        None,
        "a busy device proves nothing about a quiet sharer"
    );
}

#[test]
fn unpinned_sharer_idle_only_when_whole_node_idle() {
    let mut n = node("n1", 2);
    n.replicas = 2;
    let c = claims(
        vec![PodB::new("a", "s").on_node("n1").gpu(1).build()],
        vec![n],
    );
    let idle_node = usage(vec![
        DevB::new("GPU-1", "n1").build(),
        DevB::new("GPU-2", "n1").build(),
    ]);
    let l = build(&c, &idle_node, now(), &Policy::default());
    assert_eq!(
        (pod(&l, "s").attribution, pod(&l, "s").idle),
        (Attribution::Shared, Some(true))
    );
    let busy_node = usage(vec![
        DevB::new("GPU-1", "n1").build(),
        DevB::new("GPU-2", "n1").util(0.5, 0.5).build(),
    ]);
    let l = build(&c, &busy_node, now(), &Policy::default());
    assert_eq!(pod(&l, "s").idle, None);
    assert!(
        l.unclaimed_busy.is_empty(),
        "a GPU attributed to time-sliced sharers by node is claimed: {:?}",
        l.unclaimed_busy
    );
}

#[test]
fn source_down_makes_everything_unknown() {
    let c = claims(
        vec![PodB::new("a", "p").on_node("n1").gpu(1).build()],
        vec![node("n1", 1)],
    );
    let u = Usage {
        hami: Vec::new(),
        devices: vec![],
        available: false,
        partial: false,
        gpu_health: Vec::new(),
    };
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "p");
    assert_eq!(
        (p.idle, p.utilization, p.attribution),
        (None, None, Attribution::Unattributed)
    );
    assert!(!l.usage_available);
}

#[test]
fn quotas_and_notebooks() {
    let nb = NotebookInfo::new("a", "nb")
        .with_uid("nb-uid")
        .at_version("1");
    let mut c = claims(
        vec![
            PodB::new("a", "nb-0")
                .on_node("n1")
                .gpu(1)
                .owned_by_sts("nb", "sts-uid")
                .build(),
        ],
        vec![node("n1", 1)],
    );
    c.notebooks = vec![nb];
    c.notebooks_enabled = true;
    c.quotas = vec![QuotaInfo {
        namespace: "b".into(),
        name: "q".into(),
        gpu_hard: [("requests.nvidia.com/gpu".to_string(), 4)].into(),
        names_gpu: true,
        ..QuotaInfo::default()
    }];
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    let p = pod(&l, "nb-0");
    assert_eq!(p.notebook.as_deref(), Some("nb"));
    assert_eq!(
        p.evidence.owner.as_ref().map(|o| o.verified),
        Some(false),
        "unverified without StatefulSets"
    );
    c.statefulsets = vec![StatefulSetInfo {
        namespace: "a".into(),
        name: "nb".into(),
        uid: "sts-uid".into(),
        controller: Some(OwnerRef {
            group: "kubeflow.org".into(),
            kind: "Notebook".into(),
            name: "nb".into(),
            uid: "nb-uid".into(),
        }),
        selector: Some(super::claims::LabelSelector {
            match_labels: [("statefulset".to_string(), "nb".to_string())].into(),
            match_expressions: vec![],
        }),
    }];
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(
        pod(&l, "nb-0").evidence.owner,
        None,
        "a pod outside the StatefulSet's selector is not its pod"
    );
    std::sync::Arc::make_mut(&mut c.pods[0]).labels =
        [("statefulset".to_string(), "nb".to_string())].into();
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(
        pod(&l, "nb-0").evidence.owner.as_ref().map(|o| o.verified),
        Some(true)
    );
    // A StatefulSet owned by a different Notebook uid is not proof.
    c.statefulsets[0].controller.as_mut().expect("ctrl").uid = "other".into();
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(pod(&l, "nb-0").notebook, None);
    let names: Vec<_> = l
        .namespaces
        .iter()
        .map(|n| (n.namespace.as_str(), n.gpu_quota))
        .collect();
    assert_eq!(names, vec![("a", None), ("b", Some(4.0))]);
}

#[test]
fn a_pod_carrying_the_statefulsets_uid_is_not_the_notebooks_pod_unless_it_is_an_ordinal_pod() {
    // offline, a `scratch-pod` with the StatefulSet's uid in its ownerReference, idle, beside the
    // notebook's real pod `alice-nb-0`, busy: only `alice-nb-0` speaks for the notebook.
    let selector = super::claims::LabelSelector {
        match_labels: [("statefulset".to_string(), "alice-nb".to_string())].into(),
        match_expressions: vec![],
    };
    let labelled = |mut p: PodClaim| {
        p.labels = [("statefulset".to_string(), "alice-nb".to_string())].into();
        p
    };
    let mut c = claims(
        vec![
            labelled(
                PodB::new("team-ml", "alice-nb-0")
                    .on_node("n1")
                    .gpu(1)
                    .owned_by_sts("alice-nb", "sts-uid")
                    .build(),
            ),
            labelled(
                PodB::new("team-ml", "scratch-pod")
                    .on_node("n1")
                    .gpu(1)
                    .owned_by_sts("alice-nb", "sts-uid")
                    .build(),
            ),
            labelled(
                PodB::new("team-ml", "alice-nb-x")
                    .on_node("n1")
                    .gpu(1)
                    .owned_by_sts("alice-nb", "sts-uid")
                    .build(),
            ),
        ],
        vec![node("n1", 3)],
    );
    c.notebooks = vec![NotebookInfo::new("team-ml", "alice-nb").with_uid("nb-uid")];
    c.notebooks_enabled = true;
    c.statefulsets = vec![StatefulSetInfo {
        namespace: "team-ml".into(),
        name: "alice-nb".into(),
        uid: "sts-uid".into(),
        controller: Some(OwnerRef {
            group: "kubeflow.org".into(),
            kind: "Notebook".into(),
            name: "alice-nb".into(),
            uid: "nb-uid".into(),
        }),
        selector: Some(selector),
    }];
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(pod(&l, "alice-nb-0").notebook.as_deref(), Some("alice-nb"));
    assert_eq!(pod(&l, "scratch-pod").notebook, None);
    assert_eq!(pod(&l, "alice-nb-x").notebook, None, "not an ordinal");
    // Without StatefulSets (unverified) the name rule still holds.
    c.statefulsets.clear();
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(pod(&l, "scratch-pod").notebook, None);
    assert_eq!(pod(&l, "alice-nb-0").notebook.as_deref(), Some("alice-nb"));
}

#[test]
fn unknown_phase_is_never_idle() {
    let c = claims(
        vec![
            PodB::new("a", "lost")
                .on_node("n1")
                .gpu(1)
                .phase(PodPhase::Unknown)
                .build(),
        ],
        vec![node("n1", 1)],
    );
    let u = usage(vec![DevB::new("GPU-1", "n1").held_by("a", "lost").build()]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "lost");
    assert_eq!(
        (p.state, p.attribution),
        (PodState::Running, Attribution::Exclusive)
    );
    assert_eq!(p.idle, None, "a pod its node no longer reports is unknown");
}

mod dra;
mod kai_mps;
mod scope;

#[test]
fn a_partial_answer_proves_nothing_idle_but_busy_still_counts() {
    let c = claims(
        vec![
            PodB::new("a", "idle").on_node("n1").gpu(1).build(),
            PodB::new("a", "busy").on_node("n1").gpu(1).build(),
        ],
        vec![node("n1", 2)],
    );
    let mut u = usage(vec![
        DevB::new("GPU-1", "n1")
            .held_by("a", "idle")
            .active_at(now() - Duration::minutes(30))
            .build(),
        DevB::new("GPU-2", "n1")
            .held_by("a", "busy")
            .util(0.9, 0.95)
            .build(),
    ]);
    let complete = build(&c, &u, now(), &Policy::default());
    assert_eq!(pod(&complete, "idle").idle, Some(true), "complete: idle");
    u.partial = true;
    let l = build(&c, &u, now(), &Policy::default());
    let idle = pod(&l, "idle");
    assert_eq!(
        (idle.idle, idle.idle_seconds, idle.utilization),
        (None, None, Some(0.0)),
        "partial: unknown, the reading still shown"
    );
    assert_eq!(pod(&l, "busy").idle, Some(false), "busy evidence counts");
    assert_eq!(l.namespaces[0].gpus_idle, 0.0);
}

fn own(ns: &str, pod: &str, peak: f64) -> super::usage::OwnWindow {
    super::usage::OwnWindow {
        workload: Workload {
            namespace: ns.into(),
            pod: pod.into(),
        },
        peak: Some(peak),
        coverage: 1.0,
        last_sample_at: Some(now() - Duration::seconds(10)),
        last_active_at: (peak >= 0.05).then(|| now() - Duration::seconds(10)),
        covered_since: Some(now() - Duration::hours(1)),
    }
}

#[test]
fn a_per_process_sharer_is_proven_idle_while_its_neighbour_is_busy() {
    // dcgm-exporter's virtual GPUs with per-process GPU_UTIL (PR #594): the device is busy
    // (GR_ENGINE_ACTIVE repeats the device's 0.6 on both sharers), s1's own processes are busy,
    // s2's read 0 for the whole window: s2 is idle, and the busy device is no conflict.
    let mut n = node("n1", 4);
    n.replicas = 4;
    let c = claims(
        vec![
            PodB::new("a", "s1").on_node("n1").gpu(1).build(),
            PodB::new("b", "s2").on_node("n1").gpu(1).build(),
        ],
        vec![n],
    );
    let device = |windows: Vec<super::usage::OwnWindow>| {
        let mut d = DevB::new("GPU-t", "n1")
            .held_by("a", "s1")
            .held_by("b", "s2")
            .util(0.6, 0.6)
            .active_at(now() - Duration::seconds(10))
            .build();
        d.per_pod_utilization = windows
            .iter()
            .map(|o| (o.workload.clone(), o.peak.unwrap_or_default()))
            .collect();
        d.per_pod_windows = windows;
        d
    };
    let l = build(
        &c,
        &usage(vec![device(vec![
            own("a", "s1", 0.58),
            own("b", "s2", 0.0),
        ])]),
        now(),
        &Policy::default(),
    );
    assert_eq!(pod(&l, "s1").idle, Some(false));
    let s2 = pod(&l, "s2");
    assert_eq!(s2.attribution, Attribution::Shared);
    assert_eq!((s2.utilization, s2.idle), (Some(0.0), Some(true)));
    // Idle since the later of its start (2 h ago) and its own covered run (1 h): not the
    // device's last activity 10 s ago.
    assert!((s2.idle_seconds.expect("idle seconds") - 3600.0).abs() < 1.0);
    assert!(
        l.namespaces
            .iter()
            .any(|n| n.namespace == "b" && n.gpus_idle > 0.0)
    );
    // The device busy while no sharer's own processes are: activity nobody accounts for
    // (a process outside the pods, or NVML sampling nothing): unknown, never idle.
    let l = build(
        &c,
        &usage(vec![device(vec![own("a", "s1", 0.0), own("b", "s2", 0.0)])]),
        now(),
        &Policy::default(),
    );
    assert_eq!((pod(&l, "s1").idle, pod(&l, "s2").idle), (None, None));
    // Thin own coverage proves nothing either.
    let mut thin = own("b", "s2", 0.0);
    thin.coverage = 0.5;
    let l = build(
        &c,
        &usage(vec![device(vec![own("a", "s1", 0.58), thin])]),
        now(),
        &Policy::default(),
    );
    assert_eq!(pod(&l, "s2").idle, None);
}

#[test]
fn a_mig_gpus_parent_series_and_its_instances_are_one_piece_of_work() {
    let mig_node = NodeInfo {
        hami: crate::ledger::hami_inputs::HamiNode::default(),
        name: "n1".into(),
        allocatable: [("nvidia.com/mig-3g.40gb".to_string(), 2)].into(),
        replicas: 1,
        product: Some("NVIDIA-A100-SXM4-80GB".into()),
        gpu_labels: BTreeMap::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        ready: Some(true),
    };
    let c = claims(
        vec![
            PodB::new("a", "m")
                .on_node("n1")
                .with("nvidia.com/mig-3g.40gb", 1)
                .build(),
        ],
        vec![mig_node],
    );
    // The whole-GPU series (no GPU_I_ID) is busy with the pod's work on GI 1.
    let parent = DevB::new("GPU-m", "n1").util(0.4, 0.4).build();
    let gi1 = DevB::new("GPU-m", "n1")
        .mig("1")
        .held_by("a", "m")
        .util(0.8, 0.8)
        .build();
    let gi2 = DevB::new("GPU-m", "n1").mig("2").build();
    let l = build(
        &c,
        &usage(vec![parent.clone(), gi1.clone(), gi2.clone()]),
        now(),
        &Policy::default(),
    );
    assert_eq!(
        l.unclaimed_busy,
        vec![],
        "the parent is the claimed instance's work"
    );
    assert_eq!(pod(&l, "m").utilization, Some(0.8));
    // Busy work on an instance no pod holds: listed once, as the instance, not the parent too.
    let gi2_busy = DevB::new("GPU-m", "n1").mig("2").util(0.7, 0.7).build();
    let l = build(
        &c,
        &usage(vec![parent.clone(), gi1.clone(), gi2_busy]),
        now(),
        &Policy::default(),
    );
    let listed: Vec<(&str, Option<&str>)> = l
        .unclaimed_busy
        .iter()
        .map(|u| (u.uuid.as_str(), u.gpu_instance.as_deref()))
        .collect();
    assert_eq!(listed, vec![("GPU-m", Some("2"))]);
    // An exporter that names the pod on the parent too: the pod's work is counted once.
    let parent_named = DevB::new("GPU-m", "n1")
        .held_by("a", "m")
        .util(0.4, 0.4)
        .build();
    let l = build(
        &c,
        &usage(vec![parent_named, gi1, gi2]),
        now(),
        &Policy::default(),
    );
    let m = pod(&l, "m");
    assert_eq!(m.devices.len(), 1, "{:?}", m.devices);
    assert_eq!(m.utilization, Some(0.8));
}

#[test]
fn mig_slices_without_gfd_come_from_dcgm_model_or_the_profile_name() {
    // The device plugin without GFD: no product label, allocatable MIG resources only.
    let bare = |profiles: &[(&str, u64)]| NodeInfo {
        hami: crate::ledger::hami_inputs::HamiNode::default(),
        name: "n1".into(),
        allocatable: profiles
            .iter()
            .map(|(p, n)| (format!("nvidia.com/mig-{p}"), *n))
            .collect(),
        replicas: 1,
        product: None,
        gpu_labels: BTreeMap::new(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        ready: Some(true),
    };
    let a30_pods = || {
        vec![
            PodB::new("a", "half")
                .on_node("n1")
                .with("nvidia.com/mig-2g.12gb", 1)
                .build(),
        ]
    };
    let instance = |model: Option<&str>, profile: &str| {
        let mut d = DevB::new("GPU-a30", "n1").mig("1").build();
        d.model = model.map(str::to_string);
        d.mig_profile = Some(profile.into());
        d
    };
    // DCGM's modelName names the A30 (4 slices).
    let c = claims(a30_pods(), vec![bare(&[("2g.12gb", 1), ("1g.6gb", 2)])]);
    let l = build(
        &c,
        &usage(vec![instance(Some("NVIDIA A30"), "2g.12gb")]),
        now(),
        &Policy::default(),
    );
    assert!(
        (pod(&l, "half").gpus - 0.5).abs() < 1e-9,
        "{}",
        pod(&l, "half").gpus
    );
    assert!((l.nodes[0].gpus_allocatable - 1.0).abs() < 1e-9);
    // No modelName (early exporters): the A30-only profile names say 4 slices.
    let l = build(
        &c,
        &usage(vec![instance(None, "2g.12gb")]),
        now(),
        &Policy::default(),
    );
    assert!((pod(&l, "half").gpus - 0.5).abs() < 1e-9);
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert!((pod(&l, "half").gpus - 0.5).abs() < 1e-9);
    // An A100 profile on an A100 without GFD stays in sevenths; DCGM's model never overrides
    // GFD's product label.
    let c = claims(
        vec![
            PodB::new("a", "third")
                .on_node("n1")
                .with("nvidia.com/mig-3g.40gb", 1)
                .build(),
        ],
        vec![bare(&[("3g.40gb", 2)])],
    );
    let l = build(
        &c,
        &usage(vec![instance(Some("NVIDIA A100-SXM4-80GB"), "3g.40gb")]),
        now(),
        &Policy::default(),
    );
    assert!((pod(&l, "third").gpus - 3.0 / 7.0).abs() < 1e-9);
    let mut labelled = bare(&[("2g.12gb", 1)]);
    labelled.product = Some("NVIDIA-A100-SXM4-80GB".into());
    let c = claims(a30_pods(), vec![labelled]);
    let l = build(
        &c,
        &usage(vec![instance(Some("NVIDIA A30"), "2g.12gb")]),
        now(),
        &Policy::default(),
    );
    assert!((pod(&l, "half").gpus - 2.0 / 7.0).abs() < 1e-9);
}
