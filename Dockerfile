# syntax=docker/dockerfile:1
#
# gpu-ledger container image.
#
#   docker build --build-arg GPU_LEDGER_VERSION=0.1.0 \
#     --build-arg GPU_LEDGER_REVISION=$(git rev-parse --short=12 HEAD) -t gpu-ledger:0.1.0 .
#
# The binary links glibc (ring, rustls): the runtime is distroless/cc (glibc + libgcc, no shell),
# matching the bookworm builder's glibc. `gpu-ledger --version` prints the crate version and
# GPU_LEDGER_REVISION (the build context has no .git); GPU_LEDGER_VERSION only labels the image.

FROM rust:1.95-bookworm AS builder
ARG GPU_LEDGER_REVISION=unknown
ENV GPU_LEDGER_REVISION=${GPU_LEDGER_REVISION}
WORKDIR /src
COPY . .
# tests/deploy_chart.rs checks this cargo line (--release --locked, and that the lock file is
# current).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin gpu-ledger \
 && install -D -m 0755 target/release/gpu-ledger /out/gpu-ledger

FROM gcr.io/distroless/cc-debian12:nonroot
ARG GPU_LEDGER_VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-ledger" \
      org.opencontainers.image.description="Joins Kubernetes GPU claims with DCGM utilisation" \
      org.opencontainers.image.version="${GPU_LEDGER_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpu-ledger/gpu-ledger"
COPY --from=builder /out/gpu-ledger /usr/local/bin/gpu-ledger
# The binary uses mimalloc; purge freed pages at once instead of after a delay that the refresh
# interval never leaves idle: steady RSS at 4,000 GPUs 57 MiB instead of ~115 (docs/benchmarks.md).
ENV MIMALLOC_PURGE_DELAY=0
# distroless "nonroot" is 65532:65532; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/gpu-ledger"]
CMD ["serve"]
