package v1alpha1

const (
	Group      = "image-prefetcher.stackrox.io"
	Version    = "v1alpha1"
	APIVersion = Group + "/" + Version
	Kind       = "ImagePrefetcher"

	// LabelDomain prefixes the per-instance node label and annotation:
	// image-prefetcher.stackrox.io/<instance>.
	LabelDomain = "image-prefetcher.stackrox.io"

	// Values of the per-instance node label.
	LabelSucceeded = "succeeded"
	LabelFailed    = "failed"
)

// PullPolicy decides whether an image already on the node is pulled again.
type PullPolicy string

const (
	PullIfNotPresent PullPolicy = "IfNotPresent"
	PullAlways       PullPolicy = "Always"
	// PullKubelet follows the kubelet's default: Always for ":latest" or an
	// untagged reference, IfNotPresent otherwise.
	PullKubelet PullPolicy = "Kubelet"
)
