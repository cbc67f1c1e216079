//! What to do about a finding, with the exact command: stop an idle notebook the way Kubeflow's
//! UI does, clear what holds a stuck Terminating pod (its finalizers, or a force delete when its
//! node is not Ready), cap a namespace that has no GPU quota.
//!
//! Commands are only offered for names Kubernetes itself would accept (a namespace is a DNS-1123
//! label, an object name a DNS-1123 subdomain), so a hostile name in an offline dump can never
//! turn into a shell command a reader pastes; every name is a positional argument after `--`, so
//! none can be read as an option (`--all`) even if one got through.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::cells::{gpu_count, gpus, humanise_seconds, idle_for, notebook_stopped};
use crate::ledger::claims::OwnerKind;
use crate::ledger::names::{is_dns1123_label, is_dns1123_subdomain, snooze_command};
use crate::ledger::reclaim::ReclaimOption;
use crate::ledger::{Ledger, NamespaceRow, PodRow, PodState};

/// Annotation Kubeflow's notebook controller reads to scale a notebook to zero.
const STOP_ANNOTATION: &str = crate::ledger::claims::STOP_ANNOTATION;

/// Said instead of a command when a name is not one Kubernetes accepts.
pub const NO_COMMAND: &str = "no command: not a valid Kubernetes name";

/// A suggestion: one sentence, then commands, each with what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub text: String,
    /// (when to run it, command); the first element is empty when the command needs no condition.
    pub commands: Vec<(String, String)>,
    /// Why there is no command ([`NO_COMMAND`]), when a name involved is not a Kubernetes name.
    pub note: Option<&'static str>,
}

/// A resource name (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`).
fn is_resource_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/' | '_'))
}

