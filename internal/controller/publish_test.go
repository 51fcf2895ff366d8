package controller

import (
	"fmt"
	"math"
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

// A policy lists the callers that carry a limit, a share of capacity or a
// ratio, and no other: a flood of made-up caller names that the sidecars
// report costs no sidecar a slot through the policy (issue 13), and a
// caller that gets a limit later is listed at once. Every listed peer is
// one the sidecar keeps counters for (sidecar.Rule.Limited).
func TestPolicyListsOnlyLimitedCallers(t *testing.T) {
	s := newState(t)
	rates := map[string]float64{"checkout/web": 500, "checkout/batch": 10, "checkout/mobile": 30}
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
	// A capacity the demand exceeds gives every caller a share, an
	// allowed rate its headers announce: every caller is listed.
	now = now.Add(time.Second)
	p := tick(now, set(callers, 300))
	if n := len(p.GetPeers()); n != 203 {
		t.Errorf("%d callers listed under a capacity, want all 203", n)
	}
	listed(p)
}
