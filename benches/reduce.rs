//! Benchmarks of the per-refresh reduction at N = 500 (4,000 GPUs × 3 DCGM fields, 12,000
//! series, 40 samples each: a 10-minute window at 15 s): the full-window reduction
//! (`series::reduce` over every held series) against the incremental path
//! (`usage::running::RunningReduction`: a refresh folds only its new samples into per-device
//! running state and reduces from that). Figures are recorded in docs/benchmarks.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use gpu_ledger::ledger::usage::Window;
use gpu_ledger::usage::fields;
use gpu_ledger::usage::live::SampleWindow;
use gpu_ledger::usage::running::RunningReduction;
use gpu_ledger::usage::scheme::SchemeChoice;
use gpu_ledger::usage::series::{self, Series};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 500;
const GPUS_PER_NODE: usize = 8;
const STEP_MS: i64 = 15_000;
const NEWEST_MS: i64 = 1_790_000_000_000;
const WINDOW_MS: i64 = 600_000;

/// Every GPU's three series with `samples` samples each, the newest at `newest_ms` (labels cut
/// to those the window keeps, as dcgm-exporter 4.x writes them).
fn series(samples: i64, newest_ms: i64) -> Vec<Series> {
    let mut out = Vec::with_capacity(NODES * GPUS_PER_NODE * 3);
    for n in 0..NODES {
        for g in 0..GPUS_PER_NODE {
            let labels: BTreeMap<String, String> = [
                ("Hostname", format!("gpu-node-{n:05}")),
                ("UUID", format!("GPU-{n:08x}-{g:04x}-4c1e-9b8a-5d2f{g:08x}")),
                ("container", "main".into()),
                ("gpu", g.to_string()),
                ("instance", format!("10.{}.{}.7:9400", n / 250, n % 250)),
                ("modelName", "NVIDIA H100 80GB HBM3".into()),
                (
                    "namespace",
                    format!("team-{}", (n * GPUS_PER_NODE + g) % 200),
                ),
                ("pod", format!("job-{n:05}-{g}")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let labels = Arc::new(labels);
            for (f, field) in [fields::GR_ENGINE_ACTIVE, fields::GPU_UTIL, fields::FB_USED]
                .into_iter()
                .enumerate()
            {
                let samples = (0..samples)
                    .rev()
                    .map(|k| {
                        let v = match f {
                            0 => ((n + g) % 10) as f64 / 10.0,
                            1 => ((n + g) % 100) as f64,
                            _ => 40960.0,
                        };
                        (newest_ms - k * STEP_MS, v)
                    })
                    .collect();
                out.push(Series {
                    name: field.to_string(),
                    labels: Arc::clone(&labels),
                    samples,
                });
            }
        }
    }
    out
}

fn window() -> Window {
    Window {
        length: chrono::Duration::milliseconds(WINDOW_MS),
        interval: chrono::Duration::seconds(30),
        idle_threshold: 0.05,
        max_staleness: chrono::Duration::minutes(2),
    }
}

fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_millis(ms).expect("a time")
}

fn bench_reduce(c: &mut Criterion) {
    let window = window();
    let now = NEWEST_MS + STEP_MS;
    // The window after the first refresh and one steady refresh (one new sample a series).
    let held = || {
        let mut w = SampleWindow::default();
        let mut running = RunningReduction::default();
        w.absorb(series(40, NEWEST_MS), NEWEST_MS - WINDOW_MS);
        running.reduce(&w, SchemeChoice::Auto, &window, at(NEWEST_MS));
        w.absorb(series(3, now), now - WINDOW_MS);
        (w, running)
    };
    let (w, mut running) = held();
    let incremental = running.reduce(&w, SchemeChoice::Auto, &window, at(now));
    let scheme = *running.scheme().expect("a scheme");
    assert_eq!(incremental.len(), NODES * GPUS_PER_NODE);
    assert_eq!(
        series::reduce(w.series(), &scheme, &window, at(now)),
        incremental
    );

    let mut g = c.benchmark_group("reduce");
    g.sample_size(10);
    g.bench_function("full_window_4000_gpus", |b| {
        b.iter(|| series::reduce(black_box(w.series()), &scheme, &window, at(now)));
    });
    g.bench_function("incremental_4000_gpus", |b| {
        b.iter_batched_ref(
            &held,
            |(w, running)| running.reduce(black_box(w), SchemeChoice::Auto, &window, at(now)),
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

criterion_group!(benches, bench_reduce);
criterion_main!(benches);
