# The README's commands: `make test` (everything CI runs) and `make demo`.
# Every target installs what it needs on a fresh machine of this kind.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

MODULE            := github.com/image-prefetcher/image-prefetcher
VERSION           := $(shell cat VERSION)
BIN               := $(CURDIR)/bin
LDFLAGS           := -s -w -X $(MODULE)/fn/version.Version=$(VERSION)
KUSTOMIZE_VERSION := v5.8.2
CONTROLLER_GEN_VERSION := v0.23.0
# kpt is not go-installable at a pinned version (its module needs a newer
# toolchain and replaces), so `make tools` checks the one on PATH instead.
KPT_VERSION       := 1.0.0-beta.56
KUBE_VERSION      := v1.36.3
KUBE_BIN_DIR      ?= $(HOME)/.cache/image-prefetcher/kube/$(KUBE_VERSION)
# The runtimes of the runtime matrix besides Debian's containerd 1.6
# (tests/runtimes): built from the Go module proxy, cached by version.
CONTAINERD_VERSION := v2.4.2
CRIO_VERSION       := v1.34.0
RUNTIMES_DIR      ?= $(HOME)/.cache/image-prefetcher/runtimes
# libseccomp-dev, gcc and pkg-config build CRI-O; conmon runs its containers.
APT_PACKAGES      := containerd runc etcd-server containernetworking-plugins iptables iproute2 util-linux conmon libseccomp-dev gcc libc6-dev pkg-config

comma := ,

export PATH := $(BIN):$(PATH)
export KUBE_BIN_DIR
export RUNTIMES_DIR
export CGO_ENABLED := 0
# One set of compiler flags for every go command here (builds, tests, go
# run), so that each package is compiled once per platform: -trimpath for
# the release binaries, and grpcnotrace, which drops grpc's
# golang.org/x/net/trace, whose html/template use disables the linker's
# dead-method elimination (-5 MB binary, -2.5 MiB idle RSS; docs/agent.md).
# The Dockerfiles build with the same flags.
GO_BUILD_FLAGS := -trimpath -tags=grpcnotrace
export GOFLAGS := $(strip $(filter-out $(GO_BUILD_FLAGS),$(shell go env GOFLAGS)) $(GO_BUILD_FLAGS))
# Test binaries are linked on every run (about 50 of them in make test) and
# never debugged there: without DWARF a link takes a fifth less CPU.
TEST_LDFLAGS := -ldflags=-w

.PHONY: build test unit e2e tools host-deps kube runtimes FORCE

## ---- build ------------------------------------------------------------------
build: $(BIN)/image-prefetcher $(BIN)/image-prefetcher-fn

$(BIN)/image-prefetcher: FORCE
	go build -ldflags '$(LDFLAGS)' -o $@ ./agent/cmd/image-prefetcher

$(BIN)/image-prefetcher-fn: FORCE
	go build -ldflags '$(LDFLAGS)' -o $@ ./fn/cmd/image-prefetcher-fn

## ---- tools and host dependencies ----------------------------------------------
# What the kustomize path needs (`make build tools`, docs/install.md): no kpt.
tools: $(BIN)/kustomize

# The tools only the tests use: the kpt check and controller-gen, which
# tests/examples TestCRDIsUpToDate runs.
.PHONY: test-tools
test-tools: tools kpt-check $(BIN)/controller-gen

# The ImagePrefetcher CRD, for tools that read schemas (docs/api.md);
# tests/examples TestCRDIsUpToDate checks it.
.PHONY: crd
crd: $(BIN)/controller-gen
	CONTROLLER_GEN=$(BIN)/controller-gen fn/api/crd/generate.sh

$(BIN)/controller-gen:
	@echo ">> installing controller-gen $(CONTROLLER_GEN_VERSION) into $(BIN)"
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

