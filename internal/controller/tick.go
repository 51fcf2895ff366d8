package controller

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// A tick: the global loads summed, the law run on them, the policies that
// changed rendered.

// Totals is a bucket's global load, summed over live aggregators.
type Totals struct {
	Offered, Dropped, ShadowDropped float64
	// OfferedCost and AdmittedCost are cost units per second, for a
	// callee counting cost (issue #16); InFlight is requests in flight,
	// the sum of the sidecars' latest gauges.
	OfferedCost, AdmittedCost, InFlight float64
}

// TickResult is what one tick decided.
type TickResult struct {
	// Changed holds the policies to push, by resource name.
	Changed map[string]*sluicev1.DropPolicy
	// Deleted names resources to remove (services gone for a TTL).
	Deleted []string
	// Warm is false while the controller is still collecting after start;
	// nothing is published then.
	Warm bool
	// Aggregators and Buckets count what the tick summed.
	Aggregators, Buckets int
	// Quiet counts the callees the law had nothing to drop of and was
	// not stepped for (dropratio.Law.Quiet), and Rendered the callees
	// whose policies were built: a quiet callee's policy is not while
	// nothing in it changed enough to publish (State.unchanged).
	Quiet, Rendered int
	// Stale names aggregators this tick dropped for silence.
	Stale []string
	// Services holds the global load per callee, for metrics.
	Services map[string]Totals
	// Procedures holds the global load per callee and procedure, for
	// metrics: "" for a callee without procedures, else each declared
	// procedure and names.Other with traffic.
	Procedures map[ServiceProcedure]Totals
	// Loads holds the global load of every observed bucket, sorted, for
	// the history recorder: a leaf's tiers summed, as history keeps no
	// tiers. Valid until the next Tick, which reuses its room: at 110,000
	// buckets a fresh one cost a sixth of a quiet tick.
	Loads []BucketLoad
	// RefusedClaims holds the outbound claims left out of the buckets,
	// sorted by callee then caller (see combine).
	RefusedClaims []RefusedClaim
	// Shed holds, per policy over the most peers a policy lists, what was
	// left out of it (see capPeers), sorted by policy.
	Shed []ShedPeers
	// Descriptors holds what each configured descriptor listed, sorted by
	// service then descriptor, for metrics.
	Descriptors []DescriptorStat
	// Debts holds, per callee counting cost with a bucket in debt, the
	// sum of its buckets' debts in cost units, for metrics.
	Debts map[string]float64
	// Health holds what each callee did with the requests its sidecars
	// let through, per procedure it declares and "" for the callee as a
	// whole (health.go).
	Health map[ServiceProcedure]UpstreamHealth
	// Estimates holds the capacity estimated for each callee (Procedure
	// "") and each procedure with an objective (adaptive.go).
	Estimates map[ServiceProcedure]adaptive.Estimate
}

// BucketLoad is one bucket's global load in one tick: a leaf's when
// Procedure is set, else a (callee, caller) pair's.
type BucketLoad struct {
	Callee, Caller, Procedure string
	Totals
	// Cost says the callee counts cost: the history recorder keeps the
	// bucket's cost rates too.
	Cost bool
}

// RefusedClaim is an outbound claim of Caller toward Callee left out of
// the law, and why: one of the Refused* reasons, a metric label.
type RefusedClaim struct {
	BucketLoad
	Reason string
}

// The reasons of RefusedClaim.
const (
	// RefusedNoLimit: the callee has a capacity and the bucket no finite
	// limit (see trustClaim).
	RefusedNoLimit = "no_limit"
	// RefusedProcedures: the callee declares procedures, and its own
	// sidecars decide and count every call in its leaf (see combine).
	RefusedProcedures = "callee_procedures"
	// RefusedTiers: the callee declares tiers, and its own sidecars
	// decide and count every call in its tier (see combine).
	RefusedTiers = "callee_tiers"
	// RefusedCost: the callee counts cost, which only its own sidecars
	// price (see combine).
	RefusedCost = "callee_cost"
)

