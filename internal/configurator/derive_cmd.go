package configurator

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/pkg/history"
)

// derivationOutput is derive's JSON and YAML.
type derivationOutput struct {
	DryRun    bool          `json:"dry_run" yaml:"dry_run"`
	Proposals []proposalRow `json:"proposals" yaml:"proposals"`
	Refusals  []refusalRow  `json:"refusals" yaml:"refusals"`
	Unchanged []bucketRow   `json:"unchanged" yaml:"unchanged"`
}

type refusalRow struct {
	Callee    string `json:"callee" yaml:"callee"`
	Caller    string `json:"caller" yaml:"caller"`
	Procedure string `json:"procedure,omitempty" yaml:"procedure,omitempty"`
	Days      int    `json:"days" yaml:"days"`
	Reason    string `json:"reason" yaml:"reason"`
}

type bucketRow struct {
	Callee    string `json:"callee" yaml:"callee"`
	Caller    string `json:"caller" yaml:"caller"`
	Procedure string `json:"procedure,omitempty" yaml:"procedure,omitempty"`
}

// deriveOptions are derive's flags.
type deriveOptions struct {
	cfg    DeriveConfig
	filter filterOptions
	dryRun bool
	out    format
}

func (a *app) deriveCommand() *cobra.Command {
	o := deriveOptions{cfg: DefaultDeriveConfig()}
	cmd := &cobra.Command{
		Use:   "derive [callee[/caller[/procedure]]]",
		Short: "propose limits from the history of every bucket",
		Long: `For each bucket with history, proposes

  limit = peak over --lookback × (1 + --headroom)

rounded up to two significant figures (1234 → 1300, 87.2 → 88; never down, by
less than 10 %), never below the peak of the last --recent (rounded up the same
way) nor below --min-limit. A window is every UTC day it overlaps, today
included: 28d at noon reads 29 daily peaks.

A bucket needs --min-days days with at least --min-coverage of their 1440
minutes of history in the look-back; otherwise it is listed with the reason
and nothing is proposed for it. History comes from the controller, which
writes a row per bucket per minute when run with --database-url; for a demo,
"configurator history seed --synthetic 4w" writes made-up history.

A proposal more than --max-step-down below the limit in force is flagged
"step down needs approval": approve --all skips it.
A bucket whose derived limit is already in force is left alone.

For a callee that declares procedures, the controller keeps history per
(caller, procedure) leaf and per procedure: derive proposes a leaf's limit
(checkout/web/create-charge) and a procedure's capacity (checkout/*/create-charge)
the same way, and a caller's limit across procedures from its own rows.
A bucket path derives for that bucket alone.

For a callee with --unit cost (configurator set CALLEE --unit cost), the
controller keeps the offered and admitted cost rate too: derive proposes from
the peaks of its offered cost rate, in cost units per second ("units/s"), with
the same rules; days before it counted cost are days without history.

Proposals are written for review (superseding pending ones of the same
buckets); --dry-run only prints them. Durations take w, d, h, m, s: 28d, 4w,
672h, 1w3d.`,
		Example: `  configurator derive --dry-run
  configurator derive --callee checkout --lookback 2w --headroom 0.5
  configurator derive checkout/*/create-charge`,
		Args: cobra.MaximumNArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			return a.runDerive(cmd, st, args, o)
		}),
	}
	addDeriveFlags(cmd, &o)
	return cmd
}

