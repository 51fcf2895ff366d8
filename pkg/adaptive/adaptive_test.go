package adaptive

import (
	"math"
	"strings"
	"testing"
	"time"
)

func mustNew(t testing.TB, cfg Config) *Estimator {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestObjectiveValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Objective
		want []string // fields the error names; none: valid
	}{
		{Objective{LatencyP99: 200 * time.Millisecond, Errors: 0.01}, nil},
		{Objective{LatencyP99: time.Millisecond}, nil},
		{Objective{Errors: 0.5}, nil},
		{Objective{}, []string{"neither"}},
		{Objective{LatencyP99: -time.Second, Errors: 0.01}, []string{"latency_p99"}},
		{Objective{LatencyP99: time.Second, Errors: 1}, []string{"errors"}},
		{Objective{LatencyP99: time.Second, Errors: math.NaN()}, []string{"errors"}},
		{Objective{LatencyP99: -1, Errors: -0.1}, []string{"latency_p99", "errors"}},
	} {
		err := tc.o.Validate()
		if (err == nil) != (tc.want == nil) {
			t.Errorf("%+v: Validate() = %v, want fields %v", tc.o, err, tc.want)
			continue
		}
		for _, f := range tc.want {
			if !strings.Contains(err.Error(), f) {
				t.Errorf("%+v: Validate() = %v, want it to name %s", tc.o, err, f)
			}
		}
	}
}

// Validate names every bad field at once.
func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig(objective).Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	bad := Config{
		Aim: 1.5, MinRate: 0, FloorFraction: 1, CapMultiple: 0.5, MinDecrease: 1,
		NoiseDecrease: math.NaN(), Recovery: 0, Increase: 0, MaxIncrease: 2, Period: -1,
	}
	err := bad.Validate()
	for _, f := range []string{"objective", "aim", "min_rate", "floor_fraction", "cap_multiple", "min_decrease", "noise_decrease", "recovery", "increase", "max_increase", "period"} {
		if err == nil || !strings.Contains(err.Error(), f+":") {
			t.Errorf("Validate() = %v, want it to name %s", err, f)
		}
	}
	if _, err := New(bad); err == nil {
		t.Error("New(bad) = nil error")
	}
	inf := DefaultConfig(objective)
	inf.MinRate, inf.CapMultiple = math.Inf(1), math.Inf(1)
	if err := inf.Validate(); err == nil || !strings.Contains(err.Error(), "min_rate") || !strings.Contains(err.Error(), "cap_multiple") {
		t.Errorf("infinite min_rate and cap_multiple: Validate() = %v", err)
	}
}

func TestReasonString(t *testing.T) {
	for r, want := range map[Reason]string{NoData: "no_data", Holding: "holding", ProbingUp: "probing_up", BackingOff: "backing_off", 9: "Reason(9)"} {
		if got := r.String(); got != want {
			t.Errorf("Reason(%d).String() = %q, want %q", r, got, want)
		}
	}
}

var hostile = []struct {
	name string
	dt   time.Duration
	s    Sample
}{
	{"zero dt", 0, Sample{Offered: 400, Admitted: 400, Goodput: 1, P99: time.Hour, Errors: 1}},
	{"negative dt", -time.Second, Sample{Offered: 400, Admitted: 400, Goodput: 1, P99: time.Hour, Errors: 1}},
	{"no traffic", time.Second, Sample{}},
	{"nothing answered", time.Second, Sample{Offered: 10, Admitted: 10}},
	{"NaN offered", time.Second, Sample{Offered: math.NaN(), Admitted: 10, Goodput: 10}},
	{"NaN admitted", time.Second, Sample{Offered: 10, Admitted: math.NaN(), Goodput: 10}},
	{"NaN goodput", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: math.NaN()}},
	{"NaN errors", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, Errors: math.NaN()}},
	{"NaN in flight", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, InFlight: math.NaN()}},
	{"Inf offered", time.Second, Sample{Offered: math.Inf(1), Admitted: 10, Goodput: 10}},
	{"Inf admitted", time.Second, Sample{Offered: 10, Admitted: math.Inf(1), Goodput: 10}},
	{"Inf goodput", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: math.Inf(1)}},
	{"Inf errors", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, Errors: math.Inf(1)}},
	{"Inf in flight", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, InFlight: math.Inf(1)}},
	{"negative offered", time.Second, Sample{Offered: -1, Admitted: 10, Goodput: 10}},
	{"negative admitted", time.Second, Sample{Offered: 10, Admitted: -10, Goodput: 10}},
	{"negative goodput", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: -10}},
	{"negative p99", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, P99: -time.Second}},
	{"negative errors", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, Errors: -0.5}},
	{"errors above 1", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, Errors: 1.5}},
	{"negative in flight", time.Second, Sample{Offered: 10, Admitted: 10, Goodput: 10, InFlight: -1}},
}

// A hostile sample says nothing: the estimate holds, exactly, whatever the
// state it meets, and the next good sample finds the state as it was.
func TestHostileSamples(t *testing.T) {
	good := Sample{Offered: 400, Admitted: 200, Goodput: 200, P99: 50 * time.Millisecond}
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			fresh, warm, twin := mustNew(t, DefaultConfig(objective)), mustNew(t, DefaultConfig(objective)), mustNew(t, DefaultConfig(objective))
			if got := fresh.Step(h.dt, h.s); got != (Estimate{Reason: NoData}) {
				t.Errorf("fresh: %+v, want no estimate, no data", got)
			}
			r := newRun(t, DefaultConfig(objective), shape)
			for range 20 {
				tk := r.step(400)
				s := Sample{Offered: tk.offered, Admitted: tk.admitted, Goodput: tk.Goodput, P99: tk.P99, Errors: tk.Errors, InFlight: tk.InFlight}
				warm.Step(time.Second, s)
				twin.Step(time.Second, s)
			}
			before := warm.Estimate()
			for range 5 {
				if got := warm.Step(h.dt, h.s); got.Capacity != before.Capacity || got.Reason != NoData {
					t.Fatalf("warm: %+v, want %v held, no data", got, before.Capacity)
				}
			}
			if a, b := warm.Step(time.Second, good), twin.Step(time.Second, good); a != b {
				t.Errorf("after the hostile samples %+v, without them %+v", a, b)
			}
		})
	}
}

