package configurator

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/pkg/history"
)

type auditRow struct {
	ID     int64     `json:"id" yaml:"id"`
	At     time.Time `json:"at" yaml:"at"`
	Actor  string    `json:"actor" yaml:"actor"`
	Action string    `json:"action" yaml:"action"`
	Callee string    `json:"callee" yaml:"callee"`
	Caller string    `json:"caller,omitempty" yaml:"caller,omitempty"`
	Proc   string    `json:"procedure,omitempty" yaml:"procedure,omitempty"`
	Old    string    `json:"old" yaml:"old"`
	New    string    `json:"new" yaml:"new"`
	Reason string    `json:"reason" yaml:"reason"`
}

func (a *app) auditCommand() *cobra.Command {
	var (
		since time.Duration = Day
		limit               = 50
		out   format
	)
	cmd := &cobra.Command{
		Use:   "audit [callee[/caller[/procedure]]]",
		Short: "who changed what, when and why",
		Long: `Lists the audit log, newest first: every change to a limit, a callee's settings
or a mode, every proposal and every decision, with who made it and why.
A callee alone includes the changes to its own settings and to all its buckets;
a caller, the changes to its leaves (callee/caller/procedure) too.`,
		Example: `  configurator audit
  configurator audit checkout/web --since 4w --limit 0`,
		Args: cobra.MaximumNArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			var f history.Filter
			if len(args) == 1 {
				t, err := parseTarget(args[0], true)
				if err != nil {
					return err
				}
				f = t.filter()
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d is negative; 0 lists every entry", limit)
			}
			var from time.Time
			if since > 0 {
				from = a.opts.Now().Add(-since)
			}
			entries, err := st.Audit(cmd.Context(), f, from, limit)
			if err != nil {
				return fmt.Errorf("read audit log: %w", err)
			}
			w := cmd.OutOrStdout()
			if out != formatTable {
				rows := make([]auditRow, len(entries))
				for i, e := range entries {
					rows[i] = auditRow{ID: e.ID, At: e.At.UTC(), Actor: e.Actor, Action: e.Action, Callee: e.Callee, Caller: e.Caller, Proc: e.Procedure, Old: e.Old, New: e.New, Reason: e.Reason}
				}
				return encode(w, out, rows)
			}
			switch {
			case len(entries) > 0:
			case since > 0:
				fmt.Fprintf(w, "no changes in the last %s\n", duration.Format(since))
				return nil
			default:
				fmt.Fprintln(w, "no changes")
				return nil
			}
			t := newTable(w, "TIME", "ACTOR", "ACTION", "BUCKET", "OLD", "NEW", "REASON")
			for _, e := range entries {
				b := e.Callee
				if e.Caller != "" {
					b = e.Path()
				}
				t.row(formatTime(e.At), e.Actor, e.Action, b, e.Old, e.New, e.Reason)
			}
			return t.flush()
		}),
	}
	cmd.Flags().Var((*duration.NonNegative)(&since), "since", "how far back to list (w, d, h, m, s); 0 lists everything")
	cmd.Flags().IntVar(&limit, "limit", limit, "most entries to list; 0 lists all")
	addOutput(cmd, &out)
	return cmd
}
