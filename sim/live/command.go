package live

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/child"
	"github.com/sluicehq/sluice/sim"
)

// Command returns `sim live`.
func Command() *cobra.Command {
	var (
		s       = DefaultScaling()
		seed    uint64
		seeds   int
		compare bool
		bin     string
		csvDir  string
		pngDir  string
		maxRPS  float64
		quiet   bool
	)
	cmd := &cobra.Command{
		Use:          "live <scenario> ...",
		SilenceUsage: true, // errors name the flag or scenario; --help has the rest
		Short:        "run scenarios, scaled down, against the real binaries on loopback",
		Long: `live runs a scenario against the real controller, aggregator and sidecar binaries,
as processes on 127.0.0.1: one controller with the scenario's limits, one aggregator
per zone, --sidecars sidecars per zone in front of an in-process app, and a load
generator per caller and zone. Every rate of the scenario (flows, limits,
capacities) is multiplied by --scale so that the run fits one machine; the loop's
intervals are the scenario's. Events happen for real: kill_aggregator is SIGKILL,
restart_controller SIGTERM and a new process on the same ports.

It prints the same measures as ` + "`sim run`" + `, computed by the same code. With --compare
it also runs the deterministic mode on the same scaled scenario over --seeds seeds
and prints both side by side with the tolerance of each measure and whether they
agree; the exit status is 1 when they do not. docs/simulation.md, "Live mode", has
the details.

The binaries are built once from the module (go build, without -race) into a
temporary directory unless --bin names a directory holding them. A scenario live
mode can not run (retries it can not reproduce, or a scaled peak over --max-rps)
is refused before anything starts, with the reason. Ctrl-C stops every process.`,
		Example: `  sim live uber-surge --compare
  sim live sim/live/testdata/step-surge.yaml --scale 1 --compare --png out
  sim live aggregator-loss controller-restart --scale 0.02 --bin bin`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("name a scenario: a YAML file, or one of the built-in ones: %s", strings.Join(sim.Builtin(), ", "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			var progress io.Writer
			if !quiet {
				progress = errOut
			}
			// Every problem with the flags and the scenarios is reported
			// at once, before anything is built or started.
			var errs []error
			if err := s.Validate(); err != nil {
				errs = append(errs, err)
			}
			if seeds < 1 {
				errs = append(errs, fmt.Errorf("--seeds: %d; the deterministic range needs at least one seed", seeds))
			}
			if !(maxRPS > 0) {
				errs = append(errs, fmt.Errorf("--max-rps: %v; must be positive", maxRPS))
			}
			if bin != "" {
				if err := child.Check(bin, child.Binaries...); err != nil {
					errs = append(errs, fmt.Errorf("--bin %s: %w", bin, err))
				}
			}
			var scenarios []*sim.Scenario
			for _, a := range args {
				sc, err := sim.Load(a)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				scenarios = append(scenarios, sc)
				if s.Validate() == nil && maxRPS > 0 {
					if _, err := Fit(sc, s, maxRPS); err != nil {
						errs = append(errs, err)
					}
				}
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
			if bin == "" {
				// Built once for all the scenarios, removed at the end.
				dir, err := os.MkdirTemp("", "sluice-live-bin-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				if progress != nil {
					fmt.Fprintf(progress, "building the controller, aggregator and sidecar (without -race) into %s ...\n", dir)
				}
				if err := Build(ctx, dir); err != nil {
					return interrupted(ctx, err)
				}
				bin = dir
			}
			disagree := 0
			for i, sc := range scenarios {
				if i > 0 {
					fmt.Fprintln(out)
				}
				sd := sc.Seed
				if cmd.Flags().Changed("seed") {
					sd = seed
				}
				r, err := Run(ctx, sc, s, Options{Bin: bin, Progress: progress, MaxRPS: maxRPS, Seed: sd})
				if err != nil {
					return interrupted(ctx, err)
				}
				if err := WriteSummary(out, r); err != nil {
					return err
				}
				if err := writeFiles(out, &r.Result, csvDir, pngDir); err != nil {
					return err
				}
				if !compare {
					continue
				}
				c, err := Compare(r, sd, seeds, DefaultMargins())
				if err != nil {
					return err
				}
				fmt.Fprintln(out)
				if err := c.Write(out); err != nil {
					return err
				}
				if err := writeFiles(out, c.Sim, csvDir, pngDir); err != nil {
					return err
				}
				if !c.Agree() {
					disagree++
				}
			}
			if disagree > 0 {
				return fmt.Errorf("live and deterministic mode disagree on %d scenario(s)", disagree)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Float64Var(&s.Factor, "scale", s.Factor, "multiply every rate of the scenario (flows, limits, capacities) by this, in (0, 1]")
	f.IntVar(&s.Sidecars, "sidecars", s.Sidecars, "sidecars per zone and service, at most (a zone keeps fewer if the scenario has fewer)")
	f.Uint64Var(&seed, "seed", 0, "draws the instants the live processes start at (their phases); with --compare, also the deterministic run's seed and the first of the range (default: the scenario's own)")
	f.IntVar(&seeds, "seeds", 10, "with --compare: how many seeds the deterministic range is over")
	f.BoolVar(&compare, "compare", false, "also run the deterministic mode on the same scaled scenario and compare")
	f.StringVar(&bin, "bin", "", "directory with the controller, aggregator and sidecar binaries (default: go build them)")
	f.StringVar(&csvDir, "csv", "", "write the per-second series to `DIR`/<scenario>-live.csv (and -sim.csv with --compare)")
	f.StringVar(&pngDir, "png", "", "write the plots to `DIR`/<scenario>-live.png (and -sim.png with --compare)")
	f.Float64Var(&maxRPS, "max-rps", DefaultMaxRPS, "refuse a scaled scenario whose peak rate, retries at their most included, is higher")
	f.BoolVar(&quiet, "quiet", false, "no progress on stderr")
	return cmd
}

// interrupted says that the run was interrupted when ctx ended (Ctrl-C,
// SIGTERM): every process had been stopped by the time Run returned.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted (%v); every process started was stopped: %w", context.Cause(ctx), err)
	}
	return err
}

// writeFiles writes r's CSV and PNG into the directories that are set.
func writeFiles(out io.Writer, r *sim.Result, csvDir, pngDir string) error {
	for _, o := range []struct {
		dir, ext string
		write    func(io.Writer, *sim.Result) error
	}{{csvDir, "csv", sim.WriteCSV}, {pngDir, "png", sim.WritePNG}} {
		if o.dir == "" {
			continue
		}
		var buf bytes.Buffer
		if err := o.write(&buf, r); err != nil {
			return fmt.Errorf("%s: %s: %w", r.Scenario.Name, o.ext, err)
		}
		p := filepath.Join(o.dir, r.Scenario.Name+"."+o.ext)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			return err
		}
		what := "live run"
		if strings.HasSuffix(r.Scenario.Name, "-sim") {
			what = fmt.Sprintf("deterministic run, seed %d", r.Seed)
		}
		fmt.Fprintf(out, "wrote %s (%s)\n", p, what)
	}
	return nil
}
