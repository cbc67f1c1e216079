//! The HAMi rule: one card, four quarter-claims; shares by cores, memory, split; idleness only
//! from a sharer's own monitor series.

use chrono::{DateTime, Duration, Utc};

use super::*;
use crate::ledger::claims::{Claims, NodeInfo, PodClaim};

use crate::ledger::usage::{DeviceUsage, Signal};
use crate::ledger::{PodRow, build};

const CARD: &str = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec";

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

/// A one-card HAMi node: the device plugin advertises card × split = 10 `nvidia.com/gpu`.
fn hami_node() -> NodeInfo {
    NodeInfo {
        hami: HamiNode {
            devices: vec![HamiDevice {
                uuid: CARD.into(),
                split: 10,
                mem_mib: 32768,
                cores: 100,
                model: "NVIDIA-Tesla V100-PCIE-32GB".into(),
                healthy: true,
            }],
            error: None,
        },
        ..NodeInfo::new("gpu-1").allocating("nvidia.com/gpu", 10)
    }
}

fn sharer(name: &str, allocs: &[(usize, u64, u32)]) -> PodClaim {
    let mut p = PodClaim::new("team-a", name)
        .running_on("gpu-1")
        .claiming("nvidia.com/gpu", 1)
        .created(now() - Duration::hours(3));
    p.hami.allocs = allocs
        .iter()
        .map(|&(container, mem_mib, cores)| HamiAlloc {
            container,
            uuid: CARD.into(),
            mem_mib,
            cores,
        })
        .collect();
    p
}

fn claims(pods: Vec<PodClaim>) -> Claims {
    Claims {
        pods: pods.into_iter().map(std::sync::Arc::new).collect(),
        nodes: vec![hami_node()],
        ..Claims::default()
    }
}

/// A container's own readings, idle for hours (util 0 over the whole window, last kernel 2 h ago).
fn own(pod: &str) -> HamiContainerUsage {
    HamiContainerUsage {
        workload: Workload {
            namespace: "team-a".into(),
            pod: pod.into(),
        },
        container: "main".into(),
        uuid: CARD.into(),
        peak: Some(0.0),
        utilization: Some(0.0),
        over_100: false,
        coverage: 1.0,
        last_sample_at: Some(now() - Duration::seconds(10)),
        last_active_at: None,
        last_kernel: Some((now() - Duration::seconds(10), 7200.0)),
        kernel_in_window: Some(false),
        memory_used_bytes: Some(1e9),
    }
}

fn busy(pod: &str) -> HamiContainerUsage {
    HamiContainerUsage {
        peak: Some(0.8),
        utilization: Some(0.7),
        last_kernel: Some((now() - Duration::seconds(10), 0.5)),
        kernel_in_window: Some(true),
        ..own(pod)
    }
}

/// The card's DCGM series: no pod labels (HAMi#112), busy (its three busy sharers).
fn dcgm_card() -> DeviceUsage {
    DeviceUsage {
        key: DeviceKey {
            uuid: CARD.into(),
            gpu_instance: None,
        },
        hostname: Some("gpu-1".into()),
        exporter: None,
        instance: None,
        model: None,
        mig_profile: None,
        mig_uuid: None,
        workloads: Vec::new(),
        per_pod_utilization: Vec::new(),
        per_pod_memory_bytes: Vec::new(),
        per_pod_windows: Vec::new(),
        signal: Some(Signal::GpuUtil),
        utilization: Some(0.9),
        peak: Some(0.9),
        coverage: 1.0,
        last_sample_at: Some(now() - Duration::seconds(10)),
        memory_used_bytes: None,
        last_active_at: Some(now()),
        covered_since: Some(now() - Duration::hours(24)),
    }
}

fn usage(hami: Vec<HamiContainerUsage>) -> Usage {
    Usage {
        devices: vec![dcgm_card()],
        available: true,
        partial: false,
        hami,
        gpu_health: Vec::new(),
    }
}

fn row<'a>(rows: &'a [PodRow], pod: &str) -> &'a PodRow {
    rows.iter().find(|r| r.pod == pod).expect("row")
}

#[test]
fn one_card_and_four_vgpu_pods_read_as_one_gpu_with_four_quarter_claims() {
    let pods: Vec<PodClaim> = (0..4)
        .map(|i| sharer(&format!("vgpu-{i}"), &[(0, 8192, 25)]))
        .collect();
    let l = build(
        &claims(pods),
        &usage(vec![
            own("vgpu-0"),
            busy("vgpu-1"),
            busy("vgpu-2"),
            busy("vgpu-3"),
        ]),
        now(),
        &Policy::default(),
    );
    assert_eq!(l.nodes.len(), 1);
    assert!(
        (l.nodes[0].gpus_allocatable - 1.0).abs() < 1e-9,
        "{:?}",
        l.nodes[0]
    );
    assert!(
        (l.nodes[0].gpus_claimed - 1.0).abs() < 1e-9,
        "{:?}",
        l.nodes[0]
    );
    assert_eq!(l.nodes[0].gpus_free, Some(0.0));
    for p in &l.pods {
        assert!((p.gpus - 0.25).abs() < 1e-9, "{p:?}");
        assert_eq!(p.attribution, Attribution::Shared);
        assert_eq!(p.sharing.as_str(), "hami");
        assert_eq!(
            p.gpus_by_resource,
            vec![("nvidia.com/gpu".to_string(), 0.25)]
        );
    }
    let idle = row(&l.pods, "vgpu-0");
    assert_eq!(idle.idle, Some(true), "own series idle: {idle:?}");
    // Idle since its last kernel, two hours ago (the card itself is busy: not its evidence).
    assert!((idle.idle_seconds.expect("seconds") - 7210.0).abs() < 1.0);
    assert_eq!(row(&l.pods, "vgpu-1").idle, Some(false));
    assert!((row(&l.pods, "vgpu-1").utilization.expect("own") - 0.7).abs() < 1e-9);
    // The busy card is the sharers', joined by UUID: not unclaimed busy.
    assert!(l.unclaimed_busy.is_empty(), "{:?}", l.unclaimed_busy);
    let json = serde_json::to_value(idle).expect("json");
    assert_eq!(json["sharing"]["layer"], "hami");
    assert_eq!(json["sharing"]["devices"][0]["cores"], 25);
    assert_eq!(json["sharing"]["devices"][0]["memory_mib"], 8192);
}

