//go:build unix

package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/loadgen/rig"
)

// startDescriptorLoop is startCheckoutLoop until checkout's policy names
// a descriptor.
func startDescriptorLoop(t *testing.T, limitsDoc, upstream string) (ctl, agg *node, sidecars []*node) {
	t.Helper()
	return startCheckoutLoop(t, limitsDoc, upstream, "checkout's descriptors", func(p *sluicev1.DropPolicy) bool {
		return len(p.GetDescriptors()) > 0
	})
}

// valueRatio is the drop ratio p's descriptor gives value; NaN when p does
// not list it.
func valueRatio(p *sluicev1.DropPolicy, desc, value string) float64 {
	for _, d := range p.GetDescriptors() {
		if d.GetName() != desc {
			continue
		}
		for _, v := range d.GetValues() {
			if v.GetValue() == value {
				return v.GetDropRatio()
			}
		}
	}
	return math.NaN()
}

// A descriptor test's traffic: one abusive value at 5× the limit, and a
// crowd whose n-th request carries value n mod crowdValues, that no limit
// binds.
const (
	valueLimit  = 20.0  // rps per value, in the limits
	abuserRate  = 100.0 // 5× it
	crowdValues = 100_000
	valueHeld   = 3 // the abuser is held from this second on
)

// A crowd sends rate requests a second for seconds, the n-th with value n
// mod crowdValues. The tenant test sends 1,000 rps for 101 s: all 100,000
// values. The rig and the processes behind it run without the race
// detector (plainBinaries): race-built, this load kept both cores busy.
// The client-ip test, the same code behind another Vary, sends 15 s of
// it: 15,000 addresses.
type crowdLoad struct {
	rate    float64
	seconds int
}

// sampleSeconds calls sample at the end of each of n seconds from now, on
// a goroutine of its own, until ctx ends or stop is called; stop returns
// once the goroutine has, and the values (NaN for seconds not reached)
// may be read then.
func sampleSeconds(ctx context.Context, n int, sample func() float64) (values []float64, stop func()) {
	values = make([]float64, n)
	for i := range values {
		values[i] = math.NaN()
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for i := range values {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			values[i] = sample()
		}
	}()
	return values, func() { cancel(); <-done }
}

// startRig starts the load rig (internal/loadgen/rig), which serves the
// app behind the sidecars and sends the load, and returns its base URL.
func startRig(t *testing.T) string {
	t.Helper()
	p := start(t, "loadrig", "loadrig", "--listen=127.0.0.1:0")
	return "http://" + p.addr(t, "http")
}

// runDescriptorLoad has the rig send the abuser's and the crowd's
// requests through sidecars, the crowd's varied by crowd, and checks what
// every descriptor test asserts: the rig kept its schedule, the abuser's
// admitted rate is its limit ± 5 % once held, the crowd lost < 0.1 %, and
// the app saw exactly the admitted requests.
func runDescriptorLoad(t *testing.T, ctl, agg *node, sidecars []*node, rigURL, desc string, abuser http.Header, abuserValue string,
	load crowdLoad, crowd *rig.Vary) {
	t.Helper()
	secs := load.seconds
	plan := rig.Plan{Targets: targets(sidecars), Seconds: secs, Callers: []rig.Caller{
		{Name: "abuser", Header: abuser, Rate: abuserRate},
		{Name: "crowd", Rate: load.rate, Vary: crowd},
	}}
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(secs)*time.Second+startTimeout)
	defer cancel()
	// The controller's ratio for the abuser at the end of each second,
	// sampled while the rig runs, for the log.
	ratios, stop := sampleSeconds(ctx, secs, func() float64 {
		p, err := fetchPolicy(ctl.admin, "callee/checkout")
		if err != nil {
			return math.NaN()
		}
		return valueRatio(p, desc, abuserValue)
	})
	res, err := rig.Run(ctx, rigURL, plan)
	stop()
	if err != nil {
		t.Fatal(err)
	}
	for s := range secs {
		a, c := res.Sum("abuser", s, s+1), res.Sum("crowd", s, s+1)
		t.Logf("t=%2ds abuser sent=%3d admitted=%3d (ratio %.3f) | crowd sent=%3d dropped=%d | errors=%d skipped=%d",
			s, a.Sent, a.Admitted, ratios[s], c.Sent, c.Dropped, a.Errors+c.Errors, a.Skipped+c.Skipped)
	}
	requireDelivered(t, res.OffSchedule, 0, secs)
	for _, flow := range []string{"abuser", "crowd"} {
		if s := res.Sum(flow, 0, secs); s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", flow, s.Errors, s.Skipped)
		}
	}
	logDescriptorRejections(t, ctl, agg, sidecars)

	held := res.Sum("abuser", valueHeld, secs)
	if got := float64(held.Admitted) / float64(secs-valueHeld); math.Abs(got-valueLimit) > 0.05*valueLimit {
		t.Errorf("the abusive %s: %.1f rps admitted over seconds [%d, %d), want %v ± 5 %%", desc, got, valueHeld, secs, valueLimit)
	} else {
		t.Logf("the abusive %s: %.1f rps admitted over seconds [%d, %d) (limit %v)", desc, got, valueHeld, secs, valueLimit)
	}
	c := res.Sum("crowd", 0, secs)
	loss := float64(c.Dropped) / float64(c.Sent)
	t.Logf("the crowd: %d requests from %d distinct values of %s, lost %.4f %% (%d)", c.Sent, min(c.Sent, crowdValues), desc, 100*loss, c.Dropped)
	if loss >= 0.001 {
		t.Errorf("the crowd, every %s far under its limit, lost %.3f %% (%d of %d), want < 0.1 %%", desc, 100*loss, c.Dropped, c.Sent)
	}
	if want := res.Sum("abuser", 0, secs).Admitted + c.Admitted; res.Served != want {
		t.Errorf("the app served %d requests, want %d (the admitted ones)", res.Served, want)
	}
	for _, s := range sidecars {
		if n, _ := metric(t, s.admin, "sluice_sidecar_descriptor_dropped_total", `descriptor="`+desc+`"`); !(n > 0) {
			t.Errorf("%s: sluice_sidecar_descriptor_dropped_total{descriptor=%q} = %v, want > 0", s.Name(), desc, n)
		}
	}
}

