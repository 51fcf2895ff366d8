package dropratio

import (
	"math"
	"slices"
	"strings"
	"time"
)

// Law holds the previous ratios of every bucket; it is the only state.
// Not safe for concurrent use: one owner calls Step.
//
// Only buckets whose last ratio is above zero are held: a bucket at zero
// behaves exactly like one never seen, so forgetting it loses nothing and
// keeps memory proportional to the buckets being dropped, not to the mesh.
type Law struct {
	cfg      Config
	services map[string]*serviceState
	buckets  int    // buckets held across services, for Len
	step     uint64 // counts Step calls, to spot services missing from the input

	// Scratch reused by every Step, so that a steady state allocates only the
	// slices it returns.
	order    []int // services, by name
	input    []row // one service's callers as given
	perm     []int // input, by name
	rows     []row // one service's buckets, by name, merged, carried over
	demands  []float64
	vanished []string
	procs    []Procedure   // one service's procedures, as given
	limits   []CallerLimit // one service's caller limits, as given
	tree     Tree          // one service's hierarchy, for filler
	filler   Filler

	// open says this step may open a bucket back under its allowance at
	// once (Config.OpenBelow) on what it sees: a step of at least
	// openMinStep. The fast path's urgent steps, 50 ms apart, see rates
	// some of which come from a surge report's fraction of an interval, in
	// which a caller can send nothing for reasons that are not a fall (its
	// requests held by slow bodies, or refused by a full proxy): opened on
	// one such rate, an abuser ten times over its limit got the gates open
	// for a tick, again and again (TestHostileSlowBodies: 64 connections at
	// the app where its sidecar's bound is 48, and the victim lost half of
	// its allowance; three short steps in a row under the band were no
	// better: 52 connections). A fall the fast path reported is opened by
	// the next regular tick, a second at most later.
	open bool
}

// openMinStep is the shortest step that may open a bucket at once: half
// the controller's default tick, so that regular ticks do and urgent ones
// do not.
const openMinStep = time.Second / 2

type serviceState struct {
	callers map[leafKey]bucket
	step    uint64 // the last Step whose input named this service
}

// leafKey names a bucket within a service; procedure "" is the implicit
// one of a callee that declares none.
type leafKey struct {
	caller, procedure string
	tier              uint8
}

type bucket struct {
	ratio float64 // last ratio returned, in (0, PMax]
	limit float64 // last known, for when the caller vanishes
	mode  Mode
}

// row is one bucket while a service is being stepped.
type row struct {
	name      string
	procedure string
	tier      uint8
	offered   float64
	limit     float64
	mode      Mode
	prev      float64
	hasPrev   bool
	carried   bool // missing from the input, kept while it releases
	allowed   float64
	bound     Bound
}

// New returns a law with no state. It refuses an invalid cfg; the error is
// Validate's, which already names the package, fields and bounds.
func New(cfg Config) (*Law, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Law{cfg: cfg, services: make(map[string]*serviceState)}, nil
}

// Len returns the number of buckets held in state: those whose last ratio was
// above zero.
func (l *Law) Len() int { return l.buckets }

// Ratio returns the last ratio returned for the bucket, 0 if none.
func (l *Law) Ratio(service, caller string) float64 { return l.LeafRatio(service, caller, "") }

// LeafRatio returns the last ratio returned for the untiered leaf (caller,
// procedure), 0 if none.
func (l *Law) LeafRatio(service, caller, procedure string) float64 {
	return l.TierRatio(service, caller, procedure, 0)
}

// TierRatio returns the last ratio returned for the bucket (caller,
// procedure, tier), 0 if none.
func (l *Law) TierRatio(service, caller, procedure string, tier uint8) float64 {
	if st := l.services[service]; st != nil {
		return st.callers[leafKey{caller, procedure, tier}].ratio
	}
	return 0
}

