package configurator

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/pkg/history"
)

// seedOptions are history seed's flags.
type seedOptions struct {
	span     time.Duration
	seed     uint64
	buckets  []string
	specFile string
	force    bool
	reason   string
}

func (a *app) seedCommand() *cobra.Command {
	o := seedOptions{seed: 1}
	cmd := &cobra.Command{
		Use:   "seed --synthetic DURATION --reason TEXT [--bucket callee/caller=PEAK]... [--spec FILE]",
		Short: "write made-up minute history, to try derive, backtest and the rest without a controller",
		Long: `Writes SYNTHETIC minute history: made up, not observed. It is for a demo, a
tutorial or a test database, so that derive, review, backtest and history have
something to work on before a controller has recorded weeks of real traffic.
Never seed a production database: limits derived from made-up history protect
nothing.

--synthetic is how long the history is, ending now (or at --now): 4w writes
28 days of minutes. Each bucket gets one row per minute, written as the
controller writes them (the same COPY path), with a daily curve that tops out at
its peak at its peak hour (UTC), a quarter of it twelve hours later, a little
noise, and nothing dropped. The rows are deterministic in --seed.

Without --spec, the buckets are those of README's lifecycle transcript:

  checkout/web     peak 900 rps at 19:00, growing 5 % a week
  checkout/mobile  peak 300 rps at 20:00
  checkout/batch   peak 60 rps at 03:00, only the last 3 days
  orders/checkout  peak 420 rps at 14:00

--spec FILE replaces them with the buckets of a YAML file:

  buckets:
    checkout/web:   {peak: 1000, growth: 0.05, peak_hour: 19}
    checkout/batch: {peak: 60, days: 3}

and each --bucket callee/caller=PEAK[,growth=5%][,days=N][,peak-hour=H] then
replaces the bucket of that name or adds one (peak hour 18 unless given).

It refuses to write into a bucket that has any history in the span already,
real or not: derive could not tell the two apart. --force writes anyway; a
minute that has a row keeps it, so only gaps are filled.

Like every write, it needs a --reason and is audited (write_history, one entry
per bucket, with --actor).`,
		Example: `  configurator history seed --synthetic 4w --reason "try the lifecycle"
  configurator history seed --synthetic 2w --spec buckets.yaml --seed 7 --reason "workshop"
  configurator history seed --synthetic 4w --bucket checkout/web=1000,growth=5% --reason "demo"`,
		Args: cobra.NoArgs,
		RunE: a.withStore(func(cmd *cobra.Command, _ []string, st history.Store) error {
			return a.runSeed(cmd, st, o)
		}),
	}
	addSeedFlags(cmd, &o)
	return cmd
}

func addSeedFlags(cmd *cobra.Command, o *seedOptions) {
	fl := cmd.Flags()
	fl.Var((*duration.NonNegative)(&o.span), "synthetic", "write this much made-up history, ending now (or at --now): 4w, 28d, 2w3d")
	fl.Uint64Var(&o.seed, "seed", o.seed, "seed of the noise: the same seed writes the same rows")
	fl.StringArrayVar(&o.buckets, "bucket", nil, "callee/caller=PEAK[,growth=5%][,days=N][,peak-hour=H]: replace or add a bucket (repeatable)")
	fl.StringVar(&o.specFile, "spec", "", "YAML file of buckets, instead of the default ones")
	fl.BoolVar(&o.force, "force", false, "write into buckets that have history in the span already (existing minutes are kept)")
	fl.StringVar(&o.reason, "reason", "", "why, for the audit log (required)")
}

func (a *app) runSeed(cmd *cobra.Command, st history.Store, o seedOptions) error {
	spec, err := a.seedSpec(cmd, o)
	if err != nil {
		return err
	}
	end := a.clock().UTC().Truncate(time.Minute)
	var total int64
	for _, b := range spec {
		from, to := seedRange(b, end, o.span)
		total += int64(to.Sub(from) / time.Minute)
	}
	if total > maxSeedRows {
		return fmt.Errorf("%s rows is more than %s: seed fewer buckets or a shorter --synthetic", formatCount(float64(total)), formatCount(maxSeedRows))
	}

	ctx := cmd.Context()
	start := end.Add(-o.span)
	if !o.force {
		if err := refuseExisting(cmd, st, spec, start, end); err != nil {
			return err
		}
	}
	rows := Synthetic(spec, end, o.span, o.seed)
	began := time.Now()
	if err := st.WriteMinutes(ctx, rows); err != nil {
		return fmt.Errorf("write synthetic history: %w", err)
	}
	a.log.Debug("seeded", "rows", len(rows), "took", time.Since(began))

	notes := make([]history.HistoryNote, len(spec))
	for i, b := range spec {
		from, to := seedRange(b, end, o.span)
		notes[i] = history.HistoryNote{Bucket: b.Bucket, What: fmt.Sprintf("synthetic: %s minutes from %s, seed %d",
			formatCount(to.Sub(from).Minutes()), from.Format("2006-01-02 15:04Z"), o.seed)}
	}
	if err := st.AuditHistory(ctx, notes, a.change(o.reason)); err != nil {
		return fmt.Errorf("the history is written, but its audit entries are not: %w", err)
	}
	return a.writeSeeded(cmd.OutOrStdout(), o, spec, len(rows), end)
}

