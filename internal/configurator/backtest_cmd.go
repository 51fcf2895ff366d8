package configurator

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// Limit sources a backtest reports.
const (
	fromProposal = "proposed"
	fromCurrent  = "current"
	fromNone     = "none"
)

// backtestRow is a bucket's replay in JSON and YAML: requests rounded to
// whole ones, shares and ratios as the table rounds them (roundShare), the
// limit exact.
type backtestRow struct {
	Callee      string     `json:"callee" yaml:"callee"`
	Caller      string     `json:"caller" yaml:"caller"`
	Procedure   string     `json:"procedure,omitempty" yaml:"procedure,omitempty"`
	Limit       *float64   `json:"limit" yaml:"limit"` // null: none
	LimitFrom   string     `json:"limit_from" yaml:"limit_from"`
	Minutes     int        `json:"minutes" yaml:"minutes"`
	Offered     float64    `json:"offered_requests" yaml:"offered_requests"`
	Dropped     float64    `json:"dropped_requests" yaml:"dropped_requests"`
	Share       float64    `json:"dropped_share" yaml:"dropped_share"`
	DropMinutes int        `json:"drop_minutes" yaml:"drop_minutes"`
	WorstMinute *time.Time `json:"worst_minute" yaml:"worst_minute"`
	WorstRatio  float64    `json:"worst_ratio" yaml:"worst_ratio"`
	FirstDrop   *time.Time `json:"first_drop" yaml:"first_drop"`
	LastDrop    *time.Time `json:"last_drop" yaml:"last_drop"`
	// Unit is "cost" for a callee counting cost: its limit, offered and
	// dropped are then cost units (per second); absent for requests.
	Unit string `json:"unit,omitempty" yaml:"unit,omitempty"`
}

// backtestOptions are backtest's flags.
type backtestOptions struct {
	proposed, current bool
	from, to          string
	days              int
	law               dropratio.Config
	out               format
}