// Seed gives a bucket the law holds no state for a previous ratio, as if an
// earlier Step had returned it. A restarted controller seeds the ratios its
// sidecars are observed to enforce (dropped / offered): its first Step then
// keeps them, and later ones release from there, instead of jumping to a
// target computed from a picture that may still be incomplete. A bucket that
// already has state keeps it; a ratio that is not above zero seeds nothing;
// one above PMax is clamped to it.
func (l *Law) Seed(service, caller string, ratio float64) { l.SeedLeaf(service, caller, "", ratio) }

// SeedLeaf is Seed for the untiered leaf (caller, procedure).
func (l *Law) SeedLeaf(service, caller, procedure string, ratio float64) {
	l.SeedTier(service, caller, procedure, 0, ratio)
}

// SeedTier is Seed for the bucket (caller, procedure, tier).
func (l *Law) SeedTier(service, caller, procedure string, tier uint8, ratio float64) {
	if !(ratio > 0) { // also refuses NaN
		return
	}
	st := l.services[service]
	if st == nil {
		st = &serviceState{callers: make(map[leafKey]bucket), step: l.step}
		l.services[service] = st
	}
	key := leafKey{caller, procedure, tier}
	if _, ok := st.callers[key]; ok {
		return
	}
	st.callers[key] = bucket{ratio: min(ratio, l.cfg.PMax), limit: math.Inf(1), mode: Enforce}
	l.buckets++
}

// Step computes the verdicts for one tick, dt after the previous one, and
// returns them sorted by Service, each service's verdicts sorted by Caller,
// Procedure and Tier.
//
// Every service and caller in the input gets a verdict. Buckets that had a
// ratio above zero but are missing from the input (the caller, or the whole
// service, vanished) are carried over with Offered 0 and their last known
// Limit and Mode: their ratio keeps releasing, they stay in the output until
// it has reached 0, so sidecars learn of the 0, and are then forgotten.
// A service that vanished has no known capacity and is stepped without one.
//
// A dt <= 0 (the first tick, or two ticks at one instant) allows no release:
// a ratio may rise, never fall.
//
// Shadow callers are computed exactly as if enforced and take part in the
// capacity split with the demand they would have under enforcement: a shadow
// verdict says what enforcement would do, so switching a caller to Enforce
// changes whether drops happen, never how many.
func (l *Law) Step(dt time.Duration, services []Service) []ServiceVerdict {
	l.step++
	release := 0.0 // growth factor of the admitted share this tick; 0 means none
	if dt > 0 {
		release = math.Pow(l.cfg.ReleaseRate, dt.Seconds())
	}
	l.open = l.cfg.OpenBelow > 0 && dt >= openMinStep

	l.order = l.order[:0]
	size := l.buckets // every held bucket may be carried over
	for i := range services {
		l.order = append(l.order, i)
		size += len(services[i].Callers)
	}
	slices.SortFunc(l.order, func(a, b int) int {
		return strings.Compare(services[a].Name, services[b].Name)
	})

	// One backing array for all verdicts: two allocations per Step in all.
	// Each service gets a capped subslice, so appending to one can not
	// overwrite the next.
	out := make([]ServiceVerdict, 0, len(services)+len(l.services))
	verdicts := make([]Verdict, 0, size)
	emit := func(name string, capacity float64) {
		start := len(verdicts)
		verdicts, _ = l.stepService(name, capacity, release, verdicts, false)
		out = append(out, ServiceVerdict{Service: name, Verdicts: verdicts[start:len(verdicts):len(verdicts)]})
	}

	for i := 0; i < len(l.order); {
		name := services[l.order[i]].Name
		capacity := math.Inf(1)
		l.input, l.procs, l.limits = l.input[:0], l.procs[:0], l.limits[:0]
		for ; i < len(l.order) && services[l.order[i]].Name == name; i++ {
			capacity = min(capacity, l.add(&services[l.order[i]]))
		}
		emit(name, capacity)
	}

	l.vanished = l.vanished[:0]
	for name, st := range l.services {
		if st.step != l.step {
			l.vanished = append(l.vanished, name)
		}
	}
	if len(l.vanished) > 0 {
		slices.Sort(l.vanished)
		for _, name := range l.vanished {
			l.input, l.procs, l.limits = l.input[:0], l.procs[:0], l.limits[:0]
			emit(name, math.Inf(1))
		}
		slices.SortFunc(out, func(a, b ServiceVerdict) int { return strings.Compare(a.Service, b.Service) })
	}
	clear(l.vanished) // do not keep forgotten names alive
	return out
}

