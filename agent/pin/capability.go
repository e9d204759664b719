package pin

import (
	"fmt"
	"strconv"
	"strings"
)

// Check tells whether a runtime, named as its CRI Version names it, can pin
// images for a pod: why is empty when it can, and otherwise says why not.
// verify is set for a containerd whose version cannot be read: it is
// tried, and its first pin checked through the CRI (Pinner.Verify).
func Check(runtime, version string) (why string, verify bool) {
	switch runtime {
	case "containerd":
	case "cri-o":
		return "CRI-O pins only what its own configuration lists (pinned_images under /etc/crio), which a pod cannot change without write access to the host's /etc/crio and a signal to CRI-O", false
	default:
		return fmt.Sprintf("%s %s is not containerd: only containerd pins images through an API", runtime, version), false
	}
	major, minor, patch, ok := parseVersion(version)
	if !ok {
		return "", true
	}
	switch {
	case major >= 2, major == 1 && minor >= 8,
		major == 1 && minor == 7 && patch >= 10,
		major == 1 && minor == 6 && patch >= 25:
		return "", false
	}
	return fmt.Sprintf("containerd %s keeps a pin label set after the pull, but its CRI does not report the image as pinned, so the kubelet's image garbage collection removes it anyway; that works from containerd 1.6.25, 1.7.10 and 2.0 (containerd #9338)", version), false
}

// parseVersion reads major.minor.patch from a version such as "v2.4.2",
// "2.4.2+unknown" or Debian's "1.6.20~ds1".
func parseVersion(v string) (major, minor, patch int, ok bool) {
	v = strings.TrimPrefix(v, "v")
	var n [3]int
	for i := range n {
		end := 0
		for end < len(v) && '0' <= v[end] && v[end] <= '9' {
			end++
		}
		if end == 0 {
			return 0, 0, 0, false
		}
		x, err := strconv.Atoi(v[:end])
		if err != nil {
			return 0, 0, 0, false
		}
		n[i], v = x, v[end:]
		if i < 2 {
			if !strings.HasPrefix(v, ".") {
				return 0, 0, 0, false
			}
			v = v[1:]
		}
	}
	return n[0], n[1], n[2], true
}
