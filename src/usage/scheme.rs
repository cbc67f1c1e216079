//! Label schemes: where dcgm-exporter's workload, host and device labels ended up after scraping.
//!
//! Three workload spellings exist: `pod`/`namespace`/`container` as the exporter writes them (and
//! as Prometheus keeps them with `honor_labels: true`); `exported_pod`/… when Prometheus scraped
//! without `honor_labels` and renamed them because its own target labels `pod`/`namespace` (the
//! exporter pod) collided (NVIDIA/gpu-operator#2938, dcgm-exporter#340); and
//! `pod_name`/`pod_namespace`/`container_name` from `--use-old-namespace` (dcgm-exporter#188,
//! #272). Device labels come capitalised (`UUID`, `Hostname`, `GPU_I_ID`, `modelName`) or
//! lower-cased (`uuid`, `hostname` since dcgm-exporter#655, and pipelines that lower-case
//! everything, dcgm-exporter#577).

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

/// Label names for one scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelScheme {
    pub pod: &'static str,
    pub namespace: &'static str,
    pub container: &'static str,
    pub hostname: &'static str,
    pub uuid: &'static str,
    pub gpu_instance: &'static str,
    pub gpu_profile: &'static str,
    pub model: &'static str,
    /// The workload labels are not `pod`/`namespace`, so those (when present) are the scrape's
    /// target labels naming the exporter pod.
    pub exporter_labels: bool,
}

/// Which workload spelling to read, or detect it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemeChoice {
    #[default]
    Auto,
    Exported,
    Plain,
    Legacy,
}

impl FromStr for SchemeChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "exported" => Ok(Self::Exported),
            "plain" => Ok(Self::Plain),
            "legacy" => Ok(Self::Legacy),
            other => Err(format!(
                "unknown label scheme {other:?} (expected auto, exported, plain or legacy)"
            )),
        }
    }
}

impl fmt::Display for SchemeChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Exported => "exported",
            Self::Plain => "plain",
            Self::Legacy => "legacy",
        })
    }
}

/// Workload labels prefixed `exported_` (Prometheus renamed them; `pod` names the exporter).
pub const EXPORTED: (&str, &str, &str) =
    ("exported_pod", "exported_namespace", "exported_container");
/// Workload labels as dcgm-exporter writes them.
pub const PLAIN: (&str, &str, &str) = ("pod", "namespace", "container");
/// Workload labels of `--use-old-namespace`.
pub const LEGACY: (&str, &str, &str) = ("pod_name", "pod_namespace", "container_name");

/// Every label the reduction reads, in any scheme: the live path keeps only these.
pub const READ_LABELS: &[&str] = &[
    "UUID",
    "uuid",
    "GPU_I_ID",
    "gpu_i_id",
    "GPU_I_PROFILE",
    "gpu_i_profile",
    "Hostname",
    "hostname",
    "modelName",
    "modelname",
    "pod",
    "namespace",
    "container",
    "exported_pod",
    "exported_namespace",
    "exported_container",
    "pod_name",
    "pod_namespace",
    "container_name",
    "pod_uid",
    "instance",
    DRA_MIG_UUID_LABEL,
    // Which cluster a series came from in a shared store (`usage::prom::CLUSTER_LABELS`).
    "cluster",
    "cluster_id",
    // HAMi's vGPU monitor (`usage::hami`): the card, and the legacy names' workload labels.
    "device_uuid",
    "deviceuuid",
    "podname",
    "podnamespace",
    "ctrname",
];

/// dcgm-exporter's MIG device UUID label, set with `--kubernetes-enable-dra` on MIG devices
/// handed out through a ResourceClaim (no other label names a MIG UUID).
pub const DRA_MIG_UUID_LABEL: &str = "dra_mig_device_uuid";

impl LabelScheme {
    /// The scheme for a workload spelling with the capitalised device labels.
    pub fn of(choice: SchemeChoice) -> Self {
        Self::build(choice, &HashSet::new())
    }

