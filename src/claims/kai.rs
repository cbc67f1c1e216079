//! KAI-Scheduler's GPU-sharing labels and annotations on a pod, read and bounded (pure).
//!
//! Keys as KAI writes and reads them (kai-scheduler/KAI-Scheduler: `docs/gpu-sharing/README.md`,
//! `pkg/binder/binding/resourcereservation/resource_reservation.go`, the `constants` package): a
//! user asks with `gpu-fraction` or `gpu-memory` (MiB), optionally `gpu-fraction-num-devices` and
//! `gpu-fraction-container-name`; the binder labels it `runai-gpu-group: <g>` (one card) or
//! `runai-gpu-group/<g>: <g>` per card; the reservation pod carries the group label and
//! `run.ai/reserve_for_gpu_index: <GPU UUID>`. Values are untrusted (anyone who can create a pod
//! writes them): each is bounded, and one that is present but not understood is recorded as such.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::ledger::kai_pod::{
    CONTAINER_ANNOTATION, FRACTION_ANNOTATION, GPU_GROUP_LABEL, KaiPod, MEMORY_ANNOTATION,
    MULTI_GPU_GROUP_PREFIX, NUM_DEVICES_ANNOTATION, RESERVED_GPU_ANNOTATION,
};

/// Most GPU groups kept per pod (KAI's multi-device fractions span a node's cards: 8 or 16).
const MAX_GROUPS: usize = 16;
/// Longest group id, container name or UUID kept (label values are at most 63 bytes; container
/// names 63; a GPU UUID is 40).
const MAX_VALUE_BYTES: usize = 63;
/// Most cards a multi-device fraction may name.
const MAX_DEVICES: u32 = 64;
/// Largest `gpu-memory` taken as a memory size, MiB (16 TiB: no card comes near).
const MAX_MEMORY_MIB: u64 = 16 * 1024 * 1024;

