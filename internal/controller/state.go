package controller

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// StateConfig holds what the pure part of the controller needs to know.
type StateConfig struct {
	// StaleAfter is how many of its own flush intervals an aggregator may
	// stay silent before its load leaves the sums.
	StaleAfter int
	// Warmup is how long after start the controller collects zone loads
	// before it publishes anything: a restarted controller must not push
	// ratios computed from half a picture.
	Warmup time.Duration
	// PolicyTTL is the TTL written into every policy. Unchanged policies
	// are re-issued every half TTL so that sidecars can tell a quiet
	// controller from a lost one.
	PolicyTTL time.Duration
	// FailOpenDecay is written into every policy.
	FailOpenDecay time.Duration
	// RepublishThreshold is the relative change of a bucket's admitted
	// share, (1−p), that makes a policy worth pushing before its refresh is
	// due. 0.005 means: push when some caller's admitted rate would move by
	// more than half a percent.
	RepublishThreshold float64
	// MaxAggregators bounds the aggregators whose loads are held.
	MaxAggregators int
	// Law configures the control law.
	Law dropratio.Config
}

// RejectError says why a zone load was refused; Reason is a metric label.
type RejectError struct {
	Reason string
	Detail string
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Detail }

func reject(reason, format string, args ...any) error {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// maxRate bounds any single rate in a zone load: 10^10 rps is more than any
// real fleet sends, so a larger number is a bug or a lie.
const maxRate = 1e10

// State is the controller's logic without goroutines, sockets or clocks:
// zone loads in, drop policies out, time as an argument. Not safe for
// concurrent use; the Service guards it, the simulator drives it directly.
type State struct {
	cfg   StateConfig
	start time.Time
	law   *dropratio.Law

	aggs map[string]*aggregatorLoad

	lastStep  time.Time // zero before the first step
	lastJoin  time.Time // when an aggregator last appeared
	warm      bool
	urgent    bool // set by Apply on a surge; see TakeUrgent
	published map[string]*published
}

type aggregatorLoad struct {
	zone     string
	interval time.Duration
	seen     time.Time
	load     *sluicev1.ZoneLoad
}

type published struct {
	policy    *sluicev1.DropPolicy
	tombstone time.Time // when the policy was emptied because its service vanished; zero while live
}

// NewState returns the state of a controller that starts at now.
func NewState(cfg StateConfig, now time.Time) (*State, error) {
	law, err := dropratio.New(cfg.Law)
	if err != nil {
		return nil, err
	}
	return &State{
		cfg:       cfg,
		start:     now,
		law:       law,
		aggs:      map[string]*aggregatorLoad{},
		published: map[string]*published{},
	}, nil
}

// Apply validates a zone load and makes it its aggregator's current load,
// replacing the previous one: a duplicated or late flush never adds up.
func (s *State) Apply(load *sluicev1.ZoneLoad, now time.Time) error {
	if err := validateZoneLoad(load); err != nil {
		return err
	}
	id := load.GetAggregatorId()
	prev, ok := s.aggs[id]
	if !ok {
		if len(s.aggs) >= s.cfg.MaxAggregators {
			return reject("too_many_aggregators", "already holding %d aggregators", len(s.aggs))
		}
		s.lastJoin = now
		s.urgent = s.urgent || load.GetUrgent()
	} else if !s.urgent {
		s.urgent = load.GetUrgent() || zoneSurged(prev.load, load)
	}
	sortPeers(load)
	s.aggs[id] = &aggregatorLoad{
		zone:     load.GetZone(),
		interval: load.GetInterval().AsDuration(),
		seen:     now,
		load:     load,
	}
	return nil
}

// TakeUrgent reports whether a zone load applied since the last call showed
// a surge — the aggregator marked it urgent, or some bucket's rate in that
// zone jumped (dropratio.Jumped) — and clears the mark. The service ticks
// at once when it is set instead of waiting for the next tick. An
// aggregator's first load is urgent only when it says so.
func (s *State) TakeUrgent() bool {
	u := s.urgent
	s.urgent = false
	return u
}

// sortPeers sorts every service's peers by name, which sum relies on. The
// aggregators send them sorted; a load that is not is sorted in place
// rather than refused.
func sortPeers(load *sluicev1.ZoneLoad) {
	byPeer := func(a, b *sluicev1.PeerRate) int { return strings.Compare(a.GetPeer(), b.GetPeer()) }
	for _, svc := range load.GetServices() {
		if !slices.IsSortedFunc(svc.GetPeers(), byPeer) {
			slices.SortFunc(svc.Peers, byPeer)
		}
	}
}

// zoneSurged reports whether some bucket's offered rate, inbound or
// outbound, jumped from before to after, up or down (dropratio.Jumped); a
// bucket missing from one of them had rate 0 there.
func zoneSurged(before, after *sluicev1.ZoneLoad) bool {
	type bucket struct {
		service, peer string
		dir           sluicev1.Direction
	}
	rates := func(z *sluicev1.ZoneLoad) map[bucket]float64 {
		m := map[bucket]float64{}
		for _, svc := range z.GetServices() {
			for _, p := range svc.GetPeers() {
				m[bucket{svc.GetService(), p.GetPeer(), svc.GetDirection()}] = p.GetOfferedRps()
			}
		}
		return m
	}
	old, cur := rates(before), rates(after)
	for b, r := range cur {
		if dropratio.Jumped(old[b], r) {
			return true
		}
	}
	for b, r := range old {
		if _, ok := cur[b]; !ok && dropratio.Jumped(r, 0) {
			return true
		}
	}
	return false
}

// Remove forgets an aggregator at once, e.g. when its stream ended: its
// sidecars reconnect elsewhere and must not be counted twice meanwhile.
func (s *State) Remove(aggregatorID string) { delete(s.aggs, aggregatorID) }

// Aggregators is the number of aggregators whose loads are held.
func (s *State) Aggregators() int { return len(s.aggs) }

// Warm reports whether the warm-up after start is over at now: Warmup has
// passed, and no aggregator has joined for half of it, so that aggregators
// still reconnecting after a restart are in the picture. Aggregators that
// keep joining can hold it back to three Warmups at most. Once warm, warm.
func (s *State) Warm(now time.Time) bool {
	if !s.warm {
		up := now.Sub(s.start)
		settled := s.lastJoin.IsZero() || now.Sub(s.lastJoin) >= s.cfg.Warmup/2
		s.warm = up >= s.cfg.Warmup && settled || up >= 3*s.cfg.Warmup
	}
	return s.warm
}

func validateZoneLoad(z *sluicev1.ZoneLoad) error {
	if err := names.Check(z.GetAggregatorId()); err != nil {
		return reject("bad_name", "aggregator_id: %v", err)
	}
	if err := names.Check(z.GetZone()); err != nil {
		return reject("bad_name", "zone: %v", err)
	}
	if iv := z.GetInterval(); iv == nil || iv.CheckValid() != nil || iv.AsDuration() < 10*time.Millisecond || iv.AsDuration() > time.Minute {
		return reject("bad_interval", "interval %v is outside [10ms, 1m]", iv.AsDuration())
	}
	type key struct {
		service string
		dir     sluicev1.Direction
	}
	seen := make(map[key]bool, len(z.GetServices()))
	for i, svc := range z.GetServices() {
		if err := names.Check(svc.GetService()); err != nil || svc.GetService() == names.Overflow {
			return reject("bad_name", "services[%d].service: %v", i, errOr(err, "reserved name"))
		}
		d := svc.GetDirection()
		if d != sluicev1.Direction_DIRECTION_INBOUND && d != sluicev1.Direction_DIRECTION_OUTBOUND {
			return reject("bad_direction", "services[%d].direction: %v", i, d)
		}
		k := key{svc.GetService(), d}
		if seen[k] {
			return reject("duplicate_service", "services[%d]: %s %v listed twice", i, k.service, d)
		}
		seen[k] = true
		peers := make(map[string]bool, len(svc.GetPeers()))
		for j, p := range svc.GetPeers() {
			if err := names.Check(p.GetPeer()); err != nil {
				return reject("bad_name", "services[%d].peers[%d].peer: %v", i, j, err)
			}
			if peers[p.GetPeer()] {
				return reject("duplicate_peer", "services[%d].peers[%d]: %q listed twice", i, j, p.GetPeer())
			}
			peers[p.GetPeer()] = true
			for _, r := range []struct {
				field string
				v     float64
			}{{"offered_rps", p.GetOfferedRps()}, {"dropped_rps", p.GetDroppedRps()}, {"shadow_dropped_rps", p.GetShadowDroppedRps()}} {
				if math.IsNaN(r.v) || r.v < 0 || r.v > maxRate {
					return reject("bad_rate", "services[%d].peers[%d].%s: %v is outside [0, %g]", i, j, r.field, r.v, maxRate)
				}
			}
		}
	}
	return nil
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}

// Totals is a bucket's global load, summed over live aggregators.
type Totals struct {
	Offered, Dropped, ShadowDropped float64
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
	// Stale names aggregators this tick dropped for silence.
	Stale []string
	// Services holds the global load per callee, for metrics.
	Services map[string]Totals
	// Loads holds the global load of every observed bucket, sorted, for
	// the history recorder.
	Loads []BucketLoad
}

// BucketLoad is one bucket's global load in one tick.
type BucketLoad struct {
	Callee, Caller string
	Totals
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

	loads := s.sum()
	inbound, live := loads.buckets, loads.live
	services := lawInput(inbound, set)
	var dt time.Duration
	if !s.lastStep.IsZero() {
		dt = now.Sub(s.lastStep)
	} else {
		s.seed(inbound)
	}
	s.lastStep = now
	verdicts := s.law.Step(dt, services)

	res.Changed = map[string]*sluicev1.DropPolicy{}
	res.Services = make(map[string]Totals, len(verdicts))
	current := make(map[string]bool, len(verdicts))
	for _, sv := range verdicts {
		var tot Totals
		for _, p := range inbound[sv.Service] {
			tot.Offered += p.Offered
			tot.Dropped += p.Dropped
			tot.ShadowDropped += p.ShadowDropped
			res.Loads = append(res.Loads, BucketLoad{Callee: sv.Service, Caller: p.peer, Totals: p.Totals})
		}
		res.Services[sv.Service] = tot
		res.Buckets += len(sv.Verdicts)
		policy := s.policy(sv, live[sv.Service], set.Service(sv.Service), now)
		current[policy.GetName()] = true
		if s.due(policy, now) {
			s.published[policy.GetName()] = &published{policy: policy}
			res.Changed[policy.GetName()] = policy
		}
	}
	for _, policy := range s.callerPolicies(verdicts, loads.outLive, set, now) {
		current[policy.GetName()] = true
		if s.due(policy, now) {
			s.published[policy.GetName()] = &published{policy: policy}
			res.Changed[policy.GetName()] = policy
		}
	}
	// Services that vanished (no traffic, no limits, ratios released): an
	// empty policy first, so state-of-the-world clients, which never hear
	// of deletions, stop dropping; the resource itself goes a TTL later.
	for _, name := range sortedKeys(s.published) {
		p := s.published[name]
		if current[name] {
			continue
		}
		switch {
		case p.tombstone.IsZero():
			empty := &sluicev1.DropPolicy{
				Name: name, Service: p.policy.GetService(), Direction: p.policy.GetDirection(),
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
func (s *State) seed(inbound map[string][]peerTotals) {
	for svc, peers := range inbound {
		for _, p := range peers {
			if p.Offered > 0 {
				s.law.Seed(svc, p.peer, (p.Dropped+p.ShadowDropped)/p.Offered)
			}
		}
	}
}

// peerTotals is one bucket's load during a tick.
type peerTotals struct {
	Totals
	peer string
}

// tickLoads is what one tick sums from the live aggregators' zone loads.
type tickLoads struct {
	// buckets holds each callee's load per caller, sorted by caller: what
	// reached the callee's inbound sidecars undecided plus what callers
	// enforcing outbound offered it (see combine).
	buckets map[string][]peerTotals
	live    map[string]uint32 // per callee: live inbound sidecars
	outLive map[string]uint32 // per caller: live instances enforcing outbound
}

// sum adds up the live aggregators' loads, in sorted aggregator order: float
// sums depend on order, and every controller replica must compute the same
// ratios from the same inputs.
//
// Each zone load lists a service's peers sorted (Apply sees to it), so a
// service's peers are merged across aggregators rather than hashed: at
// 110,000 buckets from a dozen aggregators, a map keyed by (service, peer)
// was most of a tick.
func (s *State) sum() tickLoads {
	// Indexed by direction: 0 inbound (service = callee, peers = callers),
	// 1 outbound (service = caller, peers = callees).
	var perService [2]map[string][]*sluicev1.ServiceLoad // in aggregator order
	var live [2]map[string]uint32
	for d := range perService {
		perService[d], live[d] = map[string][]*sluicev1.ServiceLoad{}, map[string]uint32{}
	}
	for _, id := range sortedKeys(s.aggs) {
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
			merged[d][name] = mergePeers(loads)
		}
	}
	return tickLoads{buckets: combine(merged[0], merged[1]), live: live[0], outLive: live[1]}
}

// mergePeers adds up one service's peers across the zone loads of several
// aggregators, each sorted by peer; the result is sorted by peer too.
func mergePeers(loads []*sluicev1.ServiceLoad) []peerTotals {
	heads := make([]int, len(loads))
	var merged []peerTotals
	for {
		// The smallest peer at the heads; its rates are added in
		// aggregator order.
		peer, found := "", false
		for k, l := range loads {
			if h := heads[k]; h < len(l.GetPeers()) && (!found || l.GetPeers()[h].GetPeer() < peer) {
				peer, found = l.GetPeers()[h].GetPeer(), true
			}
		}
		if !found {
			return merged
		}
		t := peerTotals{peer: peer}
		for k, l := range loads {
			if h := heads[k]; h < len(l.GetPeers()) && l.GetPeers()[h].GetPeer() == peer {
				p := l.GetPeers()[h]
				t.Offered += p.GetOfferedRps()
				t.Dropped += p.GetDroppedRps()
				t.ShadowDropped += p.GetShadowDroppedRps()
				heads[k]++
			}
		}
		merged = append(merged, t)
	}
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
// Sums are in a fixed order, inbound first, callers sorted.
func combine(inbound, outbound map[string][]peerTotals) map[string][]peerTotals {
	if len(outbound) == 0 {
		return inbound
	}
	byCallee := map[string][]peerTotals{} // sorted by caller: callers are visited sorted
	for _, caller := range sortedKeys(outbound) {
		for _, p := range outbound[caller] {
			if p.peer == names.Unknown || p.peer == names.Overflow {
				continue
			}
			byCallee[p.peer] = append(byCallee[p.peer], peerTotals{Totals: p.Totals, peer: caller})
		}
	}
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
			case j == len(outb) || i < len(in) && in[i].peer < outb[j].peer:
				merged = append(merged, in[i])
				i++
			case i == len(in) || outb[j].peer < in[i].peer:
				merged = append(merged, outb[j])
				j++
			default: // the same caller on both sides
				t := in[i]
				t.Offered += outb[j].Offered
				t.Dropped += outb[j].Dropped
				t.ShadowDropped += outb[j].ShadowDropped
				merged = append(merged, t)
				i, j = i+1, j+1
			}
		}
		out[callee] = merged
	}
	return out
}

// lawInput joins observed load with configured limits: every callee with
// traffic or limits, every caller with traffic or a limit of its own.
func lawInput(inbound map[string][]peerTotals, set *limits.Set) []dropratio.Service {
	callees := map[string]bool{}
	for svc := range inbound {
		callees[svc] = true
	}
	for _, svc := range set.Services() {
		callees[svc] = true
	}
	out := make([]dropratio.Service, 0, len(callees))
	for _, name := range sortedKeys(callees) {
		lim := set.Service(name)
		svc := dropratio.Service{Name: name, Capacity: math.Inf(1)}
		if lim != nil {
			svc.Capacity = lim.Capacity
		}
		seen := map[string]bool{}
		for _, p := range inbound[name] {
			b := lim.Bucket(p.peer)
			svc.Callers = append(svc.Callers, dropratio.Caller{Name: p.peer, Offered: p.Offered, Limit: b.Limit, Mode: b.Mode})
			seen[p.peer] = true
		}
		if lim != nil {
			for _, caller := range sortedKeys(lim.Callers) {
				if !seen[caller] {
					b := lim.Callers[caller]
					svc.Callers = append(svc.Callers, dropratio.Caller{Name: caller, Limit: b.Limit, Mode: b.Mode})
				}
			}
		}
		out = append(out, svc)
	}
	return out
}

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
	}
	if lim != nil {
		p.FailMode = failModeProto(lim.FailMode)
	}
	for _, v := range sv.Verdicts {
		pp := &sluicev1.PeerPolicy{
			Peer:       v.Caller,
			DropRatio:  v.Ratio,
			Mode:       modeProto(v.Mode),
			LimitRps:   finiteOrAbsent(v.Limit),
			AllowedRps: finiteOrAbsent(v.Allowed),
			OfferedRps: v.Offered,
			Reason:     reasonProto(v.Reason, v.Ratio),
		}
		markUpstream(pp, v.Mode, lim.Bucket(v.Caller))
		p.Peers = append(p.Peers, pp)
	}
	return p
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
// are connected, so that replicas agree.
func markUpstream(pp *sluicev1.PeerPolicy, mode dropratio.Mode, b limits.Bucket) {
	if mode == dropratio.Enforce && b.Enforcement == limits.EnforceUpstream {
		pp.Mode = sluicev1.Mode_MODE_SHADOW
		pp.EnforcedUpstream = true
	}
}

// callerPolicies builds the outbound policy, caller/<caller>, of every
// caller that enforces outbound (outLive: its live instances), sorted by
// caller: its rules are the buckets' verdicts where it is the caller, one
// per callee, with the same ratio the callee's inbound policy carries for
// it (see combine). Verdicts come sorted by callee, so each caller's rules
// are too.
//
// A policy has one fail mode while its callees may each have their own: the
// callees' common fail mode when they agree, else open, the default.
func (s *State) callerPolicies(verdicts []dropratio.ServiceVerdict, outLive map[string]uint32, set *limits.Set, now time.Time) []*sluicev1.DropPolicy {
	if len(outLive) == 0 {
		return nil
	}
	policies := make(map[string]*sluicev1.DropPolicy, len(outLive))
	failModes := make(map[string]string, len(outLive)) // "" before the first callee, "mixed" once they differ
	for _, caller := range sortedKeys(outLive) {
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
		fm := limits.FailOpen
		if lim := set.Service(sv.Service); lim != nil {
			fm = lim.FailMode
		}
		for _, v := range sv.Verdicts {
			p := policies[v.Caller]
			if p == nil {
				continue
			}
			p.Peers = append(p.Peers, &sluicev1.PeerPolicy{
				Peer:       sv.Service,
				DropRatio:  v.Ratio,
				Mode:       modeProto(v.Mode),
				LimitRps:   finiteOrAbsent(v.Limit),
				AllowedRps: finiteOrAbsent(v.Allowed),
				OfferedRps: v.Offered,
				Reason:     reasonProto(v.Reason, v.Ratio),
			})
			switch failModes[v.Caller] {
			case "":
				failModes[v.Caller] = fm
			case fm, "mixed":
			default:
				failModes[v.Caller] = "mixed"
			}
		}
	}
	out := make([]*sluicev1.DropPolicy, 0, len(policies))
	for _, caller := range sortedKeys(policies) {
		p := policies[caller]
		if fm := failModes[caller]; fm != "" && fm != "mixed" {
			p.FailMode = failModeProto(fm)
		}
		out = append(out, p)
	}
	return out
}

// due says whether policy differs enough from what was last published, or
// the last publication is half a TTL old.
func (s *State) due(policy *sluicev1.DropPolicy, now time.Time) bool {
	last, ok := s.published[policy.GetName()]
	if !ok || !last.tombstone.IsZero() {
		return true
	}
	old := last.policy
	if now.Sub(old.GetIssuedAt().AsTime()) >= s.cfg.PolicyTTL/2-refreshStagger(policy.GetName(), s.cfg.PolicyTTL) {
		return true
	}
	if old.GetLiveInstances() != policy.GetLiveInstances() || old.GetFailMode() != policy.GetFailMode() ||
		len(old.GetPeers()) != len(policy.GetPeers()) {
		return true
	}
	th := s.cfg.RepublishThreshold
	for i, np := range policy.GetPeers() {
		op := old.GetPeers()[i]
		if op.GetPeer() != np.GetPeer() || op.GetMode() != np.GetMode() || op.GetEnforcedUpstream() != np.GetEnforcedUpstream() ||
			(op.LimitRps == nil) != (np.LimitRps == nil) ||
			op.GetLimitRps() != np.GetLimitRps() || (op.AllowedRps == nil) != (np.AllowedRps == nil) || op.GetReason() != np.GetReason() {
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
		if relChanged(op.GetAllowedRps(), np.GetAllowedRps(), th) {
			return true
		}
	}
	return false
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
	for _, name := range sortedKeys(s.published) {
		out = append(out, s.published[name].policy)
	}
	return out
}

// finiteOrAbsent puts a rate on the wire, where absent means unbounded.
func finiteOrAbsent(v float64) *float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return nil
	}
	return &v
}

func modeProto(m dropratio.Mode) sluicev1.Mode {
	if m == dropratio.Shadow {
		return sluicev1.Mode_MODE_SHADOW
	}
	return sluicev1.Mode_MODE_ENFORCE
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

func failModeProto(m string) sluicev1.FailMode {
	switch m {
	case limits.FailHold:
		return sluicev1.FailMode_FAIL_MODE_HOLD
	case limits.FailLocal:
		return sluicev1.FailMode_FAIL_MODE_LOCAL
	}
	return sluicev1.FailMode_FAIL_MODE_OPEN
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
