//! The sick-card rule through `ledger::build`: taints, the kubelet's verdict and DCGM's.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};

use crate::ledger::claims::{
    Claims, DeviceTaint, DeviceTaintEffect, DraAllocation, DraDevice, DraDeviceKind, NodeInfo,
    PodClaim, ResourceClaimInfo, UnhealthyResource,
};
use crate::ledger::usage::{DcgmHealth, DeviceKey, DeviceUsage, Signal, Usage, Workload};
use crate::ledger::{Ledger, Policy, build};

const DRIVER: &str = "gpu.nvidia.com";
const UUID: &str = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c";

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-07-22T04:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

fn node(name: &str, gpus: u64) -> NodeInfo {
    NodeInfo::new(name).allocating("nvidia.com/gpu", gpus)
}

fn taint(key: &str, value: &str, effect: DeviceTaintEffect) -> DeviceTaint {
    DeviceTaint {
        key: key.into(),
        value: value.into(),
        effect,
        time_added: Some(now() - Duration::hours(1)),
    }
}

fn slice_device(taints: Vec<DeviceTaint>, generation: i64) -> DraDevice {
    DraDevice {
        driver: DRIVER.into(),
        pool: "gpu-node-1".into(),
        name: "gpu-0".into(),
        node: Some("gpu-node-1".into()),
        kind: DraDeviceKind::Gpu,
        uuid: Some(UUID.into()),
        parent_uuid: None,
        profile: None,
        product: None,
        pool_generation: generation,
        taints,
    }
}

/// A running pod `trainer-0` holding `gpu-0` through claim `trainer-gpu`, on a node whose slice
/// publishes `devices`.
fn dra_cluster(devices: Vec<DraDevice>, pod: PodClaim) -> Claims {
    Claims {
        pods: vec![Arc::new(pod)],
        dra_devices: devices,
        resource_claims: vec![ResourceClaimInfo {
            namespace: "team-a".into(),
            name: "trainer-gpu".into(),
            uid: "claim-uid".into(),
            allocated: Some(vec![DraAllocation {
                request: "gpu".into(),
                driver: DRIVER.into(),
                pool: "gpu-node-1".into(),
                device: "gpu-0".into(),
            }]),
            reserved_for: vec!["uid-trainer-0".into()],
            ..ResourceClaimInfo::default()
        }],
        dra_enabled: true,
        ..Claims::default()
    }
}

fn trainer() -> PodClaim {
    let mut p = PodClaim::new("team-a", "trainer-0")
        .with_uid("uid-trainer-0")
        .running_on("gpu-node-1");
    p.resource_claims = vec!["trainer-gpu".into()];
    p
}

fn health_of(l: &Ledger, pod: &str) -> Option<(String, Option<String>)> {
    let row = l.pods.iter().find(|p| p.pod == pod).expect("pod listed");
    row.gpu_health
        .as_ref()
        .map(|h| (h.reason.clone(), h.device.clone()))
}

#[test]
fn a_fatal_xid_taint_names_the_holder_and_a_none_effect_does_not() {
    let fatal = dra_cluster(
        vec![slice_device(
            vec![taint(
                "gpu.nvidia.com/xid",
                "79",
                DeviceTaintEffect::NoSchedule,
            )],
            1,
        )],
        trainer(),
    );
    let l = build(&fatal, &Usage::default(), now(), &Policy::default());
    assert_eq!(
        health_of(&l, "trainer-0"),
        Some(("xid:79".into(), Some(UUID.into())))
    );
    let since = l.pods[0].gpu_health.as_ref().and_then(|h| h.since);
    assert_eq!(since, Some(now() - Duration::hours(1)));

    // The driver's non-fatal XIDs and unmonitored devices carry effect None: informational.
    let informational = dra_cluster(
        vec![slice_device(
            vec![
                taint("gpu.nvidia.com/xid", "43", DeviceTaintEffect::None),
                taint("gpu.nvidia.com/unmonitored", "", DeviceTaintEffect::None),
            ],
            1,
        )],
        trainer(),
    );
    let l = build(&informational, &Usage::default(), now(), &Policy::default());
    assert_eq!(health_of(&l, "trainer-0"), None);
}

