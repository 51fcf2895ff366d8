package controller

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// mixedLoad builds a flush of one aggregator with both directions: in maps
// "callee/caller" to the offered rps the callee's inbound sidecars counted,
// out maps "caller/callee" to what the caller offered, enforcing outbound;
// dropped, when set, maps the same keys to dropped rps. live counts the
// sidecars (or outbound-enforcing instances) behind each service.
func mixedLoad(agg string, live uint32, in, out, dropped map[string]float64) *sluicev1.ZoneLoad {
	z := &sluicev1.ZoneLoad{AggregatorId: agg, Zone: "zone-" + agg, Interval: durationpb.New(time.Second)}
	for _, side := range []struct {
		dir   sluicev1.Direction
		rates map[string]float64
	}{{sluicev1.Direction_DIRECTION_INBOUND, in}, {sluicev1.Direction_DIRECTION_OUTBOUND, out}} {
		bySvc := map[string]*sluicev1.ServiceLoad{}
		for _, key := range slices.Sorted(maps.Keys(side.rates)) {
			svc, peer, _ := strings.Cut(key, "/")
			sl := bySvc[svc]
			if sl == nil {
				sl = &sluicev1.ServiceLoad{Service: svc, Direction: side.dir, LiveSidecars: live}
				bySvc[svc] = sl
				z.Services = append(z.Services, sl)
			}
			pr := &sluicev1.PeerRate{Peer: peer, OfferedRps: side.rates[key]}
			if side.dir == sluicev1.Direction_DIRECTION_OUTBOUND {
				pr.DroppedRps = dropped[key]
			}
			sl.Peers = append(sl.Peers, pr)
		}
	}
	return z
}

