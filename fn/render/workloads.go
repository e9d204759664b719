package render

import (
	"fmt"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"
	"github.com/image-prefetcher/image-prefetcher/fn/imagelist"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
	"github.com/image-prefetcher/image-prefetcher/fn/workloads"
)

// Sources are the objects of the ResourceList an ImagePrefetcher may take
// images from.
type Sources struct {
	ConfigMaps ConfigMapLookup
	// Workloads is what spec.imageListFrom.workloads selected. It is nil
	// when the function cannot see the workloads: as a kustomize
	// generator it is given its own configuration and nothing else.
	Workloads *workloads.Collection
	// StartupTaintKeys are the startup taints of every instance in the
	// ResourceList (StartupTaintKeys).
	StartupTaintKeys []string
}

// section is one source of the rendered list: a comment line, then the
// images it added.
type section struct {
	source string
	images []string
	// agent: the source uses the agent's own image, left out.
	agent bool
}

const workloadsPath = "spec.imageListFrom.workloads"

// addWorkloads adds the images of the selected workloads after every other
// source. A workload image that another source or an earlier workload
// already lists is dropped without a warning: two workloads sharing a
// sidecar image is normal, unlike a list that names an image twice.
func (c *Config) addWorkloads(b *imagelist.Builder, s v1alpha1.Spec, src Sources) ([]section, framework.Results) {
	var p framework.Results
	sels := s.ImageListFrom.Workloads
	if len(sels) == 0 {
		return nil, framework.Results{errorf(workloadsPath, "is empty: list selectors, or [{}] to select every workload of the ResourceList")}
	}
	col := src.Workloads
	if col == nil {
		return nil, framework.Results{errorf(workloadsPath, "no workload can be seen: a kustomize generator is given its own configuration and nothing else; list the function under transformers: in the kustomization that holds the workloads")}
	}
	for _, e := range col.Errors {
		p = append(p, errorf(fmt.Sprintf("%s[%d].%s", workloadsPath, e.Index, e.Field), "%v", e.Err))
	}
	if len(col.Errors) > 0 {
		return nil, p
	}
	for _, i := range col.Unmatched {
		p = append(p, warnf(fmt.Sprintf("%s[%d]", workloadsPath, i), "matches no workload of the ResourceList (a Pod, or an object with a pod template at spec.template or spec.jobTemplate.spec.template)"))
	}
	by := fmt.Sprintf("selected by %s of ImagePrefetcher %s/%s", workloadsPath, c.Namespace, c.Name)
	for _, sk := range col.Skipped {
		p = append(p, about(sk.Workload, warnf(sk.Path, "has no image, so nothing is prefetched for it (%s)", by)))
	}

	have := map[string]bool{}
	for _, n := range s.ImagePullSecrets {
		have[n] = true
	}
	for _, ps := range col.PullSecrets {
		var missing []string
		for _, n := range ps.Names {
			if !have[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			p = append(p, about(ps.Workload, warnf(ps.Path,
				"the kubelet pulls with Secret %s, the agent does not: if its images need credentials, put a kubernetes.io/dockerconfigjson Secret in namespace %s and list it in spec.imagePullSecrets of ImagePrefetcher %s/%s, or they fail as Unauthorized (%s)",
				strings.Join(missing, ", "), c.Namespace, c.Namespace, c.Name, by)))
		}
	}

	// The agent's image is on every node the DaemonSet runs on before the
	// agent can pull anything: a workload using it (the agent's own
	// DaemonSet rendered by another instance, a debug pod) adds nothing.
	agent := s.Agent.Image
	if agent == "" {
		agent = version.AgentImage()
	}
	agentNorm, _ := imagelist.Normalize(agent)

	sections := make([]section, 0, len(col.Workloads))
	at := map[workloads.Ref]int{}
	for _, w := range col.Workloads {
		at[w] = len(sections)
		sections = append(sections, section{source: w.String()})
	}
	for _, img := range col.Images {
		sec := &sections[at[img.Workload]]
		if img.NotString {
			p = append(p, about(img.Workload, errorf(img.Path, "must be a string (%s)", by)))
			continue
		}
		n, err := imagelist.Normalize(img.Ref)
		if err != nil {
			p = append(p, about(img.Workload, errorf(img.Path, "%v (%s)", err, by)))
			continue
		}
		if n == agentNorm {
			sec.agent = true
			continue
		}
		before := len(b.List().Entries)
		b.Add(0, img.Ref)
		if len(b.List().Entries) > before {
			sec.images = append(sec.images, kubeletForm(b.List().Entries[before]))
		}
	}
	return sections, p
}

// about makes r a finding about the selected workload w, r's field a path
// in w.
func about(w workloads.Ref, r *framework.Result) *framework.Result {
	r.ResourceRef = &yaml.ResourceIdentifier{
		TypeMeta: yaml.TypeMeta{APIVersion: w.APIVersion, Kind: w.Kind},
		NameMeta: yaml.NameMeta{Name: w.Name, Namespace: w.Namespace},
	}
	return r
}

// listSections groups the valid entries of list by source: inline
// references are entries [0, nInline), the ConfigMap's [nInline, nBefore);
// the workloads' sections are already grouped.
func listSections(list imagelist.List, nInline, nBefore int, cmDesc string, ws []section) []section {
	valid := func(from, to int) []string {
		var out []string
		for _, e := range list.Entries[from:to] {
			if e.Err == nil {
				out = append(out, kubeletForm(e))
			}
		}
		return out
	}
	var out []section
	if nInline > 0 {
		out = append(out, section{source: "spec.images", images: valid(0, nInline)})
	}
	if cmDesc != "" {
		out = append(out, section{source: cmDesc, images: valid(nInline, nBefore)})
	}
	return append(out, ws...)
}

// sectionText is the list text with a comment line per source. The agent
// reads '#' lines as comments (fn/imagelist), so only people see them.
func sectionText(sections []section) string {
	var b strings.Builder
	for _, s := range sections {
		b.WriteString("# " + s.source)
		switch {
		case len(s.images) > 0:
		case s.agent:
			b.WriteString(": nothing new: its images are listed above or are the agent's own, which is on the node already")
		default:
			b.WriteString(": every image is listed above")
		}
		b.WriteString("\n")
		for _, img := range s.images {
			b.WriteString(img + "\n")
		}
	}
	return b.String()
}
