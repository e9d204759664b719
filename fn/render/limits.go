package render

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/kyaml/fn/framework"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
)

// durationFloors are the smallest values the durations may take (zero is
// judged before: refreshInterval takes 0 as "off"), each with the reason
// a user reads when below it.
var durationFloors = map[string]struct {
	min time.Duration
	why string
}{
	"spec.refreshInterval":            {time.Minute, "every check lists the runtime's images and reads the Node, on every node, so checking more often loads the runtime and the apiserver for nothing (10ms is likely a typo for 10m); use 0 to turn the checks off"},
	"spec.pull.initialAttemptTimeout": {time.Second, "no registry answers a pull faster, so every first attempt would time out"},
	"spec.pull.maxAttemptTimeout":     {time.Second, "no registry answers a pull faster, so every attempt would time out"},
	"spec.pull.overallTimeout":        {time.Minute, "it bounds the pull of the whole list; below a minute most lists cannot finish and every node is labelled failed"},
	"spec.pull.initialRetryDelay":     {100 * time.Millisecond, "retrying faster hammers a registry that is already failing"},
	"spec.pull.maxRetryDelay":         {100 * time.Millisecond, "retrying faster hammers a registry that is already failing"},
}

// shortDuration prints 1m rather than Go's 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// checkDurationOrder: the durations that bound one another. A finding is
// reported at the field the user set, so that it points at their line.
func (c Config) checkDurationOrder(pull v1alpha1.Pull) framework.Results {
	var p framework.Results
	if c.InitialAttempt > 0 && c.MaxAttempt > 0 && c.InitialAttempt > c.MaxAttempt {
		p = append(p, errorf("spec.pull.initialAttemptTimeout", "%s is above maxAttemptTimeout %s", c.InitialAttempt, c.MaxAttempt))
	}
	if c.InitialRetry > 0 && c.MaxRetry > 0 && c.InitialRetry > c.MaxRetry {
		p = append(p, errorf("spec.pull.initialRetryDelay", "%s is above maxRetryDelay %s", c.InitialRetry, c.MaxRetry))
	}
	// Below its own floor, overallTimeout has been reported already.
	if c.InitialAttempt > 0 && c.OverallTimeout >= durationFloors["spec.pull.overallTimeout"].min && c.OverallTimeout < c.InitialAttempt {
		at := "spec.pull.overallTimeout"
		if pull.OverallTimeout == "" {
			at = "spec.pull.initialAttemptTimeout"
		}
		p = append(p, errorf(at, "overallTimeout %s is below initialAttemptTimeout %s: the whole list would time out before the first attempt of its first image could", shortDuration(c.OverallTimeout), shortDuration(c.InitialAttempt)))
	}
	return p
}

// Size limits of the rendered list ConfigMap.
const (
	// maxConfigMapData is the apiserver's limit on a ConfigMap's data
	// (core.MaxSecretSize).
	maxConfigMapData = 1 << 20
	// maxAnnotations is the apiserver's limit on all annotations of an
	// object together: client-side `kubectl apply` copies the object into
	// its last-applied-configuration annotation.
	maxAnnotations = 256 << 10
)

// checkListSize holds the rendered list against the apiserver's ConfigMap
// limit, and warns where client-side apply would fail first.
func (c Config) checkListSize(s v1alpha1.Spec) framework.Results {
	at := "spec.images"
	if len(s.Images) == 0 && s.ImageListFrom != nil {
		at = "spec.imageListFrom.configMapRef"
	}
	text := c.ImageListText()
	size := len(text)
	if size > maxConfigMapData {
		return framework.Results{errorf(at, "the rendered image list is %d bytes (%d images), above the %d bytes (1 MiB) the apiserver accepts in a ConfigMap: split the images across several ImagePrefetchers", size, len(c.Images), maxConfigMapData)}
	}
	// JSON doubles every newline ("\n"); the rest of the object and the
	// annotation's key take well under 1 KiB.
	if lastApplied := size + strings.Count(text, "\n") + 1024; lastApplied > maxAnnotations {
		return framework.Results{warnf(at, "the rendered image list is %d bytes (%d images): client-side `kubectl apply` copies the ConfigMap into its last-applied-configuration annotation, and annotations are limited to %d bytes (256 KiB), so it would fail; apply with `kubectl apply --server-side` (Argo CD: the ServerSideApply=true sync option; Flux applies server-side already)", size, len(c.Images), maxAnnotations)}
	}
	return nil
}

// checkMounts: the apiserver wants every mountPath of a container to be
// unique. User paths (the CRI socket's directory, the credential-provider
// paths) can land on a path the agent mounts already, or on each other.
// It looks at the DaemonSet the Config renders, so that every mount the
// renderer adds is covered.
func (c Config) checkMounts(s v1alpha1.Spec) framework.Results {
	ds := c.daemonSet(NamesFor(c.Namespace, c.Name), nil, metav1.ObjectMeta{})
	pod := ds.Spec.Template.Spec
	var p framework.Results
	reported := map[string]bool{} // the containers share their mounts
	for _, ctr := range append(pod.InitContainers, pod.Containers...) {
		first := map[string]string{}
		for _, m := range ctr.VolumeMounts {
			prev, dup := first[m.MountPath]
			if !dup {
				first[m.MountPath] = m.Name
				continue
			}
			if reported[m.MountPath] {
				continue
			}
			reported[m.MountPath] = true
			at, what := mountSource(m.Name, s)
			_, other := mountSource(prev, s)
			if at == "" {
				// Report at the user's field, whichever mount came first.
				at, what = mountSource(prev, s)
				_, other = mountSource(m.Name, s)
			}
			p = append(p, errorf(cmpOr(at, "spec"), "puts %s at %s, where the agent also mounts %s: a container's mount paths must be unique", what, m.MountPath, other))
		}
	}
	return p
}

// mountSource returns the user's field behind the volume named name ("" for
// the agent's own volumes), and what the mount holds.
func mountSource(name string, s v1alpha1.Spec) (path, what string) {
	switch name {
	case volImageList:
		return "", "the image list"
	case volTmp:
		return "", "its writable /tmp"
	case volCRISocket:
		return "spec.criSocket", "the CRI socket's directory"
	case volImageFS:
		return "spec.disk.imageFilesystem", "the image filesystem"
	case volCPConfig:
		return "spec.credentialProvider.configPath", "the credential-provider config"
	case volCPBin:
		return "spec.credentialProvider.binDir", "the credential-provider plugin directory"
	}
	var i int
	if _, err := fmt.Sscanf(name, "pull-secret-%d", &i); err == nil && i < len(s.ImagePullSecrets) {
		return fmt.Sprintf("spec.imagePullSecrets[%d]", i), "the pull secret " + s.ImagePullSecrets[i]
	}
	return "", "the volume " + name
}
