package reporter

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
	"google.golang.org/protobuf/types/known/durationpb"
)

func projReport(urgent bool, window time.Duration, offered uint64) *sluicev1.LoadReport {
	return &sluicev1.LoadReport{
		Urgent: urgent, Window: durationpb.New(window),
		Peers: []*sluicev1.PeerCounts{{Peer: "web", Offered: offered}},
	}
}

func projPolicy(offered float64) *sidecar.Policy {
	return &sidecar.Policy{Service: "checkout", Peers: []sidecar.Rule{{
		Peer: "web", Mode: dropratio.Enforce, LimitRPS: 1000, AllowedRPS: 1000, OfferedRPS: offered,
	}}}
}

// TestProjectorHoldsTheShareThenYieldsToTheController: a sidecar carrying a
// tenth of a bucket's 1,000 rps sees it triple; from its surge report
// on it drops what keeps it within a tenth of the allowed rate. The
// controller's answer, three checks later, decides what follows: a global
// rate that rose too keeps the projection until an interval has passed; one
// that did not (the traffic moved to this sidecar) ends it at once.
func TestProjectorHoldsTheShareThenYieldsToTheController(t *testing.T) {
	for _, tc := range []struct {
		name    string
		global  float64 // the controller's offered rate, three checks after the surge report
		holding bool    // the projection still in force at the fourth
	}{
		{"the bucket surged", 3000, true},
		{"the traffic moved here", 1100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const check = 100 * time.Millisecond
			p := NewProjector(time.Second, check, DefaultSurgeMinCount)
			now := time.Unix(1000, 0)
			p.Policy(projPolicy(1000), now)
			p.Reported(projReport(false, time.Second, 100), now) // 100 rps: a share of 0.1

			// The counters of a sidecar that drops with the ratio in force.
			var offered, dropped uint64
			ratio := 0.0
			step := func(n uint64, rep *sluicev1.LoadReport) []sidecar.Provisional {
				now = now.Add(check)
				then := map[bucket]sidecar.PeerCounts{{peer: "web"}: {Peer: "web", Offered: offered, Dropped: dropped}}
				offered += n
				dropped += uint64(math.Round(float64(n) * ratio))
				cur := map[bucket]sidecar.PeerCounts{{peer: "web"}: {Peer: "web", Offered: offered, Dropped: dropped}}
				if rep != nil {
					p.Reported(rep, now)
				}
				got := p.Check(now, then, cur, check)
				ratio = 0
				if len(got) == 1 {
					ratio = got[0].Ratio
				}
				return got
			}
			if got := step(10, nil); got != nil {
				t.Fatalf("a calm check projected %v", got)
			}
			// The surge report's own check: its window is 3x the share,
			// past the noise, so the ratio applies at once, and pays back
			// what that window let through over the share.
			got := step(30, projReport(true, check, 30))
			if len(got) != 1 || got[0].Peer != "web" || !(got[0].Ratio > 0.75) {
				t.Fatalf("at the surge report, 3x its share: projected %v, want web above the share's 2/3, paying back", got)
			}
			step(30, nil)
			step(30, nil)
			p.Policy(projPolicy(tc.global), now)
			if got := step(30, nil); (got != nil) != tc.holding {
				t.Fatalf("after the controller's answer (global %v rps): projected %v, want it in force: %v", tc.global, got, tc.holding)
			}
			if !tc.holding {
				return
			}
			// Paid back within a few windows: then the share, a third.
			for range 4 {
				got = step(30, nil)
			}
			if len(got) != 1 || !(got[0].Ratio > 0.6 && got[0].Ratio < 0.75) {
				t.Fatalf("once paid back, at 3x its share: projected %v, want web at about 2/3", got)
			}
			// An interval after the surge report, the controller has
			// every sidecar's regular report: the projection ends.
			for range 4 {
				got = step(30, nil)
			}
			if got != nil {
				t.Fatalf("an interval after the surge report: projected %v, want none", got)
			}
		})
	}
}

// TestBeyondNoise: a small sidecar's jump is told from noise by the tail of
// a Poisson count, not by a Gaussian bar, and the reference's own noise
// raises the bar.
func TestBeyondNoise(t *testing.T) {
	for _, tc := range []struct {
		n, want, refCount float64
		beyond            bool
	}{
		{21, 4, 1000, true},   // 5× at 17 rps, a quarter of a second in
		{8, 1.7, 17, false},   // the same a tenth in: one chance in 5,000
		{60, 20, 1000, true},  // tripled, 20 expected
		{40, 20, 1000, false}, // doubled: about 4σ, one chance in 10,000
		{30, 20, 20, false},   // a reference of 20 requests may be low by a fifth
		{0, 0, 0, false},
		{5, 0.01, 1, true}, // beyond noise; the floor of projectMinCount requests is Started's
	} {
		if got := beyondNoise(tc.n, tc.want, tc.refCount); got != tc.beyond {
			t.Errorf("beyondNoise(%v, %v, %v) = %v, want %v", tc.n, tc.want, tc.refCount, got, tc.beyond)
		}
	}
}

// TestShareSkipsAReportThatCaughtTheOnset: the regular report that caught a
// surge's first tenths of a second gives a share far larger than the
// sidecar's; the report before gives its share. For a fall, a report that
// caught it gives a share far smaller, and the report before's is taken;
// a rise does not take it (a share's noise).
func TestShareSkipsAReportThatCaughtTheOnset(t *testing.T) {
	p := NewProjector(time.Second, 100*time.Millisecond, DefaultSurgeMinCount)
	now := time.Unix(1000, 0)
	p.Policy(projPolicy(60), now)
	p.Reported(projReport(false, time.Second, 10), now)
	p.Reported(projReport(false, time.Second, 11), now.Add(time.Second)) // noise: kept
	for _, rise := range []bool{true, false} {
		if s, g := p.shareOf(bucket{peer: "web"}, rise); math.Abs(s-11.0/60) > 1e-9 || g != 60 {
			t.Errorf("after a report of 11 rps (rise %v): share %v of %v, want 11/60 of 60", rise, s, g)
		}
	}
	for i, c := range []struct {
		rate       uint64  // the next report's
		rise, fall float64 // the shares wanted
	}{
		{34, 11.0 / 60, 34.0 / 60}, // caught the onset
		{6, 6.0 / 60, 34.0 / 60},   // caught a fall
	} {
		p.Reported(projReport(false, time.Second, c.rate), now.Add(time.Duration(2+i)*time.Second))
		for _, rise := range []bool{true, false} {
			want := c.fall
			if rise {
				want = c.rise
			}
			if s, g := p.shareOf(bucket{peer: "web"}, rise); math.Abs(s-want) > 1e-9 || g != 60 {
				t.Errorf("after a report of %v rps (rise %v): share %v of %v, want %v", c.rate, rise, s, g, want)
			}
		}
	}
}