// Quiet returns the verdicts Step would return for svc, appended to out,
// when Step would drop nothing of it: the law holds no ratio for svc, and
// every caller's target is 0, so nothing would be kept either. ok is false
// otherwise, with out as it was, and svc must go to Step. It changes no
// state, and Step need never hear of a quiet service: one missing from
// Step's input is the same as one stepped at ratio 0 when the law holds
// nothing for it.
//
// A tick that costs what changed (issue 20): in most ticks most callees of
// a mesh are under their limits and capacities, and a controller steps
// only the others. Quiet runs Step's own code for one service, so the
// verdicts are Step's to the bit.
func (l *Law) Quiet(svc *Service, out []Verdict) (verdicts []Verdict, ok bool) {
	if l.services[svc.Name] != nil {
		return out, false
	}
	l.input, l.procs, l.limits = l.input[:0], l.procs[:0], l.limits[:0]
	capacity := l.add(svc)
	start := len(out)
	out, dropped := l.stepService(svc.Name, capacity, 0, out, true)
	if dropped {
		return out[:start], false
	}
	return out, true
}

// add appends s's callers, procedures and caller limits to the service
// being stepped (l.input, l.procs, l.limits), and returns its capacity,
// sanitized.
func (l *Law) add(s *Service) (capacity float64) {
	l.procs = append(l.procs, s.Procedures...)
	l.limits = append(l.limits, s.CallerLimits...)
	for _, c := range s.Callers {
		l.input = append(l.input, row{
			name:      c.Name,
			procedure: c.Procedure,
			tier:      c.Tier,
			offered:   sanitizeOffered(c.Offered),
			limit:     sanitizeLimit(c.Limit),
			mode:      c.Mode,
		})
	}
	return sanitizeLimit(s.Capacity)
}

// stepService steps the buckets of one service, whose callers are in
// l.input, appends their verdicts to out and updates the state; dry leaves
// the state alone, for a service the law holds nothing for (Quiet).
// dropped reports whether some verdict's ratio is above 0.
func (l *Law) stepService(name string, capacity, release float64, out []Verdict, dry bool) (_ []Verdict, dropped bool) {
	// Sorting a permutation moves words, not rows of 56 bytes with pointers
	// in them; the sort is most of the cost of Step on shuffled input.
	in := l.input
	l.perm = l.perm[:0]
	for i := range in {
		l.perm = append(l.perm, i)
	}
	slices.SortFunc(l.perm, func(a, b int) int { return compareRows(&in[a], &in[b]) })
	rows := l.rows[:0]
	for _, i := range l.perm {
		rows = merge(rows, &in[i])
	}

	st := l.services[name]
	if st != nil {
		st.step = l.step
		found := 0
		for k := range rows {
			if b, ok := st.callers[leafKey{rows[k].name, rows[k].procedure, rows[k].tier}]; ok {
				rows[k].prev, rows[k].hasPrev = b.ratio, true
				found++
			}
		}
		if found < len(st.callers) {
			n := len(rows)
			for key, b := range st.callers {
				if _, ok := slices.BinarySearchFunc(rows[:n], key, compareRowKey); !ok {
					rows = append(rows, row{name: key.caller, procedure: key.procedure, tier: key.tier, limit: b.limit, mode: b.mode, prev: b.ratio, hasPrev: true, carried: true})
				}
			}
			slices.SortFunc(rows, func(a, b row) int { return compareRows(&a, &b) })
		}
	}
	l.rows = rows[:0] // keep the capacity

	l.allocate(rows, capacity)
	for k := range rows {
		r := &rows[k]
		target, reason := l.target(r)
		ratio := l.release(r, target, release)
		out = append(out, Verdict{
			Caller:    r.name,
			Procedure: r.procedure,
			Tier:      r.tier,
			Ratio:     ratio,
			Target:    target,
			Allowed:   r.allowed,
			Offered:   r.offered,
			Limit:     r.limit,
			Mode:      r.mode,
			Reason:    reason,
			Bound:     r.bound,
		})
		dropped = dropped || ratio > 0
		if dry {
			continue
		}

		switch {
		case ratio > 0:
			if st == nil {
				st = &serviceState{callers: make(map[leafKey]bucket), step: l.step}
				l.services[name] = st
			}
			if !r.hasPrev {
				l.buckets++
			}
			st.callers[leafKey{r.name, r.procedure, r.tier}] = bucket{ratio: ratio, limit: r.limit, mode: r.mode}
		case r.hasPrev:
			delete(st.callers, leafKey{r.name, r.procedure, r.tier})
			l.buckets--
		}
	}
	if st != nil && len(st.callers) == 0 {
		delete(l.services, name)
	}
	return out, dropped
}

