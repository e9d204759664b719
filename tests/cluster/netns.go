package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace pinned to a file by a bind mount. The test
// process itself never joins it; it only creates sockets inside it, because a
// socket stays in the namespace it was created in.
type NetNS struct {
	Path string
}

// Do runs fn on an OS thread that has joined the namespace. The thread is
// dedicated to fn: if it cannot be moved back to its original namespace it
// is left locked, and the Go runtime destroys it when the goroutine ends.
func (n *NetNS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open network namespace %s: %w", n.Path, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("join network namespace %s: %w", n.Path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Keep the thread locked so that it dies with this goroutine.
			errc <- fmt.Errorf("leave network namespace %s: %w", n.Path, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialContext connects to addr from inside the namespace. It has the
// signature client-go and net/http expect of a dialer.
func (n *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return err
	})
	return conn, err
}

// Listen opens a listener inside the namespace.
func (n *NetNS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var lc net.ListenConfig
		ln, err := lc.Listen(context.Background(), network, addr)
		l = ln
		return err
	})
	return l, err
}

// Inode identifies the namespace, to recognise the processes inside it.
func (n *NetNS) Inode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(n.Path, &st); err != nil {
		return 0, fmt.Errorf("stat network namespace %s: %w", n.Path, err)
	}
	return st.Ino, nil
}

// createNetNS pins a new network namespace to path and gives it a loopback
// and a veth pair carrying the cluster's addresses (the kernel has no dummy
// driver, and the kubelet refuses a loopback node IP).
func createNetNS(ctx context.Context, path string, addrs []string) (*NetNS, error) {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return nil, fmt.Errorf("create network namespace file: %w", err)
	}
	if err := run(ctx, "unshare", "--net="+path, "true"); err != nil {
		return nil, fmt.Errorf("create network namespace: %w", err)
	}
	ns := &NetNS{Path: path}
	script := "set -e; ip link set lo up; ip link add veth0 type veth peer name veth1; ip link set veth0 up; ip link set veth1 up;"
	for _, a := range addrs {
		script += " ip addr add " + a + "/24 dev veth0;"
	}
	script += " ip route add default dev veth0; echo 1 > /proc/sys/net/ipv4/ip_forward"
	if err := run(ctx, "nsenter", "--net="+path, "sh", "-c", script); err != nil {
		return ns, fmt.Errorf("configure network namespace: %w", err)
	}
	return ns, nil
}

// remove unpins the namespace; it disappears once no process uses it.
func (n *NetNS) remove() error {
	if err := unix.Unmount(n.Path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount network namespace %s: %w", n.Path, err)
	}
	if err := os.Remove(n.Path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove network namespace file: %w", err)
	}
	return nil
}
