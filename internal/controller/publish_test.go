package controller

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// A callee's fail mode reaches its policy as the sidecars read it; a value
// that is not a fail mode (only a hand-built Set can hold one) goes out as
// one the sidecars refuse, never as open.
func TestFailModeOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		fm   dataplane.FailMode
		want sluicev1.FailMode
	}{
		{dataplane.FailOpen, sluicev1.FailMode_FAIL_MODE_OPEN},
		{dataplane.FailHold, sluicev1.FailMode_FAIL_MODE_HOLD},
		{dataplane.FailLocal, sluicev1.FailMode_FAIL_MODE_LOCAL},
		{dataplane.FailMode(7), -1},
	} {
		set := limits.NewSet(map[string]*limits.Service{"checkout": {
			Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: tc.fm,
		}})
		s := warmState(t)
		now := t0.Add(2 * time.Second)
		if err := s.Apply(zoneLoad("a", "zone-a", 1, map[string]float64{"checkout/web": 10}), now); err != nil {
			t.Fatal(err)
		}
		m := s.Tick(now, set).Changed["callee/checkout"]
		if got := m.GetFailMode(); got != tc.want {
			t.Errorf("%v: fail mode %v on the wire, want %v", tc.fm, got, tc.want)
		}
		p, err := sidecar.PolicyFromProto(m)
		switch {
		case tc.want < 0:
			if err == nil || !strings.Contains(err.Error(), "fail_mode") {
				t.Errorf("%v: sidecar accepted %v (%v); want a NACK naming fail_mode", tc.fm, p, err)
			}
		case err != nil || p.FailMode != tc.fm:
			t.Errorf("%v: sidecar read %v, %v", tc.fm, p, err)
		}
	}
}

// A policy lists the callers that carry a limit, a ratio or enforcement
// upstream, and no other: a flood of made-up caller names that the sidecars
// report costs no sidecar a slot through the policy (issue 13), not even
// once the callee is over its capacity and the law gives each of them a
// share, and a caller that gets a limit later is listed at once. Every
// listed peer is one the sidecar keeps counters for (sidecar.Rule.Limited).
func TestPolicyListsOnlyLimitedCallers(t *testing.T) {
	s := newState(t)
	rates := map[string]float64{"checkout/web": 500, "checkout/batch": 10, "checkout/mobile": 30, "checkout/greedy": 400}
	for i := range 200 {
		rates[fmt.Sprintf("checkout/aaa-%03d", i)] = 1
	}
	if err := s.Apply(zoneLoad("agg-a", "a", 2, rates), t0); err != nil {
		t.Fatal(err)
	}
	tick := func(now time.Time, set *limits.Set) *sluicev1.DropPolicy {
		t.Helper()
		if err := s.Apply(zoneLoad("agg-a", "a", 2, rates), now); err != nil {
			t.Fatal(err)
		}
		return s.Tick(now, set).Changed["callee/checkout"]
	}
	set := func(callers map[string]limits.Bucket, capacity float64) *limits.Set {
		return limits.NewSet(map[string]*limits.Service{"checkout": {
			Name: "checkout", Capacity: capacity, DefaultLimit: math.Inf(1), FailMode: dataplane.FailLocal, Callers: callers,
		}})
	}
	listed := func(p *sluicev1.DropPolicy) string {
		var names []string
		for _, pp := range p.GetPeers() {
			names = append(names, pp.GetPeer())
			r, err := sidecar.PolicyFromProto(&sluicev1.DropPolicy{
				Name: p.GetName(), Service: p.GetService(), Direction: p.GetDirection(), Peers: []*sluicev1.PeerPolicy{pp},
			})
			if err != nil || !r.Peers[0].Limited() {
				t.Errorf("%s listed, but a sidecar would not keep counters for it (%v)", pp.GetPeer(), err)
			}
		}
		return strings.Join(names, ",")
	}
	callers := map[string]limits.Bucket{"web": {Limit: 100}, "batch": {Limit: 50, Mode: dropratio.Shadow}}
	now := t0.Add(3 * time.Second)
	if got := listed(tick(now, set(callers, math.Inf(1)))); got != "batch,web" {
		t.Errorf("listed %q, want the limited callers batch,web", got)
	}
	callers["mobile"] = limits.Bucket{Limit: 20}
	now = now.Add(time.Second)
	if got := listed(tick(now, set(callers, math.Inf(1)))); got != "batch,mobile,web" {
		t.Errorf("listed %q after mobile's limit, want batch,mobile,web", got)
	}
	// A capacity the demand exceeds gives every caller a share (level 35:
	// 200 + 10 + 20 of demand fit, 70 is left for web and greedy). The
	// 200 callers under it, at ratio 0 without a limit, stay unlisted;
	// greedy, over its share, is listed for its ratio.
	now = now.Add(time.Second)
	p := tick(now, set(callers, 300))
	if got := listed(p); got != "batch,greedy,mobile,web" {
		t.Errorf("listed %q under a capacity, want the limited callers and greedy, over its share", got)
	}
}

