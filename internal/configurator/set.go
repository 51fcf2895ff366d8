package configurator

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// setOptions are set's flags, as given.
type setOptions struct {
	limit, mode, defaultLimit, capacity, failMode, enforcement, reason string
}

func (a *app) setCommand() *cobra.Command {
	var o setOptions
	cmd := &cobra.Command{
		Use:   "set callee/caller[/procedure] --limit N | callee/*/procedure --limit N | callee [--default-limit N] [--capacity N] [--fail-mode M] [--enforcement E]",
		Short: "set a limit by hand (a manual override), or a callee's own settings",
		Long: `With callee/caller, sets the bucket's limit by hand (source "manual"): --limit in
rps (0 blocks; "none" removes the bucket's own limit), optionally --mode and
--enforcement. For a callee that declares procedures, the caller's limit holds
across all of them.

With callee/caller/procedure, sets the limit of that (caller, procedure) leaf;
with callee/*/procedure, the procedure's capacity, shared by all its callers.
The procedure is everything after the second '/': a route's procedure
(configurator routes) or a gRPC full method, checkout/web//shop.Checkout/Pay.
A leaf is enforced as its caller is, so neither takes --mode or --enforcement.
A change the controller could not load (a procedure no route names that is
not a gRPC method, upstream enforcement on a callee with procedures) is refused.

With a callee alone, sets the service's own settings: --default-limit for callers
without a limit of their own, --capacity shared by all its callers ("none"
removes either), --fail-mode (open, hold or local), --mode and --enforcement.
Settings not given keep their value.

--enforcement upstream says the bucket's ratio is carried out before its
requests reach the callee's sidecar: by the caller's proxyless gRPC client, or
by an Envoy in front of the callee (set it on the callee: it is the default of
callers without a limit of their own, and of new bucket limits, but never of
unknown and _overflow). The callee's sidecar then counts those requests as
offered before the upstream drops and never drops them. sidecar (the default)
undoes it.

Every change needs a --reason and is audited.`,
		Example: `  configurator set checkout/web --limit 1500 --reason "launch week"
  configurator set checkout/batch --limit 0 --mode shadow --reason "would block batch"
  configurator set checkout --capacity 5000 --fail-mode hold --reason "db capacity"
  configurator set checkout/app --limit 300 --enforcement upstream --reason "proxyless gRPC client"
  configurator set checkout/web/create-charge --limit 50 --reason "charges are expensive"
  configurator set checkout/*//shop.Checkout/Pay --limit 500 --reason "payment provider quota"`,
		Args: cobra.ExactArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			return a.runSet(cmd, st, args[0], o)
		}),
	}
	addSetFlags(cmd, &o)
	return cmd
}

