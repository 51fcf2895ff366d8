package configurator

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
)

// proposalRow is a proposal as review, derive, approve and reject print it
// in JSON and YAML. Limits (current, proposed) are exact: they are what is
// or will be in force. Measured rates (the peaks) are rounded as the table
// shows them (roundRate), delta_pct to 0.1, and flags are stable codes
// (flagCodes), so that scripts can compare them.
type proposalRow struct {
	ID           int64      `json:"id,omitempty" yaml:"id,omitempty"`
	Callee       string     `json:"callee" yaml:"callee"`
	Caller       string     `json:"caller" yaml:"caller"`
	Procedure    string     `json:"procedure,omitempty" yaml:"procedure,omitempty"`
	Current      *float64   `json:"current" yaml:"current"`
	Proposed     float64    `json:"proposed" yaml:"proposed"`
	DeltaPct     *float64   `json:"delta_pct" yaml:"delta_pct"` // null for a new limit
	PeakLookback float64    `json:"peak_lookback" yaml:"peak_lookback"`
	PeakRecent   float64    `json:"peak_recent" yaml:"peak_recent"`
	Flags        []string   `json:"flags" yaml:"flags"`
	Status       string     `json:"status,omitempty" yaml:"status,omitempty"`
	CreatedBy    string     `json:"created_by,omitempty" yaml:"created_by,omitempty"`
	CreatedAt    *time.Time `json:"created_at,omitempty" yaml:"created_at,omitempty"`
	DecidedBy    string     `json:"decided_by,omitempty" yaml:"decided_by,omitempty"`
	DecidedAt    *time.Time `json:"decided_at,omitempty" yaml:"decided_at,omitempty"`
	Reason       string     `json:"reason,omitempty" yaml:"reason,omitempty"`
}

// flagCodes spell the flags for JSON and YAML. The prose is for people
// (the table) and is what the store keeps, so that binaries of every
// version read the same flags; the codes are for scripts, and never change.
var flagCodes = map[string]string{
	FlagNewLimit:       "new_limit",
	FlagStepDown:       "step_down_needs_approval",
	FlagHeldAtRecent:   "held_at_recent_peak",
	FlagReplacesManual: "replaces_manual",
	FlagCurrentHit:     "current_below_recent_peak",
	FlagBelowRecent:    "lowers_below_recent_peak",
}

// flagCode is a flag's code; a flag this binary does not know (written by
// another proposer) is spelled the same way: lower case, runs of anything
// but letters and digits as one "_".
func flagCode(flag string) string {
	if c, ok := flagCodes[flag]; ok {
		return c
	}
	var b strings.Builder
	sep := false
	for _, r := range strings.ToLower(flag) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if sep && b.Len() > 0 {
				b.WriteByte('_')
			}
			b.WriteRune(r)
			sep = false
			continue
		}
		sep = true
	}
	return b.String()
}

// reviewFlags returns p's flags plus those review adds from its numbers,
// whoever wrote the proposal.
func reviewFlags(p history.Proposal) []string {
	flags := slices.Clone(p.Flags)
	if p.Proposed < p.PeakRecent && !slices.Contains(flags, FlagBelowRecent) {
		flags = append(flags, FlagBelowRecent)
	}
	if flags == nil {
		flags = []string{}
	}
	return flags
}

func newProposalRow(p history.Proposal) proposalRow {
	flags := reviewFlags(p)
	for i, f := range flags {
		flags[i] = flagCode(f)
	}
	r := proposalRow{
		ID: p.ID, Callee: p.Callee, Caller: p.Caller, Procedure: p.Procedure,
		Current: p.Current, Proposed: p.Proposed,
		PeakLookback: roundRate(p.PeakLookback), PeakRecent: roundRate(p.PeakRecent),
		Flags:     flags,
		Status:    string(p.Status),
		CreatedBy: p.CreatedBy,
		DecidedBy: p.DecidedBy,
		Reason:    p.Reason,
	}
	if p.Current != nil && *p.Current != 0 {
		d := roundPct((p.Proposed - *p.Current) / *p.Current * 100)
		r.DeltaPct = &d
	}
	if !p.CreatedAt.IsZero() {
		t := p.CreatedAt.UTC()
		r.CreatedAt = &t
	}
	if !p.DecidedAt.IsZero() {
		t := p.DecidedAt.UTC()
		r.DecidedAt = &t
	}
	return r
}

// writeProposals writes proposals as review's table: current vs proposed.
//
// counted, when given, says which callees count cost: their rates read
// "1,300 units/s"; the others' stay bare, in rps.
func writeProposals(w io.Writer, ps []history.Proposal, withID bool, counted ...func(callee string) bool) error {
	withProc := hasProcedure(ps, func(p history.Proposal) history.Bucket { return p.Bucket })
	header := bucketColumns(withProc, "CALLEE", "CALLER", "PROCEDURE", "CURRENT", "PROPOSED", "Δ", "LOOKBACK PEAK", "RECENT PEAK", "FLAGS")
	if withID {
		header = append([]string{"ID"}, header...)
	}
	t := newTable(w, header...)
	for _, p := range ps {
		cur, delta := "none", "new"
		if p.Current != nil {
			cur, delta = formatRate(*p.Current), formatDelta(*p.Current, p.Proposed)
		}
		flags := ""
		for i, f := range reviewFlags(p) {
			if i > 0 {
				flags += ", "
			}
			flags += f
		}
		rate := formatRate
		if len(counted) > 0 && counted[0](p.Callee) {
			rate = func(v float64) string { return formatRate(v) + " units/s" }
			if p.Current != nil {
				cur = rate(*p.Current)
			}
		}
		cells := bucketColumns(withProc, p.Callee, p.Caller, p.Procedure, cur, rate(p.Proposed), delta, rate(p.PeakLookback), rate(p.PeakRecent), flags)
		if withID {
			cells = append([]string{fmt.Sprint(p.ID)}, cells...)
		}
		t.row(cells...)
	}
	return t.flush()
}