func addDeriveFlags(cmd *cobra.Command, o *deriveOptions) {
	cfg := &o.cfg
	fl := cmd.Flags()
	fl.Var((*duration.NonNegative)(&cfg.Lookback), "lookback", "window whose peak the limit comes from (w, d, h, m, s: 28d, 4w, 672h)")
	fl.Float64Var(&cfg.Headroom, "headroom", cfg.Headroom, "share added to the peak: 0.25 proposes 125 % of it")
	fl.Var((*duration.NonNegative)(&cfg.Recent), "recent", "window whose peak the limit is never below")
	fl.Float64Var(&cfg.MaxStepDown, "max-step-down", cfg.MaxStepDown, "largest cut, as a share of the limit in force, that needs no explicit approval")
	fl.IntVar(&cfg.MinDays, "min-days", cfg.MinDays, "days of history a bucket needs in the look-back")
	fl.Float64Var(&cfg.MinCoverage, "min-coverage", cfg.MinCoverage, "share of a day's 1440 minutes it needs to count as a day of history")
	fl.Float64Var(&cfg.MinLimit, "min-limit", cfg.MinLimit, "lowest limit ever proposed, rps, so that an idle bucket is not blocked")
	setting(fl, "lookback", "headroom", "recent", "max-step-down", "min-days", "min-coverage", "min-limit")
	fl.BoolVar(&o.dryRun, "dry-run", false, "print the proposals, write nothing")
	addFilterFlags(cmd, &o.filter)
	addOutput(cmd, &o.out)
}

func (a *app) runDerive(cmd *cobra.Command, st history.Store, args []string, o deriveOptions) error {
	cfg := o.cfg
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !o.dryRun {
		if err := a.requireActor(); err != nil {
			return err
		}
	}
	f, keep, err := o.filter.filter(args)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	now := a.clock()
	start := time.Now()
	lim, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	from, to := cfg.Window(now)
	peaks, err := st.DailyPeaks(ctx, f, from, to)
	if err != nil {
		return fmt.Errorf("read daily peaks: %w", err)
	}
	peaks = slices.DeleteFunc(peaks, func(p history.DailyPeak) bool { return !keep(p.Bucket) })
	read := time.Since(start)
	d := Derive(peaks, lim, cfg, now)
	a.log.Debug("derived", "daily_rows", len(peaks), "read", read, "derive", time.Since(start)-read,
		"proposals", len(d.Proposals), "refusals", len(d.Refusals), "unchanged", len(d.Unchanged))

	written := d.Proposals
	if !o.dryRun && len(d.Proposals) > 0 {
		reason := fmt.Sprintf("derived: peak over %s × %v, at least the %s peak",
			duration.Format(cfg.Lookback), 1+cfg.Headroom, duration.Format(cfg.Recent))
		written, err = st.Propose(ctx, d.Proposals, a.change(reason))
		if err != nil {
			return fmt.Errorf("write proposals: %w", err)
		}
	}
	return a.writeDerive(cmd, o, f, d, written, len(peaks), newLimitIndex(lim).counted)
}

// writeDerive reports d, of which written were written (or would be, with
// --dry-run), derived from npeaks daily rows of the buckets f selects.
func (a *app) writeDerive(cmd *cobra.Command, o deriveOptions, f history.Filter, d Derivation, written []history.Proposal, npeaks int, counted func(string) bool) error {
	w := cmd.OutOrStdout()
	if o.out != formatTable {
		out := derivationOutput{DryRun: o.dryRun, Proposals: proposalRows(written), Refusals: []refusalRow{}, Unchanged: []bucketRow{}}
		for _, r := range d.Refusals {
			out.Refusals = append(out.Refusals, refusalRow{Callee: r.Callee, Caller: r.Caller, Procedure: r.Procedure, Days: r.Days, Reason: r.Reason})
		}
		for _, b := range d.Unchanged {
			out.Unchanged = append(out.Unchanged, bucketRow{Callee: b.Callee, Caller: b.Caller, Procedure: b.Procedure})
		}
		if err := encode(w, o.out, out); err != nil {
			return err
		}
		// Stdout stays one document; people still get the hint.
		if npeaks == 0 || len(d.Proposals)+len(d.Unchanged) == 0 {
			writeNoHistory(cmd.ErrOrStderr(), describeDB(a.databaseURL), f, o.cfg, npeaks == 0)
		}
		return nil
	}
	if npeaks == 0 {
		writeNoHistory(w, describeDB(a.databaseURL), f, o.cfg, true)
		return nil
	}
	if err := writeDerivation(w, d, written, o.dryRun, counted); err != nil {
		return err
	}
	if len(d.Proposals)+len(d.Unchanged) == 0 {
		fmt.Fprintln(w)
		writeNoHistory(w, describeDB(a.databaseURL), f, o.cfg, false)
	}
	return nil
}

