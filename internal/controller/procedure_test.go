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
	"github.com/sluicehq/sluice/pkg/routes"
)

// leafLoad builds a flush of one aggregator: rates maps bucket paths,
// "service/peer/procedure" (the procedure is everything after the second
// '/', so "checkout/web//shop.Checkout/Pay" works) or "service/peer", to
// offered rps.
func leafLoad(agg string, rates map[string]float64) *sluicev1.ZoneLoad {
	z := &sluicev1.ZoneLoad{AggregatorId: agg, Zone: "zone-" + agg, Interval: durationpb.New(time.Second)}
	bySvc := map[string]*sluicev1.ServiceLoad{}
	for _, key := range slices.Sorted(maps.Keys(rates)) {
		svc, rest, _ := strings.Cut(key, "/")
		peer, proc, _ := strings.Cut(rest, "/")
		sl := bySvc[svc]
		if sl == nil {
			sl = &sluicev1.ServiceLoad{Service: svc, Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 1}
			bySvc[svc] = sl
			z.Services = append(z.Services, sl)
		}
		sl.Peers = append(sl.Peers, &sluicev1.PeerRate{Peer: peer, Procedure: proc, OfferedRps: rates[key]})
	}
	return z
}

// procLimits is checkout of the README's limits file: routes, a capacity
// per procedure, a limit per caller across procedures and one per leaf.
// edit changes it before the Set is built.
func procLimits(edit func(*limits.Service)) *limits.Set {
	inf := math.Inf(1)
	svc := &limits.Service{
		Name: "checkout", Capacity: inf, DefaultLimit: inf, FailMode: dataplane.FailOpen,
		Callers: map[string]limits.Bucket{"web": {Limit: 100}, "mobile": {Limit: 300}},
		Routes: []routes.Route{
			{Pattern: "POST /v1/charges", Procedure: "create-charge"},
			{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
		},
		Procedures: map[string]*limits.Procedure{
			"create-charge":      {Capacity: 200, Callers: map[string]float64{"web": 50}},
			"get-item":           {Capacity: inf},
			"/shop.Checkout/Pay": {Capacity: 500},
			names.Other:          {Capacity: 100},
		},
		Declared: []string{"create-charge", "get-item", "/shop.Checkout/Pay"},
	}
	if edit != nil {
		edit(svc)
	}
	return limits.NewSet(map[string]*limits.Service{"checkout": svc})
}

// leafOf returns the entry of p for (peer, procedure), or nil.
func leafOf(p *sluicev1.DropPolicy, name, procedure string) *sluicev1.PeerPolicy {
	for _, pp := range p.GetPeers() {
		if pp.GetPeer() == name && pp.GetProcedure() == procedure {
			return pp
		}
	}
	return nil
}

// tickOnce applies the zone loads and ticks once, after the warm-up.
func tickOnce(t *testing.T, set *limits.Set, loads ...*sluicev1.ZoneLoad) TickResult {
	t.Helper()
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	for _, z := range loads {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	return s.Tick(now, set)
}

func wantRatio(t *testing.T, p *sluicev1.DropPolicy, peer, procedure string, want float64) *sluicev1.PeerPolicy {
	t.Helper()
	pp := leafOf(p, peer, procedure)
	if got := pp.GetDropRatio(); math.Abs(got-want) > 1e-9 {
		t.Errorf("%s/%s: ratio %v, want %v (%v)", peer, procedure, got, want, pp)
	}
	return pp
}

// TestLeafLimitHolds: web's create-charge leaf is held at its 50 rps
// while its item reads, under every limit, are not dropped; the policy
// carries the procedures and routes, its entries sorted by (peer,
// procedure), each once.
func TestLeafLimitHolds(t *testing.T) {
	res := tickOnce(t, procLimits(nil), leafLoad("a", map[string]float64{
		"checkout/web/create-charge": 150, "checkout/web/get-item": 20,
	}), leafLoad("b", map[string]float64{"checkout/web/create-charge": 100}))
	p := res.Changed["callee/checkout"]
	if p == nil {
		t.Fatalf("no policy for checkout: %v", res.Changed)
	}
	cc := wantRatio(t, p, "web", "create-charge", 0.8)
	if cc.GetLimitRps() != 50 || cc.GetOfferedRps() != 250 || cc.GetReason() != sluicev1.DropReason_DROP_REASON_LIMIT {
		t.Errorf("web/create-charge = %v, want limit 50 from 250 rps", cc)
	}
	// get-item has no limit of its own: web's across procedures is its
	// limit on the wire, so it is listed at ratio 0.
	if gi := wantRatio(t, p, "web", "get-item", 0); gi == nil || gi.GetLimitRps() != 100 {
		t.Errorf("web/get-item = %v, want listed with web's limit 100", gi)
	}
	if !slices.Equal(p.GetProcedures(), []string{"create-charge", "get-item", "/shop.Checkout/Pay"}) {
		t.Errorf("procedures = %q", p.GetProcedures())
	}
	if len(p.GetRoutes()) != 2 || p.GetRoutes()[0].GetPattern() != "POST /v1/charges" || p.GetRoutes()[1].GetProcedure() != "get-item" {
		t.Errorf("routes = %v", p.GetRoutes())
	}
	for i := 1; i < len(p.GetPeers()); i++ {
		a, b := p.GetPeers()[i-1], p.GetPeers()[i]
		if a.GetPeer() > b.GetPeer() || a.GetPeer() == b.GetPeer() && a.GetProcedure() >= b.GetProcedure() {
			t.Errorf("peers not sorted by (peer, procedure) at %d: %v, %v", i, a, b)
		}
	}
	for _, pp := range p.GetPeers() {
		if pp.GetProcedure() == "" {
			t.Errorf("entry %v has no procedure in a callee that declares them", pp)
		}
	}
	if got := res.Procedures[ServiceProcedure{"checkout", "create-charge"}].Offered; got != 250 {
		t.Errorf("create-charge offered %v, want 250", got)
	}
	var loads []string
	for _, l := range res.Loads {
		loads = append(loads, l.Caller+"/"+l.Procedure)
	}
	if !slices.Equal(loads, []string{"web/create-charge", "web/get-item"}) {
		t.Errorf("history loads = %q", loads)
	}
}

// TestProcedureCapacitySharedMaxMin: three callers share the Pay method's
// 500 rps max-min fairly: the two under their share keep all of it, the
// surging one gets the rest.
func TestProcedureCapacitySharedMaxMin(t *testing.T) {
	const pay = "/shop.Checkout/Pay"
	res := tickOnce(t, procLimits(func(s *limits.Service) { s.Callers = nil }), leafLoad("a", map[string]float64{
		"checkout/web/" + pay: 1000, "checkout/mobile/" + pay: 100, "checkout/batch/" + pay: 150,
	}))
	p := res.Changed["callee/checkout"]
	web := wantRatio(t, p, "web", pay, 1-250.0/1000)
	if web.GetReason() != sluicev1.DropReason_DROP_REASON_CAPACITY || web.GetAllowedRps() != 250 {
		t.Errorf("web = %v, want 250 rps allowed for capacity", web)
	}
	for _, c := range []string{"mobile", "batch"} {
		if pp := leafOf(p, c, pay); pp != nil && pp.GetDropRatio() != 0 {
			t.Errorf("%s = %v, want not dropped: under its max-min share", c, pp)
		}
	}
}

// TestCallerLimitAcrossProcedures: web's 100 rps across procedures is
// shared max-min by its leaves: its 40 rps of item reads and 20 of
// others fit, its charges get the 40 left.
func TestCallerLimitAcrossProcedures(t *testing.T) {
	res := tickOnce(t, procLimits(func(s *limits.Service) { s.Procedures["create-charge"].Callers = nil }), leafLoad("a", map[string]float64{
		"checkout/web/create-charge": 150, "checkout/web/get-item": 40, "checkout/web/_other": 20,
	}))
	p := res.Changed["callee/checkout"]
	wantRatio(t, p, "web", "create-charge", 1-40.0/150)
	wantRatio(t, p, "web", "get-item", 0)
	wantRatio(t, p, "web", names.Other, 0)
	if cc := leafOf(p, "web", "create-charge"); cc.GetReason() != sluicev1.DropReason_DROP_REASON_LIMIT || cc.GetLimitRps() != 100 {
		t.Errorf("web/create-charge = %v, want dropped for web's limit of 100", cc)
	}
}

// TestInventedProceduresFoldIntoOther: a procedure the callee does not
// declare, and the procedure "" of an old sidecar, are web's _other leaf:
// no bucket, metric or policy entry of their own; its capacity holds them.
func TestInventedProceduresFoldIntoOther(t *testing.T) {
	res := tickOnce(t, procLimits(func(s *limits.Service) { s.Callers = nil }), leafLoad("a", map[string]float64{
		"checkout/web/made-up-1": 100, "checkout/web/made-up-2": 60, "checkout/web": 40, "checkout/web/get-item": 10,
	}))
	p := res.Changed["callee/checkout"]
	other := wantRatio(t, p, "web", names.Other, 0.5)
	if other.GetOfferedRps() != 200 {
		t.Errorf("web/_other = %v, want the 200 rps of the invented procedures and the old sidecar", other)
	}
	for _, pp := range p.GetPeers() {
		if pp.GetProcedure() != names.Other && !slices.Contains(p.GetProcedures(), pp.GetProcedure()) {
			t.Errorf("entry %v: procedure not declared", pp)
		}
	}
	for k := range res.Procedures {
		if k.Procedure != names.Other && k.Procedure != "get-item" {
			t.Errorf("metrics for procedure %q", k.Procedure)
		}
	}
	// web has a limit on create-charge, so a leaf per procedure.
	if res.Buckets != 4 {
		t.Errorf("%d buckets, want web's four leaves", res.Buckets)
	}
}

// TestLimitedCallersListedForEveryProcedure: a caller with a limit at any
// level is listed for every declared procedure and _other before it sends
// anything, so that sidecars pin it; a blocked caller is blocked from its
// first request.
func TestLimitedCallersListedForEveryProcedure(t *testing.T) {
	set := procLimits(func(s *limits.Service) {
		s.Callers["abuser"] = limits.Bucket{Limit: 0}
		s.Procedures["get-item"].Callers = map[string]float64{"batch": 5}
	})
	res := tickOnce(t, set, leafLoad("a", map[string]float64{"checkout/web/get-item": 1}))
	p := res.Changed["callee/checkout"]
	procs := []string{"/shop.Checkout/Pay", names.Other, "create-charge", "get-item"}
	for _, c := range []string{"abuser", "mobile", "web"} {
		for _, proc := range procs {
			pp := leafOf(p, c, proc)
			if pp == nil || pp.LimitRps == nil {
				t.Errorf("%s/%s = %v, want listed with a limit", c, proc, pp)
			}
		}
	}
	if pp := wantRatio(t, p, "abuser", "get-item", dropratio.DefaultConfig().PMax); pp.GetLimitRps() != 0 {
		t.Errorf("abuser = %v, want blocked", pp)
	}
	// batch's only limit is its get-item leaf: its other leaves bound
	// nothing and are not listed.
	if pp := leafOf(p, "batch", "get-item"); pp.GetLimitRps() != 5 {
		t.Errorf("batch/get-item = %v, want limit 5", pp)
	}
	if pp := leafOf(p, "batch", "create-charge"); pp != nil {
		t.Errorf("batch/create-charge = %v, want unlisted", pp)
	}
	if n := len(p.GetPeers()); n != 3*len(procs)+1 {
		t.Errorf("%d entries, want %d", n, 3*len(procs)+1)
	}
}

// TestProcedureLeavesCapped: the listed leaves of limited callers count
// against the policy's cap on peers like any entry, and those shed are
// counted.
func TestProcedureLeavesCapped(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPolicyPeers = 5
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(2 * time.Second)
	res := s.Tick(now, procLimits(nil)) // web and mobile × 4 procedures
	p := res.Changed["callee/checkout"]
	if len(p.GetPeers()) != 5 || len(res.Shed) != 1 || res.Shed[0].Shed != 3 {
		t.Errorf("%d entries, shed %+v; want 5 kept and 3 shed", len(p.GetPeers()), res.Shed)
	}
}

// TestNoProceduresFoldsToPair: a callee that declares no procedures sees
// its buckets whole, whatever procedures a broken sidecar reports.
func TestNoProceduresFoldsToPair(t *testing.T) {
	res := tickOnce(t, checkoutLimits(), leafLoad("a", map[string]float64{
		"checkout/web/made-up": 300, "checkout/web": 200,
	}))
	p := res.Changed["callee/checkout"]
	web := wantRatio(t, p, "web", "", 0.8)
	if web.GetOfferedRps() != 500 || len(p.GetPeers()) != 1 || len(p.GetProcedures()) != 0 || len(p.GetRoutes()) != 0 {
		t.Errorf("policy = %v, want web's one bucket at 500 rps", p)
	}
}

// TestBadProcedureDropsItsEntry: a peer entry whose procedure is not a
// valid name is left out of its service, counted; the service's other
// entries are applied.
func TestBadProcedureDropsItsEntry(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	z := leafLoad("a", map[string]float64{"checkout/web/create-charge": 250, "checkout/web/bad//name": 1e6, "checkout/mobile/ spaced": 1})
	if err := s.Apply(z, now); err != nil {
		t.Fatal(err)
	}
	if d := s.TakeDropped(); d.BadProcedures != 2 || len(d.ByReason) != 0 {
		t.Errorf("dropped = %+v, want 2 bad procedures and no service entry", d)
	}
	p := s.Tick(now, procLimits(nil)).Changed["callee/checkout"]
	wantRatio(t, p, "web", "create-charge", 0.8)
	// A leaf listed twice still costs its whole service entry.
	z = leafLoad("a", map[string]float64{"checkout/web/create-charge": 250, "checkout/mobile/get-item": 1})
	z.Services[0].Peers[0].Peer, z.Services[0].Peers[0].Procedure = "web", "create-charge"
	if err := s.Apply(z, now); err != nil {
		t.Fatal(err)
	}
	if d := s.TakeDropped(); d.ByReason["duplicate_peer"] != 1 {
		t.Errorf("dropped = %+v, want the service entry for a duplicate leaf", d)
	}
}

// TestCallerLimitOnLeaves: every inbound leaf of a caller with a limit
// across procedures carries that limit, beside its own on limit_rps, so
// that under fail mode local its sidecars share it among the caller's
// leaves; a caller without one and a callee without procedures carry
// none. A change of it alone is published at once.
func TestCallerLimitOnLeaves(t *testing.T) {
	set := procLimits(func(s *limits.Service) { s.Procedures["get-item"].Callers = map[string]float64{"batch": 5} })
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	if err := s.Apply(leafLoad("a", map[string]float64{"checkout/web/get-item": 1}), now); err != nil {
		t.Fatal(err)
	}
	p := s.Tick(now, set).Changed["callee/checkout"]
	for _, pp := range p.GetPeers() {
		want := map[string]float64{"web": 100, "mobile": 300}[pp.GetPeer()]
		switch {
		case want == 0 && pp.CallerLimitRps != nil:
			t.Errorf("%s/%s = %v, want no caller limit", pp.GetPeer(), pp.GetProcedure(), pp)
		case want != 0 && (pp.CallerLimitRps == nil || pp.GetCallerLimitRps() != want):
			t.Errorf("%s/%s = %v, want caller limit %v", pp.GetPeer(), pp.GetProcedure(), pp, want)
		}
	}
	if cc := leafOf(p, "web", "create-charge"); cc.GetLimitRps() != 50 || cc.GetCallerLimitRps() != 100 {
		t.Errorf("web/create-charge = %v, want its own limit 50 and web's 100", cc)
	}
	if pp := leafOf(p, "batch", "get-item"); pp == nil || pp.CallerLimitRps != nil {
		t.Errorf("batch/get-item = %v, want listed without a caller limit", pp)
	}

	// Only the caller limit of a leaf differs: due.
	changed := proto.Clone(p).(*sluicev1.DropPolicy)
	leafOf(changed, "web", "create-charge").CallerLimitRps = proto.Float64(120)
	if s.due(proto.Clone(p).(*sluicev1.DropPolicy), now) {
		t.Error("the published policy itself is due")
	}
	if !s.due(changed, now) {
		t.Error("a changed caller limit is not due")
	}
	leafOf(changed, "web", "create-charge").CallerLimitRps = nil
	if !s.due(changed, now) {
		t.Error("a caller limit gone is not due")
	}

	// The global offered rate alone: due from a fifth on (a sidecar's
	// surge projection reads its share of it), not for noise.
	for _, tc := range []struct {
		from, to float64
		due      bool
	}{
		{1000, 1050, false}, {1000, 900, false}, {1000, 1300, true}, {1000, 700, true},
		{30, 37, false}, // a fifth, but within a Poisson count's noise
		{0, 10, true},
	} {
		changed := proto.Clone(p).(*sluicev1.DropPolicy)
		cc := leafOf(changed, "web", "create-charge")
		cc.OfferedRps = tc.to
		base := proto.Clone(p).(*sluicev1.DropPolicy)
		leafOf(base, "web", "create-charge").OfferedRps = tc.from
		s.published[base.GetName()] = &published{policy: base}
		if got := s.due(changed, now); got != tc.due {
			t.Errorf("offered %v → %v rps: due %v, want %v", tc.from, tc.to, got, tc.due)
		}
	}

	res := tickOnce(t, checkoutLimits(), leafLoad("a", map[string]float64{"checkout/web": 500}))
	for name, p := range res.Changed {
		for _, pp := range p.GetPeers() {
			if pp.CallerLimitRps != nil {
				t.Errorf("%s: %v, want no caller limit in a callee without procedures", name, pp)
			}
		}
	}
}

// TestBoundOnLeaves: each inbound leaf names the level of the limits that
// binds it, so that its sidecars name the bucket that refused: web's
// create-charge is held by its own limit, mobile's item reads by mobile's
// limit across procedures, batch's payments by the procedure's capacity,
// and, once the callee's capacity is short, by that. Whole and outbound
// buckets carry none; a change of the bound alone is due.
func TestBoundOnLeaves(t *testing.T) {
	const (
		leaf      = sluicev1.DropBound_DROP_BOUND_LEAF
		caller    = sluicev1.DropBound_DROP_BOUND_CALLER
		procedure = sluicev1.DropBound_DROP_BOUND_PROCEDURE
		callee    = sluicev1.DropBound_DROP_BOUND_CALLEE
	)
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	if err := s.Apply(leafLoad("a", map[string]float64{
		"checkout/web/create-charge":        150, // own limit 50; web's 100 fits
		"checkout/web/get-item":             20,
		"checkout/mobile/get-item":          400, // mobile's limit 300
		"checkout/batch//shop.Checkout/Pay": 600, // the procedure's capacity 500
	}), now); err != nil {
		t.Fatal(err)
	}
	p := s.Tick(now, procLimits(nil)).Changed["callee/checkout"]
	for _, want := range []struct {
		peer, proc string
		bound      sluicev1.DropBound
	}{
		{"web", "create-charge", leaf},
		{"mobile", "get-item", caller},
		{"batch", "/shop.Checkout/Pay", procedure},
	} {
		if pp := leafOf(p, want.peer, want.proc); pp == nil || pp.GetBound() != want.bound || pp.GetDropRatio() == 0 {
			t.Errorf("%s/%s = %v, want dropped, bound %v", want.peer, want.proc, pp, want.bound)
		}
	}
	// web's item reads are under every limit: the bucket itself.
	if pp := leafOf(p, "web", "get-item"); pp == nil || pp.GetBound() != sluicev1.DropBound_DROP_BOUND_UNSPECIFIED && pp.GetBound() != leaf {
		t.Errorf("web/get-item = %v, want unbound or its own", pp)
	}

	// Only the bound of a leaf differs: due.
	changed := proto.Clone(p).(*sluicev1.DropPolicy)
	leafOf(changed, "web", "create-charge").Bound = caller
	if s.due(proto.Clone(p).(*sluicev1.DropPolicy), now) {
		t.Error("the published policy itself is due")
	}
	if !s.due(changed, now) {
		t.Error("a changed bound is not due")
	}

	// The callee's capacity, short of what the procedures demand.
	res := tickOnce(t, procLimits(func(s *limits.Service) { s.Capacity = 100 }),
		leafLoad("a", map[string]float64{"checkout/batch/get-item": 300}))
	if pp := leafOf(res.Changed["callee/checkout"], "batch", "get-item"); pp == nil || pp.GetBound() != callee {
		t.Errorf("batch/get-item = %v, want bound by the callee's capacity", pp)
	}

	// Outbound and whole buckets: the bucket itself.
	res = tickOnce(t, procLimits(nil), mixedLoad("a", 1, nil, map[string]float64{"web/checkout": 150}, nil))
	res2 := tickOnce(t, checkoutLimits(), leafLoad("a", map[string]float64{"checkout/web": 500}))
	for i, r := range []TickResult{res, res2} {
		for name, p := range r.Changed {
			if i == 0 && p.GetDirection() != sluicev1.Direction_DIRECTION_OUTBOUND {
				continue // checkout's inbound leaves of the same load
			}
			for _, pp := range p.GetPeers() {
				if pp.GetBound() != sluicev1.DropBound_DROP_BOUND_UNSPECIFIED {
					t.Errorf("%s: %v, want no bound", name, pp)
				}
			}
		}
	}
}
