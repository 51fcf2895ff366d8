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
// one tick a second, its sidecars admitting what the last published
// ratio lets through of offered(i), or all of it while late(i) (nil: never),
// as if its reports came late; it returns, per tick, what was
// admitted and the limit the policy published.
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
	now, ratio := t0, 0.0
	for i := range ticks {
		o := offered(i)
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
		ratio = pp.GetDropRatio()
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
// the ratio holds it there.
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
	over := 0.0
	for i := 10; i < 40; i++ {
		over += admitted[i] - 1000
		if i >= 10 && limit[i] > 1000*1.02 {
			t.Errorf("tick %d: limit %v after the tokens were spent", i, limit[i])
		}
	}
	if mean := (over - 2000) / 30; math.Abs(mean) > 0.03*1000 {
		t.Errorf("past the burst, admitted %+.0f rps a tick above the limit on average", mean)
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
// mean admitted rate meets the limit within a few per cent. Its level is
// forgotten once paid back.
func TestPaybackMeetsLimit(t *testing.T) {
	const L = 1000.0
	surge := func(i int) bool { return i >= 5 && i < 9 }
	admitted, limit, s := burstLoop(t, limits.Bucket{Payback: 10 * time.Second}, 40, func(i int) float64 {
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
	if len(s.levels) != 0 || math.Abs(limit[39]-L) > 1e-9 {
		t.Errorf("paid back: levels %v, limit %v", s.levels, limit[39])
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
