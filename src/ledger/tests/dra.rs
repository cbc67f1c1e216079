//! DRA accounting: claims, slices and classes joined with DCGM (pure; see `ledger::dra`).

use super::*;
use crate::ledger::claims::{
    DeviceClassInfo, DraAllocation, DraDevice, DraDeviceKind, DraDeviceStatus, DraRequest,
    ResourceClaimInfo,
};

const DRIVER: &str = "gpu.nvidia.com";

fn gpu_device(node: &str, name: &str, uuid: &str) -> DraDevice {
    DraDevice {
        driver: DRIVER.into(),
        pool: node.into(),
        name: name.into(),
        node: Some(node.into()),
        kind: DraDeviceKind::Gpu,
        uuid: Some(uuid.into()),
        parent_uuid: None,
        profile: None,
        product: Some("NVIDIA A100-SXM4-80GB".into()),
        pool_generation: 1,
        taints: Vec::new(),
    }
}

fn mig_device(
    node: &str,
    name: &str,
    uuid: &str,
    parent: &str,
    profile: &str,
    product: &str,
) -> DraDevice {
    DraDevice {
        kind: DraDeviceKind::Mig,
        uuid: Some(uuid.into()),
        parent_uuid: Some(parent.into()),
        profile: Some(profile.into()),
        product: Some(product.into()),
        ..gpu_device(node, name, uuid)
    }
}

/// A claim allocated `devices` (driver, pool, device) and reserved for `pods` (uids).
fn allocated(
    ns: &str,
    name: &str,
    devices: &[(&str, &str, &str)],
    pods: &[&str],
) -> ResourceClaimInfo {
    ResourceClaimInfo {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("claim-{name}"),
        requests: vec![],
        allocated: Some(
            devices
                .iter()
                .map(|(driver, pool, device)| DraAllocation {
                    request: "gpu".into(),
                    driver: (*driver).into(),
                    pool: (*pool).into(),
                    device: (*device).into(),
                })
                .collect(),
        ),
        reserved_for: pods.iter().map(|p| (*p).to_string()).collect(),
        device_status: vec![],
    }
}

fn pending_claim(
    ns: &str,
    name: &str,
    class: &str,
    count: u64,
    profile: Option<&str>,
) -> ResourceClaimInfo {
    ResourceClaimInfo {
        namespace: ns.into(),
        name: name.into(),
        uid: format!("claim-{name}"),
        requests: vec![DraRequest {
            name: "gpu".into(),
            device_class: class.into(),
            count,
            drivers: vec![],
            profile: profile.map(str::to_string),
            mig: false,
        }],
        allocated: None,
        reserved_for: vec![],
        device_status: vec![],
    }
}

fn nvidia_classes() -> Vec<DeviceClassInfo> {
    vec![
        DeviceClassInfo {
            name: "gpu.nvidia.com".into(),
            drivers: vec![DRIVER.into()],
            mig: false,
            ..DeviceClassInfo::default()
        },
        DeviceClassInfo {
            name: "mig.nvidia.com".into(),
            drivers: vec![DRIVER.into()],
            mig: true,
            ..DeviceClassInfo::default()
        },
        DeviceClassInfo {
            name: "nic.example.com".into(),
            drivers: vec!["dra.net".into()],
            mig: false,
            ..DeviceClassInfo::default()
        },
    ]
}

/// A pod (uid `uid-<name>`) using `claims`, no extended resources.
fn dra_pod(ns: &str, name: &str, claims: &[&str]) -> PodB {
    let mut p = PodB::new(ns, name);
    p.0.resource_claims = claims.iter().map(|c| (*c).to_string()).collect();
    p
}

fn node_without_plugin(name: &str) -> NodeInfo {
    NodeInfo::new(name)
}

fn dra_claims(
    pods: Vec<PodClaim>,
    nodes: Vec<NodeInfo>,
    rcs: Vec<ResourceClaimInfo>,
    devices: Vec<DraDevice>,
) -> Claims {
    Claims {
        pods: pods.into_iter().map(Into::into).collect(),
        nodes,
        resource_claims: rcs,
        dra_devices: devices,
        device_classes: nvidia_classes(),
        dra_enabled: true,
        ..Claims::default()
    }
}

fn node_row<'a>(l: &'a Ledger, name: &str) -> &'a NodeRow {
    l.nodes.iter().find(|n| n.node == name).expect("node row")
}

