//! The page at `/` in a real headless Chromium (Debian's package, driven over the DevTools pipe;
//! `scripts/test.sh` installs it), against `gpu-ledger serve` on the tier B stack (kwok GPU nodes,
//! the fake dcgm-exporter test double scraped by a real Prometheus):
//!
//! * with JavaScript off, the server-rendered page lists exactly the pods of `/api/v1/ledger`,
//!   and sorts and filters through its query string;
//! * with JavaScript on, the script renders the same text from the same data (both renderings
//!   of one saved page are compared), sorts and filters in place, and refreshes itself: a pod's
//!   utilisation changes in the cluster and its row follows without a reload;
//! * nothing is fetched from anywhere but the server, no script error, no dialog;
//! * `report -o html` of a hostile dump shows markup in free text as text, in both renderings;
//! * a screenshot is saved as an artifact (path printed; `$GPU_LEDGER_SCREENSHOT` overrides).

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_ledger_testkit::GpuNode;
use gpu_ledger_testkit::chromium::{Browser, Page};
use gpu_ledger_testkit::dcgm::UTILIZATION_ANNOTATION;
use gpu_ledger_testkit::stack::{Notebook, spawn_notebook_stop_rule};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Grants, eventually, tier_b};

const TEAM: &str = "team-ml";
const TRIALS: &str = "trials";
const WAIT: Duration = Duration::from_secs(90);

/// The cells of every row of table `#id` (innerText; the script and the server must agree on it).
fn table_rows(page: &Page<'_>, id: &str) -> Vec<Vec<String>> {
    let v = page
        .evaluate(&format!(
            "Array.from(document.querySelectorAll('#{id} tbody tr')).map(tr => Array.from(tr.cells).map(td => td.innerText.trim()))"
        ))
        .expect("read table");
    serde_json::from_value(v).expect("rows of strings")
}

/// Everything the page shows as data: summary, the three tables, the node bars' texts.
fn page_text(page: &Page<'_>) -> Value {
    page.evaluate(
        "({summary: document.getElementById('summary').innerText,
          time: document.getElementById('generated-at').innerText,
          pods: Array.from(document.querySelectorAll('#pods tbody tr')).map(tr => tr.innerText),
          nodes: Array.from(document.querySelectorAll('#nodes .node')).map(n => n.innerText + ' ' +
            Array.from(n.querySelectorAll('rect')).map(r => r.getAttribute('class') + '=' + r.getAttribute('width')).join(',')),
          namespaces: Array.from(document.querySelectorAll('#namespaces tbody tr')).map(tr => tr.innerText),
          unclaimed: Array.from(document.querySelectorAll('#unclaimed tbody tr')).map(tr => tr.innerText),
          reclaim: Array.from(document.querySelectorAll('#reclaim tbody tr')).map(tr => tr.innerText),
          quotas: Array.from(document.querySelectorAll('#quotas tbody tr')).map(tr => tr.innerText),
          queues: Array.from(document.querySelectorAll('#queues tbody tr')).map(tr => tr.innerText),
          unquotaed: Array.from(document.querySelectorAll('#unquotaed tbody tr')).map(tr => tr.innerText),
          queuesEmpty: document.getElementById('queues-empty').innerText,
          empty: Array.from(document.querySelectorAll('.empty')).map(e => e.id + ':' + e.hidden)})",
    )
    .expect("page text")
}

fn percent(u: f64) -> String {
    format!("{}%", (u * 100.0).round() as i64)
}

fn artifact_path() -> PathBuf {
    if let Some(p) = std::env::var_os("GPU_LEDGER_SCREENSHOT") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
        PathBuf::from,
    );
    target.join("test-artifacts").join("page.png")
}

fn assert_clean(page: &Page<'_>, origin: &str) {
    let exceptions = page.take_events("Runtime.exceptionThrown");
    assert!(exceptions.is_empty(), "script errors: {exceptions:#?}");
    let dialogs = page.take_events("Page.javascriptDialogOpening");
    assert!(dialogs.is_empty(), "dialogs: {dialogs:#?}");
    for r in page.take_events("Network.requestWillBeSent") {
        let url = r["request"]["url"].as_str().unwrap_or_default();
        assert!(
            url.starts_with(origin) || url.starts_with("data:"),
            "the page fetched {url}: no external assets allowed"
        );
    }
}

