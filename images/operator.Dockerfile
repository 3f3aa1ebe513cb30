# syntax=docker/dockerfile:1
# The operator image: `murmur operator` on distroless (glibc, CA certificates, no shell), non-root.
# From the repository root:
#   docker build -f images/operator.Dockerfile -t ghcr.io/murmur-dev/murmur-operator:0.1.0 .
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p murmur --bin murmur \
 && install -D target/release/murmur /out/murmur

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/murmur /usr/local/bin/murmur
# The chart's runAsUser; distroless's `nonroot`.
USER 65532:65532
EXPOSE 8470
ENTRYPOINT ["/usr/local/bin/murmur"]
CMD ["operator"]
