//! What a Prometheus answer may hold: the bounds the client checks while reading a body and the
//! decoders check before copying anything out of it, and the mark of an error that crossed one.

/// Largest answer accepted (bytes). 4,000 GPUs × 3 fields × 10 minutes of samples with full label
/// sets is about 15 MB; an answer 20 times that size is a misconfiguration (or a hostile
/// endpoint), not telemetry.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Longest label name or value accepted (bytes). Kubernetes names are at most 253 bytes, label
/// values 63, GPU UUIDs 40, driver versions and model names a few dozen: a longer one is not
/// telemetry, and one 200 MiB value took `serve` to a 1.84 GB peak (issue 22). A value over it
/// refuses the whole answer (not the series): answers are already all or nothing for a bad
/// sample value, and a dropped series would silently hide a device.
pub const MAX_LABEL_BYTES: usize = 4096;

/// Most labels on one series. dcgm-exporter writes about 15, service discovery adds a handful;
/// Mimir refuses to ingest more than 30 by default.
pub const MAX_LABELS_PER_SERIES: usize = 256;

/// Most series (or vector samples) in one answer. The largest cluster Kubernetes supports (5,000
/// nodes) of 8-GPU nodes split into 7 MIG instances each has 280,000 devices: 840,000 series
/// for the three fields read. Every series is held for the window, so more would not fit
/// anyway; a shared Thanos answering for many clusters wants `--prometheus-selector`.
pub const MAX_SERIES: usize = 1_000_000;

/// Marks a decoding error as a bound being exceeded (`PromError::TooLarge`).
pub const OVER_BOUND: &str = "answer over gpu-ledger's bounds";
