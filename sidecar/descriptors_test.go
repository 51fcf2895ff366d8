package sidecar

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"
)

// tenantPolicy is an inbound policy of service api with one descriptor,
// tenant, edited by edit.
func tenantPolicy(edit func(*DescriptorPolicy)) *Policy {
	d := DescriptorPolicy{
		Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"},
		LimitRPS: 10, MissingLimitRPS: 10, Quantile: allowance.DefaultQuantile,
	}
	if edit != nil {
		edit(&d)
	}
	return &Policy{Name: names.Callee("api"), Service: "api", LiveInstances: 1, Descriptors: []DescriptorPolicy{d}}
}

// newDescLimiter returns a Limiter of one stripe (deterministic decisions)
// holding p, and api's handle.
func newDescLimiter(t testing.TB, p *Policy) (*Limiter, *ServiceLimiter) {
	t.Helper()
	l := NewLimiter(LimiterOptions{OneStripe: true})
	l.SetPolicy(p)
	return l, l.Service("api")
}

// decideValue decides n requests of value and returns the drops, checking
// each names the descriptor.
func decideValue(t testing.TB, s *ServiceLimiter, value string, n int) int {
	t.Helper()
	drops := 0
	for range n {
		d := s.DecideDescriptor(0, value)
		if d.Drop {
			drops++
			if d.Descriptor() != "tenant" || d.Rule() != nil || d.v.http == nil || d.v.grpcErr == nil {
				t.Fatalf("drop of %q: descriptor %q, rule %v, rendered %v", value, d.Descriptor(), d.Rule(), d.v.http != nil)
			}
		} else if d != (Decision{}) {
			t.Fatalf("admitted %q as %+v, want the zero Decision", value, d)
		}
	}
	return drops
}

func TestDescriptorListedRatio(t *testing.T) {
	for _, p := range []float64{0, 0.1, 0.3, 0.5, 0.9, 0.99} {
		l, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
			d.Values = []ValueRule{{Value: "acme", DropRatio: p, LimitRPS: 10, OfferedRPS: 100}}
		}))
		const n = 10000
		drops := decideValue(t, s, "acme", n)
		// Diffused over the value's own count: exact to one request.
		if want := p * n; math.Abs(float64(drops)-want) > 1 {
			t.Errorf("ratio %v: %d of %d dropped, want %v ± 1", p, drops, n, want)
		}
		c := l.RotateDescriptors("api", nil)
		if len(c) != 1 || c[0].Offered != n || c[0].Dropped != uint64(drops) {
			t.Errorf("ratio %v: reported %+v, want offered %d dropped %d", p, c, n, drops)
		}
	}
}

// TestDescriptorListedIgnoresOthers: a listed value's drops follow its own
// sequence, whatever other values come in between (two tenants taking
// turns at ratio 0.5 must each lose half).
func TestDescriptorListedIgnoresOthers(t *testing.T) {
	_, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
		d.Values = []ValueRule{{Value: "a", DropRatio: 0.5, LimitRPS: 10}, {Value: "b", DropRatio: 0.5, LimitRPS: 10}}
	}))
	da, db := 0, 0
	for range 1000 {
		da += decideValue(t, s, "a", 1)
		db += decideValue(t, s, "b", 1)
	}
	if da != 500 || db != 500 {
		t.Errorf("a lost %d, b lost %d of 1000 each at ratio 0.5", da, db)
	}
}

