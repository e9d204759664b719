package release_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
	"go.yaml.in/yaml/v3"
)

// TestWorkflow lints the CI definitions with actionlint (syntax, expressions,
// contexts, action inputs), then checks that the release job is the one
// `make release` documents: it runs on a v* tag, refuses an untagged tree,
// and hands the release command the environment it reads.
func TestWorkflow(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no workflow in .github/workflows (%v)", err)
	}
	var out bytes.Buffer
	l, err := actionlint.NewLinter(&out, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := l.LintFiles(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("actionlint: %d problems\n%s", len(errs), out.String())
	}

	b, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Jobs map[string]struct {
			Steps []struct {
				Run string            `yaml:"run"`
				Env map[string]string `yaml:"env"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	// YAML 1.2 (yaml/v3): "on" is a key, not the boolean YAML 1.1 makes it.
	if err := yaml.Unmarshal(b, &wf); err != nil {
		t.Fatal(err)
	}
	if strings.Join(wf.On.Push.Tags, ",") != "v*" {
		t.Errorf("release.yml runs on tags %q, want v*", wf.On.Push.Tags)
	}
	found := false
	for _, s := range wf.Jobs["release"].Steps {
		if !strings.HasPrefix(s.Run, "make release") {
			continue
		}
		found = true
		if !strings.Contains(s.Run, "RELEASE_FLAGS=-require-tag") {
			t.Errorf("%q: the release must refuse a tree that is not at its tag", s.Run)
		}
		for _, env := range []string{"REGISTRY_USERNAME", "REGISTRY_PASSWORD", "COSIGN_PRIVATE_KEY", "COSIGN_PASSWORD"} {
			if s.Env[env] == "" {
				t.Errorf("the make release step sets no %s", env)
			}
		}
	}
	if !found {
		t.Error("the release job has no `make release` step")
	}
}
