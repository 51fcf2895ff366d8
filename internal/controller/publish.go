package controller

import (
	"cmp"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// Publishing: a verdict rendered as DropPolicy resources, pushed when they
// change enough and re-issued before their TTL runs out.

// published is what the state last published under one resource name.
type published struct {
	policy    *sluicev1.DropPolicy
	tombstone time.Time // when the policy was emptied because its service vanished; zero while live
	// quiet is what a quiet callee's policy was rendered from, when the
	// policy is a function of its verdicts alone (State.unchanged); nil
	// otherwise.
	quiet *quietSource
	// freshUntil holds, per entry of policy, until when its offered rate
	// counts as moving (see freshOffered); nil: none does.
	freshUntil []time.Time
}

// publish returns what to record of policy, going out at now in place of
// old (nil: none).
func publish(old *published, policy *sluicev1.DropPolicy, now time.Time) *published {
	return &published{policy: policy, freshUntil: freshOffered(old, policy, now)}
}

// FreshFor is how long an offered rate that moved stays fresh (see
// freshOffered): the two ticks after its own at the default tick.
const FreshFor = 3 * time.Second

// freshOffered returns, per entry of policy going out at now, until when
// its offered rate counts as moving: FreshFor from now for an entry that
// is new, or was at 0, in old, or whose rate moved from old's (see moved);
// else what old's entry had. Noise renews nothing: a policy goes out with
// all its entries, and one of twenty buckets at 100 rps, each renewed by
// a noisy move of a fifth at every push, went out at every tick, where
// its noise alone sends it at two in five
// (TestFreshOfferedSettlesWithManyNoisyBuckets). A rate published while it moves
// was counted part-way through the windows of the move (traffic that
// starts, steps or shifts within a second reaches the sidecars' reports
// at their own times, and urgent flushes publish it in pieces), and the
// rates after it differ from it by less than the noise bar of a Poisson
// count at a low rate (offeredChanged): at 100 rps the published rate went
// 12, 40, 84 (or 20, 38, 67, 81) and stood there until the refresh, and
// the sidecars projected a surge's first second from shares a fifth too
// large (step-5x and step-10x live: 238–276 admitted against 200). While
// fresh, a rate goes out again when it moves by FreshOfferedRepublish
// and OfferedRepublishMin, noise or not: a push or two more per move.
// nil when no entry is fresh.
func freshOffered(old *published, policy *sluicev1.DropPolicy, now time.Time) []time.Time {
	type key struct {
		peer, procedure string
		tier            sluicev1.Criticality
	}
	type was struct {
		rate  float64
		until time.Time
	}
	var before map[key]was
	if old != nil && old.tombstone.IsZero() {
		before = make(map[key]was, len(old.policy.GetPeers()))
		for i, op := range old.policy.GetPeers() {
			w := was{rate: op.GetOfferedRps()}
			if i < len(old.freshUntil) {
				w.until = old.freshUntil[i]
			}
			before[key{op.GetPeer(), op.GetProcedure(), op.GetCriticality()}] = w
		}
	}
	var until []time.Time
	for i, np := range policy.GetPeers() {
		r := np.GetOfferedRps()
		if !(r > 0) {
			continue
		}
		u := now.Add(FreshFor)
		if w, ok := before[key{np.GetPeer(), np.GetProcedure(), np.GetCriticality()}]; ok && w.rate > 0 && !moved(w.rate, r) {
			u = w.until
		}
		if !u.After(now) {
			continue
		}
		if until == nil {
			until = make([]time.Time, len(policy.GetPeers()))
		}
		until[i] = u
	}
	return until
}

// moved reports whether an offered rate went from a to b by more than
// noise ever moves it: by OfferedRepublish and OfferedRepublishMin, and
// beyond six standard deviations of a Poisson count (both a and b being
// counts, four of their difference's: one tick in 30,000 per bucket).
func moved(a, b float64) bool {
	d := math.Abs(a - b)
	return d >= OfferedRepublishMin && d > 6*math.Sqrt(max(a, b)) && relChanged(a, b, OfferedRepublish)
}

// freshAt reports whether entry i of p's policy has an offered rate that
// counts as moving at now.
func (p *published) freshAt(i int, now time.Time) bool {
	return i < len(p.freshUntil) && now.Before(p.freshUntil[i])
}

// peerPolicy renders one verdict of the law for peer: the caller of an
// inbound policy, the callee of an outbound one; from slab's room (nil:
// the heap's).
func peerPolicy(peer string, v dropratio.Verdict, slab *peerSlab) *sluicev1.PeerPolicy {
	pp := slab.peer()
	pp.Peer = peer
	pp.DropRatio = v.Ratio
	pp.Mode = modeProto(v.Mode)
	pp.LimitRps = slab.rate(v.Limit)
	pp.AllowedRps = slab.rate(v.Allowed)
	pp.OfferedRps = v.Offered
	pp.Reason = reasonProto(v.Reason, v.Ratio)
	// The law's tiers are the wire's (pkg/criticality): None is
	// UNSPECIFIED, an untiered bucket.
	pp.Criticality = sluicev1.Criticality(v.Tier)
	return pp
}

// peerSlab hands out the entries of one policy and their optional rates
// from two allocations, not one for every entry and every rate: at a
// million leaves a tick's policies were four allocations a leaf. A nil
// slab allocates each on the heap. What the policy does not list is
// given back (back), so that a published policy keeps no entries it does
// not hold.
type peerSlab struct {
	peers []sluicev1.PeerPolicy
	rates []float64
}

// newPeerSlab has room for n entries with three rates each.
func newPeerSlab(n int) *peerSlab {
	return &peerSlab{peers: make([]sluicev1.PeerPolicy, 0, n), rates: make([]float64, 0, 3*n)}
}

// peer returns a zero entry.
func (s *peerSlab) peer() *sluicev1.PeerPolicy {
	if s == nil || len(s.peers) == cap(s.peers) {
		return &sluicev1.PeerPolicy{}
	}
	s.peers = s.peers[:len(s.peers)+1]
	return &s.peers[len(s.peers)-1]
}

// rate returns v for an optional rate, nil when it is infinite or NaN,
// as finiteOrAbsent does.
func (s *peerSlab) rate(v float64) *float64 {
	switch {
	case !finite(v):
		return nil
	case s == nil || len(s.rates) == cap(s.rates):
		// Not finiteOrAbsent, whose &v, inlined, would move v to the
		// heap on every call.
		p := new(float64)
		*p = v
		return p
	}
	s.rates = append(s.rates, v)
	return &s.rates[len(s.rates)-1]
}

// mark and back give back what was handed out since mark, entries
// zeroed: the caller holds none of it.
func (s *peerSlab) mark() (peers, rates int) {
	if s == nil {
		return 0, 0
	}
	return len(s.peers), len(s.rates)
}

func (s *peerSlab) back(peers, rates int) {
	if s == nil {
		return
	}
	for i := peers; i < len(s.peers); i++ {
		s.peers[i] = sluicev1.PeerPolicy{}
	}
	s.peers, s.rates = s.peers[:peers], s.rates[:rates]
}

// listed reports whether a policy lists pp (dataplane.Listed): a ratio
// above 0, a limit, or enforcement upstream, never a share of capacity
// alone. A sidecar keeps counters, never evicted, for every peer listed
// (sidecar.Rule.Limited, the same rule on its form of the wire), so a peer
// listed for nothing would cost every sidecar of the callee memory, and a
// flood of made-up callers, each of which the law gives a share once the
// callee is over its capacity, would cost them that much each; every
// consumer reads an unlisted peer as ratio 0 without a limit anyway.
func listed(pp *sluicev1.PeerPolicy) bool {
	e := dataplane.EnforceSidecar
	if pp.GetEnforcedUpstream() {
		e = dataplane.EnforceUpstream
	}
	// A cap on requests in flight lists its bucket as a limit does: every
	// sidecar must hold its share of it from the first request.
	return dataplane.Listed(pp.GetDropRatio(), pp.LimitRps != nil || pp.MaxConcurrency != nil, e)
}

// leafPolicy renders the verdict of one bucket of callee (limits lim, nil
// for none) for peer: peerPolicy, with the bucket's procedure. Only an
// inbound policy carries leaves (see publishedBucket). The limit of a
// leaf on the wire is the tightest that bounds it alone: its own, else
// its caller's across procedures; so a leaf whose caller has a limit is
// listed (dataplane.Listed), and the sidecars keep its counters and a
// bucket for fail mode local from the first request. A leaf also carries
// its caller's limit across procedures, CallerLimitRps: under fail mode
// local the sidecars share it out among the caller's leaves, which
// limit_rps alone would each grant in full. And it carries the level that
// binds it, Bound, so that a sidecar's rejection names the bucket that
// refused; a whole bucket is that bucket alone and carries none.
func leafPolicy(peer string, v dropratio.Verdict, lim *limits.Service, slab *peerSlab) *sluicev1.PeerPolicy {
	if v.Procedure == "" {
		return peerPolicy(peer, v, slab)
	}
	limit, callerLimit := leafLimits(v, lim)
	v.Limit = limit
	pp := peerPolicy(peer, v, slab)
	pp.Procedure = v.Procedure
	pp.CallerLimitRps = slab.rate(callerLimit)
	pp.Bound = boundProto(v.Bound)
	return pp
}

// leafLimits returns what leafPolicy puts in a bucket's limit_rps and
// caller_limit_rps: for a leaf, the tighter of its limit and its
// caller's, and its caller's; for a whole bucket its limit, and +Inf
// (none).
func leafLimits(v dropratio.Verdict, lim *limits.Service) (limit, callerLimit float64) {
	if v.Procedure == "" {
		return v.Limit, math.Inf(1)
	}
	callerLimit = lim.Bucket(v.Caller).Limit
	return min(v.Limit, callerLimit), callerLimit
}

// publishedBucket reports whether a policy carries v, a verdict of a
// callee with limits lim (declared: its declared procedures), inbound or
// outbound. A callee without procedures publishes its buckets of
// procedure ""; one with procedures its leaves inbound, and nothing
// outbound: a caller's outbound claims carry no procedure, so its side
// cannot decide per leaf; they are left out of the law (combine), and the
// callee's inbound sidecars, ignoring the decided mark, decide and count
// every call in its leaf. A callee with tiers likewise publishes its
// tiered buckets inbound and nothing outbound; one without tiers its
// untiered buckets. Left out: a bucket the law still releases after the
// callee's procedures or tiers changed, under a procedure or a tier the
// policy no longer declares, which its sidecars would refuse.
func publishedBucket(v dropratio.Verdict, lim *limits.Service, declared map[string]bool, inbound bool) bool {
	switch {
	case lim.Tiered() != (v.Tier != uint8(criticality.None)):
		return false
	case lim.Tiered() && !inbound:
		return false
	case lim.Counted() && !inbound:
		return false
	case !lim.HasProcedures():
		return v.Procedure == ""
	case !inbound:
		return false
	}
	return v.Procedure == names.Other || declared[v.Procedure]
}

// policy renders a callee's verdict as its inbound DropPolicy, listing its
// limited buckets (see listed), and the procedures and routes its
// sidecars sort requests into buckets with.
func (s *State) policy(sv dropratio.ServiceVerdict, live uint32, lim *limits.Service, now time.Time) *sluicev1.DropPolicy {
	p := &sluicev1.DropPolicy{
		Name:          names.Callee(sv.Service),
		Service:       sv.Service,
		Direction:     sluicev1.Direction_DIRECTION_INBOUND,
		Ttl:           durationpb.New(s.cfg.PolicyTTL),
		LiveInstances: live,
		FailMode:      sluicev1.FailMode_FAIL_MODE_OPEN,
		FailOpenDecay: durationpb.New(s.cfg.FailOpenDecay),
		IssuedAt:      timestamppb.New(now),
		Peers:         make([]*sluicev1.PeerPolicy, 0, len(sv.Verdicts)),
		Shard:         ShardInfo(s.cfg.Shard, true),
	}
	if lim != nil {
		p.FailMode = failModeProto(lim.FailMode)
		p.Objective = objectiveProto(lim.SLO)
	}
	p.Criticality = criticalityPolicy(lim)
	if lim.Counted() {
		p.Unit = sluicev1.Unit_UNIT_COST
		p.Cost = costPolicy(lim)
	}
	var declared map[string]bool
	if lim.HasProcedures() {
		p.Procedures = slices.Clone(lim.Declared)
		declared = make(map[string]bool, len(lim.Declared))
		for _, d := range lim.Declared {
			declared[d] = true
		}
		for _, r := range lim.Routes {
			p.Routes = append(p.Routes, &sluicev1.Route{Pattern: r.Pattern, Procedure: r.Procedure})
		}
	}
	// Room for the entries surely listed: a published policy keeps its
	// slab whole, so unlisted callers (any number) get none; the rest of
	// the listed ones (a leaf listed for its caller's limit) go on the
	// heap.
	n := 0
	for k := range sv.Verdicts {
		if v := &sv.Verdicts[k]; v.Ratio > 0 || finite(v.Limit) {
			n++
		}
	}
	slab := newPeerSlab(n)
	for _, v := range sv.Verdicts {
		if !publishedBucket(v, lim, declared, true) {
			continue
		}
		peers, rates := slab.mark()
		pp := s.entry(v, lim, sv.Service, slab)
		if !listed(pp) {
			slab.back(peers, rates)
			continue
		}
		p.Peers = append(p.Peers, pp)
	}
	return p
}

// entry renders v, a verdict of callee service (limits lim), as its
// inbound policy's entry, from slab's room: listed or not (listed).
func (s *State) entry(v dropratio.Verdict, lim *limits.Service, service string, slab *peerSlab) *sluicev1.PeerPolicy {
	pp := leafPolicy(v.Caller, v, lim, slab)
	markUpstream(pp, v.Mode, lim.Bucket(v.Caller))
	s.markCost(pp, v, lim, service)
	return pp
}

// objectiveProto renders a callee's objective for its sidecars' health
// fast path; nil when it declares none. A procedure's own objective stays
// the controller's: a sidecar judges its callee whole.
func objectiveProto(o adaptive.Objective) *sluicev1.HealthObjective {
	if o == (adaptive.Objective{}) {
		return nil
	}
	m := &sluicev1.HealthObjective{Errors: o.Errors}
	if o.LatencyP99 > 0 {
		m.LatencyP99 = durationpb.New(o.LatencyP99)
	}
	return m
}

// criticalityPolicy renders how lim's sidecars find a request's tier;
// nil when lim declares no tiers. Procedures and callers are sorted by
// name, so that replicas publish the same bytes.
func criticalityPolicy(lim *limits.Service) *sluicev1.CriticalityPolicy {
	if !lim.Tiered() {
		return nil
	}
	c := lim.Criticality
	cp := &sluicev1.CriticalityPolicy{
		Header:      c.Header,
		DefaultTier: sluicev1.Criticality(c.Default),
		MaxTier:     sluicev1.Criticality(c.Max),
	}
	for _, proc := range slices.Sorted(maps.Keys(c.Procedures)) {
		cp.Procedures = append(cp.Procedures, &sluicev1.ProcedureCriticality{Procedure: proc, DefaultTier: sluicev1.Criticality(c.Procedures[proc])})
	}
	for _, caller := range slices.Sorted(maps.Keys(c.Callers)) {
		ct := c.Callers[caller]
		cp.Callers = append(cp.Callers, &sluicev1.CallerCriticality{Caller: caller,
			DefaultTier: sluicev1.Criticality(ct.Default), MaxTier: sluicev1.Criticality(ct.Max)})
	}
	return cp
}

// markUpstream marks an enforced bucket whose limits say it is enforced
// upstream (by the caller's proxyless gRPC client or the callee's Envoy):
// the callee's sidecar must count it as offered before those drops and
// never drop it again. The ratio stays, for the sidecar's weights and for
// the proxyless routes and runtime layers derived from this policy. The
// wire mode becomes MODE_SHADOW, which sidecars that predate the mark read
// as "count, never drop": they undercount the bucket but do not drop it
// twice. A shadow bucket stays plain shadow: nothing drops it anywhere, so
// its callee sees all of it. Only the limits decide, never which clients
// are connected, so that replicas agree. A leaf is marked as its caller's
// bucket is, with its own ratio: the limits allow upstream on a callee
// with procedures only when they are gRPC methods, and a proxyless
// client's route per method carries each leaf's ratio (Envoy's RTDS
// carries none of them).
func markUpstream(pp *sluicev1.PeerPolicy, mode dropratio.Mode, b limits.Bucket) {
	if mode == dropratio.Enforce && b.Enforcement == dataplane.EnforceUpstream {
		pp.Mode = sluicev1.Mode_MODE_SHADOW
		pp.EnforcedUpstream = true
	}
}

// callerPolicies builds the outbound policy, caller/<caller>, of every
// caller that enforces outbound (outLive: its live instances), sorted by
// caller: its rules are the limited buckets' verdicts where it is the
// caller, one per callee, with the same ratio the callee's inbound policy
// carries for it (see combine). Verdicts come sorted by callee, so each
// caller's rules are too. Toward a callee that declares procedures or
// tiers there is no rule (see publishedBucket): the caller admits its
// calls unlisted, and the callee's inbound side decides each in its leaf
// and tier, so
// that the leaf limits and procedure capacities hold for all of them.
//
// A policy has one fail mode while its callees may each have their own: the
// callees' common fail mode when they agree, else open, the default.
func (s *State) callerPolicies(verdicts []dropratio.ServiceVerdict, outLive map[string]uint32, set *limits.Set, now time.Time) []*sluicev1.DropPolicy {
	if len(outLive) == 0 || s.cfg.Shard.Sharded() {
		// A caller's outbound policy lists its callees, which sharded
		// controllers compute on several shards: not served sharded yet
		// (docs/operations.md, "Sharded controllers"); the xDS client
		// refuses to subscribe to one at sharded controllers.
		return nil
	}
	policies := make(map[string]*sluicev1.DropPolicy, len(outLive))
	// The callees' fail mode, per caller: absent before the first callee,
	// mixed once they differ.
	type callees struct {
		failMode dataplane.FailMode
		mixed    bool
	}
	failModes := make(map[string]callees, len(outLive))
	for _, caller := range slices.Sorted(maps.Keys(outLive)) {
		policies[caller] = &sluicev1.DropPolicy{
			Name:          names.Caller(caller),
			Service:       caller,
			Direction:     sluicev1.Direction_DIRECTION_OUTBOUND,
			Ttl:           durationpb.New(s.cfg.PolicyTTL),
			LiveInstances: outLive[caller],
			FailMode:      sluicev1.FailMode_FAIL_MODE_OPEN,
			FailOpenDecay: durationpb.New(s.cfg.FailOpenDecay),
			IssuedAt:      timestamppb.New(now),
		}
	}
	for _, sv := range verdicts {
		fm := dataplane.FailOpen
		lim := set.Service(sv.Service)
		if lim != nil {
			fm = lim.FailMode
		}
		for _, v := range sv.Verdicts {
			p := policies[v.Caller]
			if p == nil || !publishedBucket(v, lim, nil, false) {
				continue
			}
			pp := leafPolicy(sv.Service, v, lim, nil)
			if !listed(pp) {
				continue
			}
			p.Peers = append(p.Peers, pp)
			if c, seen := failModes[v.Caller]; !seen {
				failModes[v.Caller] = callees{failMode: fm}
			} else if c.failMode != fm {
				failModes[v.Caller] = callees{mixed: true}
			}
		}
	}
	out := make([]*sluicev1.DropPolicy, 0, len(policies))
	for _, caller := range slices.Sorted(maps.Keys(policies)) {
		p := policies[caller]
		if c, seen := failModes[caller]; seen && !c.mixed {
			p.FailMode = failModeProto(c.failMode)
		}
		out = append(out, p)
	}
	return out
}

// ShedPeers is what capPeers left out of one policy in one tick.
type ShedPeers struct {
	Policy string // the resource name
	Shed   int    // peers left out
	Kept   int    // peers listed
	// Largest is the offered rate of the busiest peer left out.
	Largest float64
}

// maxPolicyPeers is the most peers one policy lists: StateConfig's
// MaxPolicyPeers, never above what sidecars accept.
func (s *State) maxPolicyPeers() int {
	if n := s.cfg.MaxPolicyPeers; n > 0 && n < dataplane.MaxPolicyPeers {
		return n
	}
	return dataplane.MaxPolicyPeers
}

// capPeers cuts p's peers to maxPolicyPeers, so that no sidecar refuses p
// for its size (a sidecar that refuses a policy keeps the one it had, which
// would then outlive its TTL). Peers at ratio 0 go before peers with a
// ratio, which are being dropped now and would be admitted unlisted; within
// each, the smallest offered rate goes first, and the name breaks ties so
// that replicas agree. A peer left out is read as unlisted: at ratio 0 it
// loses only its own slot, its quota headers and its fail mode local
// bucket. The order of the peers kept is unchanged. It reports what it
// left out; ok is false when nothing was.
func (s *State) capPeers(p *sluicev1.DropPolicy) (ShedPeers, bool) {
	limit := s.maxPolicyPeers()
	n := len(p.Peers) - limit
	if n <= 0 {
		return ShedPeers{}, false
	}
	order := slices.Clone(p.Peers)
	slices.SortFunc(order, func(a, b *sluicev1.PeerPolicy) int {
		dropping := func(pp *sluicev1.PeerPolicy) int {
			if pp.GetDropRatio() > 0 {
				return 1
			}
			return 0
		}
		if c := cmp.Compare(dropping(a), dropping(b)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.GetOfferedRps(), b.GetOfferedRps()); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.GetPeer(), b.GetPeer()), strings.Compare(a.GetProcedure(), b.GetProcedure()), cmp.Compare(a.GetCriticality(), b.GetCriticality()))
	})
	gone := make(map[*sluicev1.PeerPolicy]bool, n)
	sp := ShedPeers{Policy: p.GetName(), Shed: n, Kept: limit}
	for _, pp := range order[:n] {
		gone[pp] = true
		sp.Largest = max(sp.Largest, pp.GetOfferedRps())
	}
	kept := make([]*sluicev1.PeerPolicy, 0, limit)
	for _, pp := range p.Peers {
		if !gone[pp] {
			kept = append(kept, pp)
		}
	}
	p.Peers = kept
	return sp, true
}

