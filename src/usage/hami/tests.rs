//! HAMi monitor series → each container's own window, from the fixture dump (new names, legacy
//! names and a reading above 100 % in one file: a node mid rolling-upgrade).

use chrono::{DateTime, Duration, Utc};

use super::*;
use crate::usage::exposition;

const DUMP: &str = include_str!("../../../tests/fixtures/hami/dcgm.prom");

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-28T09:00:00Z")
        .expect("valid")
        .with_timezone(&Utc)
}

fn window() -> Window {
    Window {
        length: Duration::minutes(10),
        interval: Duration::seconds(30),
        idle_threshold: 0.05,
        max_staleness: Duration::minutes(2),
    }
}

fn reduced(text: &str) -> Vec<HamiContainerUsage> {
    let names: Vec<&str> = fields::read_names().collect();
    let parsed = exposition::parse(text, &names, now());
    reduce(&parsed.series, &window(), now())
}

fn of<'a>(all: &'a [HamiContainerUsage], pod: &str) -> &'a HamiContainerUsage {
    all.iter().find(|h| h.workload.pod == pod).expect("pod")
}

#[test]
fn new_and_legacy_monitor_names_reduce_alike() {
    let all = reduced(DUMP);
    assert_eq!(all.len(), 4, "{all:#?}");
    for h in &all {
        assert_eq!(h.uuid, "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448");
        assert_eq!(h.container, "cuda");
        assert!(h.coverage >= 0.99, "{h:?}");
    }
    let idle = of(&all, "vgpu-0");
    assert_eq!(idle.peak, Some(0.0));
    assert_eq!(idle.kernel_in_window, Some(false));
    assert_eq!(idle.memory_used_bytes, Some(1_207_959_552.0));
    let (t, elapsed) = idle.last_kernel.expect("kernel");
    assert_eq!(t, now());
    assert!((elapsed - 10800.0).abs() < 1e-9);
    // Legacy names (`podname`, `ctrname`, `deviceuuid`): the same reading.
    let legacy = of(&all, "vgpu-3");
    assert_eq!(legacy.workload.namespace, "team-a");
    assert_eq!(legacy.kernel_in_window, Some(true));
    assert!(
        legacy.peak.is_some_and(|p| (p - 0.34).abs() < 1e-9),
        "{legacy:?}"
    );
    // HAMi#555: 104 "percent" is clamped to a whole card, and flagged.
    let over = of(&all, "vgpu-2");
    assert!(over.over_100);
    assert_eq!(over.peak, Some(1.0));
    assert!(!of(&all, "vgpu-1").over_100);
}

#[test]
fn exported_labels_name_the_workload_and_the_mig_suffix_goes() {
    let t = now().timestamp_millis();
    let text = format!(
        "hami_container_device_utilization_ratio{{exported_container=\"c\",exported_namespace=\"ns\",exported_pod=\"p\",namespace=\"hami-system\",pod=\"hami-device-plugin-x\",device_uuid=\"GPU-1[0-1]\"}} 3 {t}\n\
         hami_container_device_utilization_ratio{{namespace=\"ns\",device_uuid=\"GPU-2\"}} 3 {t}\n"
    );
    let all = reduced(&text);
    assert_eq!(all.len(), 1, "a series without a pod is ignored: {all:?}");
    assert_eq!(all[0].workload.pod, "p");
    assert_eq!(all[0].workload.namespace, "ns");
    assert_eq!(all[0].container, "c");
    assert_eq!(all[0].uuid, "GPU-1");
    // One sample: a tenth of the window proven at most, and no kernel reading.
    assert!(all[0].coverage < 0.9);
    assert_eq!(all[0].kernel_in_window, None);
    assert_eq!(all[0].utilization, Some(0.03));
}

#[test]
fn impossible_readings_are_no_readings() {
    let t = now().timestamp_millis();
    let text = format!(
        "hami_container_device_utilization_ratio{{namespace=\"ns\",pod=\"p\",device_uuid=\"GPU-1\"}} NaN {t}\n\
         hami_container_last_kernel_elapsed_seconds{{namespace=\"ns\",pod=\"p\",device_uuid=\"GPU-1\"}} -4 {t}\n"
    );
    let all = reduced(&text);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].peak, None);
    assert_eq!(all[0].last_kernel, None);
    assert_eq!(all[0].kernel_in_window, None);
}
