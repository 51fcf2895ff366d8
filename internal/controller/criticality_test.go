package controller

import (
	"context"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/history"
)

const (
	critPlus  = sluicev1.Criticality_CRITICALITY_CRITICAL_PLUS
	crit      = sluicev1.Criticality_CRITICALITY_CRITICAL
	shedPlus  = sluicev1.Criticality_CRITICALITY_SHEDDABLE_PLUS
	shed      = sluicev1.Criticality_CRITICALITY_SHEDDABLE
	untiered  = sluicev1.Criticality_CRITICALITY_UNSPECIFIED
	tieredSvc = "payments"
)

// tierLoad builds a flush of one aggregator: rates maps
// "service/peer[/procedure]@tier" (the tier a number of the enum) to
// offered rps.
func tierLoad(agg string, rates map[string]float64) *sluicev1.ZoneLoad {
	z := &sluicev1.ZoneLoad{AggregatorId: agg, Zone: "zone-" + agg, Interval: durationpb.New(time.Second)}
	bySvc := map[string]*sluicev1.ServiceLoad{}
	for _, key := range slices.Sorted(maps.Keys(rates)) {
		path, tier, _ := strings.Cut(key, "@")
		n, err := strconv.Atoi(tier)
		if err != nil {
			panic(key)
		}
		svc, rest, _ := strings.Cut(path, "/")
		peer, proc, _ := strings.Cut(rest, "/")
		sl := bySvc[svc]
		if sl == nil {
			sl = &sluicev1.ServiceLoad{Service: svc, Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 1}
			bySvc[svc] = sl
			z.Services = append(z.Services, sl)
		}
		sl.Peers = append(sl.Peers, &sluicev1.PeerRate{Peer: peer, Procedure: proc, Criticality: sluicev1.Criticality(n), OfferedRps: rates[key]})
	}
	return z
}

// tierLimits is payments of the tiered example: capacity 1000 shared by
// web (CRITICAL, may claim CRITICAL_PLUS) and batch (SHEDDABLE by
// default), each with a limit above it so both are listed; ops is limited
// to 0 and sends nothing.
func tierLimits() *limits.Set {
	inf := math.Inf(1)
	return limits.NewSet(map[string]*limits.Service{tieredSvc: {
		Name: tieredSvc, Capacity: 1000, DefaultLimit: inf, FailMode: dataplane.FailOpen,
		Callers: map[string]limits.Bucket{"web": {Limit: 5000}, "batch": {Limit: 2000}, "ops": {Limit: 0}},
		Criticality: &limits.Criticality{
			Header: criticality.DefaultHeader, Default: criticality.Critical, Max: criticality.Critical,
			Callers: map[string]limits.CallerTier{
				"web":   {Default: criticality.Critical, Max: criticality.CriticalPlus},
				"batch": {Default: criticality.Sheddable},
			},
		},
	}})
}

// tierOf returns the entry of p for (peer, "", tier), or nil.
func tierOf(p *sluicev1.DropPolicy, peer string, tier sluicev1.Criticality) *sluicev1.PeerPolicy {
	for _, pp := range p.GetPeers() {
		if pp.GetPeer() == peer && pp.GetProcedure() == "" && pp.GetCriticality() == tier {
			return pp
		}
	}
	return nil
}

// overCapacity is 1,800 rps of payments over two zones: web 800
// CRITICAL and 300 SHEDDABLE, batch 700 SHEDDABLE (200 of them from a
// sidecar whose policy predates the tiers, untiered: batch's default).
func overCapacity() []*sluicev1.ZoneLoad {
	return []*sluicev1.ZoneLoad{
		tierLoad("a", map[string]float64{"payments/web@2": 600, "payments/batch@4": 500}),
		tierLoad("b", map[string]float64{"payments/web@2": 200, "payments/web@4": 300, "payments/batch@0": 200}),
	}
}

