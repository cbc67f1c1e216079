#!/usr/bin/env python3
"""Checks, against the Prometheus of scripts/test-dashboards.sh, that fields a GPU does not report
stay absent in the dashboard and that the hardware panels show the synthetic events.

Synthetic data (synth_openmetrics.py): the RTX A1000s of gpu-node-3 report temperature but no
clock-event reasons and no power (as under passthrough); GPU-1-1 is in SW thermal slowdown;
GPU-1-3 has an application XID 43 (DCGM_EXP_XID_ERRORS_COUNT), GPU-2-0 a hardware XID 79
(DCGM_EXP_XID_ERRORS_TOTAL); gpu-node-1 has 1 and gpu-node-3 3 unschedulable GPUs.

usage: check_absent.py PROM_URL DASHBOARD_JSON    (exit 1 and a message on the first failure)
"""
import json
import sys
import urllib.parse
import urllib.request

A1000S = {"GPU-3-0", "GPU-3-1", "GPU-3-2"}


def main():
    url, dash = sys.argv[1], json.load(open(sys.argv[2]))

    def expr(title, ref="A"):
        p = next(p for p in dash["panels"] if p["title"] == title)
        e = next(t["expr"] for t in p["targets"] if t["refId"] == ref)
        return (e.replace("$__range", "1h").replace("$node", ".*").replace("$cluster", ".*")
                .replace("$job", ".*"))

    def query(e):
        q = urllib.parse.urlencode({"query": e})
        with urllib.request.urlopen(url + "/api/v1/query?" + q, timeout=30) as r:
            return json.load(r)["data"]["result"]

    slow = {r["metric"]["UUID"]: r["value"][1] for r in query(expr("GPU thermal slowdown"))}
    if slow.get("GPU-1-1") != "1" or slow.get("GPU-2-0") != "0":
        return "thermal slowdown: want GPU-1-1=1 and GPU-2-0=0, got %s" % slow
    if A1000S & set(slow):
        return "thermal slowdown: GPUs without clock-event reasons got a value: %s" % sorted(A1000S & set(slow))
    temps = {r["metric"]["UUID"] for r in query(expr("GPU temperature"))}
    if not A1000S <= temps:
        return "GPU temperature: A1000s missing: %s" % sorted(temps)
    xids = {(r["metric"]["UUID"], r["metric"].get("xid"), r["metric"].get("xid_class"))
            for r in query(expr("XID events (dashboard range)"))}
    want = {("GPU-1-3", "43", "application"), ("GPU-2-0", "79", "hardware")}
    if xids != want:
        return "XID events: want %s, got %s" % (sorted(want), sorted(xids))
    nodes = {r["metric"]["node"]: r["value"][1] for r in query(expr("GPUs present but not schedulable"))}
    if nodes != {"gpu-node-1": "1", "gpu-node-3": "3"}:
        return "GPUs present but not schedulable: got %s" % nodes
    # The workload of each GPU / MIG instance, the same under either label scheme; GPUs without a
    # workload keep their line without one, and the exporter pod is never a workload.
    got = {(r["metric"]["UUID"], r["metric"].get("GPU_I_ID", "")):
           "%s/%s" % (r["metric"].get("workload_namespace", ""), r["metric"].get("workload_pod", ""))
           for r in query(expr("GPU activity by workload"))}
    want = {("GPU-1-0", ""): "team-a/train-0", ("GPU-1-1", ""): "team-a/train-0",
            ("GPU-1-2", ""): "team-a/nb-alice-0", ("GPU-1-3", ""): "team-a/stuck-0",
            ("GPU-1-4", "1"): "team-a/mig-0", ("GPU-1-4", "2"): "/", ("GPU-1-7", ""): "/"}
    want.update({("GPU-2-%d" % g, ""): "team-b/llm-0" for g in range(4)})
    want.update({("GPU-3-%d" % g, ""): "/" for g in range(3)})
    if got != want:
        return "GPU activity by workload: want %s, got %s" % (sorted(want.items()), sorted(got.items()))
    print("thermal slowdown on %d GPUs, none for the %d without reasons; XID events %s; unschedulable %s"
          % (len(slow), len(A1000S), sorted(x[1] for x in xids), nodes))
    return None


if __name__ == "__main__":
    err = main()
    if err:
        print(err)
        sys.exit(1)
