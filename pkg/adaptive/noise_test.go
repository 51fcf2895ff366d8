package adaptive

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The knee measured through noise: each tick's goodput and admitted rate
// off by up to ±noise, its p99 by up to ±3·noise (a fleet's measurement
// of a tail), from a seeded source. Up to ±2 % the estimate still settles
// within 10 % of the knee with the p99 in the objective, in at most 5 s,
// and stays there; at ±5 % (the rates alone can no longer tell a probe's
// queue) within 15 %, in at most 10 s.
func TestNoisyKnee(t *testing.T) {
	for _, tc := range []struct {
		noise, tol float64
		within     int
	}{{0.01, 0.1, 5}, {0.02, 0.1, 5}, {0.05, 0.15, 10}} {
		noise := tc.noise
		for seed := range uint64(5) {
			r := newRun(t, DefaultConfig(objective), shape)
			rng := rand.New(rand.NewPCG(seed, 18))
			jitter := func(x, by float64) float64 { return x * (1 + by*(2*rng.Float64()-1)) }
			for range 120 {
				offered := 2 * shape.Knee()
				admitted := offered
				if c := r.est.Estimate().Capacity; c > 0 {
					admitted = min(offered, c)
				}
				k := r.sim.Knee()
				m := r.sim.Run(time.Second, admitted)
				s := Sample{
					Offered: offered, Admitted: jitter(admitted, noise), Goodput: jitter(m.Goodput, noise),
					P99: time.Duration(jitter(float64(m.P99), 3*noise)), Errors: m.Errors, InFlight: m.InFlight,
				}
				r.log = append(r.log, tick{len(r.log) + 1, offered, admitted, k, m, r.est.Step(time.Second, s)})
			}
			at := r.settled(0, len(r.log), tc.tol)
			lo, hi := 10.0, 0.0
			for _, tk := range r.log[max(at, 10)-1:] {
				lo, hi = min(lo, tk.Capacity/tk.knee), max(hi, tk.Capacity/tk.knee)
			}
			t.Logf("noise ±%.0f %%, seed %d: settled after %ds, then %.1f%%..%+.1f%% of the knee", 100*noise, seed, at, 100*(lo-1), 100*(hi-1))
			if at < 0 || at > tc.within {
				r.dump(t)
				t.Errorf("noise ±%.0f %%, seed %d: settled within %.0f %% after %ds, want ≤ %ds", 100*noise, seed, 100*tc.tol, at, tc.within)
			}
		}
	}
}
