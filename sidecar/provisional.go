package sidecar

import (
	"maps"
	"math"

	"github.com/sluicehq/sluice/pkg/criticality"
)

// Provisional ratios (issue #17). Between a surge's onset and the
// controller's answer to it, a sidecar projects the ratio its buckets need
// from what it holds (its share of the bucket's global offered rate, the
// bucket's allowed rate) and applies it at once. The projection is the
// reporter's (reporter.Projector); the Limiter only puts it in place of the
// controller's ratio, leaf by leaf, until the projection ends
// (SetProvisional without the leaf). It replaces the controller's ratio
// rather than bounding it: the controller's first answer to a surge is
// computed from part of the fleet's reports and is low, and taking the
// higher of the two would keep each sidecar whose share was measured low
// dropping more than its share while the others follow the controller (a
// 2 % undershoot in uber-surge's second second).
//
// It is never laid over an expired policy (whatever its fail mode), a shadow rule, one
// enforced upstream, or a service with a cost table (whose prices and caps
// are metered per leaf).

// Provisional is a ratio projected for one leaf of a service.
type Provisional struct {
	Peer, Procedure string
	Tier            criticality.Tier
	// Ratio is the projected ratio, in [0, 1).
	Ratio float64
}

// SetProvisional replaces service's provisional ratios with ps (none:
// the controller's ratios alone). A service without a table, or whose
// policy has expired, ignores it. Called by the reporter at surge checks,
// at most every few tens of milliseconds: each call that changes a ratio
// installs a new table, off the request path.
func (l *Limiter) SetProvisional(service string, ps []Provisional) {
	if s := l.lookup(service); s != nil {
		s.setProvisional(ps)
	}
}

func (s *ServiceLimiter) setProvisional(ps []Provisional) {
	var next map[leaf]Provisional
	if len(ps) > 0 {
		next = make(map[leaf]Provisional, len(ps))
		for _, p := range ps {
			next[leaf{p.Peer, p.Procedure, p.Tier}] = Provisional{Ratio: clampRatio(p.Ratio)}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.table.Load()
	if t.policy == nil || t.cost != nil || s.fail.derived || s.fail.state == Expired {
		// No overlay: none to lay over, a service whose leaves are metered
		// (a cost table, a concurrency cap), or an expired policy, whose
		// fail mode's verdicts (hold's too: the controller's last ratios)
		// stay until a new policy applies it. An end to the ratios is
		// heard all the same: a new policy lays s.prov over its verdicts,
		// and ratios their giver has ended must not come back with it.
		if len(next) == 0 {
			s.prov = nil
		}
		return
	}
	if closeProvisional(s.prov, next) {
		return
	}
	s.prov = next
	s.installLocked(t.policy, t.procs, t.crit, s.overlayLocked(t.policy, t.cost), t.desc, t.cost)
}

// closeProvisional reports whether b would change nothing that a's table
// does not already do: the same leaves, each admitted share (1 − ratio)
// within 1 % of a's. A projection moves its ratios at every step, and each
// change installs a table (O(leaves + policy)) under the service's lock,
// which a first sighting of a peer on the request path waits for.
func closeProvisional(a, b map[leaf]Provisional) bool {
	if len(a) != len(b) {
		return false
	}
	for k, pa := range a {
		pb, ok := b[k]
		if !ok {
			return false
		}
		x, y := 1-pa.Ratio, 1-pb.Ratio
		if math.Abs(x-y) > 0.01*max(x, y) || (pa.Ratio == 0) != (pb.Ratio == 0) {
			return false
		}
	}
	return true
}

// overlayLocked returns the verdicts of p (s.base) with s.prov laid over
// them; cost is p's compiled pricing and caps. s.mu must be held.
func (s *ServiceLimiter) overlayLocked(p *Policy, cost *costTable) map[leaf]*verdict {
	if len(s.prov) == 0 || cost != nil {
		return s.base
	}
	out := maps.Clone(s.base)
	for k, pr := range s.prov {
		v := s.base[k]
		if v == nil || v.kind != kindEnforce {
			continue
		}
		if pr.Ratio == v.ratio {
			continue
		}
		rule := *v.rule
		rule.DropRatio = pr.Ratio
		out[k] = compile(s.name, p.Direction, &rule)
	}
	return out
}