// TestDescriptorAllowance: an unlisted value is admitted up to the
// allowance in a window, then loses 1 − A/n of its n-th request; over many
// values the drops match the expectation.
func TestDescriptorAllowance(t *testing.T) {
	l, s := newDescLimiter(t, tenantPolicy(nil))
	a := allowance.Allowance(10, 1, DefaultDescriptorWindow, allowance.DefaultQuantile)
	const values, per = 300, 100
	want, variance := 0.0, 0.0
	for n := a + 1; n <= per; n++ {
		p := allowance.LocalDropRatio(a, n)
		want += p
		variance += p * (1 - p)
	}
	want, variance = want*values, variance*values
	drops := 0
	for v := range values {
		value := fmt.Sprintf("tenant-%d", v)
		for n := uint64(1); n <= per; n++ {
			d := decideValue(t, s, value, 1)
			if d > 0 && n <= a {
				t.Fatalf("%s: request %d dropped within the allowance %d", value, n, a)
			}
			drops += d
		}
	}
	if tol := 5 * math.Sqrt(variance); math.Abs(float64(drops)-want) > tol {
		t.Errorf("%d drops, want %.0f ± %.0f (allowance %d)", drops, want, tol, a)
	}
	// A new window starts the allowance again.
	c := l.RotateDescriptors("api", nil)
	if c[0].Dropped != uint64(drops) || c[0].Offered != values*per {
		t.Errorf("reported %+v, want offered %d dropped %d", c[0], values*per, drops)
	}
	if d := decideValue(t, s, "tenant-0", int(a)); d != 0 {
		t.Errorf("after rotation, %d of the first %d requests dropped", d, a)
	}
}

func TestDescriptorOverrideAndMissing(t *testing.T) {
	_, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
		d.LimitRPS, d.MissingLimitRPS = 10, 0
		d.Overrides = []ValueLimit{{Value: "acme", LimitRPS: 1000}, {Value: "zero", LimitRPS: 0}}
	}))
	if d := decideValue(t, s, "acme", 500); d != 0 {
		t.Errorf("override 1000 rps: %d of 500 dropped", d)
	}
	if d := decideValue(t, s, "zero", 5); d != 5 {
		t.Errorf("override 0 rps: %d of 5 dropped", d)
	}
	if d := decideValue(t, s, "", 5); d != 5 {
		t.Errorf("missing, limit 0: %d of 5 dropped", d)
	}
	if d := decideValue(t, s, "other", 10); d != 0 {
		t.Errorf("unlisted at limit 10: %d of its first 10 dropped", d)
	}
	// An override of _missing is its limit.
	_, s = newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
		d.MissingLimitRPS = 0
		d.Overrides = []ValueLimit{{Value: descriptor.Missing, LimitRPS: 1000}}
	}))
	if d := decideValue(t, s, "", 100); d != 0 {
		t.Errorf("missing overridden to 1000 rps: %d of 100 dropped", d)
	}
}

func TestDescriptorInvalidNeverStored(t *testing.T) {
	l, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) { d.LimitRPS = 1e6 }))
	long := strings.Repeat("x", descriptor.MaxValueLen+1)
	for range 100 {
		decideValue(t, s, long, 1)
		decideValue(t, s, "bad\xffutf8", 1)
		decideValue(t, s, "", 1)
	}
	st := s.descStates["tenant"]
	if got := st.totals().invalid; got != 200 {
		t.Errorf("invalid counted %d, want 200", got)
	}
	if got := st.sk.Estimate(descriptor.Invalid); got < 200 {
		t.Errorf("_invalid estimate %d, want ≥ 200", got)
	}
	c := l.RotateDescriptors("api", nil)
	seen := map[string]bool{}
	for _, e := range c[0].Values {
		seen[e.Value] = true
		if descriptor.Value(e.Value) != e.Value {
			t.Errorf("reported value %.20q", e.Value)
		}
	}
	if !seen[descriptor.Invalid] || !seen[descriptor.Missing] || len(seen) != 2 {
		t.Errorf("reported %v, want _invalid and _missing only", c[0].Values)
	}
}

