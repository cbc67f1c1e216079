//! Command line: every flag also reads a `GPU_LEDGER_*` environment variable. Parsed at the edge
//! into validated values (durations, URLs, ratios) before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::ledger::units::{ResourceNames, SliceTable};
use crate::ledger::{ClaimsScope, Policy};
use crate::telemetry::LogFormat;
use crate::usage::scheme::SchemeChoice;

/// `0.1.0 (abc1234)`: the crate version and the git revision it was built from (`build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("GPU_LEDGER_REVISION"),
    ")"
);

/// The exit codes, shown after `--help` of every command (and in the README).
pub const EXIT_CODES: &str = "Exit codes:
  0  success
  1  runtime failure: the Kubernetes API or Prometheus answering with an error, a task ended
  2  usage or bad input: a rejected flag, invalid configuration, an unreadable kubeconfig,
     a missing or invalid dump file or directory
  3  unreachable: the Kubernetes API or Prometheus could not be reached (connection refused
     or reset, timed out, name not resolved, TLS failed); worth a retry";

/// `showback`'s exit codes: the common ones and a partial result.
pub const SHOWBACK_EXIT_CODES: &str = "Exit codes:
  0  success
  1  runtime failure: Prometheus answering with an error
  2  usage or bad input: a rejected flag, invalid configuration, gpu-ledger's series of several
     clusters and no --prometheus-selector
  3  unreachable: Prometheus could not be reached (connection refused or reset, timed out, name
     not resolved, TLS failed); worth a retry
  4  partial: gpu-ledger reported for less of the period than --min-coverage (or not at all);
     the showback is still written, marked partial (or unknown)";

/// Joins Kubernetes GPU claims with DCGM utilisation: who holds each GPU, is it used, and
/// where did the free cards go.
#[derive(Debug, Parser)]
#[command(name = "gpu-ledger", version = VERSION, about, long_about = None, propagate_version = true, args_override_self = true, after_help = EXIT_CODES)]
pub struct Cli {
    /// Log format (`json`: one JSON object per line on stderr, fatal errors included).
    #[arg(long, env = "GPU_LEDGER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true, help_heading = "Logging")]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax, e.g. `info,gpu_ledger=debug`).
    #[arg(
        long,
        env = "GPU_LEDGER_LOG",
        default_value = "info",
        global = true,
        help_heading = "Logging"
    )]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service: watch the cluster, refresh from Prometheus, serve /metrics and the JSON API.
    #[command(after_help = EXIT_CODES)]
    Serve(Box<ServeArgs>),
    /// Print the ledger once, from a live cluster or from dump files.
    #[command(after_help = EXIT_CODES)]
    Report(Box<ReportArgs>),
    /// Write the cluster's GPU claims and DCGM history to a directory that `report --from` reads
    /// (a reproducible case for a bug report; see docs/capture.md).
    #[command(after_help = EXIT_CODES)]
    Capture(Box<CaptureArgs>),
    /// Print a shell completion script (e.g. `gpu-ledger completions bash > /etc/bash_completion.d/gpu-ledger`).
    #[command(after_help = EXIT_CODES)]
    Completions(CompletionsArgs),
    /// GPU-hours claimed, busy and idle per namespace, team or Kubeflow Profile owner over a
    /// period, from gpu-ledger's counters in Prometheus (see docs/showback.md).
    #[command(after_help = SHOWBACK_EXIT_CODES)]
    Showback(Box<ShowbackArgs>),
}

/// Which cluster to talk to (default: `$KUBECONFIG` or `~/.kube/config`, else in-cluster).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Kubernetes")]
pub struct KubeArgs {
    /// Kubeconfig file to use instead of `$KUBECONFIG` / `~/.kube/config`.
    #[arg(long, env = "GPU_LEDGER_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use instead of the current context.
    #[arg(long, env = "GPU_LEDGER_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
}

/// How to reach Prometheus.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Prometheus")]
pub struct PrometheusArgs {
    /// Prometheus (or Thanos querier) base URL holding dcgm-exporter series.
    #[arg(long, env = "GPU_LEDGER_PROMETHEUS_URL")]
    pub prometheus_url: Option<reqwest::Url>,
    /// File with a bearer token for Prometheus (re-read on every refresh).
    #[arg(long, env = "GPU_LEDGER_PROMETHEUS_BEARER_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// PEM file with the CA that signed Prometheus' serving certificate.
    #[arg(long, env = "GPU_LEDGER_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Skip TLS verification towards Prometheus (testing only).
    #[arg(long, env = "GPU_LEDGER_PROMETHEUS_INSECURE_SKIP_VERIFY")]
    pub prometheus_insecure_skip_verify: bool,
    /// Extra label matchers for every DCGM selector, e.g. `cluster="prod"` or
    /// `job="dcgm-exporter"` (a Prometheus or Thanos shared by several clusters or exporters).
    #[arg(
        long,
        env = "GPU_LEDGER_PROMETHEUS_SELECTOR",
        value_name = "MATCHERS",
        help_heading = "Prometheus"
    )]
    pub prometheus_selector: Option<crate::usage::prom::Selector>,
    /// Extra HTTP header on every Prometheus request, `Name: value`; repeat the flag (or
    /// separate with `;` in the variable) for several, e.g. `X-Scope-OrgID: team-a` for Mimir or
    /// Cortex tenants. Path prefixes (`/select/0/prometheus`) go in --prometheus-url.
    #[arg(
        long,
        env = "GPU_LEDGER_PROMETHEUS_HEADERS",
        value_name = "HEADER",
        value_delimiter = ';',
        help_heading = "Prometheus"
    )]
    pub prometheus_header: Vec<crate::usage::prom::Header>,
    /// Send the bearer token (or URL credentials) even to an `http://` Prometheus, unencrypted.
    /// Without it, that combination is refused at start-up.
    #[arg(
        long,
        env = "GPU_LEDGER_PROMETHEUS_ALLOW_INSECURE_TOKEN",
        help_heading = "Prometheus"
    )]
    pub prometheus_allow_insecure_token: bool,
    /// Timeout of one PromQL query.
    #[arg(long, env = "GPU_LEDGER_PROMETHEUS_TIMEOUT", default_value = "20s", value_parser = positive_duration)]
    pub prometheus_timeout: chrono::Duration,
}