// The controller lists a peer exactly when a sidecar keeps counters of its
// own for it: one rule (dataplane.Listed) read from each side's form of the
// wire, here checked on every combination of what makes a peer limited.
func TestListedAgreesWithSidecar(t *testing.T) {
	rate := func(v float64) *float64 { return &v }
	for _, ratio := range []float64{0, 0.3} {
		for _, limit := range []*float64{nil, rate(0), rate(50)} {
			for _, allowed := range []*float64{nil, rate(30)} {
				for _, upstream := range []bool{false, true} {
					for _, mode := range []sluicev1.Mode{sluicev1.Mode_MODE_ENFORCE, sluicev1.Mode_MODE_SHADOW} {
						pp := &sluicev1.PeerPolicy{Peer: "web", DropRatio: ratio, Mode: mode, LimitRps: limit,
							AllowedRps: allowed, OfferedRps: 40, EnforcedUpstream: upstream}
						p, err := sidecar.PolicyFromProto(&sluicev1.DropPolicy{Name: "callee/checkout", Service: "checkout",
							Direction: sluicev1.Direction_DIRECTION_INBOUND, Peers: []*sluicev1.PeerPolicy{pp}})
						if err != nil {
							t.Fatalf("%v: %v", pp, err)
						}
						if got, want := listed(pp), p.Peers[0].Limited(); got != want {
							t.Errorf("%v: controller lists it %v, sidecar pins it %v", pp, got, want)
						}
						wantListed := ratio > 0 || limit != nil || upstream
						if listed(pp) != wantListed {
							t.Errorf("%v: listed %v, want %v", pp, listed(pp), wantListed)
						}
					}
				}
			}
		}
	}
}

// A policy never lists more peers than a sidecar accepts (MaxPolicyPeers,
// here 4): the controller sheds the peers at ratio 0 before those being
// dropped, the smallest offered first, reports them, and what it publishes
// a sidecar accepts.
func TestPolicyPeersCapped(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPolicyPeers = 4
	s, err := NewState(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	// Six limited callers; over, at 300 against its limit of 100, has a
	// ratio and stays although it is not the busiest.
	rates := map[string]float64{"checkout/a": 1, "checkout/b": 5, "checkout/c": 50, "checkout/d": 60,
		"checkout/e": 90, "checkout/over": 300}
	callers := map[string]limits.Bucket{}
	for key := range rates {
		_, caller, _ := strings.Cut(key, "/")
		callers[caller] = limits.Bucket{Limit: 1000}
	}
	callers["over"] = limits.Bucket{Limit: 100}
	callers["zzz-idle"] = limits.Bucket{Limit: 10} // limited, no traffic: offered 0, shed first
	set := limits.NewSet(map[string]*limits.Service{"checkout": {
		Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), Callers: callers,
	}})
	now := t0.Add(3 * time.Second)
	for _, at := range []time.Time{t0, now} {
		if err := s.Apply(zoneLoad("agg-a", "a", 2, rates), at); err != nil {
			t.Fatal(err)
		}
	}
	res := s.Tick(now, set)
	p := res.Changed["callee/checkout"]
	var got []string
	for _, pp := range p.GetPeers() {
		got = append(got, pp.GetPeer())
	}
	if want := "c,d,e,over"; strings.Join(got, ",") != want {
		t.Errorf("listed %q, want %q: the ratio-0 peers with the least offered shed", strings.Join(got, ","), want)
	}
	want := []ShedPeers{{Policy: "callee/checkout", Shed: 3, Kept: 4, Largest: 5}}
	if !slices.Equal(res.Shed, want) {
		t.Errorf("shed %+v, want %+v", res.Shed, want)
	}
	if _, err := sidecar.PolicyFromProto(p); err != nil {
		t.Errorf("sidecar refuses the capped policy: %v", err)
	}
}