// due says whether policy differs enough from what was last published, or
// the last publication is half a TTL old.
func (s *State) due(policy *sluicev1.DropPolicy, now time.Time) bool {
	last, ok := s.published[policy.GetName()]
	if !ok || !last.tombstone.IsZero() {
		return true
	}
	old := last.policy
	if now.Sub(old.GetIssuedAt().AsTime()) >= RefreshAge(policy.GetName(), s.cfg.PolicyTTL) {
		return true
	}
	if old.GetLiveInstances() != policy.GetLiveInstances() || old.GetFailMode() != policy.GetFailMode() ||
		len(old.GetPeers()) != len(policy.GetPeers()) || !slices.Equal(old.GetProcedures(), policy.GetProcedures()) ||
		!proto.Equal(old.GetCriticality(), policy.GetCriticality()) ||
		old.GetUnit() != policy.GetUnit() || !proto.Equal(old.GetCost(), policy.GetCost()) ||
		!slices.EqualFunc(old.GetRoutes(), policy.GetRoutes(), func(a, b *sluicev1.Route) bool {
			return a.GetPattern() == b.GetPattern() && a.GetProcedure() == b.GetProcedure()
		}) {
		return true
	}
	th := s.cfg.RepublishThreshold
	if descriptorsDue(old.GetDescriptors(), policy.GetDescriptors(), th) {
		return true
	}
	cost := policy.GetUnit() == sluicev1.Unit_UNIT_COST
	for i, np := range policy.GetPeers() {
		if peerDue(old.GetPeers()[i], np, th, cost, last.freshAt(i, now)) {
			return true
		}
	}
	return false
}

