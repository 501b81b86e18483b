# syntax=docker/dockerfile:1
#
# The csi-provisioner sidecar image: a drop-in for
# registry.k8s.io/sig-storage/csi-provisioner (same entrypoint path, same flags).
#
#   docker build -t csi-provisioner:dev .
#
# Stage 1 builds a fully static binary on Alpine: the host target there is
# *-unknown-linux-musl, which links the C runtime statically by default, and
# the only C code in the build (ring) needs nothing but gcc and musl-dev. TLS is
# rustls and csi.proto is compiled by protox, so no OpenSSL and no protoc.
# Stage 2 is distroless "static" (no shell, no libc; CA certificates, tzdata and
# /etc/passwd only), running as its non-root user.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-alpine AS builder
RUN apk add --no-cache gcc musl-dev
WORKDIR /src
COPY . .
# The cache mounts keep the registry and the build directory between builds
# (BuildKit); the binary is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p csi-provisioner --bin csi-provisioner \
    && install -D -m 0755 target/release/csi-provisioner /out/csi-provisioner

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="csi-provisioner" \
      org.opencontainers.image.description="Drop-in Rust replacement for the Kubernetes CSI external-provisioner sidecar" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/csi-provisioner /csi-provisioner
# Numeric, so that `runAsNonRoot: true` can verify it. The CSI socket must be
# connectable by this user: run the driver container with the same UID (see
# deploy/kubernetes/deployment.yaml) or have it create the socket group- or
# world-writable.
USER 65532:65532
ENTRYPOINT ["/csi-provisioner"]
