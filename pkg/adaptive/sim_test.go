package adaptive

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/knee"
)

// The estimator's tests run it against the modelled knee of
// internal/testkit/knee, in simulated time, one tick a second: each tick
// the callee is offered a rate, admits it up to the estimate (all of it
// before there is one), and the estimator is given what the model did.

var (
	objective = Objective{LatencyP99: 200 * time.Millisecond, Errors: 0.01}
	shape     = knee.Config{Workers: 10, Service: 50 * time.Millisecond, Queue: 100} // knee 200 rps
)

type run struct {
	est *Estimator
	sim *knee.Sim
	log []tick
}

func newRun(t testing.TB, cfg Config, k knee.Config) *run {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := knee.NewSim(k)
	if err != nil {
		t.Fatal(err)
	}
	return &run{est: e, sim: s}
}

// tick is one second of a run: what was offered and admitted, what the
// model did, the estimate after it, and the model's knee during it.
type tick struct {
	at                      int
	offered, admitted, knee float64
	knee.Tick
	Estimate
}

func (t tick) String() string {
	return fmt.Sprintf("t=%3ds knee=%4.0f offered=%5.0f admitted=%6.1f goodput=%6.1f p99=%6v errors=%.3f -> %6.1f %v",
		t.at, t.knee, t.offered, t.admitted, t.Goodput, t.P99.Round(time.Millisecond), t.Errors, t.Capacity, t.Reason)
}

func (r *run) step(offered float64) tick {
	admitted := offered
	if c := r.est.Estimate().Capacity; c > 0 {
		admitted = min(offered, c)
	}
	k := r.sim.Knee()
	m := r.sim.Run(time.Second, admitted)
	s := Sample{Offered: offered, Admitted: admitted, Goodput: m.Goodput, P99: m.P99, Errors: m.Errors, InFlight: m.InFlight}
	tk := tick{len(r.log) + 1, offered, admitted, k, m, r.est.Step(time.Second, s)}
	r.log = append(r.log, tk)
	return tk
}

// dump logs the run when the test fails, so that a failure shows the trace.
func (r *run) dump(t *testing.T) {
	t.Helper()
	if t.Failed() || testing.Verbose() {
		var b strings.Builder
		for _, tk := range r.log {
			fmt.Fprintln(&b, tk)
		}
		t.Log("\n" + b.String())
	}
}

// settled returns the first second from which, over ticks [from, to),
// every estimate is within tol of the knee and every p99 within the
// objective; -1 if none is.
func (r *run) settled(from, to int, tol float64) int {
	at := -1
	for _, tk := range r.log[from:to] {
		ok := math.Abs(tk.Capacity/tk.knee-1) <= tol && tk.P99 <= objective.LatencyP99
		switch {
		case !ok:
			at = -1
		case at < 0:
			at = tk.at
		}
	}
	return at
}

// overshoots counts the times, over ticks [from, to), the estimate went
// past tol above the knee (an excursion counts once), and the largest.
func (r *run) overshoots(from, to int, tol float64) (n int, most float64) {
	above := false
	for _, tk := range r.log[from:to] {
		over := tk.Capacity/tk.knee - 1
		most = max(most, over)
		if over > tol && !above {
			n++
		}
		above = over > tol
	}
	return n, most
}

// From a cold start offered twice the knee, the estimate is within 10 % of
// the knee and the p99 within the objective after at most 5 s of ticks,
// and stays so.
func TestColdStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    knee.Config
	}{
		{"knee 200 rps, 50ms", shape},
		{"knee 40 rps, 100ms", knee.Config{Workers: 4, Service: 100 * time.Millisecond, Queue: 40}},
		{"knee 10k rps, 10ms", knee.Config{Workers: 100, Service: 10 * time.Millisecond, Queue: 5000}},
		{"knee 100 rps, 140ms", knee.Config{Workers: 14, Service: 140 * time.Millisecond, Queue: 50}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t, DefaultConfig(objective), tc.k)
			defer r.dump(t)
			for range 120 {
				r.step(2 * tc.k.Knee())
			}
			at := r.settled(0, len(r.log), 0.1)
			n, most := r.overshoots(at, len(r.log), 0.1)
			t.Logf("settled after %ds; afterwards the estimate went at most %.1f %% past the knee", at, 100*most)
			if at < 0 || at > 5 {
				t.Errorf("settled within 10 %% of the knee with p99 ≤ %v after %ds, want ≤ 5s", objective.LatencyP99, at)
			}
			if n > 0 {
				t.Errorf("%d overshoots past 10 %% of the knee once settled", n)
			}
		})
	}
}