// peerDue reports whether an entry np of a policy differs enough from
// the entry op at its place in the one published to push the policy: any
// field but the rates, a ratio that reaches or leaves 0, an admitted share
// or an allowed rate that moved beyond th, an offered rate as
// offeredChanged says (cost: the policy counts cost; fresh: op's offered
// rate counts as moving, see freshOffered).
func peerDue(op, np *sluicev1.PeerPolicy, th float64, cost, fresh bool) bool {
	if op.GetPeer() != np.GetPeer() || op.GetProcedure() != np.GetProcedure() || op.GetCriticality() != np.GetCriticality() ||
		op.GetMode() != np.GetMode() || op.GetEnforcedUpstream() != np.GetEnforcedUpstream() ||
		(op.LimitRps == nil) != (np.LimitRps == nil) || op.GetLimitRps() != np.GetLimitRps() ||
		(op.CallerLimitRps == nil) != (np.CallerLimitRps == nil) || op.GetCallerLimitRps() != np.GetCallerLimitRps() ||
		(op.AllowedRps == nil) != (np.AllowedRps == nil) || op.GetReason() != np.GetReason() || op.GetBound() != np.GetBound() ||
		(op.MaxConcurrency == nil) != (np.MaxConcurrency == nil) || op.GetMaxConcurrency() != np.GetMaxConcurrency() ||
		(op.GetDebt() == 0) != (np.GetDebt() == 0) {
		return true
	}
	// A ratio that reaches or leaves zero always goes out; otherwise
	// only a change of the admitted share beyond the threshold.
	if (op.GetDropRatio() == 0) != (np.GetDropRatio() == 0) {
		return true
	}
	oldAdmit, newAdmit := 1-op.GetDropRatio(), 1-np.GetDropRatio()
	if math.Abs(newAdmit-oldAdmit) > th*min(oldAdmit, newAdmit) {
		return true
	}
	return relChanged(op.GetAllowedRps(), np.GetAllowedRps(), th) ||
		offeredChanged(op.GetOfferedRps(), np.GetOfferedRps(), np.GetMaxConcurrency() > 0, cost, fresh)
}