func addSetFlags(cmd *cobra.Command, o *setOptions) {
	fl := cmd.Flags()
	fl.StringVar(&o.limit, "limit", "", `the bucket's limit in rps; 0 blocks, "none" removes it`)
	fl.StringVar(&o.mode, "mode", "", "enforce or shadow")
	fl.StringVar(&o.defaultLimit, "default-limit", "", `callee: limit of callers without one of their own, rps, or "none"`)
	fl.StringVar(&o.capacity, "capacity", "", `callee: rps all its callers share, or "none"`)
	fl.StringVar(&o.failMode, "fail-mode", "", "callee: what its sidecars do when their policy expires: open, hold or local")
	fl.StringVar(&o.enforcement, "enforcement", "", "sidecar, or upstream: a proxyless gRPC client or the callee's Envoy drops before the callee's sidecar (for a callee: its callers' default)")
	fl.StringVar(&o.reason, "reason", "", "why, for the audit log (required)")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{"enforce", "shadow"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("fail-mode", cobra.FixedCompletions([]string{"open", "hold", "local"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("enforcement", cobra.FixedCompletions([]string{"sidecar", "upstream"}, cobra.ShellCompDirectiveNoFileComp))
}

// runSet checks the flags both forms of set share, then the form's own:
// every problem of the command line is reported at once.
func (a *app) runSet(cmd *cobra.Command, st history.Store, arg string, o setOptions) error {
	t, err := parseTarget(arg, true)
	if err != nil {
		return err
	}
	changed := cmd.Flags().Changed
	var errs []error
	var m *dropratio.Mode // nil: keep, or inherit
	if changed("mode") {
		if m, err = parseFlag("mode", o.mode, dropratio.ParseMode); err != nil {
			errs = append(errs, err)
		}
	}
	var e *dataplane.Enforcement // nil: keep, or inherit
	if changed("enforcement") {
		if e, err = parseFlag("enforcement", o.enforcement, dataplane.ParseEnforcement); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.requireChange(o.reason); err != nil {
		errs = append(errs, err)
	}
	if t.Procedure != "" {
		for _, name := range []string{"mode", "enforcement"} {
			if changed(name) {
				errs = append(errs, fmt.Errorf("--%s: %s is enforced as its caller is; set it on callee/caller", name, t))
			}
		}
	}
	if t.Caller != "" {
		return a.runSetBucket(cmd, st, t, o, m, e, errs)
	}
	return a.runSetService(cmd, st, t, o, m, e, errs)
}

// runSetBucket is set callee/caller: errs are the problems found so far.
func (a *app) runSetBucket(cmd *cobra.Command, st history.Store, t target, o setOptions, m *dropratio.Mode, e *dataplane.Enforcement, errs []error) error {
	changed := cmd.Flags().Changed
	for _, name := range []string{"default-limit", "capacity", "fail-mode"} {
		if changed(name) {
			errs = append(errs, fmt.Errorf("--%s is a callee's setting: give %s alone, not %s", name, t.Callee, t))
		}
	}
	if !changed("limit") {
		errs = append(errs, fmt.Errorf("--limit is required for a bucket (e.g. set %s --limit 1000)", t))
	}
	l, ok, err := parseRate("limit", o.limit, true)
	if changed("limit") && err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return a.setBucket(cmd, st, t.Bucket, l, ok, m, e, o.reason)
}

// runSetService is set callee: errs are the problems found so far.
func (a *app) runSetService(cmd *cobra.Command, st history.Store, t target, o setOptions, m *dropratio.Mode, e *dataplane.Enforcement, errs []error) error {
	changed := cmd.Flags().Changed
	if changed("limit") {
		errs = append(errs, fmt.Errorf("--limit needs callee/caller; for all callers of %s without a limit of their own use --default-limit", t))
	}
	if !changed("default-limit") && !changed("capacity") && !changed("fail-mode") && !changed("mode") && !changed("enforcement") {
		errs = append(errs, fmt.Errorf("nothing to set for %s: give --default-limit, --capacity, --fail-mode, --mode or --enforcement", t))
	}
	var fm *dataplane.FailMode
	if changed("fail-mode") {
		var err error
		if fm, err = parseFlag("fail-mode", o.failMode, dataplane.ParseFailMode); err != nil {
			errs = append(errs, err)
		}
	}
	rate := func(flag, v string) *float64 {
		r, ok, err := parseRate(flag, v, true)
		if err != nil {
			errs = append(errs, err)
		}
		if !ok {
			return nil
		}
		return &r
	}
	var def, capa *float64
	if changed("default-limit") {
		def = rate("default-limit", o.defaultLimit)
	}
	if changed("capacity") {
		capa = rate("capacity", o.capacity)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Settings not given keep their value.
	return a.setService(cmd, st, t, o.reason, func(s *history.ServiceLimits) {
		if changed("default-limit") {
			s.DefaultLimit = def
		}
		if changed("capacity") {
			s.Capacity = capa
		}
		if changed("fail-mode") {
			s.FailMode = fm
		}
		if changed("mode") {
			s.Mode = m
		}
		if changed("enforcement") {
			s.Enforcement = e
		}
	})
}

// setService applies update to t's settings (to the defaults when the
// callee has none yet) and prints what the store then holds.
func (a *app) setService(cmd *cobra.Command, st history.Store, t target, reason string, update func(*history.ServiceLimits)) error {
	ctx := cmd.Context()
	lim, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	old, exists := newLimitIndex(lim).services[t.Callee]
	s := old
	if !exists {
		s = history.ServiceLimits{Callee: t.Callee, Mode: new(dropratio.Enforce), FailMode: new(dataplane.FailOpen)}
	}
	update(&s)
	if err := checkLoads(lim, func(l *history.Limits) {
		l.Services = slices.DeleteFunc(slices.Clone(l.Services), func(o history.ServiceLimits) bool { return o.Callee == s.Callee })
		l.Services = append(l.Services, s)
	}); err != nil {
		return fmt.Errorf("set %s: %w", t, err)
	}
	if err := st.SetService(ctx, s, a.change(reason)); err != nil {
		return fmt.Errorf("set %s: %w", t, err)
	}
	if lim, err = st.Limits(ctx); err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	s = newLimitIndex(lim).services[t.Callee]
	w := cmd.OutOrStdout()
	if !exists {
		fmt.Fprintf(w, "%s: %s\n", t, renderService(s))
	} else {
		fmt.Fprintf(w, "%s: %s\n  was %s\n", t, renderService(s), renderService(old))
	}
	return nil
}

func (a *app) setBucket(cmd *cobra.Command, st history.Store, b history.Bucket, limit float64, hasLimit bool, m *dropratio.Mode, e *dataplane.Enforcement, reason string) error {
	ctx := cmd.Context()
	lim, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	old, exists := newLimitIndex(lim).buckets[b]
	w := cmd.OutOrStdout()
	if err := checkLoads(lim, func(l *history.Limits) {
		l.Buckets = slices.DeleteFunc(slices.Clone(l.Buckets), func(o history.BucketLimit) bool { return o.Bucket == b })
		if hasLimit {
			nb := history.BucketLimit{Bucket: b, Limit: limit, Mode: m, Enforcement: e}
			if exists { // nil keeps the bucket's own, as the store does
				nb.Mode, nb.Enforcement = cmp.Or(m, old.Mode), cmp.Or(e, old.Enforcement)
			}
			l.Buckets = append(l.Buckets, nb)
		}
	}); err != nil {
		return fmt.Errorf("set limit of %s: %w", bucketString(b), err)
	}
	if !hasLimit {
		if err := st.DeleteLimit(ctx, b, a.change(reason)); errors.Is(err, history.ErrNotFound) {
			return fmt.Errorf("unknown bucket %s: it has no limit of its own to remove", bucketString(b))
		} else if err != nil {
			return fmt.Errorf("remove limit of %s: %w", bucketString(b), err)
		}
		fmt.Fprintf(w, "%s: limit removed (was %s)\n", bucketString(b), renderBucket(old))
		return nil
	}
	l := history.BucketLimit{Bucket: b, Limit: limit, Mode: m, Enforcement: e, Source: history.Manual}
	if err := st.SetLimit(ctx, l, a.change(reason)); err != nil {
		return fmt.Errorf("set limit of %s: %w", bucketString(b), err)
	}
	// Print what the store holds: a mode or enforcement not given is
	// resolved there.
	if lim, err = st.Limits(ctx); err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	l = newLimitIndex(lim).buckets[b]
	if exists {
		fmt.Fprintf(w, "%s: %s\n  was %s\n", bucketString(b), renderBucket(l), renderBucket(old))
	} else {
		fmt.Fprintf(w, "%s: %s (new)\n", bucketString(b), renderBucket(l))
	}
	return nil
}

func renderBucket(l history.BucketLimit) string {
	switch {
	case l.Caller == history.AnyCaller:
		return fmt.Sprintf("capacity %s rps, %s", formatRate(l.Limit), l.Source)
	case l.Procedure != "":
		return fmt.Sprintf("limit %s rps, %s", formatRate(l.Limit), l.Source)
	}
	return fmt.Sprintf("limit %s rps, %s, %s%s", formatRate(l.Limit), renderSetting(l.Mode), l.Source, renderUpstream(l.Enforcement))
}

// renderSetting: the setting's name; what the store returns is never nil.
func renderSetting[T fmt.Stringer](v *T) string {
	if v == nil {
		return ""
	}
	return (*v).String()
}

// renderUpstream says so when limits are enforced upstream; sidecar, the
// default, goes unsaid.
func renderUpstream(e *dataplane.Enforcement) string {
	if e != nil && *e == dataplane.EnforceUpstream {
		return ", enforced upstream"
	}
	return ""
}

func renderService(s history.ServiceLimits) string {
	opt := func(v *float64) string {
		if v == nil {
			return "none"
		}
		return formatRate(*v) + " rps"
	}
	return fmt.Sprintf("default limit %s, capacity %s, %s, fail mode %s%s", opt(s.DefaultLimit), opt(s.Capacity), renderSetting(s.Mode), renderSetting(s.FailMode), renderUpstream(s.Enforcement))
}

// modeCommand builds shadow or enforce.
func (a *app) modeCommand(m dropratio.Mode) *cobra.Command {
	var reason string
	what := map[dropratio.Mode]string{
		dropratio.Shadow:  "compute and report drops, but carry none out",
		dropratio.Enforce: "carry drops out",
	}[m]
	cmd := &cobra.Command{
		Use:   m.String() + " callee[/caller] --reason TEXT",
		Short: "switch limits to " + m.String() + " mode: " + what,
		Long: fmt.Sprintf(`Switches a bucket, or a callee and every bucket of it, to %s mode: %s.
The limits themselves do not change.`, m, what),
		Example: fmt.Sprintf(`  configurator %[1]s checkout/web --reason "new limit, watch it first"
  configurator %[1]s checkout --reason "incident 4711"`, m),
		Args: cobra.ExactArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			t, err := parseTarget(args[0], true)
			if err != nil {
				return err
			}
			if t.Procedure != "" {
				return fmt.Errorf("%s is enforced as its caller is: %s %s/CALLER", t, m, t.Callee)
			}
			if err := a.requireChange(reason); err != nil {
				return err
			}
			n, err := st.SetMode(cmd.Context(), t.filter(), m, a.change(reason))
			switch {
			case errors.Is(err, history.ErrNotFound):
				return fmt.Errorf("unknown bucket %s: it has no limit or settings to switch (set one first)", t)
			case errors.Is(err, history.ErrNoCallerLimit):
				// Switching its leaves' rows would change nothing: a
				// leaf is enforced as its caller is.
				return fmt.Errorf("%s has no limit of its own; its leaves are enforced as it is: set a limit on %s, or set the callee's mode (%s %s)", t, t, m, t.Callee)
			}
			if err != nil {
				return fmt.Errorf("switch %s to %s: %w", t, m, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (%s)\n", t, m, plural(n, "limit"))
			return nil
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	return cmd
}

// checkLoads refuses a change, change applied to a copy of lim, after
// which the controller could no longer load the limits (limits.FromHistory):
// it would keep the last limits it read, and ignore every later change
// until this one is undone; or after which it would load them but leave a
// row out that it did not before (a leaf of a procedure no route names):
// such a change does nothing but warn. Limits that did not load before are
// not this change's fault, and do not stop it.
func checkLoads(lim history.Limits, change func(*history.Limits)) error {
	before, err := limits.FromHistory(lim)
	if err != nil {
		return nil
	}
	after := lim
	change(&after)
	set, err := limits.FromHistory(after)
	if err != nil {
		return fmt.Errorf("refused: the controller could not load the limits after it: %w", err)
	}
	for _, w := range set.Warnings() {
		if !slices.Contains(before.Warnings(), w) {
			return fmt.Errorf("refused: the controller would leave a limit out after it: %s", w)
		}
	}
	return nil
}
