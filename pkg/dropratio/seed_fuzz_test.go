package dropratio

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
)

var (
	nan, negZero = math.NaN(), math.Copysign(0, -1)
	maxDT        = int64(math.MaxInt64)
)

// stepSeeds add to FuzzStep's own seeds the inputs a hostile or broken
// tier could send: rates at the bounds the aggregator and controller
// accept, and every float that is not a rate.
func stepSeeds() []testkit.Seed {
	s := func(name string, args ...any) testkit.Seed { return testkit.Seed{Name: name, Args: args} }
	// o1, l1, o2, l2, o3, l3, capacity, pmax, minRate, releaseRate, dt, modes
	return []testkit.Seed{
		s("controller-max-rates", 1e10, 0.0, 1e10, 1e10, 1e13, 1.0, 1e10, 0.99, 1.0, 2.0, int64(time.Second), uint8(0)),
		s("negative-zero", negZero, negZero, negZero, 100.0, 5.0, negZero, negZero, 0.99, 0.0, 2.0, int64(0), uint8(3)),
		s("nan-everything", nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, int64(time.Second), uint8(1)),
		s("subnormal", 5e-324, 5e-324, 1e-310, 5e-324, 2.2250738585072014e-308, 1e-320, 5e-324, 0.5, 5e-324, 1.0000000000000002, int64(1), uint8(6)),
		s("huge-dt", 1e6, 1.0, 10.0, 1.0, 0.0, inf, 5.0, 0.99, 1.0, 1e300, maxDT, uint8(0)),
		s("negative-dt", 1e6, 1.0, 10.0, 1.0, 0.0, inf, 5.0, 0.99, 1.0, 2.0, -maxDT, uint8(0)),
		s("capacity-zero", 100.0, inf, 100.0, inf, 100.0, inf, 0.0, 0.99, 1.0, 2.0, int64(time.Second), uint8(2)),
	}
}

func TestFuzzStepCorpus(t *testing.T) { testkit.CheckCorpus(t, "FuzzStep", stepSeeds()) }

// seedSeeds are FuzzSeed's committed seeds.
func seedSeeds() []testkit.Seed {
	s := func(name string, args ...any) testkit.Seed { return testkit.Seed{Name: name, Args: args} }
	// ra, rb, rq, offered a, offered b, limit a, dt
	return []testkit.Seed{
		s("measured", 0.9, 0.5, 0.3, 1000.0, 100.0, 100.0, int64(0)),
		s("released", 0.9, 0.5, 0.3, 1000.0, 100.0, 100.0, int64(time.Second)),
		s("above-one", 7.0, inf, 1.0, 50.0, 0.0, 100.0, int64(0)),
		s("not-ratios", nan, -1.0, negZero, nan, inf, -1.0, int64(0)),
		s("tiny", 5e-324, 1e-300, 0.0, 0.5, 1e10, 0.0, int64(-1)),
		s("quiet-caller", 0.99, 0.99, 0.99, 0.0, 0.0, inf, int64(0)),
	}
}

func TestFuzzSeedCorpus(t *testing.T) { testkit.CheckCorpus(t, "FuzzSeed", seedSeeds()) }

// FuzzSeed seeds a law as a restarted controller does, with ratios
// measured from the sidecars (dropped ÷ offered: any float, including
// above 1, NaN and infinities from broken counts), including a bucket of a
// service the first step does not list and a second seed of the same
// bucket, then steps twice. Every output must keep the law's invariants; a
// seeded ratio must be capped at PMax, survive the first step when that
// step allows no release (dt ≤ 0, as the controller's first step), and the
// second seed of a bucket must not replace the first.
func FuzzSeed(f *testing.F) {
	f.Fuzz(func(t *testing.T, ra, rb, rq, oa, ob, la float64, dt int64) {
		cfg := DefaultConfig()
		l := mustNew(t, cfg)
		l.Seed("x", "a", ra)
		l.Seed("x", "b", rb)
		l.Seed("z", "q", rq)
		l.Seed("x", "a", 0.5) // the first seed of a bucket stands, if it was taken
		if !(ra > 0) {
			ra = 0.5
		}
		for _, c := range []struct {
			svc, caller string
			seeded      float64
		}{{"x", "a", ra}, {"x", "b", rb}, {"z", "q", rq}} {
			want := 0.0
			if c.seeded > 0 {
				want = min(c.seeded, cfg.PMax)
			}
			if got := l.Ratio(c.svc, c.caller); got != want {
				t.Fatalf("seeded %s/%s with %v: ratio %v, want %v", c.svc, c.caller, c.seeded, got, want)
			}
		}
		in := []Service{{Name: "x", Capacity: inf, Callers: []Caller{
			{Name: "a", Offered: oa, Limit: la},
			{Name: "b", Offered: ob, Limit: inf, Mode: Shadow},
		}}}
		out := l.Step(time.Duration(dt), in)
		checkOutput(t, cfg, l, out)
		if dt <= 0 {
			for _, sv := range out {
				for _, v := range sv.Verdicts {
					seeded := map[string]float64{"x/a": ra, "x/b": rb, "z/q": rq}[sv.Service+"/"+v.Caller]
					if seeded > 0 && v.Ratio < min(seeded, cfg.PMax) {
						t.Errorf("%s/%s: seeded %v, released to %v by a step that allows no release", sv.Service, v.Caller, seeded, v.Ratio)
					}
				}
			}
		}
		checkOutput(t, cfg, l, l.Step(time.Second, nil))
	})
}
