# syntax=docker/dockerfile:1
# The trainer images: `murmur-trainer run`, one member of a job, with the MNIST sample compiled in.
# From the repository root:
#   docker build -f images/trainer.Dockerfile --target cpu  -t ghcr.io/murmur-dev/murmur-trainer:0.1.0 .
#   docker build -f images/trainer.Dockerfile --target cuda -t ghcr.io/murmur-dev/murmur-trainer:0.1.0-cuda .
# The operator starts them with `run` and the env contract (README, "Trainer environment").

# CPU: burn's ndarray backend, on distroless.
FROM docker.io/library/rust:1.95-bookworm AS build-cpu
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p murmur-trainer --bin murmur-trainer \
 && install -D target/release/murmur-trainer /out/murmur-trainer

FROM gcr.io/distroless/cc-debian12:nonroot AS cpu
COPY --from=build-cpu /out/murmur-trainer /usr/local/bin/murmur-trainer
USER 65532:65532
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/murmur-trainer"]
CMD ["run"]

# CUDA: burn's cuda backend compiles without the toolkit but loads libcuda (from the node's
# driver, mounted by the NVIDIA device plugin) and NVRTC (from this runtime image) at run time.
FROM docker.io/library/rust:1.95-bookworm AS build-cuda
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p murmur-trainer --bin murmur-trainer --features cuda \
 && install -D target/release/murmur-trainer /out/murmur-trainer

FROM docker.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS cuda
COPY --from=build-cuda /out/murmur-trainer /usr/local/bin/murmur-trainer
# The same numeric non-root user as the CPU image (the pod's runAsUser).
USER 65532:65532
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/murmur-trainer"]
CMD ["run"]