// ServiceProcedure names one procedure of one callee.
type ServiceProcedure struct{ Service, Procedure string }

func (t *Totals) add(u Totals) {
	t.Offered += u.Offered
	t.Dropped += u.Dropped
	t.ShadowDropped += u.ShadowDropped
	t.OfferedCost += u.OfferedCost
	t.AdmittedCost += u.AdmittedCost
	t.InFlight += u.InFlight
}

// Tick runs one control step at now against the limits in force.
func (s *State) Tick(now time.Time, set *limits.Set) TickResult {
	var stale []string
	for id, a := range s.aggs {
		if now.Sub(a.seen) > time.Duration(s.cfg.StaleAfter)*a.interval {
			delete(s.aggs, id)
			stale = append(stale, id)
		}
	}
	slices.Sort(stale)
	res := TickResult{Aggregators: len(s.aggs), Stale: stale}
	if !s.Warm(now) {
		return res
	}
	res.Warm = true
	set = s.ownedSet(set)
	s.perSet.under(set)

	loads := s.sum(set)
	res.RefusedClaims = loads.refused
	inbound, live := loads.buckets, loads.live
	var dt time.Duration
	if !s.lastStep.IsZero() {
		dt = now.Sub(s.lastStep)
	} else {
		s.seed(inbound)
	}
	s.lastStep = now
	res.Debts = s.stepLevels(dt, inbound, set)
	res.Health = s.sumHealth(set)
	res.Estimates = s.stepEstimates(dt, inbound, res.Health, set)
	s.ordered, s.ordering, s.stepDt = s.ordering, map[levelKey]float64{}, dt
	quiet := s.quietStep()
	services := s.lawInput(inbound, set, res.Estimates, quiet.take)
	verdicts := quiet.join(s.law.Step(dt, services))
	descriptors, dstats := s.stepDescriptors(now, dt, set)
	res.Descriptors = dstats

	res.Changed = map[string]*sluicev1.DropPolicy{}
	res.Services = make(map[string]Totals, len(verdicts))
	res.Procedures = make(map[ServiceProcedure]Totals, len(verdicts))
	current := make(map[string]bool, len(verdicts))
	entries := 0
	for _, sv := range verdicts {
		entries += len(inbound[sv.Service])
	}
	// At most one per entry: tiers of a bucket merge. In the room of the
	// last tick's, which its caller is done with (see TickResult.Loads).
	if cap(s.loads) < entries {
		s.loads = make([]BucketLoad, 0, entries)
	}
	res.Loads = s.loads[:0]
	for _, sv := range verdicts {
		var tot Totals
		counted := set.Service(sv.Service).Counted()
		for _, p := range inbound[sv.Service] {
			tot.add(p.Totals)
			k := ServiceProcedure{sv.Service, p.procedure}
			pt := res.Procedures[k]
			pt.add(p.Totals)
			res.Procedures[k] = pt
			// A bucket's tiers are adjacent: inbound is sorted by
			// (caller, procedure, tier).
			if n := len(res.Loads); n > 0 && p.tier != criticality.None {
				if last := &res.Loads[n-1]; last.Callee == sv.Service && last.Caller == p.peer && last.Procedure == p.procedure {
					last.add(p.Totals)
					continue
				}
			}
			res.Loads = append(res.Loads, BucketLoad{Callee: sv.Service, Caller: p.peer, Procedure: p.procedure, Totals: p.Totals, Cost: counted})
		}
		res.Services[sv.Service] = tot
		res.Buckets += len(sv.Verdicts)
		lim := set.Service(sv.Service)
		isQuiet := quiet.has(sv.Service)
		if isQuiet {
			res.Quiet++
			if name, ok := s.unchanged(sv, live[sv.Service], lim, now); ok {
				current[name] = true
				continue
			}
		}
		res.Rendered++
		policy := s.policy(sv, live[sv.Service], lim, now)
		policy.Descriptors = descriptors[sv.Service]
		sp, capped := s.capPeers(policy)
		if capped {
			res.Shed = append(res.Shed, sp)
		}
		current[policy.GetName()] = true
		if s.due(policy, now) {
			pub := publish(s.published[policy.GetName()], policy, now)
			if isQuiet && !capped && s.plain(lim) {
				pub.quiet = &quietSource{lim: lim, live: live[sv.Service]}
			}
			s.published[policy.GetName()] = pub
			res.Changed[policy.GetName()] = policy
		}
	}
	for _, policy := range s.callerPolicies(verdicts, loads.outLive, set, now) {
		if sp, ok := s.capPeers(policy); ok {
			res.Shed = append(res.Shed, sp)
		}
		current[policy.GetName()] = true
		if s.due(policy, now) {
			s.published[policy.GetName()] = publish(s.published[policy.GetName()], policy, now)
			res.Changed[policy.GetName()] = policy
		}
	}
	s.loads = res.Loads[:0]
	slices.SortFunc(res.Shed, func(a, b ShedPeers) int { return strings.Compare(a.Policy, b.Policy) })
	// Services that vanished (no traffic, no limits, ratios released): an
	// empty policy first, so state-of-the-world clients, which never hear
	// of deletions, stop dropping; the resource itself goes a TTL later.
	for _, name := range slices.Sorted(maps.Keys(s.published)) {
		p := s.published[name]
		if current[name] {
			continue
		}
		switch {
		case p.tombstone.IsZero():
			empty := &sluicev1.DropPolicy{
				Name: name, Service: p.policy.GetService(), Direction: p.policy.GetDirection(), Shard: p.policy.GetShard(),
				Ttl: p.policy.GetTtl(), FailMode: p.policy.GetFailMode(), FailOpenDecay: p.policy.GetFailOpenDecay(),
				IssuedAt: timestamppb.New(now),
			}
			s.published[name] = &published{policy: empty, tombstone: now}
			res.Changed[name] = empty
		case now.Sub(p.tombstone) >= s.cfg.PolicyTTL:
			delete(s.published, name)
			res.Deleted = append(res.Deleted, name)
		}
	}
	return res
}