#[test]
fn an_exclusive_gpu_joins_dcgm_by_uuid() {
    let c = dra_claims(
        vec![
            dra_pod("a", "train", &["train-gpu-x7"])
                .on_node("n1")
                .build(),
        ],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "train-gpu-x7",
            &[(DRIVER, "n1", "gpu-0")],
            &["uid-train"],
        )],
        vec![
            gpu_device("n1", "gpu-0", "GPU-A"),
            gpu_device("n1", "gpu-1", "GPU-B"),
        ],
    );
    // No pod labels on the series (exporter without --kubernetes-enable-dra): the UUID joins.
    let u = usage(vec![
        DevB::new("GPU-A", "n1").util(0.5, 0.6).build(),
        DevB::new("GPU-B", "n1").build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "train");
    assert_eq!(p.state, PodState::Running);
    assert!((p.gpus - 1.0).abs() < 1e-9);
    assert_eq!(p.resources.get("dra:gpu.nvidia.com"), Some(&1));
    assert_eq!(
        p.gpus_by_resource,
        vec![("dra:gpu.nvidia.com".to_string(), 1.0)]
    );
    assert_eq!(p.attribution, Attribution::Exclusive);
    assert_eq!(p.utilization, Some(0.5));
    assert_eq!(p.idle, Some(false));
    assert_eq!(p.devices.len(), 1);
    assert_eq!(p.devices[0].uuid, "GPU-A");
    assert_eq!(
        (p.evidence.devices_found, p.evidence.devices_expected),
        (1, 1)
    );
    let n = node_row(&l, "n1");
    assert_eq!(
        (
            n.gpus_allocatable,
            n.gpus_claimed,
            n.gpus_free.unwrap_or(f64::NAN),
        ),
        (2.0, 1.0, 1.0)
    );
    assert_eq!(l.namespaces[0].gpus_claimed, 1.0);
    // The same input without DRA from the source (group not served): not a GPU pod.
    let mut off = c.clone();
    off.dra_enabled = false;
    assert!(build(&off, &u, now(), &Policy::default()).pods.is_empty());
}

#[test]
fn mig_devices_are_g_over_s_and_join_by_mig_uuid_only() {
    let c = dra_claims(
        vec![
            dra_pod("a", "big", &["big-mig"]).on_node("n1").build(),
            dra_pod("a", "small", &["small-mig"]).on_node("n2").build(),
        ],
        vec![node_without_plugin("n1"), node_without_plugin("n2")],
        vec![
            allocated(
                "a",
                "big-mig",
                &[(DRIVER, "n1", "gpu-0-mig-3g40gb-9-4")],
                &["uid-big"],
            ),
            allocated(
                "a",
                "small-mig",
                &[(DRIVER, "n2", "gpu-0-mig-1g6gb-14-0")],
                &["uid-small"],
            ),
        ],
        vec![
            mig_device(
                "n1",
                "gpu-0-mig-3g40gb-9-4",
                "MIG-1",
                "GPU-P",
                "3g.40gb",
                "NVIDIA A100-SXM4-80GB",
            ),
            mig_device(
                "n2",
                "gpu-0-mig-1g6gb-14-0",
                "MIG-2",
                "GPU-Q",
                "1g.6gb",
                "NVIDIA A30",
            ),
        ],
    );
    let mut inst = DevB::new("GPU-P", "n1").mig("2").util(0.3, 0.3).build();
    inst.mig_uuid = Some("MIG-1".into());
    // The A30's instance carries no dra_mig_device_uuid: it cannot be pinned.
    let other = DevB::new("GPU-Q", "n2").mig("7").build();
    let l = build(&c, &usage(vec![inst, other]), now(), &Policy::default());
    let big = pod(&l, "big");
    assert!((big.gpus - 3.0 / 7.0).abs() < 1e-9, "{}", big.gpus);
    assert_eq!(
        big.resources.get("dra:gpu.nvidia.com/mig-3g.40gb"),
        Some(&1)
    );
    assert_eq!(big.attribution, Attribution::Mig);
    assert_eq!(big.utilization, Some(0.3));
    let small = pod(&l, "small");
    assert!(
        (small.gpus - 0.25).abs() < 1e-9,
        "A30: 4 slices, {}",
        small.gpus
    );
    assert_eq!(small.attribution, Attribution::Unattributed);
    assert_eq!(small.idle, None, "never guessed");
    // Each node publishes one physical GPU (a MIG device folds into its parent).
    assert_eq!(node_row(&l, "n1").gpus_allocatable, 1.0);
    assert!((node_row(&l, "n1").gpus_free.expect("known") - 4.0 / 7.0).abs() < 1e-9);
}

#[test]
fn a_shared_claim_splits_its_device_among_its_pods() {
    let c = dra_claims(
        vec![
            dra_pod("a", "p1", &["shared-gpu"]).on_node("n1").build(),
            dra_pod("a", "p2", &["shared-gpu"]).on_node("n1").build(),
        ],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "shared-gpu",
            &[(DRIVER, "n1", "gpu-0")],
            &["uid-p1", "uid-p2"],
        )],
        vec![gpu_device("n1", "gpu-0", "GPU-S")],
    );
    // The real exporter writes one series per pod of the claim (kubernetes/website, feature gate
    // KubeletPodResourcesDynamicResources): both pods are named on the device.
    let u = usage(vec![
        DevB::new("GPU-S", "n1")
            .held_by("a", "p1")
            .held_by("a", "p2")
            .build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    for name in ["p1", "p2"] {
        let p = pod(&l, name);
        assert!((p.gpus - 0.5).abs() < 1e-9, "{name}: {}", p.gpus);
        assert_eq!(p.attribution, Attribution::Shared, "{name}");
        assert_eq!(
            p.utilization, None,
            "device-wide values are not the pod's own"
        );
    }
    // Without pod labels the split is still shared.
    let bare = usage(vec![DevB::new("GPU-S", "n1").build()]);
    let l2 = build(&c, &bare, now(), &Policy::default());
    assert_eq!(pod(&l2, "p1").attribution, Attribution::Shared);
    let n = node_row(&l, "n1");
    assert_eq!((n.gpus_allocatable, n.gpus_claimed), (1.0, 1.0));
}

#[test]
fn pending_pods_show_the_demand_of_their_unallocated_claims() {
    let c = dra_claims(
        vec![
            dra_pod("a", "wait", &["wait-gpu"]).build(),
            dra_pod("a", "wait-mig", &["wait-mig"]).build(),
            dra_pod("a", "wait-nic", &["wait-nic"]).build(),
            // A template claim not generated yet: unknown, not listed.
            dra_pod("a", "no-claim-yet", &["gone"]).build(),
        ],
        vec![node_without_plugin("n1")],
        vec![
            pending_claim("a", "wait-gpu", "gpu.nvidia.com", 2, None),
            pending_claim("a", "wait-mig", "mig.nvidia.com", 1, Some("1g.10gb")),
            pending_claim("a", "wait-nic", "nic.example.com", 1, None),
        ],
        vec![gpu_device("n1", "gpu-0", "GPU-A")],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(
        l.pods.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(),
        vec!["wait", "wait-mig"]
    );
    let w = pod(&l, "wait");
    assert_eq!(w.state, PodState::Pending);
    assert_eq!(w.attribution, Attribution::None);
    assert!((w.gpus - 2.0).abs() < 1e-9);
    assert_eq!(w.resources.get("dra:gpu.nvidia.com"), Some(&2));
    let m = pod(&l, "wait-mig");
    assert!((m.gpus - 1.0 / 7.0).abs() < 1e-9);
    assert_eq!(m.resources.get("dra:gpu.nvidia.com/mig-1g.10gb"), Some(&1));
    let ns = &l.namespaces[0];
    assert!((ns.gpus_pending - 15.0 / 7.0).abs() < 1e-9);
    assert_eq!(ns.gpus_claimed, 0.0);
    assert_eq!(node_row(&l, "n1").gpus_claimed, 0.0);
}

#[test]
fn a_claim_not_reserved_for_the_pod_gives_it_nothing() {
    let c = dra_claims(
        vec![
            dra_pod("a", "late", &["someone-elses"])
                .on_node("n1")
                .build(),
        ],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "someone-elses",
            &[(DRIVER, "n1", "gpu-0")],
            &["uid-other"],
        )],
        vec![gpu_device("n1", "gpu-0", "GPU-A")],
    );
    let u = usage(vec![DevB::new("GPU-A", "n1").util(0.9, 0.9).build()]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "late");
    assert_eq!(p.gpus, 0.0);
    assert!(p.devices.is_empty());
    assert_eq!(node_row(&l, "n1").gpus_claimed, 0.0);
    // Its device is held by no listed pod: busy outside any pod's claim.
    assert_eq!(l.unclaimed_busy.len(), 1);
}

