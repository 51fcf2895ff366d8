//go:build unix

package e2e

import (
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// proxylessMethodLimits declares one gRPC method of checkout with a limit
// for web, a proxyless client enforced upstream; web's other methods fall
// in _other, under web's limit across methods.
const proxylessMethodLimits = `
services:
  checkout:
    callers:
      web: {limit: 1000, enforcement: upstream} # a proxyless gRPC client
    procedures:
      /shop.Checkout/Pay:
        callers:
          web: {limit: 150}
`

// TestProxylessPerMethodLimits runs the whole loop for a proxyless caller
// of a callee that declares a gRPC method: a real gRPC-Go xDS client (web)
// calls /shop.Checkout/Pay at 5× its leaf limit of 150 rps and
// /shop.Checkout/Browse, undeclared, well under web's limit across
// methods, open loop; the callee is a real gRPC server behind sluice's
// inbound interceptors (testbed.GRPCCallee), reporting to a real
// aggregator and controller, which serves the client a route per method.
//
// Once Pay's leaf ratio is up (1 − 150/750 = 0.8):
//   - Pay is admitted at its limit, −20 % to +10 %. Never above: that
//     would be the per-method route missing. The low side is wide because
//     at p = 0.8 each arrival the callee counts weighs 1/(1−p) = 5, so
//     the offered rate it reports is noisy, and the law, quick to raise a
//     ratio and slow to release it, then sits above 0.8 on average: 9 %
//     under the limit at 750 rps here, 25 % at 200 rps (40 arrivals a
//     second), which is why the rates are this high;
//   - Browse is never aborted: its route, the catch-all, is at web's
//     _other leaf, ratio 0;
//   - the callee counts Pay's offered load through the 1/(1−p) weighting:
//     it reports what the client sent ± 10 %, drops nothing itself, and
//     counts every Pay call that reached the app as an upstream arrival.
func TestProxylessPerMethodLimits(t *testing.T) { retryBusy(testProxylessPerMethodLimits)(t) }

func testProxylessPerMethodLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: a whole loop for half a minute")
	}
	const (
		pay, browse = "/shop.Checkout/Pay", "/shop.Checkout/Browse"
		payRate     = 750.0
		payLimit    = 150.0
		browseRate  = 40.0
		runFor      = 30 // seconds of load
		settleTicks = 3
		tol         = 0.10
	)
	c, callee, reg := startProxylessCallee(t, proxylessMethodLimits, sidecar.GRPCOptions{})
	tick := controller.DefaultConfig().Tick // startProxylessCallee's controller's
	testkit.WaitFor(t, 15*time.Second, "the callee holds web's Pay leaf as enforced upstream", func() bool {
		p := callee.Limiter.Policy("checkout")
		return p != nil && p.Leaf("web", pay) != nil && p.Leaf("web", pay).Enforcement == dataplane.EnforceUpstream
	})
	leafRatioNow := func(procedure string) float64 {
		if svc := c.Controller(); svc != nil {
			for _, p := range svc.Policies() {
				if p.GetName() == "callee/checkout" {
					return leafRatio(p, "web", procedure)
				}
			}
		}
		return math.NaN()
	}

	web := newProxylessClient(t, c.ControllerAddr, "web", "web-1")
	start := time.Now()
	var load *grpcLoad
	var wg sync.WaitGroup
	wg.Go(func() {
		load = runGRPCLoad(t, []*grpc.ClientConn{web.cc}, runFor, []grpcFlow{
			{method: pay, caller: "web", rate: payRate},
			{method: browse, caller: "web", rate: browseRate},
		})
	})
	t.Cleanup(wg.Wait) // before the cluster closes, on any way out
	var ratioMu sync.Mutex
	ratioAt := make([][]float64, runFor+1) // Pay's published leaf ratio, sampled per second of the load
	wg.Go(func() {
		for s := 0; s <= runFor; s = int(time.Since(start).Seconds()) {
			r := leafRatioNow(pay)
			ratioMu.Lock()
			ratioAt[s] = append(ratioAt[s], r)
			ratioMu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	})
	testkit.WaitFor(t, 20*time.Second, "the controller publishes web's Pay leaf at ≥ 0.7", func() bool {
		return leafRatioNow(pay) >= 0.7
	})
	// The window: whole seconds of the load from settleTicks ticks after
	// the ratio was up, to one second before its end.
	held := int(time.Since(start).Seconds()+settleTicks*tick.Seconds()) + 1
	end := runFor - 1
	if end-held < 10 {
		t.Fatalf("Pay's ratio was up only %v after the load started: no 10 s window left", time.Since(start).Round(time.Millisecond))
	}
	leafCounts := func(procedure string) sidecar.PeerCounts {
		for _, pc := range callee.Limiter.AppendCounts("checkout", nil) {
			if pc.Peer == "web" && pc.Procedure == procedure {
				return pc
			}
		}
		return sidecar.PeerCounts{}
	}
	time.Sleep(time.Until(start.Add(time.Duration(held) * time.Second)))
	c1, ratio1 := leafCounts(pay), leafRatioNow(pay)
	time.Sleep(time.Until(start.Add(time.Duration(end) * time.Second)))
	c2, ratio2 := leafCounts(pay), leafRatioNow(pay)
	wg.Wait()

	for s := range runFor {
		p, b := load.second(0, s), load.second(1, s)
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range ratioAt[s] {
			lo, hi = min(lo, r), max(hi, r)
		}
		t.Logf("t=%2ds Pay sent=%3d ok=%3d exhausted=%3d (published %.3f..%.3f) | Browse sent=%2d exhausted=%d | errors=%d",
			s, p.sent, p.ok, p.exhausted, lo, hi, b.sent, b.exhausted, p.errors+b.errors)
	}
	load.requireOnSchedule(t, held, end)
	if e := load.sum(0, 0, runFor).errors + load.sum(1, 0, runFor).errors; e > 0 {
		t.Errorf("%d calls failed with neither OK nor RESOURCE_EXHAUSTED: the rig, not the limiter", e)
	}
	secs := float64(end - held)
	p := load.sum(0, held, end)
	admitted, sent := float64(p.ok)/secs, float64(p.sent)/secs
	reported := float64(c2.Offered-c1.Offered) / secs
	t.Logf("window [%d s, %d s): web sent Pay at %.1f rps, %.1f admitted (leaf limit %v); the callee reported %.1f rps offered; Pay's leaf ratio %.3f, then %.3f",
		held, end, sent, admitted, payLimit, reported, ratio1, ratio2)
	if admitted > (1+tol)*payLimit || admitted < (1-2*tol)*payLimit {
		t.Errorf("web's Pay: %.1f calls/s admitted, want its leaf limit %v −%.0f %% to +%.0f %%", admitted, payLimit, 200*tol, 100*tol)
	}
	if math.Abs(reported-sent) > tol*sent {
		t.Errorf("the callee reported web's Pay offered at %.1f rps, the client sent %.1f: want within %.0f %% (arrivals weighed 1/(1−p))", reported, sent, 100*tol)
	}
	if c1.Incarnation != c2.Incarnation {
		t.Errorf("web's Pay leaf was evicted during the window (incarnation %d → %d)", c1.Incarnation, c2.Incarnation)
	}
	b := load.sum(1, 0, runFor)
	if b.exhausted != 0 || b.sent == 0 {
		t.Errorf("web's Browse, an undeclared method under web's limit, lost %d of %d calls; want none", b.exhausted, b.sent)
	} else {
		t.Logf("web's Browse lost none of %d calls; its leaf (%s) ratio %v", b.sent, names.Other, leafRatioNow(names.Other))
	}

	// No second drop at the callee: every Pay call that reached it was
	// an upstream arrival, admitted, and the drops it inferred are the
	// client's.
	ownDrops := leafMetric(t, reg, "sluice_sidecar_requests_total", "web", pay, "dropped")
	arrivals := leafMetric(t, reg, "sluice_sidecar_upstream_arrivals_total", "web", pay, "")
	inferred := leafMetric(t, reg, "sluice_sidecar_upstream_dropped_total", "web", pay, "")
	received := callee.ReceivedMethod("web", pay)
	t.Logf("callee's Pay counters: %v arrivals enforced upstream, %v inferred upstream drops, %v own drops; app received %d",
		arrivals, inferred, ownDrops, received)
	if ownDrops != 0 || arrivals != float64(received) || !(inferred > 0) {
		t.Errorf("callee counted for web's Pay %v own drops, %v upstream arrivals for %d received, %v inferred drops; want 0, all, > 0",
			ownDrops, arrivals, received, inferred)
	}
	if got := callee.ReceivedMethod("web", browse); int64(got) != b.ok {
		t.Errorf("callee received %d Browse calls, the client saw %d succeed", got, b.ok)
	}
}