// seed starts the law from the ratios the sidecars are seen to enforce, so
// that a restarted controller neither forgets a surge nor releases it from a
// picture that may still lack a zone: a ratio measured as dropped / offered
// is right even from part of the fleet.
// Each tier of a bucket is seeded apart: its sidecars drop each tier at its
// own ratio.
func (s *State) seed(inbound map[string][]peerTotals) {
	for svc, peers := range inbound {
		for _, p := range peers {
			if p.Offered > 0 {
				s.law.SeedTier(svc, p.peer, p.procedure, uint8(p.tier), (p.Dropped+p.ShadowDropped)/p.Offered)
			}
		}
	}
}

// lawInput joins observed load with configured limits: every callee with
// traffic or limits, every caller with traffic or a limit of its own. A
// callee that declares procedures is a tree (procedureInput).
//
// A callee that declares tiers has one Caller per tier seen of each bucket
// (peers are folded: foldBuckets), each with the bucket's limit, which its
// tiers share (the law gives it to them top-down). A limited bucket with
// no traffic is listed in its default tier only (limits.Service.
// DefaultTier), so that a blocked caller is blocked at once: a sidecar
// admits a request of a tier its policy does not list until the next
// tick, as it admits an unlisted caller's. The law carries the tiers it
// holds a ratio for until they release.
//
// A callee counting cost (limits.Service.Counted) offers its leaves' cost
// rates, and every limit, its own and lowered by its debt (limit), and
// capacity is in its units.
//
// Each callee's input is built in s.scratch, and offered to quiet, which
// may take it (the law need not step it: see quiet.go) and keeps nothing
// of it; only the inputs quiet refuses are copied out, so that a tick
// allocates law input for the callees that changed, not the mesh.
func (s *State) lawInput(inbound map[string][]peerTotals, set *limits.Set, est map[ServiceProcedure]adaptive.Estimate, quiet func(*dropratio.Service) bool) []dropratio.Service {
	callees := map[string]bool{}
	for svc := range inbound {
		callees[svc] = true
	}
	for _, svc := range set.Services() {
		callees[svc] = true
	}
	out := make([]dropratio.Service, 0, len(callees))
	for _, name := range slices.Sorted(maps.Keys(callees)) {
		lim := set.Service(name)
		var configured []string
		if lim.HasProcedures() {
			configured = s.limitedCallers(lim)
		} else {
			configured = s.sortedCallers(lim)
		}
		svc := serviceInput(name, inbound[name], lim, s.levelLimit, est, configured, s.scratch[:0])
		s.scratch = svc.Callers[:0]
		if quiet(&svc) {
			continue
		}
		svc.Callers = slices.Clone(svc.Callers)
		out = append(out, svc)
	}
	clear(s.scratch[:cap(s.scratch)]) // do not keep this tick's names alive
	return out
}

