// Package e2e runs sluice's whole loop over real gRPC and HTTP on loopback:
// a controller, three zone aggregators, six sidecars in front of an app, and
// open-loop load through them.
package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

const (
	limit     = 100.0 // rps, for both callers
	surgeRate = 500.0 // web's surge: 5× its limit
	calmRate  = 50.0  // half the limit
)

func checkoutLimits() *limits.Set {
	return limits.NewSet(map[string]*limits.Service{
		"checkout": {
			Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{
				"web":   {Limit: limit, Mode: dropratio.Enforce},
				"batch": {Limit: limit, Mode: dropratio.Enforce},
			},
		},
	})
}

// startCluster runs the loop at the binaries' default intervals (1s
// report, flush and tick), with a shorter warm-up to keep the test short.
func startCluster(t *testing.T) *testbed.Cluster {
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.Warmup = 2 * time.Second
	logs := &testLog{w: t.Output()}
	c, err := testbed.Start(testbed.Options{
		Service:         "checkout",
		Zones:           []string{"zone-a", "zone-b", "zone-c"},
		SidecarsPerZone: 2,
		Limits:          checkoutLimits(),
		Controller:      &cfg,
		Logger:          slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		logs.close()
	})
	testkit.WaitFor(t, 15*time.Second, "every sidecar holds a policy", func() bool {
		for _, s := range c.Sidecars {
			if s.Agent.Limiter().Policy("checkout") == nil {
				return false
			}
		}
		return true
	})
	return c
}

// testLog carries the components' logs into the test's output (shown when
// it fails), and drops them once the test is over: a straggling goroutine
// must not write to a finished test.
type testLog struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	return l.w.Write(p)
}

func (l *testLog) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

func rate(r float64) func(time.Duration) float64 { return func(time.Duration) float64 { return r } }

// admittedRate is a caller's mean admitted rate over seconds [from, to).
func admittedRate(g *loadgen.Generator, caller string, from, to int) float64 {
	return float64(g.Sum(caller, from, to).Admitted) / float64(to-from)
}

// requireOnSchedule ends a test whose load generator could not keep its
// schedule over seconds [from, to), the ones the test judges: the rates it
// measured are the machine's (a burst after a stall is a surge the loop
// answers, rightly, by dropping more), not the loop's: see tooBusy.
func requireOnSchedule(t *testing.T, g *loadgen.Generator, from, to int) {
	t.Helper()
	requireDelivered(t, g.OffSchedule(from, to), from, to)
}

// requireDelivered is requireOnSchedule for a run whose off-schedule
// seconds in [from, to) are late.
func requireDelivered(t *testing.T, late []int, from, to int) {
	t.Helper()
	if len(late) == 0 {
		return
	}
	tooBusy(t, offScheduleMsg(late, from, to))
}

func offScheduleMsg(late []int, from, to int) string {
	return fmt.Sprintf("the load went out more than 10 %% off its schedule in seconds %v of [%d, %d): the machine is too busy for this run to say anything about the loop", late, from, to)
}

// logSeconds prints the run, one line a second, for whoever reads a failure.
func logSeconds(t *testing.T, g *loadgen.Generator, seconds int, ratio func(int) float64) {
	t.Helper()
	for s := range seconds {
		w, b := g.Second("web", s), g.Second("batch", s)
		t.Logf("t=%2ds web sent=%3d admitted=%3d dropped=%3d ratio=%.3f | batch sent=%3d dropped=%d errors=%d skipped=%d",
			s, w.Sent, w.Admitted, w.Dropped, ratio(s), b.Sent, b.Dropped, w.Errors+b.Errors, w.Skipped+b.Skipped)
	}
}

// TestLoopHoldsASurge: web goes from half its limit to 5× it; the loop
// brings its global admitted rate to the limit within 5 s and holds it
// there, batch (under its limit) loses nothing, and once the surge ends the
// ratio returns to 0.
func TestLoopHoldsASurge(t *testing.T) { retryBusy(testLoopHoldsASurge)(t) }

