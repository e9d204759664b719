// Package cli holds the image-prefetcher commands.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/image-prefetcher/image-prefetcher/agent/kube"
	"github.com/image-prefetcher/image-prefetcher/agent/pull"
	"github.com/image-prefetcher/image-prefetcher/fn/version"
)

// Exit codes.
const (
	ExitOK = 0
	// ExitError: the run could not finish (CRI unreachable, labeling failed,
	// bad configuration), or `status` found a node that is not succeeded.
	ExitError = 1
	// ExitUsage: unknown flag or bad flag value.
	ExitUsage = 2
	// ExitImagesFailed: fetch --fail-on-error and at least one image failed.
	ExitImagesFailed = 3
)

// ExitCodeError carries a process exit code.
type ExitCodeError struct {
	Code int
	Err  error
}

func (e *ExitCodeError) Error() string { return e.Err.Error() }
func (e *ExitCodeError) Unwrap() error { return e.Err }

// Deps are the seams tests use. Zero fields get production behaviour.
type Deps struct {
	// Kube returns an API client for a kubeconfig path ("" means in-cluster,
	// then the default loading rules).
	Kube func(kubeconfig string) (kube.Interface, error)
	// Sleep waits between pull attempts.
	Sleep func(ctx context.Context, d time.Duration) error
	// LabelSleep waits between labeling retries.
	LabelSleep func(time.Duration)
	// NewGate builds the herd-control gate (see gate.go).
	NewGate func(ctx context.Context, cfg GateConfig) (pull.Gate, error)
	// Ready is called by watch and sleep once their signal handler is in place.
	Ready func()
	// Getenv reads the environment.
	Getenv func(string) string
	// NamespaceFile holds the pod's namespace in its service-account
	// directory.
	NamespaceFile string
	// Stdout receives command output (status, version).
	Stdout io.Writer
	// Stderr receives logs.
	Stderr io.Writer
}

func (d *Deps) defaults() {
	if d.Kube == nil {
		d.Kube = KubeClient
	}
	if d.NewGate == nil {
		d.NewGate = NewGate
	}
	if d.Ready == nil {
		d.Ready = func() {}
	}
	if d.Getenv == nil {
		d.Getenv = os.Getenv
	}
	if d.NamespaceFile == "" {
		d.NamespaceFile = serviceAccountNamespace
	}
	if d.Stdout == nil {
		d.Stdout = os.Stdout
	}
	if d.Stderr == nil {
		d.Stderr = os.Stderr
	}
}

// KubeClient builds a client from a kubeconfig path, or from the in-cluster
// config, or from the default loading rules ($KUBECONFIG, ~/.kube/config).
func KubeClient(kubeconfig string) (kube.Interface, error) {
	cfg, err := kube.Config(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (not in a pod and no usable kubeconfig; pass --kubeconfig): %w", err)
	}
	cfg.UserAgent = "image-prefetcher/" + version.Version
	c, err := kube.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

type globalFlags struct {
	logFormat string
	logLevel  string
	// log is the logger the flags asked for, once they were read.
	log *slog.Logger
}

// New returns the root command.
func New(deps Deps) *cobra.Command {
	cmd, _ := newRoot(deps)
	return cmd
}

// newRoot returns the root command and the global flags it fills in.
func newRoot(deps Deps) (*cobra.Command, *globalFlags) {
	deps.defaults()
	g := &globalFlags{}
	root := &cobra.Command{
		Use:           "image-prefetcher",
		Short:         "Pull a list of images on this node and label the node with the outcome",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Version,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			level := g.logLevel
			// The reference agent's --debug, on fetch and watch; an explicit
			// --log-level wins.
			if d := cmd.Flags().Lookup("debug"); d != nil && d.Value.String() == "true" && !cmd.Flags().Changed("log-level") {
				level = "debug"
			}
			log, err := newLogger(deps.Stderr, g.logFormat, level)
			if err != nil {
				return &ExitCodeError{Code: ExitUsage, Err: err}
			}
			slog.SetDefault(log)
			g.log = log
			return nil
		},
	}
	root.SetOut(deps.Stdout)
	root.SetErr(deps.Stderr)
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log format: json or text")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &ExitCodeError{Code: ExitUsage, Err: err}
	})
	root.AddCommand(newFetch(&deps), newWatch(&deps), newSleep(&deps), newStatus(&deps), newAllowlist(&deps), newVersion(&deps))
	return root, g
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

// Execute runs the command line and returns the process exit code.
func Execute(ctx context.Context, args []string, deps Deps) int {
	deps.defaults()
	cmd, g := newRoot(deps)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	code := ExitError
	var ce *ExitCodeError
	if errors.As(err, &ce) {
		code = ce.Code
	}
	if code == ExitUsage || !errors.As(err, &ce) || ce.Err != errSilent {
		reportFatal(deps.Stderr, g, err, code)
	}
	return code
}

// reportFatal prints the error that ends the run. Under --log-format json it
// is one more JSON log line, at error level, so that a log pipeline that
// parses every line as JSON keeps it; otherwise it is a plain line.
func reportFatal(w io.Writer, g *globalFlags, err error, code int) {
	if !strings.EqualFold(g.logFormat, "json") {
		fmt.Fprintf(w, "image-prefetcher: %v\n", err)
		return
	}
	log := g.log
	if log == nil {
		// The run ended before the logger was set up: a flag the parser
		// rejected, or a bad --log-level. --log-format json was read.
		log, _ = newLogger(w, "json", "info")
	}
	log.Error(err.Error(), "exitCode", code)
}

// errSilent marks exits whose reason was already logged.
var errSilent = errors.New("already reported")

func newVersion(deps *Deps) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(deps.Stdout, version.Version)
			return err
		},
	}
}
