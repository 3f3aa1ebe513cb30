# syntax=docker/dockerfile:1
# The trainer images: `murmur-trainer run`, one member of a job, with the MNIST sample compiled in.
# The operator starts them with `run` and the env contract (README, "Trainer environment").
#
# Compiled inside the build, from the repository root (docker/BuildKit, podman or buildah):
#   docker build -f images/trainer.Dockerfile --target cpu  -t ghcr.io/murmur-dev/murmur-trainer:0.1.0 .
#   docker build -f images/trainer.Dockerfile --target cuda -t ghcr.io/murmur-dev/murmur-trainer:0.1.0-cuda .
# From binaries built outside it: a context directory holding `murmur-trainer` (and, for the
# cuda target, `murmur-trainer-cuda`, built with --features cuda); images/build.sh --binaries
# makes one:
#   docker build -f images/trainer.Dockerfile --target cpu --build-arg BINARIES=prebuilt -t ... CONTEXT
#
# Build arguments: RUST_IMAGE (the compiling stages' base), RUNTIME_IMAGE (the CPU image's base:
# any glibc root filesystem; images/build.sh --local-base makes one from Debian's packages),
# CUDA_RUNTIME_IMAGE (the CUDA image's base: NVRTC and the CUDA runtime), BINARIES (compiled |
# prebuilt). Both ways end in the same runtime stages.
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG CUDA_RUNTIME_IMAGE=docker.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG BINARIES=compiled

# CPU: burn's flex backend.
FROM ${RUST_IMAGE} AS compiled-cpu
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p murmur-trainer --bin murmur-trainer \
 && install -D target/release/murmur-trainer /out/murmur-trainer

FROM scratch AS prebuilt-cpu
COPY murmur-trainer /out/murmur-trainer

FROM ${BINARIES}-cpu AS binaries-cpu

FROM ${RUNTIME_IMAGE} AS cpu
COPY --from=binaries-cpu /out/murmur-trainer /usr/local/bin/murmur-trainer
USER 65532:65532
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/murmur-trainer"]
CMD ["run"]

# CUDA: burn's cuda backend compiles without the toolkit but loads libcuda (from the node's
# driver, mounted by the NVIDIA device plugin) and NVRTC (from this runtime image) at run time.
FROM ${RUST_IMAGE} AS compiled-cuda
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p murmur-trainer --bin murmur-trainer --features cuda \
 && install -D target/release/murmur-trainer /out/murmur-trainer

FROM scratch AS prebuilt-cuda
COPY murmur-trainer-cuda /out/murmur-trainer

FROM ${BINARIES}-cuda AS binaries-cuda

FROM ${CUDA_RUNTIME_IMAGE} AS cuda
COPY --from=binaries-cuda /out/murmur-trainer /usr/local/bin/murmur-trainer
# The same numeric non-root user as the CPU image (the pod's runAsUser).
USER 65532:65532
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/murmur-trainer"]
CMD ["run"]