// The bucket checkout/web over two zones: web enforces outbound and offers
// 300 + 200 rps; checkout's inbound sidecars see web's admitted calls marked
// as decided, so they count only batch. The controller runs the law on the
// outbound 500 rps, and gives web's outbound policy and checkout's inbound
// policy the same ratio for the bucket.
func TestOutboundPublishesCallerPolicies(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	for _, z := range []*sluicev1.ZoneLoad{
		mixedLoad("a", 2, map[string]float64{"checkout/batch": 30}, map[string]float64{"web/checkout": 300}, nil),
		mixedLoad("b", 3, map[string]float64{"checkout/batch": 20}, map[string]float64{"web/checkout": 200}, nil),
	} {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	res := s.Tick(now, checkoutLimits())

	in, out := res.Changed["callee/checkout"], res.Changed["caller/web"]
	if in == nil || out == nil {
		t.Fatalf("published %v, want callee/checkout and caller/web", slices.Sorted(maps.Keys(res.Changed)))
	}
	if len(res.Changed) != 2 {
		t.Errorf("published %v, want only callee/checkout and caller/web", slices.Sorted(maps.Keys(res.Changed)))
	}
	if out.GetService() != "web" || out.GetDirection() != sluicev1.Direction_DIRECTION_OUTBOUND || out.GetLiveInstances() != 5 {
		t.Errorf("caller/web: service %q, direction %v, live %d; want web, OUTBOUND, 5", out.GetService(), out.GetDirection(), out.GetLiveInstances())
	}
	if len(out.GetPeers()) != 1 || out.GetPeers()[0].GetPeer() != "checkout" {
		t.Fatalf("caller/web peers %v, want checkout only", out.GetPeers())
	}
	o := out.GetPeers()[0]
	if math.Abs(o.GetDropRatio()-0.8) > 1e-9 || o.GetOfferedRps() != 500 || o.GetLimitRps() != 100 || o.GetAllowedRps() != 100 ||
		o.GetReason() != sluicev1.DropReason_DROP_REASON_LIMIT {
		t.Errorf("caller/web → checkout: %v, want ratio 0.8 on 500 rps against 100", o)
	}
	if w := peer(in, "web"); w == nil || w.GetDropRatio() != o.GetDropRatio() || w.GetOfferedRps() != 500 {
		t.Errorf("callee/checkout → web: %v, want the same ratio and offered rate as caller/web's", w)
	}
	if b := peer(in, "batch"); b != nil {
		t.Errorf("callee/checkout → batch: %v, want it left out: no limit, no ratio", b)
	}
	if in.GetLiveInstances() != 5 {
		t.Errorf("callee/checkout live %d, want its inbound sidecars' 2 + 3", in.GetLiveInstances())
	}
	// The sidecars accept both.
	for name, m := range res.Changed {
		p, err := sidecar.PolicyFromProto(m)
		if err != nil {
			t.Fatalf("%s: the sidecar refuses it: %v", name, err)
		}
		if name == "caller/web" && (p.Direction != sidecar.Outbound || p.Rule("checkout") == nil) {
			t.Errorf("caller/web as the sidecar reads it: %+v", p)
		}
	}
	// History and metrics see the bucket once, at what the caller offered.
	if got := res.Services["checkout"].Offered; got != 550 {
		t.Errorf("checkout offered %v rps in the totals, want 550 (500 web outbound + 50 batch inbound)", got)
	}
	var webRows int
	for _, l := range res.Loads {
		if l.Callee == "checkout" && l.Caller == "web" {
			webRows++
			if l.Offered != 500 {
				t.Errorf("history row checkout/web offered %v, want 500", l.Offered)
			}
		}
		if l.Callee == "web" {
			t.Errorf("history row %+v: web is a caller, not a callee", l)
		}
	}
	if webRows != 1 {
		t.Errorf("%d history rows for checkout/web, want 1", webRows)
	}
}

// A fleet where some of web's instances enforce outbound and others do not:
// the unmarked calls reach checkout's inbound sidecars and are counted
// there, the outbound ones only at the caller; the bucket's load is the sum,
// and the one ratio, applied by each side to what it decides, admits the
// limit in total.
func TestOutboundAndInboundAddUp(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	z := mixedLoad("a", 1,
		map[string]float64{"checkout/web": 200},
		map[string]float64{"web/checkout": 300},
		map[string]float64{"web/checkout": 30})
	if err := s.Apply(z, now); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(now, checkoutLimits())
	in, out := peer(res.Changed["callee/checkout"], "web"), peer(res.Changed["caller/web"], "checkout")
	if in == nil || out == nil {
		t.Fatalf("published %v", res.Changed)
	}
	const offered = 500.0 // 200 unmarked inbound + 300 outbound
	if in.GetOfferedRps() != offered || out.GetOfferedRps() != offered {
		t.Errorf("offered %v inbound, %v outbound; want %v both", in.GetOfferedRps(), out.GetOfferedRps(), offered)
	}
	p := in.GetDropRatio()
	if p != out.GetDropRatio() {
		t.Errorf("ratios differ: inbound %v, outbound %v", p, out.GetDropRatio())
	}
	// Each side applies p to what it decides: admitted in total is the
	// limit, not twice it, and nothing is dropped twice.
	if admitted := (1-p)*200 + (1-p)*300; math.Abs(admitted-100) > 1e-6 {
		t.Errorf("the two sides admit %v rps together at ratio %v, want the limit 100", admitted, p)
	}
	if got := res.Services["checkout"]; got.Offered != offered || got.Dropped != 30 {
		t.Errorf("checkout totals %+v, want 500 offered, 30 dropped", got)
	}
}

// Calls whose callee the caller could not name (unknown) or beyond its peer
// table (_overflow) are left out: no limit names them, and a policy for a
// service called "unknown" would be noise.
func TestOutboundIgnoresUnnamedCallees(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	z := mixedLoad("a", 1, nil, map[string]float64{"web/unknown": 70, "web/_overflow": 9, "web/orders": 5}, nil)
	if err := s.Apply(z, now); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(now, limits.NewSet(map[string]*limits.Service{
		"orders": {
			Name: "orders", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{"web": {Limit: 100, Mode: dropratio.Enforce}},
		},
	}))
	for name := range res.Changed {
		if name != "caller/web" && name != "callee/orders" {
			t.Errorf("published %s", name)
		}
	}
	if ps := res.Changed["caller/web"].GetPeers(); len(ps) != 1 || ps[0].GetPeer() != "orders" {
		t.Errorf("caller/web peers %v, want orders only", ps)
	}
	for _, l := range res.Loads {
		if l.Callee == "unknown" || l.Callee == "_overflow" {
			t.Errorf("history row %+v", l)
		}
	}
}

// A caller's outbound policy lists every callee whose limits name it, even
// before it sends them anything, so that a blocked bucket is blocked from
// the first call; its fail mode is its callees' when they agree.
func TestOutboundPolicyListsLimitedCallees(t *testing.T) {
	limitsWith := func(ordersFailMode dataplane.FailMode) *limits.Set {
		return limits.NewSet(map[string]*limits.Service{
			"checkout": {
				Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailHold,
				Callers: map[string]limits.Bucket{"web": {Limit: 100, Mode: dropratio.Enforce}},
			},
			"orders": {
				Name: "orders", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: ordersFailMode,
				Callers: map[string]limits.Bucket{"web": {Limit: 0, Mode: dropratio.Enforce}},
			},
		})
	}
	set := limitsWith(dataplane.FailHold)
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	if err := s.Apply(mixedLoad("a", 4, nil, map[string]float64{"web/checkout": 50}, nil), now); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(now, set)
	out := res.Changed["caller/web"]
	if got := []string{peerName(out, 0), peerName(out, 1)}; got[0] != "checkout" || got[1] != "orders" || len(out.GetPeers()) != 2 {
		t.Fatalf("caller/web peers %v, want checkout and orders", out.GetPeers())
	}
	if o := out.GetPeers()[1]; o.LimitRps == nil || o.GetLimitRps() != 0 {
		t.Errorf("web → orders: %v, want the blocking limit 0", o)
	}
	if out.GetFailMode() != sluicev1.FailMode_FAIL_MODE_HOLD {
		t.Errorf("fail mode %v, want hold: both callees say hold", out.GetFailMode())
	}

	// Callees that disagree: the default, open.
	now = now.Add(time.Second)
	if err := s.Apply(mixedLoad("a", 4, nil, map[string]float64{"web/checkout": 50}, nil), now); err != nil {
		t.Fatal(err)
	}
	res = s.Tick(now, limitsWith(dataplane.FailLocal))
	if m := res.Changed["caller/web"]; m == nil || m.GetFailMode() != sluicev1.FailMode_FAIL_MODE_OPEN {
		t.Errorf("caller/web with callees in hold and local: %v, want fail mode open", m)
	}
}

func peerName(p *sluicev1.DropPolicy, i int) string {
	if i < len(p.GetPeers()) {
		return p.GetPeers()[i].GetPeer()
	}
	return ""
}

// A caller that stops enforcing outbound (its loads go stale) gets an empty
// caller policy first, then the resource is deleted a TTL later, as callee
// policies are.
func TestOutboundCallerVanishes(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	if err := s.Apply(mixedLoad("a", 1, nil, map[string]float64{"web/checkout": 500}, nil), now); err != nil {
		t.Fatal(err)
	}
	if res := s.Tick(now, checkoutLimits()); res.Changed["caller/web"] == nil {
		t.Fatal("no caller/web")
	}
	now = now.Add(5 * time.Second) // the aggregator has gone stale
	res := s.Tick(now, checkoutLimits())
	tomb := res.Changed["caller/web"]
	if tomb == nil || len(tomb.GetPeers()) != 0 || tomb.GetDirection() != sluicev1.Direction_DIRECTION_OUTBOUND {
		t.Fatalf("caller/web after its caller went silent: %v, want an empty outbound policy", tomb)
	}
	deleted := false
	for range 12 {
		now = now.Add(time.Second)
		res = s.Tick(now, checkoutLimits())
		if len(res.Deleted) > 0 {
			deleted = res.Deleted[0] == "caller/web"
			break
		}
	}
	if !deleted {
		t.Errorf("caller/web was not deleted a TTL after its tombstone")
	}
}

// A surge in an outbound bucket ticks at once, as an inbound one does.
func TestOutboundSurgeIsUrgent(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	s.Apply(mixedLoad("a", 1, nil, map[string]float64{"web/checkout": 50}, nil), now)
	s.TakeUrgent()
	s.Apply(mixedLoad("a", 1, nil, map[string]float64{"web/checkout": 500}, nil), now.Add(100*time.Millisecond))
	if !s.TakeUrgent() {
		t.Error("web's outbound rate went from 50 to 500 rps, and the controller did not mark it urgent")
	}
}

// Replicas agree: the same zone loads, applied in any order, publish the
// same policies, to the bit, with sums that depend on the order of float
// additions.
func TestOutboundDeterministic(t *testing.T) {
	loads := []*sluicev1.ZoneLoad{
		mixedLoad("a", 1, map[string]float64{"checkout/web": 0.1, "orders/web": 1e-9}, map[string]float64{"web/checkout": 0.2, "web/orders": 1}, nil),
		mixedLoad("b", 2, map[string]float64{"checkout/web": 0.3}, map[string]float64{"web/checkout": 1e9, "mobile/checkout": 3}, nil),
		mixedLoad("c", 3, map[string]float64{"checkout/mobile": 7}, map[string]float64{"web/checkout": 1, "web/orders": 1e9}, nil),
	}
	run := func(order []int) TickResult {
		s := warmState(t)
		now := t0.Add(2 * time.Second)
		for _, i := range order {
			if err := s.Apply(proto.Clone(loads[i]).(*sluicev1.ZoneLoad), now); err != nil {
				t.Fatal(err)
			}
		}
		return s.Tick(now, checkoutLimits())
	}
	want := run([]int{0, 1, 2})
	for _, order := range [][]int{{2, 1, 0}, {1, 0, 2}, {2, 0, 1}} {
		got := run(order)
		if len(got.Changed) != len(want.Changed) {
			t.Fatalf("order %v: %d policies, want %d", order, len(got.Changed), len(want.Changed))
		}
		for name, p := range want.Changed {
			if !proto.Equal(got.Changed[name], p) {
				t.Errorf("order %v: %s differs:\n got %v\nwant %v", order, name, got.Changed[name], p)
			}
		}
	}
	if want.Changed["caller/mobile"] == nil || want.Changed["caller/web"] == nil {
		t.Errorf("published %v, want caller/mobile and caller/web among them", slices.Sorted(maps.Keys(want.Changed)))
	}
}

// Outbound claims toward a callee with a capacity count only for buckets
// with a finite limit: abuser, with no limit at checkout, claims 10^9 rps
// of outbound calls to it, and before this the claim entered checkout's
// capacity split and cut victim, under its limit, from 100 to 75 rps.
// With a limit of its own, or checkout's default limit, the claim counts
// (it takes at most that limit from the split); toward a callee without a
// capacity it counts too, cutting no one.
func TestOutboundClaimsNeedALimitUnderCapacity(t *testing.T) {
	const claim = 1e9
	in := map[string]float64{"checkout/victim": 100, "checkout/web": 50}
	out := map[string]float64{"abuser/checkout": claim}
	for _, tc := range []struct {
		name    string
		limits  string
		trusted bool
	}{
		{"capacity, no limit", `
services:
  checkout:
    capacity: 200
    callers: {victim: {limit: 100}, web: {limit: 50}}
`, false},
		{"capacity, own limit", `
services:
  checkout:
    capacity: 200
    callers: {victim: {limit: 100}, web: {limit: 50}, abuser: {limit: 10}}
`, true},
		{"capacity, default limit", `
services:
  checkout:
    capacity: 200
    default_limit: 10
    callers: {victim: {limit: 100}, web: {limit: 50}}
`, true},
		{"no capacity", `
services:
  checkout:
    callers: {victim: {limit: 100}, web: {limit: 50}}
`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := parseLimits(t, tc.limits)
			s := warmState(t)
			now := t0.Add(2 * time.Second)
			if err := s.Apply(mixedLoad("a", 1, in, out, nil), now); err != nil {
				t.Fatal(err)
			}
			// The law's input: the claim is in abuser's bucket or nowhere.
			loads := s.sum(set)
			var offered float64
			for _, p := range loads.buckets["checkout"] {
				if p.peer == "abuser" {
					offered = p.Offered
				}
			}
			wantRefused := []RefusedClaim{{BucketLoad{Callee: "checkout", Caller: "abuser", Totals: Totals{Offered: claim}}, RefusedNoLimit}}
			if tc.trusted {
				wantRefused = nil
				if offered != claim {
					t.Errorf("checkout/abuser offered %v in the law's input, want the claim %v", offered, claim)
				}
			} else if offered != 0 {
				t.Errorf("checkout/abuser offered %v in the law's input, want none: the claim is refused", offered)
			}
			if !slices.Equal(loads.refused, wantRefused) {
				t.Errorf("refused %v, want %v", loads.refused, wantRefused)
			}

			res := s.Tick(now, set)
			if !slices.Equal(res.RefusedClaims, wantRefused) {
				t.Errorf("TickResult.RefusedClaims %v, want %v", res.RefusedClaims, wantRefused)
			}
			p := res.Changed["callee/checkout"]
			for _, caller := range []string{"victim", "web"} {
				if r := peerRatio(p, caller); r != 0 {
					t.Errorf("%s, under its limit, got ratio %v: the claim cut it", caller, r)
				}
			}
		})
	}
}

