package scale

import "github.com/image-prefetcher/image-prefetcher/agent/slots"

// waiterMode picks how a waiter learns that a slot is free. Until
// slots.Config.Poll exists (the watch-based waiter), every waiter polls;
// this shim goes once it does.
func waiterMode(cfg slots.Config, poll bool) slots.Config {
	_ = poll
	return cfg
}