/// Settings shared by `serve` and `report` (live and offline).
#[derive(Debug, Clone, Args)]
pub struct LedgerArgs {
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Where dcgm-exporter's workload labels are: `exported_pod`… (scraped without honor_labels),
    /// `pod`… (honor_labels), or detect.
    #[arg(
        long,
        env = "GPU_LEDGER_LABEL_SCHEME",
        default_value = "auto",
        help_heading = "Prometheus"
    )]
    pub label_scheme: SchemeChoice,
    /// Also ask Prometheus for dcgm-exporter's health families (`DCGM_EXP_GPU_HEALTH_STATUS`,
    /// `DCGM_EXP_XID_ERRORS_COUNT`, commented out in its default counters CSV) once per refresh:
    /// a GPU failing a health watch or showing a fatal XID in the window is a sick card.
    #[arg(long, env = "GPU_LEDGER_DCGM_HEALTH", help_heading = "Prometheus")]
    pub dcgm_health: bool,
    /// Window over which a GPU must stay below the threshold to count as idle.
    #[arg(long, env = "GPU_LEDGER_WINDOW", default_value = "10m", value_parser = positive_duration, help_heading = "Idle evidence")]
    pub window: chrono::Duration,
    /// DCGM sample spacing assumed only where the samples cannot show theirs (a GPU with fewer
    /// than two samples in the window); coverage and idle time otherwise come from each GPU's
    /// own sample times, live and offline. 30 s when not given.
    #[arg(long, env = "GPU_LEDGER_SCRAPE_INTERVAL", value_parser = positive_duration, help_heading = "Idle evidence")]
    pub scrape_interval: Option<chrono::Duration>,
    /// Utilisation (0..1) below which a GPU counts as idle.
    #[arg(long, env = "GPU_LEDGER_IDLE_THRESHOLD", default_value_t = 0.05, value_parser = ratio, help_heading = "Idle evidence")]
    pub idle_threshold: f64,
    /// Share of the window the samples must prove (at their own interval) before anything is
    /// called idle.
    #[arg(long, env = "GPU_LEDGER_MIN_COVERAGE", default_value_t = 0.9, value_parser = positive_ratio, help_heading = "Idle evidence")]
    pub min_coverage: f64,
    /// Samples older than this are not a current reading.
    #[arg(long, env = "GPU_LEDGER_MAX_STALENESS", default_value = "2m", value_parser = positive_duration, help_heading = "Idle evidence")]
    pub max_staleness: chrono::Duration,
    /// A terminating pod this long past its deletion deadline is stuck.
    #[arg(long, env = "GPU_LEDGER_STUCK_AFTER", default_value = "5m", value_parser = duration, help_heading = "Claims")]
    pub stuck_after: chrono::Duration,
    /// How far back idle history is read from Prometheus at start-up.
    #[arg(long, env = "GPU_LEDGER_HISTORY_LOOKBACK", default_value = "24h", value_parser = positive_duration, help_heading = "Idle evidence")]
    pub history_lookback: chrono::Duration,
    /// Extra resource names counted as whole GPUs (comma-separated).
    #[arg(
        long,
        env = "GPU_LEDGER_EXTRA_GPU_RESOURCES",
        value_delimiter = ',',
        help_heading = "Claims"
    )]
    pub extra_gpu_resources: Vec<String>,
    /// Namespaces to watch (comma-separated); empty means all. Offline, pods and quotas of other
    /// namespaces in the dumps are left out.
    #[arg(
        long,
        env = "GPU_LEDGER_NAMESPACES",
        value_delimiter = ',',
        help_heading = "Claims"
    )]
    pub namespaces: Vec<String>,
    /// Namespaces where dcgm-exporter runs (comma-separated); their DaemonSet pods locate each
    /// device's node. Empty means all namespaces.
    #[arg(
        long,
        env = "GPU_LEDGER_EXPORTER_NAMESPACES",
        value_delimiter = ',',
        help_heading = "Claims"
    )]
    pub exporter_namespaces: Vec<String>,
    /// Compute slices of MIG-capable GPUs, as `PRODUCT=SLICES` (comma-separated; PRODUCT is
    /// matched as a substring of the node's `nvidia.com/gpu.product`). Built in: A30=4, all
    /// others 7.
    #[arg(long, env = "GPU_LEDGER_MIG_COMPUTE_SLICES", value_delimiter = ',', value_parser = product_slices, help_heading = "Claims")]
    pub mig_compute_slices: Vec<(String, u8)>,
    /// DRA drivers whose devices (ResourceSlices, ResourceClaims) count as GPUs
    /// (comma-separated); devices of other drivers are ignored.
    #[arg(
        long,
        env = "GPU_LEDGER_DRA_GPU_DRIVERS",
        value_delimiter = ',',
        default_value = "gpu.nvidia.com"
    )]
    pub dra_gpu_drivers: Vec<String>,
    /// Kueue's manager ConfigMap, `[NAMESPACE/]NAME` (namespace `kueue-system` by default, as
    /// Kueue's manifests and Helm chart install it): its `resources.deviceClassMappings` make
    /// ClusterQueue quota of a mapped name GPU quota. Read with `get` only; an absent ConfigMap
    /// means no mappings; empty: not read.
    #[arg(
        long,
        env = "GPU_LEDGER_KUEUE_CONFIG_MAP",
        default_value = "kueue-system/kueue-manager-config",
        value_parser = kueue_config_map,
        help_heading = "Claims"
    )]
    pub kueue_config_map: KueueConfigMap,
    /// Namespaces of KAI-Scheduler's reservation pods (comma-separated): their card is handed to
    /// the fraction pods of their GPU group. `kai-resource-reservation` since KAI v0.6.0,
    /// `runai-reservation` before.
    #[arg(
        long,
        env = "GPU_LEDGER_KAI_RESERVATION_NAMESPACES",
        value_delimiter = ',',
        default_value = "kai-resource-reservation,runai-reservation",
        help_heading = "Claims"
    )]
    pub kai_reservation_namespaces: Vec<String>,
}

