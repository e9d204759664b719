package cluster

import (
	"fmt"
	"syscall"
)

// roomPercent is how full the host filesystem under the runs may be. Test
// nodes keep their images on it, and the agent's default disk ceiling (80%,
// counted as capacity minus available, as the kubelet counts it) refuses
// every pull above that: a machine short of disk would otherwise fail dozens
// of tests with InsufficientDisk instead of once, saying why.
const roomPercent = 79

// checkRoom fails when the filesystem holding dir leaves the test nodes'
// pulls too little room below the agent's disk ceiling.
func checkRoom(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	return roomError(dir, st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize))
}

func roomError(dir string, capacity, available uint64) error {
	if capacity == 0 {
		return nil
	}
	used := (capacity - available) * 100 / capacity
	if used < roomPercent {
		return nil
	}
	return fmt.Errorf("the filesystem of %s is %d%% used (%.1f GiB available of %.1f GiB); test nodes keep their images there "+
		"and the agent's default disk ceiling (80%%) refuses pulls from %d%%: free space, or set IMAGE_PREFETCHER_E2E_DIR to a roomier filesystem",
		dir, used, float64(available)/(1<<30), float64(capacity)/(1<<30), roomPercent)
}
