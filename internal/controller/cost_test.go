package controller

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
)

func costLimits(t *testing.T) *limits.Set {
	t.Helper()
	set, err := limits.Parse(strings.NewReader(`
services:
  llm:
    unit: cost
    cost: {default: 2, response: x-sluice-cost}
    callers:
      chat: {limit: 5000, max_concurrency: 40}
  search:
    callers:
      web: {max_concurrency: 20}
`))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// costLoad is one aggregator's flush: chat offers llm 100 rps that cost
// offeredCost units per second, and admitted admittedCost; web offers
// search 50 rps.
func costLoad(offeredCost, admittedCost float64) *sluicev1.ZoneLoad {
	return &sluicev1.ZoneLoad{AggregatorId: "agg-a", Zone: "a", Interval: durationpb.New(time.Second), Services: []*sluicev1.ServiceLoad{
		{Service: "llm", Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 2, Peers: []*sluicev1.PeerRate{
			{Peer: "chat", OfferedRps: 100, OfferedCostRps: offeredCost, AdmittedCostRps: admittedCost, InFlight: 12},
		}},
		{Service: "search", Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 1, Peers: []*sluicev1.PeerRate{
			{Peer: "web", OfferedRps: 50},
		}},
	}}
}

// TestCostServiceRatio: a callee counting cost runs the law on its offered
// cost rate against its limit in units (a new bucket's raised by the
// credit a bucket that pays back starts with, dropratio.LevelTop: a
// hundredth of its 10 s window, 500, spent over a tick), and publishes its unit, its
// pricing and its callers' caps; a callee counting requests publishes a
// cap alone, without a unit or pricing.
func TestCostServiceRatio(t *testing.T) {
	s := newState(t)
	if err := s.Apply(costLoad(20000, 5000), t0); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(t0.Add(3*time.Second), costLimits(t))
	p := res.Changed["callee/llm"]
	chat := peer(p, "chat")
	if chat == nil || math.Abs(chat.GetDropRatio()-(1-5500.0/20000)) > 1e-12 || chat.GetOfferedRps() != 20000 || chat.GetLimitRps() != 5500 {
		t.Fatalf("chat = %v, want ratio 0.725 from 20000 units/s against 5000 and its credit of 500", chat)
	}
	if chat.MaxConcurrency == nil || chat.GetMaxConcurrency() != 40 || chat.GetDebt() != 0 {
		t.Errorf("chat cap %v, debt %v; want 40 and 0", chat.MaxConcurrency, chat.GetDebt())
	}
	if p.GetUnit() != sluicev1.Unit_UNIT_COST {
		t.Errorf("unit %v", p.GetUnit())
	}
	if want := (&sluicev1.CostPolicy{DefaultCost: 2, ResponseHeader: "x-sluice-cost", MaxCost: 1e6}); !proto.Equal(p.GetCost(), want) {
		t.Errorf("cost %v, want %v", p.GetCost(), want)
	}
	if tot := res.Services["llm"]; tot.Offered != 100 || tot.OfferedCost != 20000 || tot.AdmittedCost != 5000 || tot.InFlight != 12 {
		t.Errorf("llm totals %+v", tot)
	}
	sp := res.Changed["callee/search"]
	web := peer(sp, "web")
	if web == nil || web.GetMaxConcurrency() != 20 || web.LimitRps != nil || web.GetDropRatio() != 0 {
		t.Errorf("web = %v, want listed for its cap 20 alone", web)
	}
	if sp.GetUnit() != sluicev1.Unit_UNIT_UNSPECIFIED || sp.GetCost() != nil {
		t.Errorf("search unit %v, cost %v", sp.GetUnit(), sp.GetCost())
	}
}

// TestCostDebt: chat admits 7500 units/s against its limit of 5000 for
// four ticks (its requests cost more than priced); its credit of 500 (a
// new bucket's) is spent, then it owes the rest, published as its debt,
// and its limit is lowered by four times the debt it will owe once the
// tick its reports have not yet counted has passed (admitting what it
// was last given) over the payback window (10 s). Then, admitting what
// the policy of two ticks before allowed (as the loop runs: a tick's
// reports are a tick behind the sidecars), it pays back without running
// past 0 and gets its limit back.
func TestCostDebt(t *testing.T) {
	s := newState(t)
	s.cfg.RepublishThreshold = 0 // every change published: the last is the tick's
	set := costLimits(t)
	if err := s.Apply(costLoad(20000, 5000), t0); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(3 * time.Second)
	var debts map[string]float64
	tick := func(admitted float64) *sluicev1.PeerPolicy {
		t.Helper()
		if err := s.Apply(costLoad(20000, admitted), now); err != nil {
			t.Fatal(err)
		}
		res := s.Tick(now, set)
		debts = res.Debts
		now = now.Add(time.Second)
		return peer(s.published["callee/llm"].policy, "chat")
	}
	given := tick(5000).GetAllowedRps() // the first step: no dt yet
	if given != 5500 {
		t.Fatalf("a new bucket: allowed %v, want 5000 and its credit of 500", given)
	}
	allowed := []float64{given}
	for i := 1; i <= 4; i++ {
		chat := tick(7500)
		debt := 2500*float64(i) - 500
		if want := 5000 - 4*(debt-(5000-given))/10; chat.GetDebt() != debt || chat.GetAllowedRps() != want || chat.GetLimitRps() != want {
			t.Fatalf("overshoot tick %d: debt %v, allowed %v, limit %v; want %v, %v", i, chat.GetDebt(), chat.GetAllowedRps(), chat.GetLimitRps(), debt, want)
		}
		if got := debts["llm"]; got != debt {
			t.Errorf("tick %d: llm's debt %v, want %v", i, got, debt)
		}
		given = chat.GetAllowedRps()
		allowed = append(allowed, given)
	}
	owed := 0.0
	for i := 0; i < 200 && (given < 5000 || owed > 0); i++ {
		chat := tick(allowed[len(allowed)-2])
		owed, given = chat.GetDebt(), chat.GetAllowedRps()
		if owed > 0 && given >= 5000 {
			t.Fatalf("paying back: debt %v, allowed %v", owed, given)
		}
		if l := s.levels[levelKey{"llm", "chat", ""}]; l > 0 {
			t.Fatalf("paying back: level %v, ran past 0 into credit: the tick the reports had not counted was paid twice", l)
		}
		allowed = append(allowed, given)
	}
	if math.Abs(given-5000) > 1e-4*5000 || s.levels[levelKey{"llm", "chat", ""}] != 0 || debts != nil {
		t.Errorf("after paying back: allowed %v, levels %v", given, s.levels)
	}
}

// TestCappedOfferedRepublished: a capped bucket's policy goes out when its
// global offered rate moves a twentieth, noise or not, since every
// sidecar's share of the cap is its own rate over that one; under a
// twentieth it waits.
func TestCappedOfferedRepublished(t *testing.T) {
	s := newState(t)
	set := costLimits(t)
	load := func(web float64) *sluicev1.ZoneLoad {
		l := costLoad(20000, 5000)
		l.Services[1].Peers[0].OfferedRps = web
		return l
	}
	now := t0
	tick := func(web float64) *sluicev1.DropPolicy {
		t.Helper()
		if err := s.Apply(load(web), now); err != nil {
			t.Fatal(err)
		}
		res := s.Tick(now, set)
		now = now.Add(time.Second)
		return res.Changed["callee/search"]
	}
	if err := s.Apply(load(160), now); err != nil {
		t.Fatal(err)
	}
	now = now.Add(3 * time.Second) // past the warm-up
	if p := tick(160); p == nil || peer(p, "web").GetOfferedRps() != 160 {
		t.Fatalf("first policy %v: want web's cap and its 160 rps", p)
	}
	if p := tick(164); p != nil {
		t.Errorf("web at 164 rps, 2.5 %% over the published 160: republished %v, want it to wait", p)
	}
	if p := tick(200); p == nil || peer(p, "web").GetOfferedRps() != 200 {
		t.Errorf("web at 200 rps against a published 160 (within a Poisson count's noise): %v, want it republished", p)
	}
}