// TestDescriptorPolicySwap: the sketch survives a swap that keeps the
// name; a name the policy drops loses it, a new one starts fresh; an index
// past the policy admits.
func TestDescriptorPolicySwap(t *testing.T) {
	l, s := newDescLimiter(t, tenantPolicy(nil))
	decideValue(t, s, "acme", 7)
	sk := s.descStates["tenant"].sk
	l.SetPolicy(tenantPolicy(func(d *DescriptorPolicy) { d.LimitRPS = 20 }))
	if s.descStates["tenant"].sk != sk || sk.Estimate("acme") != 7 {
		t.Errorf("swap lost the sketch: estimate %d", s.descStates["tenant"].sk.Estimate("acme"))
	}
	l.SetPolicy(tenantPolicy(func(d *DescriptorPolicy) { d.Name = "user" }))
	if s.descStates["tenant"] != nil || s.descStates["user"].sk.Estimate("acme") != 0 {
		t.Errorf("renamed descriptor: states %v", s.descStates)
	}
	for _, i := range []int{-1, 1, 4, math.MaxInt} {
		if d := s.DecideDescriptor(i, "acme"); d != (Decision{}) {
			t.Errorf("DecideDescriptor(%d) = %+v, want admit", i, d)
		}
	}
	l.RemovePolicy("api")
	if d := s.DecideDescriptor(0, "acme"); d != (Decision{}) || s.DescriptorSources() != nil || len(l.RotateDescriptors("api", nil)) != 0 {
		t.Errorf("without a policy: %+v, sources %v", d, s.DescriptorSources())
	}
}

func TestDescriptorReportListedAndBounded(t *testing.T) {
	const k = 16
	l := NewLimiter(LimiterOptions{OneStripe: true, DescriptorHeavy: k})
	l.SetPolicy(tenantPolicy(func(d *DescriptorPolicy) {
		d.LimitRPS = 100 // report threshold, of the missing limit 10: PoissonQuantile(5, .95) = 9
		d.Values = []ValueRule{{Value: "quiet", DropRatio: 0}}
	}))
	s := l.Service("api")
	decideValue(t, s, "quiet", 3) // listed, far under the threshold
	for v := range 1000 {
		decideValue(t, s, fmt.Sprint("light-", v), 2)
	}
	for v := range 2 * k {
		decideValue(t, s, fmt.Sprint("heavy-", v), 100+v)
	}
	c := l.RotateDescriptors("api", nil)
	if len(c[0].Values) != k+1 {
		t.Fatalf("%d values reported, want the heavy-set bound %d and the listed value", len(c[0].Values), k)
	}
	for _, e := range c[0].Values {
		if !strings.HasPrefix(e.Value, "heavy-") && (e.Value != "quiet" || e.Estimate != 3) {
			t.Errorf("reported %+v", e)
		}
	}
	// A listed value is reported by its exact count, whatever it is.
	decideValue(t, s, "quiet", 3)
	c = l.RotateDescriptors("api", c[:0])
	if len(c[0].Values) != 1 || c[0].Values[0].Value != "quiet" || c[0].Values[0].Estimate != 3 {
		t.Errorf("reported %+v, want quiet alone", c[0].Values)
	}
}

func TestDecideDescriptorAllocatesNothing(t *testing.T) {
	_, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
		d.LimitRPS = 1
		d.Values = []ValueRule{{Value: "listed", DropRatio: 0.5}}
	}))
	long := strings.Repeat("y", 1000)
	for _, v := range []string{"listed", "unlisted", "", long, "a\xff"} {
		if got := testing.AllocsPerRun(1000, func() { s.DecideDescriptor(0, v) }); got != 0 {
			t.Errorf("DecideDescriptor(%.10q): %v allocations", v, got)
		}
	}
	if got := testing.AllocsPerRun(100, func() { s.DescriptorSources() }); got != 0 {
		t.Errorf("DescriptorSources: %v allocations", got)
	}
}

// TestDescriptorRace decides, rotates and swaps policies at once; run with
// -race. Every decision is counted once.
func TestDescriptorRace(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(tenantPolicy(nil))
	s := l.Service("api")
	const workers, per = 4, 2000
	var work, rot sync.WaitGroup
	for w := range workers {
		work.Go(func() {
			for i := range per {
				s.DecideDescriptor(0, fmt.Sprint("t", (i*7+w)%50))
			}
		})
	}
	work.Go(func() {
		for i := range 200 {
			l.SetPolicy(tenantPolicy(func(d *DescriptorPolicy) {
				d.LimitRPS = float64(1 + i%5)
				d.Values = []ValueRule{{Value: "t1", DropRatio: 0.5}}
			}))
		}
	})
	done := make(chan struct{})
	var reported uint64
	rot.Go(func() {
		var buf []DescriptorCounts
		for {
			buf = l.RotateDescriptors("api", buf[:0])
			for _, c := range buf {
				reported += c.Offered
			}
			select {
			case <-done:
				return
			default:
			}
		}
	})
	work.Wait()
	close(done)
	rot.Wait()
	for _, c := range l.RotateDescriptors("api", nil) {
		reported += c.Offered
	}
	if reported != workers*per {
		t.Errorf("reported %d offered, decided %d", reported, workers*per)
	}
}