// OfferedRepublish is the relative change of a listed bucket's global
// offered rate that is pushed before the refresh is due, whatever its
// ratio did. A sidecar projects a surge's ratio from its share of that
// rate (reporter.Projector: its own rate over offered_rps); under a ratio
// of 0 nothing else changes, so a bucket whose rate had doubled since its
// last policy projected from a share twice too large. A fifth keeps the
// projection within a fifth of the truth, at a few pushes an hour for a
// rate that follows a day's curve; changes under OfferedRepublishMin rps,
// or within three standard deviations of a Poisson count, stay unpushed:
// noise, not a move. Not for a callee counting cost: sidecars project no
// surge there (its prices and caps are metered per leaf), and its policies
// go out as its ratios and debts move.
const (
	OfferedRepublish    = 0.2
	OfferedRepublishMin = 5.0
	// FreshOfferedRepublish is OfferedRepublish for an offered rate
	// published as it moved (see freshOffered), without the noise bar;
	// OfferedRepublishMin still holds.
	FreshOfferedRepublish = 0.05
)

// offeredChanged reports whether a listed bucket's global offered rate
// moved from a to b enough to push its policy: a capped bucket's by
// CappedOfferedRepublish, a callee counting cost's not at all, a fresh
// one's (a moving: see freshOffered) by FreshOfferedRepublish, any
// other's by OfferedRepublish and beyond noise.
func offeredChanged(a, b float64, capped, cost, fresh bool) bool {
	switch {
	case capped:
		return (a == 0) != (b == 0) || relChanged(a, b, CappedOfferedRepublish)
	case cost:
		return false
	case (a == 0) != (b == 0):
		return true
	case fresh:
		return math.Abs(a-b) >= OfferedRepublishMin && relChanged(a, b, FreshOfferedRepublish)
	}
	// Beyond noise too: a bucket at 30 rps differs from its last
	// published rate by a fifth about one tick in three.
	d := math.Abs(a - b)
	return d >= OfferedRepublishMin && d > 3*math.Sqrt(max(a, b)) && relChanged(a, b, OfferedRepublish)
}

