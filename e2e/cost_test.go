//go:build unix

package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/loadgen"
)

// costLimits makes checkout count tokens that its app reports in each
// response, after the fact, and limits web to 300 of them a second.
const costLimits = `services:
  checkout:
    unit: cost
    cost:
      default: 1
      response: x-sluice-cost
    callers:
      web: {limit: 300}
`

// TestCostLimitsAsProcesses: web sends 100 rps to checkout, whose app
// reports in a response header what each request cost: 8 to 12 tokens, 10
// on average, so web offers about 1,000 tokens a second against a limit of
// 300. No request is priced before it runs: the sidecars price requests at
// the mean cost their responses reported, and the controller computes
// ratios on the tokens offered.
//
// The first seconds, before any response has reported a cost and before
// the loop has answered, admit everything: that overshoot is web's debt,
// which the controller makes it pay back by a lowered limit, so those
// seconds are not judged. From 15 s the loop is steady; at 25 s every
// request starts to cost twice as much, which the sidecars learn only from
// the responses, after admitting at the old price: the overshoot is debt
// again, paid back within the payback window (10 s). Over every 10 s
// window from 15 s on, the tokens the app spent on web's admitted requests
// are within ±5 % of the limit's 3,000.
func TestCostLimitsAsProcesses(t *testing.T) { retryBusy(testCostLimitsAsProcesses)(t) }

func testCostLimitsAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 50 s")
	}
	const (
		limit   = 300.0 // tokens a second
		window  = 10    // seconds
		warm    = 15    // the cold start and its debt: not judged
		doubled = 25    // requests cost twice as much from here on
		runFor  = warm + 3*window
	)
	var gen atomic.Pointer[loadgen.Generator]
	var served atomic.Int64
	tokens := make([]atomic.Int64, runFor+2) // by second of the run
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := served.Add(1)
		cost := 8 + k*7%5 // 8 to 12, 10 on average
		if g := gen.Load(); g != nil {
			sec := int(g.Elapsed() / time.Second)
			if sec >= doubled {
				cost *= 2
			}
			tokens[min(sec, len(tokens)-1)].Add(cost)
		}
		w.Header().Set("x-sluice-cost", strconv.FormatInt(cost, 10))
		fmt.Fprintln(w, "from the app")
	}))
	t.Cleanup(app.Close)
	ctl, _, sidecars := startCheckoutLoop(t, costLimits, app.URL, "checkout's cost unit", func(p *sluicev1.DropPolicy) bool {
		return p.GetUnit() == sluicev1.Unit_UNIT_COST
	})

	g, err := loadgen.New(loadgen.Options{
		Targets:  targets(sidecars),
		Callers:  []loadgen.Caller{{Name: "web", Rate: rate(100)}},
		Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	gen.Store(g)
	type tick struct{ ratio, debt, offered float64 }
	ticks := make([]tick, runFor)
	ctx, cancel := context.WithTimeout(context.Background(), runFor*time.Second+startTimeout)
	defer cancel()
	if err := g.Run(ctx, func(s int) {
		for _, pp := range policy(t, ctl.admin, "callee/checkout").GetPeers() {
			if pp.GetPeer() == "web" {
				ticks[s] = tick{pp.GetDropRatio(), pp.GetDebt(), pp.GetOfferedRps()}
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	for s := range runFor {
		w := g.Second("web", s)
		t.Logf("t=%2ds web sent=%3d admitted=%3d tokens=%4d | policy: offered %6.1f tokens/s, ratio %.3f, debt %6.1f | errors=%d skipped=%d",
			s, w.Sent, w.Admitted, tokens[s].Load(), ticks[s].offered, ticks[s].ratio, ticks[s].debt, w.Errors, w.Skipped)
	}
	requireOnSchedule(t, g, 0, runFor)
	if s := g.Sum("web", 0, runFor+1); s.Errors > 0 || s.Skipped > 0 {
		t.Errorf("web: %d errors, %d skipped: the rig, not the limiter, lost requests", s.Errors, s.Skipped)
	}

	for from := warm; from < runFor; from += window {
		var spent int64
		for s := from; s < from+window; s++ {
			spent += tokens[s].Load()
		}
		want := limit * window
		if math.Abs(float64(spent)-want) > 0.05*want {
			t.Errorf("seconds [%d, %d): the app spent %d tokens on web, want its limit's %v ± 5 %%", from, from+window, spent, want)
		} else {
			t.Logf("seconds [%d, %d): the app spent %d tokens on web (limit %v)", from, from+window, spent, want)
		}
	}
	if want := g.Sum("web", 0, runFor+1).Admitted; served.Load() != want {
		t.Errorf("the app served %d requests, want %d (the admitted ones)", served.Load(), want)
	}
}

// concurrencyLimits caps web's requests in flight at checkout at 10,
// across both sidecars; its rate limit does not bind.
const concurrencyLimits = `services:
  checkout:
    callers:
      web: {limit: 10000, max_concurrency: 10}
`

// TestConcurrencyAsProcesses: checkout's app takes 100 ms a request, and
// web sends 200 rps: 20 requests in flight without a cap. Each of the two
// sidecars holds its share of web's cap of 10, so the app never has more
// than 10 of web's requests at once, from the first request on (a policy
// that counts no sidecar yet gives each one slot); the rest are refused,
// counted, and what is admitted is what 10 slots of 100 ms carry, about
// 100 rps.
func TestConcurrencyAsProcesses(t *testing.T) { retryBusy(testConcurrencyAsProcesses)(t) }

func testConcurrencyAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 25 s")
	}
	const (
		capacity = 10
		latency  = 100 * time.Millisecond
		runFor   = 15
	)
	var inFlight, peak atomic.Int64
	var gen atomic.Pointer[loadgen.Generator]
	peaks := make([]atomic.Int64, runFor+2) // by second of the run
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		raiseTo(&peak, n)
		if g := gen.Load(); g != nil {
			raiseTo(&peaks[min(int(g.Elapsed()/time.Second), len(peaks)-1)], n)
		}
		time.Sleep(latency)
		inFlight.Add(-1)
		fmt.Fprintln(w, "from the app")
	}))
	t.Cleanup(app.Close)
	ctl, _, sidecars := startCheckoutLoop(t, concurrencyLimits, app.URL, "web's concurrency cap", func(p *sluicev1.DropPolicy) bool {
		for _, pp := range p.GetPeers() {
			if pp.GetPeer() == "web" && pp.GetMaxConcurrency() == capacity {
				return true
			}
		}
		return false
	})

	g, err := loadgen.New(loadgen.Options{
		Targets:  targets(sidecars),
		Callers:  []loadgen.Caller{{Name: "web", Rate: rate(200)}},
		Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	gen.Store(g)
	// The policy each second: the global rate the sidecars split the cap
	// by, and the live sidecars.
	type tick struct {
		offered float64
		live    uint32
	}
	ticks := make([]tick, runFor)
	ctx, cancel := context.WithTimeout(context.Background(), runFor*time.Second+startTimeout)
	defer cancel()
	if err := g.Run(ctx, func(s int) {
		p := policy(t, ctl.admin, "callee/checkout")
		for _, pp := range p.GetPeers() {
			if pp.GetPeer() == "web" {
				ticks[s] = tick{pp.GetOfferedRps(), p.GetLiveInstances()}
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	for s := range runFor {
		w := g.Second("web", s)
		t.Logf("t=%2ds web sent=%3d admitted=%3d dropped=%3d errors=%d skipped=%d | at most %2d in flight | policy: offered %5.1f rps, %d live",
			s, w.Sent, w.Admitted, w.Dropped, w.Errors, w.Skipped, peaks[s].Load(), ticks[s].offered, ticks[s].live)
	}
	requireOnSchedule(t, g, 0, runFor)
	if s := g.Sum("web", 0, runFor+1); s.Errors > 0 || s.Skipped > 0 {
		t.Errorf("web: %d errors, %d skipped: the rig, not the limiter, lost requests", s.Errors, s.Skipped)
	}

	if p := peak.Load(); p > capacity {
		t.Errorf("the app had %d of web's requests in flight at once, want at most its cap of %d", p, capacity)
	} else {
		t.Logf("the app had at most %d of web's requests in flight (cap %d)", p, capacity)
	}
	// 10 slots of 100 ms carry 100 rps; the shares are whole slots per
	// sidecar, and a slot is free again only once the response is back.
	// Judged from the 4th second: until the controller has counted the
	// sidecars, each holds one slot, not five.
	if got := admittedRate(g, "web", 3, runFor); got < 0.7*capacity/latency.Seconds() || got > capacity/latency.Seconds() {
		t.Errorf("web: %.1f rps admitted, want what %d slots of %v carry: 70 to 100 rps", got, capacity, latency)
	} else {
		t.Logf("web: %.1f rps admitted through %d slots of %v", got, capacity, latency)
	}
	var refused float64
	for _, s := range sidecars {
		n, _ := metric(t, s.admin, "sluice_sidecar_concurrency_dropped_total", `service="checkout"`)
		refused += n
	}
	if dropped := g.Sum("web", 0, runFor+1).Dropped; refused != float64(dropped) {
		t.Errorf("sluice_sidecar_concurrency_dropped_total{service=\"checkout\"} = %v over the sidecars, want web's %d refusals", refused, dropped)
	}
}

// raiseTo sets a to n if n is larger, for concurrent callers.
func raiseTo(a *atomic.Int64, n int64) {
	for p := a.Load(); n > p && !a.CompareAndSwap(p, n); p = a.Load() {
	}
}