// serviceInput is one callee's law input (see lawInput), its callers
// appended to dst; configured are the callers lim names, sorted
// (sortedCallers, or limitedCallers for a callee with procedures).
func serviceInput(name string, peers []peerTotals, lim *limits.Service, limit leafLimit, est map[ServiceProcedure]adaptive.Estimate, configured []string, dst []dropratio.Caller) dropratio.Service {
	if lim.HasProcedures() {
		return capTiers(procedureInput(name, peers, lim, limit, est, configured, dst), lim)
	}
	written := math.Inf(1)
	if lim != nil {
		written = lim.Capacity
	}
	svc := dropratio.Service{Name: name, Capacity: capacityOf(ServiceProcedure{name, ""}, written, est), Callers: dst}
	for _, p := range peers {
		b := lim.Bucket(p.peer)
		svc.Callers = append(svc.Callers, dropratio.Caller{Name: p.peer, Tier: uint8(p.tier), Offered: p.offered(lim),
			Limit: limit(lim, p.peer, "", b.Limit), Mode: b.Mode})
	}
	// The configured callers that sent nothing: peers are sorted by
	// caller, as configured is, so one walk finds them.
	i := 0
	for _, caller := range configured {
		for i < len(peers) && peers[i].peer < caller {
			i++
		}
		if i < len(peers) && peers[i].peer == caller {
			continue
		}
		b := lim.Callers[caller]
		svc.Callers = append(svc.Callers, dropratio.Caller{Name: caller, Tier: uint8(lim.DefaultTier(caller, "")),
			Limit: limit(lim, caller, "", b.Limit), Mode: b.Mode})
	}
	return capTiers(svc, lim)
}

// capTiers adds to a tiered callee's law input every tier of each capped
// (caller, procedure) it lacks, offering nothing, so that the policy lists
// the cap on all four: a sidecar holds one pool of slots per (caller,
// procedure) across its tiers, and a tier the policy did not list would
// have no verdict to take a slot with. Listed without traffic, such a
// tier is not dropped (the law blocks an idle bucket only at a limit of 0).
func capTiers(svc dropratio.Service, lim *limits.Service) dropratio.Service {
	if !lim.Tiered() {
		return svc
	}
	type key struct {
		caller, procedure string
		tier              uint8
	}
	have := make(map[key]bool, len(svc.Callers))
	for _, c := range svc.Callers {
		have[key{c.Name, c.Procedure, c.Tier}] = true
	}
	n := len(svc.Callers)
	for i := range n {
		c := svc.Callers[i]
		if lim.MaxConcurrency(c.Name, c.Procedure) == 0 {
			continue
		}
		for _, tier := range criticality.Tiers {
			if k := (key{c.Name, c.Procedure, uint8(tier)}); !have[k] {
				have[k] = true
				svc.Callers = append(svc.Callers, dropratio.Caller{Name: c.Name, Procedure: c.Procedure, Tier: uint8(tier), Limit: c.Limit, Mode: c.Mode})
			}
		}
	}
	return svc
}