// CappedOfferedRepublish is the relative change of a capped bucket's
// global offered rate that is pushed at once, noise or not: each sidecar
// holds the cap times its own rate over that one, so a global rate that
// stays low (a fleet's first window, counted part-way through) has every
// sidecar take more than its part, and their shares add up past the cap
// (TestConcurrencyAsProcesses held 12 of 10 for ten seconds, on a first
// rate of 160 rps against 200). A twentieth keeps two sidecars' rounded
// down shares within the cap; a capped callee's policy may go out every
// tick for it, a price its few buckets pay.
const CappedOfferedRepublish = 0.05

// RefreshAge is the age at which an unchanged policy of that resource name
// is issued again, on the first tick from then on: between a quarter and
// half the TTL, fixed per name (refreshStagger).
func RefreshAge(name string, ttl time.Duration) time.Duration {
	return ttl/2 - refreshStagger(name, ttl)
}

// refreshStagger spreads the refreshes of unchanged policies over a quarter
// of the TTL by resource name: every policy first goes out on the same
// tick, and without it every refresh after would too, in one burst every
// half TTL (454 MiB/s against a 211 MiB/s mean at 100,000 sidecars in the
// scale simulation). A hash of the name, so that replicas agree.
func refreshStagger(name string, ttl time.Duration) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(name))
	return time.Duration(h.Sum64() % uint64(max(ttl/4, 1)))
}