func TestDescriptorMetrics(t *testing.T) {
	l, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
		d.Values = []ValueRule{{Value: "evil", DropRatio: 0.5}}
	}))
	listed := decideValue(t, s, "evil", 100)
	local := decideValue(t, s, "busy", 100)
	decideValue(t, s, "\xff", 3)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(l.Collector()); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`
# HELP sluice_sidecar_descriptor_dropped_total %s
# TYPE sluice_sidecar_descriptor_dropped_total counter
sluice_sidecar_descriptor_dropped_total{descriptor="tenant",reason="listed",service="api"} %d
sluice_sidecar_descriptor_dropped_total{descriptor="tenant",reason="local",service="api"} %d
# HELP sluice_sidecar_descriptor_invalid_total %s
# TYPE sluice_sidecar_descriptor_invalid_total counter
sluice_sidecar_descriptor_invalid_total{descriptor="tenant",service="api"} 3
# HELP sluice_sidecar_descriptor_offered_total %s
# TYPE sluice_sidecar_descriptor_offered_total counter
sluice_sidecar_descriptor_offered_total{descriptor="tenant",service="api"} 203
# HELP sluice_sidecar_descriptor_sketch_bytes %s
# TYPE sluice_sidecar_descriptor_sketch_bytes gauge
sluice_sidecar_descriptor_sketch_bytes{descriptor="tenant",service="api"} %d
`, help(descDroppedDesc), listed, local, help(descInvalidDesc), help(descOfferedDesc), help(descBytesDesc), LimiterOptions{}.descOptions().Bytes())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"sluice_sidecar_descriptor_dropped_total", "sluice_sidecar_descriptor_invalid_total",
		"sluice_sidecar_descriptor_offered_total", "sluice_sidecar_descriptor_sketch_bytes"); err != nil {
		t.Error(err)
	}
	// Two heavy values (evil, busy; the threshold is 9) of K.
	if got, want := testutil.ToFloat64(gauge(t, reg, "sluice_sidecar_descriptor_heavy_fullness")), 2.0/DefaultDescriptorHeavy; got != want {
		t.Errorf("heavy fullness %v, want %v", got, want)
	}
}

// help returns a Desc's help text.
func help(d *prometheus.Desc) string {
	s := d.String()
	i := strings.Index(s, `help: "`) + len(`help: "`)
	return s[i : i+strings.Index(s[i:], `"`)]
}

// gauge returns the one series of name in reg, as a collector.
func gauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "x"}, func() float64 { return mf.GetMetric()[0].GetGauge().GetValue() })
		}
	}
	t.Fatalf("no single series %s", name)
	return nil
}

func TestLimiterOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		o    LimiterOptions
		want []string // fields the error names; none: valid
	}{
		{LimiterOptions{}, nil},
		{LimiterOptions{DescriptorCounters: 1 << 20, DescriptorHeavy: 1024, DescriptorWindow: 5 * time.Second}, nil},
		{LimiterOptions{DescriptorCounters: 10}, []string{"DescriptorCounters 10"}},
		{LimiterOptions{DescriptorHeavy: -1, DescriptorWindow: -time.Second}, []string{"DescriptorHeavy -1", "DescriptorWindow -1s"}},
		{LimiterOptions{DescriptorHeavy: 1 << 17}, []string{"DescriptorHeavy 131072"}},
	} {
		err := c.o.Validate()
		if (err == nil) != (c.want == nil) {
			t.Errorf("%+v: Validate() = %v", c.o, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: Validate() = %v, want it to name %q", c.o, err, w)
			}
		}
	}
	// NewLimiter takes the defaults in place of what Validate rejects.
	l := NewLimiter(LimiterOptions{DescriptorCounters: 10, DescriptorWindow: -time.Second, OneStripe: true})
	l.SetPolicy(tenantPolicy(nil))
	if d := l.Service("api").DecideDescriptor(0, "x"); d.Drop {
		t.Errorf("first request of a value dropped: %+v", d)
	}
}

