//go:build unix

package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/loadgen"
)

// tierLimits gives checkout a capacity of 260 rps, shed by tier. web may
// send 150 rps in all and claim CRITICAL_PLUS; mobile and batch claim no
// more than the service's max, CRITICAL.
const tierLimits = `services:
  checkout:
    capacity: 260
    criticality:
      from: header x-sluice-criticality
      default: CRITICAL
      max: CRITICAL
    callers:
      web:    {limit: 150}
      mobile: {limit: 200, max_criticality: CRITICAL_PLUS}
`

// tierRatio is the drop ratio of peer's tier in p (procedure ""); NaN when
// p does not list it.
func tierRatio(p *sluicev1.DropPolicy, peer string, tier sluicev1.Criticality) float64 {
	for _, pp := range p.GetPeers() {
		if pp.GetPeer() == peer && pp.GetProcedure() == "" && pp.GetCriticality() == tier {
			return pp.GetDropRatio()
		}
	}
	return math.NaN()
}

// TestCriticalityAsProcesses: checkout's capacity is 260 rps and it is
// offered 320, through two real sidecars:
//
//   - mobile sends 100 rps CRITICAL_PLUS, which it may claim;
//   - web sends 100 rps CRITICAL and 100 rps SHEDDABLE, over its own limit
//     of 150;
//   - batch sends 20 rps claiming CRITICAL_PLUS, which it may not: the
//     sidecars lower the claim to CRITICAL, and count it.
//
// The critical tiers, 220 rps in all, fit with room for a second's noise
// in their measured rates: they lose nothing. web's own limit sheds its
// SHEDDABLE half first (to 50 rps), and the capacity, with 40 rps left
// after the critical tiers, cuts it to 40: the whole cut comes from web's
// sheddable requests, and checkout admits its capacity.
func TestCriticalityAsProcesses(t *testing.T) { retryBusy(testCriticalityAsProcesses)(t) }

func testCriticalityAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 25 s")
	}
	const (
		capacity = 260.0
		shedFits = 40.0 // what the critical tiers leave for web's SHEDDABLE requests
		runFor   = 15
		held     = 3 // from the 4th second on, the loop has answered
	)
	app, served := countingApp(t)
	ctl, _, sidecars := startCheckoutLoop(t, tierLimits, app.URL, "checkout's tiers", func(p *sluicev1.DropPolicy) bool {
		return p.GetCriticality() != nil
	})

	as := func(caller, tier string) http.Header {
		return http.Header{"X-Sluice-Caller": {caller}, "X-Sluice-Criticality": {tier}}
	}
	flows := []loadgen.Caller{
		{Name: "mobile-critical-plus", Header: as("mobile", "CRITICAL_PLUS"), Rate: rate(100)},
		{Name: "web-critical", Header: as("web", "CRITICAL"), Rate: rate(100)},
		{Name: "web-sheddable", Header: as("web", "SHEDDABLE"), Rate: rate(100)},
		{Name: "batch-claims-plus", Header: as("batch", "CRITICAL_PLUS"), Rate: rate(20)},
	}
	g, err := loadgen.New(loadgen.Options{Targets: targets(sidecars), Callers: flows, Duration: runFor * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	shedRatio := make([]float64, runFor)
	ctx, cancel := context.WithTimeout(context.Background(), runFor*time.Second+startTimeout)
	defer cancel()
	if err := g.Run(ctx, func(s int) {
		shedRatio[s] = tierRatio(policy(t, ctl.admin, "callee/checkout"), "web", sluicev1.Criticality_CRITICALITY_SHEDDABLE)
	}); err != nil {
		t.Fatal(err)
	}
	for s := range runFor {
		line := fmt.Sprintf("t=%2ds", s)
		for _, f := range flows {
			x := g.Second(f.Name, s)
			line += fmt.Sprintf(" | %s %3d/%3d", f.Name, x.Admitted, x.Sent)
		}
		t.Logf("%s | web SHEDDABLE ratio %.3f", line, shedRatio[s])
	}
	requireOnSchedule(t, g, 0, runFor)
	for _, f := range flows {
		if s := g.Sum(f.Name, 0, runFor+1); s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", f.Name, s.Errors, s.Skipped)
		}
	}

	// The critical tiers lose nothing once the loop has answered; before,
	// no ratio is in force and nothing is dropped at all.
	for _, flow := range []string{"mobile-critical-plus", "web-critical", "batch-claims-plus"} {
		s := g.Sum(flow, 0, runFor+1)
		t.Logf("%s lost %.3f %% (%d of %d)", flow, 100*float64(s.Dropped)/float64(s.Sent), s.Dropped, s.Sent)
		if s.Dropped > 0 {
			t.Errorf("%s, a critical tier within capacity, lost %d of %d; want none", flow, s.Dropped, s.Sent)
		}
	}
	// The critical tiers admit all they send, so the sheddable tier's
	// error is the total's: ± 5 % of the capacity.
	if got := admittedRate(g, "web-sheddable", held, runFor); math.Abs(got-shedFits) > 0.05*capacity {
		t.Errorf("web's SHEDDABLE requests: %.1f rps admitted over seconds [%d, %d), want %v ± %v", got, held, runFor, shedFits, 0.05*capacity)
	} else {
		t.Logf("web's SHEDDABLE requests: %.1f rps admitted over seconds [%d, %d) (what the critical tiers leave: %v)", got, held, runFor, shedFits)
	}
	var total float64
	for _, f := range flows {
		total += admittedRate(g, f.Name, held, runFor)
	}
	if math.Abs(total-capacity) > 0.05*capacity {
		t.Errorf("checkout admitted %.1f rps over seconds [%d, %d), want its capacity %v ± 5 %%", total, held, runFor, capacity)
	} else {
		t.Logf("checkout admitted %.1f rps over seconds [%d, %d) (capacity %v)", total, held, runFor, capacity)
	}
	var want int64
	for _, f := range flows {
		want += g.Sum(f.Name, 0, runFor+1).Admitted
	}
	if served.Load() != want {
		t.Errorf("the app served %d requests, want %d (the admitted ones)", served.Load(), want)
	}
	var lowered float64
	for _, s := range sidecars {
		n, _ := metric(t, s.admin, "sluice_sidecar_criticality_lowered_total", `service="checkout"`)
		lowered += n
	}
	if sent := g.Sum("batch-claims-plus", 0, runFor+1).Sent; lowered != float64(sent) {
		t.Errorf("sluice_sidecar_criticality_lowered_total{service=\"checkout\"} = %v over the sidecars, want %d: each of batch's claims", lowered, sent)
	}
}
