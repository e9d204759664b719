#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
# and kubectl at KUBE_VERSION from the Go module proxy and caches them by
# version; only binaries missing from the cache are built.
# k8s.io/kubernetes cannot be required directly without replacing every
# staging module, hence the throwaway wrapper module.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
CACHE=${KUBE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/image-prefetcher/kube/$KUBE_VERSION}
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

missing=()
for b in "${BINS[@]}"; do [ -x "$CACHE/$b" ] || missing+=("$b"); done
if [ "${#missing[@]}" = 0 ]; then echo "kube binaries $KUBE_VERSION cached in $CACHE"; exit 0; fi

staging_version="v0.${KUBE_VERSION#v1.}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
echo ">> building Kubernetes $KUBE_VERSION ${missing[*]} into $CACHE (first time only)"
gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
  echo "module kubebuild"
  echo "go 1.26"
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  grep -oE '=> \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" | sed 's#=> ./staging/src/##' | sort -u |
    while read -r m; do echo "replace $m => $m $staging_version"; done
} > go.mod
{
  echo '//go:build tools'
  echo
  echo 'package tools'
  echo
  echo 'import ('
  for b in "${missing[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$b\""; done
  echo ')'
} > tools.go
GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
mkdir -p "$CACHE"
pkgs=()
for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
echo ">> go build ${missing[*]}"
# One go build for all, so that each link overlaps the compiling of other
# binaries' packages (a build each waited for every link in turn).
out="$CACHE/.build"
rm -rf "$out" && mkdir -p "$out"
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -tags tools -ldflags "$ldflags" -o "$out/" "${pkgs[@]}"
# Built beside the cache and renamed, so that a cached binary is always whole.
for b in "${missing[@]}"; do mv "$out/$b" "$CACHE/$b"; done
rmdir "$out"
echo ">> kube binaries ready in $CACHE"