#[test]
fn other_drivers_and_stale_pool_generations_are_ignored() {
    let mut old = gpu_device("n1", "gpu-9", "GPU-OLD");
    old.pool_generation = 0;
    let mut nic = gpu_device("n1", "eth1", "NIC-1");
    nic.driver = "dra.net".into();
    let c = dra_claims(
        vec![dra_pod("a", "net", &["net-claim"]).on_node("n1").build()],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "net-claim",
            &[("dra.net", "n1", "eth1")],
            &["uid-net"],
        )],
        vec![gpu_device("n1", "gpu-0", "GPU-A"), old, nic],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert!(l.pods.is_empty(), "a NIC claim is no GPU claim");
    assert_eq!(
        node_row(&l, "n1").gpus_allocatable,
        1.0,
        "generation 0 of pool n1 is stale; the NIC is no GPU"
    );
    // A configured second driver counts.
    let mut policy = Policy::default();
    policy.names.dra_drivers.push("dra.net".into());
    let l = build(&c, &usage(vec![]), now(), &policy);
    assert_eq!(pod(&l, "net").resources.get("dra:dra.net"), Some(&1));
}

#[test]
fn a_terminating_holder_still_holds_its_device() {
    let c = dra_claims(
        vec![
            dra_pod("a", "going", &["going-gpu"])
                .on_node("n1")
                .deleted(Duration::minutes(20), 30)
                .build(),
        ],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "going-gpu",
            &[(DRIVER, "n1", "gpu-0")],
            &["uid-going"],
        )],
        vec![gpu_device("n1", "gpu-0", "GPU-A")],
    );
    let u = usage(vec![DevB::new("GPU-A", "n1").build()]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "going");
    assert_eq!(p.state, PodState::Terminating);
    assert!(p.stuck);
    assert_eq!(p.gpus, 1.0);
    assert_eq!(node_row(&l, "n1").gpus_free, Some(0.0));
}