impl LedgerArgs {
    pub fn policy(&self) -> Policy {
        Policy {
            names: ResourceNames {
                extra: self.extra_gpu_resources.clone(),
                dra_drivers: self
                    .dra_gpu_drivers
                    .iter()
                    .map(|d| d.trim().to_string())
                    .filter(|d| !d.is_empty())
                    .collect(),
            },
            slices: SliceTable {
                overrides: self.mig_compute_slices.clone(),
            },
            idle_threshold: self.idle_threshold,
            min_coverage: self.min_coverage,
            max_staleness: self.max_staleness,
            stuck_after: self.stuck_after,
            // Pods of other namespaces are not seen: they may hold any device or capacity.
            claims_scope: if self.namespaces.is_empty() {
                ClaimsScope::Complete
            } else {
                ClaimsScope::Namespaces
            },
            kai_reservation_namespaces: self
                .kai_reservation_namespaces
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
        }
    }
}

/// `gpu-ledger serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub ledger: LedgerArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Address of the HTTP server (/, /metrics, /healthz, /readyz, /api/v1/ledger).
    #[arg(
        long,
        env = "GPU_LEDGER_LISTEN",
        default_value = "0.0.0.0:8080",
        help_heading = "Server"
    )]
    pub listen: SocketAddr,
    /// How often to query Prometheus and rebuild the ledger.
    #[arg(long, env = "GPU_LEDGER_REFRESH_INTERVAL", default_value = "30s", value_parser = positive_duration, help_heading = "Server")]
    pub refresh_interval: chrono::Duration,
    /// How often to count the GPUs with DCGM series but none of the fields read
    /// (`gpu_ledger_dcgm_devices_fields_missing`): one Prometheus query, at a refresh at most this
    /// often, since the count changes when an exporter is upgraded, not between refreshes.
    #[arg(long, env = "GPU_LEDGER_DCGM_FIELDS_CHECK_INTERVAL", default_value = "1m", value_parser = positive_duration, help_heading = "Server")]
    pub dcgm_fields_check_interval: chrono::Duration,
    /// This replica's shard (0-based); it owns nodes whose name hashes to it, and their pods.
    #[arg(
        long,
        env = "GPU_LEDGER_SHARD",
        default_value_t = 0,
        help_heading = "Server"
    )]
    pub shard: u32,
    /// Number of shards; 1 = no sharding. With more than one, every exported series carries
    /// `shard="<i>"`, so PromQL can add the shards (docs/metrics.md).
    #[arg(
        long,
        env = "GPU_LEDGER_TOTAL_SHARDS",
        default_value_t = 1,
        help_heading = "Server"
    )]
    pub total_shards: u32,
    /// With more than one shard: the DCGM label naming a device's node (or its exporter pod), by
    /// which each shard asks Prometheus only for its own nodes' devices; `none`: every shard
    /// reads every device and drops the others' (when no label names the node).
    #[arg(
        long,
        env = "GPU_LEDGER_SHARD_QUERY_SCOPE",
        default_value = "Hostname",
        value_parser = shard_query_scope,
        help_heading = "Server"
    )]
    pub shard_query_scope: String,
    #[command(flatten)]
    pub cull: CullArgs,
    /// PEM certificate (chain) to serve HTTPS on --listen; re-read when the file changes.
    #[arg(
        long,
        env = "GPU_LEDGER_TLS_CERT_FILE",
        requires = "tls_key_file",
        help_heading = "Server"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file; re-read when the file changes.
    #[arg(
        long,
        env = "GPU_LEDGER_TLS_KEY_FILE",
        requires = "tls_cert_file",
        help_heading = "Server"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// File holding a bearer token that requests to /api/v1/* must present (every path but
    /// /metrics, /healthz, /livez, /readyz); re-read when it changes.
    #[arg(long, env = "GPU_LEDGER_API_TOKEN_FILE", help_heading = "Server")]
    pub api_token_file: Option<PathBuf>,
    /// `kubernetes`: accept /api/v1/* callers whose bearer token passes a TokenReview and whose
    /// user may `get` the virtual resource `ledger` in group `gpu-ledger.io`
    /// (SubjectAccessReview).
    #[arg(long, env = "GPU_LEDGER_API_AUTH", value_enum, ignore_case = true, default_value_t = ApiAuthFlag::None, help_heading = "Server")]
    pub api_auth: ApiAuthFlag,
    /// Connections the HTTP server serves at once; 64 more get a 2 s header deadline and one
    /// request, and beyond those new connections are closed at once (docs/security.md).
    #[arg(
        long,
        env = "GPU_LEDGER_MAX_CONNECTIONS",
        default_value_t = 512,
        value_parser = clap::value_parser!(u32).range(1..=65_536),
        help_heading = "Server"
    )]
    pub max_connections: u32,
    /// Longest a write to an HTTP client may make no progress; then the connection is dropped
    /// with the answer it held (a client that stops reading).
    #[arg(long, env = "GPU_LEDGER_WRITE_TIMEOUT", default_value = "10s", value_parser = positive_duration, help_heading = "Server")]
    pub write_timeout: chrono::Duration,
    /// Large answers (/, /metrics, /api/v1/ledger, /api/v1/history) rendered or being sent at
    /// once; a request waits up to 5 s for a slot, then gets 503 with Retry-After.
    #[arg(
        long,
        env = "GPU_LEDGER_MAX_INFLIGHT_RESPONSES",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..=4096),
        help_heading = "Server"
    )]
    pub max_inflight_responses: u32,
}

/// `--api-auth`: how API callers are checked besides `--api-token-file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApiAuthFlag {
    /// Only `--api-token-file` (if given).
    None,
    /// TokenReview + SubjectAccessReview against the Kubernetes API.
    Kubernetes,
}

