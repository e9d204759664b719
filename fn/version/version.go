// Package version holds the release version shared by the function and the
// agent, so that a function of release X renders the agent image of release X.
package version

// Version is overwritten at build time from the top-level VERSION file
// (-ldflags -X). The literal is kept equal to that file by a test, so that
// `go test` and `go run` render the same default image as a release build.
var Version = "0.1.0"

// AgentImageRepository is where release images of the agent are published.
// A var, not a const, so that `make release REGISTRY=...` can stamp the
// registry the release was pushed to (-ldflags -X): a function released into
// a private registry renders the agent image of that registry by default.
var AgentImageRepository = "ghcr.io/image-prefetcher/image-prefetcher"

// AgentImageDigest, when set at build time by `make release`, is the digest
// of the agent image index pushed with this release: the function then
// renders the agent pinned to it, repository:version@digest.
var AgentImageDigest = ""

// FunctionImageRepository is where release images of the function are published.
const FunctionImageRepository = "ghcr.io/image-prefetcher/image-prefetcher-fn"

// AgentImage is the default agent image of this release.
func AgentImage() string {
	if AgentImageDigest != "" {
		return AgentImageRepository + ":" + Version + "@" + AgentImageDigest
	}
	return AgentImageRepository + ":" + Version
}
