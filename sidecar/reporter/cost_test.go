package reporter

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

func TestBuildCost(t *testing.T) {
	h := Header{SidecarID: "s1", Service: "llm"}
	prev := []sidecar.PeerCounts{
		{Peer: "chat", Offered: 10, OfferedCost: 50_000, AdmittedCost: 40_000, Incarnation: 1},
		{Peer: "web", Offered: 5, OfferedCost: math.MaxUint64 - 999, Incarnation: 1}, // wraps
		{Peer: "batch", Offered: 1, OfferedCost: 9000, Incarnation: 1},
		{Peer: "long", Offered: 3, OfferedCost: 30_000, Incarnation: 1},
		{Peer: "idle", Offered: 3, OfferedCost: 30_000, AdmittedCost: 30_000, Incarnation: 1},
	}
	cur := []sidecar.PeerCounts{
		{Peer: "chat", Offered: 20, Dropped: 2, OfferedCost: 150_000, AdmittedCost: 120_500, InFlight: 3, Incarnation: 1},
		{Peer: "web", Offered: 6, OfferedCost: 1000, Incarnation: 1},
		{Peer: "batch", Offered: 2, OfferedCost: 8000, Incarnation: 1}, // backwards: 0
		{Peer: "plain", Offered: 4, Incarnation: 1},
		// Nothing offered in the window, but a long request's cost arrived
		// and another is still running: kept, for those.
		{Peer: "long", Offered: 3, OfferedCost: 30_000, AdmittedCost: 12_000, InFlight: 1, Incarnation: 1},
		// Nothing at all in the window: left out.
		{Peer: "idle", Offered: 3, OfferedCost: 30_000, AdmittedCost: 30_000, Incarnation: 1},
	}
	rep := Build(h, prev, cur, time.Unix(0, 0), time.Second)
	got := map[string][3]float64{}
	for _, p := range rep.GetPeers() {
		got[p.GetPeer()] = [3]float64{p.GetOfferedCost(), p.GetAdmittedCost(), float64(p.GetInFlight())}
	}
	want := map[string][3]float64{"chat": {100, 80.5, 3}, "web": {2, 0, 0}, "batch": {0, 0, 0}, "plain": {0, 0, 0}, "long": {0, 12, 1}}
	if _, ok := got["idle"]; ok {
		t.Errorf("a bucket with nothing in the window is reported: %v", got["idle"])
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: offered cost, admitted cost, in flight %v, want %v", k, got[k], w)
		}
	}
}

// TestWindowEndsLimiterWindow checks that each report moves a capped
// leaf's share with its part of the bucket's offered rate.
func TestWindowEndsLimiterWindow(t *testing.T) {
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	cap := uint32(100)
	l.SetPolicy(&sidecar.Policy{
		Name: names.Callee("llm"), Service: "llm", LiveInstances: 4,
		Peers: []sidecar.Rule{{Peer: "chat", LimitRPS: math.Inf(1), AllowedRPS: math.Inf(1), OfferedRPS: 1000, MaxConcurrency: cap}},
	})
	s := l.Service("llm")
	start := time.Unix(100, 0)
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "s1", Service: "llm"}, Interval: time.Second}, start, l)
	// Before a window: cap / instances = 25 slots.
	decide := func(n int) (held []sidecar.Decision) {
		for range n {
			if d := s.Decide("chat"); !d.Drop {
				held = append(held, d)
			}
		}
		return held
	}
	held := decide(40)
	if len(held) != 25 {
		t.Fatalf("%d of 40 admitted before a window, want the share cap/instances = 25", len(held))
	}
	rep := w.Tick(start.Add(time.Second), l)
	if rep == nil {
		t.Fatal("no report")
	}
	for _, p := range rep.GetPeers() {
		if p.GetPeer() == "chat" && p.GetInFlight() != 25 {
			t.Fatalf("report in_flight %d, want 25", p.GetInFlight())
		}
	}
	// The share follows the window before the one that just closed (the
	// one the policy's global rate was computed from): none yet, so still
	// cap / instances.
	for _, d := range held {
		d.Done(0, false)
	}
	held = decide(40)
	if len(held) != 25 {
		t.Fatalf("%d of 40 admitted after a window, want still cap/instances = 25", len(held))
	}
	for _, d := range held {
		d.Done(0, false)
	}
	if rep := w.Tick(start.Add(2*time.Second), l); rep == nil {
		t.Fatal("no second report")
	}
	// The first window's 40 rps of the bucket's 1000: floor(100 × 0.04) = 4 slots.
	if n := len(decide(10)); n != 4 {
		t.Fatalf("%d of 10 admitted after two windows, want the share 4", n)
	}
}