// TestOutboundTowardProcedures (issue 14): web enforces outbound toward
// checkout, which declares procedures, and offers it 150 rps of charges;
// web's _other leaf has a limit of 10. Outbound claims carry no
// procedure, so before this they all landed in web's _other leaf: its
// ratio, 0.933, went out as web's outbound rule and cut every call of web
// to checkout to 10 rps, while web's create-charge leaf limit (50) never
// applied. Now the controller publishes web no rule toward checkout and
// leaves its claims out of the law (counted, reason callee_procedures);
// checkout's sidecars, ignoring the decided mark, count the calls in
// their leaf, and the leaf limit holds. A callee without procedures keeps
// its outbound rule.
func TestOutboundTowardProcedures(t *testing.T) {
	set := procLimits(func(s *limits.Service) {
		s.Procedures[names.Other].Callers = map[string]float64{"web": 10}
	})
	orders := &limits.Service{Name: "orders", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
		Callers: map[string]limits.Bucket{"web": {Limit: 20, Mode: dropratio.Enforce}}}
	set = limits.NewSet(map[string]*limits.Service{"checkout": set.Service("checkout"), "orders": orders})

	s := warmState(t)
	now := t0.Add(2 * time.Second)
	for _, z := range []*sluicev1.ZoneLoad{
		mixedLoad("a", 1, nil, map[string]float64{"web/checkout": 150, "web/orders": 40}, nil),
		leafLoad("b", map[string]float64{"checkout/web/create-charge": 150}),
	} {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	loads := s.sum(set)
	for _, p := range loads.buckets["checkout"] {
		if p.peer == "web" && p.procedure != "create-charge" {
			t.Errorf("checkout/web/%s offered %v in the law's input, want only the create-charge leaf", p.procedure, p.Offered)
		}
	}
	wantRefused := []RefusedClaim{{BucketLoad{Callee: "checkout", Caller: "web", Totals: Totals{Offered: 150}}, RefusedProcedures}}
	if !slices.Equal(loads.refused, wantRefused) {
		t.Errorf("refused %v, want %v", loads.refused, wantRefused)
	}

	res := s.Tick(now, set)
	out := res.Changed["caller/web"]
	if out == nil || len(out.GetPeers()) != 1 || out.GetPeers()[0].GetPeer() != "orders" {
		t.Fatalf("outbound policy %v, want a rule toward orders alone", out)
	}
	if r := out.GetPeers()[0].GetDropRatio(); math.Abs(r-0.5) > 1e-9 {
		t.Errorf("web's rule toward orders: ratio %v, want 0.5", r)
	}
	in := res.Changed["callee/checkout"]
	wantRatio(t, in, "web", "create-charge", 1-50.0/150)
	if pp := leafOf(in, "web", names.Other); pp.GetDropRatio() != 0 {
		t.Errorf("web/_other = %v, want ratio 0: no claim lands there", pp)
	}
}