// TestTieredPolicies: the tiers are threaded from the zone loads to the
// policy, whatever split the law makes: one rule per (peer, tier) seen,
// sorted by (peer, procedure, tier), each tier's load summed across
// zones, untiered load of a tiered callee in its default tier, a limited
// caller without traffic listed in its default tier alone, and the
// service's criticality published from the limits.
func TestTieredPolicies(t *testing.T) {
	res := tickOnce(t, tierLimits(), overCapacity()...)
	p := res.Changed["callee/payments"]
	if p == nil {
		t.Fatalf("no policy for payments: %v", res.Changed)
	}
	type rule struct {
		peer    string
		tier    sluicev1.Criticality
		offered float64
	}
	var got []rule
	for _, pp := range p.GetPeers() {
		got = append(got, rule{pp.GetPeer(), pp.GetCriticality(), pp.GetOfferedRps()})
	}
	want := []rule{{"batch", shed, 700}, {"ops", crit, 0}, {"web", crit, 800}, {"web", shed, 300}}
	if !slices.Equal(got, want) {
		t.Errorf("rules %v, want %v", got, want)
	}
	if ops := tierOf(p, "ops", crit); ops.GetDropRatio() != 0.99 || ops.GetLimitRps() != 0 {
		t.Errorf("ops = %v, want blocked at p_max", ops)
	}
	for _, pp := range p.GetPeers() {
		if pp.GetPeer() != "ops" && pp.GetLimitRps() == 0 {
			t.Errorf("%s/%v carries no limit: %v", pp.GetPeer(), pp.GetCriticality(), pp)
		}
	}
	wantPolicy := &sluicev1.CriticalityPolicy{
		Header: "x-sluice-criticality", DefaultTier: crit, MaxTier: crit,
		Callers: []*sluicev1.CallerCriticality{
			{Caller: "batch", DefaultTier: shed},
			{Caller: "web", DefaultTier: crit, MaxTier: critPlus},
		},
	}
	if !proto.Equal(p.GetCriticality(), wantPolicy) {
		t.Errorf("criticality %v, want %v", p.GetCriticality(), wantPolicy)
	}
	// History keeps no tiers: one load per bucket, its tiers summed.
	var loads []string
	for _, l := range res.Loads {
		loads = append(loads, l.Caller+"="+strconv.FormatFloat(l.Offered, 'f', -1, 64))
	}
	if want := []string{"batch=700", "web=1100"}; !slices.Equal(loads, want) {
		t.Errorf("loads %q, want %q", loads, want)
	}
	if got := res.Services[tieredSvc].Offered; got != 1800 {
		t.Errorf("payments offered %v, want 1800", got)
	}
}

// TestTieredPoliciesPriority is what the tier-aware law must do with
// overCapacity: capacity goes to tiers from the top down, so web's 800
// CRITICAL rps pass whole and the 200 left are shared max-min by the
// sheddable tier, 100 each; the total admitted is the capacity.
func TestTieredPoliciesPriority(t *testing.T) {
	p := tickOnce(t, tierLimits(), overCapacity()...).Changed["callee/payments"]
	admitted := 0.0
	for _, tc := range []struct {
		peer  string
		tier  sluicev1.Criticality
		ratio float64
	}{{"web", crit, 0}, {"web", shed, 1 - 100.0/300}, {"batch", shed, 1 - 100.0/700}} {
		pp := tierOf(p, tc.peer, tc.tier)
		if math.Abs(pp.GetDropRatio()-tc.ratio) > 1e-9 {
			t.Errorf("%s/%v: ratio %v, want %v", tc.peer, tc.tier, pp.GetDropRatio(), tc.ratio)
		}
		admitted += pp.GetOfferedRps() * (1 - pp.GetDropRatio())
	}
	if math.Abs(admitted-1000) > 1e-6 {
		t.Errorf("admitted %v rps, want the capacity 1000", admitted)
	}
}

