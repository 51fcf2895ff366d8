package limits

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// FromHistory turns the store's limits into a Set. A setting the store left
// empty (nil) is inherited: a bucket's from its callee, a callee's is the
// default. A value its type does not know (a LimitStore is an interface;
// history's own stores refuse such values) is an error naming the service
// or bucket and the field, never a silent default: an unknown fail mode must
// not become open.
//
// A callee's routes and its limits with a procedure (history.Limits)
// declare its procedures by the limits file's rules (procedures): they are
// checked here again, each problem naming its row.
//
// A callee's objective (history.ServiceLimits.SLO) is its slo; a
// procedure's own objective comes from the limits file only.
//
// A callee's cost block and tiers (history.ServiceLimits) and the
// settings of its buckets (history.Limits.Settings: callers' tiers and
// caps, leaves' caps, procedures' default tiers and static costs) make
// the Unit, Cost, Criticality and caps the limits file would, by its
// rules (a tier needs the callee's tiers, a cost its unit: cost, upstream
// enforcement neither), each problem naming its row.
//
// The store holds no descriptor limits (issue #15): a Set read from it has
// none, and a controller on --database-url publishes none. Descriptors
// come from the limits file only, which excludes the store.
func FromHistory(l history.Limits) (*Set, error) {
	services := map[string]*Service{}
	get := func(callee string) *Service {
		s := services[callee]
		if s == nil {
			s = &Service{
				Name: callee, Capacity: math.Inf(1), DefaultLimit: math.Inf(1),
				Mode: dropratio.Enforce, FailMode: dataplane.FailOpen, Callers: map[string]Bucket{},
			}
			services[callee] = s
		}
		return s
	}
	var (
		errs  []error
		warns []string
	)
	for _, sl := range l.Services {
		s := get(sl.Callee)
		if sl.Capacity != nil {
			s.Capacity = *sl.Capacity
		}
		if sl.DefaultLimit != nil {
			s.DefaultLimit = *sl.DefaultLimit
		}
		path := "service " + sl.Callee
		s.Mode = stored(path+": mode", sl.Mode, dropratio.Enforce, &errs)
		s.FailMode = stored(path+": fail_mode", sl.FailMode, dataplane.FailOpen, &errs)
		s.Enforcement = stored(path+": enforcement", sl.Enforcement, dataplane.EnforceSidecar, &errs)
		storedCost(s, sl.Cost, path, &errs)
		storedCriticality(s, sl.Criticality, path, &errs, &warns)
		storedSLO(s, sl.SLO, path, &errs)
	}
	var leaves []history.BucketLimit
	for _, b := range l.Buckets {
		s := get(b.Callee)
		if b.Procedure != "" {
			leaves = append(leaves, b) // once every caller's mode is known
			continue
		}
		path := "limit " + b.Path()
		s.Callers[b.Caller] = Bucket{
			Limit:       b.Limit,
			Mode:        stored(path+": mode", b.Mode, s.Mode, &errs),
			Enforcement: stored(path+": enforcement", b.Enforcement, s.callerEnforcement(b.Caller), &errs),
			Burst:       storedBurst(b.Burst),
			Payback:     storedPayback(b.Payback),
		}
	}
	storedProcedures(l.Routes, leaves, l.Settings, get, &errs, &warns)
	for _, b := range l.Buckets { // once every callee's procedures are known
		if storedBurst(b.Burst) == 0 && storedPayback(b.Payback) == 0 {
			continue
		}
		if err := checkStoredBurst(b); err != nil {
			errs = append(errs, fmt.Errorf("limit %s: %w", b.Path(), err))
		} else if b.Procedure != "" || get(b.Callee).HasProcedures() {
			errs = append(errs, fmt.Errorf("limit %s: burst, payback: %w", b.Path(), errBurstProcedures))
		}
	}
	storedSettings(l.Settings, get, &errs, &warns)
	for _, name := range slices.Sorted(maps.Keys(services)) {
		storedUpstream(services[name], &errs)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid limits: %w", errors.Join(errs...))
	}
	set := NewSet(services)
	set.warnings = warns
	return set, nil
}