// An objective with errors alone, or latency alone: a cold start offered
// twice the knee still settles within 10 % of it in at most 5 s, the
// objective held from then on (the errors or the p99: the other is free).
func TestOneSidedObjective(t *testing.T) {
	for _, obj := range []Objective{{Errors: 0.01}, {LatencyP99: 200 * time.Millisecond}} {
		t.Run(fmt.Sprintf("%+v", obj), func(t *testing.T) {
			r := newRun(t, DefaultConfig(obj), shape)
			defer r.dump(t)
			for range 120 {
				r.step(2 * shape.Knee())
			}
			at := -1
			for _, tk := range r.log {
				ok := math.Abs(tk.Capacity/tk.knee-1) <= 0.1 &&
					(obj.Errors == 0 || tk.Errors <= obj.Errors) && (obj.LatencyP99 == 0 || tk.P99 <= obj.LatencyP99)
				switch {
				case !ok:
					at = -1
				case at < 0:
					at = tk.at
				}
			}
			n, most := r.overshoots(max(at, 1)-1, len(r.log), 0.1)
			t.Logf("settled after %ds; afterwards %d overshoots past 10 %%, at most %.1f %%", at, n, 100*most)
			if at < 0 || at > 5 {
				t.Errorf("settled after %ds, want ≤ 5s", at)
			}
		})
	}
}

// The callee's capacity halves for 30 s (half its workers, or a service
// time twice as long: a slow database): the estimate finds the new knee,
// at most one overshoot past 10 % of it, and releases it after the
// capacity returns.
func TestBrownout(t *testing.T) {
	for _, tc := range []struct {
		name        string
		brown, heal func(*knee.Sim)
	}{
		{"half the workers", func(s *knee.Sim) { s.SetWorkers(5) }, func(s *knee.Sim) { s.SetWorkers(10) }},
		{"twice the service time", func(s *knee.Sim) { s.SetService(100 * time.Millisecond) }, func(s *knee.Sim) { s.SetService(50 * time.Millisecond) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t, DefaultConfig(objective), shape)
			defer r.dump(t)
			offered := 2 * shape.Knee()
			for range 30 {
				r.step(offered)
			}
			tc.brown(r.sim)
			for range 30 {
				r.step(offered)
			}
			tc.heal(r.sim)
			for range 60 {
				r.step(offered)
			}
			found := r.settled(30, 60, 0.1)
			if found < 0 {
				t.Fatal("the estimate never settled within 10 % of the new knee with the p99 in the objective")
			}
			n, most := r.overshoots(found-1, 60, 0.1)
			t.Logf("brownout at 31s: found within 10 %% at %ds (%ds on), %d overshoots past 10 %%, at most %.1f %%", found, found-30, n, 100*most)
			if found < 0 || found-30 > 10 {
				t.Errorf("found the new knee %ds after the brownout, want ≤ 10s", found-30)
			}
			if n > 1 {
				t.Errorf("%d overshoots past 10 %% of the new knee, want at most one", n)
			}
			released := r.settled(60, 120, 0.1)
			if released < 0 {
				t.Fatal("the estimate never settled within 10 % of the knee after the recovery")
			}
			n, most = r.overshoots(released-1, 120, 0.1)
			t.Logf("recovery at 61s: released within 10 %% at %ds (%ds on), %d overshoots past 10 %%, at most %.1f %%", released, released-60, n, 100*most)
			if released < 0 || released-60 > 30 {
				t.Errorf("released to the old knee %ds after the recovery, want ≤ 30s", released-60)
			}
			if n > 1 {
				t.Errorf("%d overshoots past 10 %% of the knee after recovery, want at most one", n)
			}
		})
	}
}

// Offered under the knee, the estimate never limits the callee, never
// collapses, and never grows past twice the most it has seen healthy.
func TestUnderKnee(t *testing.T) {
	r := newRun(t, DefaultConfig(objective), shape)
	defer r.dump(t)
	peak := 0.0
	for i := range 180 {
		offered := 100.0 // half the knee, then a tenth, then back, with a wobble
		switch {
		case i >= 120:
			offered = 120 + 20*math.Sin(float64(i))
		case i >= 60:
			offered = 20
		}
		tk := r.step(offered)
		peak = max(peak, offered)
		if tk.admitted != offered {
			t.Fatalf("%v: admitted %v of %v under the knee", tk, tk.admitted, offered)
		}
		if tk.Capacity < offered || tk.Capacity > 2*peak {
			t.Fatalf("%v: estimate out of [%v, %v]", tk, offered, 2*peak)
		}
		if tk.Reason != Holding {
			t.Fatalf("%v: want holding", tk)
		}
	}
}

