package controller

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// Cost units and debt (issue #16). A callee counting cost runs the law on
// its buckets' offered cost rates against limits and capacities in its
// units. A bucket whose requests turn out, once their responses report
// it, to cost more than they were admitted at runs its admitted cost above
// its own limit: the overshoot is its debt (dropratio.LevelStep), and the
// law holds it to a lower limit until it is paid back
// (dropratio.DebtLimit), so that over the payback window its admitted
// cost meets its limit. Debt is kept only for the buckets of a callee
// counting cost with a finite limit of their own (a leaf's, or the
// caller's for a callee without procedures), at most one per bucket the
// law runs over, and forgotten once the bucket is quiet.

// Burst and payback (issue #17) are the same mechanism on the other side
// of 0: a caller's limit may say burst: N, and it holds up to N tokens,
// or payback: D, and it pays back an overshoot of its limit over D, as a
// cost callee's bucket does over CostPayback. One level per bucket
// (dropratio.LevelStep): negative is debt, positive tokens. The law is
// given the bucket's limit raised by its tokens spread over burstSpend,
// or lowered by its debt (dropratio.LevelLimit). Levels are kept only for
// buckets with a finite limit of their own that hold a burst, pay back,
// or count cost, and only while they differ from a quiet bucket's: full,
// at dropratio.LevelTop (its burst, or for one that pays back at least
// the band it is credited for undershoot). A bucket that has no level is
// full: a new bucket, or a new controller, starts so.

// DefaultCostPayback is the payback window of a bucket's debt when
// StateConfig.CostPayback is 0.
const DefaultCostPayback = 10 * time.Second

// burstSpend is how long the law is given to spend a bucket's tokens:
// one default tick. The law allows L + tokens/burstSpend until the
// admitted rate, summed a tick later, drains them.
const burstSpend = time.Second

// levelKey names a bucket that can hold a level: a (callee, caller)
// pair, or a leaf; its tiers share it.
type levelKey struct{ service, caller, procedure string }

// leafLimit returns the limit the law holds the bucket (caller,
// procedure) of lim to, given its configured limit l.
type leafLimit func(lim *limits.Service, caller, procedure string, l float64) float64

func (s *State) costPayback() time.Duration { return cmp.Or(s.cfg.CostPayback, DefaultCostPayback) }

// bucketLevel is what a bucket's level is held to: its own limit, its
// burst and its payback window.
type bucketLevel struct {
	limit, burst float64
	payback      time.Duration
}

// levelOf returns the limit, burst and payback of lim's bucket (caller,
// procedure). The payback is the limit's own, else the controller's
// CostPayback for a callee counting cost, else none.
func (s *State) levelOf(lim *limits.Service, caller, procedure string) bucketLevel {
	if lim == nil {
		return bucketLevel{limit: math.Inf(1)}
	}
	bl := bucketLevel{limit: ownLimit(lim, caller, procedure)}
	if !lim.HasProcedures() {
		b := lim.Bucket(caller)
		bl.burst, bl.payback = b.Burst, b.Payback
	}
	if bl.payback == 0 && lim.Counted() {
		bl.payback = s.costPayback()
	}
	return bl
}

// mayHoldLevels reports whether some bucket of a callee with limits lim
// (nil for none) may keep a level (levelOf, holds): it counts cost, or
// it declares no procedures and some caller's limit has a burst or pays
// back. Cached per limits set (setCache), so that a tick asks each
// bucket of the few callees that may, not every bucket of the mesh.
func (s *State) mayHoldLevels(lim *limits.Service) bool {
	switch {
	case lim == nil:
		return false
	case lim.Counted():
		return true
	case lim.HasProcedures():
		return false
	}
	if m, ok := s.perSet.levels[lim]; ok {
		return m
	}
	m := false
	for _, b := range lim.Callers {
		if b.Burst > 0 || b.Payback > 0 {
			m = true
			break
		}
	}
	s.perSet.levels[lim] = m
	return m
}

// holds reports whether a bucket at bl keeps a level at all.
func (bl bucketLevel) holds() bool {
	return !math.IsInf(bl.limit, 1) && (bl.burst > 0 || bl.payback > 0)
}

// level returns the bucket k's level: a quiet bucket's (full) when the
// State keeps none.
func (s *State) level(k levelKey, bl bucketLevel) float64 {
	if l, ok := s.levels[k]; ok {
		return l
	}
	return bl.top()
}

// top is the level of a quiet bucket: dropratio.LevelTop.
func (bl bucketLevel) top() float64 {
	return dropratio.LevelTop(bl.limit, bl.burst, bl.payback)
}

