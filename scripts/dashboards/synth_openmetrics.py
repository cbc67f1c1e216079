#!/usr/bin/env python3
"""Writes synthetic OpenMetrics history for scripts/test-dashboards.sh.

SYNTHETIC DATA: hand-made gpu-ledger families (per docs/metrics.md) and dcgm-exporter series,
2h15m of history at 30 s steps ending at `now`, timestamps in Unix seconds, `# EOF` at the end.
A later Rust test may replace this with real gpu-ledger output fed from the testkit.

Scenario (namespace team-a on gpu-node-1 has a bit of everything, so concrete variable values
return data too): running pods with known and unknown utilisation, an idle notebook, a
stuck-Terminating pod, pending pods, an unclaimed busy device, counters increasing, MIG, one GPU
of gpu-node-1 not schedulable (device plugin marked it unhealthy), gpu-node-3 with three RTX
A1000s per GFD and DCGM but nothing allocatable. DCGM: clock-event reasons under both field names
(one GPU in SW thermal slowdown), power on the H100s only (the A1000s report none, and no
reasons), and XID events in the last minutes that the recording rules, evaluated only from
Prometheus start, can see: DCGM_EXP_XID_ERRORS_COUNT (application XID 43 on GPU-1-3) and
DCGM_EXP_XID_ERRORS_TOTAL (hardware XID 79 on GPU-2-0, series new 3 minutes ago).

Label schemes (--scheme, src/usage/scheme.rs): "exported" is dcgm-exporter scraped without
honor_labels (workload in exported_namespace/exported_pod, namespace/pod name the exporter pod);
"plain" is with honor_labels (workload in namespace/pod; series without a workload keep the
target labels namespace/pod of the exporter pod). --cluster adds a `cluster` label to every
series, as a store shared by several clusters has it. gpu-ledger's own families carry the
scrape's job and instance (job="gpu-ledger", as the chart's ServiceMonitor names it).

usage: synth_openmetrics.py OUT_FILE [NOW_UNIX_SECONDS] [--scheme exported|plain] [--cluster NAME]
"""
import sys
import time

STEP = 30
SPAN = 2 * 3600 + 15 * 60