/// Culling flags of `serve` (see docs/culling.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Culling")]
pub struct CullArgs {
    /// Culling of idle GPU notebooks: off, dry-run (log, export, events) or on.
    #[arg(long = "cull", env = "GPU_LEDGER_CULL", value_enum, ignore_case = true, default_value_t = CullModeFlag::Off)]
    pub mode: CullModeFlag,
    #[command(flatten)]
    pub policy: CullPolicyArgs,
    /// Never cull in namespaces matching this label selector (e.g. `gpu-ledger.io/cull=false`).
    #[arg(long, env = "GPU_LEDGER_CULL_NAMESPACE_SELECTOR")]
    pub cull_namespace_selector: Option<String>,
    /// Kill switch: a ConfigMap (`NAME` in the Lease's namespace, or `NAMESPACE/NAME`) whose key
    /// `cull: off` stops all culling writes from the next cycle, without a restart.
    #[arg(
        long,
        env = "GPU_LEDGER_CULL_KILL_SWITCH",
        value_name = "[NAMESPACE/]CONFIGMAP",
        value_parser = configmap_ref
    )]
    pub cull_kill_switch: Option<ConfigMapRef>,
    /// Name of the coordination.k8s.io Lease that elects the acting replica.
    #[arg(long, env = "GPU_LEDGER_LEASE_NAME", default_value = "gpu-ledger")]
    pub lease_name: String,
    /// Namespace of the Lease (defaults to the pod's namespace).
    #[arg(long, env = "GPU_LEDGER_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// File holding the URL every notice before a stop is also posted to (mount it from a
    /// Secret; the URL itself is never a flag and never logged).
    #[arg(
        long,
        env = "GPU_LEDGER_CULL_NOTICE_WEBHOOK_URL_FILE",
        value_name = "PATH",
        help_heading = "Culling"
    )]
    pub cull_notice_webhook_url_file: Option<std::path::PathBuf>,
    /// Body of the notice webhook: alertmanager (webhook_config, version 4) or slack (text).
    #[arg(long, env = "GPU_LEDGER_CULL_NOTICE_WEBHOOK_FORMAT", value_enum, ignore_case = true, default_value_t = WebhookFormatFlag::Alertmanager, help_heading = "Culling")]
    pub cull_notice_webhook_format: WebhookFormatFlag,
}

/// `--cull-notice-webhook-format` (mapped onto the culler's own format by `app`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WebhookFormatFlag {
    /// Alertmanager's webhook body (version 4).
    Alertmanager,
    /// Slack's incoming-webhook body.
    Slack,
}

/// The culling rules a plan applies: shared by `serve --cull` and `report --cull-dry-run`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Culling")]
pub struct CullPolicyArgs {
    /// A notebook's GPUs must be proven idle this long before it is stopped.
    #[arg(long, env = "GPU_LEDGER_CULL_IDLE_AFTER", default_value = "2h", value_parser = positive_duration)]
    pub cull_idle_after: chrono::Duration,
    /// Minimum time Running+Ready since the later of pod start and our last stop.
    #[arg(long, env = "GPU_LEDGER_CULL_MIN_RUNTIME", default_value = "1h", value_parser = duration)]
    pub cull_min_runtime: chrono::Duration,
    /// At most this many stops per refresh cycle (and never more than one per namespace).
    #[arg(long, env = "GPU_LEDGER_CULL_MAX_PER_CYCLE", default_value_t = 3)]
    pub cull_max_per_cycle: usize,
    /// Only cull in these namespaces (comma-separated); empty = all.
    #[arg(long, env = "GPU_LEDGER_CULL_NAMESPACES", value_delimiter = ',')]
    pub cull_namespaces: Vec<String>,
    /// Never cull in these namespaces (comma-separated).
    #[arg(
        long,
        env = "GPU_LEDGER_CULL_EXCLUDE_NAMESPACES",
        value_delimiter = ','
    )]
    pub cull_exclude_namespaces: Vec<String>,
    /// Notice before a stop: annotate the notebook and publish a Warning Event this long before
    /// stopping it (0 = stop without notice). Never shortens --cull-idle-after.
    #[arg(long, env = "GPU_LEDGER_CULL_NOTICE", default_value = "0s", value_parser = duration, help_heading = "Culling")]
    pub cull_notice: chrono::Duration,
    /// A `gpu-ledger.io/snooze-until` counts at most this long after the notebook first
    /// qualified for a stop (0 = no bound).
    #[arg(long, env = "GPU_LEDGER_CULL_MAX_SNOOZE", default_value = "0s", value_parser = duration, help_heading = "Culling")]
    pub cull_max_snooze: chrono::Duration,
    /// When an idle notebook is stopped: `idle` (whenever idle long enough) or `demand` (only
    /// when a pending GPU pod would fit by stopping it; see docs/culling.md).
    #[arg(long, env = "GPU_LEDGER_CULL_WHEN", value_enum, ignore_case = true, default_value_t = CullWhenFlag::Idle, help_heading = "Culling")]
    pub cull_when: CullWhenFlag,
    /// Activity veto: do not stop an owner whose own controller recorded activity within
    /// --cull-idle-after (a Notebook's `notebooks.kubeflow.org/last-activity`, kernel activity
    /// only), however idle its GPUs. `--cull-respect-activity=false` stops on GPU idleness alone.
    #[arg(
        long,
        env = "GPU_LEDGER_CULL_RESPECT_ACTIVITY",
        default_value_t = true,
        default_missing_value = "true",
        num_args = 0..=1,
        require_equals = true,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new(),
        help_heading = "Culling"
    )]
    pub cull_respect_activity: bool,
    /// The kinds culling may stop, comma-separated target names (`notebook`, `workspace`,
    /// `raycluster`);
    /// empty = every registered kind. Grant the culling RBAC of these only (chart:
    /// `culling.targets`).
    #[arg(
        long,
        env = "GPU_LEDGER_CULL_TARGETS",
        value_delimiter = ',',
        value_name = "KIND",
        help_heading = "Culling"
    )]
    pub cull_targets: Vec<String>,
}

