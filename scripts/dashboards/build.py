#!/usr/bin/env python3
"""Builds dashboards/gpu-ledger.json and deploy/grafana/dashboard-configmap.yaml.

The dashboard is written as data here (one place for every panel, query and description) and
rendered deterministically. `build.py --check` regenerates both files in memory and fails if the
committed copies differ (used by scripts/test-dashboards.sh).

Queries use the recording rules of alerts/gpu-ledger.rules.yaml where noted; load those rules.
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "gpu-ledger.json"
CONFIGMAP = ROOT / "deploy" / "grafana" / "dashboard-configmap.yaml"

DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'
NODE = 'node=~"$node"'
# GPU equivalents held per pod (running + terminating), replicas de-duplicated.
HELD = ('sum by (namespace, pod, node, state) (max by (namespace, pod, node, state, resource) '
        '(gpu_ledger_pod_gpus{state!="pending", %s, %s}))' % (NS, NODE))
DEV = "Hostname, hostname, UUID, gpu"  # device key; DCGM device-wide fields: max, never sum


# Every series selector gets the `cluster` variable, gpu-ledger's own families also `job`
# (kubernetes-mixin style: one dashboard for one cluster of a shared store, and for the scrape job
# that names gpu-ledger). Metric names: gpu_ledger_*, recording rules (level:metric:op), DCGM_*;
# label names never match these shapes.
CLUSTER = 'cluster=~"$cluster"'
JOB = 'job=~"$job"'
SELECTOR = re.compile(r'\b(gpu_ledger_\w+|[a-z_]+:[a-z0-9_]+:[a-z0-9_]+|DCGM_\w+)(\{[^}]*\})?')


def scoped(expr):
    def one(m):
        extra = [CLUSTER] + ([JOB] if m.group(1).startswith("gpu_ledger_") else [])
        inner = m.group(2)[1:-1].strip() if m.group(2) else ""
        return "%s{%s}" % (m.group(1), ", ".join(([inner] if inner else []) + extra))
    return SELECTOR.sub(one, expr)


def target(ref, expr, legend=None, instant=False, fmt=None):
    t = {"datasource": DS, "refId": ref, "expr": scoped(expr), "editorMode": "code", "range": not instant,
         "instant": instant}
    if legend:
        t["legendFormat"] = legend
    if fmt:
        t["format"] = fmt
    return t


def field_defaults(unit=None, decimals=None, custom=None, thresholds=None, minv=None, maxv=None, mappings=None):
    d = {"color": {"mode": "palette-classic"}, "mappings": mappings or []}
    if unit:
        d["unit"] = unit
    if decimals is not None:
        d["decimals"] = decimals
    if minv is not None:
        d["min"] = minv
    if maxv is not None:
        d["max"] = maxv
    if thresholds:
        d["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if custom is not None:
        d["custom"] = custom
    return d


GREEN = [{"color": "green", "value": None}]


def timeseries(title, description, targets, unit="short", stack=False, decimals=None, minv=0, maxv=None):
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
              "spanNulls": False}
    if minv is not None:
        custom["axisSoftMin"] = minv
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    return {"type": "timeseries", "title": title, "description": description, "datasource": DS,
            "fieldConfig": {"defaults": field_defaults(unit, decimals, custom, GREEN, maxv=maxv),
                            "overrides": []},
            "options": {"legend": {"displayMode": "table", "placement": "right", "showLegend": True,
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "targets": targets}


def stat(title, description, expr, unit="short", decimals=2, thresholds=None):
    return {"type": "stat", "title": title, "description": description, "datasource": DS,
            "fieldConfig": {"defaults": field_defaults(unit, decimals, None, thresholds or GREEN),
                            "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto"},
            "targets": [target("A", expr, title)]}


def table(title, description, targets, renames, units=None, sort=None, hide=()):
    """Instant table queries merged on their common labels."""
    overrides = []
    for name, unit in (units or {}).items():
        overrides.append({"matcher": {"id": "byName", "options": name},
                          "properties": [{"id": "unit", "value": unit}]})
    excl = {"Time": True}
    excl.update({h: True for h in hide})
    transformations = [{"id": "merge", "options": {}},
                       {"id": "organize", "options": {"excludeByName": excl, "renameByName": renames}}]
    p = {"type": "table", "title": title, "description": description, "datasource": DS,
         "fieldConfig": {"defaults": field_defaults(custom={"align": "auto", "filterable": True}),
                         "overrides": overrides},
         "options": {"showHeader": True, "cellHeight": "sm"},
         "transformations": transformations,
         "targets": targets}
    if sort:
        p["options"]["sortBy"] = [{"displayName": sort, "desc": True}]
    return p


def bargauge(title, description, expr, legend, unit="short"):
    return {"type": "bargauge", "title": title, "description": description, "datasource": DS,
            "fieldConfig": {"defaults": field_defaults(unit, 1, None, GREEN, minv=0), "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                        "valueMode": "color", "namePlacement": "auto", "sizing": "auto",
                        "minVizHeight": 16, "minVizWidth": 8, "maxVizHeight": 300},
            "targets": [target("A", expr, legend, instant=True)]}


def panels():
    out = []

    def add(p, w, h):
        out.append((p, w, h))

    # --- cluster at a glance (cluster-wide; the namespace/node variables do not apply)
    for title, desc, rec in [
        ("Allocatable GPUs", "How many GPU equivalents can the cluster's nodes offer (MIG g/7, time-slice 1/R)? Cluster-wide.", "cluster:gpu_ledger_gpus_allocatable:sum"),
        ("Claimed GPUs", "How many GPU equivalents are held by running and terminating pods right now? Cluster-wide.", "cluster:gpu_ledger_gpus_claimed:sum"),
        ("Free GPUs", "How many GPU equivalents can the scheduler still hand out (allocatable minus claimed)? Cluster-wide.", "cluster:gpu_ledger_gpus_free:sum"),
        ("Idle claimed GPUs", "How many claimed GPU equivalents are held by pods proven idle? Cluster-wide.", "cluster:gpu_ledger_gpus_idle:sum"),
        ("Pending GPU demand", "How many GPU equivalents do pending pods ask for? Cluster-wide.", "cluster:gpu_ledger_gpus_pending:sum"),
        ("Used GPUs", "How many GPU equivalents are actually busy (mean utilisation x claim, pods with known utilisation only)? Cluster-wide.", "cluster:gpu_ledger_gpus_used:sum"),
    ]:
        add(stat(title, desc, rec), 4, 4)

    add(timeseries(
        "Allocated vs used GPUs by namespace",
        "Which namespaces hold GPUs and how much of what they hold do they use? Claimed = GPU equivalents held by running and terminating pods; used = sum over pods of mean utilisation x GPU equivalents (pods with unknown utilisation are left out, never counted as 0). Uses the recording rules in alerts/gpu-ledger.rules.yaml.",
        [target("A", 'namespace:gpu_ledger_gpus_claimed:sum{%s}' % NS, "{{namespace}} claimed"),
         target("B", 'namespace:gpu_ledger_gpus_used:sum{%s}' % NS, "{{namespace}} used")],
        decimals=2), 24, 9)

    add(table(
        "Who holds GPUs now",
        "Who holds each GPU right now, are they using it, and for how long has it been idle? One row per pod holding GPUs (running or terminating) with its node, GPU equivalents, mean utilisation, memory, idle time and owning controller / Kubeflow notebook (from gpu_ledger_pod_owner_info). Empty utilisation means unknown, not idle.",
        [target("A", '(%s * on (namespace, pod) group_left (owner_kind, owner_name, notebook) max by (namespace, pod, owner_kind, owner_name, notebook) (gpu_ledger_pod_owner_info{%s})) or %s' % (HELD, NS, HELD), instant=True, fmt="table"),
         target("B", 'max by (namespace, pod, node) (gpu_ledger_pod_gpu_utilization_ratio{%s, %s})' % (NS, NODE), instant=True, fmt="table"),
         target("C", 'max by (namespace, pod, node) (gpu_ledger_pod_gpu_idle_seconds{%s, %s})' % (NS, NODE), instant=True, fmt="table"),
         target("D", 'max by (namespace, pod, node) (gpu_ledger_pod_gpu_memory_used_bytes{%s, %s})' % (NS, NODE), instant=True, fmt="table")],
        {"Value #A": "GPUs", "Value #B": "utilisation", "Value #C": "idle for", "Value #D": "memory used"},
        units={"utilisation": "percentunit", "idle for": "s", "memory used": "bytes"}, sort="idle for"), 24, 10)

    add(bargauge(
        "Idle GPU-hours by namespace (dashboard range)",
        "Which namespaces wasted the most GPU time in the selected time range? GPU-hours held while proven idle: the recording rule namespace:gpu_ledger_gpu_seconds_idle:increase1m summed over the range / 3600 (HA replicas once, shards and replaced replicas added).",
        'sort_desc(sum_over_time(namespace:gpu_ledger_gpu_seconds_idle:increase1m{%s}[$__range]) / 3600)' % NS,
        "{{namespace}}", unit="h"), 12, 8)
    add(timeseries(
        "Idle GPU-hours per hour by namespace",
        "When did each namespace hold idle GPUs? Idle GPU-hours over the trailing hour (recording rule namespace:gpu_ledger_gpu_hours_idle:increase1h).",
        [target("A", 'namespace:gpu_ledger_gpu_hours_idle:increase1h{%s}' % NS, "{{namespace}}")],
        unit="h", decimals=2), 12, 8)

    add(table(
        "Allocatable vs claimed vs free by node",
        "Where did the free cards go? Per node: allocatable GPU equivalents, claimed by running and terminating pods, free (what the scheduler sees), and unschedulable physical GPUs (present per GFD labels or DCGM, not offered by allocatable; empty when gpu-ledger does not export it).",
        [target("A", 'node:gpu_ledger_gpus_allocatable:sum{%s}' % NODE, instant=True, fmt="table"),
         target("B", 'node:gpu_ledger_gpus_claimed:sum{%s}' % NODE, instant=True, fmt="table"),
         target("C", 'node:gpu_ledger_gpus_free:sum{%s}' % NODE, instant=True, fmt="table"),
         target("D", 'node:gpu_ledger_gpus_unschedulable:sum{%s}' % NODE, instant=True, fmt="table")],
        {"Value #A": "allocatable", "Value #B": "claimed", "Value #C": "free", "Value #D": "unschedulable"}, sort="free"), 12, 8)
    add(timeseries(
        "Cluster GPUs: allocatable, claimed, free, idle, pending",
        "How has cluster GPU capacity been used over time, and was there pending demand while claimed GPUs sat idle?",
        [target("A", "cluster:gpu_ledger_gpus_allocatable:sum", "allocatable"),
         target("B", "cluster:gpu_ledger_gpus_claimed:sum", "claimed"),
         target("C", "cluster:gpu_ledger_gpus_free:sum", "free"),
         target("D", "cluster:gpu_ledger_gpus_idle:sum", "idle"),
         target("E", "cluster:gpu_ledger_gpus_pending:sum", "pending")], decimals=2), 12, 8)

    add(table(
        "GPUs present but not schedulable",
        "Which nodes have physical GPUs that no pod can be scheduled on? GPUs the node's GPU Feature Discovery labels (nvidia.com/gpu.count, MIG and time-slicing taken into account) or DCGM report, minus what its allocatable GPU resources offer: device plugin down or marking devices unhealthy, a stuck driver or MIG rollout, a card fallen off the bus. Only nodes with at least one; see runbook GpuLedgerGpusUnschedulable.",
        [target("A", 'node:gpu_ledger_gpus_unschedulable:sum{%s} > 0' % NODE, instant=True, fmt="table"),
         target("B", 'node:gpu_ledger_gpus_allocatable:sum{%s} and on (node) (node:gpu_ledger_gpus_unschedulable:sum{%s} > 0)' % (NODE, NODE), instant=True, fmt="table")],
        {"Value #A": "unschedulable GPUs", "Value #B": "allocatable"}, sort="unschedulable GPUs"), 12, 8)
    add(table(
        "Unclaimed busy GPUs",
        "Which GPUs are busy although no pod claims them (work outside the scheduler)? Devices above the idle threshold with no GPU pod; see runbook GpuLedgerUnclaimedBusyGpu.",
        [target("A", 'max by (node, uuid, gpu_instance) (gpu_ledger_unclaimed_busy_gpu_utilization_ratio{%s})' % NODE, instant=True, fmt="table")],
        {"Value #A": "utilisation"}, units={"utilisation": "percentunit"}, sort="utilisation"), 12, 8)

    stuck = 'and on (namespace, pod) (max by (namespace, pod) (gpu_ledger_pod_stuck_terminating) == 1)'
    add(table(
        "Stuck Terminating pods holding GPUs",
        "Which deleted pods still hold GPUs past their deletion deadline (plus --stuck-after)? A card is held until the pod object is gone; see runbook GpuLedgerStuckTerminatingHoldsGpu.",
        [target("A", 'max by (namespace, pod, node) (gpu_ledger_pod_terminating_seconds{%s, %s}) %s' % (NS, NODE, stuck), instant=True, fmt="table"),
         target("B", 'sum by (namespace, pod, node) (max by (namespace, pod, node, resource) (gpu_ledger_pod_gpus{state="terminating", %s, %s})) %s' % (NS, NODE, stuck), instant=True, fmt="table")],
        {"Value #A": "terminating for", "Value #B": "GPUs"}, units={"terminating for": "s"}, sort="terminating for"), 12, 8)
    add(table(
        "Pending GPU pods",
        "Which GPU pods are waiting to be scheduled, for how long, and how many GPU equivalents do they ask for? (The node filter does not apply: pending pods have no node.)",
        [target("A", 'max by (namespace, pod) (gpu_ledger_pod_pending_seconds{%s})' % NS, instant=True, fmt="table"),
         target("B", 'sum by (namespace, pod) (max by (namespace, pod, resource) (gpu_ledger_pod_gpus{state="pending", %s}))' % NS, instant=True, fmt="table")],
        {"Value #A": "pending for", "Value #B": "GPUs requested"}, units={"pending for": "s"}, sort="pending for"), 12, 8)

    xid = 'uuid_xid:dcgm_xid_events:new10m'
    xidkey = DEV + ", modelName, xid, xid_class"
    add(table(
        "XID events (dashboard range)",
        "Which GPUs had new XID errors in the selected range, of which class (hardware, memory, application, other; see docs/runbooks/dcgm-xid-classes.md)? From the recording rule uuid_xid:dcgm_xid_events:new10m: new events only, never the sticky last code of DCGM_FI_DEV_XID_ERRORS. Events: the most counted in one 10-minute window (1 where only the last-code gauge exists). Not filtered by node: DCGM's Hostname may be the exporter pod name.",
        [target("A", 'max by (%s) (max_over_time(%s[$__range]))' % (xidkey, xid), instant=True, fmt="table")],
        {"Value #A": "events", "xid_class": "class"}, sort="events"), 12, 8)
    add(timeseries(
        "GPU thermal slowdown",
        "Which GPUs does the driver slow down for heat? 1 while the software (0x20) or hardware (0x40) thermal-slowdown bit of the clock-event reasons is set (DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, per physical GPU); DcgmGpuThermalSlowdown fires when it recurs for 10m. GPUs whose exporter does not report the reasons have no line here (absent, not 0): see GPU temperature.",
        [target("A", 'uuid:dcgm_thermal_slowdown:active', "{{Hostname}}{{hostname}} gpu {{gpu}}")],
        decimals=0, maxv=1), 12, 8)

    add(timeseries(
        "GPU temperature",
        "Which GPUs run hot? Core temperature per physical GPU (max over MIG instances, never summed; DCGM_FI_DEV_GPU_TEMP or DCGM 4.7's DCGM_FI_DEV_GPU_TEMP_CELSIUS, from the recording rule uuid:dcgm_gpu_temp_celsius:max). For GPUs that report no clock-event reasons, DcgmGpuHot fires above 85 °C for 5m; the others alert on thermal slowdown itself. Not filtered by node: DCGM's Hostname may be the exporter pod name.",
        [target("A", 'max by (%s) (uuid:dcgm_gpu_temp_celsius:max)' % DEV, "{{Hostname}}{{hostname}} gpu {{gpu}}")],
        unit="celsius", minv=None), 8, 8)
    fbkey = DEV + ", GPU_I_ID"
    add(timeseries(
        "GPU framebuffer used",
        "Which GPUs (or MIG instances) are close to running out of memory? FB used / (used + free) per GPU and per MIG instance, in bytes whether the exporter reports MiB (DCGM_FI_DEV_FB_USED, _FREE) or bytes (DCGM 4.7's DCGM_FI_DEV_FB_USED_BYTES, _FREE_BYTES), from the recording rules uuid_gi:dcgm_fb_*_bytes:max; DcgmFramebufferNearlyFull fires above 95% for 10m.",
        [target("A", 'max by (%s) (uuid_gi:dcgm_fb_used_bytes:max) / (max by (%s) (uuid_gi:dcgm_fb_used_bytes:max) + max by (%s) (uuid_gi:dcgm_fb_free_bytes:max))' % (fbkey, fbkey, fbkey),
                "{{Hostname}}{{hostname}} gpu {{gpu}} {{GPU_I_ID}}")],
        unit="percentunit", maxv=1), 8, 8)
    # The workload is in exported_namespace/exported_pod when Prometheus scraped dcgm-exporter
    # without honor_labels (then namespace/pod name the exporter pod), in namespace/pod with
    # honor_labels (src/usage/scheme.rs). Both become workload_namespace/workload_pod; the
    # namespace/pod branch counts only where no series has exported_pod (the exported scheme's
    # namespace/pod would name the exporter), and GPUs without a workload keep their line.
    # With honor_labels a series without a workload keeps the target's namespace/pod, the exporter
    # pod: the GPU Operator's nvidia-dcgm-exporter-* and the dcgm-exporter chart's
    # dcgm-exporter-* pods are not workloads.
    # Field 1001 under its legacy name and DCGM 4.7's: one expression per name, joined by `or`
    # (the legacy name wins where an exporter emits both; a GPU switching names mid-range keeps
    # one line).
    wl = 'label_replace(label_replace(%s{%s!=""%s}, "workload_namespace", "$1", "%s", "(.*)"), "workload_pod", "$1", "%s", "(.*)")'
    by_workload = lambda act: ('max by (%s, workload_namespace, workload_pod) (%s or (%s unless on () %s{exported_pod!=""})) or on (%s) max by (%s) (%s)'
                               % (fbkey, wl % (act, "exported_pod", "", "exported_namespace", "exported_pod"),
                                  wl % (act, "pod", ', pod!~"(nvidia-)?dcgm-exporter-.*"', "namespace", "pod"), act, fbkey, fbkey, act))
    add(timeseries(
        "GPU activity by workload",
        "Which workloads keep their GPUs busy? DCGM_FI_PROF_GR_ENGINE_ACTIVE (or DCGM 4.7's DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO, 0..1) per GPU / MIG instance, labelled with the workload: exported_namespace/exported_pod or namespace/pod, whichever way dcgm-exporter is scraped (without or with honor_labels).",
        [target("A", '(%s) or (%s)' % (by_workload("DCGM_FI_PROF_GR_ENGINE_ACTIVE"), by_workload("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO")),
                "{{workload_namespace}}/{{workload_pod}} {{UUID}} {{GPU_I_ID}}")],
        unit="percentunit", maxv=1), 8, 8)

    add(stat("Seconds since last ledger refresh",
             "Is gpu-ledger's data fresh? Age of the last completed refresh; GpuLedgerRefreshStale fires above 300 s.",
             "time() - max(gpu_ledger_last_refresh_timestamp_seconds)", unit="s", decimals=0,
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 120},
                         {"color": "red", "value": 300}]), 8, 5)
    add(table("gpu-ledger sources",
              "Can gpu-ledger reach Kubernetes and Prometheus? 1 = the last refresh could use the source.",
              [target("A", "min by (source) (gpu_ledger_source_up)", instant=True, fmt="table")],
              {"Value #A": "up"}), 8, 5)
    add(timeseries("Culling circuit breaker",
                   "Is automatic culling of idle notebooks blocked, and why? 1 while the circuit breaker blocks culling.",
                   [target("A", "max by (reason) (gpu_ledger_cull_circuit_open)", "{{reason}}")],
                   decimals=0), 8, 5)

    # --- monthly showback: one row of 24 columns (pick "Previous month" or "This month so far"
    # as the time range). Titled rather than a Grafana row panel, which the checker does not cover.
    add(table(
        "Monthly showback: GPU-hours by namespace (dashboard range)",
        "Who held how many GPU-hours in the selected time range, how many were busy, how many sat idle? GPU-hours in GPU equivalents (MIG and time-slices count their share), from gpu-ledger's counters through the recording rules *:increase1m summed over the range (restart-safe; HA replicas counted once, shards and the replicas a rollout replaces added; docs/metrics.md). Busy is from gpu_ledger_gpu_seconds_by_model_total (empty for hours counted before it existed); claimed minus busy minus idle is unknown, never idle. Time when gpu-ledger was down is not counted: see the coverage panel, and `gpu-ledger showback` for the gaps and prices (docs/showback.md).",
        [target("A", 'sum_over_time(namespace:gpu_ledger_gpu_seconds_claimed:increase1m{%s}[$__range]) / 3600' % NS, instant=True, fmt="table"),
         target("B", 'sum by (namespace) (sum_over_time(namespace_model_activity:gpu_ledger_gpu_seconds:increase1m{%s, activity="busy"}[$__range])) / 3600' % NS, instant=True, fmt="table"),
         target("C", 'sum_over_time(namespace:gpu_ledger_gpu_seconds_idle:increase1m{%s}[$__range]) / 3600' % NS, instant=True, fmt="table"),
         # The share from the counters themselves (shards added, HA once): a rollout loses the
         # same part of both, so the ratio holds, and it has a value from the first scrape on.
         target("D", 'sum by (namespace) (max by (namespace, shard) (increase(gpu_ledger_gpu_seconds_idle_total{%s}[$__range]))) / (sum by (namespace) (max by (namespace, shard) (increase(gpu_ledger_gpu_seconds_claimed_total{%s}[$__range]))) > 0)' % (NS, NS), instant=True, fmt="table"),
         target("E", 'max_over_time(namespace:gpu_ledger_gpus_claimed:sum{%s}[$__range])' % NS, instant=True, fmt="table")],
        {"Value #A": "GPU-hours", "Value #B": "busy", "Value #C": "idle", "Value #D": "idle share", "Value #E": "peak GPUs"},
        units={"GPU-hours": "h", "busy": "h", "idle": "h", "idle share": "percentunit"}, sort="GPU-hours"), 12, 8)
    add(bargauge(
        "Monthly showback: GPU-hours by GPU model",
        "On which GPU models were the GPU-hours of the selected range held (the node's nvidia.com/gpu.product; `unknown` without GFD labels)? The model dimension `gpu-ledger showback --price` prices.",
        'sort_desc(sum by (model) (sum_over_time(namespace_model_activity:gpu_ledger_gpu_seconds:increase1m{%s}[$__range])) / 3600)' % NS,
        "{{model}}", unit="h"), 8, 8)
    add(stat("Monthly showback: coverage",
             "For what share of the selected range did gpu-ledger report (5-minute steps with a sample of gpu_ledger_last_refresh_timestamp_seconds)? Below 100%, GPU-hours in the gaps were not counted: unknown, not zero.",
             "count_over_time(group(gpu_ledger_last_refresh_timestamp_seconds)[$__range:5m]) / count_over_time(vector(1)[$__range:5m])",
             unit="percentunit", decimals=1,
             thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 0.95},
                         {"color": "green", "value": 0.99}]), 4, 8)
    # --- reclaimable demand (the reclaim planner; docs/report-json.md#reclaim): one layout row
    # of its own (16 + 8 columns), titled by its theme (the checker covers no Grafana row panel)
    add(timeseries("Reclaimable demand: pending GPUs that would run if idle holders stopped",
                   "Is GPU work waiting for cards that idle notebooks or stuck Terminating pods hold? GPU equivalents of pending pods that fit on no node now but would once stuck holders are cleared or proven-idle notebooks stopped (same GPU resource, node selector, affinity and taints). GpuLedgerPendingReclaimable fires after 30m; the report's Who could run names the node and the holders.",
                   [target("A", "max by (namespace) (gpu_ledger_pending_reclaimable_gpus{%s})" % NS, "{{namespace}}")]), 16, 8)
    add(stat("Reclaimable demand: pending GPUs now",
             "How many pending GPUs could run now if idle holders stopped? Sum over namespaces of gpu_ledger_pending_reclaimable_gpus (GPU equivalents).",
             "sum(max by (namespace) (gpu_ledger_pending_reclaimable_gpus{%s}))" % NS,
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.01}]), 8, 8)
    # --- quotas and queues (issue 25; docs/report-json.md#quotas-and-queues): one layout row
    # (12 + 8 + 4 columns)
    add(timeseries("Quotas and queues: GPUs held idle under a ResourceQuota",
                   "Is a namespace's GPU quota spent on GPUs that do nothing? GPU equivalents held on each quota's GPU resource by pods proven idle (gpu_ledger_quota_gpus kind=idle). GpuLedgerQuotaHeldIdle fires when the quota is also used up (status.used >= hard) for 1h.",
                   [target("A", 'max by (namespace, resource) (gpu_ledger_quota_gpus{kind="idle",%s})' % NS, "{{namespace}} {{resource}}")]), 12, 8)
    add(timeseries("Quotas and queues: Kueue admitted vs idle GPUs",
                   "How much of each Kueue ClusterQueue's admitted GPU quota (status.flavorsUsage, units) is held by pods proven idle (GPU equivalents)? Per ClusterQueue, summed over flavors and GPU resources. Cluster-wide (ClusterQueues are not namespaced).",
                   [target("A", 'sum by (cluster_queue) (max by (cluster_queue, flavor, resource) (gpu_ledger_queue_gpus{kind="admitted"}))', "{{cluster_queue}} admitted"),
                    target("B", 'sum by (cluster_queue) (max by (cluster_queue, flavor, resource) (gpu_ledger_queue_gpus{kind="idle"}))', "{{cluster_queue}} idle")]), 8, 8)
    add(stat("Quotas and queues: queues starved while a lender idles",
             "How many Kueue ClusterQueues have pending GPU workloads while another ClusterQueue of their cohort holds admitted GPUs proven idle? GpuLedgerQueueStarvedWhileLenderIdle fires after 15m.",
             "sum(max by (cluster_queue) (gpu_ledger_queue_starved_while_lender_idle))",
             decimals=0,
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}]), 4, 8)

    # lay out left to right, wrapping at 24 columns
    result, x, y, rowh = [], 0, 0, 0
    for i, (p, w, h) in enumerate(out, start=1):
        if x + w > 24:
            x, y, rowh = 0, y + rowh, 0
        p = {"id": i, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **p}
        result.append(p)
        x += w
        rowh = max(rowh, h)
    return result


def dashboard():
    def var_query(name, label, metric, desc):
        q = "label_values(%s, %s)" % (metric, label)
        return {"name": name, "label": label, "type": "query", "datasource": DS, "description": desc,
                "query": {"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                "refresh": 2, "sort": 1, "multi": True, "includeAll": True,
                "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "hide": 0, "options": [], "regex": ""}

    return {
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
            "type": "dashboard"}]},
        "description": "gpu-ledger: who holds each GPU, is it used, and where did the free cards go. Needs the recording rules in alerts/gpu-ledger.rules.yaml.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [{"title": "Runbooks", "type": "link", "icon": "doc", "targetBlank": True,
                   "url": "https://github.com/gpu-ledger/gpu-ledger/tree/main/docs/runbooks",
                   "asDropdown": False, "includeVars": False, "keepTime": False, "tags": [],
                   "tooltip": "gpu-ledger alert runbooks"}],
        "panels": panels(),
        "refresh": "1m",
        "schemaVersion": 39,
        "tags": ["gpu", "gpu-ledger", "kubernetes"],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "hide": 0, "includeAll": False, "multi": False, "options": [],
             "refresh": 1, "regex": "", "description": "Prometheus that scrapes gpu-ledger and dcgm-exporter"},
            var_query("namespace", "namespace", "gpu_ledger_namespace_gpus_claimed",
                      "Namespaces known to gpu-ledger (any GPU pod or a GPU quota)"),
            var_query("node", "node", "gpu_ledger_node_gpus_allocatable", "GPU nodes known to gpu-ledger"),
            # One cluster at a time (joins match on namespace/pod); "All" (.*) also matches series
            # without a cluster label, as in a single-cluster Prometheus.
            dict(var_query("cluster", "cluster", "gpu_ledger_build_info",
                           "Cluster (the `cluster` label of a store shared by several clusters; All where there is none)"),
                 multi=False, current={"selected": True, "text": "All", "value": "$__all"}),
            var_query("job", "job", "gpu_ledger_build_info", "Scrape job(s) of gpu-ledger"),
        ]},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": "gpu-ledger",
        "uid": "gpu-ledger",
        "version": 1,
        "weekStart": "",
    }


def render_dashboard():
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def render_configmap(dashboard_json):
    body = "".join("    " + line + "\n" if line else "\n" for line in dashboard_json.rstrip("\n").split("\n"))
    return ("# Generated by scripts/dashboards/build.py from dashboards/gpu-ledger.json: do not edit.\n"
            "# Grafana's dashboard sidecar (kube-prometheus-stack: sidecar.dashboards.enabled) loads\n"
            "# ConfigMaps labelled grafana_dashboard=\"1\".\n"
            "apiVersion: v1\n"
            "kind: ConfigMap\n"
            "metadata:\n"
            "  name: gpu-ledger-dashboard\n"
            "  labels:\n"
            "    grafana_dashboard: \"1\"\n"
            "    app.kubernetes.io/name: gpu-ledger\n"
            "data:\n"
            "  gpu-ledger.json: |\n" + body)


def main(argv):
    check = "--check" in argv
    want_dash = render_dashboard()
    want_cm = render_configmap(want_dash)
    if check:
        bad = []
        for path, want in ((DASHBOARD, want_dash), (CONFIGMAP, want_cm)):
            if not path.exists() or path.read_text() != want:
                bad.append(str(path.relative_to(ROOT)))
        if bad:
            print("out of date (run scripts/dashboards/build.py): " + ", ".join(bad), file=sys.stderr)
            return 1
        print("dashboard and ConfigMap are up to date")
        return 0
    DASHBOARD.write_text(want_dash)
    CONFIGMAP.write_text(want_cm)
    print("wrote %s and %s" % (DASHBOARD.relative_to(ROOT), CONFIGMAP.relative_to(ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