func relChanged(a, b, th float64) bool {
	if a == b {
		return false
	}
	return math.Abs(a-b) > th*math.Max(math.Abs(a), math.Abs(b))
}

// Policies returns the policies last published, sorted by name.
func (s *State) Policies() []*sluicev1.DropPolicy {
	out := make([]*sluicev1.DropPolicy, 0, len(s.published))
	for _, name := range slices.Sorted(maps.Keys(s.published)) {
		out = append(out, s.published[name].policy)
	}
	return out
}

// finiteOrAbsent puts a rate on the wire, where absent means unbounded.
func finiteOrAbsent(v float64) *float64 {
	if !finite(v) {
		return nil
	}
	return &v
}

// finite reports whether v is neither infinite nor NaN: whether
// finiteOrAbsent puts it on the wire.
func finite(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }

// modeProto puts a mode on the wire. Limits hold only the two modes (their
// sources parse every mode and refuse others); the law's verdicts echo them.
func modeProto(m dropratio.Mode) sluicev1.Mode {
	if m == dropratio.Shadow {
		return sluicev1.Mode_MODE_SHADOW
	}
	return sluicev1.Mode_MODE_ENFORCE
}

// boundProto puts the level that binds a leaf on the wire; none (an
// unbounded leaf) is the bucket itself.
func boundProto(b dropratio.Bound) sluicev1.DropBound {
	switch b {
	case dropratio.BoundLeaf:
		return sluicev1.DropBound_DROP_BOUND_LEAF
	case dropratio.BoundCaller:
		return sluicev1.DropBound_DROP_BOUND_CALLER
	case dropratio.BoundProcedure:
		return sluicev1.DropBound_DROP_BOUND_PROCEDURE
	case dropratio.BoundCallee:
		return sluicev1.DropBound_DROP_BOUND_CALLEE
	}
	return sluicev1.DropBound_DROP_BOUND_UNSPECIFIED
}

