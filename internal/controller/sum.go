package controller

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
)

// Summing: the latest zone load of every live aggregator, merged per
// bucket, inbound and outbound counted once each.

// peerTotals is one bucket's load during a tick: a (callee, caller) pair's
// when procedure is "", else one leaf's; in one tier of a callee that
// declares them, else tier None.
type peerTotals struct {
	Totals
	peer, procedure string
	tier            criticality.Tier
}

// comparePeers orders buckets by peer, then procedure, then tier.
func comparePeers(a, b *peerTotals) int {
	if c := strings.Compare(a.peer, b.peer); c != 0 {
		return c
	}
	if c := strings.Compare(a.procedure, b.procedure); c != 0 {
		return c
	}
	return cmp.Compare(a.tier, b.tier)
}

// tickLoads is what one tick sums from the live aggregators' zone loads.
type tickLoads struct {
	// buckets holds each callee's load per bucket, sorted by caller then
	// procedure: what reached the callee's inbound sidecars undecided plus
	// what callers enforcing outbound offered it (see combine), with
	// procedures and tiers folded into the callee's (see foldBuckets).
	buckets map[string][]peerTotals
	live    map[string]uint32 // per callee: live inbound sidecars
	outLive map[string]uint32 // per caller: live instances enforcing outbound
	// refused holds the outbound claims left out of buckets, sorted by
	// callee then caller (see combine).
	refused []RefusedClaim
}

// sum adds up the live aggregators' loads, in sorted aggregator order: float
// sums depend on order, and every controller replica must compute the same
// ratios from the same inputs. Outbound claims are taken as set allows
// (trustClaim).
//
// Each zone load lists a service's peers sorted (Apply sees to it), so a
// service's peers are merged across aggregators rather than hashed: at
// 110,000 buckets from a dozen aggregators, a map keyed by (service, peer)
// was most of a tick.
func (s *State) sum(set *limits.Set) tickLoads {
	// Indexed by direction: 0 inbound (service = callee, peers = callers),
	// 1 outbound (service = caller, peers = callees).
	var perService [2]map[string][]*sluicev1.ServiceLoad // in aggregator order
	var live [2]map[string]uint32
	for d := range perService {
		perService[d], live[d] = map[string][]*sluicev1.ServiceLoad{}, map[string]uint32{}
	}
	for _, id := range slices.Sorted(maps.Keys(s.aggs)) {
		for _, svc := range s.aggs[id].load.GetServices() {
			d := 0
			if svc.GetDirection() == sluicev1.Direction_DIRECTION_OUTBOUND {
				d = 1
			}
			// Saturating: a zone claiming 2^32-1 sidecars must not wrap the
			// sum around to a handful.
			live[d][svc.GetService()] += min(svc.GetLiveSidecars(), math.MaxUint32-live[d][svc.GetService()])
			perService[d][svc.GetService()] = append(perService[d][svc.GetService()], svc)
		}
	}
	var merged [2]map[string][]peerTotals
	for d := range merged {
		merged[d] = make(map[string][]peerTotals, len(perService[d]))
		for name, loads := range perService[d] {
			merged[d][name] = mergePeers(loads, s.merged[d][name])
		}
	}
	// Nothing keeps a tick's merged loads past the tick: the next one
	// merges into the same room.
	s.merged = merged
	buckets, refused := combine(merged[0], merged[1], set)
	foldBuckets(buckets, set)
	return tickLoads{buckets: buckets, live: live[0], outLive: live[1], refused: refused}
}

// mergePeers adds up one service's buckets across the zone loads of
// several aggregators, each sorted by peer, procedure and tier; the result
// is sorted so too, in dst's room when it has enough.
func mergePeers(loads []*sluicev1.ServiceLoad, dst []peerTotals) []peerTotals {
	// Each load's buckets and the next one to merge.
	type cursor struct {
		peers []*sluicev1.PeerRate
		next  int
	}
	cursors := make([]cursor, len(loads))
	// Most buckets are in every zone's load: the longest load is about
	// the merge's length, and growing to it by doubling would copy it
	// all several times over, at 110,000 buckets a tick.
	longest := 0
	for k, l := range loads {
		cursors[k].peers = l.GetPeers()
		longest = max(longest, len(cursors[k].peers))
	}
	merged := dst[:0]
	if cap(merged) < longest {
		merged = make([]peerTotals, 0, longest)
	}
	for {
		// The smallest bucket at the heads, first found in load first;
		// no load before first holds it.
		var least *sluicev1.PeerRate
		first := -1
		for k := range cursors {
			c := &cursors[k]
			if c.next < len(c.peers) && (least == nil || comparePeerRates(c.peers[c.next], least) < 0) {
				least, first = c.peers[c.next], k
			}
		}
		if least == nil {
			return merged
		}
		// Its rates, added in aggregator order.
		t := peerTotals{peer: least.GetPeer(), procedure: least.GetProcedure(), tier: criticality.Tier(least.GetCriticality())}
		for k := first; k < len(cursors); k++ {
			c := &cursors[k]
			if c.next == len(c.peers) {
				continue
			}
			if p := c.peers[c.next]; p == least || comparePeerRates(p, least) == 0 {
				t.add(Totals{Offered: p.GetOfferedRps(), Dropped: p.GetDroppedRps(), ShadowDropped: p.GetShadowDroppedRps(),
					OfferedCost: p.GetOfferedCostRps(), AdmittedCost: p.GetAdmittedCostRps(), InFlight: float64(p.GetInFlight())})
				c.next++
			}
		}
		merged = append(merged, t)
	}
}