func writeDerivation(w io.Writer, d Derivation, written []history.Proposal, dryRun bool, counted func(string) bool) error {
	if len(written) > 0 {
		if err := writeProposals(w, written, !dryRun, counted); err != nil {
			return err
		}
	}
	if len(d.Refusals) > 0 {
		if len(written) > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "not proposed, too little history:")
		withProc := hasProcedure(d.Refusals, func(r Refusal) history.Bucket { return r.Bucket })
		t := newTable(w, bucketColumns(withProc, "CALLEE", "CALLER", "PROCEDURE", "REASON")...)
		for _, r := range d.Refusals {
			t.row(bucketColumns(withProc, r.Callee, r.Caller, r.Procedure, r.Reason)...)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(written) > 0 || len(d.Refusals) > 0 {
		fmt.Fprintln(w)
	}
	switch {
	case len(written) == 0:
		fmt.Fprint(w, "no proposals")
	case dryRun:
		fmt.Fprintf(w, "dry run: %s not written", plural(len(written), "proposal"))
	case len(written) == 1:
		fmt.Fprintf(w, "wrote 1 proposal (id %d); review it with `configurator review`", written[0].ID)
	default:
		fmt.Fprintf(w, "wrote %s (ids %d–%d); review them with `configurator review`",
			plural(len(written), "proposal"), minID(written), maxID(written))
	}
	fmt.Fprintf(w, "; %s refused, %s unchanged\n", plural(len(d.Refusals), "bucket"), plural(len(d.Unchanged), "bucket"))
	return nil
}

// writeNoHistory says that there is no history (none) or too little of it in
// db for the buckets f selects, what derive needs, and where history comes
// from: the first thing a new user meets.
func writeNoHistory(w io.Writer, db string, f history.Filter, cfg DeriveConfig, none bool) {
	what := "every bucket"
	if f != (history.Filter{}) {
		what = "the buckets " + f.String()
	}
	if none {
		fmt.Fprintf(w, "no history in %s for %s in the last %s.\n", db, what, duration.Format(max(cfg.Lookback, cfg.Recent)))
	} else {
		fmt.Fprintf(w, "too little history in %s for %s to propose any limit.\n", db, what)
	}
	fmt.Fprintf(w, "derive needs --min-days %d days, each with --min-coverage %s of its 1440 minutes, in the last --lookback %s.\n",
		cfg.MinDays, formatPercent(cfg.MinCoverage), duration.Format(cfg.Lookback))
	fmt.Fprintln(w, "The controller writes a row per bucket per minute when run with --database-url.")
	fmt.Fprintln(w, "For a demo: configurator history seed --synthetic 4w --reason \"try derive\" (made-up history; see its --help).")
}

// describeDB names the database at url for people, without credentials:
// database "sluice" on db:5432.
func describeDB(url string) string {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return "the database"
	}
	host := cfg.Host
	if !strings.HasPrefix(host, "/") {
		host = net.JoinHostPort(host, strconv.Itoa(int(cfg.Port)))
	}
	return fmt.Sprintf("database %q on %s", cfg.Database, host)
}

func minID(ps []history.Proposal) int64 {
	m := ps[0].ID
	for _, p := range ps {
		m = min(m, p.ID)
	}
	return m
}

func maxID(ps []history.Proposal) int64 {
	var m int64
	for _, p := range ps {
		m = max(m, p.ID)
	}
	return m
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