// An expired policy's fail mode reaches its descriptors: open decays a
// listed value's ratio as it decays a bucket's, and then the value's
// allowance decides it, as any value's; hold and local keep the ratio
// (local: a listed ratio is the value's local share already).
func TestDescriptorFailModes(t *testing.T) {
	for _, tc := range []struct {
		mode dataplane.FailMode
		// limit is the listed value's; at is when, after the TTL, it is
		// decided; want is the share of its requests dropped then.
		limit float64
		at    time.Duration
		want  float64
	}{
		// A limit whose allowance 1,000 requests do not reach: the ratio
		// alone decides.
		{dataplane.FailOpen, 10000, testDecay / 2, 0.4},
		{dataplane.FailOpen, 10000, testDecay, 0},
		{dataplane.FailHold, 10000, testDecay, 0.8},
		{dataplane.FailLocal, 10000, testDecay, 0.8},
		// Decayed, a value over its allowance is limited by it: 1 − A/k
		// for the k-th request past A, 1 − A(1 + ln(n/A))/n over n.
		{dataplane.FailOpen, 10, testDecay, -1},
	} {
		t.Run(fmt.Sprintf("%v-%v-%v", tc.mode, tc.limit, tc.at), func(t *testing.T) {
			p := tenantPolicy(func(d *DescriptorPolicy) {
				d.Values = []ValueRule{{Value: "acme", DropRatio: 0.8, LimitRPS: tc.limit, OfferedRPS: 5 * tc.limit}}
			})
			p.TTL, p.FailMode, p.FailOpenDecay = testTTL, tc.mode, testDecay
			l := NewLimiter(LimiterOptions{OneStripe: true})
			l.SetPolicyAt(p, t0)
			s := l.Service("api")
			l.Expire(t0.Add(testTTL + tc.at))
			if st := s.Status(); st.State != Expired {
				t.Fatalf("status %+v, want expired", st)
			}
			const n = 1000
			got := float64(decideValue(t, s, "acme", n)) / n
			want, tolerance := tc.want, 0.01
			if want < 0 {
				a := float64(allowance.Allowance(tc.limit, 1, time.Second, allowance.DefaultQuantile))
				want, tolerance = 1-a*(1+math.Log(n/a))/n, 0.05
			}
			if math.Abs(got-want) > tolerance {
				t.Errorf("acme lost %.3f of its requests, want %.3f ± %v", got, want, tolerance)
			}
		})
	}
}

// An expired policy's descriptors keep their compiled header keys: a
// request through the HTTP edge under fail mode open is decided, not a
// panic (the fail-open table once lost them and indexed an empty slice).
func TestDescriptorFailOpenAtTheHTTPEdge(t *testing.T) {
	p := tenantPolicy(func(d *DescriptorPolicy) {
		d.Values = []ValueRule{{Value: "acme", DropRatio: 0.8, LimitRPS: 10, OfferedRPS: 50}}
	})
	p.TTL, p.FailMode, p.FailOpenDecay = testTTL, dataplane.FailOpen, testDecay
	l := NewLimiter(LimiterOptions{OneStripe: true})
	l.SetPolicyAt(p, t0)
	s := l.Service("api")
	l.Expire(t0.Add(testTTL + testDecay/2))
	if st := s.Status(); st.State != Expired {
		t.Fatalf("status %+v, want expired", st)
	}
	h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), HTTPOptions{})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("x-tenant-id", "acme")
	req.Header.Set(DefaultCallerHeader, "web")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK && rec.Code != http.StatusTooManyRequests {
		t.Errorf("status %d, want the request decided", rec.Code)
	}
}

