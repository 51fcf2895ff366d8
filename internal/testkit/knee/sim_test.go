package knee

import (
	"math"
	"strings"
	"testing"
	"time"
)

var shape = Config{Workers: 10, Service: 50 * time.Millisecond, Queue: 100} // knee 200 rps

func newSim(t *testing.T, c Config) *Sim {
	t.Helper()
	s, err := NewSim(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// Below the knee the app answers everything in its service time; above it
// the queue fills, latency grows to the service time plus a full queue's
// wait, the excess is refused and the goodput is the knee.
func TestSimKnee(t *testing.T) {
	if got := shape.Knee(); got != 200 {
		t.Fatalf("Knee() = %v, want 200", got)
	}
	s := newSim(t, shape)
	for range 5 {
		tk := s.Run(time.Second, 100)
		if !near(tk.Goodput, 100, 1e-6) || tk.Errors != 0 || tk.P99 != shape.Service {
			t.Fatalf("at half the knee: %+v, want goodput 100, no errors, p99 %v", tk, shape.Service)
		}
	}
	var last Tick
	for i := range 5 {
		tk := s.Run(time.Second, 400)
		if tk.P99 < last.P99 {
			t.Errorf("at twice the knee, tick %d: p99 %v fell from %v", i, tk.P99, last.P99)
		}
		last = tk
	}
	full := shape.Service + time.Duration(float64(shape.Queue)/shape.Knee()*float64(time.Second)) // 550ms
	if !near(last.Goodput, 200, 1e-6) || !near(last.Errors, 0.5, 1e-6) || !near(last.P99.Seconds(), full.Seconds(), 0.011) {
		t.Fatalf("at twice the knee, settled: %+v, want goodput 200, errors 0.5, p99 %v", last, full)
	}
	if !near(last.InFlight, float64(shape.Queue+shape.Workers), 1e-6) {
		t.Errorf("in flight %v, want %d", last.InFlight, shape.Queue+shape.Workers)
	}
	// Offered nothing, the queue drains at the knee: the first tick's
	// answers still waited, the next are back to the service time.
	if tk := s.Run(time.Second, 0); !near(tk.Goodput, 100, 1e-6) || tk.P99 < 500*time.Millisecond {
		t.Errorf("draining: %+v, want goodput 100 (the queue), p99 about %v", tk, full)
	}
	if tk := s.Run(time.Second, 50); tk.P99 != shape.Service || !near(tk.Goodput, 50, 1e-6) {
		t.Errorf("drained: %+v, want p99 %v", tk, shape.Service)
	}
}

// A brownout: half the workers halve the knee from the next tick.
func TestSimSetWorkers(t *testing.T) {
	s := newSim(t, shape)
	s.Run(time.Second, 150)
	s.SetWorkers(5)
	if s.Knee() != 100 {
		t.Fatalf("Knee() = %v after SetWorkers(5), want 100", s.Knee())
	}
	tk := s.Run(time.Second, 150)
	if !near(tk.Goodput, 100, 1e-6) || tk.P99 <= shape.Service {
		t.Fatalf("after the brownout: %+v, want goodput 100 and a queue", tk)
	}
	s.SetService(25 * time.Millisecond)
	if s.Knee() != 200 {
		t.Fatalf("Knee() = %v after SetService(25ms), want 200", s.Knee())
	}
}

func TestSimDeterministic(t *testing.T) {
	a, b := newSim(t, shape), newSim(t, shape)
	for i := range 50 {
		rate := float64(i%7) * 80
		if x, y := a.Run(time.Second, rate), b.Run(time.Second, rate); x != y {
			t.Fatalf("tick %d: %+v and %+v", i, x, y)
		}
	}
}

func TestSimHostileRate(t *testing.T) {
	s := newSim(t, shape)
	for _, r := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -5} {
		if tk := s.Run(time.Second, r); tk.Offered != 0 || tk.Goodput != 0 || tk.P99 != 0 {
			t.Errorf("rate %v: %+v, want nothing offered", r, tk)
		}
	}
	if tk := s.Run(0, 100); tk.Offered != 0 || tk.Goodput != 0 || tk.P99 != 0 {
		t.Errorf("dt 0: %+v, want nothing offered", tk)
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Workers: 0, Service: 0, Queue: -1}.Validate()
	for _, field := range []string{"workers", "service", "queue"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %v, want it to name %s", err, field)
		}
	}
	if err := shape.Validate(); err != nil {
		t.Errorf("Validate() = %v for %+v", err, shape)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New(Config{}) = nil error")
	}
	if _, err := NewSim(Config{}); err == nil {
		t.Error("NewSim(Config{}) = nil error")
	}
}

// Answered holds what Run's tick counted: as many answers as its goodput,
// at latencies whose top is its p99, from the service time up.
func TestSimAnswered(t *testing.T) {
	s := newSim(t, shape)
	for _, rate := range []float64{100, 400, 400, 50} {
		tk := s.Run(time.Second, rate)
		var n float64
		lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
		s.Answered(func(d time.Duration, k float64) {
			n += k
			lo, hi = min(lo, d), max(hi, d)
		})
		if !near(n, tk.Goodput, 1e-6) {
			t.Errorf("at %v rps: %v answers, goodput %v", rate, n, tk.Goodput)
		}
		if lo < shape.Service-time.Microsecond || hi < tk.P99-time.Microsecond {
			t.Errorf("at %v rps: latencies %v to %v, want from the service time %v and up to p99 %v", rate, lo, hi, shape.Service, tk.P99)
		}
	}
}