/// KAI's sharing data of a pod, `None` when it carries none of KAI's keys.
pub fn pod(meta: &ObjectMeta) -> Option<KaiPod> {
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let mut k = KaiPod::default();
    let mut groups: Vec<&str> = labels
        .iter()
        .filter(|(key, _)| {
            key.as_str() == GPU_GROUP_LABEL || key.starts_with(MULTI_GPU_GROUP_PREFIX)
        })
        .map(|(key, v)| {
            // The per-card label carries the group in its key and value alike.
            key.strip_prefix(MULTI_GPU_GROUP_PREFIX)
                .filter(|g| !g.is_empty())
                .unwrap_or(v.as_str())
        })
        .filter(|g| !g.is_empty())
        .collect();
    groups.sort_unstable();
    groups.dedup();
    if groups.len() > MAX_GROUPS || groups.iter().any(|g| g.len() > MAX_VALUE_BYTES) {
        k.invalid.push(GPU_GROUP_LABEL);
        groups.clear();
    }
    k.groups = groups.into_iter().map(str::to_string).collect();
    let get = |key: &str| annotations.get(key).map(|v| v.trim());
    if let Some(v) = get(FRACTION_ANNOTATION) {
        match v.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => k.fraction = Some(f),
            _ => k.invalid.push(FRACTION_ANNOTATION),
        }
    }
    if let Some(v) = get(MEMORY_ANNOTATION) {
        match v.parse::<u64>() {
            Ok(m) if m > 0 && m <= MAX_MEMORY_MIB => k.memory_mib = Some(m),
            _ => k.invalid.push(MEMORY_ANNOTATION),
        }
    }
    if let Some(v) = get(NUM_DEVICES_ANNOTATION) {
        match v.parse::<u32>() {
            Ok(n) if (1..=MAX_DEVICES).contains(&n) => k.num_devices = Some(n),
            _ => k.invalid.push(NUM_DEVICES_ANNOTATION),
        }
    }
    if let Some(v) = get(CONTAINER_ANNOTATION) {
        if v.len() <= MAX_VALUE_BYTES {
            k.container = Some(v.to_string());
        } else {
            k.invalid.push(CONTAINER_ANNOTATION);
        }
    }
    if let Some(v) = get(RESERVED_GPU_ANNOTATION) {
        if !v.is_empty() && v.len() <= MAX_VALUE_BYTES {
            k.reserved_uuid = Some(v.to_string());
        } else {
            k.invalid.push(RESERVED_GPU_ANNOTATION);
        }
    }
    let any = !k.groups.is_empty()
        || k.fraction.is_some()
        || k.memory_mib.is_some()
        || k.reserved_uuid.is_some()
        || !k.invalid.is_empty();
    any.then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn fraction_memory_and_groups_are_read_as_kai_writes_them() {
        // `docs/gpu-sharing/gpu-memory.yaml`, after the binder labelled it.
        let k = pod(&meta(
            &[
                ("kai.scheduler/queue", "default-queue"),
                (GPU_GROUP_LABEL, "5e2c1b7a"),
            ],
            &[(MEMORY_ANNOTATION, "2000")],
        ))
        .expect("a KAI user");
        assert_eq!(k.groups, ["5e2c1b7a"]);
        assert_eq!((k.fraction, k.memory_mib), (None, Some(2000)));
        let k = pod(&meta(&[], &[(FRACTION_ANNOTATION, "0.5")])).expect("a pending user");
        assert_eq!(k.fraction, Some(0.5));
        assert!(k.groups.is_empty() && k.invalid.is_empty());
        // A multi-device fraction: one label per card.
        let k = pod(&meta(
            &[("runai-gpu-group/g2", "g2"), ("runai-gpu-group/g1", "g1")],
            &[
                (FRACTION_ANNOTATION, "0.25"),
                (NUM_DEVICES_ANNOTATION, "2"),
                (CONTAINER_ANNOTATION, "trainer"),
            ],
        ))
        .expect("a multi-device user");
        assert_eq!(k.groups, ["g1", "g2"]);
        assert_eq!(k.num_devices, Some(2));
        assert_eq!(k.container.as_deref(), Some("trainer"));
        // A reservation pod (a real Run:ai-era dump: the "index" holds a UUID).
        let k = pod(&meta(
            &[
                ("app", "runai-reservation"),
                (GPU_GROUP_LABEL, "df7c0dd3-9795-443c-85b9-acbf49c8fb6b"),
            ],
            &[(
                RESERVED_GPU_ANNOTATION,
                "GPU-8983c66a-23df-e63b-4c2f-afcae9ec79b3",
            )],
        ))
        .expect("a reservation pod");
        assert_eq!(
            k.reserved_uuid.as_deref(),
            Some("GPU-8983c66a-23df-e63b-4c2f-afcae9ec79b3")
        );
        assert!(pod(&meta(&[("app", "web")], &[("note", "x")])).is_none());
    }

    #[test]
    fn values_not_understood_are_recorded_never_read_as_absent() {
        for (key, value) in [
            (FRACTION_ANNOTATION, "2"),
            (FRACTION_ANNOTATION, "NaN"),
            (FRACTION_ANNOTATION, "-0.5"),
            (FRACTION_ANNOTATION, "0"),
            (MEMORY_ANNOTATION, "lots"),
            (MEMORY_ANNOTATION, "99999999999999999999"),
            (NUM_DEVICES_ANNOTATION, "0"),
            (NUM_DEVICES_ANNOTATION, "4096"),
        ] {
            let k = pod(&meta(&[], &[(key, value)])).expect("kept: it names KAI");
            assert_eq!(k.invalid, [key], "{key}={value}");
            assert_eq!(
                (k.fraction, k.memory_mib, k.num_devices),
                (None, None, None)
            );
        }
        let long = "g".repeat(MAX_VALUE_BYTES + 1);
        let k = pod(&meta(&[(GPU_GROUP_LABEL, &long)], &[])).expect("kept");
        assert!(k.groups.is_empty());
        assert_eq!(k.invalid, [GPU_GROUP_LABEL]);
        let many: Vec<(String, String)> = (0..=MAX_GROUPS)
            .map(|i| (format!("{MULTI_GPU_GROUP_PREFIX}g{i}"), format!("g{i}")))
            .collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let k = pod(&meta(&refs, &[])).expect("kept");
        assert!(k.groups.is_empty(), "{:?}", k.groups);
    }
}