// A listed value is reported by its exact count, beside the heavy set and
// outside its bound, whenever it sent a request: not by the sketch's
// estimate, which collisions raise for a value that sent nothing.
func TestListedValuesReportedExactly(t *testing.T) {
	const k = 4
	l := NewLimiter(LimiterOptions{OneStripe: true, DescriptorHeavy: k, DescriptorCounters: 3 * 16})
	l.SetPolicy(tenantPolicy(func(d *DescriptorPolicy) {
		d.Values = []ValueRule{{Value: "quiet", DropRatio: 0.5, LimitRPS: 10, OfferedRPS: 20},
			{Value: "thin", DropRatio: 0.5, LimitRPS: 10, OfferedRPS: 20}}
	}))
	s := l.Service("api")
	// 48 counters, 2,000 distinct values: every counter is far above 0,
	// and a heavy set of 4 is full of them.
	for i := range 2000 {
		decideValue(t, s, fmt.Sprint("noise-", i), 3)
	}
	decideValue(t, s, "thin", 1)
	c := l.RotateDescriptors("api", nil)
	got := map[string]uint32{}
	for _, v := range c[0].Values {
		got[v.Value] = v.Estimate
	}
	if got["thin"] != 1 {
		t.Errorf("thin, listed, sent 1: reported %d", got["thin"])
	}
	if n, ok := got["quiet"]; ok {
		t.Errorf("quiet, listed, sent nothing: reported %d", n)
	}
	if len(c[0].Values) != k+1 {
		t.Errorf("%d values reported, want the heavy set's %d and thin", len(c[0].Values), k)
	}
}

// A value listed during a window is reported at its rate over the whole
// window, not over the part after its listing: its exact count is scaled
// by the descriptor's traffic, in its first window only. A value spread
// thin over a fleet is reported almost only by these counts, and its next
// ratio would fall short of its offered rate.
func TestListedMidWindowReportsTheWholeWindow(t *testing.T) {
	policy := func(listed bool) *Policy {
		return tenantPolicy(func(d *DescriptorPolicy) {
			d.LimitRPS = 1000 // no value of this test passes the report threshold
			if listed {
				d.Values = []ValueRule{{Value: "thin", DropRatio: 0.01, LimitRPS: 1000, OfferedRPS: 2000}}
			}
		})
	}
	// A heavy set of four, which four heavier values fill: thin is
	// reported by its exact count alone.
	l := NewLimiter(LimiterOptions{OneStripe: true, DescriptorHeavy: 4})
	l.SetPolicy(policy(false))
	s := l.Service("api")
	// A window of 400 requests, one in ten thin's, two in ten each heavy
	// value's; thin is listed after the first 100, and counted exactly for
	// the other 300: 30 of its 40.
	send := func(from, to int) {
		for i := from; i < to; i++ {
			v := fmt.Sprint("noise-", i)
			switch j := i % 10; {
			case j == 0:
				v = "thin"
			case j < 9:
				v = fmt.Sprint("heavy-", (j+1)/2)
			}
			decideValue(t, s, v, 1)
		}
	}
	send(0, 100)
	l.SetPolicy(policy(true))
	send(100, 400)
	reported := func() uint32 {
		for _, v := range l.RotateDescriptors("api", nil)[0].Values {
			if v.Value == "thin" {
				return v.Estimate
			}
		}
		return 0
	}
	if got := reported(); got != 40 {
		t.Errorf("thin, listed a quarter into the window, sent 40 in it: reported %d, want 40", got)
	}
	// The next window is counted whole, and reported as counted.
	send(0, 200)
	if got := reported(); got != 20 {
		t.Errorf("thin sent 20 in its second listed window: reported %d, want 20", got)
	}

	// Listed with ten requests of the window to go: scaled, one of them
	// would be 40. A first window is never reported above what the sketch
	// counted of the value in the window.
	late := func(before, after []int) uint32 {
		l, s = newDescLimiter(t, policy(false))
		for i := range 390 {
			v := fmt.Sprint("noise-", i)
			if slices.Contains(before, i) {
				v = "thin"
			}
			decideValue(t, s, v, 1)
		}
		l.SetPolicy(policy(true))
		for i := 390; i < 400; i++ {
			v := fmt.Sprint("noise-", i)
			if slices.Contains(after, i) {
				v = "thin"
			}
			decideValue(t, s, v, 1)
		}
		return reported()
	}
	if got := late([]int{0, 100, 200, 300}, []int{395}); got != 5 {
		t.Errorf("thin, 5 in the window, 1 of them with 10 requests to go: reported %d, want the sketch's 5", got)
	}
	if got := late([]int{0, 100, 200, 300, 385}, nil); got != 0 {
		t.Errorf("thin, 5 in the window, none after its listing: reported %d, want 0", got)
	}
	if got := late(nil, []int{391, 392, 393, 394, 395}); got != 5 {
		t.Errorf("thin, all of its 5 in the window's last 10 requests: reported %d, want the sketch's 5", got)
	}
}

