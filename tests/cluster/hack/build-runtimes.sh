#!/usr/bin/env bash
# Builds the container runtimes the runtime matrix runs besides Debian's
# containerd 1.6, from the Go module proxy, and caches them by version under
# RUNTIMES_CACHE/<name>/<version>; only binaries missing from the cache are
# built (docs/testing.md):
#   containerd  CONTAINERD_VERSION  containerd, containerd-shim-runc-v2
#   cri-o       CRIO_VERSION        crio, pinns
# Each is built in a throwaway wrapper module, beside the cache, and renamed
# into it, so that a cached binary is always whole.
set -euo pipefail
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRIO_VERSION=${CRIO_VERSION:-v1.34.0}
CACHE=${RUNTIMES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/image-prefetcher/runtimes}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_containerd() {
  local dir="$CACHE/containerd/$CONTAINERD_VERSION"
  if [ -x "$dir/containerd" ] && [ -x "$dir/containerd-shim-runc-v2" ]; then echo "containerd $CONTAINERD_VERSION cached in $dir"; return; fi
  echo ">> building containerd $CONTAINERD_VERSION into $dir (first time only, ~1.5 min on 2 cores)"
  local w="$work/containerd"
  mkdir -p "$w" "$dir"
  (
    cd "$w"
    printf 'module containerdbuild\n\ngo 1.26\n' > go.mod
    GOFLAGS=-mod=mod go get "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" >/dev/null
    # The shim too: the host's, from Debian's containerd 1.6, cannot run
    # the pods of a containerd 2.x node ("type with url ...: not found").
    for cmd in containerd containerd-shim-runc-v2; do
      [ -x "$dir/$cmd" ] && continue
      GOFLAGS=-mod=mod go get "github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD_VERSION" >/dev/null
      # No btrfs/devmapper/zfs headers on the host; the tests use overlayfs.
      CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        -tags 'no_btrfs no_devmapper no_zfs' -o "$dir/.$cmd.tmp" "github.com/containerd/containerd/v2/cmd/$cmd"
      mv "$dir/.$cmd.tmp" "$dir/$cmd"
    done
  )
}

build_crio() {
  local dir="$CACHE/cri-o/$CRIO_VERSION"
  if [ -x "$dir/crio" ] && [ -x "$dir/pinns" ]; then echo "cri-o $CRIO_VERSION cached in $dir"; return; fi
  echo ">> building cri-o $CRIO_VERSION into $dir (first time only, ~1.5 min on 2 cores)"
  local w="$work/crio"
  mkdir -p "$w" "$dir"
  local src
  src=$(go mod download -json "github.com/cri-o/cri-o@$CRIO_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$src" ] || { echo "!! go mod download github.com/cri-o/cri-o@$CRIO_VERSION gave no source directory" >&2; exit 1; }
  if [ ! -x "$dir/crio" ]; then
    (
      cd "$w"
      printf 'module criobuild\n\ngo 1.26\n' > go.mod
      # CRI-O's own go.sum: without it the checksum database is asked about
      # two pseudo-versions it does not know, and the build stops.
      cp "$src/go.sum" go.sum
      chmod u+w go.sum
      GOFLAGS=-mod=mod go get "github.com/cri-o/cri-o/cmd/crio@$CRIO_VERSION" >/dev/null
      # Cgo for seccomp (libseccomp-dev); no btrfs/devicemapper headers here.
      CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -ldflags '-s -w' \
        -tags 'containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper seccomp' \
        -o "$dir/.crio.tmp" github.com/cri-o/cri-o/cmd/crio
    )
    mv "$dir/.crio.tmp" "$dir/crio"
  fi
  if [ ! -x "$dir/pinns" ]; then
    # CRI-O will not start without pinns, even for image pulls alone; its C
    # source ships in the module zip.
    gcc -std=c99 -O3 -static -o "$dir/.pinns.tmp" "$src"/pinns/src/*.c
    mv "$dir/.pinns.tmp" "$dir/pinns"
  fi
}

case "${1:-all}" in
  containerd) build_containerd ;;
  cri-o|crio) build_crio ;;
  all) build_containerd; build_crio ;;
  *) echo "usage: $0 [containerd|cri-o|all]" >&2; exit 2 ;;
esac
echo ">> runtime binaries ready in $CACHE"