// allocate sets every row's allowed rate and the level that bounds it. A
// service without procedures, caller limits or tiers takes the flat split,
// the hierarchical law's special case, without building a tree; rows are
// sorted, so the caller-limit pass of the tree would see the same order.
func (l *Law) allocate(rows []row, capacity float64) {
	flat := len(l.procs) == 0 && len(l.limits) == 0
	for k := 0; flat && k < len(rows); k++ {
		flat = rows[k].procedure == "" && rows[k].tier == 0
	}
	if flat {
		level := l.level(rows, capacity)
		for k := range rows {
			r := &rows[k]
			r.allowed, r.bound = min(r.limit, level), BoundLeaf
			switch {
			case level < r.limit:
				r.bound = BoundCallee
			case math.IsInf(r.limit, 1):
				r.bound = BoundNone
			}
		}
		return
	}
	l.tree.Capacity, l.tree.Procedures, l.tree.Callers = capacity, l.procs, l.limits
	l.tree.Leaves = l.tree.Leaves[:0]
	for k := range rows {
		r := &rows[k]
		l.tree.Leaves = append(l.tree.Leaves, Leaf{Caller: r.name, Procedure: r.procedure, Tier: r.tier, Offered: r.offered, Limit: r.limit})
	}
	for k, s := range l.filler.Fill(&l.tree) {
		rows[k].allowed, rows[k].bound = s.Allowed, s.Bound
	}
	clear(l.tree.Leaves) // do not keep names alive
}

// level returns the max-min fair share of capacity per caller, +Inf when the
// callers' demands fit.
func (l *Law) level(rows []row, capacity float64) float64 {
	if math.IsInf(capacity, 1) {
		return capacity
	}
	// rows are sorted by name, so the sum is the same on every replica.
	sum := 0.0
	for k := range rows {
		sum += demand(&rows[k])
	}
	if !(sum > capacity) {
		return math.Inf(1)
	}
	l.demands = l.demands[:0]
	for k := range rows {
		l.demands = append(l.demands, demand(&rows[k]))
	}
	return waterLevel(l.demands, capacity)
}

// demand is what a caller would send under its own limit. Callers below
// MinRate count in full: they are spared drops, not capacity.
func demand(r *row) float64 { return min(r.offered, r.limit) }

// waterLevel splits capacity max-min fairly: it returns the level such that
// giving each caller min(demand, level) hands out the whole capacity, or +Inf
// when the demands fit. It sorts demands in place; demands must be >= 0.
//
// Going up from the smallest demand, each caller that wants no more than an
// equal split of what is left is satisfied and leaves the rest to the others;
// the first that wants more sets the level for itself and everyone above.
func waterLevel(demands []float64, capacity float64) float64 {
	slices.Sort(demands)
	left := capacity
	for i, d := range demands {
		share := left / float64(len(demands)-i)
		if d > share {
			return share
		}
		left -= d
	}
	return math.Inf(1)
}

