package cluster

// ImageGCOptions is one node of rt whose kubelet's image GC runs within a
// test's time: its image store is a 192 MiB tmpfs, and an unlisted image
// that takes it below 45% available brings disk pressure, on which the
// eviction manager runs the image GC at once. The periodic GC stays off
// (thresholds 100/99). maxGCAge is imageMaximumGCAge, as platform teams
// set it: images unused that long go at the next pass, prefetched ones
// included unless pinned.
func ImageGCOptions(rt Runtime, maxGCAge string) Options {
	return Options{
		Deploys:         true,
		Nodes:           1,
		NodeRuntime:     func(int) Runtime { return rt },
		ImageStoreBytes: 192 << 20,
		KubeletConfig: map[string]any{
			"imageMaximumGCAge": maxGCAge,
			"evictionHard": map[string]string{
				"imagefs.available":  "45%",
				"nodefs.available":   "1%",
				"nodefs.inodesFree":  "1%",
				"imagefs.inodesFree": "1%",
			},
			"evictionPressureTransitionPeriod": "5s",
			// 0 would mean the default, 2m.
			"imageMinimumGCAge": "1s",
		},
	}
}