// procedureInput is the law's input for a callee that declares
// procedures: one Caller per leaf, its Limit the leaf's own and its mode
// its caller's; the capacities of the callee, of the declared procedures
// and of names.Other, each capped by its objective's estimate (est); and the limit across procedures of every caller in it, its
// own or the callee's default. peers are the callee's observed leaves,
// folded (foldBuckets). A caller named by any limit of the callee gets
// a leaf for every procedure, traffic or not, so that its policy lists
// them from the first request (a blocked caller is blocked at once).
func procedureInput(name string, peers []peerTotals, lim *limits.Service, limit leafLimit, est map[ServiceProcedure]adaptive.Estimate, limited []string, dst []dropratio.Caller) dropratio.Service {
	procs := append(slices.Clone(lim.Declared), names.Other)
	svc := dropratio.Service{Name: name, Capacity: capacityOf(ServiceProcedure{name, ""}, lim.Capacity, est), Procedures: make([]dropratio.Procedure, 0, len(procs)), Callers: dst}
	for _, p := range procs {
		svc.Procedures = append(svc.Procedures, dropratio.Procedure{Name: p, Capacity: capacityOf(ServiceProcedure{name, p}, lim.ProcedureCapacity(p), est)})
	}
	for _, p := range peers {
		b := lim.Bucket(p.peer)
		svc.Callers = append(svc.Callers, dropratio.Caller{Name: p.peer, Procedure: p.procedure, Tier: uint8(p.tier), Offered: p.offered(lim),
			Limit: limit(lim, p.peer, p.procedure, lim.LeafLimit(p.peer, p.procedure)), Mode: b.Mode})
	}
	// The leaves of limited callers without traffic: peers are sorted by
	// caller, as limited is, so one walk finds each caller's run of
	// leaves, in any tier.
	i := 0
	for _, caller := range limited {
		for i < len(peers) && peers[i].peer < caller {
			i++
		}
		j := i
		for j < len(peers) && peers[j].peer == caller {
			j++
		}
		mode := lim.Bucket(caller).Mode
		for _, p := range procs {
			if !slices.ContainsFunc(peers[i:j], func(q peerTotals) bool { return q.procedure == p }) {
				svc.Callers = append(svc.Callers, dropratio.Caller{Name: caller, Procedure: p, Tier: uint8(lim.DefaultTier(caller, p)),
					Limit: limit(lim, caller, p, lim.LeafLimit(caller, p)), Mode: mode})
			}
		}
		i = j
	}
	// The limit across procedures of every caller with traffic or a
	// limit, in name order: the two sorted lists merged, each name once.
	last, started := "", false
	callerLimit := func(caller string) {
		if started && caller == last {
			return
		}
		last, started = caller, true
		if l := lim.Bucket(caller).Limit; !math.IsInf(l, 1) {
			svc.CallerLimits = append(svc.CallerLimits, dropratio.CallerLimit{Name: caller, Limit: l})
		}
	}
	for i, k := 0, 0; i < len(peers) || k < len(limited); {
		if k == len(limited) || i < len(peers) && peers[i].peer < limited[k] {
			callerLimit(peers[i].peer)
			i++
			continue
		}
		callerLimit(limited[k])
		k++
	}
	return svc
}

// limitedCallers returns the callers lim names anywhere in its limits, or
// caps in flight, sorted: procedureInput gives each a leaf for every
// procedure. Computed once per limits set (setCache).
func (s *State) limitedCallers(lim *limits.Service) []string {
	if c, ok := s.perSet.limited[lim]; ok {
		return c
	}
	set := maps.Clone(lim.Callers)
	if set == nil {
		set = map[string]limits.Bucket{}
	}
	for _, p := range lim.Procedures {
		for c := range p.Callers {
			set[c] = limits.Bucket{}
		}
		for c := range p.MaxConcurrency { // listed for their cap
			set[c] = limits.Bucket{}
		}
	}
	c := slices.Sorted(maps.Keys(set))
	s.perSet.limited[lim] = c
	return c
}
