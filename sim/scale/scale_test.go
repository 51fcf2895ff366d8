package scale

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// testConfig is Small without noise, so that a surging bucket's offered rate,
// and so its ratio, is the same every second of the surge.
func testConfig() Config {
	c := Small()
	c.Noise = 0
	// A TTL whose half-TTL refresh window ends before the surge, so that
	// the refreshes can be counted apart from the surge's policies.
	c.Controller.PolicyTTL = 10 * time.Second
	return c
}

func run(t *testing.T, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("Run(seed %d): %v", cfg.Seed, err)
	}
	return res
}

func TestSumsAndSurgeRatio(t *testing.T) {
	cfg := testConfig()
	res := run(t, cfg)
	c := res.Counted
	if c.Rejected != 0 {
		t.Errorf("%d reports or zone loads rejected, want 0", c.Rejected)
	}
	if c.Buckets != 200 || c.Aggregators != 6 || c.Surging != 10 {
		t.Errorf("buckets, aggregators, surging = %d, %d, %d; want 200, 6, 10", c.Buckets, c.Aggregators, c.Surging)
	}
	if len(c.Seconds) != cfg.Seconds {
		t.Fatalf("%d seconds recorded, want %d", len(c.Seconds), cfg.Seconds)
	}

	// Without a surge the mesh offers RPS, up to rounding each bucket's
	// count to a whole request.
	if got := c.Seconds[0].Generated; math.Abs(got-cfg.RPS) > float64(c.Buckets) {
		t.Errorf("second 1 generated %v rps, want %v ± %d", got, cfg.RPS, c.Buckets)
	}
	warm := 0
	for _, s := range c.Seconds {
		if s.Reports != cfg.Sidecars {
			t.Errorf("t=%d: %d reports, want one per sidecar, %d", s.T, s.Reports, cfg.Sidecars)
		}
		if s.ZoneLoads != c.Aggregators {
			t.Errorf("t=%d: %d zone loads, want %d", s.T, s.ZoneLoads, c.Aggregators)
		}
		if !s.Warm {
			continue
		}
		warm++
		// The controller sees exactly what the sidecars counted: counts
		// are split over sidecars, summed by aggregators as rates, summed
		// again by the controller.
		if d := relDiff(s.Generated, s.Seen); d > 1e-12 {
			t.Errorf("t=%d: generated %v rps, the controller saw %v (relative difference %g)", s.T, s.Generated, s.Seen, d)
		}
		if s.Buckets != c.Buckets {
			t.Errorf("t=%d: the tick ran %d buckets, want %d", s.T, s.Buckets, c.Buckets)
		}
	}
	if want := cfg.Seconds - int(cfg.Controller.Warmup/time.Second) + 1; warm != want {
		t.Errorf("%d warm ticks, want %d", warm, want)
	}

	// The first warm tick publishes every policy to every sidecar. Nothing
	// changes before the surge, so over the next TTL/2 every policy is
	// refreshed exactly once, staggered by name over the last quarter TTL
	// so that the refreshes do not all land on one tick.
	first := int(cfg.Controller.Warmup / time.Second)
	half := int(cfg.Controller.PolicyTTL / 2 / time.Second)
	if first+half > cfg.SurgeAt {
		t.Fatalf("test config: refresh window ends at t=%d, after the surge at t=%d", first+half, cfg.SurgeAt)
	}
	s := c.Seconds[first-1]
	if s.Policies != cfg.Services || s.Pushes != int64(cfg.Sidecars) {
		t.Errorf("t=%d: %d policies to %d sidecars, want all %d to all %d", first, s.Policies, s.Pushes, cfg.Services, cfg.Sidecars)
	}
	if s.RelayPushes < int64(cfg.Services) || s.RelayPushes > int64(cfg.Services*c.Aggregators) {
		t.Errorf("t=%d: %d relay pushes, want between %d and %d", first, s.RelayPushes, cfg.Services, cfg.Services*c.Aggregators)
	}
	if s := c.Seconds[first]; s.Policies != 0 {
		t.Errorf("t=%d: %d policies published in a quiet second, want 0", s.T, s.Policies)
	}
	var policies, refreshes, busiest int
	var pushes int64
	for _, s := range c.Seconds[first : first+half] {
		policies += s.Policies
		refreshes += s.Refreshes
		pushes += s.Pushes
		busiest = max(busiest, s.Policies)
	}
	if policies != cfg.Services || refreshes != cfg.Services || pushes != int64(cfg.Sidecars) {
		t.Errorf("t=%d..%d: %d policies (%d refreshes) to %d sidecars; want each of %d refreshed once, to all %d",
			first+1, first+half, policies, refreshes, pushes, cfg.Services, cfg.Sidecars)
	}
	if busiest == cfg.Services {
		t.Errorf("t=%d..%d: all %d refreshes on one tick, want them staggered", first+1, first+half, busiest)
	}

	// The surging bucket: counted from second SurgeAt+1, seen at that
	// tick, and from then on dropped with 1 − limit/offered.
	p := c.Probe
	for i := range p.Offered {
		tsec := i + 1
		surging := i >= cfg.SurgeAt && i < cfg.SurgeAt+cfg.SurgeFor
		switch {
		case tsec <= cfg.SurgeAt:
			if p.Ratio[i] != 0 {
				t.Errorf("t=%d: ratio %v before the surge, want 0", tsec, p.Ratio[i])
			}
		case surging:
			want := 1 - p.Limit/p.Offered[i]
			if p.Seen[i] != p.Offered[i] || math.Abs(p.Ratio[i]-want) > 1e-12 {
				t.Errorf("t=%d: offered %v, seen %v, ratio %v; want seen = offered and ratio 1 − %v/%v = %v",
					tsec, p.Offered[i], p.Seen[i], p.Ratio[i], p.Limit, p.Offered[i], want)
			}
			if math.Abs(want-(1-1/(cfg.SurgeFactor/(1+cfg.Headroom)))) > 1e-3 {
				t.Errorf("t=%d: expected ratio %v is not 1 − (1+headroom)/factor", tsec, want)
			}
		case tsec >= cfg.SurgeAt+cfg.SurgeFor+7:
			// Slow release: the admitted share may double each second,
			// so from ~0.92 the ratio is 0 within 7 ticks.
			if p.Ratio[i] != 0 {
				t.Errorf("t=%d: ratio %v long after the surge, want 0", tsec, p.Ratio[i])
			}
		}
	}
	// Each state's memory is measured by releasing it: a figure near zero
	// means the state was freed before the baseline, or never.
	if m := res.Memory; m.Controller < 10<<10 || len(m.Aggregators) != c.Aggregators || slices.Min(m.Aggregators) < 10<<10 {
		t.Errorf("memory: controller %d B, aggregators %v B; want each at least 10 KiB", m.Controller, m.Aggregators)
	}

	// While the ratio holds, the sidecars drop: the controller sees drops
	// of about (ratio × offered) summed over surging buckets.
	mid := c.Seconds[cfg.SurgeAt+cfg.SurgeFor/2]
	if mid.SeenDropped <= 0 || mid.SeenDropped >= mid.Seen {
		t.Errorf("t=%d: the controller saw %v of %v rps dropped; want some but not all", mid.T, mid.SeenDropped, mid.Seen)
	}
}

