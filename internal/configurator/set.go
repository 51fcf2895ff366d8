package configurator

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// setOptions are set's flags, as given.
type setOptions struct {
	limit, mode, defaultLimit, capacity, failMode, enforcement, reason string
	// burst and payback go with a caller's limit (issue #17).
	burst, payback string

	// Tiers, cost and caps (issue #16): a bucket's settings other than
	// its limit (maxConcurrency, criticality, maxCriticality, cost), and
	// a callee's unit, cost block and tiers (unit, cost*, criticality,
	// maxCriticality, criticalityHeader).
	maxConcurrency, criticality, maxCriticality, cost                 string
	unit, costDefault, costMax, costRequestHeader, costResponseHeader string
	criticalityHeader                                                 string
	// A callee's objective (issue #18).
	sloLatencyP99, sloErrors string
}

// bucketSettingFlags are set's flags for a bucket's settings other than
// its limit; serviceCostFlags and serviceTierFlags a callee's.
var (
	bucketSettingFlags = []string{"max-concurrency", "criticality", "max-criticality", "cost"}
	serviceCostFlags   = []string{"cost-default", "cost-max", "cost-request-header", "cost-response-header"}
	serviceTierFlags   = []string{"criticality", "max-criticality", "criticality-header"}
	serviceSLOFlags    = []string{"slo-latency-p99", "slo-errors"}
)

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