/// The value Kubeflow's UI writes into `kubeflow-resource-stopped`: UTC `YYYY-MM-DDTHH:MM:SSZ`.
pub fn stop_value(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The hint for one pod, as of `at` (the ledger's time; the stop annotation's value).
pub fn pod_hint(p: &PodRow, at: DateTime<Utc>) -> Option<Hint> {
    let named = is_dns1123_label(&p.namespace) && is_dns1123_subdomain(&p.pod);
    if let Some(hint) = notice_hint(p) {
        return Some(hint);
    }
    if let Some(hint) = raycluster_hint(p, named) {
        return Some(hint);
    }
    match p.state {
        PodState::Running if p.idle == Some(true) && !notebook_stopped(p) => {
            let nb = p.notebook.as_deref()?;
            let mut commands = Vec::new();
            let named = named && is_dns1123_subdomain(nb);
            if named {
                commands.push((
                    String::new(),
                    format!(
                        "kubectl annotate notebook -n {} -- {nb} {STOP_ANNOTATION}={}",
                        p.namespace,
                        stop_value(at)
                    ),
                ));
            }
            Some(Hint {
                text: format!(
                    "idle {}: stop notebook {nb} (Kubeflow scales it to zero; its volumes stay)",
                    idle_for(p)
                ),
                commands,
                note: (!named).then_some(NO_COMMAND),
            })
        }
        PodState::Terminating if p.stuck => Some(stuck_hint(p, named)),
        _ => None,
    }
}

/// The exact command that suspends RayCluster `name` (KubeRay then deletes its pods and keeps
/// the cluster); the names are checked by the caller.
fn suspend_command(namespace: &str, name: &str) -> String {
    format!(
        "kubectl patch raycluster -n {namespace} --type merge -p '{{\"spec\":{{\"suspend\":true}}}}' -- {name}"
    )
}

/// An idle GPU pod of a RayCluster: suspend the cluster (every GPU worker of it goes), or, when
/// a RayJob or RayService made it, say that its parent is where to stop it.
fn raycluster_hint(p: &PodRow, named: bool) -> Option<Hint> {
    let owner = p
        .evidence
        .owner
        .as_ref()
        .filter(|o| o.kind == OwnerKind::RayCluster)?;
    let rc = &owner.info;
    if p.state != PodState::Running || p.idle != Some(true) || rc.stopped.is_some() {
        return None;
    }
    if let Some(parent) = &rc.managed_by {
        return Some(Hint {
            text: format!(
                "idle {}: raycluster {} is managed by {parent}: stop it there",
                idle_for(p),
                rc.name
            ),
            commands: Vec::new(),
            note: None,
        });
    }
    let named = named && is_dns1123_subdomain(&rc.name);
    Some(Hint {
        text: format!(
            "idle {}: suspend raycluster {}/{} (KubeRay deletes its pods and keeps the cluster; \
             resume with spec.suspend: false)",
            idle_for(p),
            p.namespace,
            rc.name
        ),
        commands: if named {
            vec![(String::new(), suspend_command(&p.namespace, &rc.name))]
        } else {
            Vec::new()
        },
        note: (!named).then_some(NO_COMMAND),
    })
}

/// What frees a stuck Terminating pod, as far as the data tells (issue 36): finalizers are
/// removed only by a patch (a force delete leaves them, and the object with its GPUs stays);
/// a force delete is what an unreachable or not-Ready node needs. Both "if …" lines only where
/// the node's readiness is unknown; a storage finalizer is named before its patch.
fn stuck_hint(p: &PodRow, named: bool) -> Hint {
    let age = p
        .terminating_seconds
        .map(|s| format!(" {}", humanise_seconds(s as i64)))
        .unwrap_or_default();
    let node = p.node.as_deref().unwrap_or("its node");
    let (ns, pod) = (&p.namespace, &p.pod);
    let patch = format!(
        "kubectl patch pod -n {ns} --type=merge -p '{{\"metadata\":{{\"finalizers\":null}}}}' -- {pod}"
    );
    let force = format!("kubectl delete pod -n {ns} --grace-period=0 --force -- {pod}");
    let finalizers = p.finalizers.join(", ");
    let storage: Vec<&str> = p
        .finalizers
        .iter()
        .map(String::as_str)
        .filter(|f| protects_storage(f))
        .collect();
    let before_patch = if storage.is_empty() {
        String::new()
    } else {
        format!(
            "{} protects storage: removing it skips the clean-up it waits for (unmount, detach); check the volume first",
            storage.join(", ")
        )
    };
    let (why, commands): (String, Vec<(String, String)>) = match (
        p.finalizers.is_empty(),
        p.node_ready,
    ) {
        (false, Some(true)) => (
            format!(
                "finalizer {finalizers} keeps it ({node} is Ready; a force delete does not remove finalizers)"
            ),
            vec![(before_patch, patch)],
        ),
        (false, Some(false)) => (
            format!("finalizer {finalizers} and {node}, not Ready, keep it"),
            vec![(before_patch, patch), (String::new(), force)],
        ),
        (false, None) => (
            format!("finalizer {finalizers} keeps it (whether {node} is Ready is unknown)"),
            vec![(before_patch, patch), (format!("if {node} is down"), force)],
        ),
        (true, Some(false)) => (
            format!("{node} is not Ready (unreachable?): its kubelet cannot finish the pod"),
            vec![(String::new(), force)],
        ),
        (true, Some(true)) => (
            format!(
                "no finalizer, {node} is Ready: its kubelet has not finished the pod (see the pod's events, the kubelet's log)"
            ),
            vec![(format!("once its containers are gone from {node}"), force)],
        ),
        (true, None) => (
            format!("no finalizer; whether {node} is Ready is unknown"),
            vec![(format!("if {node} is down"), force)],
        ),
    };
    Hint {
        text: format!(
            "stuck terminating{age}, still holds {}: {why}",
            gpu_count(p.gpus)
        ),
        commands: if named { commands } else { Vec::new() },
        note: (!named).then_some(NO_COMMAND),
    }
}

/// Finalizers that guard storage: Kubernetes' own PVC and PV protection, and any whose name
/// speaks of storage (a CSI driver's, a backup tool's). Removing one skips the clean-up it
/// waits for, so the advice says so before the patch.
pub fn protects_storage(finalizer: &str) -> bool {
    const WORDS: [&str; 8] = [
        "storage", "volume", "pvc", "pv-", "csi", "mount", "disk", "snapshot",
    ];
    let f = finalizer.to_ascii_lowercase();
    f == "kubernetes.io/pvc-protection"
        || f == "kubernetes.io/pv-protection"
        || WORDS.iter().any(|w| f.contains(w))
}

/// How "Who could run" says what frees stuck holder `p`: "clear finalizers of", "clear
/// finalizers and force delete", or "force delete" (unknown pods too).
pub fn stuck_remedy(p: Option<&PodRow>) -> &'static str {
    match p {
        Some(p) if !p.finalizers.is_empty() && p.node_ready == Some(false) => {
            "clear finalizers and force delete"
        }
        Some(p) if !p.finalizers.is_empty() => "clear finalizers of",
        _ => "force delete",
    }
}