#[test]
fn a_lost_gpu_outranks_an_xid_and_only_the_current_pool_generation_counts() {
    let both = dra_cluster(
        vec![slice_device(
            vec![
                taint("gpu.nvidia.com/xid", "79", DeviceTaintEffect::NoSchedule),
                taint("gpu.nvidia.com/gpu-lost", "", DeviceTaintEffect::NoExecute),
            ],
            1,
        )],
        trainer(),
    );
    let l = build(&both, &Usage::default(), now(), &Policy::default());
    assert_eq!(
        health_of(&l, "trainer-0").map(|h| h.0).as_deref(),
        Some("gpu-lost")
    );
    // Generation 2 republished the device without the taint (the plugin restarted).
    let healed = dra_cluster(
        vec![
            slice_device(
                vec![taint(
                    "gpu.nvidia.com/xid",
                    "79",
                    DeviceTaintEffect::NoSchedule,
                )],
                1,
            ),
            slice_device(Vec::new(), 2),
        ],
        trainer(),
    );
    let l = build(&healed, &Usage::default(), now(), &Policy::default());
    assert_eq!(health_of(&l, "trainer-0"), None);
}

#[test]
fn another_pods_tainted_device_and_a_pending_pod_are_not_sick() {
    let tainted = vec![slice_device(
        vec![taint(
            "gpu.nvidia.com/xid",
            "79",
            DeviceTaintEffect::NoSchedule,
        )],
        1,
    )];
    // Not reserved for this pod: the claim's device is someone else's.
    let mut other = trainer().with_uid("uid-someone-else");
    other.name = "other-0".into();
    let l = build(
        &dra_cluster(tainted.clone(), other),
        &Usage::default(),
        now(),
        &Policy::default(),
    );
    assert!(
        l.pods.iter().all(|p| p.gpu_health.is_none()),
        "{:?}",
        l.pods
    );
    let mut pending = trainer();
    pending.node = None;
    pending.phase = crate::ledger::claims::PodPhase::Pending;
    let l = build(
        &dra_cluster(tainted, pending),
        &Usage::default(),
        now(),
        &Policy::default(),
    );
    assert!(
        l.pods.iter().all(|p| p.gpu_health.is_none()),
        "{:?}",
        l.pods
    );
}

#[test]
fn the_kubelets_unhealthy_verdict_names_its_message() {
    let mut p = PodClaim::new("team-b", "nb-0")
        .with_uid("uid-nb-0")
        .running_on("gpu-node-2")
        .claiming("nvidia.com/gpu", 1);
    p.unhealthy_devices = vec![UnhealthyResource {
        name: "nvidia.com/gpu".into(),
        resource_id: UUID.into(),
        message: "critical XID 79 reported by NVML".into(),
    }];
    let claims = Claims {
        pods: vec![Arc::new(p)],
        nodes: vec![node("gpu-node-2", 1)],
        ..Claims::default()
    };
    let l = build(&claims, &Usage::default(), now(), &Policy::default());
    assert_eq!(
        health_of(&l, "nb-0"),
        Some((
            "kubelet:critical XID 79 reported by NVML".into(),
            Some(UUID.into())
        ))
    );
}

fn device(uuid: &str, ns: &str, pod: &str) -> DeviceUsage {
    DeviceUsage {
        key: DeviceKey {
            uuid: uuid.into(),
            gpu_instance: None,
        },
        hostname: Some("gpu-node-2".into()),
        exporter: None,
        instance: None,
        model: None,
        mig_profile: None,
        mig_uuid: None,
        workloads: vec![Workload {
            namespace: ns.into(),
            pod: pod.into(),
        }],
        per_pod_utilization: Vec::new(),
        per_pod_memory_bytes: Vec::new(),
        per_pod_windows: Vec::new(),
        signal: Some(Signal::GrEngineActive),
        utilization: Some(0.5),
        peak: Some(0.5),
        coverage: 1.0,
        last_sample_at: Some(now() - Duration::seconds(10)),
        memory_used_bytes: None,
        last_active_at: Some(now()),
        covered_since: Some(now() - Duration::hours(1)),
    }
}

/// `nb-0` holds `UUID` (attributed by DCGM's pod labels) on `gpu-node-2`.
fn dcgm_cluster(health: DcgmHealth) -> (Claims, Usage) {
    let p = PodClaim::new("team-b", "nb-0")
        .with_uid("uid-nb-0")
        .running_on("gpu-node-2")
        .claiming("nvidia.com/gpu", 1);
    let claims = Claims {
        pods: vec![Arc::new(p)],
        nodes: vec![node("gpu-node-2", 1)],
        ..Claims::default()
    };
    let usage = Usage {
        devices: vec![device(UUID, "team-b", "nb-0")],
        available: true,
        partial: false,
        gpu_health: vec![health],
        hami: Vec::new(),
    };
    (claims, usage)
}

