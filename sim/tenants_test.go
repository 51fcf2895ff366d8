package sim

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func testTenants(count int) *Tenants {
	return &Tenants{
		Callee: "api", Caller: "web", Descriptor: "tenant",
		Count: count, Exponent: 1, Rate: 100, Sticky: 0.25,
		Abusers: 2, AbuseFactor: 10, AbuseFrom: 2 * time.Second,
		Limit: 5, Overrides: map[string]float64{"t00000002": 2, "acme": 500},
	}
}

// TestTenantOracleExact feeds the oracle random requests and decisions and
// checks its totals against a naive recount from a log of every request.
func TestTenantOracleExact(t *testing.T) {
	ts := testTenants(50)
	r := rand.New(rand.NewPCG(3, 4))
	pop := newTenantPop(ts, 7, r)
	if got := pop.limit(1); got != 2 {
		t.Fatalf("t00000002's limit = %v, want its override 2", got)
	}
	const nbins = 5
	o := newTenantOracle(pop, nbins)
	type req struct {
		bin, tenant int
		admitted    bool
	}
	var log []req
	for bin := range nbins {
		for range 400 {
			q := req{bin, pop.zipf.Draw(r), r.IntN(3) > 0}
			log = append(log, q)
			o.count(q.tenant, q.admitted)
		}
		o.endSecond(bin)
	}
	res := o.result()

	// The naive recount.
	type key struct{ bin, tenant int }
	off, adm := map[key]float64{}, map[key]float64{}
	seen := map[int]bool{}
	for _, q := range log {
		k := key{q.bin, q.tenant}
		off[k]++
		if q.admitted {
			adm[k]++
		}
		seen[q.tenant] = true
	}
	var want [2]TenantCounts // compliant, abusive
	for k, n := range off {
		a, limit := adm[k], pop.limit(k.tenant)
		c := &want[0]
		if pop.abuse[k.tenant] >= 0 && k.bin >= 2 {
			c = &want[1]
		}
		c.Offered += int64(n)
		c.Admitted += int64(a)
		if n <= limit { // under the threshold: every drop was wrong
			c.WronglyLimited += n - a
		} else {
			c.WronglyAllowed += max(0, a-limit)
			c.Shortfall += max(0, limit-a)
		}
	}
	for i, got := range []TenantCounts{res.Compliant, res.Abusive} {
		w := want[i]
		if got.Offered != w.Offered || got.Admitted != w.Admitted || math.Abs(got.WronglyLimited-w.WronglyLimited) > 1e-9 ||
			math.Abs(got.WronglyAllowed-w.WronglyAllowed) > 1e-9 || math.Abs(got.Shortfall-w.Shortfall) > 1e-9 {
			t.Errorf("class %d: got %+v, want %+v", i, got, w)
		}
	}
	if res.Seen != len(seen) {
		t.Errorf("seen %d tenants, want %d", res.Seen, len(seen))
	}
	for _, ab := range res.Abusers {
		i, _ := pop.rank(ab.Tenant)
		for bin := range nbins {
			if ab.Offered[bin] != off[key{bin, i}] || ab.Admitted[bin] != adm[key{bin, i}] {
				t.Errorf("abuser %s second %d: %v/%v, want %v/%v", ab.Tenant, bin, ab.Admitted[bin], ab.Offered[bin], adm[key{bin, i}], off[key{bin, i}])
			}
		}
	}
}

// TestTenantPop: names are fixed-width and round-trip, the sticky share
// and the abusers are as asked, and a tenant's rate follows Zipf until it
// abuses.
func TestTenantPop(t *testing.T) {
	ts := testTenants(10000)
	ts.Abusers = 50
	pop := newTenantPop(ts, 300, rand.New(rand.NewPCG(1, 1)))
	if pop.name(0) != "t00000001" || pop.name(9999) != "t00010000" {
		t.Fatalf("names %q, %q", pop.name(0), pop.name(9999))
	}
	for _, i := range []int{0, 41, 9999} {
		if j, ok := pop.rank(pop.name(i)); !ok || j != i {
			t.Fatalf("rank(%q) = %d, %v", pop.name(i), j, ok)
		}
	}
	pinned := 0
	for _, p := range pop.pin {
		if p >= 0 {
			pinned++
			if p >= 300 {
				t.Fatalf("pinned to sidecar %d of 300", p)
			}
		}
	}
	// Binomial(10000, 0.25): sd 43.
	if math.Abs(float64(pinned)-2500) > 5*43 {
		t.Errorf("%d tenants pinned, want about 2500", pinned)
	}
	if len(pop.abusers) != 50 {
		t.Fatalf("%d abusers", len(pop.abusers))
	}
	a := int(pop.abusers[0])
	if got, want := pop.rate(a, time.Second), 100*pop.zipf.Prob(a); got != want {
		t.Errorf("abuser before abuse: %v rps, want its Zipf rate %v", got, want)
	}
	if got := pop.rate(a, 2*time.Second); got != 10*pop.limit(a) {
		t.Errorf("abuser: %v rps, want 10× its limit", got)
	}
}

// TestMeasureTenants checks the measures on hand-made series.
func TestMeasureTenants(t *testing.T) {
	ts := testTenants(100)
	ts.Limit = 100
	r := &TenantResult{
		Tenants:   ts,
		Compliant: TenantCounts{Offered: 9000, WronglyLimited: 9},
		Abusive:   TenantCounts{Offered: 1000, WronglyAllowed: 100},
		Abusers: []AbuserSeries{
			// Enforced from second 4: two seconds after the abuse began.
			{Limit: 100, Admitted: []float64{10, 10, 1000, 500, 100, 120, 80, 104}},
			// Back over its limit in the last second: never enforced.
			{Limit: 100, Admitted: []float64{10, 10, 100, 100, 100, 100, 100, 300}},
			// Enforced from the start of the abuse.
			{Limit: 100, Admitted: []float64{10, 10, 110, 110, 110, 110, 110, 110}},
		},
	}
	m := MeasureTenants(r)
	if m.Requests != 10000 || m.WronglyLimited != 9.0/10000 || m.WronglyAllowed != 100.0/10000 || m.CompliantLimited != 9.0/9000 {
		t.Errorf("shares: %+v", m)
	}
	if m.Unenforced != 1 || m.MaxTimeToEnforce != 2*time.Second || m.MeanTimeToEnforce != time.Second {
		t.Errorf("time to enforce: mean %v, max %v, %d never", m.MeanTimeToEnforce, m.MaxTimeToEnforce, m.Unenforced)
	}
	// Errors: |101 − 100|/100 and |110 − 100|/100.
	if math.Abs(m.AbuserError-(0.01+0.10)/2) > 1e-12 {
		t.Errorf("abusers' error %v, want 0.055", m.AbuserError)
	}
}
