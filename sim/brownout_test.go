package sim

import (
	"testing"
	"time"
)

// TestBrownoutLoop judges the loop on the brownout scenario's series, not
// its golden bytes: when the callee's knee halves, the estimate comes down
// to the new one within seconds, and when it comes back the estimate
// releases up to it before the run ends; in no phase does the estimate
// overshoot the knee by more than 10 % more than once (the issue's
// measure of oscillation), nor, when the knee halves, fall below half the
// new one (a loop that cuts again on the lagging health of the same
// overload, as before adaptive's Period, fell to -83 %); while the knee is
// halved the tiers decide who is shed: a tier loses no more than a less
// critical one.
//
// Not asserted, and reported in docs/simulation.md: that the estimate
// settles within 10 % of each knee, that critical traffic, which fits in
// the halved knee, loses nothing, and that the p99 stays within the
// objective once the estimate has come down (an estimate that returns to
// a knee it learnt from samples straddling the brownout's start overshoots
// once, which the issue allows, and the objective is missed then). Today
// the estimate settles 10–25 % under the knee.
func TestBrownoutLoop(t *testing.T) {
	t.Parallel()
	sc := loadBuiltin(t, "brownout")
	r := run(t, sc, sc.Seed)
	ms := MeasureCapacity(r)
	if len(ms) != 1 || len(ms[0].Phases) != 3 {
		t.Fatalf("want one modelled callee in three phases, got %+v", ms)
	}
	ps := ms[0].Phases
	for i, want := range []float64{12000, 6000, 12000} {
		if ps[i].Knee != want {
			t.Fatalf("phase %d: knee %v, want %v", i+1, ps[i].Knee, want)
		}
	}
	for i, p := range ps {
		if p.Overshoots > 1 {
			t.Errorf("phase %d (%v–%v): %d overshoots past %s of the knee %v (peak %s): the loop oscillates",
				i+1, p.From, p.To, p.Overshoots, pct(CapacityBand), p.Knee, signedPct(p.Peak))
		}
	}
	if b := ps[1]; b.Reached < 0 || b.Reached > 5*time.Second {
		t.Errorf("brownout: the estimate came down to %v·(1+%v) after %v, want within 5s", b.Knee, CapacityBand, b.Reached)
	}
	if b := ps[1]; b.Lowest < -0.5 {
		t.Errorf("brownout: the estimate fell to %s of the new knee: cut again and again on the same overload", signedPct(b.Lowest))
	}
	t.Logf("brownout: the objective missed %d seconds after the estimate came down, max p99 %v", ps[1].OverObjective, ps[1].P99)
	if rel := ps[2]; rel.Reached < 0 {
		t.Errorf("after the brownout: the estimate never released up to %v·(1−%v) (lowest %s)", rel.Knee, CapacityBand, signedPct(rel.Lowest))
	}
	tm := MeasureTiers(r)
	for p, ph := range tm.Phases {
		if ph.From != 30*time.Second {
			continue
		}
		for _, a := range tm.Flows {
			for _, b := range tm.Flows {
				if a.Tier < b.Tier && a.Loss[p] > b.Loss[p]+0.01 {
					t.Errorf("brownout: %s/%s %v lost %s, more than %s/%s %v's %s",
						a.Callee, a.Caller, a.Tier, pct(a.Loss[p]), b.Callee, b.Caller, b.Tier, pct(b.Loss[p]))
				}
			}
		}
	}
}