// sameBucket reports whether p and q are loads of one bucket.
func (p *peerTotals) sameBucket(q *peerTotals) bool {
	return p.peer == q.peer && p.procedure == q.procedure && p.tier == q.tier
}

// combine turns outbound loads (per caller, peers = callees) around into
// buckets (per callee, peers = callers) and adds them to the inbound ones.
//
// The double-counting rule: a call that a caller enforcing outbound admits
// reaches the callee's inbound sidecar marked as decided (sidecar.
// DecidedHeader), and the inbound side neither decides nor counts it. So
// the inbound counts of a bucket hold only what no caller decided (callers
// that do not enforce outbound, or not yet), the outbound counts what the
// enforcing callers offered before their drops, and a bucket's offered load
// is their sum: each request counted once, whichever side decided it. The
// law runs once per bucket on that sum, and both sides get the bucket's one
// ratio (callee/<callee> and caller/<caller>), each applying it to the
// requests it decides, so that together they admit the limit: (1−p)·(R_out
// + R_in) = L, never 2·L, and no request is dropped twice.
//
// Outbound peers names.Unknown and names.Overflow (calls whose callee the
// caller could not name, or beyond its table) are left out: no limit can
// name them, and they would make policies for services that do not exist.
// Claims set does not trust (trustClaim) are left out too, and returned,
// sorted by callee then caller. So are all claims toward a callee that
// declares procedures: they carry no procedure, so the caller's side
// cannot decide per leaf, and the callee's inbound sidecars ignore the
// decided mark of such a callee and count every call in its leaf
// themselves (sidecar.DecidedHeader); counted here as well, each call
// would count twice. So are all claims toward a callee that declares
// tiers, for the same reason: a caller's side resolves no tier; and toward
// a callee counting cost, which a caller's side neither prices nor
// counts. Sums are
// in a fixed order, inbound first, callers sorted.
func combine(inbound, outbound map[string][]peerTotals, set *limits.Set) (map[string][]peerTotals, []RefusedClaim) {
	if len(outbound) == 0 {
		return inbound, nil
	}
	byCallee := map[string][]peerTotals{} // sorted by caller: callers are visited sorted
	var refused []RefusedClaim
	for _, caller := range slices.Sorted(maps.Keys(outbound)) {
		for _, p := range outbound[caller] {
			if p.peer == names.Unknown || p.peer == names.Overflow {
				continue
			}
			lim := set.Service(p.peer)
			reason := ""
			switch {
			case lim.HasProcedures():
				reason = RefusedProcedures
			case lim.Tiered():
				reason = RefusedTiers
			case lim.Counted():
				reason = RefusedCost
			case !trustClaim(lim, caller):
				reason = RefusedNoLimit
			}
			if reason != "" {
				refused = append(refused, RefusedClaim{BucketLoad{Callee: p.peer, Caller: caller, Totals: p.Totals}, reason})
				continue
			}
			byCallee[p.peer] = append(byCallee[p.peer], peerTotals{Totals: p.Totals, peer: caller, procedure: p.procedure})
		}
	}
	slices.SortFunc(refused, func(a, b RefusedClaim) int {
		return cmp.Or(strings.Compare(a.Callee, b.Callee), strings.Compare(a.Caller, b.Caller))
	})
	out := make(map[string][]peerTotals, len(inbound)+len(byCallee))
	for callee, in := range inbound {
		out[callee] = in
	}
	for callee, outb := range byCallee {
		in := inbound[callee]
		merged := make([]peerTotals, 0, len(in)+len(outb))
		i, j := 0, 0
		for i < len(in) || j < len(outb) {
			switch {
			case j == len(outb) || i < len(in) && comparePeers(&in[i], &outb[j]) < 0:
				merged = append(merged, in[i])
				i++
			case i == len(in) || comparePeers(&outb[j], &in[i]) < 0:
				merged = append(merged, outb[j])
				j++
			default: // the same bucket on both sides
				t := in[i]
				t.add(outb[j].Totals)
				merged = append(merged, t)
				i, j = i+1, j+1
			}
		}
		out[callee] = merged
	}
	return out, refused
}

