package render

import (
	"github.com/image-prefetcher/image-prefetcher/fn/api/v1alpha1"

	"sigs.k8s.io/kustomize/kyaml/fn/framework"
)

// validatePin checks spec.pin. Defaults stay out of the Config, so that the
// rendered objects of an ImagePrefetcher without spec.pin do not change.
func (c *Config) validatePin(s v1alpha1.Spec) framework.Results {
	if s.Pin.Enabled != nil && !*s.Pin.Enabled {
		c.PinOff = true
	}
	if s.Pin.Budget == "" {
		return nil
	}
	b, err := v1alpha1.ParsePinBudget(s.Pin.Budget)
	if err != nil {
		return framework.Results{errorf("spec.pin.budget", "%v", err)}
	}
	if v := b.String(); v != v1alpha1.DefaultPinBudget && !c.PinOff {
		c.PinBudget = v
	}
	return nil
}

// pinFlags are the agent's flags for pinning.
func (c Config) pinFlags() []string {
	switch {
	case c.PinOff:
		return []string{"--pin=false"}
	case c.PinBudget != "":
		return []string{"--pin-budget=" + c.PinBudget}
	}
	return nil
}