#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_in_headless_chromium() {
    let stack = tier_b(
        &[GpuNode::new("gpu-1", 2), GpuNode::new("gpu-2", 2)],
        Grants::ReadOnly,
    )
    .await;
    let admin = stack.admin();
    // The homelab story, live: an idle notebook, a busy job, a stopped notebook whose pod a
    // finalizer holds Terminating, a pending trial, a namespace with a GPU quota and one without.
    stack.ensure_namespace(TEAM).await.expect("namespace");
    stack.ensure_namespace(TRIALS).await.expect("namespace");
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}
    }))
    .expect("quota");
    Api::<ResourceQuota>::namespaced(admin.clone(), TEAM)
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota");
    stack
        .create_notebook(&Notebook::new(TEAM, "alice-nb").node("gpu-1"))
        .await
        .expect("alice");
    stack
        .create_notebook(
            &Notebook::new(TEAM, "bob-nb")
                .node("gpu-2")
                .pod_finalizer("gpu-ledger.test/hold"),
        )
        .await
        .expect("bob");
    stack
        .create_gpu_pod(TEAM, "train-llm", 1, Some(93.0))
        .await
        .expect("busy");
    for (ns, name) in [
        (TEAM, "alice-nb-0"),
        (TEAM, "bob-nb-0"),
        (TEAM, "train-llm"),
    ] {
        stack.wait_pod_running(ns, name).await.expect("running");
    }
    stack
        .create_gpu_pod(TRIALS, "hp-trial-42", 2, None)
        .await
        .expect("pending");
    // Stop bob's notebook the way Kubeflow does; its pod stays Terminating (finalizer).
    let stop_rule = spawn_notebook_stop_rule(admin.clone());
    let notebooks: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        TEAM,
        &gpu_ledger_testkit::stack::notebook_resource(),
    );
    notebooks
        .patch(
            "bob-nb",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"kubeflow-resource-stopped": "2026-01-01T00:00:00Z"}}}),
            ),
        )
        .await
        .expect("stop bob");

    let gl = stack
        .start_gpu_ledger(
            Path::new(env!("CARGO_BIN_EXE_gpu-ledger")),
            "gpu-ledger",
            &["--stuck-after", "1s"],
        )
        .await
        .expect("gpu-ledger serve ready");
    let origin = gl.url().to_string();
    eventually("a settled ledger", WAIT, || async {
        let v = gl.ledger_json().await.ok()?;
        let row = |name: &str| {
            v["pods"]
                .as_array()?
                .iter()
                .find(|p| p["pod"] == name)
                .cloned()
        };
        let settled = row("alice-nb-0")?["idle"] == true
            && row("train-llm")?["idle"] == false
            && row("bob-nb-0")?["stuck"] == true
            && row("bob-nb-0")?["notebook_stopped"] == true
            && row("hp-trial-42")?["pending_reason"].is_string();
        settled.then_some(())
    })
    .await;
    stop_rule.abort();

    let logs = tempfile::tempdir().expect("tmp");
    let browser = Browser::launch(logs.path()).expect("headless chromium");
    eprintln!("browser: {}", browser.version().expect("version"));

    // 1. JavaScript off: the server's rendering, checked against the JSON API.
    let off = browser.page(1280, 900, false).expect("tab");
    off.watch_network().expect("network");
    off.navigate(&format!("{origin}/")).expect("load /");
    let ledger = gl.ledger_json().await.expect("ledger");
    assert_eq!(
        off.evaluate("document.body.getAttribute('data-rendered')")
            .expect("attr"),
        Value::Null,
        "the script must not have run"
    );
    let rows = table_rows(&off, "pods");
    let pods = ledger["pods"].as_array().expect("pods");
    assert_eq!(rows.len(), pods.len(), "{rows:?}\n{ledger:#}");
    for p in pods {
        let row = rows
            .iter()
            .find(|r| r[0] == p["namespace"] && r[1] == p["pod"])
            .unwrap_or_else(|| panic!("no row for {p}"));
        assert_eq!(row[2], p["node"].as_str().unwrap_or("-"), "{row:?}");
        assert_eq!(row[3], p["state"].as_str().expect("state"), "{row:?}");
        let util = p["utilization"]
            .as_f64()
            .map_or_else(|| "-".into(), percent);
        assert_eq!(row[5], util, "{row:?} vs {p}");
        assert_eq!(row[7], p["notebook"].as_str().unwrap_or("-"), "{row:?}");
    }
    let alice = rows.iter().find(|r| r[1] == "alice-nb-0").expect("alice");
    assert!(
        alice[8].contains(
            "kubectl annotate notebook -n team-ml -- alice-nb kubeflow-resource-stopped="
        ),
        "{alice:?}"
    );
    let bob = rows.iter().find(|r| r[1] == "bob-nb-0").expect("bob");
    assert!(bob[8].contains("\"finalizers\":null"), "{bob:?}");
    // Its finalizer on a Ready (kwok) node: a force delete would not free it, so none is offered.
    assert!(
        bob[8].contains("finalizer gpu-ledger.test/hold keeps it") && !bob[8].contains("--force"),
        "{bob:?}"
    );
    let namespaces = table_rows(&off, "namespaces");
    let trials = namespaces
        .iter()
        .find(|r| r[0] == TRIALS)
        .expect("trials row");
    assert_eq!(trials[4], "none (!)", "{trials:?}");
    assert!(
        trials[5]
            .contains("kubectl create quota gpu-quota -n trials --hard=requests.nvidia.com/gpu=2"),
        "{trials:?}"
    );
    // Who could run: the pending trial, as many rows as the JSON has options (or one).
    let reclaim = table_rows(&off, "reclaim");
    let planned = ledger["reclaim"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["pending"]["pod"] == "hp-trial-42"))
        .expect("hp-trial-42 planned");
    let options = planned["options"].as_array().expect("options").len();
    assert_eq!(
        reclaim
            .iter()
            .filter(|r| r[0] == "trials/hp-trial-42")
            .count(),
        options.max(1),
        "{reclaim:?}\n{planned:#}"
    );
    // Quotas and queues: the team's quota row as the JSON has it; Kueue is not installed here.
    let quotas = table_rows(&off, "quotas");
    let team_quota = ledger["quotas"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["namespace"] == TEAM))
        .expect("the team's quota row in the JSON");
    let row = quotas
        .iter()
        .find(|r| r[0] == TEAM)
        .unwrap_or_else(|| panic!("no quota row for {TEAM}: {quotas:?}"));
    assert_eq!(row[1..3], ["nvidia.com/gpu", "4"], "{row:?}");
    assert_eq!(
        row[3],
        team_quota["used"]
            .as_u64()
            .map_or_else(|| "?".to_string(), |u| u.to_string()),
        "{row:?} vs {team_quota}"
    );
    assert_eq!(
        off.evaluate("document.getElementById('queues-empty').innerText")
            .expect("queues-empty"),
        Value::String("Kueue not found: no queue rows.".into())
    );
    let summary = off
        .evaluate("document.getElementById('summary').innerText")
        .expect("summary");
    let summary = summary.as_str().expect("text").replace('\n', " ");
    assert!(
        summary.contains("4allocatable") || summary.contains("4 allocatable"),
        "{summary}"
    );
    // Sorting and filtering without the script: the query string.
    off.navigate(&format!("{origin}/?namespace=team-ml&sort=util&dir=desc"))
        .expect("load filtered");
    let rows = table_rows(&off, "pods");
    assert!(rows.iter().all(|r| r[0] == TEAM), "{rows:?}");
    assert_eq!(
        rows[0][1], "train-llm",
        "highest utilisation first: {rows:?}"
    );
    assert_clean(&off, &origin);

    // 2. The script renders the same text from the same data: one saved page, both ways.
    let html = reqwest::get(format!("{origin}/"))
        .await
        .expect("GET /")
        .text()
        .await
        .expect("body");
    let saved = logs.path().join("page.html");
    std::fs::write(&saved, &html).expect("save page");
    let file_url = format!("file://{}?refresh=3600", saved.display());
    off.navigate(&file_url).expect("saved page, no script");
    let server_text = page_text(&off);
    let on = browser.page(1280, 900, true).expect("tab");
    on.navigate(&file_url).expect("saved page, script");
    on.wait_for(
        "document.body.getAttribute('data-rendered') === 'script'",
        WAIT,
    )
    .expect("the script rendered (a CSP or script error would stop it)");
    assert_eq!(
        page_text(&on),
        server_text,
        "script and server render the same ledger differently"
    );
    // Sorting and filtering in place.
    on.evaluate("document.querySelector('#pods th[data-key=\"gpus\"] a').click()")
        .expect("click");
    on.evaluate("document.querySelector('#pods th[data-key=\"gpus\"] a').click()")
        .expect("click again: descending");
    let rows = table_rows(&on, "pods");
    assert_eq!(rows[0][1], "hp-trial-42", "2 GPUs first: {rows:?}");
    on.evaluate(
        "(() => { const s = document.querySelector('#filters select[name=node]'); s.value = 'gpu-2'; s.dispatchEvent(new Event('change', {bubbles: true})); })()",
    )
    .expect("filter");
    let rows = table_rows(&on, "pods");
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r[2] == "gpu-2"),
        "{rows:?}"
    );
    assert_clean(&on, "file://");
    drop(on);

    // 3. Served, with the script: it refreshes itself and follows the cluster.
    let live = browser.page(1280, 900, true).expect("tab");
    live.watch_network().expect("network");
    live.navigate(&format!("{origin}/?refresh=1"))
        .expect("load / with refresh");
    live.wait_for(
        "Number(document.body.getAttribute('data-refreshes')) >= 1",
        WAIT,
    )
    .expect("a first refresh");
    let util_of = |page: &Page<'_>| {
        table_rows(page, "pods")
            .into_iter()
            .find(|r| r[1] == "train-llm")
            .map(|r| r[5].clone())
    };
    assert_eq!(util_of(&live).as_deref(), Some("93%"));
    live.evaluate("window.sameDocument = true").expect("marker");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), TEAM);
    pods.patch(
        "train-llm",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {UTILIZATION_ANNOTATION: "41"}}})),
    )
    .await
    .expect("change utilisation");
    live.wait_for(
        "Array.from(document.querySelectorAll('#pods tbody tr')).some(tr => tr.cells[1].innerText === 'train-llm' && tr.cells[5].innerText === '41%')",
        WAIT,
    )
    .expect("the row follows the new utilisation");
    assert_eq!(
        live.evaluate("window.sameDocument === true")
            .expect("marker"),
        Value::Bool(true),
        "refreshed in place, not reloaded"
    );
    // The same rows as the API now.
    let ledger = gl.ledger_json().await.expect("ledger");
    let busy = ledger["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .find(|p| p["pod"] == "train-llm")
        .expect("busy");
    assert_eq!(percent(busy["utilization"].as_f64().expect("util")), "41%");
    let shot = artifact_path();
    std::fs::create_dir_all(shot.parent().expect("dir")).expect("artifact dir");
    live.screenshot(&shot).expect("screenshot");
    eprintln!("screenshot: {}", shot.display());
    assert!(std::fs::metadata(&shot).expect("png").len() > 10_000);
    // Deleting a pod takes its row away on the next refresh.
    pods.delete("train-llm", &DeleteParams::default())
        .await
        .expect("delete");
    live.wait_for(
        "!Array.from(document.querySelectorAll('#pods tbody tr')).some(tr => tr.cells[1].innerText === 'train-llm')",
        WAIT,
    )
    .expect("the deleted pod's row goes");
    assert_clean(&live, &origin);
    drop(live);

    // 4. Hostile text from an offline dump is text, in both renderings.
    let dir = hostile_dump();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-ledger"))
        .args(["report", "-o", "html", "--from"])
        .arg(dir.path())
        .output()
        .expect("report -o html");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.path().join("page.html");
    std::fs::write(&file, &out.stdout).expect("write page");
    let url = format!("file://{}", file.display());
    for javascript in [false, true] {
        let page = browser.page(1280, 900, javascript).expect("tab");
        page.navigate(&url).expect("hostile page");
        if javascript {
            page.wait_for(
                "document.body.getAttribute('data-rendered') === 'script'",
                WAIT,
            )
            .expect("script ran");
        }
        let injected = page
            .evaluate("document.querySelectorAll('main img, main script, main b.injected').length")
            .expect("count");
        assert_eq!(
            injected,
            json!(0),
            "markup from the dump became elements (js {javascript})"
        );
        let notes = page
            .evaluate("Array.from(document.querySelectorAll('#pods tbody tr')).map(tr => tr.cells[8].textContent)")
            .expect("notes");
        assert!(
            notes
                .as_array()
                .expect("notes")
                .iter()
                .any(|n| n.as_str().is_some_and(|n| n.contains(HOSTILE_TEXT))),
            "{notes} (js {javascript})"
        );
        assert_clean(&page, "file://");
    }
}

const HOSTILE_TEXT: &str = "<img src=x onerror=alert(1)><b class=injected>x</b>";

/// The homelab dumps with markup in the pending pod's scheduling message (free text in the API
/// too; a name with markup is refused when the dump is loaded, see tests/hostile_input.rs).
fn hostile_dump() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    let lab = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/homelab");
    for f in [
        "nodes.json",
        "notebooks.json",
        "quotas.json",
        "statefulsets.json",
        "rayclusters.json",
        "dcgm.prom",
    ] {
        std::fs::copy(lab.join(f), dir.path().join(f)).expect("copy");
    }
    let pods = std::fs::read_to_string(lab.join("pods.json")).expect("pods");
    let pods = pods.replace(
        "\"message\": \"0/4 nodes are available: 4 Insufficient nvidia.com/gpu.\"",
        &format!(
            "\"message\": {}",
            serde_json::to_string(HOSTILE_TEXT).expect("json")
        ),
    );
    assert!(
        pods.contains("onerror"),
        "the homelab dump changed: update the test"
    );
    std::fs::write(dir.path().join("pods.json"), pods).expect("write pods");
    dir
}