/// A notebook under a culling notice (`gpu-ledger.io/stop-scheduled-at`, `--cull-notice`): when
/// it stops unless used or snoozed, and the exact command to snooze it (a day past the stop).
fn notice_hint(p: &PodRow) -> Option<Hint> {
    let owner = p.evidence.owner.as_ref()?;
    let nb = &owner.info;
    let at = nb.stop_scheduled_at?;
    if p.state != PodState::Running || nb.stopped.is_some() {
        return None;
    }
    let until = stop_value(at + chrono::Duration::days(1));
    // kubectl's resource name: the kind in lower case (`notebook`, `raycluster`).
    let resource = owner.kind.as_str().to_ascii_lowercase();
    let command = snooze_command(&resource, &p.namespace, &nb.name, &until);
    Some(Hint {
        text: format!(
            "stops at {} unless used or snoozed (notice before an idle stop)",
            stop_value(at)
        ),
        note: command.is_none().then_some(NO_COMMAND),
        commands: command
            .map(|c| ("to snooze".to_string(), c))
            .into_iter()
            .collect(),
    })
}

/// The hint for a namespace that holds or asks for GPUs with no quota naming a GPU resource:
/// a quota at today's demand (units per resource over its listed pods, pending included).
pub fn namespace_hint(ns: &NamespaceRow, pods: &[PodRow]) -> Option<Hint> {
    if ns.gpu_quota.is_some() || (ns.gpus_claimed <= 0.0 && ns.gpus_pending <= 0.0) {
        return None;
    }
    // KAI's reservation namespace holds its users' cards: a quota there would only stop KAI
    // placing fractions (the users' own namespaces get the hint).
    let mut listed = pods
        .iter()
        .filter(|p| p.namespace == ns.namespace)
        .peekable();
    if listed.peek().is_some()
        && listed.all(|p| matches!(p.sharing, crate::ledger::Sharing::KaiReservation { .. }))
    {
        return None;
    }
    let mut units: BTreeMap<&str, u64> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.namespace == ns.namespace) {
        for (name, n) in &p.resources {
            let e = units.entry(name.as_str()).or_default();
            *e = e.saturating_add(*n);
        }
    }
    let hard: Vec<String> = units
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(name, n)| format!("requests.{name}={n}"))
        .collect();
    let mut commands = Vec::new();
    let named = is_dns1123_label(&ns.namespace);
    if named && !hard.is_empty() && units.keys().all(|name| is_resource_name(name)) {
        commands.push((
            String::new(),
            format!(
                "kubectl create quota gpu-quota -n {} --hard={}",
                ns.namespace,
                hard.join(",")
            ),
        ));
    }
    Some(Hint {
        text: format!(
            "{} held, {} pending, no GPU quota: add one (here at today's demand)",
            gpu_count(ns.gpus_claimed),
            gpus(ns.gpus_pending)
        ),
        commands,
        note: (!named).then_some(NO_COMMAND),
    })
}

