//! HAMi vGPU annotations → the ledger's HAMi inputs (pure, bounded, never panics).
//!
//! Formats from Project-HAMi/HAMi `docs/develop/protocol.md` (fixtures in
//! `tests/fixtures/hami/` cite them):
//! - node `hami.io/node-nvidia-register`: per card
//!   `{uuid},{split},{memory MiB},{core limit},{type},{numa},{healthy},{index},{mode}:` (nine
//!   fields), or the older seven (no index, no mode), which HAMi's scheduler still accepts; each
//!   card ends with `:`.
//! - pod `hami.io/vgpu-devices-allocated` (else `hami.io/vgpu-devices-to-allocate`, the same
//!   string): per container `;`, per vGPU `{uuid},{type},{memory MiB},{cores}:`. In MIG mode HAMi
//!   writes the UUID as `GPU-…[i-j]` (`AddResourceUsage`, `pkg/device/nvidia/device.go`): the
//!   suffix is stripped, the card is the GPU.
//!
//! Anything malformed gives no devices and a reason: the node or pod is then read as if HAMi
//! were not there (by its extended resources), and the reason is shown. Never a guessed share.

use std::collections::BTreeMap;

use crate::ledger::hami_inputs::{
    ALLOCATED_ANNOTATION, HamiAlloc, HamiDevice, HamiNode, HamiPod, MAX_ALLOCS,
    MAX_ANNOTATION_BYTES, MAX_REGISTER_DEVICES, REGISTER_ANNOTATION, TO_ALLOCATE_ANNOTATION,
};

/// Longest UUID accepted (`GPU-` and 36 characters; room for other vendors' spellings).
const MAX_UUID_BYTES: usize = 128;
/// Longest device type kept.
const MAX_TYPE_BYTES: usize = 128;
/// Largest memory MiB accepted (16 TiB: no card is near it).
const MAX_MEM_MIB: u64 = 1 << 24;
/// Largest core value accepted (100 = a card; `deviceCoreScaling` may raise the register's).
const MAX_CORES: u32 = 10_000;
/// Largest split count accepted.
const MAX_SPLIT: u32 = 1_000;

/// The node's register annotation, read (empty when the node has none).
pub fn node(annotations: Option<&BTreeMap<String, String>>) -> HamiNode {
    match annotations.and_then(|a| a.get(REGISTER_ANNOTATION)) {
        None => HamiNode::default(),
        Some(v) => match parse_register(v) {
            Ok(devices) => HamiNode {
                devices,
                error: None,
            },
            Err(e) => HamiNode {
                devices: Vec::new(),
                error: Some(format!("{REGISTER_ANNOTATION} unreadable: {e}")),
            },
        },
    }
}

/// The pod's allocation annotation, read (empty when it has none).
pub fn pod(annotations: Option<&BTreeMap<String, String>>) -> HamiPod {
    let Some(a) = annotations else {
        return HamiPod::default();
    };
    let (key, v) = match (a.get(ALLOCATED_ANNOTATION), a.get(TO_ALLOCATE_ANNOTATION)) {
        (Some(v), _) => (ALLOCATED_ANNOTATION, v),
        (None, Some(v)) => (TO_ALLOCATE_ANNOTATION, v),
        (None, None) => return HamiPod::default(),
    };
    match parse_allocation(v) {
        Ok(allocs) => HamiPod {
            allocs,
            error: None,
        },
        Err(e) => HamiPod {
            allocs: Vec::new(),
            error: Some(format!("{key} unreadable: {e}")),
        },
    }
}

/// A UUID as HAMi writes it, a MIG-mode `[i-j]` suffix stripped; `Err` for anything else.
pub fn card_uuid(raw: &str) -> Result<&str, String> {
    let uuid = match raw.split_once('[') {
        Some((u, rest)) if rest.ends_with(']') && rest.len() > 1 => u,
        Some(_) => return Err(format!("UUID {:?} has an unclosed suffix", excerpt(raw))),
        None => raw,
    };
    if uuid.is_empty()
        || uuid.len() > MAX_UUID_BYTES
        || !uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(format!("{:?} is no device UUID", excerpt(raw)));
    }
    Ok(uuid)
}

fn excerpt(s: &str) -> String {
    s.chars().take(48).collect()
}

fn number<T: std::str::FromStr + PartialOrd + Copy>(
    field: &str,
    what: &str,
    max: T,
) -> Result<T, String> {
    field
        .trim()
        .parse::<T>()
        .ok()
        .filter(|v| *v <= max)
        .ok_or_else(|| format!("{what} {:?} is no number in range", excerpt(field)))
}

fn bounded(v: &str) -> Result<(), String> {
    if v.len() > MAX_ANNOTATION_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_ANNOTATION_BYTES} read",
            v.len()
        ));
    }
    Ok(())
}

/// The cards of a register annotation (nine- or seven-field form).
pub fn parse_register(v: &str) -> Result<Vec<HamiDevice>, String> {
    bounded(v)?;
    let mut out = Vec::new();
    for (i, item) in v.split(':').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        if out.len() == MAX_REGISTER_DEVICES {
            return Err(format!("more than {MAX_REGISTER_DEVICES} devices"));
        }
        let f: Vec<&str> = item.split(',').collect();
        if f.len() != 9 && f.len() != 7 {
            return Err(format!(
                "device {i} has {} fields, not 9 (or the older 7)",
                f.len()
            ));
        }
        let healthy = match f[6].trim() {
            "true" => true,
            "false" => false,
            other => return Err(format!("healthy {:?} is not true/false", excerpt(other))),
        };
        let model = f[4].trim();
        if model.len() > MAX_TYPE_BYTES {
            return Err(format!(
                "device {i}: type longer than {MAX_TYPE_BYTES} bytes"
            ));
        }
        out.push(HamiDevice {
            uuid: card_uuid(f[0].trim())?.to_string(),
            split: number(f[1], "split count", MAX_SPLIT).and_then(|s| {
                (s > 0)
                    .then_some(s)
                    .ok_or_else(|| "split count 0".to_string())
            })?,
            mem_mib: number(f[2], "memory", MAX_MEM_MIB)?,
            cores: number(f[3], "core limit", MAX_CORES)?,
            model: model.to_string(),
            healthy,
        });
    }
    Ok(out)
}