/// Watches and their values, XID codes, and the reason expected.
type DcgmCase = (Vec<(&'static str, f64)>, Vec<u32>, Option<&'static str>);

#[test]
fn dcgm_fail_and_fatal_xids_are_sick_warn_and_non_fatal_xids_are_not() {
    let cases: [DcgmCase; 5] = [
        (
            vec![("THERMAL", 20.0), ("POWER", 0.0)],
            vec![],
            Some("dcgm:THERMAL"),
        ),
        (vec![("THERMAL", 10.0)], vec![], None),
        (vec![], vec![13, 31, 43, 45, 68, 109], None),
        (vec![], vec![43, 79], Some("xid:79")),
        // A failing watch says more than an XID code.
        (vec![("PCIE", 20.0)], vec![48], Some("dcgm:PCIE")),
    ];
    for (watches, xids, want) in cases {
        let (claims, usage) = dcgm_cluster(DcgmHealth {
            uuid: UUID.into(),
            watches: watches
                .iter()
                .map(|(w, v)| ((*w).to_string(), *v))
                .collect(),
            xids: xids.clone(),
        });
        let l = build(&claims, &usage, now(), &Policy::default());
        assert_eq!(
            health_of(&l, "nb-0").map(|h| h.0).as_deref(),
            want,
            "{watches:?} {xids:?}"
        );
    }
    // Another card's failure is not this pod's.
    let (claims, usage) = dcgm_cluster(DcgmHealth {
        uuid: "GPU-other".into(),
        watches: vec![("ALL".into(), 20.0)],
        xids: vec![79],
    });
    let l = build(&claims, &usage, now(), &Policy::default());
    assert_eq!(health_of(&l, "nb-0"), None);
}

#[test]
fn reasons_are_bounded_label_values() {
    let mut p = PodClaim::new("team-b", "nb-0")
        .with_uid("uid-nb-0")
        .running_on("gpu-node-2")
        .claiming("nvidia.com/gpu", 1);
    p.unhealthy_devices = vec![UnhealthyResource {
        name: "nvidia.com/gpu".into(),
        resource_id: UUID.into(),
        message: "é".repeat(1000),
    }];
    let claims = Claims {
        pods: vec![Arc::new(p)],
        nodes: vec![node("gpu-node-2", 1)],
        ..Claims::default()
    };
    let l = build(&claims, &Usage::default(), now(), &Policy::default());
    let reason = health_of(&l, "nb-0").expect("sick").0;
    assert!(
        reason.len() <= crate::ledger::claims::MAX_HEALTH_TEXT,
        "{}",
        reason.len()
    );
    assert!(reason.starts_with("kubelet:é"));
}

#[test]
fn a_card_hamis_register_marks_unhealthy_names_its_vgpu_holders() {
    use crate::ledger::hami_inputs::{HamiAlloc, HamiDevice, HamiNode, HamiPod};
    let card = |uuid: &str, healthy| HamiDevice {
        uuid: uuid.into(),
        split: 10,
        mem_mib: 32768,
        cores: 100,
        model: "NVIDIA-Tesla V100-PCIE-32GB".into(),
        healthy,
    };
    let mut n = node("gpu-node-1", 10);
    n.hami = HamiNode {
        devices: vec![card(UUID, false), card("GPU-healthy", true)],
        error: None,
    };
    let vgpu = |name: &str, uuid: &str| {
        let mut p = trainer();
        p.name = name.into();
        p.uid = format!("uid-{name}");
        p.resource_claims.clear();
        p.resources = [("nvidia.com/gpu".to_string(), 1)].into_iter().collect();
        p.hami = HamiPod {
            allocs: vec![HamiAlloc {
                container: 0,
                uuid: uuid.into(),
                mem_mib: 8192,
                cores: 25,
            }],
            error: None,
        };
        Arc::new(p)
    };
    let claims = Claims {
        pods: vec![vgpu("on-sick", UUID), vgpu("on-fine", "GPU-healthy")],
        nodes: vec![n],
        ..Claims::default()
    };
    let l = build(&claims, &Usage::default(), now(), &Policy::default());
    assert_eq!(
        health_of(&l, "on-sick"),
        Some(("hami-unhealthy".to_string(), Some(UUID.to_string())))
    );
    assert_eq!(health_of(&l, "on-fine"), None);
}