func TestDeterministic(t *testing.T) {
	cfg := Small()
	cfg.Seconds = 24 // surge and release
	a, b := run(t, cfg), run(t, cfg)
	if !reflect.DeepEqual(a.Counted, b.Counted) {
		for i := range a.Counted.Seconds {
			if a.Counted.Seconds[i] != b.Counted.Seconds[i] {
				t.Errorf("seed %d, second %d differs:\n%+v\n%+v", cfg.Seed, i+1, a.Counted.Seconds[i], b.Counted.Seconds[i])
				break
			}
		}
		t.Fatalf("seed %d: two runs counted differently", cfg.Seed)
	}
	cfg.Seed++
	c := run(t, cfg)
	if reflect.DeepEqual(a.Counted, c.Counted) {
		t.Errorf("seeds %d and %d counted the same: the seed does nothing", cfg.Seed-1, cfg.Seed)
	}
}

func TestXDSDeliversEveryPush(t *testing.T) {
	cfg := testConfig()
	cfg.Seconds = 12
	cfg.XDSStreams = cfg.Sidecars // one client per sidecar: the clients are the fleet
	res := run(t, cfg)
	x := res.XDS
	if x == nil {
		t.Fatal("no xDS result")
	}
	var pushes int64
	ticks := 0
	for _, s := range res.Counted.Seconds {
		pushes += s.Pushes
		if s.Policies > 0 {
			ticks++
		}
	}
	if x.Streams != cfg.Sidecars || x.Services != cfg.Services {
		t.Errorf("%d streams over %d services, want %d over %d", x.Streams, x.Services, cfg.Sidecars, cfg.Services)
	}
	// What the real server delivered is what the run counted as pushes.
	if x.Deliveries != pushes || len(x.Updates) != ticks || len(x.Delivery) != ticks {
		t.Errorf("%d deliveries in %d updates (%d timed), want %d in %d", x.Deliveries, len(x.Updates), len(x.Delivery), pushes, ticks)
	}
}

func TestCommandSmall(t *testing.T) {
	cmd := Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--small", "--seconds", "8", "--quiet", "--controller-shards", "2", "--procedures", "2"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("scale --small: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		"command: scale --services 20 --callers 10 --procedures 2 --controller-shards 2 --sidecars 300 --rps 200000 --zones 3 --aggregators-per-zone 2 --seconds 8",
		"mesh: 20 services × 10 callers × 2 procedures = 400 buckets",
		"controller shards: 2",
		"worst shard: tick p99",
		"aggregator Apply, per report",
		"controller state",
		"sidecars → aggregators: load reports",
		"relay: controller → aggregators",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if errOut.Len() != 0 {
		t.Errorf("--quiet wrote to stderr: %s", errOut.String())
	}
}