// storedProcedures fills the Routes, Declared and Procedures of the
// services get returns from the store's routes and its limits with a
// procedure (leaves: a leaf's limit, or with caller history.AnyCaller a
// procedure's capacity), by the limits file's rules: Declared is the
// procedures the routes name, in order of first mention, then the other
// procedures, sorted, each a gRPC full method; names.Other is never
// declared, and has limits only beside a declared procedure; at most
// routes.MaxRoutes; and enforcement upstream is refused on a callee that
// routes HTTP requests to procedures (upstreamRefused). A leaf's own mode
// and enforcement are not used: it is enforced as its caller is.
//
// Settings with a procedure (a leaf's cap, a procedure's tier or cost)
// declare it as its limits do.
func storedProcedures(rs []history.ServiceRoutes, leaves []history.BucketLimit, settings []history.BucketSettings, get func(string) *Service, errs *[]error, warns *[]string) {
	touched := map[*Service]bool{}
	named := map[*Service]map[string]bool{}
	for _, sr := range rs {
		s := get(sr.Callee)
		compiled, err := routes.CompileRoutes(sr.Routes)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("routes of %s: %w", sr.Callee, err))
			continue
		}
		s.Routes = slices.Clone(sr.Routes)
		s.Declared = compiled.Procedures() // in order of first mention
		named[s] = map[string]bool{}
		for _, p := range s.Declared {
			named[s][p] = true
		}
		touched[s] = true
	}
	extra := map[*Service][]string{}
	// procedure returns the limits of b's procedure, made when b declares
	// it, nil when b is left out.
	procedure := func(b history.BucketLimit, path string) *Procedure {
		s := get(b.Callee)
		if err := checkLeaf(b); err != nil {
			*errs = append(*errs, fmt.Errorf("%s: %w", path, err))
			return nil
		}
		p := s.Procedures[b.Procedure]
		if p == nil {
			orphan := b.Procedure != names.Other && !named[s][b.Procedure] && !routes.IsGRPCMethod(b.Procedure)
			if orphan {
				// Legal to reach (history outlives routes: an approved
				// proposal, a route renamed since), so it costs its own
				// row, never every service's limits.
				*warns = append(*warns, fmt.Sprintf("%s: left out: no route of %s names %s and it is not a gRPC full method (/pkg.Service/Method), so no request could be it", path, b.Callee, b.Procedure))
				return nil
			}
			if s.Procedures == nil {
				s.Procedures = map[string]*Procedure{}
			}
			p = &Procedure{Capacity: math.Inf(1), Callers: map[string]float64{}}
			s.Procedures[b.Procedure] = p
			if b.Procedure != names.Other && !named[s][b.Procedure] {
				extra[s] = append(extra[s], b.Procedure)
			}
		}
		touched[s] = true
		return p
	}
	for _, b := range leaves {
		p := procedure(b, "limit "+b.Path())
		switch {
		case p == nil:
		case b.Caller == history.AnyCaller:
			p.Capacity = b.Limit
		default:
			p.Callers[b.Caller] = b.Limit
		}
	}
	for _, st := range settings {
		if st.Procedure != "" {
			procedure(history.BucketLimit{Bucket: st.Bucket}, "settings "+st.Path())
		}
	}
	for _, s := range slices.SortedFunc(maps.Keys(touched), func(a, b *Service) int { return strings.Compare(a.Name, b.Name) }) {
		slices.Sort(extra[s])
		s.Declared = append(s.Declared, extra[s]...)
		checkDeclared(s, errs, warns)
	}
}

// storedCost makes s count cost when the store says so (c), priced as
// the limits file's cost block would.
func storedCost(s *Service, c *history.CostSettings, path string, errs *[]error) {
	if c == nil {
		return
	}
	s.Unit = UnitCost
	cost := &Cost{Default: DefaultCost, Max: DefaultMaxCost}
	if c.Max != nil {
		if v := *c.Max; !(v > 0) || math.IsInf(v, 1) {
			*errs = append(*errs, fmt.Errorf("%s: cost.max: %v is not a finite cost > 0", path, v))
		} else {
			cost.Max = v
		}
	}
	if c.Default != nil {
		cost.Default = storedCostValue(path+": cost.default", *c.Default, cost.Max, errs)
	}
	cost.RequestHeader = storedHeader(path+": cost.request_header", c.RequestHeader, errs)
	cost.ResponseHeader = storedHeader(path+": cost.response_header", c.ResponseHeader, errs)
	s.Cost = cost
}

// storedCostValue checks a stored cost as costValue does a file's.
func storedCostValue(path string, v, maxCost float64, errs *[]error) float64 {
	b := &builder{}
	v = b.costValue(path, v, maxCost)
	*errs = append(*errs, b.errs...)
	return v
}

