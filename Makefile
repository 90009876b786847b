# isthmus: every target a newcomer or CI needs. `make demo` and `make test` do their own set-up.
GO      ?= go
BIN     := bin/isthmus
# The lab and the benchmarks: a command of their own, so the image's binaries
# link none of it (TestImageLinksNoLab). Its agents run $(BIN), beside it.
LAB     := bin/isthmus-lab
# Which build this is (isthmus version, the CNI plugin's VERSION, isthmus_build_info):
# the release from the newest v* tag (dev when there is none) and the commit, with
# -dirty for uncommitted changes. Outside a git checkout COMMIT is empty and the
# binaries fall back to what the Go toolchain recorded (loader/buildinfo).
VERSION ?= $(shell git describe --tags --match 'v*' --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { [ -z "$$(git status --porcelain 2>/dev/null)" ] || c=$$c-dirty; echo $$c; })
LDFLAGS := -X github.com/isthmus-dev/isthmus/loader/buildinfo.Release=$(VERSION) -X github.com/isthmus-dev/isthmus/loader/buildinfo.Commit=$(COMMIT)
# Generated files that must match what `make generate` produces.
GENERATED := bpf api deploy/crds

.PHONY: all deps build image generate check-generated vet kube-binaries test test-unit fuzz bench demo lab-down conformance clean

all: build

deps:
	@./hack/install-deps.sh

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/isthmus
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/isthmus-cni ./cmd/isthmus-cni
	$(GO) build -o bin/portmap github.com/containernetworking/plugins/plugins/meta/portmap
	$(GO) build -ldflags '$(LDFLAGS)' -o $(LAB) ./cmd/isthmus-lab
	$(GO) build -o bin/cnitool github.com/containernetworking/cni/cnitool

# The image the Dockerfile describes, built without a registry or Docker engine: Debian
# trixie from Debian's mirrors by mmdebstrap (cached in /var/cache/isthmus), the static
# binaries, written as an OCI archive for `ctr -n k8s.io images import` (docs/install.md).
# Needs root. IMAGE_VERSION is its tag (isthmus:IMAGE_VERSION), its version label and
# the release its binaries report (the build's VERSION where the Makefile has one).
IMAGE_VERSION ?= $(or $(VERSION),dev)
IMAGE_LDFLAGS ?=
IMAGE_ARCHIVE ?= bin/isthmus-image.oci.tar
image: deps
	$(GO) run ./testenv/image/cmd/isthmus-image -version $(IMAGE_VERSION) -ldflags "$(IMAGE_LDFLAGS)" -o $(IMAGE_ARCHIVE)

# bpf2go (BPF objects and their Go bindings) and controller-gen (deep-copy, deploy/crds).
generate: deps
	$(GO) generate ./bpf/... ./api/...

# Regenerates and fails when the committed output differs: stale generated code is a bug.
check-generated: generate
	@if ! git diff --quiet -- $(GENERATED) || [ -n "$$(git status --porcelain --untracked-files=all -- $(GENERATED))" ]; then \
		echo "generated code is stale: run 'make generate' and commit the result" >&2; \
		git status --short -- $(GENERATED) >&2; exit 1; fi

vet:
	$(GO) vet ./...

# The kube-apiserver, etcd and kube-proxy the Kubernetes tests run, the container
# runtime tests' crictl, the Pod tests' kubelet and deploy/'s kubectl (kustomize),
# built once into /var/cache/isthmus with a progress line every few seconds (go test
# would hide it).
kube-binaries:
	$(GO) run ./testenv/kube/cmd/prebuild

# Unit tests, BPF program tests and end-to-end lab tests. Needs root (netns, BPF).
# testenv/bench first and alone: it measures throughput against kernel VXLAN, which
# another package on the same two cores would distort. Then every other package, two
# at a time (-p 2): the end-to-end tests judge paths, drops and bounded gaps, not speed,
# and they leave a core idle for long stretches (waiting on clusters, timeouts, the
# network), where the other packages compile and run: named first, the end-to-end
# package starts first. Each package's lab names, namespaces and pins are its own.
# Then a bounded run of every fuzz target (their seeds and corpus already ran above).
test: deps check-generated vet kube-binaries
	$(GO) test -p 1 -count=1 -timeout 15m ./testenv/bench
	$(GO) test -p 2 -count=1 -timeout 45m ./testenv/e2e $$($(GO) list ./... | grep -v -e '/testenv/bench$$' -e '/testenv/e2e$$')
	$(MAKE) fuzz

# The BPF fuzz targets (docs/fuzzing.md), FUZZTIME each, one after another (go test
# takes one -fuzz target at a time). Needs root. A failing input is written to
# bpf/testdata/fuzz/<target>/: commit it, it is a regression test from then on.
# The budget is a count of executions, not a duration: with a duration, Go up to 1.26
# can fail a clean run with a bare "context deadline exceeded" when the deadline races
# a busy worker (golang/go#75804; CI failed that way). 20,000 runs take 30-60 s per
# target here, which keeps a first `make test` within its budget (docs/development.md);
# FUZZTIME=10m still works for a long run, with that risk.
FUZZTIME ?= 20000x
# Minimizing each new interesting input runs up to 60 s by default, during which the
# workers report no executions: a 20 s run did ~8,500 executions. Ten tries each
# keeps the run fuzzing (~110,000 executions in 20 s for FuzzOraclePodIngress).
FUZZMINIMIZE ?= 10x
FUZZ_TARGETS := FuzzOracleUnderlayTC FuzzOracleUnderlayXDP FuzzOraclePodIngress FuzzOracleOverlayEgress FuzzOracleUnderlayEgress FuzzUnderlayIngress
fuzz:
	@for f in $(FUZZ_TARGETS); do \
		echo "fuzz $$f for $(FUZZTIME)"; \
		$(GO) test ./bpf -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) || exit 1; \
	done

# Only what needs no root and no kernel: loading, the plan, pure map diffs.
test-unit:
	$(GO) test -count=1 ./api/... ./loader/objects/... ./loader/plan/...

# Single TCP stream pod to pod: isthmus GENEVE vs kernel VXLAN vs plain routing, one run;
# then the control plane at fleet scale: plans of 500-20,000 nodes, event to maps through
# running agents at 5,000 nodes, and on the test API
# server 5,000 Nodes bootstrapped by the controller and heartbeating under an agent
# (about 5 minutes). docs/benchmarks.md.
bench: deps build kube-binaries
	$(LAB) bench
	$(LAB) bench --control-plane
	$(GO) test ./testenv/kube -run '^$$' -bench NodeChurn -benchtime 1x -timeout 30m

# Brings up the default lab, shows the connectivity matrix and a GENEVE frame on the wire.
demo: deps build
	-@$(LAB) lab down default >/dev/null 2>&1
	$(LAB) lab up default
	$(LAB) lab check default
	$(LAB) lab capture default
	@echo "lab is up: 'make lab-down' removes it"

lab-down: build
	$(LAB) lab down default

# Kubernetes' network conformance suite (e2e.test of the lab's kube release), full
# focus minus testenv/conformance/skip.txt, against a whole cluster of the lab
# (CONFORMANCE_SCENARIO). Writes the JUnit report to CONFORMANCE_REPORT and prints
# one line of passed, failed and skipped cases. docs/conformance.md.
CONFORMANCE_SCENARIO ?= default
CONFORMANCE_REPORT ?= conformance-report
conformance: deps build kube-binaries
	$(LAB) conformance --focus full --scenario $(CONFORMANCE_SCENARIO) --report $(CONFORMANCE_REPORT)

clean:
	rm -rf bin