/// The vGPUs of an allocation annotation, by container position.
pub fn parse_allocation(v: &str) -> Result<Vec<HamiAlloc>, String> {
    bounded(v)?;
    let mut out = Vec::new();
    for (container, c) in v.split(';').enumerate() {
        for item in c.split(':') {
            if item.trim().is_empty() {
                continue;
            }
            if out.len() == MAX_ALLOCS {
                return Err(format!("more than {MAX_ALLOCS} vGPUs"));
            }
            let f: Vec<&str> = item.split(',').collect();
            if f.len() != 4 {
                return Err(format!(
                    "container {container}: vGPU {:?} has {} fields, not 4",
                    excerpt(item),
                    f.len()
                ));
            }
            out.push(HamiAlloc {
                container,
                uuid: card_uuid(f[0].trim())?.to_string(),
                mem_mib: number(f[2], "memory", MAX_MEM_MIB)?,
                cores: number(f[3], "cores", MAX_CORES)?,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// protocol.md's register example, verbatim (two V100s, nine fields, trailing `:`).
    const REGISTER: &str = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,0,hami-core:GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true,1,hami-core:";
    /// protocol.md's allocation example, verbatim (two containers on one card, cores unset).
    const ALLOCATION: &str = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,5000,0:;";

    #[test]
    fn reads_protocol_md_register_and_allocation() {
        let d = parse_register(REGISTER).expect("protocol.md example");
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].uuid, "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec");
        assert_eq!((d[0].split, d[0].mem_mib, d[0].cores), (10, 32768, 100));
        assert_eq!(d[1].model, "NVIDIA-Tesla V100-PCIE-32GB");
        assert!(d[1].healthy);
        let a = parse_allocation(ALLOCATION).expect("protocol.md example");
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].container, a[0].mem_mib, a[0].cores), (0, 3000, 0));
        assert_eq!((a[1].container, a[1].mem_mib), (1, 5000));
        assert_eq!(a[1].uuid, "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448");
    }

    #[test]
    fn reads_the_old_seven_field_register() {
        let d = parse_register(
            "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,false:",
        )
        .expect("seven fields");
        assert_eq!(d.len(), 1);
        assert!(!d[0].healthy);
    }

    #[test]
    fn strips_the_mig_suffix() {
        assert_eq!(card_uuid("GPU-abc-1[0-1]"), Ok("GPU-abc-1"));
        assert!(card_uuid("GPU-abc-1[0-1").is_err());
        let a = parse_allocation("GPU-abc-1[1-2],NVIDIA,10240,0:;").expect("MIG mode");
        assert_eq!(a[0].uuid, "GPU-abc-1");
    }

    #[test]
    fn malformed_annotations_are_reasons_not_panics_or_guesses() {
        for bad in [
            "GPU-1,10,32768,100,T,0,true,0:",                 // eight fields
            "GPU-1,0,32768,100,T,0,true,0,hami-core:",        // split 0
            "GPU-1,10,-5,100,T,0,true,0,hami-core:",          // negative memory
            "GPU-1,10,32768,100,T,0,maybe,0,hami-core:",      // healthy
            "GPU 1,10,32768,100,T,0,true,0,hami-core:",       // not a UUID
            "GPU-1,10,99999999999,100,T,0,true,0,hami-core:", // absurd memory
        ] {
            assert!(parse_register(bad).is_err(), "{bad}");
        }
        for bad in ["GPU-1,NVIDIA,3000:;", "GPU-1,NVIDIA,x,0:;", ",NVIDIA,1,0:;"] {
            assert!(parse_allocation(bad).is_err(), "{bad}");
        }
        let huge = "GPU-1,NVIDIA,1,0:".repeat(MAX_ALLOCS + 1);
        assert!(parse_allocation(&huge).is_err());
        let long = "x".repeat(MAX_ANNOTATION_BYTES + 1);
        assert!(parse_register(&long).is_err());
        let annotations: BTreeMap<String, String> =
            [(ALLOCATED_ANNOTATION.to_string(), "junk".to_string())].into();
        let p = pod(Some(&annotations));
        assert!(p.allocs.is_empty());
        assert!(
            p.error
                .as_deref()
                .is_some_and(|e| e.contains(ALLOCATED_ANNOTATION)),
            "{p:?}"
        );
    }

    #[test]
    fn the_to_allocate_key_is_read_when_allocated_is_missing() {
        let annotations: BTreeMap<String, String> =
            [(TO_ALLOCATE_ANNOTATION.to_string(), ALLOCATION.to_string())].into();
        assert_eq!(pod(Some(&annotations)).allocs.len(), 2);
        assert_eq!(pod(None), HamiPod::default());
        assert_eq!(node(None), HamiNode::default());
    }

    proptest::proptest! {
        #[test]
        fn never_panics(v in "[-GPU0-9a-f,:;\\[\\] truefalsNVIDA]{0,300}") {
            let _ = parse_register(&v);
            let _ = parse_allocation(&v);
        }
    }
}