// storedHeader checks a stored header name ("" none) as the file's
// sources are: it must be one a file could give, lower-cased.
func storedHeader(path, h string, errs *[]error) string {
	if h == "" {
		return ""
	}
	b := &builder{}
	got := b.headerName(path, "header "+h)
	if len(b.errs) == 0 && got != h {
		b.errs = append(b.errs, fmt.Errorf("%s: %q is not lower case", path, h))
	}
	*errs = append(*errs, b.errs...)
	return got
}

// storedCriticality declares s's tiers when the store says so (c), as the
// limits file's criticality block would.
func storedCriticality(s *Service, c *history.CriticalitySettings, path string, errs *[]error, warns *[]string) {
	if c == nil {
		return
	}
	crit := &Criticality{Header: criticality.DefaultHeader, Default: criticality.Critical, Max: criticality.Critical}
	if c.Header != "" {
		crit.Header = storedHeader(path+": criticality.header", c.Header, errs)
	}
	crit.Default = storedTier(path+": criticality.default", c.Default, criticality.Critical, errs)
	crit.Max = storedTier(path+": criticality.max", c.Max, criticality.Critical, errs)
	if crit.Default < crit.Max {
		*warns = append(*warns, fmt.Sprintf("%s: criticality.default: %v is above max %v, so a request that claims no tier outranks one that claims it", path, crit.Default, crit.Max))
	}
	s.Criticality = crit
}

// storedSLO gives s the objective the store holds (o), as the limits
// file's slo block would, checked as the file's is.
func storedSLO(s *Service, o *history.ObjectiveSettings, path string, errs *[]error) {
	if o == nil {
		return
	}
	obj := adaptive.Objective{LatencyP99: o.LatencyP99, Errors: o.Errors}
	if err := obj.Validate(); err != nil {
		*errs = append(*errs, fmt.Errorf("%s: slo: %w", path, err))
		return
	}
	if s.Counted() {
		*errs = append(*errs, fmt.Errorf("%s: slo: not with unit: cost (the estimate is in requests)", path))
		return
	}
	s.SLO = obj
}

// storedTier is t, def when t is None; a tier its type does not know is
// an error.
func storedTier(path string, t, def criticality.Tier, errs *[]error) criticality.Tier {
	if !t.Valid() {
		*errs = append(*errs, fmt.Errorf("%s: %v is not a tier", path, t))
		return def
	}
	return orTier(t, def)
}

// storedSettings applies the store's bucket settings to the services get
// returns, whose callers and procedures must be built: callers' tiers and
// caps, leaves' caps, procedures' default tiers and static costs. A tier
// needs the callee's tiers, a cost its unit: cost, and a cap sidecar
// enforcement, as in the limits file.
func storedSettings(settings []history.BucketSettings, get func(string) *Service, errs *[]error, warns *[]string) {
	for _, st := range settings {
		s, path := get(st.Callee), "settings "+st.Path()
		needTiers := func(field string) bool {
			if !s.Tiered() {
				*errs = append(*errs, fmt.Errorf("%s: %s: needs the criticality of %s (the service declares no tiers)", path, field, st.Callee))
			}
			return s.Tiered()
		}
		switch {
		case st.Procedure == "":
			if err := names.Check(st.Caller); err != nil {
				*errs = append(*errs, fmt.Errorf("%s: caller: %w", path, err))
				continue
			}
			if st.MaxConcurrency > 0 {
				b := s.Bucket(st.Caller)
				b.MaxConcurrency = st.MaxConcurrency
				if b.Enforcement == dataplane.EnforceUpstream {
					*errs = append(*errs, fmt.Errorf("%s: max_concurrency: %w", path, errUpstreamConcurrency))
				}
				s.Callers[st.Caller] = b
			}
			if st.Criticality == criticality.None && st.MaxCriticality == criticality.None {
				continue
			}
			if !needTiers("criticality") {
				continue
			}
			ct := CallerTier{
				Default: storedTier(path+": criticality", st.Criticality, criticality.None, errs),
				Max:     storedTier(path+": max_criticality", st.MaxCriticality, criticality.None, errs),
			}
			if max := orTier(ct.Max, s.Criticality.Max); ct.Default != criticality.None && ct.Default < max {
				*warns = append(*warns, fmt.Sprintf("%s: criticality: %v is above the caller's max %v, so its requests that claim no tier outrank those that claim it", path, ct.Default, max))
			}
			if s.Criticality.Callers == nil {
				s.Criticality.Callers = map[string]CallerTier{}
			}
			s.Criticality.Callers[st.Caller] = ct
		default:
			p := s.Procedures[st.Procedure]
			if p == nil {
				continue // left out by storedProcedures, which said why
			}
			if st.Caller != history.AnyCaller {
				if st.MaxConcurrency > 0 {
					if p.MaxConcurrency == nil {
						p.MaxConcurrency = map[string]uint32{}
					}
					p.MaxConcurrency[st.Caller] = st.MaxConcurrency
					if s.Bucket(st.Caller).Enforcement == dataplane.EnforceUpstream {
						*errs = append(*errs, fmt.Errorf("%s: max_concurrency: %w", path, errUpstreamConcurrency))
					}
				}
				continue
			}
			if st.Criticality != criticality.None && needTiers("criticality") {
				if s.Criticality.Procedures == nil {
					s.Criticality.Procedures = map[string]criticality.Tier{}
				}
				s.Criticality.Procedures[st.Procedure] = storedTier(path+": criticality", st.Criticality, criticality.None, errs)
			}
			if st.Cost != nil {
				if !s.Counted() {
					*errs = append(*errs, fmt.Errorf("%s: cost: needs unit cost on %s (the service counts requests)", path, st.Callee))
					continue
				}
				if s.Cost.Procedures == nil {
					s.Cost.Procedures = map[string]float64{}
				}
				s.Cost.Procedures[st.Procedure] = storedCostValue(path+": cost", *st.Cost, s.Cost.Max, errs)
			}
		}
	}
}

