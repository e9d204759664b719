# syntax=docker/dockerfile:1
# The agent image: a static image-prefetcher binary on distroless static.
# Build from the repository root: docker build -f Dockerfile -t <tag> .  (or `make images`)

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
# Modules first, so that the download layer survives source edits.
COPY go.mod go.sum ./
RUN go mod download
COPY VERSION ./
# The agent imports the API, the image-list parser and the version from fn/.
COPY fn/ fn/
COPY agent/ agent/
ARG TARGETOS
ARG TARGETARCH
# VERSION defaults to the VERSION file, which is what the Makefile stamps too.
ARG VERSION=
# grpcnotrace: the same tag as `make build`, for the agent's small footprint
# (see docs/agent.md, Footprint).
RUN version="${VERSION:-$(cat VERSION)}" && \
    CGO_ENABLED=0 GOOS="$TARGETOS" GOARCH="$TARGETARCH" GOTOOLCHAIN=local \
    go build -trimpath -tags grpcnotrace \
      -ldflags "-s -w -X github.com/image-prefetcher/image-prefetcher/fn/version.Version=${version}" \
      -o /out/image-prefetcher ./agent/cmd/image-prefetcher

# distroless/static has no shell and no package manager; CGO is off, so the
# binary needs nothing from the base but CA certificates and /etc/passwd.
FROM gcr.io/distroless/static-debian12
COPY --from=build /out/image-prefetcher /usr/local/bin/image-prefetcher
# Root on purpose: the CRI socket on the host is owned by root and mode 0660,
# so a non-root agent could not talk to the runtime. The pod still drops every
# capability, forbids privilege escalation and mounts the socket read-only.
USER 0:0
ENTRYPOINT ["/usr/local/bin/image-prefetcher"]
