//! Label schemes: where dcgm-exporter's workload, host and device labels ended up after scraping.

use std::fmt;
use std::str::FromStr;

/// Label names for one scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelScheme {
    pub pod: &'static str,
    pub namespace: &'static str,
    pub container: &'static str,
    pub hostname: &'static str,
    pub uuid: &'static str,
}

/// `exported_pod`… (scraped without honor_labels), `pod`… (honor_labels or relabelled), or auto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemeChoice {
    #[default]
    Auto,
    Exported,
    Plain,
}

impl FromStr for SchemeChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "exported" => Ok(Self::Exported),
            "plain" => Ok(Self::Plain),
            other => Err(format!(
                "unknown label scheme {other:?} (expected auto, exported or plain)"
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
        })
    }
}

/// Workload labels prefixed `exported_` (Prometheus renamed them; `pod` names the exporter).
pub const EXPORTED: (&str, &str, &str) =
    ("exported_pod", "exported_namespace", "exported_container");
/// Workload labels as dcgm-exporter wrote them.
pub const PLAIN: (&str, &str, &str) = ("pod", "namespace", "container");

impl LabelScheme {
    /// Builds a scheme from the workload choice and the spellings seen for host and UUID labels.
    pub fn new(exported: bool, lower_hostname: bool, lower_uuid: bool) -> Self {
        let (pod, namespace, container) = if exported { EXPORTED } else { PLAIN };
        LabelScheme {
            pod,
            namespace,
            container,
            hostname: if lower_hostname {
                "hostname"
            } else {
                "Hostname"
            },
            uuid: if lower_uuid { "uuid" } else { "UUID" },
        }
    }

    /// Detects the scheme from the label names present on DCGM series.
    ///
    /// `exported_pod` anywhere means the scrape renamed workload labels; `hostname`/`uuid` in lower
    /// case are accepted when the capitalised spelling is absent.
    pub fn detect<'a, I>(choice: SchemeChoice, label_names: I) -> Self
    where
        I: IntoIterator<Item = &'a str>,
    {
        let (mut exported, mut upper_host, mut lower_host, mut upper_uuid, mut lower_uuid) =
            (false, false, false, false, false);
        for name in label_names {
            match name {
                "exported_pod" | "exported_namespace" => exported = true,
                "Hostname" => upper_host = true,
                "hostname" => lower_host = true,
                "UUID" => upper_uuid = true,
                "uuid" => lower_uuid = true,
                _ => {}
            }
        }
        let exported = match choice {
            SchemeChoice::Auto => exported,
            SchemeChoice::Exported => true,
            SchemeChoice::Plain => false,
        };
        Self::new(
            exported,
            lower_host && !upper_host,
            lower_uuid && !upper_uuid,
        )
    }
}

impl Default for LabelScheme {
    fn default() -> Self {
        Self::new(false, false, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_exported_and_lowercase() {
        let s = LabelScheme::detect(
            SchemeChoice::Auto,
            ["exported_pod", "pod", "hostname", "UUID"],
        );
        assert_eq!(
            (s.pod, s.hostname, s.uuid),
            ("exported_pod", "hostname", "UUID")
        );
        let s = LabelScheme::detect(SchemeChoice::Auto, ["pod", "Hostname", "uuid"]);
        assert_eq!((s.pod, s.hostname, s.uuid), ("pod", "Hostname", "uuid"));
        let s = LabelScheme::detect(SchemeChoice::Plain, ["exported_pod"]);
        assert_eq!(s.pod, "pod");
        let s = LabelScheme::detect(SchemeChoice::Exported, ["pod"]);
        assert_eq!(s.namespace, "exported_namespace");
    }
}