/// `--cull-when` (mapped onto the culler's own type by `app`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CullWhenFlag {
    /// Stop a notebook whenever its GPUs are proven idle long enough.
    Idle,
    /// Stop an idle notebook only for a pending GPU pod that would fit by stopping it.
    Demand,
}

/// `--cull`: what culling may do (mapped onto the culler's own mode by `app`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CullModeFlag {
    /// Plan, log and export only.
    #[value(alias = "false")]
    Off,
    /// Also re-check and publish `IdleGPUWouldStop` Events; never stop.
    #[value(aliases = ["dryrun", "dry_run"])]
    DryRun,
    /// Stop idle notebooks.
    #[value(alias = "true")]
    On,
}

/// A ConfigMap named on the command line, with its namespace when one was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    pub namespace: Option<String>,
    pub name: String,
}

impl ConfigMapRef {
    /// `(namespace, name)`, a bare name living in `default_namespace`.
    pub fn resolve(&self, default_namespace: &str) -> (String, String) {
        (
            self.namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_string()),
            self.name.clone(),
        )
    }
}

/// Parses `CONFIGMAP` or `NAMESPACE/CONFIGMAP` (the value parser of `--cull-kill-switch`).
pub fn configmap_ref(value: &str) -> Result<ConfigMapRef, String> {
    let value = value.trim();
    let parts: Vec<&str> = value.split('/').collect();
    match parts.as_slice() {
        [name] if !name.is_empty() => Ok(ConfigMapRef {
            namespace: None,
            name: (*name).to_string(),
        }),
        [ns, name] if !ns.is_empty() && !name.is_empty() => Ok(ConfigMapRef {
            namespace: Some((*ns).to_string()),
            name: (*name).to_string(),
        }),
        _ => Err(format!(
            "--cull-kill-switch {value:?}: expected CONFIGMAP or NAMESPACE/CONFIGMAP"
        )),
    }
}

/// Output format of `report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Who holds what, then per-node and per-namespace totals.
    Table,
    /// The table with device UUIDs, attribution and memory per pod.
    Wide,
    /// The JSON contract of docs/report-json.md.
    Json,
    /// Prometheus text exposition of the ledger families (e.g. for a node_exporter textfile).
    Metrics,
    /// The page `serve` shows at `/`, as one self-contained HTML file.
    Html,
    /// The JSON document (`-o json`) as YAML: the same data.
    Yaml,
}

/// `gpu-ledger report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub ledger: LedgerArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub input: DumpArgs,
    /// Report as of this instant (RFC 3339). Offline default: the newest DCGM sample; live, Prometheus
    /// is read as of this instant (the claims are the cluster's current state).
    #[arg(long, env = "GPU_LEDGER_AT", value_parser = rfc3339, help_heading = "Output")]
    pub at: Option<DateTime<Utc>>,
    /// Output format. `json`, `yaml` and `metrics` print nothing else on stdout (warnings go to
    /// stderr).
    #[arg(short = 'o', long, env = "GPU_LEDGER_OUTPUT", value_enum, default_value_t = Output::Table, help_heading = "Output")]
    pub output: Output,
    /// Also show what `--cull=dry-run` would stop: a section of the table, a `cull` object in
    /// the JSON, `gpu_ledger_cull_*` families (and the plan on stderr) with `-o metrics`.
    #[arg(long, env = "GPU_LEDGER_CULL_DRY_RUN", help_heading = "Culling")]
    pub cull_dry_run: bool,
    #[command(flatten)]
    pub cull: CullPolicyArgs,
    /// Largest dump file accepted (each file), e.g. `512MiB`, `2GiB`, or bytes; a larger one is
    /// refused before it is parsed (docs/security.md).
    #[arg(long, env = "GPU_LEDGER_MAX_DUMP_SIZE", default_value = "1GiB", value_parser = byte_size, help_heading = "Offline input")]
    pub max_dump_size: u64,
    /// Show only this namespace: its pods, totals, quotas and pending pods' reclaim rows, the
    /// summary counting its GPUs; nodes stay whole, as node free counts every pod. Unlike
    /// `--namespaces`, the ledger is still built from every pod. An unknown namespace is an error.
    #[arg(
        short = 'n',
        long = "namespace",
        env = "GPU_LEDGER_NAMESPACE",
        value_name = "NAMESPACE",
        help_heading = "Output"
    )]
    pub namespace: Option<String>,
    /// Without --prometheus-url: query this Prometheus Service through the API server's service
    /// proxy, `NAMESPACE/NAME[:PORT]` (port by name or number; default the Service's Prometheus
    /// port). No Service is searched for.
    #[arg(
        long,
        env = "GPU_LEDGER_PROMETHEUS_SERVICE",
        value_name = "NAMESPACE/NAME[:PORT]",
        conflicts_with = "prometheus_url",
        help_heading = "Prometheus"
    )]
    pub prometheus_service: Option<crate::usage::discover::ServiceRef>,
    /// Without --prometheus-url or --prometheus-service: the only namespaces searched for the
    /// well-known Prometheus Services, first match first (comma-separated or repeated). A
    /// Service elsewhere is never chosen: any user may create one in their own namespace.
    #[arg(
        long,
        env = "GPU_LEDGER_PROMETHEUS_NAMESPACE",
        value_name = "NAMESPACE",
        value_delimiter = ',',
        default_values = crate::usage::discover::DEFAULT_NAMESPACES,
        value_parser = crate::usage::discover::namespace_name,
        help_heading = "Prometheus"
    )]
    pub prometheus_namespace: Vec<String>,
}

