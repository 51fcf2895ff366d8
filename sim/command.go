package sim

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// The scenarios shipped with sluice, also available by name to `sim run`.
//
//go:embed scenarios/*.yaml
var builtin embed.FS

// Builtin returns the names of the built-in scenarios, sorted.
func Builtin() []string {
	entries, err := fs.ReadDir(builtin, "scenarios")
	if err != nil {
		panic(err) // the embedded directory is part of the binary
	}
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return out
}

// LoadBuiltin parses the built-in scenario name.
func LoadBuiltin(name string) (*Scenario, error) {
	data, err := builtin.ReadFile(path.Join("scenarios", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("no built-in scenario %q; there are: %s", name, strings.Join(Builtin(), ", "))
	}
	sc, err := Parse(bytes.NewReader(data), name)
	if err != nil {
		return nil, fmt.Errorf("scenarios/%s.yaml: %w", name, err)
	}
	return sc, nil
}

// Load reads a scenario from a file, or, when no file has that path, the
// built-in scenario it names: "uber-surge", "uber-surge.yaml" and
// "scenarios/uber-surge.yaml" all name the same one.
func Load(arg string) (*Scenario, error) {
	if _, err := os.Stat(arg); err == nil {
		return LoadFile(arg)
	}
	name := strings.TrimSuffix(strings.TrimPrefix(filepath.ToSlash(arg), "scenarios/"), ".yaml")
	if strings.Contains(name, "/") {
		return nil, fmt.Errorf("read scenario: %s: no such file", arg)
	}
	return LoadBuiltin(name)
}

// Command returns the `sim` command and its `run` subcommand. The live and
// scale modes add their own subcommands to it (see cmd/sim).
func Command() *cobra.Command {
	root := &cobra.Command{
		Use:   "sim",
		Short: "sluice's traffic-surge simulator",
		Long: `sim runs scenarios against sluice's control loop.

  sim run    deterministic mode: the production sidecar, aggregator, controller and
             control law in one goroutine, under a virtual clock, with a seeded random
             source; the same scenario and seed give the same output, byte for byte.
  sim live   live mode: the same scenarios, scaled down, against the real controller,
             aggregator and sidecar binaries on loopback; --compare sets the two modes
             side by side.`,
		SilenceUsage: true,
	}
	root.AddCommand(runCommand())
	return root
}

func runCommand() *cobra.Command {
	var (
		all      bool
		seed     uint64
		csvDir   string
		pngDir   string
		progress string
	)
	cmd := &cobra.Command{
		Use:   "run [scenario ...]",
		Short: "simulate scenarios deterministically and print their measures",
		Long: `run simulates each scenario and prints its summary: per caller the time to enforce,
peak overshoot, steady-state error, collateral drops and the wrongly dropped and
wrongly allowed shares, where the time to enforce went, and the control plane's
bytes per second per tier. docs/simulation.md defines every measure.

A scenario is a YAML file, or the name of a built-in one (` + "`sim run --all`" + ` runs them all):
` + "  " + strings.Join(Builtin(), ", ") + `.

Every output names the seed; a failed run names it too, so that it can be replayed
with --seed.`,
		Example: `  sim run uber-surge
  sim run sim/scenarios/uber-surge.yaml --seed 7 --csv out --png out
  sim run --all --png docs/img`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("name scenarios to run, or --all (not both)")
			}
			if progress != "auto" && progress != "always" && progress != "never" {
				return fmt.Errorf("--progress: %q is not auto, always or never", progress)
			}
			if all {
				args = Builtin()
			}
			var scenarios []*Scenario
			var errs []error
			for _, a := range args {
				sc, err := Load(a)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				scenarios = append(scenarios, sc)
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			for _, dir := range []string{csvDir, pngDir} {
				if dir != "" {
					if err := os.MkdirAll(dir, 0o755); err != nil {
						return err
					}
				}
			}
			showProgress := progress == "always" || progress == "auto" && isTerminal(cmd.ErrOrStderr())
			for i, sc := range scenarios {
				s := sc.Seed
				if cmd.Flags().Changed("seed") {
					s = seed
				}
				if err := runOne(cmd, sc, s, csvDir, pngDir, showProgress, i > 0); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&all, "all", false, "run every built-in scenario")
	f.Uint64Var(&seed, "seed", 0, "seed of the random source (default: the scenario's own seed)")
	f.StringVar(&csvDir, "csv", "", "write each scenario's per-second series to `DIR`/<scenario>.csv")
	f.StringVar(&pngDir, "png", "", "write each scenario's plot to `DIR`/<scenario>.png")
	f.StringVar(&progress, "progress", "auto", "progress bar on stderr: auto (when it is a terminal), always, never")
	return cmd
}

func runOne(cmd *cobra.Command, sc *Scenario, seed uint64, csvDir, pngDir string, showProgress, gap bool) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	var opts Options
	if showProgress {
		opts.Progress = progressBar(errOut, sc.Name, seed)
	}
	start := time.Now() // wall time, for the user only; the run never sees it
	r, err := Run(sc, seed, opts)
	if showProgress {
		fmt.Fprint(errOut, "\r\033[K")
	}
	if err != nil {
		return err // names the scenario and the seed
	}
	elapsed := time.Since(start)
	if gap {
		fmt.Fprintln(out)
	}
	if err := WriteSummary(out, r); err != nil {
		return err
	}
	write := func(dir, ext string, f func(io.Writer, *Result) error) error {
		if dir == "" {
			return nil
		}
		p := filepath.Join(dir, sc.Name+"."+ext)
		var buf bytes.Buffer
		if err := f(&buf, r); err != nil {
			return fmt.Errorf("%s seed %d: %s: %w", sc.Name, seed, ext, err)
		}
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(out, "wrote %s (seed %d)\n", p, seed)
		return nil
	}
	if err := write(csvDir, "csv", WriteCSV); err != nil {
		return err
	}
	if err := write(pngDir, "png", WritePNG); err != nil {
		return err
	}
	decisions := r.Decisions
	if r.Tenants != nil {
		decisions += r.Tenants.Requests
	}
	fmt.Fprintf(errOut, "%s seed %d: %v simulated in %v wall time, %.1fM decisions\n",
		sc.Name, seed, sc.Duration, elapsed.Round(time.Millisecond), float64(decisions)/1e6)
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar returns a Progress callback that redraws a bar on w whenever
// the shown percentage changes.
func progressBar(w io.Writer, name string, seed uint64) func(done, total time.Duration) {
	last := -1
	return func(done, total time.Duration) {
		pc := int(100 * done / total)
		if pc == last {
			return
		}
		last = pc
		const width = 30
		n := width * pc / 100
		fmt.Fprintf(w, "\r%s seed %d [%s%s] %3d%% of %v", name, seed, strings.Repeat("#", n), strings.Repeat(".", width-n), pc, total)
	}
}