#[test]
fn each_device_counts_once_in_node_allocatable() {
    let mut n = node("n1", 2);
    n.gpu_labels
        .insert("nvidia.com/gpu.count".into(), "2".into());
    // The device plugin advertises both cards; the DRA driver publishes one of them too.
    let c = dra_claims(
        vec![PodB::new("a", "ext").on_node("n1").gpu(1).build()],
        vec![n],
        vec![allocated("a", "unused", &[(DRIVER, "n1", "gpu-1")], &[])],
        vec![gpu_device("n1", "gpu-1", "GPU-1")],
    );
    let u = usage(vec![
        DevB::new("GPU-0", "n1").held_by("a", "ext").build(),
        DevB::new("GPU-1", "n1").build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    assert_eq!(node_row(&l, "n1").gpus_allocatable, 2.0);
    // Disjoint: one card by the device plugin, the other by DRA (GFD counts both).
    let mut one = node("n1", 1);
    one.gpu_labels
        .insert("nvidia.com/gpu.count".into(), "2".into());
    let c = dra_claims(
        vec![],
        vec![one],
        vec![allocated("a", "x", &[(DRIVER, "n1", "gpu-1")], &[])],
        vec![gpu_device("n1", "gpu-1", "GPU-1")],
    );
    let l = build(&c, &u, now(), &Policy::default());
    let row = node_row(&l, "n1");
    assert_eq!((row.gpus_allocatable, row.gpus_unschedulable), (2.0, 0.0));
}

#[test]
fn the_claims_own_device_status_describes_a_device_its_slice_lost() {
    // A MIG device torn down from the slice after preparation: the driver's status data keeps
    // its identity (kubernetes-sigs/dra-driver-nvidia-gpu, `DeviceStatusData`).
    let mut rc = allocated(
        "a",
        "m",
        &[(DRIVER, "n1", "gpu-0-mig-1g10gb-19-0")],
        &["uid-m"],
    );
    rc.device_status.push(DraDeviceStatus {
        driver: DRIVER.into(),
        pool: "n1".into(),
        device: "gpu-0-mig-1g10gb-19-0".into(),
        kind: Some(DraDeviceKind::Mig),
        uuid: Some("MIG-9".into()),
        parent_uuid: Some("GPU-P".into()),
        profile: Some("1g.10gb".into()),
        product: Some("NVIDIA H100 80GB HBM3".into()),
    });
    let c = dra_claims(
        vec![dra_pod("a", "m", &["m"]).on_node("n1").build()],
        vec![node_without_plugin("n1")],
        vec![rc],
        vec![],
    );
    let mut inst = DevB::new("GPU-P", "n1").mig("13").build();
    inst.mig_uuid = Some("MIG-9".into());
    let l = build(&c, &usage(vec![inst]), now(), &Policy::default());
    let p = pod(&l, "m");
    assert!((p.gpus - 1.0 / 7.0).abs() < 1e-9);
    assert_eq!(p.attribution, Attribution::Mig);
    assert_eq!(p.idle, Some(true));
    // Described by nothing: one whole GPU, unattributed.
    let c = dra_claims(
        vec![dra_pod("a", "m", &["m"]).on_node("n1").build()],
        vec![node_without_plugin("n1")],
        vec![allocated("a", "m", &[(DRIVER, "n1", "gpu-7")], &["uid-m"])],
        vec![],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(pod(&l, "m").gpus, 1.0);
    assert_eq!(pod(&l, "m").attribution, Attribution::Unattributed);
}

#[test]
fn dra_held_devices_are_claimed_not_unclaimed_busy() {
    let c = dra_claims(
        vec![dra_pod("a", "busy", &["busy-gpu"]).on_node("n1").build()],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "busy-gpu",
            &[(DRIVER, "n1", "gpu-0")],
            &["uid-busy"],
        )],
        vec![
            gpu_device("n1", "gpu-0", "GPU-A"),
            gpu_device("n1", "gpu-1", "GPU-B"),
        ],
    );
    let u = usage(vec![
        DevB::new("GPU-A", "n1").util(0.9, 0.9).build(),
        DevB::new("GPU-B", "n1").util(0.8, 0.8).build(),
    ]);
    let l = build(&c, &u, now(), &Policy::default());
    assert_eq!(l.unclaimed_busy.len(), 1, "{:?}", l.unclaimed_busy);
    assert_eq!(l.unclaimed_busy[0].uuid, "GPU-B");
    // A device allocated to two claims (consumable capacity): half per claim.
    let c = dra_claims(
        vec![
            dra_pod("a", "x", &["cx"]).on_node("n1").build(),
            dra_pod("a", "y", &["cy"]).on_node("n1").build(),
        ],
        vec![node_without_plugin("n1")],
        vec![
            allocated("a", "cx", &[(DRIVER, "n1", "gpu-0")], &["uid-x"]),
            allocated("a", "cy", &[(DRIVER, "n1", "gpu-0")], &["uid-y"]),
        ],
        vec![gpu_device("n1", "gpu-0", "GPU-A")],
    );
    let l = build(&c, &u, now(), &Policy::default());
    assert_eq!(pod(&l, "x").gpus, 0.5);
    assert_eq!(pod(&l, "x").attribution, Attribution::Shared);
}

#[test]
fn network_attached_devices_count_for_the_pod_not_its_node() {
    let mut remote = gpu_device("fabric", "gpu-0", "GPU-R");
    remote.node = None;
    let c = dra_claims(
        vec![dra_pod("a", "r", &["rc"]).on_node("n1").build()],
        vec![node("n1", 1)],
        vec![allocated(
            "a",
            "rc",
            &[(DRIVER, "fabric", "gpu-0")],
            &["uid-r"],
        )],
        vec![remote],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    assert_eq!(pod(&l, "r").gpus, 1.0);
    assert_eq!(l.namespaces[0].gpus_claimed, 1.0);
    let n = node_row(&l, "n1");
    assert_eq!((n.gpus_allocatable, n.gpus_claimed), (1.0, 0.0));
}

/// Extended resources DRA serves (KEP-5004): the pod asks `nvidia.com/gpu`, the scheduler makes
/// `claim` and records the mapping (`status.extendedResourceClaimStatus`, as kube-scheduler
/// 1.36.3 wrote it in tests/e2e_dra.rs: tests/fixtures/dra/pods.json, pod `legacy`).
fn extended_pod(ns: &str, name: &str, claim: &str) -> PodB {
    use crate::ledger::claims::{ExtendedMapping, ExtendedResourceClaim};
    let mut p = dra_pod(ns, name, &[claim]).gpu(1);
    p.0.extended_claim = Some(ExtendedResourceClaim {
        claim: claim.into(),
        mappings: vec![ExtendedMapping {
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            request: "container-0-request-0".into(),
        }],
    });
    p
}

#[test]
fn an_extended_resource_served_by_dra_is_counted_once_through_its_claim() {
    // The pod both lists nvidia.com/gpu and holds the claim's device: one GPU, the device's.
    let c = dra_claims(
        vec![
            extended_pod("a", "legacy", "legacy-extended-resources-9zg6h")
                .on_node("n1")
                .build(),
        ],
        vec![node_without_plugin("n1")],
        vec![allocated(
            "a",
            "legacy-extended-resources-9zg6h",
            &[(DRIVER, "n1", "gpu-0")],
            &["uid-legacy"],
        )],
        vec![gpu_device("n1", "gpu-0", "GPU-A")],
    );
    let u = usage(vec![DevB::new("GPU-A", "n1").util(0.0, 0.0).build()]);
    let l = build(&c, &u, now(), &Policy::default());
    let p = pod(&l, "legacy");
    assert!((p.gpus - 1.0).abs() < 1e-9, "{p:?}");
    assert_eq!(
        p.resources,
        [("dra:gpu.nvidia.com".to_string(), 1)]
            .into_iter()
            .collect::<Resources>()
    );
    assert_eq!(p.attribution, Attribution::Exclusive);
    assert_eq!(
        p.devices
            .iter()
            .map(|d| d.uuid.as_str())
            .collect::<Vec<_>>(),
        ["GPU-A"]
    );
    assert_eq!(
        (p.evidence.devices_found, p.evidence.devices_expected),
        (1, 1)
    );
    assert_eq!(p.idle, Some(true), "{p:?}");
    let n = node_row(&l, "n1");
    assert_eq!(
        (n.gpus_allocatable, n.gpus_claimed, n.gpus_free),
        (1.0, 1.0, Some(0.0))
    );
    assert!((l.namespaces[0].gpus_claimed - 1.0).abs() < 1e-9);
}

#[test]
fn a_mapping_whose_claim_is_not_allocated_yet_is_demand_by_request() {
    // Between the scheduler creating its claim and allocating it (or before the claim reaches
    // the watch), the pod's request stands for the device: one GPU of demand, not two, not none.
    let waiting = |claims: Vec<ResourceClaimInfo>| {
        let c = dra_claims(
            vec![extended_pod("a", "p", "p-extended-resources-1").build()],
            vec![node_without_plugin("n1")],
            claims,
            vec![gpu_device("n1", "gpu-0", "GPU-A")],
        );
        let l = build(&c, &usage(vec![]), now(), &Policy::default());
        let p = pod(&l, "p").clone();
        (p, l.namespaces[0].gpus_pending)
    };
    for (case, claims) in [
        (
            "claim made, not allocated",
            vec![pending_claim(
                "a",
                "p-extended-resources-1",
                "gpu.nvidia.com",
                1,
                None,
            )],
        ),
        ("claim not seen yet", vec![]),
    ] {
        let (p, pending) = waiting(claims);
        assert_eq!(p.state, PodState::Pending, "{case}");
        assert!((p.gpus - 1.0).abs() < 1e-9, "{case}: {p:?}");
        assert_eq!(
            p.resources,
            [("nvidia.com/gpu".to_string(), 1)]
                .into_iter()
                .collect::<Resources>(),
            "{case}"
        );
        assert!((pending - 1.0).abs() < 1e-9, "{case}: {pending}");
    }
}

#[test]
fn a_device_class_implicit_name_is_demand_of_that_class() {
    // `deviceclass.resource.kubernetes.io/<class>`: a whole-GPU class's devices are GPUs; a
    // class of another driver is no GPU (the pod is not listed).
    let mut gpu = dra_pod("a", "implicit", &[]);
    gpu.0.class_requests.insert(
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com".into(),
        2,
    );
    let mut nic = dra_pod("a", "nic", &[]);
    nic.0.class_requests.insert(
        "deviceclass.resource.kubernetes.io/nic.example.com".into(),
        1,
    );
    let c = dra_claims(
        vec![gpu.build(), nic.build()],
        vec![node_without_plugin("n1")],
        vec![],
        vec![gpu_device("n1", "gpu-0", "GPU-A")],
    );
    let l = build(&c, &usage(vec![]), now(), &Policy::default());
    let p = pod(&l, "implicit");
    assert!((p.gpus - 2.0).abs() < 1e-9, "{p:?}");
    assert_eq!(
        p.resources,
        [(
            "deviceclass.resource.kubernetes.io/gpu.nvidia.com".to_string(),
            2,
        )]
        .into_iter()
        .collect::<Resources>()
    );
    assert!(l.pods.iter().all(|p| p.pod != "nic"), "{:?}", l.pods);
}
