//! Kubernetes object names as the API server validates them: what a name from a dump must be
//! before it is read, and before it is printed inside a suggested command.

/// One DNS-1123 label's characters: lowercase alphanumerics and `-`, alphanumeric at both ends.
fn is_label_chars(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// A DNS-1123 label (at most 63 characters): what the API server accepts as a namespace.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_chars(s)
}

/// A DNS-1123 subdomain (labels joined by `.`, at most 253 characters): what the API server
/// accepts as the name of a pod, node, notebook, quota or StatefulSet, and as a pod's node.
/// Never starts with `-`, so never read as an option.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_chars)
}

/// The command that snoozes culling of object `name` (kubectl resource `resource`, e.g.
/// `notebook`) until `until` (RFC 3339), or `None` when a name is not one Kubernetes accepts;
/// the name goes after `--`, so it is never read as an option.
pub fn snooze_command(resource: &str, namespace: &str, name: &str, until: &str) -> Option<String> {
    (is_dns1123_label(namespace) && is_dns1123_subdomain(name)).then(|| {
        format!(
            "kubectl annotate --overwrite {resource} -n {namespace} -- {name} gpu-ledger.io/snooze-until={until}"
        )
    })
}