// seedSpec checks seed's flags, reporting every problem at once, and
// returns the buckets to seed.
func (a *app) seedSpec(cmd *cobra.Command, o seedOptions) ([]SeedBucket, error) {
	var errs []error
	if err := a.requireChange(o.reason); err != nil {
		errs = append(errs, err)
	}
	switch {
	case !cmd.Flags().Changed("synthetic"):
		errs = append(errs, errors.New("--synthetic DURATION is required (e.g. --synthetic 4w): seed writes made-up history only, and says so"))
	case o.span < minSeedSpan || o.span > maxSeedSpan:
		errs = append(errs, fmt.Errorf("--synthetic %s is outside [%s, %s]", duration.Format(o.span), duration.Format(minSeedSpan), duration.Format(maxSeedSpan)))
	}
	spec := DefaultSeedSpec()
	if o.specFile != "" {
		f, err := os.Open(o.specFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--spec: %w", err))
		} else {
			spec, err = parseSeedFile(f)
			f.Close()
			if err != nil {
				errs = append(errs, fmt.Errorf("--spec %s: %w", o.specFile, err))
			}
		}
	}
	var over []SeedBucket
	for _, s := range o.buckets {
		b, err := parseSeedBucket(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		over = append(over, b)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return mergeSeedBuckets(spec, over), nil
}

// writeSeeded reports the rows of spec written, ending at end.
func (a *app) writeSeeded(w io.Writer, o seedOptions, spec []SeedBucket, rows int, end time.Time) error {
	fmt.Fprintf(w, "wrote %s minute rows of SYNTHETIC history (seed %d), %s … %s:\n",
		formatCount(float64(rows)), o.seed, formatTime(end.Add(-o.span)), formatTime(end))
	t := newTable(w, "BUCKET", "DAILY PEAK", "GROWTH", "PEAK HOUR", "FROM", "MINUTES")
	for _, b := range spec {
		from, to := seedRange(b, end, o.span)
		growth := "none"
		if b.Growth != 0 {
			growth = fmt.Sprintf("%+g%%/week", b.Growth*100)
		}
		t.row(bucketString(b.Bucket), formatRate(b.Peak)+" rps", growth, fmt.Sprintf("%02d:00Z", b.PeakHour),
			formatTime(from), formatCount(to.Sub(from).Minutes()))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if o.force {
		fmt.Fprintln(w, "--force: minutes that had a row already kept it")
	}
	fmt.Fprintf(w, "audited as write_history by %s\n", a.actor)
	return nil
}

// refuseExisting refuses to mix synthetic rows into buckets of spec that
// have history in [from, to).
func refuseExisting(cmd *cobra.Command, st history.Store, spec []SeedBucket, from, to time.Time) error {
	peaks, err := st.DailyPeaks(cmd.Context(), history.Filter{}, startOfDay(from), startOfDay(to).Add(Day))
	if err != nil {
		return fmt.Errorf("read daily peaks: %w", err)
	}
	days := map[history.Bucket]int{}
	for _, p := range peaks {
		if slices.ContainsFunc(spec, func(b SeedBucket) bool { return b.Bucket == p.Bucket }) {
			days[p.Bucket]++
		}
	}
	if len(days) == 0 {
		return nil
	}
	var have []string
	for _, b := range spec {
		if n := days[b.Bucket]; n > 0 {
			have = append(have, fmt.Sprintf("%s (%s)", bucketString(b.Bucket), plural(n, "day")))
		}
	}
	return fmt.Errorf("refusing to seed: %s already %s history between %s and %s; synthetic rows mixed into it could not be told apart. "+
		"Seed an empty database, or give --force to write anyway (a minute that has a row keeps it: only gaps are filled)",
		strings.Join(have, ", "), map[bool]string{true: "has", false: "have"}[len(have) == 1],
		from.Format(time.DateOnly), to.Format(time.DateOnly))
}