func TestValidateNamesEveryBadFlag(t *testing.T) {
	c := Default()
	c.Services, c.Sidecars, c.Zones, c.Noise = 1, 0, 0, 2
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, flag := range []string{"services:", "callers:", "sidecars:", "zones:", "noise:"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("error does not name %s: %v", flag, err)
		}
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("Default: %v", err)
	}
	if err := Small().Validate(); err != nil {
		t.Errorf("Small: %v", err)
	}
}

func TestApportion(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		n := 1 + r.IntN(50)
		total := n + r.IntN(10000)
		w := make([]float64, n)
		var sum float64
		for i := range w {
			w[i] = r.ExpFloat64()
			sum += w[i]
		}
		for i := range w {
			w[i] /= sum
		}
		got := apportion(total, w)
		s := 0
		for i, v := range got {
			s += v
			// Largest remainder: within one of the exact share.
			if exact := 1 + float64(total-n)*w[i]; v < 1 || math.Abs(float64(v)-exact) >= 1 {
				t.Fatalf("apportion(%d, %v)[%d] = %d, exact share %v", total, w, i, v, exact)
			}
		}
		if s != total {
			t.Fatalf("apportion(%d, …) sums to %d", total, s)
		}
	}
}

func TestHistQuantile(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var h Hist
	var exact Samples
	for range 10000 {
		d := time.Duration(r.ExpFloat64() * 5000)
		h.Add(d)
		exact = append(exact, d)
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 1} {
		got, want := h.Quantile(q), exact.Quantile(q)
		// The bucket's upper bound: at or above the exact value, within a
		// sixteenth.
		if got < want || float64(got) > float64(want)*(1+1.0/16)+1 {
			t.Errorf("q%v = %v, exact %v", q, got, want)
		}
	}
	if h.MaxDur != slices.Max(exact) || h.Count != 10000 {
		t.Errorf("max %v count %d; want %v 10000", h.MaxDur, h.Count, slices.Max(exact))
	}
}

// Sharding the controller changes where the law runs, not what it computes:
// the callees split over three shards publish, second by second, the ratios
// one controller publishes for the same mesh, procedures included; only the
// shard mark (and so a policy's bytes) differs.
func TestShardedControllersComputeWhatOneDoes(t *testing.T) {
	cfg := Small()
	cfg.Seconds = 24 // surge and release
	cfg.Procedures = 3
	one := run(t, cfg)
	cfg.ControllerShards = 3
	three := run(t, cfg)
	if len(three.Timing.Shards) != 3 || len(three.Memory.Shards) != 3 {
		t.Fatalf("a run of 3 shards timed %d shards and weighed %d", len(three.Timing.Shards), len(three.Memory.Shards))
	}
	leaves := 0
	for i, s := range three.Timing.Shards {
		if s.Buckets == 0 || len(s.Tick) == 0 || len(s.Apply) != cfg.Seconds*cfg.Aggregators() {
			t.Errorf("shard %d: %d leaves, %d ticks, %d zone loads applied", i, s.Buckets, len(s.Tick), len(s.Apply))
		}
		leaves += s.Buckets
	}
	a, b := one.Counted, three.Counted
	if last := a.Seconds[len(a.Seconds)-1]; leaves != last.Buckets {
		t.Errorf("the shards ran the law on %d leaves, one controller on %d", leaves, last.Buckets)
	}
	if !slices.Equal(a.Probe.Ratio, b.Probe.Ratio) || !slices.Equal(a.Probe.Seen, b.Probe.Seen) {
		t.Errorf("the probe's course differs:\none:   seen %v ratio %v\nthree: seen %v ratio %v", a.Probe.Seen, a.Probe.Ratio, b.Probe.Seen, b.Probe.Ratio)
	}
	for i := range a.Seconds {
		x, y := a.Seconds[i], b.Seconds[i]
		if x.Seen != y.Seen || x.SeenDropped != y.SeenDropped || x.Policies != y.Policies || x.Buckets != y.Buckets {
			t.Errorf("second %d: one controller saw %v (dropped %v), published %d over %d leaves; three shards %v (%v), %d over %d",
				i+1, x.Seen, x.SeenDropped, x.Policies, x.Buckets, y.Seen, y.SeenDropped, y.Policies, y.Buckets)
		}
		// Each aggregator sends every shard its part.
		if y.ZoneLoads != 3*x.ZoneLoads {
			t.Errorf("second %d: %d zone loads to 3 shards, %d to one", i+1, y.ZoneLoads, x.ZoneLoads)
		}
	}
}
