package controller

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// burstLoop runs checkout's caller bulk (limit 1000, b) through the State
// one tick a second, as the loop runs: the load a tick sums was admitted
// under the ratio published two ticks before (reports are a tick behind
// the sidecars, whose second a tick's policy governs is the next one),
// of offered(i), or all of it while late(i) (nil: never), as if its
// reports came late; it returns, per tick, what was admitted and the
// limit the policy published.
func burstLoop(t *testing.T, b limits.Bucket, ticks int, offered func(i int) float64, late func(i int) bool) (admitted, limit []float64, s *State) {
	t.Helper()
	s = newState(t)
	s.cfg.RepublishThreshold = 0
	b.Limit, b.Mode = 1000, dropratio.Enforce
	set := limits.NewSet(map[string]*limits.Service{
		"checkout": {
			Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{"bulk": b, "web": {Limit: 100, Mode: dropratio.Enforce}},
		},
	})
	now := t0
	var ratios []float64
	for i := range ticks {
		o, ratio := offered(i), 0.0
		if i >= 2 {
			ratio = ratios[i-2]
		}
		a := o * (1 - ratio)
		if late != nil && late(i) {
			a = o
		}
		load := &sluicev1.ZoneLoad{AggregatorId: "agg-a", Zone: "a", Interval: durationpb.New(time.Second), Services: []*sluicev1.ServiceLoad{
			{Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 3, Peers: []*sluicev1.PeerRate{
				{Peer: "bulk", OfferedRps: o, DroppedRps: o - a},
				{Peer: "web", OfferedRps: 50},
			}},
		}}
		if err := s.Apply(load, now); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			now = now.Add(3 * time.Second) // past the warm-up
		}
		s.Tick(now, set)
		pp := peer(s.published["callee/checkout"].policy, "bulk")
		ratios = append(ratios, pp.GetDropRatio())
		admitted, limit = append(admitted, a), append(limit, pp.GetLimitRps())
		if _, ok := s.levels[levelKey{"checkout", "web", ""}]; ok {
			t.Fatalf("tick %d: web, without burst or payback, holds a level", i)
		}
		now = now.Add(time.Second)
	}
	return admitted, limit, s
}

// TestBurstAdmitsTokensThenLimit: bulk (limit 1000, burst 2000), quiet at
// 200 rps, holds no level (it is full); surging to 3000 rps it is
// allowed its limit and its 2000 tokens for a tick, then its limit, and
// the ratio holds it there. Over the surge it admits at most its tokens
// more than a bucket without a burst does: the tokens are spent once,
// though the loop sees what was admitted a tick late.
func TestBurstAdmitsTokensThenLimit(t *testing.T) {
	offered := func(i int) float64 {
		if i < 10 {
			return 200
		}
		return 3000
	}
	admitted, limit, s := burstLoop(t, limits.Bucket{Burst: 2000}, 40, offered, nil)
	// The limit published at a tick holds for the next.
	for i := range 10 {
		if limit[i] != 3000 {
			t.Errorf("quiet tick %d: limit %v, want 1000 + 2000 tokens", i, limit[i])
		}
	}
	if admitted[10] != 3000 {
		t.Errorf("first tick of the surge: admitted %v; want the burst admitted", admitted[10])
	}
	if math.Abs(limit[10]-1000) > 1e-6 {
		t.Errorf("tokens spent: limit %v, want 1000", limit[10])
	}
	plain, _, _ := burstLoop(t, limits.Bucket{}, 40, offered, nil)
	more := 0.0
	for i := 10; i < 40; i++ {
		more += admitted[i] - plain[i]
		if limit[i] > 1000*1.02 {
			t.Errorf("tick %d: limit %v after the tokens were spent", i, limit[i])
		}
	}
	if more < -1e-6 || more > 2000*1.02 {
		t.Errorf("over the surge, admitted %+.0f more than without a burst; want 0 to its 2000 tokens", more)
	}
	for i := 30; i < 40; i++ {
		if math.Abs(admitted[i]-1000) > 0.02*1000 {
			t.Errorf("steady tick %d: admitted %v, want 1000 ± 2 %%", i, admitted[i])
		}
	}
	if len(s.levels) > 1 {
		t.Errorf("levels %v: one bucket at most", s.levels)
	}
	// Without burst: the tightest edge, today's behaviour.
	_, limit, s = burstLoop(t, limits.Bucket{}, 20, offered, nil)
	for i, l := range limit {
		if l != 1000 {
			t.Fatalf("tick %d without burst: limit %v", i, l)
		}
	}
	if len(s.levels) != 0 {
		t.Errorf("without burst or payback: levels %v", s.levels)
	}
}

// TestPaybackMeetsLimit: bulk (limit 1000, payback 10s) admits 1500 for
// four ticks whatever the ratio (late reports); its limit is then
// lowered, and over the overshoot and the payback window after it, its
// mean admitted rate meets the limit within a few per cent. Its debt is
// gone once paid back (rounded to 0 under a millionth of a window) and its
// limit is L again.
func TestPaybackMeetsLimit(t *testing.T) {
	const L = 1000.0
	surge := func(i int) bool { return i >= 5 && i < 9 }
	admitted, limit, s := burstLoop(t, limits.Bucket{Payback: 10 * time.Second}, 60, func(i int) float64 {
		if i < 5 {
			return 500
		}
		return 1500
	}, surge)
	if limit[8] >= L*0.9 {
		t.Errorf("after 2000 over the limit: limit %v, want it lowered", limit[8])
	}
	// The window: the overshoot and the payback window after it.
	sum := 0.0
	for i := 5; i < 5+4+10; i++ {
		sum += admitted[i]
	}
	if mean := sum / 14; math.Abs(mean-L) > 0.05*L {
		t.Errorf("over the overshoot and its payback window: mean admitted %.0f, want %v ± 5 %%", mean, L)
	}
	if l := s.levels[levelKey{"checkout", "bulk", ""}]; l < 0 || math.Abs(limit[59]-L) > 1e-9*L {
		t.Errorf("paid back: level %v, limit %v", l, limit[59])
	}
	// Without payback, a request limit pays nothing back: today's behaviour.
	_, limit, s = burstLoop(t, limits.Bucket{}, 20, func(int) float64 { return 1500 }, surge)
	for i, l := range limit {
		if l != L {
			t.Fatalf("tick %d without payback: limit %v", i, l)
		}
	}
	if len(s.levels) != 0 {
		t.Errorf("without payback: levels %v", s.levels)
	}
}
