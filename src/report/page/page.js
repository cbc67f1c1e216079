// gpu-ledger page script: re-renders the server's markup from the ledger JSON (embedded, then
// refreshed from api/v1/ledger when served), sorts and filters in place. Formatting mirrors
// src/report (gpus, percent, idle_for, note, advice); every API string goes in via textContent.
(function () {
  "use strict";
  var body = document.body;
  var live = body.getAttribute("data-live") === "true";
  var dataBlock = document.getElementById("ledger-data");
  var ledger = JSON.parse(dataBlock.textContent);
  var params = new URLSearchParams(window.location.search);
  var view = {
    namespace: params.get("namespace") || "",
    node: params.get("node") || "",
    sort: params.get("sort") || "namespace",
    dir: params.get("dir") === "desc" ? "desc" : "asc"
  };
  var SORT_KEYS = [
    ["namespace", "Namespace", false], ["pod", "Pod", false], ["node", "Node", false],
    ["state", "State", false], ["gpus", "GPUs", true], ["util", "Utilisation", true],
    ["idle", "Idle for", true], ["notebook", "Notebook", false]
  ];
  if (!SORT_KEYS.some(function (k) { return k[0] === view.sort; })) { view.sort = "namespace"; }
  var refreshes = 0;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = text; }
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  // Halves away from zero, as src/report rounds.
  function hundredths(x) { return Math.sign(x) * Math.round(Math.abs(x) * 100); }
  function gpus(x) {
    var h = hundredths(x);
    // Past 2^53 hundredths: the whole number, as src/report prints it.
    if (Math.abs(h) >= 9007199254740992) { return String(Math.sign(x) * Math.round(Math.abs(x))); }
    var sign = h < 0 ? "-" : "";
    var a = Math.abs(h), whole = Math.floor(a / 100), frac = a % 100;
    if (frac === 0) { return sign + whole; }
    if (frac % 10 === 0) { return sign + whole + "." + (frac / 10); }
    return sign + whole + "." + (frac < 10 ? "0" : "") + frac;
  }
  function fixed2(x) {
    var h = hundredths(x), sign = h < 0 ? "-" : "", a = Math.abs(h), frac = a % 100;
    return sign + Math.floor(a / 100) + "." + (frac < 10 ? "0" : "") + frac;
  }
  function gpuCount(x) { var n = gpus(x); return n === "1" ? "1 GPU" : n + " GPUs"; }
  function percent(r) { return (Math.sign(r) * Math.round(Math.abs(r) * 100)) + "%"; }
  function humanise(secs) {
    var s = Math.max(0, Math.trunc(secs));
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    var m = Math.floor((s % 3600) / 60), r = s % 60;
    if (d > 0) { return d + "d" + h + "h"; }
    if (h > 0) { return h + "h" + m + "m"; }
    if (m > 0) { return m + "m"; }
    return r + "s";
  }
  function idleFor(p) {
    if (p.idle === false) { return "active"; }
    if (p.idle_seconds === null || p.idle_seconds === undefined) { return "-"; }
    if (p.idle_seconds <= 0) { return "active"; }
    return (p.idle_bounded_by_history ? "\u2265" : "") + humanise(p.idle_seconds);
  }
  function note(p, usageAvailable) {
    var parts = [];
    if (p.state === "pending") {
      var s = p.pending_seconds !== null ? "pending " + humanise(p.pending_seconds) : "pending";
      if (p.pending_reason) { s += ": " + p.pending_reason; }
      parts.push(s);
    } else if (p.state === "terminating") {
      var age = p.terminating_seconds !== null ? " " + humanise(p.terminating_seconds) : "";
      parts.push((p.stuck ? "stuck terminating" : "terminating") + age);
    }
    if (p.notebook_stopped) { parts.push("notebook stopped, pod still holds its GPU"); }
    if (usageAvailable) {
      if (p.attribution === "unattributed") {
        parts.push("unattributed: no DCGM series names this pod");
      } else if (p.attribution === "shared" && p.utilization === null) {
        parts.push("shared device: own utilisation unknown");
      } else if ((p.attribution === "exclusive" || p.attribution === "mig") &&
                 p.idle === null && p.utilization !== null) {
        parts.push("idle unproven: samples missing or stale");
      }
    }
    return parts.join("; ");
  }
  // DNS-1123, as src/report/advice.rs and the API server check names.
  var NO_COMMAND = "no command: not a valid Kubernetes name";
  function isDnsLabel(s) {
    return typeof s === "string" && s.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(s);
  }
  function isDnsSubdomain(s) {
    return typeof s === "string" && s.length <= 253 &&
      /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(s);
  }
  function isResourceName(s) { return s.length > 0 && s.length <= 253 && /^[A-Za-z0-9._\/-]+$/.test(s); }
  function stopValue(at) { return new Date(at).toISOString().slice(0, 19) + "Z"; }
  function podHint(p, at) {
    var named = isDnsLabel(p.namespace) && isDnsSubdomain(p.pod);
    if (p.state === "running" && p.idle === true && !p.notebook_stopped && p.notebook !== null) {
      var cmds = [];
      var nbNamed = named && isDnsSubdomain(p.notebook);
      if (nbNamed) {
        cmds.push(["", "kubectl annotate notebook -n " + p.namespace + " -- " + p.notebook +
          " kubeflow-resource-stopped=" + stopValue(at)]);
      }
      return { text: "idle " + idleFor(p) + ": stop notebook " + p.notebook +
        " (Kubeflow scales it to zero; its volumes stay)", commands: cmds,
        note: nbNamed ? null : NO_COMMAND };
    }
    if (p.state === "terminating" && p.stuck) { return stuckHint(p, named); }
    return null;
  }
  // The same rules as src/report/advice.rs's stuck_hint, protects_storage and stuck_remedy.
  function protectsStorage(f) {
    f = f.toLowerCase();
    return f === "kubernetes.io/pvc-protection" || f === "kubernetes.io/pv-protection" ||
      ["storage", "volume", "pvc", "pv-", "csi", "mount", "disk", "snapshot"].some(function (w) {
        return f.indexOf(w) >= 0;
      });
  }
  function stuckRemedy(p) {
    if (p && p.finalizers.length > 0 && p.node_ready === false) { return "clear finalizers and force delete"; }
    if (p && p.finalizers.length > 0) { return "clear finalizers of"; }
    return "force delete";
  }
  function stuckHint(p, named) {
    var age = p.terminating_seconds !== null ? " " + humanise(p.terminating_seconds) : "";
    var node = p.node !== null ? p.node : "its node";
    var patch = "kubectl patch pod -n " + p.namespace +
      " --type=merge -p '{\"metadata\":{\"finalizers\":null}}' -- " + p.pod;
    var force = "kubectl delete pod -n " + p.namespace + " --grace-period=0 --force -- " + p.pod;
    var fins = p.finalizers.join(", ");
    var storage = p.finalizers.filter(protectsStorage);
    var beforePatch = storage.length === 0 ? "" : storage.join(", ") +
      " protects storage: removing it skips the clean-up it waits for (unmount, detach); check the volume first";
    var why, c;
    if (p.finalizers.length > 0 && p.node_ready === true) {
      why = "finalizer " + fins + " keeps it (" + node + " is Ready; a force delete does not remove finalizers)";
      c = [[beforePatch, patch]];
    } else if (p.finalizers.length > 0 && p.node_ready === false) {
      why = "finalizer " + fins + " and " + node + ", not Ready, keep it";
      c = [[beforePatch, patch], ["", force]];
    } else if (p.finalizers.length > 0) {
      why = "finalizer " + fins + " keeps it (whether " + node + " is Ready is unknown)";
      c = [[beforePatch, patch], ["if " + node + " is down", force]];
    } else if (p.node_ready === false) {
      why = node + " is not Ready (unreachable?): its kubelet cannot finish the pod";
      c = [["", force]];
    } else if (p.node_ready === true) {
      why = "no finalizer, " + node + " is Ready: its kubelet has not finished the pod (see the pod's events, the kubelet's log)";
      c = [["once its containers are gone from " + node, force]];
    } else {
      why = "no finalizer; whether " + node + " is Ready is unknown";
      c = [["if " + node + " is down", force]];
    }
    return { text: "stuck terminating" + age + ", still holds " + gpuCount(p.gpus) + ": " + why,
      commands: named ? c : [], note: named ? null : NO_COMMAND };
  }
  function namespaceHint(ns, pods) {
    if (ns.gpu_quota !== null || (ns.gpus_claimed <= 0 && ns.gpus_pending <= 0)) { return null; }
    var units = {};
    pods.forEach(function (p) {
      if (p.namespace !== ns.namespace) { return; }
      Object.keys(p.resources).forEach(function (r) { units[r] = (units[r] || 0) + p.resources[r]; });
    });
    var names = Object.keys(units).sort();
    var hard = names.filter(function (r) { return units[r] > 0; })
      .map(function (r) { return "requests." + r + "=" + units[r]; });
    var cmds = [];
    var named = isDnsLabel(ns.namespace);
    if (named && hard.length > 0 && names.every(isResourceName)) {
      cmds.push(["", "kubectl create quota gpu-quota -n " + ns.namespace + " --hard=" + hard.join(",")]);
    }
    return { text: gpuCount(ns.gpus_claimed) + " held, " + gpus(ns.gpus_pending) +
      " pending, no GPU quota: add one (here at today's demand)", commands: cmds,
      note: named ? null : NO_COMMAND };
  }
  function quotaCell(n) {
    if (n.gpu_quota !== null) { return gpus(n.gpu_quota); }
    return (n.gpus_claimed > 0 || n.gpus_pending > 0) ? "none (!)" : "none";
  }
  function holds(p) { return p.state === "running" || p.state === "terminating"; }

  function compareText(a, b) { return a < b ? -1 : (a > b ? 1 : 0); }
  function sortValue(p, key) {
    switch (key) {
      case "pod": return p.pod;
      case "node": return p.node === null ? "" : p.node;
      case "state": return p.state;
      case "notebook": return p.notebook === null ? "" : p.notebook;
      case "gpus": return p.gpus;
      case "util": return p.utilization === null ? -Infinity : p.utilization;
      case "idle":
        if (p.idle === false) { return 0; }
        return p.idle_seconds === null ? -Infinity : p.idle_seconds;
      default: return p.namespace;
    }
  }
  function comparePods(a, b) {
    var x = sortValue(a, view.sort), y = sortValue(b, view.sort);
    var c = typeof x === "number" ? (x < y ? -1 : (x > y ? 1 : 0)) : compareText(x, y);
    if (view.dir === "desc") { c = -c; }
    return c || compareText(a.namespace, b.namespace) || compareText(a.pod, b.pod);
  }
  function showsPod(p) {
    return (!view.namespace || p.namespace === view.namespace) && (!view.node || p.node === view.node);
  }

  function hintInto(td, hint) {
    td.appendChild(el("span", "hint", hint.text));
    hint.commands.forEach(function (c) {
      var div = el("div", "cmd");
      if (c[0]) { div.appendChild(el("span", "when", c[0] + ":")); }
      div.appendChild(el("code", null, c[1]));
      td.appendChild(div);
    });
    if (hint.note) { td.appendChild(el("div", "cmd note", hint.note)); }
  }
  function cell(tr, text, cls) { tr.appendChild(el("td", cls || null, text)); }

  function renderSummary() {
    var s = { allocatable: 0, claimed: 0, idle: 0, pending: 0, free: 0 };
    ledger.nodes.forEach(function (n) { s.allocatable += n.gpus_allocatable; s.claimed += n.gpus_claimed; s.free = (s.free === null || n.gpus_free === null) ? null : s.free + n.gpus_free; });
    ledger.namespaces.forEach(function (n) { s.idle += n.gpus_idle; s.pending += n.gpus_pending; });
    var ul = document.getElementById("summary");
    clear(ul);
    [[s.allocatable, "allocatable"], [s.claimed, "claimed"], [s.idle, "proven idle"],
     [s.pending, "pending"], [s.free, "free"]].forEach(function (part) {
      var li = el("li");
      li.appendChild(el("b", null, part[0] === null ? "?" : gpus(part[0])));
      li.appendChild(document.createTextNode(part[1]));
      ul.appendChild(li);
    });
    var t = document.getElementById("generated-at");
    var iso = new Date(ledger.generated_at).toISOString();
    t.setAttribute("datetime", iso.slice(0, 19) + "Z");
    t.textContent = iso.slice(0, 10) + " " + iso.slice(11, 19) + " UTC";
    document.getElementById("usage-warning").hidden = ledger.usage_available;
  }

  function fillSelect(select, values, selected) {
    var set = {};
    values.forEach(function (v) { if (v) { set[v] = true; } });
    clear(select);
    select.appendChild(el("option", null, "all")).value = "";
    Object.keys(set).sort(compareText).forEach(function (v) {
      var o = el("option", null, v);
      if (v === selected) { o.selected = true; }
      select.appendChild(o);
    });
    if (selected && !set[selected]) { select.value = ""; }
  }
  function renderFilters() {
    var form = document.getElementById("filters");
    form.hidden = false;
    document.getElementById("apply").hidden = true;
    fillSelect(form.elements.namespace,
      ledger.namespaces.map(function (n) { return n.namespace; }).concat(ledger.pods.map(function (p) { return p.namespace; })),
      view.namespace);
    fillSelect(form.elements.node,
      ledger.nodes.map(function (n) { return n.node; }).concat(ledger.pods.map(function (p) { return p.node; })),
      view.node);
    form.elements.sort.value = view.sort;
    form.elements.dir.value = view.dir;
  }

  function query(key, dir) {
    var q = new URLSearchParams();
    q.set("sort", key);
    q.set("dir", dir);
    if (view.namespace) { q.set("namespace", view.namespace); }
    if (view.node) { q.set("node", view.node); }
    if (params.get("refresh")) { q.set("refresh", params.get("refresh")); }
    return "?" + q.toString();
  }
  function renderPods() {
    var table = document.getElementById("pods");
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      var key = th.getAttribute("data-key");
      if (!key) { return; }
      if (key === view.sort) {
        th.setAttribute("aria-sort", view.dir === "desc" ? "descending" : "ascending");
      } else {
        th.removeAttribute("aria-sort");
      }
      var next = (key === view.sort && view.dir === "asc") ? "desc" : "asc";
      th.firstChild.setAttribute("href", query(key, next));
    });
    var tbody = table.tBodies[0];
    clear(tbody);
    var pods = ledger.pods.filter(showsPod).sort(comparePods);
    pods.forEach(function (p) {
      var tr = el("tr", "pod state-" + p.state + (p.idle === true ? " idle" : "") + (p.stuck ? " stuck" : ""));
      cell(tr, p.namespace);
      cell(tr, p.pod);
      cell(tr, p.node === null ? "-" : p.node);
      cell(tr, p.state, "state");
      cell(tr, gpus(p.gpus), "num");
      cell(tr, p.utilization === null ? "-" : percent(p.utilization), "num");
      cell(tr, idleFor(p), "num idle-for");
      cell(tr, p.notebook === null ? "-" : p.notebook);
      var todo = el("td", "todo");
      var hint = podHint(p, ledger.generated_at);
      if (hint) {
        hintInto(todo, hint);
      } else {
        var n = note(p, ledger.usage_available);
        if (n) { todo.appendChild(el("span", "note", n)); }
      }
      tr.appendChild(todo);
      tbody.appendChild(tr);
    });
    document.getElementById("pods-empty").hidden = pods.length > 0;
  }

  function renderNodes() {
    var box = document.getElementById("nodes");
    clear(box);
    var shown = ledger.nodes.filter(function (n) { return !view.node || n.node === view.node; });
    shown.forEach(function (n) {
      var used = 0, unknown = 0;
      ledger.pods.forEach(function (p) {
        if (!holds(p) || p.node !== n.node) { return; }
        if (p.utilization === null) { unknown += p.gpus; } else { used += p.gpus * p.utilization; }
      });
      var scale = Math.max(n.gpus_allocatable, n.gpus_claimed, Number.MIN_VALUE);
      function width(x) { return fixed2(Math.min(100, Math.max(0, x / scale * 100))); }
      var div = el("div", "node");
      div.appendChild(el("div", "node-name", n.node));
      var bar = svg("svg", { "class": "bar", viewBox: "0 0 100 10", preserveAspectRatio: "none", "aria-hidden": "true" });
      bar.appendChild(svg("rect", { "class": "alloc", x: "0", y: "0", height: "10", width: width(n.gpus_allocatable) }));
      bar.appendChild(svg("rect", { "class": "claimed", x: "0", y: "0", height: "10", width: width(n.gpus_claimed) }));
      bar.appendChild(svg("rect", { "class": "used", x: "0", y: "2.5", height: "5", width: width(used) }));
      div.appendChild(bar);
      var nums = gpus(n.gpus_allocatable) + " allocatable \u00b7 " + gpus(n.gpus_claimed) + " claimed \u00b7 " +
        gpus(used) + " in use \u00b7 " + (n.gpus_free === null ? "?" : gpus(n.gpus_free)) + " free";
      if (unknown > 0) { nums += " \u00b7 " + gpus(unknown) + " unknown"; }
      if (n.gpus_unschedulable > 0) { nums += " \u00b7 " + gpus(n.gpus_unschedulable) + " not schedulable"; }
      div.appendChild(el("div", "node-nums", nums));
      box.appendChild(div);
    });
    document.getElementById("nodes-empty").hidden = shown.length > 0;
  }

  function renderNamespaces() {
    var tbody = document.getElementById("namespaces").tBodies[0];
    clear(tbody);
    var shown = ledger.namespaces.filter(function (n) { return !view.namespace || n.namespace === view.namespace; });
    shown.forEach(function (n) {
      var tr = el("tr");
      cell(tr, n.namespace);
      cell(tr, gpus(n.gpus_claimed), "num");
      cell(tr, gpus(n.gpus_idle), "num");
      cell(tr, gpus(n.gpus_pending), "num");
      cell(tr, quotaCell(n));
      var todo = el("td", "todo");
      var hint = namespaceHint(n, ledger.pods);
      if (hint) { hintInto(todo, hint); }
      tr.appendChild(todo);
      tbody.appendChild(tr);
    });
    document.getElementById("namespaces-empty").hidden = shown.length > 0;
  }

  function renderUnclaimed() {
    var tbody = document.getElementById("unclaimed").tBodies[0];
    clear(tbody);
    var shown = ledger.unclaimed_busy.filter(function (u) { return !view.node || u.node === view.node; });
    shown.forEach(function (u) {
      var tr = el("tr");
      cell(tr, u.node ? u.node : "-");
      cell(tr, u.uuid);
      cell(tr, u.gpu_instance === null ? "-" : u.gpu_instance);
      cell(tr, percent(u.utilization), "num");
      tbody.appendChild(tr);
    });
    document.getElementById("unclaimed-empty").hidden = shown.length > 0;
  }

  // History (/api/v1/history): one chart per span, the namespace filter's or the cluster's
  // lines, broken where there is no data (null is no data, never 0).
  var histories = {};
  var historyError = null;
  function drawHistory(h) {
    var fig = el("figure", "history-chart");
    fig.setAttribute("data-range", h.range);
    var s = view.namespace ? h.namespaces[view.namespace] : h.cluster;
    var cap = el("figcaption", null, "Last " + (h.range === "24h" ? "24 h" : "7 days") +
      (view.namespace ? " · " + view.namespace : " · cluster"));
    fig.appendChild(cap);
    var W = 600, H = 120, T = 12, n = h.t.length;
    var max = 1;
    if (s) {
      ["claimed", "busy", "idle"].forEach(function (k) {
        s[k].forEach(function (v) { if (v !== null && v > max) { max = v; } });
      });
    }
    var chart = svg("svg", { "class": "chart", "viewBox": "0 0 " + W + " " + (H + T), "preserveAspectRatio": "none", "role": "img" });
    chart.appendChild(svg("text", { x: "2", y: "10" })).textContent = gpus(max) + " GPUs";
    var lines = 0;
    if (s && n > 1) {
      ["claimed", "busy", "idle"].forEach(function (k) {
        var pts = [];
        function flush() {
          if (pts.length > 0) {
            chart.appendChild(svg("polyline", { "class": k === "busy" ? "busy" : k, "points": pts.join(" "), "data-series": k }));
            lines += 1;
          }
          pts = [];
        }
        s[k].forEach(function (v, i) {
          if (v === null) { flush(); return; }
          var x = (i / (n - 1)) * W, y = T + H - (v / max) * H;
          pts.push(x.toFixed(1) + "," + y.toFixed(1));
        });
        flush();
      });
    }
    fig.appendChild(chart);
    if (lines === 0) { fig.appendChild(el("p", "note", "no data in this span")); }
    return fig;
  }
  function renderHistory() {
    var box = document.getElementById("history");
    if (!box) { return; }
    var note = document.getElementById("history-note");
    Array.prototype.slice.call(box.querySelectorAll("figure")).forEach(function (f) { box.removeChild(f); });
    var reasons = [];
    ["24h", "7d"].forEach(function (r) {
      var h = histories[r];
      if (!h) { return; }
      if (h.available) { box.appendChild(drawHistory(h)); } else { reasons.push(h.reason); }
    });
    if (historyError !== null) { reasons.push(historyError); }
    if (reasons.length > 0) {
      note.textContent = "history unavailable: " + reasons.filter(function (r, i) { return reasons.indexOf(r) === i; }).join("; ");
      note.hidden = false;
      box.setAttribute("data-state", "unavailable");
    } else if (histories["24h"] || histories["7d"]) {
      note.hidden = true;
      box.setAttribute("data-state", "drawn");
    } else {
      note.textContent = "loading history…";
    }
  }
  function loadHistory() {
    historyError = null;
    Promise.all(["24h", "7d"].map(function (r) {
      return fetch("api/v1/history?range=" + r, { cache: "no-store", headers: { "Accept": "application/json" } })
        .then(function (resp) {
          if (!resp.ok) { throw new Error("HTTP " + resp.status); }
          return resp.json();
        })
        .then(function (h) { histories[r] = h; });
    }))
      .catch(function (e) { historyError = e.message; })
      .then(renderHistory);
  }

  // The cells of src/report/html.rs's reclaim_table (and report::advice::reclaim_takes).
  function reclaimTakes(o) {
    if (o.by_stopping.length === 0 && o.stuck_holders.length === 0) { return "free now"; }
    var parts = [];
    o.stuck_holders.forEach(function (s) {
      var p = ledger.pods.find(function (p) { return p.namespace === s.namespace && p.pod === s.pod; });
      parts.push(stuckRemedy(p) + " stuck " + s.namespace + "/" + s.pod);
    });
    o.by_stopping.forEach(function (s) {
      var p = ledger.pods.find(function (p) { return p.namespace === s.namespace && p.pod === s.pod; });
      var bound = p && p.idle_bounded_by_history ? "\u2265" : "";
      parts.push("stop notebook " + s.namespace + "/" + s.notebook + " (idle " + bound + humanise(Math.trunc(s.idle_seconds)) + ")");
    });
    return parts.join("; ");
  }

  function renderReclaim() {
    var tbody = document.getElementById("reclaim").tBodies[0];
    clear(tbody);
    var shown = (ledger.reclaim || []).filter(function (r) { return !view.namespace || r.pending.namespace === view.namespace; });
    shown.forEach(function (r) {
      var pending = r.pending.namespace + "/" + r.pending.pod;
      function row(node, takes) {
        var tr = el("tr");
        cell(tr, pending);
        cell(tr, gpus(r.gpus), "num");
        cell(tr, node);
        cell(tr, takes);
        tbody.appendChild(tr);
      }
      if (r.options.length === 0) { row("-", "fits nowhere: " + (r.fits_nowhere === null ? "no node" : r.fits_nowhere)); }
      r.options.forEach(function (o) { row(o.node, reclaimTakes(o)); });
    });
    document.getElementById("reclaim-empty").hidden = shown.length > 0;
  }

  // "Quotas and queues": the cells of report::quota_cells / queue_cells.
  function cellsRow(tbody, cells, numFrom, numTo) {
    var tr = el("tr");
    cells.forEach(function (c, i) { cell(tr, c, i >= numFrom && i < numTo ? "num" : null); });
    tbody.appendChild(tr);
  }
  function known(v) { return v === null ? "?" : gpus(v); }
  function units(v, none) { return v === null ? none : String(v); }
  function renderQuotas() {
    var tbody = document.getElementById("quotas").tBodies[0];
    clear(tbody);
    var shown = (ledger.quotas || []).filter(function (q) { return !view.namespace || q.namespace === view.namespace; });
    shown.forEach(function (q) {
      cellsRow(tbody, [q.namespace, q.resource, String(q.hard), units(q.used, "?"), known(q.busy), known(q.idle)], 2, 6);
    });
    document.getElementById("quotas-empty").hidden = shown.length > 0;
    tbody = document.getElementById("queues").tBodies[0];
    clear(tbody);
    var queues = ledger.queues || [];
    queues.forEach(function (r) {
      cellsRow(tbody, [r.cluster_queue, r.cohort === null ? "-" : r.cohort, r.flavor, r.resource,
        units(r.nominal, "?"), units(r.borrowing_limit, "-"), units(r.lending_limit, "-"), units(r.admitted, "?"),
        known(r.busy), known(r.idle), String(r.pending_workloads),
        r.oldest_pending_seconds === null ? "-" : humanise(r.oldest_pending_seconds),
        r.starved_while_lender_idle ? "starved: " + r.idle_lenders.join(", ") + " idle" : "-"], 4, 12);
    });
    var empty = document.getElementById("queues-empty");
    empty.hidden = queues.length > 0;
    empty.textContent = ledger.kueue_available ? "No Kueue ClusterQueue has a GPU quota." : "Kueue not found: no queue rows.";
    tbody = document.getElementById("unquotaed").tBodies[0];
    clear(tbody);
    var claims = (ledger.dra_claims_unquotaed || []).filter(function (c) { return !view.namespace || c.namespace === view.namespace; });
    claims.forEach(function (c) {
      cellsRow(tbody, [c.namespace + "/" + c.claim, c.device_classes.join(", ")], 0, 0);
    });
    document.getElementById("unquotaed-empty").hidden = claims.length > 0;
  }

  function render() {
    renderSummary();
    renderFilters();
    renderPods();
    renderNodes();
    renderNamespaces();
    renderUnclaimed();
    renderHistory();
    renderReclaim();
    renderQuotas();
    body.setAttribute("data-rendered", "script");
  }

  function remember() {
    try { window.history.replaceState(null, "", query(view.sort, view.dir)); } catch (e) { /* file: URLs */ }
  }
  document.getElementById("pods").tHead.addEventListener("click", function (ev) {
    var th = ev.target.closest("th[data-key]");
    if (!th) { return; }
    ev.preventDefault();
    var key = th.getAttribute("data-key");
    view.dir = (key === view.sort && view.dir === "asc") ? "desc" : "asc";
    view.sort = key;
    remember();
    render();
  });
  var form = document.getElementById("filters");
  form.addEventListener("change", function () {
    view.namespace = form.elements.namespace.value;
    view.node = form.elements.node.value;
    remember();
    render();
  });
  form.addEventListener("submit", function (ev) { ev.preventDefault(); });

  function showAge() {
    var secs = Math.round((Date.now() - new Date(ledger.generated_at).getTime()) / 1000);
    document.getElementById("age").textContent = live ? "(" + humanise(secs) + " ago)" : "";
  }
  function status(text) { document.getElementById("status").textContent = text; }

  var every = Math.min(3600, Math.max(1, parseInt(params.get("refresh"), 10) || 10));
  function refresh() {
    fetch("api/v1/ledger", { cache: "no-store", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (data) {
        ledger = data;
        refreshes += 1;
        render();
        body.setAttribute("data-refreshes", String(refreshes));
        status("");
        showAge();
      })
      .catch(function (e) { status("refresh failed (" + e.message + "); showing the last data"); })
      .then(function () { window.setTimeout(refresh, every * 1000); });
  }

  render();
  showAge();
  if (live) {
    window.setInterval(showAge, 1000);
    window.setTimeout(refresh, every * 1000);
    // The server caches history for a minute; a new chart every five is plenty.
    loadHistory();
    window.setInterval(loadHistory, 300000);
  }
}());
