//! Benchmarks of the live refresh's CPU path at N = 500 (4,000 GPUs × 3 DCGM fields, 12,000
//! series): decoding Prometheus' answer to the window's range-vector selector and folding it
//! into the held sample window (`SampleWindow`). The first refresh reads the whole window
//! (40 samples a series) into an empty window; a steady one reads the last 3 samples of every
//! series, all of them already held. A refresh reads the answer as the service does
//! (`PromClient::window_series`: envelope and `data` in one scan, the envelope judged, warnings
//! counted), then folds it into the window. The first refresh is also timed the way issue 38
//! read it (`first_…_two_scans`: the envelope scanned with `data` skipped, then the body scanned
//! again for `data`), to measure what the one scan saves; the steady refresh through an owned
//! path (`decode::query_data`, every label decoded into owned maps, and `SampleWindow::absorb`)
//! for comparison. Figures are recorded in docs/benchmarks.md.

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use gpu_ledger::usage::fields;
use gpu_ledger::usage::live::SampleWindow;
use gpu_ledger::usage::prom::{AnswerBody, ApiResponse, PromClient, PromConfig, QueryData, decode};
use serde::de::IgnoredAny;

/// The allocator the `gpu-ledger` binary ships with (src/main.rs): decoding and absorbing
/// allocate per series, so the allocator is part of what is measured.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 500;
const GPUS_PER_NODE: usize = 8;
/// Scrape interval (ms) and the newest sample's time.
const STEP_MS: i64 = 15_000;
const NEWEST_MS: i64 = 1_790_000_000_000;
/// The window kept (10 minutes: 40 samples of 15 s).
const WINDOW_MS: i64 = 600_000;

