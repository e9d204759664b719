// Package version holds the release version shared by the function and the
// agent, so that a function of release X renders the agent image of release X.
package version

// Version is overwritten at build time from the top-level VERSION file
// (-ldflags -X). The literal is kept equal to that file by a test, so that
// `go test` and `go run` render the same default image as a release build.
var Version = "0.1.0"

// AgentImageRepository is where release images of the agent are published.
const AgentImageRepository = "ghcr.io/image-prefetcher/image-prefetcher"

// FunctionImageRepository is where release images of the function are published.
const FunctionImageRepository = "ghcr.io/image-prefetcher/image-prefetcher-fn"

// AgentImage is the default agent image of this release.
func AgentImage() string { return AgentImageRepository + ":" + Version }
