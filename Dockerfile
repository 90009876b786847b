# syntax=docker/dockerfile:1
# The isthmus image: one static binary (agent, controller, uninstall, plan), the
# CNI plugins the agent installs (isthmus-cni and the reference portmap), plus
# the tools an operator reaches for on a node: bpftool and iproute2.
#
#   docker build --build-arg VERSION=... --build-arg COMMIT=... -t isthmus:dev .
#   (see the build stage for the values `make` uses)
#
# The BPF objects and their Go bindings are committed (bpf2go output), so the
# build needs neither clang nor kernel headers.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The reference portmap plugin (hostPort) comes from the module cache at the
# version go.mod pins (a tool of the module), not from a release tarball.
# Which build this is: `isthmus version`, the CNI plugin's VERSION answer and the
# isthmus_build_info metric print them. .git is not in the build context
# (.dockerignore), so the toolchain cannot stamp the commit (hence -buildvcs=false):
# pass both, as `make` computes them:
#   docker build --build-arg VERSION=$(git describe --tags --match 'v*' --dirty || echo dev) \
#                --build-arg COMMIT=$(git rev-parse HEAD) -t isthmus:dev .
ARG VERSION=dev
ARG COMMIT=unknown
# Static: CGO_ENABLED=0 (cilium/ebpf and vishvananda/netlink are pure Go), so the
# binary runs on any base and carries no libc dependency.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    LDFLAGS="-s -w -X github.com/isthmus-dev/isthmus/loader/buildinfo.Release=${VERSION} -X github.com/isthmus-dev/isthmus/loader/buildinfo.Commit=${COMMIT}" \
 && CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
      -ldflags "$LDFLAGS" -o /out/isthmus ./cmd/isthmus \
 && CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
      -ldflags "$LDFLAGS" -o /out/isthmus-cni ./cmd/isthmus-cni \
 && CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false \
      -ldflags "$LDFLAGS" -o /out/portmap github.com/containernetworking/plugins/plugins/meta/portmap

# Debian, not distroless: the agent pod is where an operator debugs the datapath
# (kubectl exec ... bpftool map dump pinned /sys/fs/bpf/isthmus/routes, bpftool
# link show, ip route show proto 201), and the manifests use a shell: the init
# container that mounts bpffs where the node has none, the readiness probe
# (test -f), the uninstall DaemonSet's idle container (sleep). distroless has
# none of these, and bpftool with its libelf, zlib and libcap cannot be copied in
# cleanly. trixie rather than bookworm: bookworm's bpftool 7.1 predates tcx
# (Linux 6.6) and cannot name the tcx links the agent attaches with; trixie's
# can, and golang:1.26 is built on trixie too.
FROM debian:trixie-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="isthmus" \
      org.opencontainers.image.description="eBPF GENEVE datapath joining the pod networks of several Kubernetes sites: agent, controller and tools" \
      org.opencontainers.image.source="https://github.com/isthmus-dev/isthmus" \
      org.opencontainers.image.version="${VERSION}"
# iptables and nftables: the agent's nat exemption for other CNIs' MASQUERADE, in the
# iptables nat table and in a table of its own for CNIs that write nftables
# (docs/architecture.md, "Netfilter").
RUN apt-get update \
 && apt-get install -y --no-install-recommends bpftool iproute2 iptables nftables \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/isthmus /usr/local/bin/isthmus
# The CNI plugin; the agent copies it into the node's /opt/cni/bin (docs/cni.md).
COPY --from=build /out/isthmus-cni /usr/local/bin/isthmus-cni
# The reference portmap plugin, which isthmus's conflist chains after isthmus-cni
# for hostPort; the agent copies it into /opt/cni/bin beside isthmus-cni.
COPY --from=build /out/portmap /usr/local/bin/portmap
# No USER: the agent must run as root (it loads BPF programs, pins on the node's
# bpffs, creates isthmus0 and writes net sysctls; see deploy/agent-daemonset.yaml).
# The controller needs nothing of the kind, and its Deployment runs it as
# UID 65532 with a read-only root filesystem and no capabilities.
ENTRYPOINT ["isthmus"]
