# The csi-provisioner sidecar image: a drop-in for
# registry.k8s.io/sig-storage/csi-provisioner, built the way upstream builds
# its own: the static binary is compiled outside (scripts/image.sh, which
# `make image` runs) and copied onto upstream's base, with upstream's
# entrypoint path and upstream's user (root: no USER line, so a driver socket
# created by root accepts us; running as another user: README, "Running as
# non-root").
#
# The build context is a directory holding only the static (musl) binary of
# one architecture, named csi-provisioner, and the SBOM (CycloneDX, from
# Cargo.lock), named sbom.cdx.json; scripts/image.sh builds one image per
# architecture and a manifest list of them. By hand, for amd64:
#
#   cargo build --release --target x86_64-unknown-linux-musl --bin csi-provisioner
#   mkdir ctx && cp target/x86_64-unknown-linux-musl/release/csi-provisioner ctx/
#   cargo cyclonedx --format json --target x86_64-unknown-linux-musl \
#       --override-filename sbom.cdx && mv sbom.cdx.json ctx/
#   podman build --platform linux/amd64 -f Dockerfile -t csi-provisioner:dev ctx
#
# BASE=scratch builds with no registry at all: the binary needs no libc, no
# shell and no file of the base.
ARG BASE=gcr.io/distroless/static:latest
FROM ${BASE}
ARG BASE
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="csi-provisioner" \
      org.opencontainers.image.description="Drop-in Rust replacement for the Kubernetes CSI external-provisioner sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${BASE}"
COPY csi-provisioner /csi-provisioner
COPY sbom.cdx.json /sbom.cdx.json
ENTRYPOINT ["/csi-provisioner"]
