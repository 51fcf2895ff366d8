package dropratio

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// A bucket back under its allowance by OpenBelow's margin releases at once;
// inside the band, and above the allowance, slow release holds as before.
func TestOpenBelow(t *testing.T) {
	for _, tt := range []struct {
		name    string
		offered float64 // after a surge held at 0.8; limit 100
		ratio   float64
	}{
		{"well under the limit", 60, 0},
		{"at the band's edge", 90, 0},
		{"inside the band", 95, 0.6},
		{"at the limit", 100, 0.6},
		{"over the limit, target under the eased ratio", 120, 0.6},
		{"over the limit, target above the eased ratio", 400, 0.75},
		{"no traffic at all", 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, DefaultConfig())
			stepOne(t, l, 0, 500, 100)
			if v := stepOne(t, l, time.Second, tt.offered, 100); !near(v.Ratio, tt.ratio) {
				t.Errorf("ratio %v, want %v (target %v)", v.Ratio, tt.ratio, v.Target)
			}
		})
	}
}

// A step shorter than half a second (the fast path's urgent ticks) does
// not open at once, however low the rate it sees: that rate may be a
// surge report's fraction of an interval. It eases as before; the next
// full tick opens.
func TestOpenBelowNotOnShortSteps(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	stepOne(t, l, 0, 500, 100) // held at 0.8
	v := stepOne(t, l, 50*time.Millisecond, 0, 100)
	if eased := 1 - 0.2*math.Pow(2, 0.05); !near(v.Ratio, eased) {
		t.Errorf("a 50 ms step under the band: ratio %v, want the slow release's %v", v.Ratio, eased)
	}
	if v := stepOne(t, l, time.Second, 0, 100); v.Ratio != 0 {
		t.Errorf("the next full tick under the band: ratio %v, want 0", v.Ratio)
	}
}

// The share of a capacity is an allowance too: a caller whose demand fell
// under its fair share opens at once.
func TestOpenBelowFairShare(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	step := func(dt time.Duration, batch float64) Verdict {
		out := l.Step(dt, []Service{{Name: "api", Capacity: 1000, Callers: []Caller{
			{Name: "batch", Offered: batch, Limit: inf},
			{Name: "web", Offered: 300, Limit: inf},
		}}})
		return mustFind(t, out, "api", "batch")
	}
	if v := step(0, 7000); !near(v.Ratio, 0.9) {
		t.Fatalf("surge: ratio %v, want 0.9", v.Ratio)
	}
	if v := step(time.Second, 500); v.Ratio != 0 || v.Allowed < 500/0.9 {
		t.Errorf("back at 500 of a 700 share: ratio %v, allowed %v; want 0", v.Ratio, v.Allowed)
	}
}

// Neither a carried bucket (its traffic unknown, not gone) nor a step
// without elapsed time opens at once, nor does the law of OpenBelow 0.
func TestOpenBelowExceptions(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	stepOne(t, l, 0, 500, 100)
	if v := stepOne(t, l, 0, 10, 100); !near(v.Ratio, 0.8) {
		t.Errorf("dt 0: ratio %v, want 0.8 held", v.Ratio)
	}
	l.Step(time.Second, nil)
	if r := l.Ratio("api", "web"); !near(r, 0.6) {
		t.Errorf("carried: ratio %v, want 0.6", r)
	}

	cfg := DefaultConfig()
	cfg.OpenBelow = 0
	l = mustNew(t, cfg)
	stepOne(t, l, 0, 500, 100)
	if v := stepOne(t, l, time.Second, 10, 100); !near(v.Ratio, 0.6) {
		t.Errorf("OpenBelow 0: ratio %v, want 0.6", v.Ratio)
	}
}

// reversals counts the turns of a series: a rise after a fall or a fall
// after a rise.
func reversals(ratios []float64) int {
	n, dir := 0, 0
	for i := 1; i < len(ratios); i++ {
		d := 0
		switch {
		case ratios[i] > ratios[i-1]:
			d = 1
		case ratios[i] < ratios[i-1]:
			d = -1
		}
		if d != 0 {
			if dir != 0 && d != dir {
				n++
			}
			dir = d
		}
	}
	return n
}

// A rate that hovers about a level with the worst noise the simulator's
// steady states showed (±17 %, see Config.OpenBelow, drawn uniformly on every
// tick, far worse than their σ of 0.4–5 %) turns the ratio exactly as often
// with OpenBelow as without on regular (1 s) ticks, at every level: slow
// release at the default rate opens a ratio of 0.5 or less within a second
// anyway, and a ratio above 0.5 belongs to a rate twice its allowance, which
// noise does not carry under the band. On urgent ticks (50 ms), where slow
// release opens the least, the series differ only for a rate within noise of
// its limit, and only by ratios that small: at most 0.2, with at most 10 %
// more turns.
func TestOpenBelowNoNewOscillation(t *testing.T) {
	for _, level := range []float64{0.8, 0.95, 1.0, 1.05, 1.2, 1.5, 3, 10} {
		for _, dt := range []time.Duration{time.Second, 50 * time.Millisecond} {
			run := func(open float64) (turns int, ratios []float64) {
				cfg := DefaultConfig()
				cfg.OpenBelow = open
				l := mustNew(t, cfg)
				r := rand.New(rand.NewPCG(1, 17))
				stepOne(t, l, 0, level*100, 100)
				for range 2000 {
					noise := 1 + 0.17*(2*r.Float64()-1)
					ratios = append(ratios, stepOne(t, l, dt, level*100*noise, 100).Ratio)
				}
				return reversals(ratios), ratios
			}
			before, old := run(0)
			after, now := run(DefaultConfig().OpenBelow)
			diff := 0.0
			for i := range old {
				diff = max(diff, old[i]-now[i])
			}
			crosses := level*1.17 > 0.9 && level*0.83 < 1/0.9 // noise carries it across the band and the limit
			switch {
			case (dt == time.Second || !crosses) && (diff != 0 || after != before):
				t.Errorf("level %v× the limit, dt %v: %d reversals with OpenBelow, %d without, ratios up to %v apart; want the same series",
					level, dt, after, before, diff)
			case diff > 0.2 || float64(after) > 1.1*float64(before):
				t.Errorf("level %v× the limit, dt %v: %d reversals with OpenBelow, %d without, ratios up to %v apart", level, dt, after, before, diff)
			}
			t.Logf("level %v×, dt %v: %d reversals in 2000 ticks with OpenBelow, %d without; ratios up to %.3f apart", level, dt, after, before, diff)
		}
	}
}