/// What one reclaim option takes, for people: "free now", "force delete stuck team-ml/bob-nb-0"
/// (or "clear finalizers of stuck …" when finalizers hold it: [`stuck_remedy`]),
/// "stop notebook team-ml/alice-nb (idle ≥2h0m)", joined with "; ". The idle time reads as the
/// pod's IDLE FOR cell (`≥` when it reaches back to the start of the history).
pub fn reclaim_takes(o: &ReclaimOption, ledger: &Ledger) -> String {
    if o.is_free() {
        return "free now".into();
    }
    let mut parts: Vec<String> = Vec::new();
    for s in &o.stuck_holders {
        let row = ledger
            .pods
            .iter()
            .find(|p| p.namespace == s.namespace && p.pod == s.pod);
        parts.push(format!(
            "{} stuck {}/{}",
            stuck_remedy(row),
            s.namespace,
            s.pod
        ));
    }
    let mut said = std::collections::BTreeSet::new();
    for s in &o.by_stopping {
        // One suspension takes every pod of a RayCluster: said once.
        if !said.insert((s.owner_kind, &s.namespace, &s.notebook)) {
            continue;
        }
        let bounded = ledger
            .pods
            .iter()
            .find(|p| p.namespace == s.namespace && p.pod == s.pod)
            .is_some_and(|p| p.evidence.idle_bounded_by_history);
        let verb = if s.owner_kind == OwnerKind::RayCluster.as_str() {
            "suspend raycluster"
        } else {
            "stop notebook"
        };
        parts.push(format!(
            "{verb} {}/{} (idle {}{})",
            s.namespace,
            s.notebook,
            if bounded { "≥" } else { "" },
            humanise_seconds(s.idle_seconds as i64)
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubernetes_names_become_commands() {
        for ok in ["team-ml", "alice-nb-0", "a", "0", "x1"] {
            assert!(is_dns1123_label(ok) && is_dns1123_subdomain(ok), "{ok}");
        }
        assert!(is_dns1123_subdomain("gpu.lab-1.example"));
        assert!(!is_dns1123_label("gpu.lab-1"), "a namespace has no dots");
        assert!(is_dns1123_label(&"a".repeat(63)) && !is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain(&"a".repeat(253)) && !is_dns1123_subdomain(&"a".repeat(254)));
        for bad in [
            "evil; rm -rf ~",
            "a'b",
            "Upper",
            "",
            "-all",
            "--all",
            "-A",
            "-",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a.-b",
        ] {
            assert!(
                !is_dns1123_label(bad) && !is_dns1123_subdomain(bad),
                "{bad:?}"
            );
        }
        assert!(is_resource_name("nvidia.com/mig-1g.10gb"));
        assert!(!is_resource_name("nvidia.com/gpu$(x)"));
    }

    /// A stuck Terminating pod on node `gpu-1`, with these finalizers and node readiness.
    fn stuck(finalizers: &[&str], node_ready: Option<bool>) -> PodRow {
        PodRow {
            gpus: 1.0,
            finalizers: finalizers.iter().map(|f| (*f).to_string()).collect(),
            node_ready,
            ..PodRow::new("team-ml", "bob-nb-0")
                .running_on("gpu-1")
                .stuck_for(3600.0)
        }
    }

    /// (when, first word of the command) per command: `patch` or `delete`.
    fn remedies(p: &PodRow) -> Vec<(String, String)> {
        let at = DateTime::parse_from_rfc3339("2026-11-28T09:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        pod_hint(p, at)
            .expect("a hint")
            .commands
            .into_iter()
            .map(|(when, c)| (when, c.split(' ').nth(1).unwrap_or_default().to_string()))
            .collect()
    }

    /// Issue 36, item 4: a force delete does not remove finalizers, and a finalizer is not what
    /// keeps a pod whose node is unreachable. The data says which holds: only that remedy is
    /// offered, unconditionally; "if …" remains only where the node's readiness is unknown.
    #[test]
    fn a_stuck_pod_gets_the_remedy_its_data_calls_for() {
        let none = String::new();
        assert_eq!(
            remedies(&stuck(&["example.com/cleanup"], Some(true))),
            [(none.clone(), "patch".to_string())],
            "finalizer on a Ready node: the patch alone"
        );
        assert_eq!(
            remedies(&stuck(&[], Some(false))),
            [(none.clone(), "delete".to_string())],
            "unreachable node, no finalizer: the force delete alone"
        );
        assert_eq!(
            remedies(&stuck(&["example.com/cleanup"], Some(false))),
            [
                (none.clone(), "patch".to_string()),
                (none.clone(), "delete".to_string())
            ],
            "both hold: both, neither conditional"
        );
        assert_eq!(
            remedies(&stuck(&["example.com/cleanup"], None)),
            [
                (none.clone(), "patch".to_string()),
                ("if gpu-1 is down".to_string(), "delete".to_string())
            ],
            "readiness unknown: the force delete stays conditional"
        );
        // A storage finalizer is named before the patch that removes it.
        for f in [
            "kubernetes.io/pvc-protection",
            "kubernetes.io/pv-protection",
            "storage.example.com/unmount-protection",
        ] {
            let r = remedies(&stuck(&[f], Some(true)));
            assert!(
                r[0].0.starts_with(f) && r[0].0.contains("protects storage"),
                "{f}: {r:?}"
            );
        }
    }

    #[test]
    fn who_could_run_names_the_remedy_of_a_stuck_holder() {
        assert!(protects_storage("kubernetes.io/pvc-protection"));
        assert!(protects_storage("csi.example.com/Volume-Detach"));
        assert!(!protects_storage("kueue.x-k8s.io/managed"));
        assert!(!protects_storage("batch.kubernetes.io/job-tracking"));
        let s = stuck_remedy;
        assert_eq!(s(Some(&stuck(&["x/y"], Some(true)))), "clear finalizers of");
        assert_eq!(
            s(Some(&stuck(&["x/y"], Some(false)))),
            "clear finalizers and force delete"
        );
        assert_eq!(s(Some(&stuck(&[], Some(false)))), "force delete");
        assert_eq!(s(None), "force delete");
    }

    /// An idle GPU worker of RayCluster `team-ray/rc`, its owner `managed_by` a parent or not.
    fn ray_worker(pod: &str, managed_by: Option<&str>) -> PodRow {
        let mut p = PodRow {
            idle: Some(true),
            idle_seconds: Some(3.0 * 3600.0),
            ..PodRow::new("team-ray", pod).running_on("gpu-1")
        };
        p.evidence.owner = Some(crate::ledger::OwnedBy {
            kind: OwnerKind::RayCluster,
            info: crate::ledger::claims::OwnerInfo {
                managed_by: managed_by.map(String::from),
                ..crate::ledger::claims::OwnerInfo::new("team-ray", "rc")
            },
            verified: true,
        });
        p
    }

    #[test]
    fn an_idle_raycluster_worker_says_suspend_with_the_exact_command() {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let hint = pod_hint(&ray_worker("rc-gpu-worker-a", None), at).expect("a hint");
        assert!(
            hint.text
                .starts_with("idle 3h0m: suspend raycluster team-ray/rc"),
            "{}",
            hint.text
        );
        assert_eq!(
            hint.commands,
            [(
                String::new(),
                "kubectl patch raycluster -n team-ray --type merge -p '{\"spec\":{\"suspend\":true}}' -- rc".to_string()
            )]
        );
        let managed =
            pod_hint(&ray_worker("rc-gpu-worker-a", Some("RayJob train")), at).expect("a hint");
        assert_eq!(
            (managed.text.as_str(), managed.commands.len()),
            (
                "idle 3h0m: raycluster rc is managed by RayJob train: stop it there",
                0
            )
        );
        // Who could run: one suspension frees both workers' cards, said once.
        let stop = |pod: &str| crate::ledger::reclaim::Stop {
            namespace: "team-ray".into(),
            pod: pod.into(),
            notebook: "rc".into(),
            owner_kind: "RayCluster",
            idle_seconds: 7200.0,
        };
        let option = ReclaimOption {
            node: "gpu-1".into(),
            by_stopping: vec![stop("rc-gpu-worker-a"), stop("rc-gpu-worker-b")],
            stuck_holders: vec![],
        };
        assert_eq!(
            reclaim_takes(&option, &Ledger::empty(at)),
            "suspend raycluster team-ray/rc (idle 2h0m)"
        );
    }

    #[test]
    fn stop_value_is_kubeflows_format() {
        let at = DateTime::parse_from_rfc3339("2026-11-28T09:00:00.123Z")
            .expect("time")
            .with_timezone(&Utc);
        assert_eq!(stop_value(at), "2026-11-28T09:00:00Z");
    }
}
