// Package allowlist tells, from an instance's rendered manifests, which of
// its images are public, and prints the kubelet configuration that keeps
// every other prefetched image private (KEP-2535): a prefetched image has
// no kubelet pull record, so the kubelet's default policy lets any pod on
// the node run it; NeverVerifyAllowlistedImages verifies all but the
// allowlisted names against the registry with the pod's own credentials.
package allowlist

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
)

// Public returns the images of the rendered manifests that their agents
// pull without credentials: those of every DaemonSet whose agent has no
// --docker-config and no --image-credential-provider-config. The list of
// a DaemonSet is the ConfigMap its image-list volume mounts, which must be
// among the manifests.
func Public(manifests io.Reader) ([]string, error) {
	var sets []daemonSet
	lists := map[string]string{} // namespace/name -> image list
	r := utilyaml.NewYAMLReader(bufio.NewReader(manifests))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read manifests: %w", err)
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("read manifests: %w", err)
		}
		switch head.Kind {
		case "DaemonSet":
			var ds daemonSet
			if err := yaml.Unmarshal(doc, &ds); err != nil {
				return nil, fmt.Errorf("DaemonSet: %w", err)
			}
			sets = append(sets, ds)
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal(doc, &cm); err != nil {
				return nil, fmt.Errorf("ConfigMap: %w", err)
			}
			if l, ok := cm.Data[v1alpha1.ImageListKey]; ok {
				lists[cm.Namespace+"/"+cm.Name] = l
			}
		}
	}
	var public []string
	found := false
	for _, ds := range sets {
		cm := listConfigMap(ds.Spec.Template.Spec)
		if cm == "" {
			continue // not an agent's DaemonSet
		}
		found = true
		if withCredentials(ds.Spec.Template.Spec) {
			continue
		}
		text, ok := lists[ds.Namespace+"/"+cm]
		if !ok {
			return nil, fmt.Errorf("DaemonSet %s/%s: its image list, ConfigMap %s, is not in the manifests", ds.Namespace, ds.Name, cm)
		}
		for _, e := range imagelist.Parse(text).Entries {
			if e.Err != nil {
				return nil, fmt.Errorf("ConfigMap %s/%s: line %d: %w", ds.Namespace, cm, e.Line, e.Err)
			}
			public = append(public, e.Ref)
		}
	}
	if !found {
		return nil, errors.New("no image-prefetcher DaemonSet in the manifests (give the output of kustomize build or kpt fn render)")
	}
	return public, nil
}

// daemonSet is the part of an apps/v1 DaemonSet read here; the agent's
// binary does without the apps/v1 types (their code is 0.4 MB).
type daemonSet struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Template struct {
			Spec corev1.PodSpec `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// listConfigMap returns the ConfigMap of the pod's image-list volume.
func listConfigMap(pod corev1.PodSpec) string {
	for _, v := range pod.Volumes {
		if v.Name == v1alpha1.ImageListVolume && v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	return ""
}

// withCredentials says whether any container of the pod pulls with pull
// secrets or credential-provider plugins.
func withCredentials(pod corev1.PodSpec) bool {
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		for _, a := range slices.Concat(c.Command, c.Args) {
			if strings.HasPrefix(a, "--docker-config") || strings.HasPrefix(a, "--image-credential-provider-config") {
				return true
			}
		}
	}
	return false
}

// Entries returns the kubelet's allowlist entries for images: each
// repository in every spelling pods use (imagelist.Spellings), sorted,
// without duplicates.
func Entries(images []string) ([]string, error) {
	var out []string
	for _, img := range images {
		s, err := imagelist.Spellings(img)
		if err != nil {
			return nil, err
		}
		out = append(out, s...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Snippet is the KubeletConfiguration fragment for entries.
func Snippet(entries []string) string {
	var b bytes.Buffer
	b.WriteString("# KubeletConfiguration fields: images pulled without credentials start\n")
	b.WriteString("# without a registry round-trip; every other image, prefetched or not,\n")
	b.WriteString("# is verified against the registry with the pod's own credentials.\n")
	b.WriteString("imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\n")
	if len(entries) == 0 {
		b.WriteString("preloadedImagesVerificationAllowlist: []\n")
		return b.String()
	}
	b.WriteString("preloadedImagesVerificationAllowlist:\n")
	for _, e := range entries {
		fmt.Fprintf(&b, "- %s\n", e)
	}
	return b.String()
}
