package sim

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/quick"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
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

// checkout is procedure-surge's callee: create-charge shared by web, mobile
// and partner, partner's limit across procedures well above its share.
func checkout() *limits.Service {
	return &limits.Service{
		Name: "checkout", Capacity: 20000, DefaultLimit: inf,
		Callers: map[string]limits.Bucket{"web": {Limit: 2500}, "mobile": {Limit: 2500}, "partner": {Limit: 4000}},
		Procedures: map[string]*limits.Procedure{
			"create-charge": {Capacity: 3000},
			"get-item":      {Capacity: 5000, Callers: map[string]float64{"web": 100}},
		},
		Declared: []string{"create-charge", "get-item"},
	}
}

func TestAllowedLeaves(t *testing.T) {
	leaves := []Bucket{
		{"checkout", "mobile", "create-charge"}, {"checkout", "partner", "create-charge"},
		{"checkout", "partner", "get-item"}, {"checkout", "web", "create-charge"}, {"checkout", "web", "get-item"},
	}
	for _, tc := range []struct {
		name    string
		offered []float64
		want    []float64
	}{
		// Everything fits: a leaf may send up to its own limit and its
		// caller's across procedures.
		{"fits", []float64{600, 500, 400, 700, 50}, []float64{2500, 4000, 4000, 2500, 100}},
		// partner surges: its leaves demand 7,900 > 4,000, so λ = 3,600 for
		// create-charge (get-item keeps 400); create-charge then demands
		// 600 + 3,600 + 700 > 3,000, and partner gets what is left, 1,700.
		{"surge", []float64{600, 7500, 400, 700, 50}, []float64{1700, 1700, 3600, 1700, 100}},
		// web over its leaf limit on get-item: only that leaf is held.
		{"leaf limit", []float64{600, 500, 400, 700, 300}, []float64{2500, 4000, 4000, 2500, 100}},
		// Everyone on create-charge wants more than a third of it.
		{"even split", []float64{2000, 2000, 0, 2000, 0}, []float64{1000, 1000, 4000, 1000, 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := AllowedLeaves(checkout(), leaves, tc.offered)
			for i := range got {
				if !near(got[i], tc.want[i]) && got[i] != tc.want[i] {
					t.Errorf("%s: allowed %v, want %v", leaves[i], got[i], tc.want[i])
				}
			}
		})
	}
	// A callee without procedures: Allowed, caller by caller.
	svc := &limits.Service{Capacity: 9000, DefaultLimit: inf, Callers: map[string]limits.Bucket{"batch": {Limit: 5000}}}
	got := AllowedLeaves(svc, []Bucket{{"c", "batch", ""}, {"c", "web", ""}}, []float64{100000, 3000})
	if want := Allowed(svc, []string{"batch", "web"}, []float64{100000, 3000}); got[0] != want[0] || got[1] != want[1] {
		t.Errorf("without procedures: %v, Allowed says %v", got, want)
	}
}

// The oracle and the controller's Filler, written apart, admit the same
// rate in every leaf of random callees with procedures: min(offered,
// allowed) agrees, the oracle's L_c where its caller fits changing no
// admitted rate.
func TestAllowedLeavesAgreesWithFiller(t *testing.T) {
	var filler dropratio.Filler
	f := func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, 14))
		bound := func(of float64) float64 {
			if r.IntN(3) == 0 {
				return inf
			}
			return of * r.Float64() * 1.2
		}
		procs := []string{"a", "b", "/p.S/M", names.Other}[:1+r.IntN(4)]
		svc := &limits.Service{DefaultLimit: inf, Callers: map[string]limits.Bucket{}, Procedures: map[string]*limits.Procedure{}}
		tree := &dropratio.Tree{}
		var leaves []Bucket
		var offered []float64
		for c := range 1 + r.IntN(5) {
			caller := string(rune('m' + c))
			sum := 0.0
			for _, p := range procs {
				if r.IntN(4) == 0 {
					continue
				}
				o := r.ExpFloat64() * 100
				if svc.Procedures[p] == nil {
					svc.Procedures[p] = &limits.Procedure{Capacity: inf, Callers: map[string]float64{}}
				}
				if r.IntN(3) == 0 {
					svc.Procedures[p].Callers[caller] = bound(o)
				}
				leaves = append(leaves, Bucket{"x", caller, p})
				offered = append(offered, o)
				sum += o
				tree.Leaves = append(tree.Leaves, dropratio.Leaf{Caller: caller, Procedure: p, Offered: o, Limit: svc.LeafLimit(caller, p)})
			}
			if l := bound(sum); !math.IsInf(l, 1) {
				svc.Callers[caller] = limits.Bucket{Limit: l}
				tree.Callers = append(tree.Callers, dropratio.CallerLimit{Name: caller, Limit: l})
			}
		}
		total := 0.0
		for _, o := range offered {
			total += o
		}
		for name, p := range svc.Procedures {
			p.Capacity = bound(total / float64(len(svc.Procedures)))
			tree.Procedures = append(tree.Procedures, dropratio.Procedure{Name: name, Capacity: p.Capacity})
			if name != names.Other {
				svc.Declared = append(svc.Declared, name)
			}
		}
		if len(svc.Declared) == 0 {
			svc.Declared = []string{"a"} // a callee with only _other leaves still declares one
		}
		svc.Capacity = bound(total)
		tree.Capacity = svc.Capacity
		got := AllowedLeaves(svc, leaves, offered)
		shares := filler.Fill(tree)
		for i := range leaves {
			a, b := min(offered[i], got[i]), min(offered[i], shares[i].Allowed)
			if math.Abs(a-b) > 1e-9*total {
				t.Logf("seed %d: %s admits %v by the oracle (allowed %v), %v by Filler (%+v)", seed, leaves[i], a, got[i], b, shares[i])
				return false
			}
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
}
