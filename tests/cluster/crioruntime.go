package cluster

import "context"

// runcNoHugetlbSource wraps runc for CRI-O nodes. This machine's kernel
// lists the hugetlb controller in /proc/cgroups without mounting it, so
// CRI-O passes the kubelet's hugepage limits on and runc fails to join a
// hugetlb cgroup that cannot exist. containerd nodes drop them with
// disable_hugetlb_controller; CRI-O has no such setting, so the wrapper
// removes linux.resources.hugepageLimits from the bundle before
// `runc create`, and runs runc unchanged otherwise.
const runcNoHugetlbSource = `package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
)

func main() {
	args := os.Args[1:]
	bundle, create := "", false
	for i, a := range args {
		switch {
		case a == "create" || a == "run":
			create = true
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			bundle = args[i+1]
		}
	}
	if create && bundle != "" {
		strip(filepath.Join(bundle, "config.json"))
	}
	argv := append([]string{"runc"}, args...)
	if err := syscall.Exec("/usr/sbin/runc", argv, os.Environ()); err != nil {
		os.Stderr.WriteString("runc wrapper: " + err.Error() + "\n")
		os.Exit(127)
	}
}

func strip(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var spec map[string]any
	if json.Unmarshal(data, &spec) != nil {
		return
	}
	linux, _ := spec["linux"].(map[string]any)
	res, _ := linux["resources"].(map[string]any)
	if _, ok := res["hugepageLimits"]; !ok {
		return
	}
	delete(res, "hugepageLimits")
	if out, err := json.Marshal(spec); err == nil {
		_ = os.WriteFile(path, out, 0o644)
	}
}
`

// RuncNoHugetlb builds (once, cached) the runc wrapper of CRI-O nodes.
func RuncNoHugetlb(ctx context.Context) (string, error) {
	return buildEmbedded(ctx, "runc-nohugetlb", runcNoHugetlbSource)
}
