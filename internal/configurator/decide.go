package configurator

import (
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/history"
)

// decideOutput is approve's and reject's JSON and YAML.
type decideOutput struct {
	Decided []proposalRow `json:"decided" yaml:"decided"`
	Skipped []proposalRow `json:"skipped" yaml:"skipped"`
}

// decideOptions are approve's and reject's flags.
type decideOptions struct {
	ids    []int64
	all    bool
	force  bool
	reason string
	out    format
}

// decideCommand builds approve or reject.
func (a *app) decideCommand(verb string) *cobra.Command {
	var o decideOptions
	approve := verb == "approve"
	cmd := &cobra.Command{
		Use:   verb + " [callee[/caller[/procedure]]...] [--id N...] [--all] --reason TEXT",
		Short: map[bool]string{true: "put pending proposals in force", false: "close pending proposals without applying them"}[approve],
		Example: fmt.Sprintf(`  configurator %[1]s checkout/web --reason "matches last quarter"
  configurator %[1]s --id 12 --id 13 --reason "reviewed in #traffic"
  configurator %[1]s --all --reason "weekly review"`, verb),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			return a.runDecide(cmd, st, verb, args, o)
		}),
	}
	fl := cmd.Flags()
	fl.Int64SliceVar(&o.ids, "id", nil, "proposal id, as review shows it (repeatable)")
	fl.BoolVar(&o.all, "all", false, "every pending proposal")
	fl.StringVar(&o.reason, "reason", "", "why, for the audit log (required)")
	if approve {
		fl.BoolVar(&o.force, "force", false, `with --all or a callee alone, approve proposals flagged "step down needs approval" too`)
	}
	addOutput(cmd, &o.out)
	return cmd
}

func (a *app) runDecide(cmd *cobra.Command, st history.Store, verb string, args []string, o decideOptions) error {
	approve := verb == "approve"
	if err := a.requireChange(o.reason); err != nil {
		return err
	}
	if o.all && (len(args) > 0 || len(o.ids) > 0) {
		return errors.New("--all selects every pending proposal; give it without buckets or --id")
	}
	if !o.all && len(args) == 0 && len(o.ids) == 0 {
		return fmt.Errorf("say which proposals to %s: callee/caller arguments, --id, or --all", verb)
	}
	var targets []target
	for _, s := range args {
		t, err := parseTarget(s, true)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	ctx := cmd.Context()
	pending, err := st.Proposals(ctx, history.Filter{})
	if err != nil {
		return fmt.Errorf("read proposals: %w", err)
	}
	chosen, explicit, err := selectProposals(pending, o.all, targets, o.ids)
	if err != nil {
		return err
	}

	var decide, skipped []history.Proposal
	for _, p := range pending {
		switch {
		case !chosen[p.ID]:
		case approve && !o.force && !explicit[p.ID] && slices.Contains(p.Flags, FlagStepDown):
			skipped = append(skipped, p)
		default:
			decide = append(decide, p)
		}
	}
	var decided []history.Proposal
	if len(decide) > 0 {
		idList := make([]int64, len(decide))
		for i, p := range decide {
			idList[i] = p.ID
		}
		do := st.Reject
		if approve {
			do = st.Approve
		}
		decided, err = do(ctx, idList, a.change(o.reason))
		if errors.Is(err, history.ErrNotDecidable) {
			return fmt.Errorf("%s nothing: a proposal was decided or superseded meanwhile; run review again: %w", verb, err)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", verb, err)
		}
	}
	return writeDecided(cmd.OutOrStdout(), o.out, approve, decided, skipped)
}

// selectProposals chooses among pending those that all, targets and ids
// select, remembering which were named one by one: those are explicitly
// approved even when they step down. Every target or id that selects
// nothing is reported at once.
func selectProposals(pending []history.Proposal, all bool, targets []target, ids []int64) (chosen, explicit map[int64]bool, err error) {
	explicit = map[int64]bool{}
	chosen = map[int64]bool{}
	if all {
		for _, p := range pending {
			chosen[p.ID] = true
		}
	}
	var errs []error
	for _, t := range targets {
		n := 0
		for _, p := range pending {
			if t.selects(p.Bucket) {
				chosen[p.ID] = true
				explicit[p.ID] = explicit[p.ID] || t.Caller != ""
				n++
			}
		}
		if n == 0 {
			errs = append(errs, fmt.Errorf("no pending proposal for %s (see `configurator review`)", t))
		}
	}
	for _, id := range ids {
		if !slices.ContainsFunc(pending, func(p history.Proposal) bool { return p.ID == id }) {
			errs = append(errs, fmt.Errorf("--id %d: no pending proposal with this id (see `configurator review`)", id))
			continue
		}
		chosen[id], explicit[id] = true, true
	}
	return chosen, explicit, errors.Join(errs...)
}

func writeDecided(w io.Writer, out format, approve bool, decided, skipped []history.Proposal) error {
	if out != formatTable {
		return encode(w, out, decideOutput{Decided: proposalRows(decided), Skipped: proposalRows(skipped)})
	}
	if len(decided) == 0 && len(skipped) == 0 {
		fmt.Fprintln(w, "no pending proposals")
		return nil
	}
	if len(decided) > 0 {
		past := map[bool]string{true: "approved", false: "rejected"}[approve]
		fmt.Fprintf(w, "%s %s:\n", past, plural(len(decided), "proposal"))
		withProc := hasProcedure(decided, func(p history.Proposal) history.Bucket { return p.Bucket })
		t := newTable(w, append([]string{"ID"}, bucketColumns(withProc, "CALLEE", "CALLER", "PROCEDURE", "LIMIT")...)...)
		for _, p := range decided {
			t.row(append([]string{fmt.Sprint(p.ID)}, bucketColumns(withProc, p.Callee, p.Caller, p.Procedure, change(p, approve))...)...)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(skipped) > 0 {
		fmt.Fprintf(w, "skipped %s flagged %q; approve by bucket or --id, or use --force:\n", plural(len(skipped), "proposal"), FlagStepDown)
		withProc := hasProcedure(skipped, func(p history.Proposal) history.Bucket { return p.Bucket })
		t := newTable(w, append([]string{"ID"}, bucketColumns(withProc, "CALLEE", "CALLER", "PROCEDURE", "LIMIT")...)...)
		for _, p := range skipped {
			t.row(append([]string{fmt.Sprint(p.ID)}, bucketColumns(withProc, p.Callee, p.Caller, p.Procedure, change(p, true))...)...)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	return nil
}

// change renders a proposal's effect: "1,000 → 1,300 (+30%)".
func change(p history.Proposal, applied bool) string {
	if !applied {
		return formatRate(p.Proposed) + " (not applied)"
	}
	if p.Current == nil {
		return "none → " + formatRate(p.Proposed)
	}
	return fmt.Sprintf("%s → %s (%s)", formatRate(*p.Current), formatRate(p.Proposed), formatDelta(*p.Current, p.Proposed))
}