// target returns p*, the ratio that would admit exactly what the caller is
// allowed, and why.
func (l *Law) target(r *row) (float64, Reason) {
	switch {
	case r.carried:
		// Nothing is known to be sent any more: release, then forget.
		return 0, None
	case r.allowed == 0 && r.bound.Reason() == OverLimit:
		// A block (a limit of 0, the leaf's or the caller's) is not an
		// estimate from a rate, so neither MinRate nor the absence of
		// traffic spares it: a blocked caller that is listed without
		// traffic is blocked from its first request.
		return l.cfg.PMax, OverLimit
	case r.offered == 0 || r.offered < l.cfg.MinRate:
		return 0, None
	}
	p := 1 - r.allowed/r.offered
	if !(p > 0) {
		return 0, None
	}
	return min(p, l.cfg.PMax), r.bound.Reason()
}

// release applies fast attack, slow release: a ratio rises to its target at
// once, but the admitted share 1-p grows by at most the factor release, so the
// end of a surge does not open the gates all at once while the offered rate
// is still high. A bucket back under its allowance (offered at most
// OpenBelow × allowed) releases to its target at once: it needs no drops,
// and slow release would only drop a caller within its rights. A carried
// bucket is not known to be under anything (its traffic is unknown, not
// gone), and a step without elapsed time releases nothing at all. Nor
// does a step shorter than openMinStep open at once (see Law.open).
func (l *Law) release(r *row, target, release float64) float64 {
	if !r.hasPrev || target >= r.prev {
		return target
	}
	if release == 0 {
		return r.prev
	}
	if l.open && !r.carried && r.offered <= l.cfg.OpenBelow*r.allowed {
		return target
	}
	// The explicit conversion rounds the product before the subtraction, so
	// no platform fuses them into one FMA and replicas on amd64 and arm64
	// agree bit for bit.
	eased := 1 - float64((1-r.prev)*release)
	return min(max(target, eased, 0), l.cfg.PMax)
}

// compareRows orders rows by name, procedure and tier, and duplicates by value,
// so that merging sums them in the same order whatever the input order was.
func compareRows(a, b *row) int {
	if c := strings.Compare(a.name, b.name); c != 0 {
		return c
	}
	if c := strings.Compare(a.procedure, b.procedure); c != 0 {
		return c
	}
	if a.tier != b.tier {
		return int(a.tier) - int(b.tier)
	}
	switch {
	case a.offered != b.offered:
		return cmpFloat(a.offered, b.offered)
	case a.limit != b.limit:
		return cmpFloat(a.limit, b.limit)
	}
	return int(a.mode) - int(b.mode)
}

func cmpFloat(a, b float64) int {
	if a < b {
		return -1
	}
	return 1
}

func compareRowKey(r row, k leafKey) int {
	if c := strings.Compare(r.name, k.caller); c != 0 {
		return c
	}
	if c := strings.Compare(r.procedure, k.procedure); c != 0 {
		return c
	}
	return int(r.tier) - int(k.tier)
}

// merge appends r to rows, which are sorted by name, or merges it into the
// last row if that has the same name, by the rule documented on Service.
func merge(rows []row, r *row) []row {
	if len(rows) == 0 || rows[len(rows)-1].name != r.name || rows[len(rows)-1].procedure != r.procedure || rows[len(rows)-1].tier != r.tier {
		return append(rows, *r)
	}
	m := &rows[len(rows)-1]
	// Sanitized rates are finite, but their sum may overflow.
	m.offered = min(m.offered+r.offered, math.MaxFloat64)
	m.limit = min(m.limit, r.limit)
	m.mode = min(m.mode, r.mode)
	return rows
}

// sanitizeOffered maps a rate that can not be a real count (NaN, infinite,
// negative, or -0) to 0.
func sanitizeOffered(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// sanitizeLimit maps a NaN or negative limit or capacity to 0, which blocks:
// see Caller. +Inf stays: it means no limit.
func sanitizeLimit(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return v
}
