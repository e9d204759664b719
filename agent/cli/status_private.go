package cli

import (
	"fmt"
	"slices"
	"strings"
)

// privateNote is the status line for instances whose agents pull with
// credentials (Summary.Credentials): their images may be private, and
// whether they stay private is the kubelet's
// imagePullCredentialsVerificationPolicy, which the agent cannot read (the
// kubelet's /configz needs nodes/proxy, too broad to grant). Empty when no
// instance pulls with credentials.
func privateNote(rows []NodeStatus) string {
	var names []string
	for _, r := range rows {
		for _, i := range r.Instances {
			if i.Summary != nil && i.Summary.Credentials && !slices.Contains(names, i.Instance) {
				names = append(names, i.Instance)
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	return fmt.Sprintf("Private images: %s pull with credentials. The kubelet's imagePullCredentialsVerificationPolicy AlwaysVerify, or NeverVerifyAllowlistedImages without them in its allowlist, keeps them private; under the default, NeverVerifyPreloadedImages, any pod on the node can run them. The agent cannot read the kubelet's policy (docs/security.md).\n",
		strings.Join(names, ", "))
}