// countingApp is an upstream that counts the requests it serves.
func countingApp(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var served atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.WriteString(w, "from the app\n")
	}))
	t.Cleanup(app.Close)
	return app, &served
}

// TestTenantLimitsAsProcesses: every value of a descriptor may send 20 rps
// to checkout. One value sends 5× that, among a crowd of distinct values
// (100,000 tenants; 15,000 addresses), one request each, through two
// real sidecars: the abuser is held to its limit and the crowd loses nothing,
// though no tier holds a value the reports did not find heavy.
//
//   - tenant: the value is the x-tenant-id header;
//   - client-ip: the value is the client's address behind one trusted
//     proxy (X-Forwarded-For, "xff 1"), which the load generator plays:
//     each crowd request comes from an address of its own.
func TestTenantLimitsAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 2 minutes")
	}
	plainBinaries(t)
	t.Run("tenant", retryBusy(func(t *testing.T) {
		app := startRig(t)
		ctl, agg, sidecars := startDescriptorLoop(t, fmt.Sprintf(`services:
  checkout:
    descriptors:
      tenant:
        from: header x-tenant-id
        limit: %v
`, valueLimit), app)
		runDescriptorLoad(t, ctl, agg, sidecars, app, "tenant", http.Header{"X-Tenant-Id": {"abuser"}}, "abuser",
			crowdLoad{rate: 1000, seconds: 101}, &rig.Vary{Header: "X-Tenant-Id", Format: "tenant-%05d", Modulo: crowdValues})
	}))
	t.Run("client-ip", retryBusy(func(t *testing.T) {
		app := startRig(t)
		ctl, agg, sidecars := startDescriptorLoop(t, fmt.Sprintf(`services:
  checkout:
    descriptors:
      client_ip:
        from: xff 1
        limit: %v
`, valueLimit), app)
		runDescriptorLoad(t, ctl, agg, sidecars, app, "client_ip", http.Header{"X-Forwarded-For": {"203.0.113.7"}}, "203.0.113.7",
			crowdLoad{rate: 1000, seconds: 15}, &rig.Vary{Header: "X-Forwarded-For", Format: "ipv4", Modulo: crowdValues})
	}))
}

// logDescriptorRejections logs what each tier left out of the descriptors,
// for whoever reads a failure.
func logDescriptorRejections(t *testing.T, ctl, agg *node, sidecars []*node) {
	t.Helper()
	for _, m := range []struct {
		n      *node
		metric string
	}{
		{agg, "sluice_aggregator_entries_rejected_total"},
		{agg, "sluice_aggregator_descriptor_values_cut_total"},
		{agg, "sluice_aggregator_reports_rejected_total"},
		{ctl, "sluice_controller_descriptor_entries_rejected_total"},
		{ctl, "sluice_controller_descriptor_values"},
		{ctl, "sluice_controller_descriptor_values_cut"},
	} {
		v, _ := metric(t, m.n.admin, m.metric)
		t.Logf("%s: %s = %v", m.n.Name(), m.metric, v)
	}
	for _, s := range sidecars {
		v, _ := metric(t, s.admin, "sluice_sidecar_descriptor_heavy_fullness")
		r, _ := metric(t, s.admin, "sluice_sidecar_report_sent_total")
		t.Logf("%s: heavy fullness %v, reports sent %v", s.Name(), v, r)
	}
}
