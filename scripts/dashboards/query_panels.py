#!/usr/bin/env python3
"""Runs every panel target and variable query of a Grafana dashboard against a live Prometheus.

Each target's expr is run with variables substituted, once with "All" ($namespace/$node -> .*)
and once with concrete values, through /api/v1/query (instant) and, for timeseries panels, also
/api/v1/query_range over the last 2h. A query fails unless it parses (status success) and returns
at least one series, and every label its legend names ({{a}}{{b}} side by side: either) is set on
at least one of them: a panel grouping by labels the data does not carry (the workload under
the other label scheme) shows lines without names. Dashboard variables (label_values(metric,
label)) must return values, except those named with --allow-empty (`cluster` where the store has
no cluster label: "All" is .*, which matches series without one). $cluster and $job are .*.

usage: query_panels.py PROM_URL DASHBOARD_JSON NAMESPACE NODE [--allow-empty VAR]...
Prints one line per check and "dashboard-queries: N passed, M failed"; exits 1 on any failure.
"""
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def get(url, params):
    full = url + "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(full, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return json.load(e)
        except Exception:
            return {"status": "error", "error": "HTTP %s" % e.code}


def substitute(expr, ns, node):
    for var, val in (("namespace", ns), ("node", node), ("cluster", ".*"), ("job", ".*"), ("__rate_interval", "5m"),
                     ("__range", "1h"), ("__interval", "1m"), ("datasource", "")):
        expr = expr.replace("${%s}" % var, val).replace("$" + var, val)
    return expr


def legend_groups(legend):
    """{{a}}{{b}} x {{c}} -> [["a", "b"], ["c"]]: adjacent placeholders are alternatives."""
    groups, last_end = [], None
    for m in re.finditer(r"\{\{\s*(\w+)\s*\}\}", legend or ""):
        if last_end == m.start() and groups:
            groups[-1].append(m.group(1))
        else:
            groups.append([m.group(1)])
        last_end = m.end()
    return groups


def main():
    prom, dash_file, ns, node = sys.argv[1:5]
    rest = sys.argv[5:]
    allow_empty = {rest[k + 1] for k in range(len(rest) - 1) if rest[k] == "--allow-empty"}
    dash = json.load(open(dash_file))
    passed = failed = 0
    now = time.time()

    def check(name, resp, key="result"):
        nonlocal passed, failed
        if resp.get("status") != "success":
            failed += 1
            print("FAIL %s: %s" % (name, resp.get("error")))
        elif not resp["data"] if key is None else not resp["data"][key]:
            failed += 1
            print("FAIL %s: no data" % name)
        else:
            passed += 1
            n = len(resp["data"]) if key is None else len(resp["data"][key])
            print("ok   %s (%d)" % (name, n))

    for v in dash.get("templating", {}).get("list", []):
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((\w+),\s*(\w+)\)\s*", q)
        if not m:
            failed += 1
            print("FAIL variable %s: unsupported query %r" % (v["name"], q))
            continue
        resp = get(prom + "/api/v1/label/%s/values" % m.group(2), {"match[]": m.group(1)})
        if v["name"] in allow_empty and resp.get("status") == "success" and not resp["data"]:
            passed += 1
            print("ok   variable $%s = %s (no values; allowed)" % (v["name"], q))
            continue
        check("variable $%s = %s" % (v["name"], q), resp, key=None)

    for p in dash["panels"]:
        for t in p.get("targets", []):
            for label, (nsv, nodev) in (("all", (".*", ".*")), ("%s,%s" % (ns, node), (ns, node))):
                expr = substitute(t["expr"], nsv, nodev)
                name = "panel %d %r %s [%s]" % (p["id"], p["title"], t["refId"], label)
                resp = get(prom + "/api/v1/query", {"query": expr, "time": "%.3f" % now})
                check(name + " instant", resp)
                if resp.get("status") == "success" and resp["data"]["result"]:
                    series = [r["metric"] for r in resp["data"]["result"]]
                    for group in legend_groups(t.get("legendFormat")):
                        if not any(m.get(label) for m in series for label in group):
                            failed += 1
                            print("FAIL %s legend: no series carries %s" % (name, " or ".join(group)))
                if p["type"] == "timeseries":
                    check(name + " range", get(prom + "/api/v1/query_range", {
                        "query": expr, "start": "%.3f" % (now - 7200), "end": "%.3f" % now, "step": "60"}))
    print("dashboard-queries: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