// trustClaim says whether an outbound claim of caller toward callee (whose
// limits are lim, nil for none) may enter the callee's bucket for caller.
//
// An outbound claim is the caller speaking for itself: the calls it admits
// reach the callee marked as decided, and the callee's sidecars neither
// count nor report them (see combine), so nothing the callee observes can
// confirm or bound the claim; capping it at the callee's inbound counts
// would cap every honest claim at 0. What bounds a bucket is its limit: the
// law splits a callee's capacity by demand min(offered, limit), so a claim
// for a bucket with a finite limit takes at most that limit from the other
// callers, what the operator granted the caller and what it could take by
// sending for real, while a claim without one takes whatever it names (one
// abuser claiming 10^9 rps toward checkout cut an innocent caller under
// its limit by 37 % for 14 s, issue 13). So where the callee has a capacity
// to share, a claim counts only for a bucket with a finite limit, its own
// or the callee's default_limit; without a capacity it cuts no one and
// counts, so that history and the configurator still see the caller's load.
//
// The price: a caller that enforces outbound toward a callee with a
// capacity and has no limit there is not dropped for capacity, and its
// admitted calls are not in the split; give such callers a limit (or the
// callee a default_limit). Buckets enforced upstream need nothing here:
// their callee's sidecars count every arrival as offered before the
// upstream drops, in the inbound counts. Refused claims are counted
// (sluice_controller_outbound_claims_refused_total, reason no_limit).
func trustClaim(lim *limits.Service, caller string) bool {
	if lim == nil || math.IsInf(lim.Capacity, 1) {
		return true
	}
	return !math.IsInf(lim.Bucket(caller).Limit, 1)
}

// foldBuckets makes every callee's buckets those its limits declare, in
// place, keeping each sorted by caller, procedure and tier. Folded loads
// add up, in bucket order, so that replicas agree.
//
// Procedures: for a callee that declares procedures, every bucket is a
// leaf of a declared procedure or names.Other: a procedure it does not
// declare, which only a broken or hostile sidecar or aggregator sends,
// folds into names.Other, so that no one grows the law's state, the
// policies or the metrics by inventing procedures; and so does procedure
// "", the load of a sidecar that predates procedures (outbound claims
// toward such a callee never get here: see combine). For a callee without
// procedures, every bucket is a whole (callee, caller) pair: a procedure
// folds into "".
//
// Tiers: for a callee that declares tiers, a bucket of tier None, the load
// of a sidecar whose policy predates the tiers, folds into the tier its
// requests would have now without a header (limits.Service.DefaultTier);
// for a callee without tiers, every tier folds into None, the load of a
// sidecar whose policy still has them. So the law, the policies and the
// metrics see only the tiers the limits declare, whatever mix the zones
// send while a change of the limits reaches the sidecars.
func foldBuckets(buckets map[string][]peerTotals, set *limits.Set) {
	for callee, peers := range buckets {
		lim := set.Service(callee)
		var declared map[string]bool
		if lim.HasProcedures() {
			declared = make(map[string]bool, len(lim.Declared)+1)
			for _, p := range lim.Declared {
				declared[p] = true
			}
			declared[names.Other] = true
		}
		tiered := lim.Tiered()
		changed := false
		for i := range peers {
			p := &peers[i]
			proc := p.procedure
			switch {
			case declared == nil:
				proc = ""
			case !declared[proc]:
				proc = names.Other
			}
			tier := p.tier
			switch {
			case !tiered:
				tier = criticality.None
			case tier == criticality.None:
				tier = lim.DefaultTier(p.peer, proc)
			}
			if proc != p.procedure || tier != p.tier {
				p.procedure, p.tier, changed = proc, tier, true
			}
		}
		if !changed {
			continue
		}
		// Each caller's buckets are contiguous and few, so a stable sort
		// keeps the order of those that now share a bucket.
		slices.SortStableFunc(peers, func(a, b peerTotals) int { return comparePeers(&a, &b) })
		out := peers[:0]
		for _, p := range peers {
			if n := len(out); n > 0 && out[n-1].sameBucket(&p) {
				out[n-1].add(p.Totals)
				continue
			}
			out = append(out, p)
		}
		buckets[callee] = out
	}
}