// One tick of noise (a p99 ten times the objective and half the answers
// failing, or no goodput at all) costs at most a tenth of the estimate: a
// callee limited by it has it back within a few ticks, one under it is
// never limited.
func TestSingleTickNoise(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offered float64
		noise   func(*Sample)
	}{
		{"limited, latency spike", 400, func(s *Sample) { s.P99 = 2 * time.Second }},
		{"limited, errors", 400, func(s *Sample) { s.Errors = 0.5; s.Goodput /= 2 }},
		{"limited, goodput lost", 400, func(s *Sample) { s.Goodput = 1e-9 }},
		{"under the knee, latency spike", 100, func(s *Sample) { s.P99 = 2 * time.Second }},
		{"under the knee, errors", 100, func(s *Sample) { s.Errors = 0.5; s.Goodput /= 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t, DefaultConfig(objective), shape)
			defer r.dump(t)
			for range 30 {
				r.step(tc.offered)
			}
			before := r.est.Estimate().Capacity
			// One tick of the model, reported through the noise.
			admitted := min(tc.offered, before)
			m := r.sim.Run(time.Second, admitted)
			s := Sample{Offered: tc.offered, Admitted: admitted, Goodput: m.Goodput, P99: m.P99, Errors: m.Errors, InFlight: m.InFlight}
			tc.noise(&s)
			got := r.est.Step(time.Second, s)
			t.Logf("%.1f -> %.1f (%v) on %+v", before, got.Capacity, got.Reason, s)
			if got.Capacity < 0.9*before-1e-9 {
				t.Errorf("one noisy tick took the estimate from %.1f to %.1f, more than a tenth", before, got.Capacity)
			}
			back := -1
			for i := range 10 {
				tk := r.step(tc.offered)
				if tk.Capacity >= 0.95*before && back < 0 {
					back = i + 1
				}
				if tc.offered < shape.Knee() && tk.admitted < tc.offered {
					t.Fatalf("%v: limited under the knee", tk)
				}
			}
			if tc.offered > shape.Knee() && (back < 0 || back > 3) {
				t.Errorf("estimate back within 5 %% of %.1f after %d ticks, want ≤ 3", before, back)
			}
		})
	}
}

// An objective the callee misses whatever its load (a bad deploy failing
// every other request) sheds to the floor, a tenth of the last healthy
// goodput, not to zero.
func TestFloor(t *testing.T) {
	e, err := New(DefaultConfig(objective))
	if err != nil {
		t.Fatal(err)
	}
	healthy := Sample{Offered: 100, Admitted: 100, Goodput: 100, P99: 50 * time.Millisecond}
	for range 5 {
		e.Step(time.Second, healthy)
	}
	bad := Sample{Offered: 100, P99: 50 * time.Millisecond, Errors: 0.5}
	for range 60 {
		c := e.Estimate().Capacity
		bad.Admitted = min(100, c)
		bad.Goodput = bad.Admitted / 2
		if got := e.Step(time.Second, bad); got.Capacity < 10 {
			t.Fatalf("estimate %v, below the floor of 10", got)
		}
	}
	if got := e.Estimate().Capacity; got != 10 {
		t.Errorf("after a minute of errors the estimate is %v, want the floor, 10", got)
	}
}

// lagged is step with the loop's lag: each tick's estimate reaches the
// callee lag ticks later (in a fleet, the controller's policy reaches the
// sidecars during the next report window, and that window's sample comes
// a tick later: a lag of 2; more on a busy machine).
func (r *run) lagged(offered float64, pending []float64) tick {
	admitted := offered
	if c := pending[0]; c > 0 {
		admitted = min(offered, c)
	}
	k := r.sim.Knee()
	m := r.sim.Run(time.Second, admitted)
	s := Sample{Offered: offered, Admitted: admitted, Goodput: m.Goodput, P99: m.P99, Errors: m.Errors, InFlight: m.InFlight}
	tk := tick{len(r.log) + 1, offered, admitted, k, m, r.est.Step(time.Second, s)}
	copy(pending, pending[1:])
	pending[len(pending)-1] = tk.Capacity
	r.log = append(r.log, tk)
	return tk
}

// TestStepsThroughTheLoopsLag: with the loop's lag, of two ticks or of
// four, a cold start offered twice the knee cuts once and waits for the
// cut to show before it acts again: the estimate never falls under 40 % of
// the knee, and is within 10 % of it, its p99 within the objective, in at
// most 8 ticks (12 at a lag of 4), and stays there. Without waiting for
// its steps to show, it cut for the overload it had already answered:
// a callee offered twice its knee went to a fifth of it through the real
// loop (TestAdaptiveCapacityAsProcesses), and probes ran past the knee
// by several steps.
func TestStepsThroughTheLoopsLag(t *testing.T) {
	for _, tc := range []struct {
		lag, by int
		settle  time.Duration
	}{{2, 8, 0}, {2, 8, 2 * time.Second}, {4, 12, 0}} {
		t.Run(fmt.Sprintf("lag %d settle %v", tc.lag, tc.settle), func(t *testing.T) {
			cfg := DefaultConfig(objective)
			cfg.Settle = tc.settle
			r := newRun(t, cfg, shape)
			defer r.dump(t)
			pending := make([]float64, tc.lag)
			lowest := math.Inf(1)
			for range 40 {
				if tk := r.lagged(2*r.sim.Knee(), pending); tk.Capacity > 0 {
					lowest = min(lowest, tk.Capacity)
				}
			}
			k := shape.Knee()
			if lowest < 0.4*k {
				t.Errorf("the estimate fell to %.0f, want at least 40 %% of the knee %.0f", lowest, k)
			}
			if at := r.settled(0, 40, 0.1); at < 0 || at > tc.by {
				t.Errorf("within 10 %% of the knee for good from tick %d, want by tick %d", at, tc.by)
			}
		})
	}
}