#[test]
fn shares_follow_cores_then_memory_then_split_capped_at_one_card() {
    let node = hami_node().hami;
    let pod = |allocs: &[(usize, u64, u32)]| HamiPod {
        allocs: allocs
            .iter()
            .map(|&(container, mem_mib, cores)| HamiAlloc {
                container,
                uuid: CARD.into(),
                mem_mib,
                cores,
            })
            .collect(),
        error: None,
    };
    let share = |p: &HamiPod| shares(p, Some(&node)).expect("readable")[0].share;
    assert!(
        (share(&pod(&[(0, 8192, 25)])) - 0.25).abs() < 1e-9,
        "cores win"
    );
    // protocol.md's example: cores unset, 3000 + 5000 MiB of 32768.
    assert!((share(&pod(&[(0, 3000, 0), (1, 5000, 0)])) - 8000.0 / 32768.0).abs() < 1e-9);
    assert!((share(&pod(&[(0, 0, 0)])) - 0.1).abs() < 1e-9, "1 / split");
    assert!(
        (share(&pod(&[(0, 0, 80), (1, 0, 80)])) - 1.0).abs() < 1e-9,
        "capped"
    );
    // Memory share without the card in the register: unknown, never guessed.
    assert!(shares(&pod(&[(0, 3000, 0)]), None).is_err());
    assert!(
        shares(&pod(&[(0, 0, 30)]), None).is_ok(),
        "cores need no register"
    );
}

#[test]
fn absent_or_short_own_series_prove_nothing() {
    let pods = vec![sharer("quiet", &[(0, 8192, 25)])];
    // No series at all (the container never touched the GPU, HAMi#1794): unknown.
    let l = build(
        &claims(pods.clone()),
        &usage(vec![]),
        now(),
        &Policy::default(),
    );
    assert_eq!(l.pods[0].idle, None);
    assert_eq!(l.pods[0].attribution, Attribution::Unattributed);
    // Utilisation 0 but no last-kernel reading: unknown.
    let no_kernel = HamiContainerUsage {
        last_kernel: None,
        kernel_in_window: None,
        ..own("quiet")
    };
    let l = build(
        &claims(pods.clone()),
        &usage(vec![no_kernel]),
        now(),
        &Policy::default(),
    );
    assert_eq!(l.pods[0].idle, None);
    // Half the window covered: unknown.
    let short = HamiContainerUsage {
        coverage: 0.5,
        ..own("quiet")
    };
    let l = build(
        &claims(pods.clone()),
        &usage(vec![short]),
        now(),
        &Policy::default(),
    );
    assert_eq!(l.pods[0].idle, None);
    // Two containers on the card, one series: unknown.
    let two = vec![sharer("quiet", &[(0, 4096, 10), (1, 4096, 10)])];
    let l = build(
        &claims(two),
        &usage(vec![own("quiet")]),
        now(),
        &Policy::default(),
    );
    assert_eq!(l.pods[0].idle, None);
    // A partial answer proves nothing idle.
    let mut u = usage(vec![own("quiet")]);
    u.partial = true;
    let l = build(&claims(pods), &u, now(), &Policy::default());
    assert_eq!(l.pods[0].idle, None);
}

#[test]
fn pending_and_unreadable_pods_count_by_request_with_the_reason() {
    let mut pending = PodClaim::new("team-a", "waiting").claiming("nvidia.com/gpu", 1);
    pending.hami.allocs = sharer("x", &[(0, 8192, 25)]).hami.allocs;
    let mut junk = sharer("junk", &[]);
    junk.hami.error = Some("hami.io/vgpu-devices-allocated unreadable: x".into());
    let l = build(
        &claims(vec![pending, junk]),
        &usage(vec![]),
        now(),
        &Policy::default(),
    );
    let waiting = row(&l.pods, "waiting");
    assert!((waiting.gpus - 1.0).abs() < 1e-9, "demand by request");
    assert_eq!(waiting.sharing, Sharing::Exclusive);
    let junk = row(&l.pods, "junk");
    assert!((junk.gpus - 1.0).abs() < 1e-9, "{junk:?}");
    assert!(
        matches!(&junk.sharing, Sharing::HamiUnreadable { reason } if reason.contains("unreadable")),
        "{:?}",
        junk.sharing
    );
}
