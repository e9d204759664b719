package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// kustomization is what the function reads of a kustomization file.
type kustomization struct {
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
	Components []string `yaml:"components"`
}

func readKustomization(dir string) (kustomization, string, bool) {
	for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		var k kustomization
		return k, filepath.Join(dir, name), yaml.Unmarshal(b, &k) == nil
	}
	return kustomization{}, "", false
}

// includerNamespace finds, for a function run from the Component in dir,
// a kustomization on the way down from the build's target to the
// Component that sets namespace:. kustomize applies it after the
// Component's transformers, so it moves the agent away from the namespace
// it was rendered for (it then exits 5, InstanceMoved). The Component
// cannot see its includer; kustomize, its parent process, names the
// build's target on its command line. "" when there is none, or when that
// cannot be told (a remote target, a parent that is not kustomize build).
func includerNamespace(dir string) (file, namespace string) {
	target, ok := buildTarget(os.Getppid())
	if !ok {
		return "", ""
	}
	comp, err := filepath.Abs(dir)
	if err != nil {
		return "", ""
	}
	seen := map[string]bool{}
	var walk func(d, ns, nsFile string) (string, string)
	walk = func(d, ns, nsFile string) (string, string) {
		if seen[d] {
			return "", ""
		}
		seen[d] = true
		k, f, ok := readKustomization(d)
		if !ok {
			return "", ""
		}
		if k.Namespace != "" && nsFile == "" {
			ns, nsFile = k.Namespace, f
		}
		for _, c := range k.Components {
			if filepath.Join(d, c) == comp && nsFile != "" {
				return nsFile, ns
			}
		}
		for _, r := range append(k.Resources, k.Components...) {
			p := filepath.Join(d, r)
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				if f, n := walk(p, ns, nsFile); f != "" {
					return f, n
				}
			}
		}
		return "", ""
	}
	return walk(target, "", "")
}

// buildTarget is the directory a `kustomize build` process pid builds.
func buildTarget(pid int) (string, bool) {
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	raw, err := os.ReadFile(filepath.Join(proc, "cmdline"))
	if err != nil {
		return "", false
	}
	cwd, err := os.Readlink(filepath.Join(proc, "cwd"))
	if err != nil {
		return "", false
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
	if len(args) < 2 || filepath.Base(args[0]) != "kustomize" || args[1] != "build" {
		return "", false
	}
	// kustomize build's flags that take a separate value.
	valued := map[string]bool{"-o": true, "--output": true, "--load-restrictor": true, "--helm-command": true, "-e": true, "--env": true,
		"--mount": true, "--network-name": true, "--reorder": true, "--helm-api-versions": true, "--helm-kube-version": true}
	target := "."
	for i := 2; i < len(args); i++ {
		a := args[i]
		switch {
		case valued[a]:
			i++
		case strings.HasPrefix(a, "-"):
		default:
			target = a
		}
	}
	if strings.Contains(target, "://") || strings.HasPrefix(target, "github.com/") {
		return "", false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(cwd, target)
	}
	return filepath.Clean(target), true
}
