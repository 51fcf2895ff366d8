package sim

import (
	"bytes"
	"flag"
	"slices"
	"testing"
	"time"
)

var tenantsFull = flag.Bool("tenants", false, "TestTenantsZipf: run tenants-zipf-10k and tenants-zipf as they are (300 sidecars for 60 s, about a minute without -race), not shrunk")

// TestTenantsZipf runs issue #15's scenario at 10,000 and at 1,000,000
// tenants. It checks the oracle's books on each run, and, with -tenants,
// what the issue asks of the two: sidecar memory and each link's bytes
// per second within 10 % of each other. The measures themselves (wrongly
// limited, the abusers' error, time to enforce) are reported, not
// enforced: they are what the loop achieves (docs/simulation.md).
//
// By default both run shrunk to a tenth of their sidecars and half their
// duration (a hundredth and a third under -race; see shrink), so that
// `go test ./sim` stays quick, and the costs are compared but not bounded:
// at that size the links' bytes are mostly the burst of urgent reports and
// policies when the abuse starts (60 % of the policies' bytes in 5 of 30
// seconds), whose size follows which sidecars surge and fold, not how many
// tenants there are. Over seeds 1 to 6 the shrunk runs' links differed by
// 1 to 37 %, either way round, while the runs as they are differ by 0.6 to
// 2.4 %. -tenants runs them as they are, as docs/simulation.md's table was
// measured, and make test's sim stage runs it so, bound included.
//
// The runs are not byte-for-byte repeatable, so they have no golden file:
// the sidecar's descriptor sketch hashes with keys drawn at start-up
// (pkg/wyhash) and salts its local coin per window, so collisions
// and coins differ from run to run.
func TestTenantsZipf(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the 1,000,000-tenant run takes seconds")
	}
	t.Parallel()
	var costs []TenantCosts
	for _, name := range []string{"tenants-zipf-10k", "tenants-zipf"} {
		sc := loadBuiltin(t, name)
		switch {
		case *tenantsFull:
		case raceEnabled: // the race detector slows the sketches' rotations tenfold
			sc = shrink(sc, 100, 3)
		default:
			sc = shrink(sc, 10, 2)
		}
		r := run(t, sc, sc.Seed)
		checkTenantBooks(t, r)
		var b bytes.Buffer
		if err := WriteSummary(&b, r); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", b.String())
		c, _ := Costs(r)
		costs = append(costs, c)
	}
	for _, d := range CompareCosts(costs[0], costs[1]) {
		t.Logf("%-34s %12.0f %12.0f  %5.1f%%", d.Name, d.A, d.B, 100*d.Diff)
		if *tenantsFull && d.Bounded && !(d.Diff < 0.10) {
			t.Errorf("%s: %.0f at 10,000 tenants, %.0f at 1,000,000: %.1f%% apart, want < 10%%", d.Name, d.A, d.B, 100*d.Diff)
		}
	}
	if costs[0].SketchBytes == 0 {
		t.Errorf("the sidecars report no sketch memory for the descriptor")
	}
}

// checkTenantBooks checks that the oracle accounted for every request the
// sidecars decided, once.
func checkTenantBooks(t *testing.T, r *Result) {
	t.Helper()
	tr := r.Tenants
	if tr == nil {
		t.Fatalf("seed %d: no tenants in the result", r.Seed)
	}
	c, a := tr.Compliant, tr.Abusive
	if c.Offered+a.Offered != tr.Requests {
		t.Errorf("seed %d: the oracle counted %d requests, the sidecars decided %d", r.Seed, c.Offered+a.Offered, tr.Requests)
	}
	if c.Admitted > c.Offered || a.Admitted > a.Offered || tr.Seen > tr.Tenants.Count || tr.Seen == 0 {
		t.Errorf("seed %d: books out of bounds: %+v %+v, %d seen", r.Seed, c, a, tr.Seen)
	}
	from := int(tr.Tenants.AbuseFrom / Bin)
	sum := 0.0
	for _, ab := range tr.Abusers {
		for _, v := range ab.Offered[from:] {
			sum += v
		}
	}
	if int64(sum) != a.Offered {
		t.Errorf("seed %d: abusers' series add up to %v requests, their class to %d", r.Seed, sum, a.Offered)
	}
}

// shrink returns a tenant scenario with 1/sidecars of its sidecars (at
// least one per zone that has any) and 1/duration of its duration, the
// abuse starting as much earlier: what it costs to run is mostly each
// sidecar's, per report (rotating its sketch, installing policies), not
// each tenant's.
func shrink(sc *Scenario, sidecars, duration int) *Scenario {
	c := *sc
	c.Duration = (sc.Duration / time.Duration(duration)).Truncate(Bin)
	c.Services = slices.Clone(sc.Services)
	for i := range c.Services {
		c.Services[i].Sidecars = slices.Clone(sc.Services[i].Sidecars)
		for z, n := range c.Services[i].Sidecars {
			if n > 0 {
				c.Services[i].Sidecars[z] = max(1, n/sidecars)
			}
		}
	}
	t := *sc.Tenants
	t.AbuseFrom = (sc.Tenants.AbuseFrom / time.Duration(duration)).Truncate(Bin)
	c.Tenants = &t
	return &c
}