# tests/examples runs the real `kpt fn render` and `kpt fn eval`; a missing or
# different kpt fails here, with the fix, before the tests start (make test,
# make e2e) instead of half-way through them.
.PHONY: kpt-check
kpt-check:
	@kpt=$$(command -v kpt) || { echo "!! kpt not found on PATH. Install kpt $(KPT_VERSION): curl -fsSL -o /usr/bin/kpt https://github.com/kptdev/kpt/releases/download/v$(KPT_VERSION)/kpt_linux_amd64 && chmod +x /usr/bin/kpt (see docs/testing.md)" >&2; exit 1; }; \
	 v=$$("$$kpt" version 2>&1) || { echo "!! $$kpt version failed: $$v" >&2; exit 1; }; \
	 if [ "$$v" != "$(KPT_VERSION)" ]; then echo "!! $$kpt reports version '$$v', want $(KPT_VERSION): install it as docs/testing.md says" >&2; exit 1; fi; \
	 echo ">> kpt $$v at $$kpt"

# kubectl kustomize cannot run exec functions; the standalone binary can.
$(BIN)/kustomize:
	@echo ">> installing kustomize $(KUSTOMIZE_VERSION) into $(BIN)"
	GOBIN=$(BIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

# podman runs the function image under kpt (tests/examples): no daemon, and
# without its recommends (slirp4netns, fuse-overlayfs, ...), which it does
# not use here.
host-deps:
	@missing=0; for c in containerd runc etcd iptables ip nsenter unshare podman conmon gcc pkg-config; do command -v $$c >/dev/null || missing=1; done; \
	 [ -x /usr/lib/cni/bridge ] || missing=1; \
	 pkg-config --exists libseccomp 2>/dev/null || missing=1; \
	 if [ $$missing = 1 ]; then echo ">> apt-get install $(APT_PACKAGES) podman"; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null && \
	   DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman >/dev/null; \
	 else echo ">> host packages present"; fi

kube:
	KUBE_VERSION=$(KUBE_VERSION) KUBE_BIN_CACHE=$(KUBE_BIN_DIR) tests/cluster/hack/build-kube.sh

# containerd 2.x and CRI-O (+ pinns), ~3 min on 2 cores the first time.
# containerd is pure Go; CRI-O needs host-deps' libseccomp-dev and gcc.
RUNTIMES_BUILD = CONTAINERD_VERSION=$(CONTAINERD_VERSION) CRIO_VERSION=$(CRIO_VERSION) RUNTIMES_CACHE=$(RUNTIMES_DIR) tests/cluster/hack/build-runtimes.sh
runtimes: host-deps
	$(RUNTIMES_BUILD) all

## ---- container images (needs a Docker engine; see Dockerfile, Dockerfile.fn) ----
# Both images are stamped with the same VERSION as `make build`, and the agent
# tag is the default image the function renders (fn/version.AgentImage).
AGENT_IMAGE ?= ghcr.io/image-prefetcher/image-prefetcher:$(VERSION)
FN_IMAGE    ?= ghcr.io/image-prefetcher/image-prefetcher-fn:$(VERSION)
DOCKER      ?= docker

.PHONY: images images-multiarch
images:
	$(DOCKER) build -f Dockerfile --build-arg VERSION=$(VERSION) -t $(AGENT_IMAGE) .
	$(DOCKER) build -f Dockerfile.fn --build-arg VERSION=$(VERSION) -t $(FN_IMAGE) .

# The release build (docs/release.md): one image index per image, built and
# pushed by buildx for every platform of OCI_PLATFORMS. The Dockerfiles
# cross-compile on the build machine (FROM --platform=$$BUILDPLATFORM,
# GOOS/GOARCH from TARGETOS/TARGETARCH), so no emulation is needed.
images-multiarch:
	$(DOCKER) buildx build --platform $(subst $(eval) ,$(comma),$(OCI_PLATFORMS)) -f Dockerfile --build-arg VERSION=$(VERSION) -t $(AGENT_IMAGE) --push .
	$(DOCKER) buildx build --platform $(subst $(eval) ,$(comma),$(OCI_PLATFORMS)) -f Dockerfile.fn --build-arg VERSION=$(VERSION) -t $(FN_IMAGE) --push .

## ---- OCI layouts without a container engine (tests/ociimage) ----------------
# The same images as `make images`, as OCI layouts in ./out/oci, each an
# image index with one image per platform of OCI_PLATFORMS: static Go
# cross-builds into out/bin/<os>_<arch>, no engine, no emulation. The agent
# runs as root (it must reach the root-owned CRI socket), the function as
# nonroot. docs/release.md: how the indexes and per-arch digests are
# published.
OCI_PLATFORMS ?= linux/amd64 linux/arm64
OUT_BIN       := $(CURDIR)/out/bin

.PHONY: oci
oci: build
	@for p in $(OCI_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; dir=$(OUT_BIN)/$${os}_$${arch}; \
	  echo ">> cross-building for $$p into $$dir"; \
	  GOOS=$$os GOARCH=$$arch go build -ldflags '$(LDFLAGS)' -o $$dir/ ./agent/cmd/image-prefetcher ./fn/cmd/image-prefetcher-fn; \
	done
	go run ./tests/ociimage/cmd/ociimage -user 0:0 -ref $(AGENT_IMAGE) -out out/oci/image-prefetcher \
	  $(foreach p,$(OCI_PLATFORMS),-platform $(p)=$(OUT_BIN)/$(subst /,_,$(p))/image-prefetcher)
	go run ./tests/ociimage/cmd/ociimage -user 65532:65532 -ref $(FN_IMAGE) -out out/oci/image-prefetcher-fn \
	  $(foreach p,$(OCI_PLATFORMS),-platform $(p)=$(OUT_BIN)/$(subst /,_,$(p))/image-prefetcher-fn)

# The function's darwin builds, which tests/release's release makes: compiled
# beside the builds, at the unit tests' lower priority, so that on a fresh
# machine they compete neither with the builds the clusters wait for nor
# with the clusters (the Go build cache keeps them).
.PHONY: fn-darwin
fn-darwin:
	for arch in amd64 arm64; do GOOS=darwin GOARCH=$$arch go build -o /dev/null ./fn/cmd/image-prefetcher-fn; done

## ---- release (tests/release, docs/release.md) --------------------------------
# From a tagged tree to a release in REGISTRY: both images as amd64+arm64
# indexes, pushed as $(REGISTRY)/image-prefetcher:$(VERSION) and
# $(REGISTRY)/image-prefetcher-fn:$(VERSION), each signed as `cosign sign
# --key` signs (key in COSIGN_PRIVATE_KEY, password in COSIGN_PASSWORD) and
# with a CycloneDX SBOM attached; then out/release/ with the function
# binaries, the manifests pinned to the pushed digests and SHA256SUMS.
# Registry credentials: REGISTRY_USERNAME/REGISTRY_PASSWORD or the docker
# config. RELEASE_FLAGS=-require-tag (CI) refuses a tree that is not clean
# at tag v$(VERSION). No container engine is needed.
REGISTRY      ?= ghcr.io/image-prefetcher
RELEASE_FLAGS ?=
.PHONY: release
release: tools
	go run ./tests/release/cmd/release -registry $(REGISTRY) -version $(VERSION) \
	  -kustomize $(BIN)/kustomize -out out/release -work out/release-build $(RELEASE_FLAGS)

## ---- tests ------------------------------------------------------------------
# `make test` starts every phase as soon as its inputs are there (make -j):
# the unit tests, the Kubernetes build, apt then the runtime builds, and the
# project's binaries, tools and OCI layouts all start at once; the tests
# against real components start when the builds are done, beside the unit
# tests, which they do not need (most of their time is waiting on kubelets
# and runtimes, and the unit tests use the cores meanwhile). Each phase's
# lines are prefixed with [phase]; the log ends with one line per phase
# (start, duration, result), also when a phase failed.
TEST_PHASES := $(CURDIR)/out/test-phases
T0 ?= $(shell date +%s)

# $(call phase,NAME,COMMAND): runs COMMAND, its output prefixed with [NAME],
# and records NAME's start, duration and exit status in $(TEST_PHASES).
define phase
@s=$$(date +%s); rc=0; \
 { $(2); } 2>&1 | sed -u 's/^/[$(1)] /' || rc=$$?; \
 echo "$(1) $$((s - $(T0))) $$(( $$(date +%s) - s )) $$rc" >> $(TEST_PHASES); exit $$rc
endef

.PHONY: test-phases phase-unit phase-kube phase-host-deps phase-containerd phase-cri-o phase-build phase-e2e
test:
	@mkdir -p $(dir $(TEST_PHASES)); : > $(TEST_PHASES); rm -f $(E2E_LOG) $(UNIT_LOG); t0=$$(date +%s); rc=0; \
	 $(MAKE) --no-print-directory -j test-phases T0=$$t0 || rc=$$?; \
	 echo ">> make test: phase times (phases overlap)"; \
	 awk -v total=$$(( $$(date +%s) - t0 )) -v rc=$$rc ' \
	   function d(x) { return sprintf("%dm%02ds", x / 60, x % 60) } \
	   { printf ">>   %-10s start +%-7s took %-7s %s\n", $$1, d($$2), d($$3), ($$4 == 0 ? "ok" : "FAILED (exit " $$4 ")") } \
	   END { printf ">>   %-10s %s, %s\n", "total", d(total), (rc == 0 ? "passed" : "FAILED") }' $(TEST_PHASES); \
	 for log in $(UNIT_LOG) $(E2E_LOG); do \
	   if [ $$rc -ne 0 ] && grep -qE -- '^ *--- FAIL|^FAIL|^panic:' $$log 2>/dev/null; then \
	     echo ">> what failed (the whole output: $$log)"; \
	     awk -f tests/cluster/hack/failures.awk $$log | head -n 200 || true; \
	   fi; \
	 done; \
	 exit $$rc

test-phases: phase-e2e phase-unit
# Nothing waits for the unit tests and the darwin builds: on a fresh machine
# they yield the two cores to the builds the clusters wait for (nice), and
# take what the clusters leave.
phase-unit:
	$(call phase,unit,nice -n 10 $(MAKE) --no-print-directory unit fn-darwin | tee $(UNIT_LOG))
phase-kube:
	$(call phase,kube,$(MAKE) --no-print-directory kube)
phase-host-deps:
	$(call phase,host-deps,$(MAKE) --no-print-directory host-deps)
phase-containerd:
	$(call phase,containerd,$(RUNTIMES_BUILD) containerd)
phase-cri-o: phase-host-deps
	$(call phase,cri-o,$(RUNTIMES_BUILD) cri-o)
phase-build:
	$(call phase,build,$(MAKE) --no-print-directory oci test-tools)
phase-e2e: phase-kube phase-containerd phase-cri-o phase-build
	$(call phase,e2e,$(E2E_TEST))

# ./docs/: every flag, API field, metric, reason and exit code the code has
# is in docs/, and every docs link resolves (docs/coverage_test.go).
unit:
	@echo ">> unit tests"
	go test $(TEST_LDFLAGS) ./fn/... ./agent/... ./docs/

# Tests against real components. They fail loudly, never skip, when
# something they need is missing.
# oci: the cluster smoke test pulls the out/oci layouts through a node's
# containerd, so they must be the ones of this build.
# Each package starts its own cluster in a network namespace of its own, and
# most of their time is waiting on kubelets and runtimes: E2E_PARALLEL
# packages run side by side, the longest first (docs/testing.md).
E2E_PARALLEL ?= 4
E2E_FIRST    := e2e conformance slots runtimes interact examples pins readiness
E2E_PKGS      = $(addprefix ./tests/,$(E2E_FIRST)) $(filter-out $(addprefix ./tests/,$(E2E_FIRST)),$(shell go list -f '{{if or .TestGoFiles .XTestGoFiles}}./{{slice .ImportPath (len "$(MODULE)/")}}{{end}}' ./tests/...))
# The whole output also goes to $(E2E_LOG): at its very end, where a CI
# log's tail shows them, make test names the failed tests, each with its
# last lines (tests/cluster/hack/failures.awk). -count=1: Go's
# test cache sees the test code, not the apiserver, kubelets and runtimes
# the tests drive, so a cached pass (tests/scale's was) proves nothing.
E2E_LOG      := $(CURDIR)/out/e2e.log
UNIT_LOG     := $(CURDIR)/out/unit.log
E2E_TEST      = echo ">> tests against real components, $(E2E_PARALLEL) packages at a time" && go test $(TEST_LDFLAGS) -p $(E2E_PARALLEL) -count=1 -timeout 60m -v $(E2E_PKGS) 2>&1 | tee $(E2E_LOG)
e2e: build test-tools host-deps kube runtimes oci
	@$(E2E_TEST)

# The oldest Kubernetes the rendering claims: ValidatingAdmissionPolicy v1
# and its authorizer checks are GA in 1.30. The core end-to-end scenarios on
# that version, outside `make test`: building another Kubernetes is the
# longest build of a fresh machine's `make test` (15 to 31 minutes on 2 cores
# beside the other builds; cached by version after). Its last run, on
# 2026-12-07 with v1.30.14: 14 min 46 s, about 10 of them building, passed.
KUBE_OLDEST     ?= v1.30.14
KUBE_OLDEST_DIR := $(HOME)/.cache/image-prefetcher/kube/$(KUBE_OLDEST)
E2E_OLDEST_RUN  ?= Test0[1-9]|Test1[0-4]|TestRolloutKeepsTheLabel|TestOwnershipSameNameInstances
.PHONY: e2e-oldest
e2e-oldest: build tools host-deps oci
	$(MAKE) --no-print-directory kube KUBE_VERSION=$(KUBE_OLDEST) KUBE_BIN_DIR=$(KUBE_OLDEST_DIR)
	@echo ">> core end-to-end scenarios on Kubernetes $(KUBE_OLDEST)"
	KUBE_BIN_DIR=$(KUBE_OLDEST_DIR) go test -p 1 -count=1 -timeout 40m -v -run '$(E2E_OLDEST_RUN)' ./tests/e2e/

## ---- benchmark (tests/bench, docs/benchmarks.md) ------------------------------
# Herd control against a simulated cluster: a real kube-apiserver, many
# containerd nodes, the real agent, a bandwidth-capped registry. Needs root;
# takes about 6 minutes. Writes docs/benchmarks.md and its plot. The nodes'
# images go on this machine's disk: it refuses to start if they would take
# that disk past the agent's 80% ceiling (as the kubelet counts it).
.PHONY: bench
BENCH_FLAGS ?=
bench: build host-deps kube
	@echo ">> benchmark"
	go run ./tests/bench/cmd/bench -agent $(BIN)/image-prefetcher -out docs/benchmarks.md -plot docs/benchmarks-completion.png $(BENCH_FLAGS)

## ---- scale simulation (tests/scale, docs/scale.md) ---------------------------
# Herd control at 1,000 simulated nodes with pulls of 15-60 s (K=50, K=100, one seed) and,
# with K=50, three faults (apiserver outage, lost answers, a shrinking
# herd): a real kube-apiserver, Node objects with a pod-bound identity each,
# the agent's own herd-control, pull and labeling code with metrics on, on a
# fake runtime with a shared bandwidth model. A config ending in -join
# (SCALE_FLAGS=-configs=n1000-k50-join) then has two nodes join alone,
# the second with its first Lease list answered 503.
# Needs root; takes an hour or more. Writes docs/scale.md and its plot;
# -from/-before (SCALE_FLAGS) report runs made one at a time side by side.
# Its smallest run is TestScaleSmoke, part of `make test`.
.PHONY: scale
SCALE_FLAGS ?=
scale: host-deps kube
	@echo ">> scale simulation"
	go run ./tests/scale/cmd/scale $(SCALE_FLAGS)

## ---- demo (tests/cluster/cmd/demo, docs/demo.md) ------------------------------
# A local 2-node cluster, left running, with examples/quickstart deployed
# unchanged. Its runs live in $(DEMO_DIR), apart from the tests' runs, so
# `make demo-down` removes the demo's cluster and nothing else. Needs root.
.PHONY: demo demo-down
DEMO_DIR ?= /tmp/ipf-demo
demo: build tools host-deps kube oci
	@echo ">> demo"
	go build -o $(BIN)/cluster ./tests/cluster/cmd/cluster
	IMAGE_PREFETCHER_DEMO_DIR=$(DEMO_DIR) go run ./tests/cluster/cmd/demo up -cluster $(BIN)/cluster -bin $(BIN)

demo-down:
	go build -o $(BIN)/cluster ./tests/cluster/cmd/cluster
	IMAGE_PREFETCHER_DEMO_DIR=$(DEMO_DIR) go run ./tests/cluster/cmd/demo down -cluster $(BIN)/cluster

FORCE:
