package examples_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/image-prefetcher/image-prefetcher/fn/render"
)

// integrationPages are the pages docs/integrations.md indexes, one per
// integration.
var integrationPages = []string{"kustomize", "kpt", "argocd", "flux"}

// docs/integrations.md is the index of one page per integration; it keeps
// the old section anchors (#kustomize, #where-namespace-and-images-must-go)
// so that links into it keep working, and the "Your own overlay" snippet,
// which must stay identical to the kustomize page's.
func TestIntegrationPages(t *testing.T) {
	tl := findTools(t)
	index := string(readFile(t, tl, "docs/integrations.md"))
	for _, p := range integrationPages {
		rel := "docs/integrations/" + p + ".md"
		page := string(readFile(t, tl, rel))
		if !strings.Contains(index, "(integrations/"+p+".md)") {
			t.Errorf("docs/integrations.md does not link %s", rel)
		}
		// Every relative link of the page resolves from docs/integrations/.
		for _, target := range relativeLinks(page) {
			if _, err := os.Stat(filepath.Join(tl.root, "docs", "integrations", target)); err != nil {
				t.Errorf("%s links %s, which does not exist", rel, target)
			}
		}
	}
	for _, target := range relativeLinks(index) {
		if _, err := os.Stat(filepath.Join(tl.root, "docs", target)); err != nil {
			t.Errorf("docs/integrations.md links %s, which does not exist", target)
		}
	}
	for _, heading := range []string{"## kustomize\n", "### Where `namespace:` and `images:` must go\n", "## kpt\n", "## Argo CD\n", "## Flux\n"} {
		if !strings.Contains(index, heading) {
			t.Errorf("docs/integrations.md lost the heading %q that links point to", strings.TrimSpace(heading))
		}
	}
	snippet := func(doc, rel string) string {
		_, section, ok := strings.Cut(doc, "# Your own overlay")
		if !ok {
			t.Fatalf("%s has no Your own overlay section", rel)
		}
		_, block, ok := strings.Cut(section, "```yaml\n")
		if !ok {
			t.Fatalf("%s: no yaml block under Your own overlay", rel)
		}
		block, _, _ = strings.Cut(block, "```")
		return block
	}
	kustomizePage := string(readFile(t, tl, "docs/integrations/kustomize.md"))
	if a, b := snippet(index, "docs/integrations.md"), snippet(kustomizePage, "docs/integrations/kustomize.md"); a != b {
		t.Errorf("the Your own overlay snippets differ:\n%s", lineDiff([]byte(b), []byte(a)))
	}
}

// relativeLinks returns the file part of every markdown link that is not
// a URL or a same-page anchor.
func relativeLinks(doc string) []string {
	var out []string
	for rest := doc; ; {
		i := strings.Index(rest, "](")
		if i < 0 {
			return out
		}
		rest = rest[i+2:]
		j := strings.IndexByte(rest, ')')
		if j < 0 {
			return out
		}
		target, _, _ := strings.Cut(rest[:j], "#")
		if target != "" && !strings.Contains(target, "://") && !strings.HasPrefix(target, "mailto:") {
			out = append(out, target)
		}
	}
}

// docs/migration.md names the objects an instance renders, in place of the
// reference tool's: the names it gives are the ones the function renders
// (a rename must update the page and say what it replaced).
func TestMigrationNames(t *testing.T) {
	tl := findTools(t)
	page := string(readFile(t, tl, "docs/migration.md"))
	n := render.NamesFor("<namespace>", "<name>")
	for what, name := range map[string]string{"DaemonSet and ServiceAccount": n.Namespaced, "list ConfigMap": n.ImageList, "SCC Role": n.SCCRole, "SCC": n.Cluster} {
		if !strings.Contains(page, "`"+name+"`") {
			t.Errorf("docs/migration.md does not give the %s's name `%s`", what, name)
		}
	}
}