func (a *app) backtestCommand() *cobra.Command {
	o := backtestOptions{days: 28, law: dropratio.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "backtest [callee[/caller[/procedure]]]",
		Short: "replay stored history through the control law: what would a limit have dropped?",
		Long: `Replays the stored minutes of every bucket (or of a callee, or one bucket) through
the real control law, one step per minute, with the pending proposals
(--proposed, the default; buckets without one keep the limit in force) or the
limits in force (--current), the callee's capacity shared by its callers as the
controller shares it. Reports per bucket the share of offered requests that
would have been dropped, the minutes with drops, the worst minute and its drop
ratio, and the first and last drop.

The law sees each minute's mean offered rate: bursts shorter than a minute are
averaged out, so short spikes drop more in reality than here. At one step per
minute the law's slow release completes within a step. Set --p-max, --min-rate
and --release-rate as the controller has them.

A callee with --unit cost is replayed in cost: its minutes' offered cost rate
against its limits in cost units per second ("units/s"), and the share of
offered cost units that would have been dropped; minutes from before it
counted cost are left out.`,
		Example: `  configurator backtest checkout
  configurator backtest checkout/web --current --days 7
  configurator backtest --from 2026-03-01 --to 2026-03-08T12:00 -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			return a.runBacktest(cmd, st, args, o)
		}),
	}
	addBacktestFlags(cmd, &o)
	return cmd
}

func addBacktestFlags(cmd *cobra.Command, o *backtestOptions) {
	fl := cmd.Flags()
	fl.BoolVar(&o.proposed, "proposed", false, "replay the pending proposals (the default); buckets without one keep the limit in force")
	fl.BoolVar(&o.current, "current", false, "replay the limits in force")
	fl.StringVar(&o.from, "from", "", "start of the replay, UTC: 2026-03-01 or 2026-03-01T12:00 or RFC 3339 (default: --days before --to)")
	fl.StringVar(&o.to, "to", "", "end of the replay, exclusive, same forms (default: now)")
	fl.IntVar(&o.days, "days", o.days, "days to replay, ending at --to, when --from is not given")
	fl.Float64Var(&o.law.PMax, "p-max", o.law.PMax, "the law's highest drop ratio, as the controller's --p-max")
	fl.Float64Var(&o.law.MinRate, "min-rate", o.law.MinRate, "offered rps below which nothing is dropped, as the controller's --min-rate")
	fl.Float64Var(&o.law.ReleaseRate, "release-rate", o.law.ReleaseRate, "slow release per second, as the controller's --release-rate")
	setting(fl, "p-max", "min-rate", "release-rate")
	addOutput(cmd, &o.out)
}

func (a *app) runBacktest(cmd *cobra.Command, st history.Store, args []string, o backtestOptions) error {
	var t target
	if len(args) == 1 {
		var err error
		if t, err = parseTarget(args[0], true); err != nil {
			return err
		}
	}
	if o.proposed && o.current {
		return errors.New("--proposed and --current exclude each other")
	}
	if err := o.law.Validate(); err != nil {
		return fmt.Errorf("invalid law settings (--p-max, --min-rate, --release-rate): %w", err)
	}
	from, to, err := window(a.clock(), o.from, o.to, o.days, cmd.Flags().Changed("days"))
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	lim, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	limits := backtestLimits{idx: newLimitIndex(lim), proposals: map[history.Bucket]float64{}}
	if !o.current {
		ps, err := st.Proposals(ctx, history.Filter{Callee: t.Callee})
		if err != nil {
			return fmt.Errorf("read proposals: %w", err)
		}
		for _, p := range ps {
			limits.proposals[p.Bucket] = p.Proposed
		}
	}
	rows, err := replayRows(cmd, st, t, limits.idx, from, to)
	if err != nil {
		return err
	}
	// A callee counting cost is replayed in cost units: its limits are.
	rows = CostRows(rows, limits.idx.counted)
	results, err := Replay(rows, ReplayLimits{
		Limit:    func(b history.Bucket) float64 { v, _ := limits.of(b); return v },
		Capacity: limits.idx.capacity,
	}, o.law)
	if err != nil {
		return err
	}
	results = slices.DeleteFunc(results, func(r BacktestResult) bool { return t.Caller != "" && !t.selects(r.Bucket) })
	if len(results) == 0 {
		what := "any bucket"
		if t.Callee != "" {
			what = t.String()
		}
		return fmt.Errorf("unknown bucket %s: no minute history between %s and %s", what, formatTime(from), formatTime(to))
	}
	return writeBacktest(cmd.OutOrStdout(), o.out, results, limits, from, to)
}

// backtestLimits are the limits a backtest replays.
type backtestLimits struct {
	proposals map[history.Bucket]float64 // pending; empty with --current
	idx       limitIndex
}

// of is b's limit and where it comes from: its proposal, else the limit in
// force, else none (+Inf).
func (l backtestLimits) of(b history.Bucket) (float64, string) {
	if v, ok := l.proposals[b]; ok {
		return v, fromProposal
	}
	if v, ok := l.idx.inForce(b); ok {
		return v, fromCurrent
	}
	return math.Inf(1), fromNone
}

// replayRows reads the minutes in [from, to) of the buckets t selects.
func replayRows(cmd *cobra.Command, st history.Store, t target, idx limitIndex, from, to time.Time) ([]history.MinuteRow, error) {
	// Which buckets have history: the daily rollup says, cheaply.
	// A callee with a capacity is replayed with all its callers,
	// whose demands share it; one with procedures with all its leaves and
	// levels, whose limits couple them.
	ctx := cmd.Context()
	peaks, err := st.DailyPeaks(ctx, history.Filter{Callee: t.Callee}, startOfDay(from), to)
	if err != nil {
		return nil, fmt.Errorf("read daily peaks: %w", err)
	}
	hier := slices.ContainsFunc(peaks, func(p history.DailyPeak) bool { return p.Procedure != "" })
	var buckets []history.Bucket
	for _, p := range peaks {
		wanted := t.Caller == "" || t.selects(p.Bucket) || hier || !math.IsInf(idx.capacity(p.Callee), 1)
		if wanted && (len(buckets) == 0 || buckets[len(buckets)-1] != p.Bucket) {
			buckets = append(buckets, p.Bucket)
		}
	}
	var rows []history.MinuteRow
	for _, b := range buckets {
		rs, err := st.Minutes(ctx, b, from, to)
		if err != nil {
			return nil, fmt.Errorf("read minutes of %s: %w", bucketString(b), err)
		}
		rows = append(rows, rs...)
	}
	return rows, nil
}

func writeBacktest(w io.Writer, out format, results []BacktestResult, limits backtestLimits, from, to time.Time) error {
	if out != formatTable {
		rs := make([]backtestRow, len(results))
		for i, r := range results {
			l, src := limits.of(r.Bucket)
			rs[i] = backtestRow{
				Callee: r.Callee, Caller: r.Caller, Procedure: r.Procedure, LimitFrom: src,
				Minutes: r.Minutes, Offered: math.Round(r.Offered), Dropped: math.Round(r.Dropped), Share: roundShare(r.Share()),
				DropMinutes: r.DropMinutes, WorstRatio: roundShare(r.WorstRatio),
				WorstMinute: optTime(r.WorstMinute), FirstDrop: optTime(r.FirstDrop), LastDrop: optTime(r.LastDrop),
			}
			if !math.IsInf(l, 1) {
				rs[i].Limit = &l
			}
			if limits.idx.counted(r.Callee) {
				rs[i].Unit = "cost"
			}
		}
		return encode(w, out, rs)
	}
	fmt.Fprintf(w, "replayed %s … %s, one step per minute\n\n", formatTime(from), formatTime(to))
	withProc := hasProcedure(results, func(r BacktestResult) history.Bucket { return r.Bucket })
	tb := newTable(w, bucketColumns(withProc, "CALLEE", "CALLER", "PROCEDURE", "LIMIT", "FROM", "DROPPED", "DROP MINUTES", "WORST MINUTE", "FIRST DROP", "LAST DROP")...)
	for _, r := range results {
		l, src := limits.of(r.Bucket)
		worst := ""
		if r.DropMinutes > 0 {
			worst = fmt.Sprintf("%s at %s", formatShare(r.WorstRatio), formatTime(r.WorstMinute))
		}
		limit, what := formatRate(l), "req"
		if limits.idx.counted(r.Callee) {
			what = "units"
			if !math.IsInf(l, 1) {
				limit += " units/s"
			}
		}
		tb.row(bucketColumns(withProc, r.Callee, r.Caller, r.Procedure, limit, src,
			fmt.Sprintf("%s of %s %s", formatShare(r.Share()), formatCount(r.Offered), what),
			fmt.Sprintf("%s of %s", formatCount(float64(r.DropMinutes)), formatCount(float64(r.Minutes))),
			worst, formatTime(r.FirstDrop), formatTime(r.LastDrop))...)
	}
	return tb.flush()
}

// window resolves --from, --to and --days to [from, to), whole minutes.
func window(now time.Time, fromS, toS string, ndays int, daysSet bool) (from, to time.Time, err error) {
	to = now.UTC().Truncate(time.Minute)
	if toS != "" {
		if to, err = parseTime("to", toS); err != nil {
			return from, to, err
		}
	}
	switch {
	case fromS != "" && daysSet:
		return from, to, errors.New("--from and --days exclude each other")
	case fromS != "":
		if from, err = parseTime("from", fromS); err != nil {
			return from, to, err
		}
	case ndays < 1:
		return from, to, fmt.Errorf("--days %d is below 1", ndays)
	default:
		from = to.AddDate(0, 0, -ndays)
	}
	if !from.Before(to) {
		return from, to, fmt.Errorf("--from %s is not before --to %s", formatTime(from), formatTime(to))
	}
	return from, to, nil
}

// parseTime reads a UTC time in one of the forms people type.
func parseTime(flag, s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", time.DateOnly} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t.UTC().Truncate(time.Minute), nil
		}
	}
	return time.Time{}, fmt.Errorf("--%s %q is not a time: use 2026-03-01, 2026-03-01T12:00 or RFC 3339", flag, s)
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// formatCount renders a count with thousands separators, rounded.
func formatCount(v float64) string {
	return groupThousands(fmt.Sprintf("%.0f", v))
}
