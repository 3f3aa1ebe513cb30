# syntax=docker/dockerfile:1
# The operator image: `murmur operator` on a glibc runtime base with no shell, non-root.
#
# Compiled inside the build, from the repository root (docker/BuildKit, podman or buildah):
#   docker build -f images/operator.Dockerfile -t ghcr.io/murmur-dev/murmur-operator:0.1.0 .
# From binaries built outside it: a context directory holding `murmur` (images/build.sh
# --binaries makes one):
#   docker build -f images/operator.Dockerfile --build-arg BINARIES=prebuilt -t ... CONTEXT
#
# Build arguments: RUST_IMAGE (the compiling stage's base), RUNTIME_IMAGE (the image's base: any
# glibc root filesystem; images/build.sh --local-base makes one from Debian's packages),
# BINARIES (compiled | prebuilt). Both ways end in the same runtime stage.
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARIES=compiled

FROM ${RUST_IMAGE} AS compiled
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile operator --locked -p murmur --bin murmur \
 && install -D target/operator/murmur /out/murmur

FROM scratch AS prebuilt
COPY murmur /out/murmur

FROM ${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
COPY --from=binaries /out/murmur /usr/local/bin/murmur
# The chart's runAsUser; distroless's `nonroot`.
USER 65532:65532
EXPOSE 8470
ENTRYPOINT ["/usr/local/bin/murmur"]
CMD ["operator"]