// levelLimit is the State's leafLimit: l raised by the bucket's tokens or
// lowered by its debt, as they will stand once the tick the reports have
// not yet counted has passed (see ordered).
func (s *State) levelLimit(lim *limits.Service, caller, procedure string, l float64) float64 {
	if !s.mayHoldLevels(lim) {
		return l
	}
	bl := s.levelOf(lim, caller, procedure)
	if !bl.holds() {
		return l
	}
	k := levelKey{lim.Name, caller, procedure}
	level := s.level(k, bl)
	if given, ok := s.ordered[k]; ok && s.stepDt > 0 {
		a := min(s.bucketOffered[k], given) // what the law let through meanwhile
		// LevelStep's bounds without its rounding: a debt predicted under
		// a millionth of a window is still owed until the reports show it.
		level = min(max(level+(bl.limit-a)*s.stepDt.Seconds(), -bl.limit*bl.payback.Seconds()), bl.top())
	}
	out := dropratio.LevelLimit(l, level, burstSpend, bl.payback)
	if !math.IsNaN(out) {
		s.ordering[k] = out
	}
	return out
}

// offered is the bucket's load for the law: its cost rate for a callee
// counting cost (lim), else its request rate.
func (p *peerTotals) offered(lim *limits.Service) float64 {
	if lim.Counted() {
		return p.OfferedCost
	}
	return p.Offered
}

// admitted is the bucket's admitted rate in lim's unit: cost as the
// sidecars counted it, or requests offered less those dropped in
// earnest.
func (p *peerTotals) admitted(lim *limits.Service) float64 {
	if lim.Counted() {
		return p.AdmittedCost
	}
	return max(p.Offered-p.Dropped, 0)
}

// ownLimit is the limit of lim's bucket (caller, procedure) alone, its
// tiers' and its level's: the leaf's for a callee with procedures, else
// the caller's.
func ownLimit(lim *limits.Service, caller, procedure string) float64 {
	if lim.HasProcedures() {
		return lim.LeafLimit(caller, procedure)
	}
	return lim.Bucket(caller).Limit
}

// stepLevels moves every bucket's level a step of dt on, from the
// admitted rates of inbound, and returns the sum of the debts per callee
// counting cost, for metrics (nil when none owes). A bucket with a level
// that is not in inbound admitted nothing; one that lost its limit, its
// burst and its payback holds none.
func (s *State) stepLevels(dt time.Duration, inbound map[string][]peerTotals, set *limits.Set) map[string]float64 {
	admitted := make(map[levelKey]float64, len(s.levels))
	for k := range s.levels {
		admitted[k] = 0
	}
	clear(s.bucketOffered)
	for svc, peers := range inbound {
		lim := set.Service(svc)
		if !s.mayHoldLevels(lim) {
			continue
		}
		for _, p := range peers { // sorted: a bucket's tiers add up in one order
			if s.levelOf(lim, p.peer, p.procedure).holds() {
				k := levelKey{svc, p.peer, p.procedure}
				admitted[k] += p.admitted(lim)
				s.bucketOffered[k] += p.offered(lim)
			}
		}
	}
	var sums map[string]float64
	for _, k := range slices.SortedFunc(maps.Keys(admitted), compareLevelKeys) {
		lim := set.Service(k.service)
		bl := s.levelOf(lim, k.caller, k.procedure)
		if !bl.holds() {
			delete(s.levels, k)
			continue
		}
		l := dropratio.LevelStep(s.level(k, bl), admitted[k], bl.limit, bl.burst, dt, bl.payback)
		if l == bl.top() {
			delete(s.levels, k)
			continue
		}
		s.levels[k] = l
		if l < 0 && lim.Counted() {
			if sums == nil {
				sums = map[string]float64{}
			}
			sums[k.service] -= l
		}
	}
	return sums
}

func compareLevelKeys(a, b levelKey) int {
	return cmp.Or(cmp.Compare(a.service, b.service), cmp.Compare(a.caller, b.caller), cmp.Compare(a.procedure, b.procedure))
}

// costPolicy renders how lim's sidecars price a request; nil unless lim
// counts cost. Procedures are sorted, so that replicas publish the same
// bytes.
func costPolicy(lim *limits.Service) *sluicev1.CostPolicy {
	if !lim.Counted() {
		return nil
	}
	c := lim.Cost
	cp := &sluicev1.CostPolicy{DefaultCost: c.Default, RequestHeader: c.RequestHeader, ResponseHeader: c.ResponseHeader, MaxCost: c.Max}
	for _, proc := range slices.Sorted(maps.Keys(c.Procedures)) {
		cp.Procedures = append(cp.Procedures, &sluicev1.ProcedureCost{Procedure: proc, Cost: c.Procedures[proc]})
	}
	return cp
}

// markCost adds to pp, lim's bucket of v inbound, its cap on requests in
// flight and its debt.
func (s *State) markCost(pp *sluicev1.PeerPolicy, v dropratio.Verdict, lim *limits.Service, service string) {
	if c := lim.MaxConcurrency(v.Caller, v.Procedure); c > 0 {
		// A copy: &c would move c to the heap for every bucket, capped or not.
		pp.MaxConcurrency = proto.Uint32(c)
	}
	if lim.Counted() {
		pp.Debt = max(-s.levels[levelKey{service, v.Caller, v.Procedure}], 0)
	}
}
