package configurator

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// routeRow is a route as routes list prints it in JSON and YAML.
type routeRow struct {
	Callee    string `json:"callee" yaml:"callee"`
	Position  int    `json:"position" yaml:"position"`
	Route     string `json:"route" yaml:"route"`
	Procedure string `json:"procedure" yaml:"procedure"`
}

func (a *app) routesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "routes",
		Short: "a callee's HTTP routes: which procedure each request is",
		Long: `A callee's routes name the procedure of each HTTP request, in order: the first
route whose pattern matches names it, and a request no route matches is _other.
A pattern is "[METHOD ]PATH-TEMPLATE": POST /v1/charges, GET /v1/items/{id},
/static/* (docs: pkg/routes). The controller sends a callee's routes with its
policy, so a change needs no restart. Limits on procedures are set with
configurator set callee/caller/procedure and callee/*/procedure.`,
	}
	cmd.AddCommand(a.routesSetCommand(), a.routesClearCommand(), a.routesListCommand())
	return cmd
}

func (a *app) routesSetCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "set callee 'PATTERN=PROCEDURE'... --reason TEXT",
		Short: "replace a callee's routes, in order",
		Long: `Replaces the callee's routes with those given, in order, each
"PATTERN=PROCEDURE". They are checked as the sidecar compiles them: a bad
pattern or procedure, a route an earlier one shadows, more than 256 routes:
each problem is reported, and nothing is written. A change after which the
controller could not load the limits (a limit on a procedure that no route
names any more and that is not a gRPC method) is refused.`,
		Example: `  configurator routes set checkout 'POST /v1/charges=create-charge' 'GET /v1/items/{id}=get-item' --reason "charges limits"`,
		Args:    cobra.MinimumNArgs(2),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			callee, rs, err := parseRoutes(args[0], args[1:])
			if err != nil {
				return err
			}
			if err := a.requireChange(reason); err != nil {
				return err
			}
			return a.setRoutes(cmd, st, callee, rs, reason)
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

func (a *app) routesClearCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:     "clear callee --reason TEXT",
		Short:   "remove a callee's routes",
		Example: `  configurator routes clear checkout --reason "back to one bucket per caller"`,
		Args:    cobra.ExactArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			if err := names.Check(args[0]); err != nil {
				return fmt.Errorf("callee %q: %v", args[0], err)
			}
			if err := a.requireChange(reason); err != nil {
				return err
			}
			return a.setRoutes(cmd, st, args[0], nil, reason)
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

func (a *app) routesListCommand() *cobra.Command {
	var out format
	cmd := &cobra.Command{
		Use:     "list [callee]",
		Short:   "list the routes of a callee, or of every callee",
		Example: `  configurator routes list checkout`,
		Args:    cobra.MaximumNArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			var callee string
			if len(args) == 1 {
				if callee = args[0]; names.Check(callee) != nil {
					return fmt.Errorf("callee %q: %v", callee, names.Check(callee))
				}
			}
			lim, err := st.Limits(cmd.Context())
			if err != nil {
				return fmt.Errorf("read limits: %w", err)
			}
			var rows []routeRow
			for _, sr := range lim.Routes {
				if callee != "" && sr.Callee != callee {
					continue
				}
				for i, r := range sr.Routes {
					rows = append(rows, routeRow{Callee: sr.Callee, Position: i, Route: r.Pattern, Procedure: r.Procedure})
				}
			}
			w := cmd.OutOrStdout()
			if out != formatTable {
				return encode(w, out, append([]routeRow{}, rows...))
			}
			switch {
			case len(rows) > 0:
			case callee != "":
				fmt.Fprintf(w, "%s has no routes\n", callee)
				return nil
			default:
				fmt.Fprintln(w, "no routes")
				return nil
			}
			return writeRoutes(w, rows)
		}),
	}
	addOutput(cmd, &out)
	return cmd
}

func writeRoutes(w io.Writer, rows []routeRow) error {
	t := newTable(w, "CALLEE", "#", "ROUTE", "PROCEDURE")
	for _, r := range rows {
		t.row(r.Callee, fmt.Sprint(r.Position), r.Route, r.Procedure)
	}
	return t.flush()
}

// parseRoutes reads "PATTERN=PROCEDURE" arguments (the procedure follows
// the last '=': no procedure has one) and checks them with the sidecar's
// own compiler, every problem at once.
func parseRoutes(callee string, args []string) (string, []routes.Route, error) {
	if err := names.Check(callee); err != nil {
		return "", nil, fmt.Errorf("callee %q: %v", callee, err)
	}
	var errs []error
	rs := make([]routes.Route, len(args))
	for i, arg := range args {
		eq := strings.LastIndexByte(arg, '=')
		if eq < 0 {
			errs = append(errs, fmt.Errorf("route %q: want PATTERN=PROCEDURE, e.g. 'POST /v1/charges=create-charge'", arg))
			continue
		}
		rs[i] = routes.Route{Pattern: arg[:eq], Procedure: arg[eq+1:]}
	}
	if err := errors.Join(errs...); err != nil {
		return "", nil, err
	}
	if _, err := routes.CompileRoutes(rs); err != nil {
		return "", nil, fmt.Errorf("routes of %s: %w", callee, err)
	}
	return callee, rs, nil
}

// setRoutes writes a callee's routes (none: removes them) and prints them.
func (a *app) setRoutes(cmd *cobra.Command, st history.Store, callee string, rs []routes.Route, reason string) error {
	ctx := cmd.Context()
	lim, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	if err := checkLoads(lim, func(l *history.Limits) {
		var out []history.ServiceRoutes
		for _, sr := range l.Routes {
			if sr.Callee != callee {
				out = append(out, sr)
			}
		}
		if len(rs) > 0 {
			out = append(out, history.ServiceRoutes{Callee: callee, Routes: rs})
		}
		l.Routes = out
	}); err != nil {
		return fmt.Errorf("set routes of %s: %w", callee, err)
	}
	if err := st.SetRoutes(ctx, callee, rs, a.change(reason)); err != nil {
		return fmt.Errorf("set routes of %s: %w", callee, err)
	}
	w := cmd.OutOrStdout()
	if len(rs) == 0 {
		fmt.Fprintf(w, "%s: routes removed\n", callee)
		return nil
	}
	fmt.Fprintf(w, "%s: %s\n", callee, plural(len(rs), "route"))
	rows := make([]routeRow, len(rs))
	for i, r := range rs {
		rows[i] = routeRow{Callee: callee, Position: i, Route: r.Pattern, Procedure: r.Procedure}
	}
	return writeRoutes(w, rows)
}
