package controller

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// A tick that costs what changed (issue 20). In most ticks most callees
// of a mesh drop nothing: every caller under its limit, the callers'
// demands inside the capacity, no ratio still releasing. For such a
// callee the law is not stepped (dropratio.Law.Quiet gives its verdicts,
// Step's to the bit, without building Step's state), and its policy is
// not even built while the one published says the same (unchanged). What
// a tick still does for every bucket is sum the zone loads, build the law
// input and ask Quiet, and compare a quiet callee's listed buckets with
// its published policy, none of which allocates per bucket.
//
// Nothing here is a threshold of its own: a quiet callee is one whose
// full tick would give ratio 0 everywhere, and its policy is skipped only
// where due would say it is not due. So a tick publishes exactly what a
// tick that steps and renders everything does (TestIncrementalTickIsFull
// compares the two over random meshes), and replicas agree as before.

// quietSource is what a quiet callee's published policy was rendered
// from: its limits and live sidecars, besides its verdicts.
type quietSource struct {
	lim  *limits.Service
	live uint32
}

// quietTick collects one tick's quiet callees and their verdicts.
type quietTick struct {
	s        *State
	verdicts []dropratio.ServiceVerdict // sorted by service
}

// quietStep starts a tick's collection of quiet callees, reusing the
// verdicts' room of the tick before.
func (s *State) quietStep() *quietTick {
	clear(s.quietVerdicts[:cap(s.quietVerdicts)]) // do not keep the last tick's names alive
	s.quietVerdicts = s.quietVerdicts[:0]
	return &quietTick{s: s}
}

// take is lawInput's quiet: it keeps svc's verdicts and reports true
// when the law has nothing to drop of it. Callees come in name order.
func (q *quietTick) take(svc *dropratio.Service) bool {
	s := q.s
	if s.full {
		return false
	}
	start := len(s.quietVerdicts)
	v, ok := s.law.Quiet(svc, s.quietVerdicts)
	if !ok {
		return false
	}
	s.quietVerdicts = v
	// Capped, so that a later append to the shared room can not write
	// into this callee's verdicts; a reallocation leaves them where
	// they are.
	q.verdicts = append(q.verdicts, dropratio.ServiceVerdict{Service: svc.Name, Verdicts: v[start:len(v):len(v)]})
	return true
}

// join merges the law's verdicts with the quiet ones, both sorted by
// service, as one tick's verdicts.
func (q *quietTick) join(stepped []dropratio.ServiceVerdict) []dropratio.ServiceVerdict {
	if len(q.verdicts) == 0 {
		return stepped
	}
	out := make([]dropratio.ServiceVerdict, 0, len(stepped)+len(q.verdicts))
	i, j := 0, 0
	for i < len(stepped) || j < len(q.verdicts) {
		if j == len(q.verdicts) || i < len(stepped) && strings.Compare(stepped[i].Service, q.verdicts[j].Service) < 0 {
			out = append(out, stepped[i])
			i++
			continue
		}
		out = append(out, q.verdicts[j])
		j++
	}
	return out
}

// has reports whether service was quiet this tick.
func (q *quietTick) has(service string) bool {
	_, ok := slices.BinarySearchFunc(q.verdicts, service, func(sv dropratio.ServiceVerdict, name string) int {
		return strings.Compare(sv.Service, name)
	})
	return ok
}

// unchanged reports whether the policy of sv, a quiet callee with limits
// lim and live sidecars, would not be due (see due) if it were built: so
// it is not. name is the policy's.
//
// It can tell without building the policy only when the published one
// was built from a quiet callee's verdicts (published.quiet) with the
// same limits and the same live sidecars, and lim is plain (it was, to be
// recorded): then every field of the policy due compares is a function
// of the limits and the live sidecars but the buckets' entries. Those are
// rendered one at a time into the same scratch entry (State.entry) and
// compared as due compares them (peerDue); and the refresh falls due as
// due says.
func (s *State) unchanged(sv dropratio.ServiceVerdict, live uint32, lim *limits.Service, now time.Time) (name string, ok bool) {
	name = names.Callee(sv.Service)
	pub := s.published[name]
	if s.full || pub == nil || pub.quiet == nil || pub.quiet.lim != lim || pub.quiet.live != live || !pub.tombstone.IsZero() {
		return name, false
	}
	if now.Sub(pub.policy.GetIssuedAt().AsTime()) >= RefreshAge(name, s.cfg.PolicyTTL) {
		return name, false
	}
	if s.scratchEntry == nil {
		s.scratchEntry = newPeerSlab(1)
	}
	declared := s.declared(lim)
	peers := pub.policy.GetPeers()
	i := 0
	for _, v := range sv.Verdicts {
		if !publishedBucket(v, lim, declared, true) {
			continue
		}
		s.scratchEntry.back(0, 0)
		np := s.entry(v, lim, sv.Service, s.scratchEntry)
		if !listed(np) {
			continue
		}
		if i == len(peers) || peerDue(peers[i], np, s.cfg.RepublishThreshold, false, pub.freshAt(i, now)) {
			return name, false
		}
		i++
	}
	return name, i == len(peers)
}

// plain reports whether the policy of a quiet callee with limits lim (nil
// for none) is, but for its buckets' entries, a function of its limits
// and its live sidecars, and each entry a function of its verdict and
// the limits: lim counts no cost (whose debts its entries carry) and
// declares no descriptors (whose values its policy lists), and no caller
// is enforced upstream or capped in flight.
func (s *State) plain(lim *limits.Service) bool {
	if lim == nil {
		return true
	}
	if lim.Counted() || len(lim.Descriptors) > 0 || lim.Enforcement == dataplane.EnforceUpstream {
		return false
	}
	if p, ok := s.perSet.plain[lim]; ok {
		return p
	}
	p := true
	for _, b := range lim.Callers {
		if b.Enforcement == dataplane.EnforceUpstream || b.MaxConcurrency > 0 {
			p = false
		}
	}
	for _, proc := range lim.Procedures {
		if len(proc.MaxConcurrency) > 0 {
			p = false
		}
	}
	s.perSet.plain[lim] = p
	return p
}

// declared returns the procedures lim declares, as a set; nil when it
// declares none. Computed once per limits set (setCache).
func (s *State) declared(lim *limits.Service) map[string]bool {
	if !lim.HasProcedures() {
		return nil
	}
	if d, ok := s.perSet.declared[lim]; ok {
		return d
	}
	d := make(map[string]bool, len(lim.Declared))
	for _, p := range lim.Declared {
		d[p] = true
	}
	s.perSet.declared[lim] = d
	return d
}

// sortedCallers returns the callers lim (nil for none) names, sorted;
// computed once per limits set (setCache).
func (s *State) sortedCallers(lim *limits.Service) []string {
	if lim == nil || len(lim.Callers) == 0 {
		return nil
	}
	if c, ok := s.perSet.callers[lim]; ok {
		return c
	}
	c := slices.Sorted(maps.Keys(lim.Callers))
	s.perSet.callers[lim] = c
	return c
}