/// Dump files of the offline `report`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Offline input")]
pub struct DumpArgs {
    /// Read `DIR/{pods,nodes,notebooks,quotas,statefulsets}.{json,yaml}` and `DIR/dcgm.prom`
    /// (as `gpu-ledger capture --out DIR` writes them), and the DRA dumps
    /// `DIR/{resourceclaims,resourceslices,deviceclasses}.json` when present.
    #[arg(long, env = "GPU_LEDGER_FROM", value_name = "DIR", conflicts_with_all = ["pods", "nodes"])]
    pub from: Option<PathBuf>,
    /// `kubectl get pods -A -o json|yaml` dump.
    #[arg(long, env = "GPU_LEDGER_PODS", value_name = "FILE", requires_all = ["nodes", "dcgm"])]
    pub pods: Option<PathBuf>,
    /// `kubectl get nodes -o json|yaml` dump.
    #[arg(long, env = "GPU_LEDGER_NODES", value_name = "FILE", requires = "pods")]
    pub nodes: Option<PathBuf>,
    /// `kubectl get notebooks.kubeflow.org -A -o json|yaml` dump.
    #[arg(
        long,
        env = "GPU_LEDGER_NOTEBOOKS",
        value_name = "FILE",
        requires = "pods"
    )]
    pub notebooks: Option<PathBuf>,
    /// `kubectl get resourcequotas -A -o json|yaml` dump.
    #[arg(
        long,
        env = "GPU_LEDGER_QUOTAS",
        value_name = "FILE",
        requires = "pods"
    )]
    pub quotas: Option<PathBuf>,
    /// `kubectl get statefulsets -A -o json|yaml` dump (verifies notebook ownership).
    #[arg(
        long,
        env = "GPU_LEDGER_STATEFULSETS",
        value_name = "FILE",
        requires = "pods"
    )]
    pub statefulsets: Option<PathBuf>,
    /// dcgm-exporter `/metrics` or Prometheus `/federate` dump (either label scheme), or the
    /// `dcgm.prom` history `capture` writes.
    #[arg(long, env = "GPU_LEDGER_DCGM", value_name = "FILE", requires = "pods")]
    pub dcgm: Option<PathBuf>,
}

impl DumpArgs {
    /// True when the report reads files rather than a live cluster.
    pub fn offline(&self) -> bool {
        self.from.is_some() || self.pods.is_some()
    }
}

/// `gpu-ledger capture`.
#[derive(Debug, Clone, Args)]
pub struct CaptureArgs {
    /// Directory to write (created if missing; existing capture files in it are replaced).
    #[arg(long, env = "GPU_LEDGER_CAPTURE_OUT", value_name = "DIR")]
    pub out: PathBuf,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// How much DCGM history to write, ending at `--at`: at least the report's `--window`; the
    /// live service reads `--history-lookback` (24h) of it to tell how long a GPU has been idle.
    #[arg(long, env = "GPU_LEDGER_HISTORY_LOOKBACK", default_value = "24h", value_parser = duration, help_heading = "Capture")]
    pub history_lookback: chrono::Duration,
    /// End of the DCGM history (RFC 3339; default now). The claims are always the cluster's
    /// current state.
    #[arg(long, env = "GPU_LEDGER_AT", value_parser = rfc3339, help_heading = "Capture")]
    pub at: Option<DateTime<Utc>>,
    /// Namespaces to capture pods and quotas of (comma-separated); empty means all.
    #[arg(
        long,
        env = "GPU_LEDGER_NAMESPACES",
        value_delimiter = ',',
        help_heading = "Capture"
    )]
    pub namespaces: Vec<String>,
    /// Extra resource names counted as whole GPUs (comma-separated): pods claiming them are captured.
    #[arg(
        long,
        env = "GPU_LEDGER_EXTRA_GPU_RESOURCES",
        value_delimiter = ',',
        help_heading = "Capture"
    )]
    pub extra_gpu_resources: Vec<String>,
    /// Kueue's manager ConfigMap to capture, `[NAMESPACE/]NAME` (its `deviceClassMappings`);
    /// empty: not captured.
    #[arg(
        long,
        env = "GPU_LEDGER_KUEUE_CONFIG_MAP",
        default_value = "kueue-system/kueue-manager-config",
        value_parser = kueue_config_map,
        help_heading = "Capture"
    )]
    pub kueue_config_map: KueueConfigMap,
}

/// Output format of `showback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShowbackOutput {
    /// An aligned table, then the period, its coverage and every gap.
    Table,
    /// One line per group and a `total` line, each with the period and its coverage.
    Csv,
    /// The JSON document of docs/showback.md.
    Json,
}

/// When `showback` prints the progress of its queries on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Progress {
    /// When stderr is a terminal.
    Auto,
    Always,
    Never,
}