// storedUpstream refuses upstream enforcement of a service with tiers or
// counting cost, as the limits file does (a service with procedures is
// checkDeclared's).
func storedUpstream(s *Service, errs *[]error) {
	if upstreamRefused(s) {
		return
	}
	upErr := upstreamErr(s)
	if upErr == nil {
		return
	}
	if s.Enforcement == dataplane.EnforceUpstream {
		*errs = append(*errs, fmt.Errorf("service %s: enforcement: %w", s.Name, upErr))
	}
	for _, c := range slices.Sorted(maps.Keys(s.Callers)) {
		if s.Callers[c].Enforcement == dataplane.EnforceUpstream {
			*errs = append(*errs, fmt.Errorf("limit %s/%s: enforcement: %w", s.Name, c, upErr))
		}
	}
}

// checkLeaf checks what the store should have: a valid procedure, and a
// valid caller or history.AnyCaller.
func checkLeaf(b history.BucketLimit) error {
	if err := names.CheckProcedure(b.Procedure); err != nil {
		return fmt.Errorf("procedure: %w", err)
	}
	if b.Caller != history.AnyCaller {
		if err := names.Check(b.Caller); err != nil {
			return fmt.Errorf("caller: %w", err)
		}
	}
	if math.IsNaN(b.Limit) || math.IsInf(b.Limit, 0) || b.Limit < 0 {
		return fmt.Errorf("limit: %v is not a finite rate >= 0", b.Limit)
	}
	return nil
}

// checkDeclared finishes a service whose routes or limits name
// procedures: each declared procedure has its Procedures entry, and the
// service keeps within the bounds on what it declares.
func checkDeclared(s *Service, errs *[]error, warns *[]string) {
	_, other := s.Procedures[names.Other]
	switch {
	case len(s.Declared) == 0 && other:
		// As an orphan leaf: reachable when routes went and history
		// stayed, so it costs its own rows.
		*warns = append(*warns, fmt.Sprintf("limits of %s on %s: left out: %s declares no procedure, so every request is its caller's whole bucket", s.Name, names.Other, s.Name))
		s.Procedures = nil
		return
	case len(s.Declared) > routes.MaxRoutes:
		*errs = append(*errs, fmt.Errorf("service %s: %d procedures declared, at most %d (routes.MaxRoutes)", s.Name, len(s.Declared), routes.MaxRoutes))
		return
	case len(s.Declared) == 0:
		return
	}
	if upstreamRefused(s) {
		if s.Enforcement == dataplane.EnforceUpstream {
			*errs = append(*errs, fmt.Errorf("service %s: enforcement: %w", s.Name, errUpstream))
		}
		for _, c := range slices.Sorted(maps.Keys(s.Callers)) {
			if s.Callers[c].Enforcement == dataplane.EnforceUpstream {
				*errs = append(*errs, fmt.Errorf("limit %s/%s: enforcement: %w", s.Name, c, errUpstream))
			}
		}
	}
	if s.Procedures == nil {
		s.Procedures = make(map[string]*Procedure, len(s.Declared))
	}
	for _, p := range s.Declared {
		if s.Procedures[p] == nil {
			s.Procedures[p] = &Procedure{Capacity: math.Inf(1), Callers: map[string]float64{}}
		}
	}
}

