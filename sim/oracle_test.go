package sim

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/quick"

	"github.com/sluicehq/sluice/internal/limits"
)

var inf = math.Inf(1)

func TestAllowed(t *testing.T) {
	svc := func(capacity, def float64, callers map[string]float64) *limits.Service {
		s := &limits.Service{Name: "api", Capacity: capacity, DefaultLimit: def, Callers: map[string]limits.Bucket{}}
		for c, l := range callers {
			s.Callers[c] = limits.Bucket{Limit: l}
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		svc     *limits.Service
		callers []string
		offered []float64
		want    []float64
	}{
		{"no limits", nil, []string{"a", "b"}, []float64{10, 20}, []float64{inf, inf}},
		{"own and default limits", svc(inf, 50, map[string]float64{"web": 100}), []string{"other", "web"}, []float64{500, 500}, []float64{50, 100}},
		{"capacity fits", svc(1000, inf, nil), []string{"a", "b"}, []float64{300, 400}, []float64{inf, inf}},
		{
			// noisy-neighbour: demands 3000, 2000 and batch's 5000 (its
			// limit) exceed 9000; web and mobile fit under the level 4000.
			"capacity split", svc(9000, inf, map[string]float64{"web": 6000, "mobile": 4000, "batch": 5000}),
			[]string{"batch", "mobile", "web"}, []float64{100000, 2000, 3000}, []float64{4000, 4000, 4000},
		},
		{"equal shares", svc(100, inf, nil), []string{"a", "b", "c"}, []float64{100, 100, 100}, []float64{100.0 / 3, 100.0 / 3, 100.0 / 3}},
		{"blocked", svc(inf, inf, map[string]float64{"bad": 0}), []string{"bad"}, []float64{10}, []float64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Allowed(tc.svc, tc.callers, tc.offered)
			for i := range got {
				if !near(got[i], tc.want[i]) && got[i] != tc.want[i] {
					t.Errorf("%s: allowed %v, want %v", tc.callers[i], got[i], tc.want[i])
				}
			}
		})
	}
}

// The water-filling in rounds agrees with the level found by bisection: the
// L at which Σ min(demand, L) is the capacity.
func TestAllowedMaxMinFair(t *testing.T) {
	f := func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, 3))
		n := 1 + r.IntN(8)
		callers := make([]string, n)
		offered := make([]float64, n)
		svc := &limits.Service{Capacity: 1 + r.Float64()*1000, DefaultLimit: inf, Callers: map[string]limits.Bucket{}}
		total := 0.0
		for i := range n {
			callers[i] = string(rune('a' + i))
			offered[i] = r.Float64() * 500
			if r.IntN(3) == 0 {
				svc.Callers[callers[i]] = limits.Bucket{Limit: r.Float64() * 300}
			}
			total += min(offered[i], svc.Bucket(callers[i]).Limit)
		}
		got := Allowed(svc, callers, offered)
		if total <= svc.Capacity {
			for i := range got {
				if got[i] != svc.Bucket(callers[i]).Limit {
					return false
				}
			}
			return true
		}
		lo, hi := 0.0, svc.Capacity
		for range 200 {
			mid := (lo + hi) / 2
			sum := 0.0
			for i := range n {
				sum += min(offered[i], svc.Bucket(callers[i]).Limit, mid)
			}
			if sum < svc.Capacity {
				lo = mid
			} else {
				hi = mid
			}
		}
		granted := 0.0
		for i := range n {
			want := min(svc.Bucket(callers[i]).Limit, lo)
			if math.Abs(got[i]-want) > 1e-6*svc.Capacity && min(offered[i], got[i]) != min(offered[i], want) {
				t.Logf("seed %d: %s allowed %v, bisection says %v", seed, callers[i], got[i], want)
				return false
			}
			granted += min(offered[i], got[i])
		}
		return math.Abs(granted-svc.Capacity) <= 1e-6*svc.Capacity
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 500, Rand: nil}); err != nil {
		t.Error(err)
	}
}