/// `gpu-ledger showback`.
#[derive(Debug, Clone, Args)]
pub struct ShowbackArgs {
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Calendar month (UTC): `YYYY-MM`, `last` (the previous month) or `this` (so far).
    #[arg(
        long,
        env = "GPU_LEDGER_SHOWBACK_MONTH",
        value_name = "YYYY-MM|last|this",
        conflicts_with_all = ["since", "until"],
        required_unless_present = "since",
        help_heading = "Showback period"
    )]
    pub month: Option<String>,
    /// Start of the period (RFC 3339).
    #[arg(long, env = "GPU_LEDGER_SHOWBACK_SINCE", value_parser = rfc3339, help_heading = "Showback period")]
    pub since: Option<DateTime<Utc>>,
    /// End of the period (RFC 3339; default now).
    #[arg(long, env = "GPU_LEDGER_SHOWBACK_UNTIL", value_parser = rfc3339, requires = "since", help_heading = "Showback period")]
    pub until: Option<DateTime<Utc>>,
    /// Step at which gaps (gpu-ledger not reporting) and the peak are found; must be longer
    /// than Prometheus' scrape interval of gpu-ledger.
    #[arg(long, env = "GPU_LEDGER_SHOWBACK_RESOLUTION", default_value = "5m", value_parser = positive_duration, help_heading = "Showback period")]
    pub resolution: chrono::Duration,
    /// Share of the period gpu-ledger must have reported in (`0.95` or `95%`); below it the
    /// showback is marked partial in every format and the command exits 4.
    #[arg(long, env = "GPU_LEDGER_SHOWBACK_MIN_COVERAGE", default_value = "95%", value_parser = share, value_name = "SHARE", help_heading = "Showback period")]
    pub min_coverage: f64,
    /// Group namespaces by this namespace label (read from kube-state-metrics'
    /// `kube_namespace_labels`, which must allow it: `--metric-labels-allowlist=namespaces=[team]`).
    #[arg(
        long,
        env = "GPU_LEDGER_SHOWBACK_GROUP_BY_LABEL",
        value_name = "KEY",
        conflicts_with = "group_by_profile_owner",
        help_heading = "Showback grouping"
    )]
    pub group_by_label: Option<String>,
    /// Group namespaces by the `owner` annotation the Kubeflow Profile controller writes (read
    /// from `kube_namespace_annotations`: `--metric-annotations-allowlist=namespaces=[owner]`).
    #[arg(
        long,
        env = "GPU_LEDGER_SHOWBACK_GROUP_BY_PROFILE_OWNER",
        help_heading = "Showback grouping"
    )]
    pub group_by_profile_owner: bool,
    /// Price per GPU-hour by GPU model, `MODEL=PRICE` comma-separated (e.g.
    /// `A100=2.10,RTX-A1000=0.25`); MODEL matches whole words of the node's
    /// `nvidia.com/gpu.product`.
    #[arg(
        long,
        env = "GPU_LEDGER_SHOWBACK_PRICE",
        value_name = "MODEL=PRICE,…",
        conflicts_with = "price_file",
        help_heading = "Showback cost"
    )]
    pub price: Option<String>,
    /// File of `MODEL=PRICE` lines (`#` comments), instead of --price.
    #[arg(
        long,
        env = "GPU_LEDGER_SHOWBACK_PRICE_FILE",
        value_name = "FILE",
        help_heading = "Showback cost"
    )]
    pub price_file: Option<PathBuf>,
    /// Output format. `csv` and `json` print nothing else on stdout (notes go to stderr).
    #[arg(short = 'o', long, env = "GPU_LEDGER_OUTPUT", value_enum, default_value_t = ShowbackOutput::Table, help_heading = "Output")]
    pub output: ShowbackOutput,
    /// Write the output to this file instead of stdout (e.g. for a CronJob's next container,
    /// which mails or posts it; the image has no shell to redirect with).
    #[arg(
        long,
        env = "GPU_LEDGER_SHOWBACK_OUTPUT_FILE",
        value_name = "FILE",
        help_heading = "Output"
    )]
    pub output_file: Option<PathBuf>,
    /// Progress of the Prometheus queries on stderr (a month can take a while): `auto` shows it
    /// when stderr is a terminal.
    #[arg(long, env = "GPU_LEDGER_SHOWBACK_PROGRESS", value_enum, default_value_t = Progress::Auto, help_heading = "Output")]
    pub progress: Progress,
}

/// `gpu-ledger completions`.
#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// Shell to print the completion script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Longest duration any flag accepts: times are computed from now plus or minus these, and a
/// year is far beyond any window, lookback or grace that makes sense.
pub const MAX_DURATION_DAYS: i64 = 366;

/// Parses `10m`, `2h`, `30s` (humantime), from 0 up to [`MAX_DURATION_DAYS`].
pub fn duration(s: &str) -> Result<chrono::Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 30s, 10m or 2h: {e}"))?;
    let d = chrono::Duration::from_std(d).map_err(|e| format!("{s:?} is too long: {e}"))?;
    if d > chrono::Duration::days(MAX_DURATION_DAYS) {
        return Err(format!(
            "{s:?} is too long (at most {MAX_DURATION_DAYS} days)"
        ));
    }
    Ok(d)
}

/// A [`duration`] that must be more than zero (windows, intervals, timeouts).
pub fn positive_duration(s: &str) -> Result<chrono::Duration, String> {
    let d = duration(s)?;
    if d <= chrono::Duration::zero() {
        return Err(format!("{s:?} must be longer than zero"));
    }
    Ok(d)
}

/// `none`, or a Prometheus label name (`--shard-query-scope`).
pub fn shard_query_scope(s: &str) -> Result<String, String> {
    let label_name = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if label_name {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is neither a Prometheus label name nor none"))
    }
}

/// Kueue's manager ConfigMap (`--kueue-config-map`); `None`: not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KueueConfigMap(pub Option<ConfigMapRef>);

/// Namespace of a bare `--kueue-config-map` name: where Kueue's manifests install it.
pub const KUEUE_NAMESPACE: &str = "kueue-system";

impl KueueConfigMap {
    /// `(namespace, name)` of the ConfigMap to read, if any.
    pub fn resolve(&self) -> Option<(String, String)> {
        self.0.as_ref().map(|c| c.resolve(KUEUE_NAMESPACE))
    }
}

/// Parses `--kueue-config-map`: `[NAMESPACE/]NAME`, or empty for none.
pub fn kueue_config_map(s: &str) -> Result<KueueConfigMap, String> {
    if s.trim().is_empty() {
        return Ok(KueueConfigMap(None));
    }
    configmap_ref(s).map(|c| KueueConfigMap(Some(c)))
}

/// Parses `PRODUCT=SLICES` with SLICES in 1..=8.
pub fn product_slices(s: &str) -> Result<(String, u8), String> {
    let (product, slices) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not PRODUCT=SLICES (e.g. A30=4)"))?;
    let product = product.trim();
    let slices: u8 = slices
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: {slices:?} is not a number of compute slices"))?;
    if product.is_empty() || !(1..=8).contains(&slices) {
        return Err(format!(
            "{s:?}: expected a product name and 1 to 8 compute slices"
        ));
    }
    Ok((product.to_string(), slices))
}

/// Parses a size: bytes, or a number with `KiB`, `MiB`, `GiB` (1024-based) or `KB`, `MB`, `GB`
/// (1000-based).
pub fn byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 512MiB, 2GiB or 1000000"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
            ));
        }
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a ratio in 0..=1.
pub fn ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    // NaN fails the range check too.
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is outside 0..1"))
    }
}