/// Prometheus' answer to `{__name__=~"…"}[range]` for every GPU: `samples` samples per series,
/// the newest at `newest_ms`. Labels as dcgm-exporter 4.x writes them (testkit's fake exporter:
/// `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, the pod's
/// `container`/`namespace`/`pod`, the driver version) plus the scrape's `instance` and `job`,
/// in the byte order Prometheus keeps a label set in.
fn answer(samples: i64, newest_ms: i64) -> Vec<u8> {
    let mut body = String::from(r#"{"status":"success","data":{"resultType":"matrix","result":["#);
    let mut first = true;
    for n in 0..NODES {
        for g in 0..GPUS_PER_NODE {
            for (f, field) in [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL, fields::FB_USED]
                .into_iter()
                .enumerate()
            {
                if !first {
                    body.push(',');
                }
                first = false;
                let team = (n * GPUS_PER_NODE + g) % 200;
                write!(
                    body,
                    r#"{{"metric":{{"__name__":"{field}","DCGM_FI_DRIVER_VERSION":"550.54.15","Hostname":"gpu-node-{n:05}","UUID":"GPU-{n:08x}-{g:04x}-4c1e-9b8a-5d2f{g:08x}","container":"main","device":"nvidia{g}","gpu":"{g}","instance":"10.{}.{}.7:9400","job":"dcgm-exporter","modelName":"NVIDIA H100 80GB HBM3","namespace":"team-{team}","pci_bus_id":"00000000:{:02X}:00.0","pod":"job-{n:05}-{g}"}},"values":["#,
                    n / 250,
                    n % 250,
                    0x18 + g * 0x10,
                )
                .expect("write to a String");
                for k in (0..samples).rev() {
                    let t = newest_ms - k * STEP_MS;
                    let v = match f {
                        0 => format!("{:.6}", ((n + g) % 10) as f64 / 10.0),
                        1 => format!("{}", (n + g) % 100),
                        _ => "40960".to_string(),
                    };
                    let sep = if k == 0 { "" } else { "," };
                    write!(body, r#"[{}.{:03},"{v}"]{sep}"#, t / 1000, t % 1000)
                        .expect("write to a String");
                }
                body.push_str("]}");
            }
        }
    }
    body.push_str("]}}");
    body.into_bytes()
}

/// The answer's envelope as the client reads it before handing the body on (`data` skipped):
/// the first scan of the owned path, and of the window's read before issue 41.
fn envelope(body: &[u8]) {
    let r: ApiResponse<IgnoredAny> = serde_json::from_slice(body).expect("an envelope");
    assert_eq!(r.warnings.count, 0);
}

/// One refresh as the service reads it: the answer read in one scan (envelope judged, `data`
/// decoded borrowing from the body), then folded into the window.
fn refresh(client: &PromClient, window: &mut SampleWindow, body: &AnswerBody, keep_after: i64) {
    let answer = client.window_series(body).expect("a matrix answer");
    assert_eq!(answer.warnings.count, 0);
    window.absorb_answer(&answer.value, keep_after);
}

/// One refresh as issue 38 read it: the envelope scanned with `data` skipped, then the body
/// scanned again for the series (`decode::window`, which reads the envelope again, unjudged:
/// the old second scan skipped it, a difference of a few bytes in 14 MB).
fn refresh_two_scans(window: &mut SampleWindow, body: &[u8], keep_after: i64) {
    envelope(body);
    let fresh = decode::window(body).expect("a matrix answer");
    window.absorb_answer(&fresh, keep_after);
}

/// One refresh through owned label maps (every label decoded, then cut and found in the window).
fn refresh_owned(window: &mut SampleWindow, body: &[u8], keep_after: i64) {
    envelope(body);
    let fresh = decode::query_data(body)
        .and_then(QueryData::into_series)
        .expect("a matrix answer");
    window.absorb(fresh, keep_after);
}

fn bench_window(c: &mut Criterion) {
    // A client is only needed to judge answers and count their warnings: it never connects.
    let client = PromClient::new(PromConfig::new(
        "http://127.0.0.1:9/".parse().expect("a URL"),
        std::time::Duration::from_secs(30),
    ))
    .expect("a client");
    let full = AnswerBody::ok(answer(40, NEWEST_MS));
    // The next refresh, 15 s later, with two intervals of overlap: one new sample a series.
    let steady = AnswerBody::ok(answer(3, NEWEST_MS + STEP_MS));
    // The window after the first refresh (rebuilt for every timed steady refresh, untimed).
    let held = || {
        let mut w = SampleWindow::default();
        refresh(&client, &mut w, &full, NEWEST_MS - WINDOW_MS);
        w
    };
    assert_eq!(held().len(), NODES * GPUS_PER_NODE * 3);

    let mut g = c.benchmark_group("window_refresh");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(full.bytes().len() as u64));
    g.bench_function("first_4000_gpus_40_samples", |b| {
        b.iter_batched_ref(
            SampleWindow::default,
            |w| refresh(&client, w, black_box(&full), NEWEST_MS - WINDOW_MS),
            BatchSize::PerIteration,
        );
    });
    g.bench_function("first_4000_gpus_40_samples_two_scans", |b| {
        b.iter_batched_ref(
            SampleWindow::default,
            |w| refresh_two_scans(w, black_box(full.bytes()), NEWEST_MS - WINDOW_MS),
            BatchSize::PerIteration,
        );
    });
    // Samples older than this fall out of the window at the steady refresh.
    let steady_keep = NEWEST_MS + STEP_MS - WINDOW_MS;
    g.throughput(Throughput::Bytes(steady.bytes().len() as u64));
    g.bench_function("steady_4000_gpus_3_samples", |b| {
        b.iter_batched_ref(
            &held,
            |w| refresh(&client, w, black_box(&steady), steady_keep),
            BatchSize::PerIteration,
        );
    });
    g.bench_function("steady_4000_gpus_3_samples_owned", |b| {
        b.iter_batched_ref(
            &held,
            |w| refresh_owned(w, black_box(steady.bytes()), steady_keep),
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

criterion_group!(benches, bench_window);
criterion_main!(benches);