func testLoopHoldsASurge(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: about 35 s")
	}
	c := startCluster(t)

	const (
		surgeStart = 5
		surgeEnd   = 25
		runFor     = 35
	)
	ratios := make([]float64, runFor)
	g, err := loadgen.New(loadgen.Options{
		Targets: c.SidecarURLs(),
		Callers: []loadgen.Caller{
			{Name: "web", Rate: func(t time.Duration) float64 {
				if t >= surgeStart*time.Second && t < surgeEnd*time.Second {
					return surgeRate
				}
				return calmRate
			}},
			{Name: "batch", Rate: rate(calmRate)},
		},
		Duration:    runFor * time.Second,
		SecondEnded: func(s int) { ratios[s] = c.Ratio("web") },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	logSeconds(t, g, runFor, func(s int) float64 { return ratios[s] })

	requireOnSchedule(t, g, 0, runFor)
	for _, caller := range []string{"web", "batch"} {
		if s := g.Sum(caller, 0, runFor); s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", caller, s.Errors, s.Skipped)
		}
	}

	// Time to enforce: the first second the admitted rate is within ±5 %.
	enforced := -1
	for s := surgeStart; s < surgeEnd; s++ {
		if math.Abs(float64(g.Second("web", s).Admitted)-limit) <= 0.05*limit {
			enforced = s - surgeStart
			break
		}
	}
	t.Logf("time to enforce: %d s", enforced)

	// Steady state: from 5 s after the surge began to its end.
	steady := admittedRate(g, "web", surgeStart+5, surgeEnd)
	if math.Abs(steady-limit) > 0.05*limit {
		t.Errorf("web admitted %.1f rps over the steady state, want %v ± 5 %%", steady, limit)
	} else {
		t.Logf("web admitted %.1f rps over the steady state (limit %v)", steady, limit)
	}

	batch := g.Sum("batch", 0, runFor)
	if loss := float64(batch.Dropped) / float64(batch.Sent); loss >= 0.001 {
		t.Errorf("batch, under its limit, lost %.3f %% (%d of %d)", 100*loss, batch.Dropped, batch.Sent)
	}

	testkit.WaitFor(t, 15*time.Second, "web's ratio returns to 0 after the surge", func() bool {
		for _, s := range c.Sidecars {
			p := s.Agent.Limiter().Policy("checkout")
			if r := p.Rule("web"); r != nil && r.DropRatio != 0 {
				return false
			}
		}
		return true
	})
}

// TestControllerRestart: mid-surge the controller stops; every sidecar keeps
// the very policy it held, so web keeps being dropped at that ratio; a new
// controller comes up on the same address and the loop converges again.
func TestControllerRestart(t *testing.T) { retryBusy(testControllerRestart)(t) }

func testControllerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: about 35 s")
	}
	c := startCluster(t)

	const (
		stopAt  = 10
		startAt = 16
		runFor  = 30
	)
	var (
		mu      sync.Mutex
		held    []*sidecar.Policy // each sidecar's policy once the controller is gone
		changed []string          // sidecars whose policy changed while it was away
	)
	policies := func() []*sidecar.Policy {
		ps := make([]*sidecar.Policy, len(c.Sidecars))
		for i, s := range c.Sidecars {
			ps[i] = s.Agent.Limiter().Policy("checkout")
		}
		return ps
	}
	ratios := make([]float64, runFor)
	errs := make(chan error, 2)
	g, err := loadgen.New(loadgen.Options{
		Targets:  c.SidecarURLs(),
		Callers:  []loadgen.Caller{{Name: "web", Rate: rate(surgeRate)}, {Name: "batch", Rate: rate(calmRate)}},
		Duration: runFor * time.Second,
		SecondEnded: func(s int) {
			ratios[s] = c.Ratio("web")
			mu.Lock()
			if held != nil && s+1 < startAt {
				for i, p := range policies() {
					if p != held[i] {
						changed = append(changed, fmt.Sprintf("t=%ds %s", s, c.Sidecars[i].Name))
					}
				}
			}
			mu.Unlock()
			switch s + 1 {
			case stopAt:
				go func() {
					err := c.StopController()
					mu.Lock()
					held = policies()
					mu.Unlock()
					errs <- err
				}()
			case startAt:
				go func() { errs <- c.StartController(c.ControllerAddr) }()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("restart: %v", err)
		}
	}
	logSeconds(t, g, runFor, func(s int) float64 { return ratios[s] })
	requireOnSchedule(t, g, 0, runFor)

	// While the controller is away, the sidecars keep their policies: the
	// same objects, so web is dropped at the ratio it had when it left.
	if len(changed) > 0 {
		t.Errorf("policies changed while the controller was away: %v", changed)
	}
	for i, p := range held {
		if p == nil || p.Rule("web") == nil || p.Rule("web").DropRatio < 0.5 {
			t.Fatalf("%s held %v when the controller left, want web's surge ratio", c.Sidecars[i].Name, p)
		}
	}
	heldRatio := held[0].Rule("web").DropRatio
	away := g.Sum("web", stopAt+1, startAt)
	if share := float64(away.Admitted) / float64(away.Sent); math.Abs(share-(1-heldRatio)) > 0.03 {
		t.Errorf("web admitted %.3f of its requests while the controller was away, want 1 − %.3f held", share, heldRatio)
	}

	// Before the stop and after the restart, web is at its limit.
	before := admittedRate(g, "web", 6, stopAt)
	after := admittedRate(g, "web", startAt+6, runFor)
	t.Logf("web admitted: %.1f rps before, %.1f while the controller was away (ratio held %.3f), %.1f after", before, admittedRate(g, "web", stopAt+1, startAt), heldRatio, after)
	for _, phase := range []struct {
		name string
		rate float64
	}{{"before the stop", before}, {"after the restart", after}} {
		if math.Abs(phase.rate-limit) > 0.05*limit {
			t.Errorf("web admitted %.1f rps %s, want %v ± 5 %%", phase.rate, phase.name, limit)
		}
	}
	for s := stopAt; s < runFor; s++ {
		if ratios[s] < 0.5 {
			t.Errorf("t=%ds: web's ratio fell to %.3f around the restart", s, ratios[s])
		}
	}
	if c.Controller() == nil || c.Controller().XDSStreams() == 0 {
		t.Error("sidecars did not reconnect to the new controller")
	}
}