    /// The scheme for `choice` given the label names seen on DCGM series.
    fn build(choice: SchemeChoice, seen: &HashSet<&str>) -> Self {
        let has = |name: &str| seen.contains(name);
        let workload = match choice {
            SchemeChoice::Auto if has("exported_pod") || has("exported_namespace") => {
                SchemeChoice::Exported
            }
            SchemeChoice::Auto if has("pod_name") || has("pod_namespace") => SchemeChoice::Legacy,
            SchemeChoice::Auto => SchemeChoice::Plain,
            other => other,
        };
        let (pod, namespace, container) = match workload {
            SchemeChoice::Exported => EXPORTED,
            SchemeChoice::Legacy => LEGACY,
            SchemeChoice::Plain | SchemeChoice::Auto => PLAIN,
        };
        // The lower-case spelling only where the capitalised one is absent.
        let pick = |upper: &'static str, lower: &'static str| {
            if has(lower) && !has(upper) {
                lower
            } else {
                upper
            }
        };
        LabelScheme {
            pod,
            namespace,
            container,
            hostname: pick("Hostname", "hostname"),
            uuid: pick("UUID", "uuid"),
            gpu_instance: pick("GPU_I_ID", "gpu_i_id"),
            gpu_profile: pick("GPU_I_PROFILE", "gpu_i_profile"),
            model: pick("modelName", "modelname"),
            exporter_labels: workload != SchemeChoice::Plain,
        }
    }

    /// Detects the scheme from the label names present on DCGM series.
    ///
    /// `exported_pod` anywhere means the scrape renamed workload labels; `pod_name` means
    /// `--use-old-namespace`; lower-case device labels are used when the capitalised spelling is
    /// absent.
    pub fn detect<'a, I>(choice: SchemeChoice, label_names: I) -> Self
    where
        I: IntoIterator<Item = &'a str>,
    {
        let seen: HashSet<&str> = label_names
            .into_iter()
            .filter(|n| READ_LABELS.contains(n))
            .collect();
        Self::build(choice, &seen)
    }
}

impl Default for LabelScheme {
    fn default() -> Self {
        Self::of(SchemeChoice::Plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_exported_legacy_and_lowercase() {
        let s = LabelScheme::detect(
            SchemeChoice::Auto,
            ["exported_pod", "pod", "hostname", "UUID"],
        );
        assert_eq!(
            (s.pod, s.hostname, s.uuid, s.exporter_labels),
            ("exported_pod", "hostname", "UUID", true)
        );
        let s = LabelScheme::detect(SchemeChoice::Auto, ["pod", "Hostname", "uuid"]);
        assert_eq!(
            (s.pod, s.hostname, s.uuid, s.exporter_labels),
            ("pod", "Hostname", "uuid", false)
        );
        let s = LabelScheme::detect(SchemeChoice::Plain, ["exported_pod"]);
        assert_eq!(s.pod, "pod");
        let s = LabelScheme::detect(SchemeChoice::Exported, ["pod"]);
        assert_eq!(s.namespace, "exported_namespace");
        let s = LabelScheme::detect(
            SchemeChoice::Auto,
            ["uuid", "pod_name", "pod_namespace", "container_name", "pod"],
        );
        assert_eq!(
            (s.pod, s.namespace, s.container, s.uuid, s.exporter_labels),
            ("pod_name", "pod_namespace", "container_name", "uuid", true)
        );
        let s = LabelScheme::detect(
            SchemeChoice::Auto,
            ["uuid", "gpu_i_id", "gpu_i_profile", "modelname", "pod"],
        );
        assert_eq!(
            (s.gpu_instance, s.gpu_profile, s.model),
            ("gpu_i_id", "gpu_i_profile", "modelname")
        );
    }

    #[test]
    fn every_spelling_a_scheme_reads_is_kept() {
        for choice in [
            SchemeChoice::Plain,
            SchemeChoice::Exported,
            SchemeChoice::Legacy,
        ] {
            let s = LabelScheme::of(choice);
            for l in [
                s.pod,
                s.namespace,
                s.uuid,
                s.hostname,
                s.gpu_instance,
                s.model,
            ] {
                assert!(READ_LABELS.contains(&l), "{l}");
            }
        }
        assert!("legacy".parse::<SchemeChoice>().is_ok());
        assert!("nope".parse::<SchemeChoice>().is_err());
    }
}