// TestTiersFoldToTheLimits: a callee without tiers sees its tiered load
// (from sidecars whose policy still has tiers) as untiered, and publishes
// untiered rules and no criticality; a tiered callee's untiered load goes
// to its default tier; outbound claims toward a tiered callee are refused.
func TestTiersFoldToTheLimits(t *testing.T) {
	inf := math.Inf(1)
	set := limits.NewSet(map[string]*limits.Service{
		tieredSvc: tierLimits().Service(tieredSvc),
		"orders": {Name: "orders", Capacity: inf, DefaultLimit: inf, FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{"web": {Limit: 100}}},
	})
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	for _, z := range []*sluicev1.ZoneLoad{
		tierLoad("a", map[string]float64{"orders/web@2": 100, "orders/web@4": 50, "payments/mobile@0": 10}),
		tierLoad("b", map[string]float64{"orders/web@0": 50}),
		mixedLoad("c", 1, nil, map[string]float64{"web/payments": 40}, nil),
	} {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	loads := s.sum(set)
	if got, want := loads.buckets["orders"], []peerTotals{{Totals: Totals{Offered: 200}, peer: "web"}}; !slices.Equal(got, want) {
		t.Errorf("orders' buckets %+v, want %+v", got, want)
	}
	if got, want := loads.buckets[tieredSvc], []peerTotals{{Totals: Totals{Offered: 10}, peer: "mobile", tier: criticality.Critical}}; !slices.Equal(got, want) {
		t.Errorf("payments' buckets %+v, want %+v", got, want)
	}
	if len(loads.refused) != 1 || loads.refused[0].Reason != RefusedTiers {
		t.Errorf("refused %v, want web's claim toward payments, %s", loads.refused, RefusedTiers)
	}
	res := s.Tick(now, set)
	orders := res.Changed["callee/orders"]
	if orders.GetCriticality() != nil || len(orders.GetPeers()) != 1 || orders.GetPeers()[0].GetCriticality() != untiered {
		t.Errorf("orders' policy %v, want one untiered rule and no criticality", orders)
	}
	if out := res.Changed["caller/web"]; len(out.GetPeers()) != 1 || out.GetPeers()[0].GetPeer() != "orders" {
		t.Errorf("web's outbound policy %v, want a rule toward orders alone", out)
	}
}

// TestTieredPolicyRepublished: a change of the criticality alone, or of
// a rule's tier, makes a policy due.
func TestTieredPolicyRepublished(t *testing.T) {
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	for _, z := range overCapacity() {
		if err := s.Apply(z, now); err != nil {
			t.Fatal(err)
		}
	}
	set := tierLimits()
	if s.Tick(now, set).Changed["callee/payments"] == nil {
		t.Fatal("first tick published nothing")
	}
	now = now.Add(time.Second)
	if p := s.Tick(now, set).Changed["callee/payments"]; p != nil {
		t.Fatalf("republished an unchanged policy: %v", p)
	}
	set.Service(tieredSvc).Criticality.Header = "x-prio"
	p := s.Tick(now.Add(time.Second), set).Changed["callee/payments"]
	if p.GetCriticality().GetHeader() != "x-prio" {
		t.Errorf("a new header was not published: %v", p)
	}
}

// TestZoneLoadBadTier: over gRPC, a zone load's entry with a tier outside
// the enum is left out and counted; the rest of the load is applied.
func TestZoneLoadBadTier(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, err := New(DefaultConfig(), limits.NewStore(history.NewMemory(), time.Hour, nil), nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := sluicev1.NewZoneLoadServiceClient(cc).StreamZoneLoads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	z := tierLoad("a", map[string]float64{"payments/web@2": 10, "payments/web@9": 10, "payments/batch@-3": 5})
	if err := stream.Send(&sluicev1.StreamZoneLoadsRequest{Load: z}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetAccepted() {
		t.Fatalf("zone load refused: %v", resp)
	}
	if got := testutil.ToFloat64(svc.m.peerRejected.WithLabelValues(ReasonBadCriticality)); got != 2 {
		t.Errorf("peer_entries_rejected{reason=bad_criticality} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(svc.m.svcRejected.WithLabelValues("duplicate_peer")); got != 0 {
		t.Errorf("the service entry was refused: duplicate_peer = %v", got)
	}
}

// A restarted controller seeds each tier of a bucket with the ratio its
// sidecars are seen to enforce on that tier, not the bucket's blend.
func TestRestartSeedsEachTier(t *testing.T) {
	s := newState(t)
	z := tierLoad("a", map[string]float64{
		tieredSvc + "/web@" + strconv.Itoa(int(crit)): 600,
		tieredSvc + "/web@" + strconv.Itoa(int(shed)): 400,
	})
	for _, p := range z.Services[0].Peers {
		if p.GetCriticality() == shed {
			p.DroppedRps = 0.75 * p.GetOfferedRps()
		}
	}
	s.Apply(z, t0)
	res := s.Tick(t0.Add(3*time.Second), tierLimits())
	pol := res.Changed["callee/"+tieredSvc]
	for _, c := range []struct {
		tier sluicev1.Criticality
		want float64
	}{{crit, 0}, {shed, 0.75}} {
		got := math.NaN()
		for _, pp := range pol.GetPeers() {
			if pp.GetPeer() == "web" && pp.GetCriticality() == c.tier {
				got = pp.GetDropRatio()
			}
		}
		if math.Abs(got-c.want) > 1e-9 {
			t.Errorf("web %v: first ratio after restart = %v, want the enforced %v", c.tier, got, c.want)
		}
	}
}

// A capped caller of a tiered callee is listed in all four tiers, each
// with its cap, whatever tiers it was seen in: its sidecars hold one pool
// of slots across its tiers, and take a slot only under a listed rule.
func TestCappedCallerListedInEveryTier(t *testing.T) {
	s := newState(t)
	set := tierLimits()
	web := set.Service(tieredSvc).Callers["web"]
	web.MaxConcurrency = 5
	set.Service(tieredSvc).Callers["web"] = web
	s.Apply(tierLoad("a", map[string]float64{tieredSvc + "/web@" + strconv.Itoa(int(crit)): 100}), t0)
	res := s.Tick(t0.Add(3*time.Second), set)
	got := map[sluicev1.Criticality]uint32{}
	for _, pp := range res.Changed["callee/"+tieredSvc].GetPeers() {
		if pp.GetPeer() == "web" {
			got[pp.GetCriticality()] = pp.GetMaxConcurrency()
			if pp.GetDropRatio() != 0 {
				t.Errorf("web %v: ratio %v, want 0 (it sends nothing there, or under every level)", pp.GetCriticality(), pp.GetDropRatio())
			}
		}
	}
	for _, tier := range []sluicev1.Criticality{critPlus, crit, shedPlus, shed} {
		if got[tier] != 5 {
			t.Errorf("web %v: max_concurrency %d, want 5 on every tier (listed: %v)", tier, got[tier], got)
		}
	}
}
