package dropratio

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzStep feeds arbitrary rates, limits, capacities, configs and intervals
// through three steps, the last two with buckets vanishing, and checks what
// must hold for any input.
func FuzzStep(f *testing.F) {
	nan, inf := math.NaN(), math.Inf(1)
	// o1, l1, o2, l2, o3, l3, capacity, pmax, minRate, releaseRate, dt, modes
	f.Add(500.0, 100.0, 50.0, 100.0, 0.0, 0.0, inf, 0.99, 1.0, 2.0, int64(time.Second), uint8(0))
	f.Add(2000.0, inf, 50.0, inf, 80.0, 100.0, 300.0, 0.99, 1.0, 2.0, int64(time.Second), uint8(1))
	f.Add(nan, nan, inf, -1.0, -inf, inf, nan, 0.5, 0.0, 1.5, int64(-time.Second), uint8(7))
	f.Add(math.MaxFloat64, math.SmallestNonzeroFloat64, math.MaxFloat64, 0.0, 1e-300, 1e300, 1e-300, 0.999999, 0.0, 1e300, int64(math.MaxInt64), uint8(2))
	f.Add(0.5, 0.0, 1.0, 0.5, 0.9, 0.1, 0.0, 1e-9, 1e9, 1.0000001, int64(1), uint8(255))
	f.Fuzz(func(t *testing.T, o1, l1, o2, l2, o3, l3, capacity, pmax, minRate, releaseRate float64, dt int64, modes uint8) {
		cfg := Config{PMax: pmax, MinRate: minRate, ReleaseRate: releaseRate}
		if cfg.Validate() != nil {
			cfg = DefaultConfig()
		}
		l := mustNew(t, cfg)
		callers := []Caller{
			{Name: "a", Offered: o1, Limit: l1, Mode: Mode(modes & 1)},
			{Name: "b", Offered: o2, Limit: l2, Mode: Mode(modes >> 1 & 1)},
			{Name: "c", Offered: o3, Limit: l3, Mode: Mode(modes >> 2)},
			{Name: "a", Offered: o3, Limit: l2},
		}
		steps := [][]Service{
			{{Name: "x", Capacity: capacity, Callers: callers}, {Name: "y", Capacity: inf, Callers: callers[1:3]}},
			{{Name: "y", Capacity: capacity, Callers: callers[:1]}},
			nil,
		}
		for i, in := range steps {
			out := l.Step(time.Duration(dt), in)
			checkOutput(t, cfg, l, out)
			if i == 0 && len(out) != 2 {
				t.Fatalf("step %d: %d services, want 2", i, len(out))
			}
		}
	})
}

// checkOutput checks the invariants of one Step's output against the law that
// produced it.
func checkOutput(t *testing.T, cfg Config, l *Law, out []ServiceVerdict) {
	t.Helper()
	if !slices.IsSortedFunc(out, func(a, b ServiceVerdict) int { return strings.Compare(a.Service, b.Service) }) {
		t.Fatalf("services not sorted: %+v", out)
	}
	above := 0
	for _, sv := range out {
		byLeaf := func(a, b Verdict) int {
			return cmp.Or(strings.Compare(a.Caller, b.Caller), strings.Compare(a.Procedure, b.Procedure), cmp.Compare(a.Tier, b.Tier))
		}
		if !slices.IsSortedFunc(sv.Verdicts, byLeaf) {
			t.Fatalf("%s: callers not sorted: %+v", sv.Service, sv.Verdicts)
		}
		for i, v := range sv.Verdicts {
			if i > 0 && byLeaf(sv.Verdicts[i-1], v) == 0 {
				t.Fatalf("%s: leaf %s/%s/%d twice", sv.Service, v.Caller, v.Procedure, v.Tier)
			}
			checkVerdict(t, cfg, v)
			if r := l.TierRatio(sv.Service, v.Caller, v.Procedure, v.Tier); r != v.Ratio {
				t.Errorf("TierRatio(%s, %s, %s, %d) = %v, verdict says %v", sv.Service, v.Caller, v.Procedure, v.Tier, r, v.Ratio)
			}
			if v.Ratio > 0 {
				above++
			}
		}
	}
	// Every held bucket is in the output, carried over if need be.
	if l.Len() != above {
		t.Errorf("Len() = %d, but %d verdicts are above zero", l.Len(), above)
	}
}
