package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// version is the release a binary was built as. `make build` and `make
// images` set it at link time:
//
//	-ldflags "-X github.com/sluicehq/sluice/internal/cli.version=v0.1.0"
//
// Without it the module version that `go install …@v0.1.0` records is
// used, and failing that "devel". revision is the commit, set by the same
// targets: the go command records it itself only where VCS stamping is on
// (GOFLAGS=-buildvcs=false turns it off, as on this project's CI machines).
var version, revision string

// Build says what a binary was built from.
type Build struct {
	Version   string // the release, "devel" for a build of a work tree
	Revision  string // the VCS commit, "" when the build did not record one
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string
}

// BuildInfo returns what this binary was built from.
func BuildInfo() Build {
	b := Build{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			b.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Revision == "" {
					b.Revision = s.Value
				}
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	return b
}

// String is the one line `--version` prints.
func (b Build) String() string {
	s := b.Version
	if b.Revision != "" {
		rev := b.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += " (" + rev
		if b.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return s + " " + b.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// Versioned gives a binary's root command --version (and -v, unless the
// command has a -v of its own), printing "<binary> <build>".
func Versioned(root *cobra.Command) *cobra.Command {
	root.Version = BuildInfo().String()
	root.SetVersionTemplate(fmt.Sprintf("%s {{.Version}}\n", root.Name()))
	return root
}

// BuildInfoCollector is sluice_build_info: always 1, labelled with what
// the binary was built from, so that a dashboard can tell which replicas
// run which release during a rollout.
func BuildInfoCollector() prometheus.Collector {
	b := BuildInfo()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; the labels say what this binary was built from.",
		ConstLabels: prometheus.Labels{
			"version":   b.Version,
			"revision":  b.Revision,
			"goversion": b.GoVersion,
		},
	})
	g.Set(1)
	return g
}