Tiers, cost and caps (the limits file's criticality, unit: cost and
max_concurrency): on callee/caller, --criticality (its default tier),
--max-criticality (the highest it may claim) and --max-concurrency (requests in
flight, global); on callee/caller/procedure, --max-concurrency; on
callee/*/procedure, --criticality (the procedure's default tier) and --cost
(its static cost). "none" removes each; a bucket needs no limit to have them.
On a callee: --unit cost (its limits, capacities and rates are then cost units
per second; --unit requests undoes it) with --cost-default, --cost-max,
--cost-request-header and --cost-response-header; --criticality,
--max-criticality and --criticality-header declare its tiers (--criticality
none removes them). A tier needs the callee's tiers, a cost its unit cost.

An objective (the limits file's slo): on a callee, --slo-latency-p99 (its p99
over the fleet, e.g. 200ms) and --slo-errors (the share of answers that may
fail, "1%" or 0.01); the controller then estimates its capacity from its health,
and the smaller of that and --capacity holds. "none" removes each; not with
--unit cost.

Every change needs a --reason and is audited.`,
		Example: `  configurator set checkout/web --limit 1500 --reason "launch week"
  configurator set checkout/batch --limit 0 --mode shadow --reason "would block batch"
  configurator set checkout --capacity 5000 --fail-mode hold --reason "db capacity"
  configurator set checkout/app --limit 300 --enforcement upstream --reason "proxyless gRPC client"
  configurator set checkout/web/create-charge --limit 50 --reason "charges are expensive"
  configurator set checkout/*//shop.Checkout/Pay --limit 500 --reason "payment provider quota"
  configurator set llm --unit cost --cost-response-header x-sluice-cost --reason "count tokens"
  configurator set llm/chat --max-concurrency 40 --reason "GPU slots"
  configurator set ledger --criticality CRITICAL --reason "shed batch first"
  configurator set ledger/batch --criticality SHEDDABLE --reason "batch can wait"
  configurator set search --slo-latency-p99 200ms --slo-errors 1% --reason "capacity from health"`,
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
	fl.StringVar(&o.burst, "burst", "", "callee/caller with --limit: how far above its limit it may admit after a quiet period, in its unit; 0 (the default) is the tightest edge")
	fl.StringVar(&o.payback, "payback", "", "callee/caller with --limit: window over which it pays back what it admitted above its limit (e.g. 10s, at most 1h); 0 pays nothing back")
	fl.StringVar(&o.defaultLimit, "default-limit", "", `callee: limit of callers without one of their own, rps, or "none"`)
	fl.StringVar(&o.capacity, "capacity", "", `callee: rps all its callers share, or "none"`)
	fl.StringVar(&o.failMode, "fail-mode", "", "callee: what its sidecars do when their policy expires: open, hold or local")
	fl.StringVar(&o.enforcement, "enforcement", "", "sidecar, or upstream: a proxyless gRPC client or the callee's Envoy drops before the callee's sidecar (for a callee: its callers' default)")
	fl.StringVar(&o.reason, "reason", "", "why, for the audit log (required)")
	fl.StringVar(&o.maxConcurrency, "max-concurrency", "", `callee/caller or a leaf: cap on requests in flight, global, any unit; "none" removes it`)
	fl.StringVar(&o.criticality, "criticality", "", `default tier (CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE) of a caller, of a procedure (callee/*/procedure), or of a callee (declares its tiers); "none" removes it (on a callee: its tiers)`)
	fl.StringVar(&o.maxCriticality, "max-criticality", "", `highest tier a caller (or, on a callee, any caller) may claim; "none" removes it`)
	fl.StringVar(&o.cost, "cost", "", `callee/*/procedure: the procedure's static cost, in a callee with --unit cost; "none" removes it`)
	fl.StringVar(&o.unit, "unit", "", "callee: what its limits count: requests, or cost (cost units per second)")
	fl.StringVar(&o.costDefault, "cost-default", "", `callee with --unit cost: cost of a request nothing else prices (default 1), or "none"`)
	fl.StringVar(&o.costMax, "cost-max", "", `callee with --unit cost: a larger cost is clamped to it (default 1e6), or "none"`)
	fl.StringVar(&o.costRequestHeader, "cost-request-header", "", `callee with --unit cost: a request header the callee trusts to carry a cost, or "none"`)
	fl.StringVar(&o.costResponseHeader, "cost-response-header", "", `callee with --unit cost: the response header (or trailer) the app reports the real cost in, or "none"`)
	fl.StringVar(&o.criticalityHeader, "criticality-header", "", `callee: the header a request's tier is read from (default x-sluice-criticality); declares its tiers`)
	fl.StringVar(&o.sloLatencyP99, "slo-latency-p99", "", `callee: its objective's p99 latency over the fleet (e.g. 200ms), from which its capacity is estimated; "none" removes it`)
	fl.StringVar(&o.sloErrors, "slo-errors", "", `callee: its objective's share of answers that may fail ("1%" or 0.01); "none" removes it`)
	tiers := []string{"CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE", "none"}
	_ = cmd.RegisterFlagCompletionFunc("criticality", cobra.FixedCompletions(tiers, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("max-criticality", cobra.FixedCompletions(tiers, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("unit", cobra.FixedCompletions([]string{"requests", "cost"}, cobra.ShellCompDirectiveNoFileComp))
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
	for _, name := range append(append([]string{"default-limit", "capacity", "fail-mode", "unit", "criticality-header"}, serviceCostFlags...), serviceSLOFlags...) {
		if changed(name) {
			errs = append(errs, fmt.Errorf("--%s is a callee's setting: give %s alone, not %s", name, t.Callee, t))
		}
	}
	settings := slices.ContainsFunc(bucketSettingFlags, changed)
	if !changed("limit") && !settings {
		errs = append(errs, fmt.Errorf("--limit is required for a bucket (e.g. set %s --limit 1000)", t))
	}
	l, ok, err := parseRate("limit", o.limit, true)
	if changed("limit") && err != nil {
		errs = append(errs, err)
	}
	update, uerrs := bucketSettingsUpdate(changed, t, o)
	errs = append(errs, uerrs...)
	if settings && !changed("limit") {
		for _, name := range []string{"mode", "enforcement"} {
			if changed(name) && t.Procedure == "" {
				errs = append(errs, fmt.Errorf("--%s is a limit's: give --limit too", name))
			}
		}
	}
	var lb limitBurst
	for _, name := range []string{"burst", "payback"} {
		switch {
		case !changed(name):
		case !changed("limit") || !ok:
			errs = append(errs, fmt.Errorf("--%s goes with a caller's limit: give --limit too", name))
		case t.Procedure != "" || settings:
			errs = append(errs, fmt.Errorf("--%s is a caller's limit's: give callee/caller and --limit alone", name))
		}
	}
	if changed("burst") {
		v, _, err := parseRate("burst", o.burst, false)
		if err != nil {
			errs = append(errs, err)
		}
		lb.burst = &v
	}
	if changed("payback") {
		d, err := limits.ParsePayback(o.payback)
		if err != nil {
			errs = append(errs, fmt.Errorf("--payback %q: %w", o.payback, err))
		}
		lb.payback = &d
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !settings {
		return a.setBucket(cmd, st, t.Bucket, l, ok, m, e, o.reason, lb)
	}
	return a.setBucketSettings(cmd, st, t.Bucket, update, changed("limit"), l, ok, m, e, o.reason)
}

// bucketSettingsUpdate checks set's flags for t's settings other than its
// limit: what each shape of bucket may set, each value's form. It returns
// what applies them to the bucket's settings.
func bucketSettingsUpdate(changed func(string) bool, t target, o setOptions) (func(*history.BucketSettings), []error) {
	var errs []error
	shape := func(flag, why string) {
		if changed(flag) {
			errs = append(errs, fmt.Errorf("--%s: %s", flag, why))
		}
	}
	switch {
	case t.Caller == history.AnyCaller:
		shape("max-concurrency", fmt.Sprintf("%s is a procedure: a cap on requests in flight is a caller's (%s/CALLER) or a leaf's (%s/CALLER/%s)", t, t.Callee, t.Callee, t.Procedure))
		shape("max-criticality", fmt.Sprintf("%s is a procedure: the highest tier a caller may claim is set on %s/CALLER", t, t.Callee))
	case t.Procedure != "":
		shape("criticality", fmt.Sprintf("%s is a leaf: tiers default per caller (%s/%s) or per procedure (%s/%s/%s)", t, t.Callee, t.Caller, t.Callee, history.AnyCaller, t.Procedure))
		shape("max-criticality", fmt.Sprintf("%s is a leaf: set it on %s/%s", t, t.Callee, t.Caller))
		shape("cost", fmt.Sprintf("%s is a leaf: a static cost is a procedure's (%s/%s/%s)", t, t.Callee, history.AnyCaller, t.Procedure))
	default:
		shape("cost", fmt.Sprintf("a static cost is a procedure's: give %s/%s/PROCEDURE", t.Callee, history.AnyCaller))
	}
	var mc uint32
	if changed("max-concurrency") {
		var err error
		if mc, err = parseMaxConcurrency(o.maxConcurrency); err != nil {
			errs = append(errs, err)
		}
	}
	crit, maxCrit := tierFlag(changed, "criticality", o.criticality, &errs), tierFlag(changed, "max-criticality", o.maxCriticality, &errs)
	var cost *float64
	if changed("cost") {
		v, ok, err := parseRate("cost", o.cost, true)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			cost = &v
		}
	}
	return func(s *history.BucketSettings) {
		if changed("max-concurrency") {
			s.MaxConcurrency = mc
		}
		if changed("criticality") {
			s.Criticality = crit
		}
		if changed("max-criticality") {
			s.MaxCriticality = maxCrit
		}
		if changed("cost") {
			s.Cost = cost
		}
	}, errs
}

// parseMaxConcurrency reads --max-concurrency: "none" (0), or an integer
// from 1 to 2^32-1.
func parseMaxConcurrency(s string) (uint32, error) {
	if s == "none" {
		return 0, nil
	}
	v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("--max-concurrency %q is not an integer from 1 to %d, or none", s, uint32(math.MaxUint32))
	}
	return uint32(v), nil
}

// tierFlag reads a tier flag, if given: "none" is criticality.None.
func tierFlag(changed func(string) bool, flag, s string, errs *[]error) criticality.Tier {
	if !changed(flag) || s == "none" {
		return criticality.None
	}
	t, err := parseFlag(flag, s, criticality.ParseConfig)
	if err != nil {
		*errs = append(*errs, err)
		return criticality.None
	}
	return *t
}

// setBucketSettings applies update to b's settings, and sets its limit
// too when limitGiven: both are checked to load first, then written, the
// limit first. It prints what the store then holds.
func (a *app) setBucketSettings(cmd *cobra.Command, st history.Store, b history.Bucket, update func(*history.BucketSettings), limitGiven bool, limit float64, hasLimit bool, m *dropratio.Mode, e *dataplane.Enforcement, reason string) error {
	ctx := cmd.Context()
	lim, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("read limits: %w", err)
	}
	old := history.BucketSettings{Bucket: b}
	if i := slices.IndexFunc(lim.Settings, func(s history.BucketSettings) bool { return s.Bucket == b }); i >= 0 {
		old = lim.Settings[i]
	}
	s := old
	update(&s)
	idx := newLimitIndex(lim)
	svc := idx.services[b.Callee]
	if (s.Criticality != criticality.None && s.Criticality != old.Criticality || s.MaxCriticality != criticality.None && s.MaxCriticality != old.MaxCriticality) && svc.Criticality == nil {
		return fmt.Errorf("--criticality: %s declares no tiers: declare them first (set %s --criticality CRITICAL)", b.Callee, b.Callee)
	}
	if s.Cost != nil && svc.Cost == nil {
		return fmt.Errorf("--cost: %s counts requests: set %s --unit cost first", b.Callee, b.Callee)
	}
	if s.Cost != nil {
		if m := *cmp.Or(svc.Cost.Max, new(limits.DefaultMaxCost)); *s.Cost > m {
			return fmt.Errorf("--cost: %s is above %s's cost max %s (--cost-max)", formatRate(*s.Cost), b.Callee, formatRate(m))
		}
	}
	oldLimit, exists := idx.buckets[b]
	if err := checkLoads(lim, func(l *history.Limits) {
		l.Settings = slices.DeleteFunc(slices.Clone(l.Settings), func(o history.BucketSettings) bool { return o.Bucket == b })
		if !s.IsZero() {
			l.Settings = append(l.Settings, s)
		}
		if !limitGiven {
			return
		}
		l.Buckets = slices.DeleteFunc(slices.Clone(l.Buckets), func(o history.BucketLimit) bool { return o.Bucket == b })
		if hasLimit {
			nb := history.BucketLimit{Bucket: b, Limit: limit, Mode: m, Enforcement: e}
			if exists {
				nb.Mode, nb.Enforcement = cmp.Or(m, oldLimit.Mode), cmp.Or(e, oldLimit.Enforcement)
			}
			l.Buckets = append(l.Buckets, nb)
		}
	}); err != nil {
		return fmt.Errorf("set %s: %w", bucketString(b), err)
	}
	if limitGiven {
		if err := a.setBucket(cmd, st, b, limit, hasLimit, m, e, reason, limitBurst{}); err != nil {
			return err
		}
	}
	if err := st.SetSettings(ctx, s, a.change(reason)); err != nil {
		return fmt.Errorf("set %s: %w", bucketString(b), err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n  was %s\n", bucketString(b), renderBucketSettings(s), renderBucketSettings(old))
	return nil
}

// renderBucketSettings: "criticality SHEDDABLE, max concurrency 40", or
// "no tier, cost or cap of its own".
func renderBucketSettings(s history.BucketSettings) string {
	var parts []string
	if s.Criticality != criticality.None {
		parts = append(parts, "criticality "+s.Criticality.String())
	}
	if s.MaxCriticality != criticality.None {
		parts = append(parts, "max criticality "+s.MaxCriticality.String())
	}
	if s.MaxConcurrency != 0 {
		parts = append(parts, fmt.Sprintf("max concurrency %d", s.MaxConcurrency))
	}
	if s.Cost != nil {
		parts = append(parts, "cost "+formatRate(*s.Cost))
	}
	if len(parts) == 0 {
		return "no tier, cost or cap of its own"
	}
	return strings.Join(parts, ", ")
}

// runSetService is set callee: errs are the problems found so far.
func (a *app) runSetService(cmd *cobra.Command, st history.Store, t target, o setOptions, m *dropratio.Mode, e *dataplane.Enforcement, errs []error) error {
	changed := cmd.Flags().Changed
	if changed("limit") {
		errs = append(errs, fmt.Errorf("--limit needs callee/caller; for all callers of %s without a limit of their own use --default-limit", t))
	}
	serviceFlags := slices.Concat([]string{"default-limit", "capacity", "fail-mode", "mode", "enforcement", "unit"}, serviceCostFlags, serviceTierFlags, serviceSLOFlags)
	if !slices.ContainsFunc(serviceFlags, changed) {
		errs = append(errs, fmt.Errorf("nothing to set for %s: give --default-limit, --capacity, --fail-mode, --mode, --enforcement, --unit, --cost-…, --criticality… or --slo-…", t))
	}
	if changed("max-concurrency") {
		errs = append(errs, fmt.Errorf("--max-concurrency is a caller's or a leaf's: give %s/CALLER", t))
	}
	if changed("cost") {
		errs = append(errs, fmt.Errorf("--cost is a procedure's static cost: give %s/%s/PROCEDURE; a callee's default is --cost-default", t, history.AnyCaller))
	}
	tiersUpdate := serviceTiersUpdate(changed, o, &errs)
	sloUpdate := serviceSLOUpdate(changed, o, &errs)
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
	var unit string
	if changed("unit") {
		switch o.unit {
		case "requests", "cost":
			unit = o.unit
		default:
			errs = append(errs, fmt.Errorf("--unit %q is not requests or cost", o.unit))
		}
	}
	var costDef, costMax *float64
	if changed("cost-default") {
		costDef = rate("cost-default", o.costDefault)
	}
	if changed("cost-max") {
		if costMax = rate("cost-max", o.costMax); costMax != nil && *costMax == 0 {
			errs = append(errs, errors.New("--cost-max 0: want a cost > 0 (or none: 1e6)"))
		}
	}
	reqHeader := headerFlag(changed, "cost-request-header", o.costRequestHeader, &errs)
	respHeader := headerFlag(changed, "cost-response-header", o.costResponseHeader, &errs)
	if unit == "requests" {
		for _, f := range serviceCostFlags {
			if changed(f) {
				errs = append(errs, fmt.Errorf("--%s prices requests in cost units: it needs --unit cost, not requests", f))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	costUpdate := func(s *history.ServiceLimits) error {
		switch unit {
		case "requests":
			s.Cost = nil
		case "cost":
			if s.Cost == nil {
				s.Cost = &history.CostSettings{}
			}
		}
		if !slices.ContainsFunc(serviceCostFlags, changed) {
			return nil
		}
		if s.Cost == nil {
			return fmt.Errorf("--%s: %s counts requests: give --unit cost too", serviceCostFlags[slices.IndexFunc(serviceCostFlags, changed)], t)
		}
		c := *s.Cost
		if changed("cost-default") {
			c.Default = costDef
		}
		if changed("cost-max") {
			c.Max = costMax
		}
		if changed("cost-request-header") {
			c.RequestHeader = reqHeader
		}
		if changed("cost-response-header") {
			c.ResponseHeader = respHeader
		}
		d, m := limits.DefaultCost, limits.DefaultMaxCost
		if c.Default != nil {
			d = *c.Default
		}
		if c.Max != nil {
			m = *c.Max
		}
		if d > m {
			return fmt.Errorf("--cost-default: %s is above the cost's max %s", formatRate(d), formatRate(m))
		}
		s.Cost = &c
		return nil
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
	}, func(s *history.ServiceLimits) error {
		if err := costUpdate(s); err != nil {
			return err
		}
		tiersUpdate(s)
		sloUpdate(s)
		return nil
	})
}

// serviceSLOUpdate checks set's objective flags for a callee and returns
// what applies them: each sets its half of the objective, "none" unsets
// it, and an objective with neither half set is none.
func serviceSLOUpdate(changed func(string) bool, o setOptions, errs *[]error) func(*history.ServiceLimits) {
	var lat time.Duration
	if changed("slo-latency-p99") && o.sloLatencyP99 != "none" {
		d, err := duration.Parse(o.sloLatencyP99)
		switch {
		case err != nil || d <= 0:
			*errs = append(*errs, fmt.Errorf(`--slo-latency-p99 %q: want a positive duration (200ms) or "none"`, o.sloLatencyP99))
		case d > history.MaxObjectiveLatency:
			*errs = append(*errs, fmt.Errorf("--slo-latency-p99 %q: at most %v", o.sloLatencyP99, history.MaxObjectiveLatency))
		}
		lat = d
	}
	var ratio float64
	if changed("slo-errors") && o.sloErrors != "none" {
		r, err := limits.ParseRatio(o.sloErrors)
		if err != nil {
			*errs = append(*errs, fmt.Errorf(`--slo-errors: %v, or "none"`, err))
		}
		ratio = r
	}
	return func(s *history.ServiceLimits) {
		if !slices.ContainsFunc(serviceSLOFlags, changed) {
			return
		}
		var obj history.ObjectiveSettings
		if s.SLO != nil {
			obj = *s.SLO
		}
		if changed("slo-latency-p99") {
			obj.LatencyP99 = lat
		}
		if changed("slo-errors") {
			obj.Errors = ratio
		}
		s.SLO = nil
		if obj != (history.ObjectiveSettings{}) {
			s.SLO = &obj
		}
	}
}

// serviceTiersUpdate checks set's tier flags for a callee and returns what
// applies them: any of them declares its tiers, --criticality none
// removes them.
func serviceTiersUpdate(changed func(string) bool, o setOptions, errs *[]error) func(*history.ServiceLimits) {
	remove := changed("criticality") && o.criticality == "none"
	if remove {
		for _, f := range []string{"max-criticality", "criticality-header"} {
			if changed(f) {
				*errs = append(*errs, fmt.Errorf("--%s: --criticality none removes the callee's tiers", f))
			}
		}
	}
	if changed("max-criticality") && o.maxCriticality == "none" {
		*errs = append(*errs, errors.New(`--max-criticality none: a callee with tiers has a maximum (default CRITICAL); to remove its tiers give --criticality none`))
	}
	crit, maxCrit := tierFlag(changed, "criticality", o.criticality, errs), tierFlag(changed, "max-criticality", o.maxCriticality, errs)
	header := headerFlag(changed, "criticality-header", o.criticalityHeader, errs)
	return func(s *history.ServiceLimits) {
		if remove {
			s.Criticality = nil
			return
		}
		if !slices.ContainsFunc(serviceTierFlags, changed) {
			return
		}
		c := history.CriticalitySettings{}
		if s.Criticality != nil {
			c = *s.Criticality
		}
		if changed("criticality") {
			c.Default = crit
		}
		if changed("max-criticality") {
			c.Max = maxCrit
		}
		if changed("criticality-header") {
			c.Header = header
		}
		s.Criticality = &c
	}
}

// headerFlag reads a header name flag, if given: "none" is "", else a
// header name as the limits file takes it, lower-cased.
func headerFlag(changed func(string) bool, flag, s string, errs *[]error) string {
	if !changed(flag) || s == "none" {
		return ""
	}
	src, err := descriptor.ParseSource("header " + s) // of kind Header, or an error
	if err != nil {
		*errs = append(*errs, fmt.Errorf("--%s: %w", flag, err))
		return ""
	}
	return src.Header
}

// setService applies update to t's settings (to the defaults when the
// callee has none yet) and prints what the store then holds.
//
// check, when given, applies what may be refused by the settings in
// force (a cost needs the callee's unit cost): its error names the flag.
func (a *app) setService(cmd *cobra.Command, st history.Store, t target, reason string, update func(*history.ServiceLimits), check ...func(*history.ServiceLimits) error) error {
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
	for _, c := range check {
		if err := c(&s); err != nil {
			return err
		}
	}
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

// limitBurst is set's --burst and --payback: nil keeps the bucket's own.
type limitBurst struct {
	burst   *float64
	payback *time.Duration
}

func (a *app) setBucket(cmd *cobra.Command, st history.Store, b history.Bucket, limit float64, hasLimit bool, m *dropratio.Mode, e *dataplane.Enforcement, reason string, lb limitBurst) error {
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
			nb := history.BucketLimit{Bucket: b, Limit: limit, Mode: m, Enforcement: e, Burst: lb.burst, Payback: lb.payback}
			if exists { // nil keeps the bucket's own, as the store does
				nb.Mode, nb.Enforcement = cmp.Or(m, old.Mode), cmp.Or(e, old.Enforcement)
				nb.Burst, nb.Payback = cmp.Or(lb.burst, old.Burst), cmp.Or(lb.payback, old.Payback)
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
	l := history.BucketLimit{Bucket: b, Limit: limit, Mode: m, Enforcement: e, Burst: lb.burst, Payback: lb.payback, Source: history.Manual}
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
	out := fmt.Sprintf("default limit %s, capacity %s, %s, fail mode %s%s", opt(s.DefaultLimit), opt(s.Capacity), renderSetting(s.Mode), renderSetting(s.FailMode), renderUpstream(s.Enforcement))
	// A callee counting requests without tiers reads as before they existed.
	if s.Cost != nil {
		out = strings.Replace(out, " rps", " units/s", -1)
	}
	out += s.RenderDeclarations(func(v *float64, def float64) string { return formatRate(*cmp.Or(v, &def)) })
	return out
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
		// Other warnings (a default tier above the maximum) are legal
		// limits the file would load too.
		if strings.Contains(w, ": left out: ") && !slices.Contains(before.Warnings(), w) {
			return fmt.Errorf("refused: the controller would leave a limit out after it: %s", w)
		}
	}
	return nil
}