// stored reads a setting from the store: def when it is nil, else its
// value, which must be one its type can spell (MarshalText refuses others).
func stored[T encoding.TextMarshaler](path string, v *T, def T, errs *[]error) T {
	if v == nil {
		return def
	}
	if _, err := (*v).MarshalText(); err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", path, err))
		return def
	}
	return *v
}

// Store is a Source backed by the history store: it reloads every limit
// within moments of a change notification, and every resync interval as a
// safety net for notifications lost with a connection. While the store is
// unreachable it keeps serving the last limits it read.
//
// Until the first successful read, Ready reports why not, and the
// controller publishes nothing: it would otherwise push ratios computed
// without limits, which opens every gate.
type Store struct {
	store   history.LimitStore
	resync  time.Duration
	log     *slog.Logger
	current atomic.Pointer[Set]
	lastErr atomic.Pointer[error]
	warned  []string // the warnings last logged; Run's goroutine only

	// OnReload, when set before Run, is told the outcome of every read
	// (nil for success), for metrics.
	OnReload func(error)
}

// NewStore returns a Source over st; Run keeps it current.
func NewStore(st history.LimitStore, resync time.Duration, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{store: st, resync: resync, log: logger}
}

// Limits returns the last limits read, or no limits before the first read.
func (s *Store) Limits() *Set {
	if set := s.current.Load(); set != nil {
		return set
	}
	return Empty
}

// Ready is nil once limits have been read at least once.
func (s *Store) Ready() error {
	if s.current.Load() != nil {
		return nil
	}
	if err := s.lastErr.Load(); err != nil {
		return fmt.Errorf("limits not loaded yet: %w", *err)
	}
	return errors.New("limits not loaded yet")
}

// Run reads the limits now, on every change notification and every resync
// interval, until ctx ends. It subscribes again after losing the
// notification channel.
func (s *Store) Run(ctx context.Context) error {
	s.reload(ctx)
	resync := time.NewTicker(s.resync)
	defer resync.Stop()
	var changes <-chan struct{}
	retry := time.NewTimer(0)
	defer retry.Stop()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
			ch, err := s.store.Changes(ctx)
			if err != nil {
				s.log.Warn("cannot listen for limit changes; retrying", "err", err, "retry_in", backoff)
				retry.Reset(backoff)
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			changes = ch
			// Changes made while nobody listened are read now.
			s.reload(ctx)
		case _, ok := <-changes:
			if !ok {
				changes = nil
				retry.Reset(backoff)
				continue
			}
			s.reload(ctx)
		case <-resync.C:
			s.reload(ctx)
		}
	}
}

func (s *Store) reload(ctx context.Context) {
	l, err := s.store.Limits(ctx)
	if ctx.Err() != nil {
		return
	}
	var set *Set
	if err == nil {
		set, err = FromHistory(l)
	}
	// OnReload is told last, so that whoever hears of a good read reads
	// its limits.
	defer func() {
		if s.OnReload != nil {
			s.OnReload(err)
		}
	}()
	if err != nil {
		s.lastErr.Store(&err)
		s.log.Error("reading limits failed; keeping the last limits read", "err", err)
		return
	}
	s.lastErr.Store(nil)
	// Every resync reads the same rows again: a warning is logged when
	// it first appears, not every time.
	if w := set.Warnings(); !slices.Equal(w, s.warned) {
		for _, msg := range w {
			if !slices.Contains(s.warned, msg) {
				s.log.Warn("stored limits: a row is left out or surely not what was meant", "warning", msg)
			}
		}
		s.warned = w
	}
	first := s.current.Load() == nil
	s.current.Store(set)
	if first {
		s.log.Info("limits loaded", "services", set.Len(), "buckets", len(l.Buckets))
	}
}

func storedBurst(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

func storedPayback(v *time.Duration) time.Duration {
	if v == nil {
		return 0
	}
	return *v
}

// checkStoredBurst checks a stored limit's burst and payback by the limits
// file's rules.
func checkStoredBurst(b history.BucketLimit) error {
	if v := storedBurst(b.Burst); math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("burst: %v is not a finite number >= 0", v)
	}
	if p := storedPayback(b.Payback); p < 0 || p > MaxPayback {
		return fmt.Errorf("payback: %v is outside [0, %v]", p, MaxPayback)
	}
	return nil
}