def main():
    args = sys.argv[1:]
    opts = {}
    for flag in ("--scheme", "--cluster"):
        if flag in args:
            k = args.index(flag)
            opts[flag] = args[k + 1]
            del args[k:k + 2]
    scheme = opts.get("--scheme", "exported")
    if scheme not in ("exported", "plain"):
        sys.exit("--scheme must be exported or plain, not %r" % scheme)
    cluster = opts.get("--cluster")
    out = args[0]
    now = int(float(args[1])) if len(args) > 1 else int(time.time())
    start = now - SPAN
    ts = list(range(start, now + 1, STEP))
    fams = {}  # name -> (type, help, [(labels, fn(t_index, t) -> value)])

    def s(name, typ, labels, fn, help_="synthetic"):
        labels = dict(labels)
        if name.startswith("gpu_ledger_"):
            labels.update(job="gpu-ledger", instance="10.0.0.10:8080")
        if cluster:
            labels["cluster"] = cluster
        fams.setdefault(name, (typ, help_, []))[2].append((labels, fn))

    const = lambda v: (lambda i, t: v)

    # ---- gpu-ledger per pod -------------------------------------------------------------
    pods = [
        # ns, pod, node, state, resource, attribution, gpus, util, owner_kind, owner, notebook
        ("team-a", "train-0", "gpu-node-1", "running", "nvidia.com/gpu", "exclusive", 2, 0.6, "StatefulSet", "train", ""),
        ("team-a", "nb-alice-0", "gpu-node-1", "running", "nvidia.com/gpu", "exclusive", 1, 0.0, "StatefulSet", "nb-alice", "nb-alice"),
        ("team-a", "stuck-0", "gpu-node-1", "terminating", "nvidia.com/gpu", "exclusive", 1, 0.0, "StatefulSet", "nb-old", "nb-old"),
        ("team-a", "sweep-1", "", "pending", "nvidia.com/gpu", "none", 1, None, "Job", "sweep", ""),
        ("team-a", "mig-0", "gpu-node-1", "running", "nvidia.com/mig-3g.40gb", "mig", 3 / 7, 0.8, "Deployment", "infer", ""),
        ("team-b", "llm-0", "gpu-node-2", "running", "nvidia.com/gpu", "exclusive", 4, 0.9, "Job", "llm", ""),
        ("team-b", "nb-bob-0", "gpu-node-2", "running", "nvidia.com/gpu", "unattributed", 1, None, "StatefulSet", "nb-bob", "nb-bob"),
        ("team-c", "eval-7", "", "pending", "nvidia.com/gpu", "none", 2, None, "Job", "eval", ""),
    ]
    for ns, pod, node, state, res, attr, gpus, util, okind, oname, nb in pods:
        s("gpu_ledger_pod_gpus", "gauge", dict(namespace=ns, pod=pod, node=node, state=state, resource=res, attribution=attr), const(gpus))
        s("gpu_ledger_pod_owner_info", "gauge", dict(namespace=ns, pod=pod, owner_kind=okind, owner_name=oname, notebook=nb), const(1))
        if state == "pending":
            s("gpu_ledger_pod_pending_seconds", "gauge", dict(namespace=ns, pod=pod), lambda i, t: 1800 + i * STEP)
            continue
        labels = dict(namespace=ns, pod=pod, node=node)
        if util is not None:
            s("gpu_ledger_pod_gpu_utilization_ratio", "gauge", labels, const(util))
            s("gpu_ledger_pod_gpu_memory_used_bytes", "gauge", labels, const(int(gpus * 20e9)))
            idle = util == 0.0
            s("gpu_ledger_pod_gpu_idle_seconds", "gauge", labels, (lambda i, t: 10000 + i * STEP) if idle else const(0))
        if state == "terminating":
            s("gpu_ledger_pod_terminating_seconds", "gauge", labels, lambda i, t: 900 + i * STEP)
            s("gpu_ledger_pod_stuck_terminating", "gauge", labels, const(1))

    # ---- per node / namespace ------------------------------------------------------------
    for node, alloc, claimed, unsched in (("gpu-node-1", 7, 4 + 3 / 7, 1), ("gpu-node-2", 8, 5, 0), ("gpu-node-3", 0, 0, 3)):
        s("gpu_ledger_node_gpus_allocatable", "gauge", dict(node=node), const(alloc))
        s("gpu_ledger_node_gpus_claimed", "gauge", dict(node=node), const(claimed))
        s("gpu_ledger_node_gpus_free", "gauge", dict(node=node), const(alloc - claimed))
        s("gpu_ledger_node_gpus_unschedulable", "gauge", dict(node=node), const(unsched))
    for ns, claimed, idle, pending in (("team-a", 4 + 3 / 7, 2, 1), ("team-b", 5, 0, 0), ("team-c", 0, 0, 2)):
        s("gpu_ledger_namespace_gpus_claimed", "gauge", dict(namespace=ns), const(claimed))
        s("gpu_ledger_namespace_gpus_idle", "gauge", dict(namespace=ns), const(idle))
        s("gpu_ledger_namespace_gpus_pending", "gauge", dict(namespace=ns), const(pending))
        s("gpu_ledger_gpu_seconds_claimed", "counter", dict(namespace=ns), lambda i, t, c=claimed: c * i * STEP)
        s("gpu_ledger_gpu_seconds_idle", "counter", dict(namespace=ns), lambda i, t, d=idle: d * i * STEP)
        for activity, g in (("busy", claimed - idle), ("idle", idle)):
            s("gpu_ledger_gpu_seconds_by_model", "counter", dict(namespace=ns, model="NVIDIA-H100-80GB-HBM3", activity=activity), lambda i, t, g=g: g * i * STEP)
        # pending work that would fit once idle holders stop (here: all of team-c's, none of team-a's)
        s("gpu_ledger_pending_reclaimable_gpus", "gauge", dict(namespace=ns), const(pending if ns == "team-c" else 0))
    s("gpu_ledger_namespace_gpu_quota", "gauge", {"namespace": "team-a", "resource": "requests.nvidia.com/gpu"}, const(8))
    for ns, missing in (("team-a", 0), ("team-b", 1), ("team-c", 1)):
        s("gpu_ledger_namespace_gpu_quota_missing", "gauge", dict(namespace=ns), const(missing))
    # quotas and queues: team-a's quota is full with 2 idle GPUs; two ClusterQueues in a cohort,
    # the lender's admitted GPU idle, the other starved
    for kind, v in (("hard", 8), ("used", 8), ("busy", 6), ("idle", 2)):
        s("gpu_ledger_quota_gpus", "gauge", dict(namespace="team-a", resource="nvidia.com/gpu", kind=kind), const(v))
    for cq, admitted, busy, idle, pending, starved in (("lender", 1, 0, 1, 0, 0), ("starved", 0, 0, 0, 1, 1)):
        for kind, v in (("nominal", 2), ("admitted", admitted), ("busy", busy), ("idle", idle)):
            s("gpu_ledger_queue_gpus", "gauge", dict(cluster_queue=cq, flavor="h100", resource="nvidia.com/gpu", kind=kind), const(v))
        s("gpu_ledger_queue_pending_workloads", "gauge", dict(cluster_queue=cq), const(pending))
        s("gpu_ledger_queue_starved_while_lender_idle", "gauge", dict(cluster_queue=cq), const(starved))
    s("gpu_ledger_dra_claims_unquotaed", "gauge", dict(namespace="team-b"), const(1))
    s("gpu_ledger_unclaimed_busy_gpu_utilization_ratio", "gauge", dict(node="gpu-node-1", uuid="GPU-1-7", gpu_instance=""), const(0.7))

    # ---- self ----------------------------------------------------------------------------
    s("gpu_ledger_source_up", "gauge", dict(source="kubernetes"), const(1))
    s("gpu_ledger_source_up", "gauge", dict(source="prometheus"), const(1))
    s("gpu_ledger_last_refresh_timestamp_seconds", "gauge", {}, lambda i, t: t - 10)
    s("gpu_ledger_prometheus_queries", "counter", {}, lambda i, t: 6 * i)
    s("gpu_ledger_prometheus_query_errors", "counter", {}, const(0))
    s("gpu_ledger_build_info", "gauge", dict(version="0.1.0"), const(1))
    s("gpu_ledger_cull_circuit_open", "gauge", dict(reason="error_rate"), const(0))
    s("gpu_ledger_cull_leader", "gauge", {}, const(1))

    # ---- dcgm-exporter (scraped without honor_labels: workload in exported_*) ----------
    exporter = dict(job="dcgm-exporter", namespace="gpu-operator", container="exporter")
    last = len(ts) - 1
    recent = lambda i, minutes: i >= last - minutes * 60 // STEP  # sample within the last N minutes
    H100, A1000 = "NVIDIA H100 80GB HBM3", "NVIDIA RTX A1000"
    devices = [
        # Hostname, gpu, UUID, model, extra, (exported_ns, exported_pod), temp, fb_used, fb_free, xid, active, reasons
        # reasons: (field name, mask) or None when the exporter does not report them
        ("gpu-node-1", "0", "GPU-1-0", H100, {}, ("team-a", "train-0"), 71, 52000, 29000, 0, 0.6, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0)),
        ("gpu-node-1", "1", "GPU-1-1", H100, {}, ("team-a", "train-0"), 88, 79000, 2000, 0, 0.6, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x20)),
        ("gpu-node-1", "2", "GPU-1-2", H100, {}, ("team-a", "nb-alice-0"), 40, 1000, 80000, 0, 0.0, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x1)),
        ("gpu-node-1", "3", "GPU-1-3", H100, {}, ("team-a", "stuck-0"), 38, 500, 80500, 43, 0.0, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x1)),
        ("gpu-node-1", "4", "GPU-1-4", H100, {"GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb"}, ("team-a", "mig-0"), 55, 30000, 10000, 0, 0.8, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0)),
        ("gpu-node-1", "4", "GPU-1-4", H100, {"GPU_I_ID": "2", "GPU_I_PROFILE": "3g.40gb"}, None, 55, 0, 40000, 0, 0.0, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0)),
        ("gpu-node-1", "7", "GPU-1-7", H100, {}, None, 66, 20000, 61000, 0, 0.7, ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0)),
    ] + [("gpu-node-2", str(g), "GPU-2-%d" % g, H100, {}, ("team-b", "llm-0"), 75, 70000, 11000, 79 if g == 0 else 0, 0.9,
          ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0x4)) for g in range(4)
    ] + [("gpu-node-3", str(g), "GPU-3-%d" % g, A1000, {}, None, 84 + g, 400, 7600, 0, 0.0, None) for g in range(3)]
    for host, gpu, uuid, model, extra, wl, temp, used, free, xid, active, reasons in devices:
        base = dict(gpu=gpu, UUID=uuid, device="nvidia" + gpu, modelName=model, Hostname=host, **extra)
        base["pod"] = "nvidia-dcgm-exporter-" + host[-1]
        base.update(exporter)
        if wl and scheme == "exported":
            base.update(exported_namespace=wl[0], exported_pod=wl[1], exported_container="main")
        elif wl:  # honor_labels: the exporter's workload labels replace the target's
            base.update(namespace=wl[0], pod=wl[1], container="main")
        s("DCGM_FI_DEV_GPU_TEMP", "gauge", base, lambda i, t, v=temp: v + (i % 4))
        s("DCGM_FI_DEV_FB_USED", "gauge", base, const(used))
        s("DCGM_FI_DEV_FB_FREE", "gauge", base, const(free))
        s("DCGM_FI_DEV_XID_ERRORS", "gauge", dict(base, err_code=str(xid)), const(xid))
        s("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", base, const(active))
        if model == H100:  # the A1000s under passthrough report no power draw
            s("DCGM_FI_DEV_POWER_USAGE", "gauge", base, lambda i, t, a=active: 80 + 500 * a)
        if reasons:
            s(reasons[0], "gauge", base, const(reasons[1]))
        if host == "gpu-node-1":
            # COUNT, 5-minute window: GPU-1-3's XID 43 in the last 4 minutes, the others none
            win = dict(base, window_size_in_ms="300000")
            if uuid == "GPU-1-3":
                s("DCGM_EXP_XID_ERRORS_COUNT", "gauge", dict(win, xid="43"), lambda i, t: 1 if recent(i, 4) else None)
                s("DCGM_EXP_XID_ERRORS_COUNT", "gauge", win, lambda i, t: None if recent(i, 4) else 0)
            else:
                s("DCGM_EXP_XID_ERRORS_COUNT", "gauge", win, const(0))
        if uuid == "GPU-2-0":
            # TOTAL: created by the first XID 79, 3 minutes ago. A counter in dcgm-exporter; typed
            # "unknown" here because OpenMetrics would append "_total" to a counter's samples.
            s("DCGM_EXP_XID_ERRORS_TOTAL", "unknown", dict(base, xid="79"), lambda i, t: 1 if recent(i, 3) else None)

    # up for both jobs
    s("up", "gauge", dict(job="gpu-ledger", instance="10.0.0.10:8080", **({"cluster": cluster} if cluster else {})), const(1))

    def fmt_labels(d):
        if not d:
            return ""
        return "{" + ",".join('%s="%s"' % (k, str(v).replace('"', '\\"')) for k, v in d.items()) + "}"

    with open(out, "w") as f:
        for name, (typ, help_, series) in fams.items():
            f.write("# HELP %s %s\n# TYPE %s %s\n" % (name, help_, name, typ))
            suffix = "_total" if typ == "counter" else ""
            for labels, fn in series:
                ls = fmt_labels(labels)
                for i, t in enumerate(ts):
                    v = fn(i, t)
                    if v is None:  # no sample: the exporter did not emit this series then
                        continue
                    f.write("%s%s%s %s %d\n" % (name, suffix, ls, repr(float(v)), t))
        f.write("# EOF\n")


if __name__ == "__main__":
    main()