func proposalRows(ps []history.Proposal) []proposalRow {
	rows := make([]proposalRow, len(ps))
	for i, p := range ps {
		rows[i] = newProposalRow(p)
	}
	return rows
}

func (a *app) reviewCommand() *cobra.Command {
	var (
		fo  filterOptions
		out format
	)
	cmd := &cobra.Command{
		Use:   "review [callee[/caller[/procedure]]]",
		Short: "compare pending proposals with the limits in force",
		Long: `Lists the pending proposals, one per bucket: the limit in force (CURRENT: the
bucket's own, else, for a caller, its callee's default), the proposal, the change, the peaks it
was derived from, and flags worth a look:

  new limit                  the bucket has no limit of its own yet
  step down needs approval   lowers the limit by more than derive's --max-step-down;
                             approve --all skips it: approve it by bucket or --id
  replaces manual limit      the limit in force was set by hand
  current below recent peak  traffic went over the limit in force in the recent window
  held at recent peak        the recent-peak guard raised the proposal
  lowers below recent peak   the proposal is below the recent peak

Rates are requests per second, or cost units per second ("units/s") for a
callee with --unit cost. -o json and -o yaml spell the flags as codes
that never change: new_limit, step_down_needs_approval, replaces_manual,
current_below_recent_peak, held_at_recent_peak, lowers_below_recent_peak; they
round measured rates as the table does and delta_pct to 0.1, and give limits
(current, proposed) exactly.`,
		Example: `  configurator review
  configurator review --callee checkout -o json
  configurator review checkout/web/create-charge`,
		Args: cobra.MaximumNArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			f, keep, err := fo.filter(args)
			if err != nil {
				return err
			}
			ps, err := st.Proposals(cmd.Context(), f)
			if err != nil {
				return fmt.Errorf("read proposals: %w", err)
			}
			ps = slices.DeleteFunc(ps, func(p history.Proposal) bool { return !keep(p.Bucket) })
			w := cmd.OutOrStdout()
			if out != formatTable {
				return encode(w, out, proposalRows(ps))
			}
			if len(ps) == 0 {
				fmt.Fprintln(w, "no pending proposals")
				return nil
			}
			lim, err := st.Limits(cmd.Context())
			if err != nil {
				return fmt.Errorf("read limits: %w", err)
			}
			return writeProposals(w, ps, true, newLimitIndex(lim).counted)
		}),
	}
	addFilterFlags(cmd, &fo)
	addOutput(cmd, &out)
	return cmd
}

// filterOptions are the flags that select buckets: --callee, --caller
// (with its leaves) and --procedure (every caller's leaf of it, and its
// own level).
type filterOptions struct{ callee, caller, procedure string }

func addFilterFlags(cmd *cobra.Command, o *filterOptions) {
	cmd.Flags().StringVar(&o.callee, "callee", "", "only buckets of this callee")
	cmd.Flags().StringVar(&o.caller, "caller", "", "only buckets of this caller (its leaves included; * for procedures' own levels)")
	cmd.Flags().StringVar(&o.procedure, "procedure", "", "only buckets of this procedure (a route's name, or a gRPC method /pkg.Service/Method)")
}

// filter checks the flags, or the one bucket path of args (which they
// then may not narrow), and returns what to read from the store and which
// of what it returns to keep: a path with a caller names one bucket.
func (o filterOptions) filter(args []string) (history.Filter, func(history.Bucket) bool, error) {
	all := func(history.Bucket) bool { return true }
	if len(args) == 1 {
		if o != (filterOptions{}) {
			return history.Filter{}, nil, fmt.Errorf("give a bucket %s or --callee, --caller and --procedure, not both", args[0])
		}
		t, err := parseTarget(args[0], true)
		if err != nil {
			return history.Filter{}, nil, err
		}
		return t.filter(), t.selects, nil
	}
	var errs []error
	for _, f := range [...]struct{ flag, v string }{{"callee", o.callee}, {"caller", o.caller}} {
		if f.v == "" || f.flag == "caller" && f.v == history.AnyCaller {
			continue
		}
		if err := names.Check(f.v); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %v", f.flag, err))
		}
	}
	if o.procedure != "" {
		if err := names.CheckProcedure(o.procedure); err != nil {
			errs = append(errs, fmt.Errorf("--procedure: %v", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return history.Filter{}, nil, err
	}
	return history.Filter{Callee: o.callee, Caller: o.caller, Procedure: o.procedure}, all, nil
}