// A listed value spread over many sidecars has a count of one or two on
// each in a window: it still loses its ratio of its requests, not the
// first requests of every window (what diffusion from a fixed phase
// dropped: nearly all of them at a high ratio).
func TestListedValueSpreadThin(t *testing.T) {
	const ratio, windows = 0.9, 20000
	l := NewLimiter(LimiterOptions{OneStripe: true, DescriptorCounters: 3 * 1024}) // a rotation clears them
	l.SetPolicy(tenantPolicy(func(d *DescriptorPolicy) {
		d.Values = []ValueRule{{Value: "acme", DropRatio: ratio, LimitRPS: 10, OfferedRPS: 100}}
	}))
	s := l.Service("api")
	for _, perWindow := range []int{1, 2} {
		drops := 0
		for range windows {
			drops += decideValue(t, s, "acme", perWindow)
			l.RotateDescriptors("api", nil)
		}
		n := float64(windows * perWindow)
		// Binomial at worst (one request a window): 5 standard deviations.
		if got, tol := float64(drops), 5*math.Sqrt(n*ratio*(1-ratio)); math.Abs(got-ratio*n) > tol {
			t.Errorf("%d a window: %v of %v dropped, want %v ± %.0f", perWindow, got, n, ratio*n, tol)
		}
	}
}

// The report threshold is the count a value must pass to be reported
// (allowance.ReportThreshold): a value at it is not heavy, one past it is.
func TestReportThresholdIsPassed(t *testing.T) {
	p := tenantPolicy(nil)
	l, s := newDescLimiter(t, p)
	th := allowance.ReportThreshold(p.Descriptors[0].LimitRPS, p.LiveInstances, DefaultDescriptorWindow, allowance.DefaultQuantile)
	decideValue(t, s, "at", int(th))
	decideValue(t, s, "past", int(th)+1)
	c := l.RotateDescriptors("api", nil)
	var got []string
	for _, v := range c[0].Values {
		got = append(got, v.Value)
	}
	if !slices.Equal(got, []string{"past"}) {
		t.Errorf("threshold %d: reported %q, want only the value past it", th, got)
	}
}

// An unlisted value is decided against what it may send when all of its
// traffic lands on this sidecar (sticky routing), whatever the number of
// live sidecars: a compliant value pinned to one of 300 is not dropped, and
// one past its limit on this sidecar alone is.
func TestAllowanceAssumesAPinnedValue(t *testing.T) {
	p := tenantPolicy(func(d *DescriptorPolicy) { d.LimitRPS = 50 })
	p.LiveInstances = 300
	_, s := newDescLimiter(t, p)
	if drops := decideValue(t, s, "pinned-compliant", 50); drops != 0 {
		t.Errorf("a value at its limit, all on one sidecar of 300: %d of 50 dropped in a window, want 0", drops)
	}
	if drops := decideValue(t, s, "pinned-abuser", 500); drops < 200 {
		t.Errorf("a value at 10× its limit on one sidecar: %d of 500 dropped in a window, want most of the excess", drops)
	}
}

// A listed value whose limit is 0 is blocked: the law's ratio stops at
// PMax, the block does not let its 1 % through.
func TestListedBlockedValue(t *testing.T) {
	_, s := newDescLimiter(t, tenantPolicy(func(d *DescriptorPolicy) {
		d.Values = []ValueRule{{Value: "banned", DropRatio: 0.99, LimitRPS: 0, OfferedRPS: 100}}
	}))
	if drops := decideValue(t, s, "banned", 1000); drops != 1000 {
		t.Errorf("a blocked value lost %d of 1000", drops)
	}
}