func reasonProto(r dropratio.Reason, ratio float64) sluicev1.DropReason {
	if ratio == 0 {
		return sluicev1.DropReason_DROP_REASON_UNSPECIFIED
	}
	switch r {
	case dropratio.OverLimit:
		return sluicev1.DropReason_DROP_REASON_LIMIT
	case dropratio.OverCapacity:
		return sluicev1.DropReason_DROP_REASON_CAPACITY
	}
	return sluicev1.DropReason_DROP_REASON_UNSPECIFIED
}

// failModeProto puts a fail mode on the wire. Limits hold only the three
// fail modes: limits.Parse and limits.FromHistory refuse any other, naming
// the field. A value beyond them can only come from a hand-built Set; it
// goes out as a value no sidecar knows, which sidecars NACK, keeping the
// policy they have, rather than as UNSPECIFIED, which they read as open.
func failModeProto(f dataplane.FailMode) sluicev1.FailMode {
	switch f {
	case dataplane.FailOpen:
		return sluicev1.FailMode_FAIL_MODE_OPEN
	case dataplane.FailHold:
		return sluicev1.FailMode_FAIL_MODE_HOLD
	case dataplane.FailLocal:
		return sluicev1.FailMode_FAIL_MODE_LOCAL
	}
	return -1
}
