// Package v1alpha1 holds the ImagePrefetcher API. It depends on nothing
// heavy so that the agent can import it. The markers let controller-gen
// write the CRD that editors, kubeconform and Argo CD read (fn/api/crd,
// `make crd`).
//
// +groupName=image-prefetcher.stackrox.io
// +versionName=v1alpha1
package v1alpha1