func TestStepAllocs(t *testing.T) {
	e := mustNew(t, DefaultConfig(objective))
	s := Sample{Offered: 400, Admitted: 200, Goodput: 200, P99: 50 * time.Millisecond}
	if n := testing.AllocsPerRun(100, func() { e.Step(time.Second, s) }); n != 0 {
		t.Errorf("Step allocates %v times, want 0", n)
	}
}

func BenchmarkStep(b *testing.B) {
	e := mustNew(b, DefaultConfig(objective))
	samples := [...]Sample{
		{Offered: 400, Admitted: 200, Goodput: 200, P99: 50 * time.Millisecond},
		{Offered: 400, Admitted: 210, Goodput: 200, P99: 120 * time.Millisecond},
		{Offered: 400, Admitted: 190, Goodput: 200, P99: 250 * time.Millisecond, Errors: 0.02},
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		e.Step(time.Second, samples[i%len(samples)])
		i++
	}
}

// A controller ticks more often than its fleet's health changes while a
// surge brings its ticks forward: the steps within one Period are one
// decision, not twenty. Without the period, the sample below (a violated
// objective, the same until the next report) halved the estimate at every
// urgent tick: 7,600 → 3,800 → … → 119 in 300 ms.
func TestPeriodOneDecision(t *testing.T) {
	cfg := DefaultConfig(objective)
	violated := Sample{Offered: 18000, Admitted: 18000, Goodput: 7600, P99: 128 * time.Millisecond, Errors: 0.33}
	e := mustNew(t, cfg)
	first := e.Step(50*time.Millisecond, violated)
	if first.Reason != BackingOff || first.Capacity != 7600*cfg.MinDecrease {
		t.Fatalf("first step: %+v, want backing off to %v", first, 7600*cfg.MinDecrease)
	}
	for i := 1; i < 20; i++ { // urgent ticks, 50ms apart, reading the same health
		if got := e.Step(50*time.Millisecond, violated); got.Capacity != first.Capacity {
			t.Fatalf("step %d, %v after the decision: %+v, want %v held", i, time.Duration(i)*50*time.Millisecond, got, first.Capacity)
		}
	}
	// The next decision comes a period after the first, on a violated
	// sample that shows the first carried out (the callee admitted no
	// more than it, Estimator.downTo), and the period after that on one
	// that the decrease's own sample did not cover: two periods.
	carried := Sample{Offered: 18000, Admitted: first.Capacity, Goodput: first.Capacity * (1 - 0.33), P99: 128 * time.Millisecond, Errors: 0.33}
	decided := func(e *Estimator, dt time.Duration) (steps int) {
		for steps = 1; steps <= 100; steps++ {
			if got := e.Step(dt, carried); got.Reason == BackingOff {
				if got.Capacity >= first.Capacity {
					t.Errorf("a second decision %+v, want below %v", got, first.Capacity)
				}
				return steps
			}
		}
		return -1
	}
	if n := decided(e, 50*time.Millisecond); n < 20 || n > 41 {
		t.Errorf("the second decrease after %d more steps of 50ms, want after one or two periods (20 to 40)", n)
	}

	// A controller's ticks come a few µs either side of the period:
	// each one decides.
	e = mustNew(t, cfg)
	e.Step(time.Second, violated)
	for i := range 10 {
		if got := e.Step(time.Second-time.Duration(i+1)*time.Microsecond, carried); got.Reason == Holding && e.pending != 0 {
			t.Fatalf("step %d, a hair under the period: held as too soon (%+v)", i, got)
		}
	}

	cfg.Period = 0 // every step decides, as before
	e = mustNew(t, cfg)
	e.Step(50*time.Millisecond, violated)
	if n := decided(e, 50*time.Millisecond); n != 2 {
		t.Errorf("without a period, the second decrease after %d steps of 50ms, want 2 (one to see the first carried out)", n)
	}
}

// A step that comes late (a busy machine's controller, or a tick held
// as too soon before it) is one decision: it probes as far as a step on
// time. Before, a late step probed twice as far, and a sped-up probe
// taken with two seconds at once went 12 % past the knee in a step
// through the real loop.
func TestLateStepProbesOnce(t *testing.T) {
	healthy := Sample{Offered: 1000, Admitted: 100, Goodput: 100, P99: 50 * time.Millisecond}
	limited := Sample{Offered: 1000, Admitted: 200, Goodput: 200, P99: 50 * time.Millisecond}
	probe := func(dt time.Duration) float64 {
		e := mustNew(t, DefaultConfig(objective))
		e.Step(time.Second, healthy)
		got := e.Step(dt, limited)
		if got.Reason != ProbingUp {
			t.Fatalf("step of %v: %+v, want probing up", dt, got)
		}
		return got.Capacity
	}
	if onTime, late := probe(time.Second), probe(2*time.Second); late != onTime {
		t.Errorf("a probe taken 2s after the last decision went to %v, one on time to %v: want the same", late, onTime)
	}
}