/// A [`ratio`], or a percentage (`95%`).
pub fn share(s: &str) -> Result<f64, String> {
    match s.trim().strip_suffix('%') {
        Some(p) => {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a percentage"))?;
            if (0.0..=100.0).contains(&v) {
                Ok(v / 100.0)
            } else {
                Err(format!("{s} is outside 0%..100%"))
            }
        }
        None => ratio(s.trim()),
    }
}

/// A [`ratio`] that must be more than zero (a coverage of 0 would call a GPU with no data idle).
pub fn positive_ratio(s: &str) -> Result<f64, String> {
    let v = ratio(s)?;
    if v <= 0.0 {
        return Err(format!("{s} must be above 0"));
    }
    Ok(v)
}

/// Parses an RFC 3339 instant.
pub fn rfc3339(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time like 2026-11-30T12:00:00Z: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_an_env_var() {
        let cmd = Cli::command();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                // Positional arguments (`completions <SHELL>`) are not settings.
                if matches!(id, "help" | "version") || arg.is_positional() {
                    continue;
                }
                assert!(
                    arg.get_env().is_some(),
                    "{} --{id} has no env var",
                    sub.get_name()
                );
            }
        }
    }

    #[test]
    fn the_kueue_config_map_is_namespace_slash_name_by_default_kueues() {
        let cli = Cli::try_parse_from(["gpu-ledger", "report", "--from", "x"]).expect("parse");
        let Command::Report(r) = cli.command else {
            panic!("report")
        };
        assert_eq!(
            r.ledger.kueue_config_map.resolve(),
            Some(("kueue-system".into(), "kueue-manager-config".into()))
        );
        assert_eq!(kueue_config_map(""), Ok(KueueConfigMap(None)));
        assert_eq!(
            kueue_config_map("my-kueue-config").map(|c| c.resolve()),
            Ok(Some(("kueue-system".into(), "my-kueue-config".into())))
        );
        assert!(kueue_config_map("a/b/c").is_err());
    }

    #[test]
    fn parsers_reject_bad_values() {
        assert!(duration("10m").is_ok());
        assert!(duration("ten minutes").is_err());
        assert!(ratio("1.5").is_err());
        assert!(rfc3339("yesterday").expect_err("bad").contains("RFC 3339"));
        let err = Cli::try_parse_from(["gpu-ledger", "report", "--from", "x", "--at", "nope"])
            .expect_err("bad --at");
        assert!(err.to_string().contains("RFC 3339"), "{err}");
    }

    #[test]
    fn impossible_durations_ratios_and_slices_are_rejected() {
        for flag in [
            "--window",
            "--scrape-interval",
            "--max-staleness",
            "--history-lookback",
            "--prometheus-timeout",
        ] {
            for bad in ["0s", "0", "400d"] {
                let err = Cli::try_parse_from(["gpu-ledger", "report", "--from", "x", flag, bad])
                    .expect_err(bad);
                assert!(
                    err.to_string().contains("zero") || err.to_string().contains("too long"),
                    "{flag} {bad}: {err}"
                );
            }
        }
        for bad in ["0s", "-1s"] {
            assert!(
                Cli::try_parse_from(["gpu-ledger", "serve", "--refresh-interval", bad]).is_err()
            );
        }
        assert!(
            Cli::try_parse_from(["gpu-ledger", "report", "--from", "x", "--stuck-after", "0s"])
                .is_ok()
        );
        for bad in ["0", "NaN", "-0.1", "1.5"] {
            assert!(
                Cli::try_parse_from(["gpu-ledger", "report", "--from", "x", "--min-coverage", bad])
                    .is_err(),
                "{bad}"
            );
        }
        assert!(
            Cli::try_parse_from([
                "gpu-ledger",
                "report",
                "--from",
                "x",
                "--idle-threshold",
                "NaN"
            ])
            .is_err()
        );
        assert_eq!(product_slices("A30=4"), Ok(("A30".into(), 4)));
        for bad in ["A30", "=4", "A30=0", "A30=9", "A30=x"] {
            assert!(product_slices(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(byte_size("1GiB"), Ok(1 << 30));
        assert_eq!(byte_size("512MiB"), Ok(512 << 20));
        assert_eq!(byte_size("2MB"), Ok(2_000_000));
        assert_eq!(byte_size("100"), Ok(100));
        assert_eq!(byte_size(" 7 KiB "), Ok(7 << 10));
        for bad in ["", "GiB", "1.5GiB", "-1", "1TiB", "99999999999999999999GiB"] {
            assert!(byte_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kill_switch_flag_names_a_configmap() {
        let parsed = configmap_ref("ops/gpu-ledger-cull").expect("ns/name");
        assert_eq!(
            parsed.resolve("gpu-ledger"),
            ("ops".into(), "gpu-ledger-cull".into())
        );
        let parsed = configmap_ref(" gpu-ledger-cull ").expect("name");
        assert_eq!(
            parsed.resolve("gpu-ledger"),
            ("gpu-ledger".into(), "gpu-ledger-cull".into()),
            "a bare name lives beside the Lease"
        );
        for bad in ["", "ops/", "/name", "a/b/c"] {
            let e = configmap_ref(bad).expect_err(bad);
            assert!(e.contains("--cull-kill-switch"), "{e}");
        }
    }

    #[test]
    fn cull_mode_accepts_its_aliases_in_any_case() {
        for (value, mode) in [
            ("off", CullModeFlag::Off),
            ("FALSE", CullModeFlag::Off),
            ("dry-run", CullModeFlag::DryRun),
            ("DRY-RUN", CullModeFlag::DryRun),
            ("dry_run", CullModeFlag::DryRun),
            ("on", CullModeFlag::On),
            ("true", CullModeFlag::On),
        ] {
            let cli = Cli::try_parse_from(["gpu-ledger", "serve", "--cull", value])
                .unwrap_or_else(|e| panic!("--cull {value}: {e}"));
            let Command::Serve(args) = cli.command else {
                panic!("serve")
            };
            assert_eq!(args.cull.mode, mode, "--cull {value}");
        }
        assert!(Cli::try_parse_from(["gpu-ledger", "serve", "--cull", "maybe"]).is_err());
    }
}
