// Command cluster brings the test cluster of tests/cluster up and down by
// hand, for `make demo` and for exploring what the tests see.
//
//	cluster up [-nodes 2] [-push DIR=REPO:TAG]...   start, print how to use it, return
//	cluster status                                  list runs and their nodes
//	cluster env [-run ID]                           print the variables to export
//	cluster exec [-run ID] [-node NAME] -- CMD...   run CMD inside the cluster's network (and node)
//	cluster kubectl [-run ID] ARGS...               kubectl with the admin kubeconfig, inside the network
//	cluster push [-run ID] LAYOUT-DIR REPO:TAG      push an OCI layout to the cluster's registry
//	cluster down [-run ID | -all]                   tear down (the newest run by default)
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-prefetcher/image-prefetcher/tests/cluster"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "up":
		err = up(args)
	case "serve": // the detached owner `up` starts
		err = serve(args)
	case "down":
		err = down(args)
	case "status":
		err = status(args)
	case "env":
		err = env(args)
	case "exec":
		err = execIn(args, false)
	case "kubectl":
		err = execIn(args, true)
	case "push":
		err = push(args)
	case "-h", "--help", "help":
		usage()
		return
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintf(os.Stderr, "cluster %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: cluster up|down|status|env|exec|kubectl|push [flags]
  up [-nodes N] [-push DIR=REPO:TAG]...  start a cluster that outlives this command
  down [-run ID] [-all]                  tear down the newest run, one run, or all
  status                                 list runs and their nodes
  env [-run ID]                          print KUBECONFIG and the namespace path
  exec [-run ID] [-node NAME] -- CMD...  run CMD inside the cluster network (and node)
  kubectl [-run ID] ARGS...              run kubectl inside the cluster network
  push [-run ID] LAYOUT-DIR REPO:TAG     push an OCI layout; pods pull ghcr.io/REPO:TAG
Runs live under $IMAGE_PREFETCHER_E2E_DIR (default /tmp/ipf-e2e).
`)
}

type pushList []string

func (p *pushList) String() string     { return strings.Join(*p, ",") }
func (p *pushList) Set(v string) error { *p = append(*p, v); return nil }

// up starts `serve` in its own session, relays its progress until the
// cluster is ready, and returns; the server keeps the registry and the
// components alive until `cluster down`.
func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	nodes := fs.Int("nodes", 2, "number of nodes (0: etcd and kube-apiserver only)")
	var pushes pushList
	fs.Var(&pushes, "push", "DIR=REPO:TAG: push the OCI layout DIR once the cluster is up (repeatable)")
	_ = fs.Parse(args)
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	sargs := []string{"serve", fmt.Sprintf("-nodes=%d", *nodes)}
	for _, p := range pushes {
		sargs = append(sargs, "-push="+p)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, sargs...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start cluster server: %w", err)
	}
	w.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if dir, ok := strings.CutPrefix(line, "READY "); ok {
			_ = cmd.Process.Release()
			return printUsage(dir)
		}
		fmt.Println(line)
	}
	err = cmd.Wait()
	return fmt.Errorf("cluster server exited before the cluster was ready (%v)", err)
}

func printUsage(dir string) error {
	c, err := cluster.Attach(dir)
	if err != nil {
		return err
	}
	fmt.Printf(`
cluster %s is up (%d node(s)); state and logs in %s
  KUBECONFIG=%s
  network namespace %s
  nodes: %s
Use it with:
  cluster kubectl get nodes          (or: cluster exec -- <any command>)
  cluster down                       (tears it down and restores the host)
`, c.ID, len(c.Nodes()), c.Dir, c.Kubeconfig, c.NetNS.Path, nodeList(c))
	return nil
}

func nodeList(c *cluster.Cluster) string {
	var out []string
	for _, n := range c.Nodes() {
		out = append(out, fmt.Sprintf("%s (CRI %s)", n.Name, n.CRISocket))
	}
	if len(out) == 0 {
		return "none (control plane only)"
	}
	return strings.Join(out, ", ")
}

// switchWriter sends progress to the terminal of `up` until the cluster is
// ready, then to the run's log (the terminal's pipe is gone by then).
type switchWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *switchWriter) set(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w = w
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	nodes := fs.Int("nodes", 2, "number of nodes")
	var pushes pushList
	fs.Var(&pushes, "push", "DIR=REPO:TAG")
	_ = fs.Parse(args)
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	out := &switchWriter{w: os.Stdout}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{Nodes: *nodes, Detached: true, Progress: out})
	if err != nil {
		return err
	}
	for _, p := range pushes {
		dir, ref, ok := strings.Cut(p, "=")
		if !ok {
			err = fmt.Errorf("-push %q: want DIR=REPO:TAG", p)
		} else {
			err = c.PushLayout(ctx, dir, ref)
			fmt.Fprintf(out, ">> pushed %s as %s (pods pull ghcr.io/%s)\n", dir, ref, ref)
		}
		if err != nil {
			_ = c.Stop(context.Background())
			return err
		}
	}
	logf, err := os.OpenFile(filepath.Join(c.Dir, "logs", "cluster.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		_ = c.Stop(context.Background())
		return err
	}
	fmt.Fprintf(out, "READY %s\n", c.Dir)
	out.set(logf)
	// The pipe to `up` closes when it returns; anything later written to
	// stdout or stderr (a panic, a library's log) goes to the run's log.
	_ = syscall.Dup3(int(logf.Fd()), 1, 0)
	_ = syscall.Dup3(int(logf.Fd()), 2, 0)
	<-sigs
	return c.Stop(context.Background())
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	id := fs.String("run", "", "run ID (default: the newest one `cluster up` started)")
	all := fs.Bool("all", false, "tear down every run, including stale ones")
	_ = fs.Parse(args)
	if fs.NArg() == 1 && *id == "" {
		*id = fs.Arg(0)
	}
	var runs []cluster.Run
	if *all {
		rs, err := cluster.Runs("")
		if err != nil {
			return err
		}
		runs = rs
	} else {
		r, err := cluster.FindRun("", *id)
		if err != nil {
			return err
		}
		runs = []cluster.Run{r}
	}
	if len(runs) == 0 {
		fmt.Println("no runs")
	}
	var errs []error
	for _, r := range runs {
		fmt.Printf(">> tearing down %s\n", r.ID)
		if err := downOne(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// downOne asks the owner to tear down (it knows its processes best) and
// destroys what is left if the owner is gone or does not finish.
func downOne(r cluster.Run) error {
	if r.OwnerAlive && r.OwnerPID != os.Getpid() {
		_ = syscall.Kill(r.OwnerPID, syscall.SIGTERM)
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			if err := syscall.Kill(r.OwnerPID, 0); err != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if _, err := os.Stat(r.Dir); err == nil {
		return cluster.Destroy(r.Dir)
	}
	return nil
}

func status(args []string) error {
	runs, err := cluster.Runs("")
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		fmt.Println("no runs")
		return nil
	}
	for _, r := range runs {
		state := "running"
		if !r.OwnerAlive {
			state = "stale (owner gone: `cluster down -all` removes it)"
		}
		fmt.Printf("%s  %s  owner %d  %s\n", r.ID, r.Dir, r.OwnerPID, state)
		if !r.OwnerAlive {
			continue
		}
		c, err := cluster.Attach(r.Dir)
		if err != nil {
			fmt.Printf("  %v\n", err)
			continue
		}
		cs, err := c.Clientset()
		if err != nil {
			fmt.Printf("  %v\n", err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		cancel()
		if err != nil {
			fmt.Printf("  apiserver: %v\n", err)
			continue
		}
		fmt.Printf("  apiserver: ok, %d node(s)\n", len(list.Items))
		for _, n := range list.Items {
			ready := "NotReady"
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready = "Ready"
				}
			}
			sock := ""
			if node := c.Node(n.Name); node != nil {
				sock = " CRI " + node.CRISocket
			}
			fmt.Printf("  node %s %s%s\n", n.Name, ready, sock)
		}
	}
	return nil
}

func attach(id string) (*cluster.Cluster, error) {
	r, err := cluster.FindRun("", id)
	if err != nil {
		return nil, err
	}
	return cluster.Attach(r.Dir)
}

func env(args []string) error {
	fs := flag.NewFlagSet("env", flag.ExitOnError)
	id := fs.String("run", "", "run ID (default: the newest one `cluster up` started)")
	_ = fs.Parse(args)
	c, err := attach(*id)
	if err != nil {
		return err
	}
	for _, e := range c.Env() {
		fmt.Printf("export %s\n", e)
	}
	fmt.Println("# The API server is reachable only inside the namespace: run clients with")
	fmt.Printf("#   nsenter --net=%s -- kubectl get nodes\n", c.NetNS.Path)
	return nil
}

func execIn(args []string, kubectl bool) error {
	fs := flag.NewFlagSet("exec", flag.ExitOnError)
	id := fs.String("run", "", "run ID (default: the newest one `cluster up` started)")
	node := fs.String("node", "", "also enter this node's mount namespace (its /run/containerd)")
	_ = fs.Parse(args)
	rest := fs.Args()
	if kubectl {
		rest = append([]string{"kubectl"}, rest...)
	}
	if len(rest) == 0 {
		return errors.New("no command given")
	}
	c, err := attach(*id)
	if err != nil {
		return err
	}
	var cmd *exec.Cmd
	if *node != "" {
		n := c.Node(*node)
		if n == nil {
			return fmt.Errorf("no node %q", *node)
		}
		cmd = n.Command(context.Background(), rest[0], rest[1:]...)
	} else {
		cmd = c.Command(context.Background(), rest[0], rest[1:]...)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	return cmd.Run()
}

func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	id := fs.String("run", "", "run ID (default: the newest one `cluster up` started)")
	_ = fs.Parse(args)
	if fs.NArg() != 2 {
		return errors.New("usage: cluster push [-run ID] LAYOUT-DIR REPO:TAG")
	}
	c, err := attach(*id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.PushLayout(ctx, fs.Arg(0), fs.Arg(1)); err != nil {
		return err
	}
	fmt.Printf("pushed %s; pods pull it as ghcr.io/%s\n", fs.Arg(0), fs.Arg(1))
	return nil
}
