package allowance

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// refTails is the independent reference: the Poisson(lambda) pmf as ratios
// to its mode, p_{j±1} = p_j·λ/(j+1) or p_j·j/λ, normalised by their sum.
// No exp, no lgamma, no incomplete gamma: nothing the code under test uses.
// It returns, for every k in [lo, hi], P(X ≤ k) and P(X > k).
type refTails struct {
	lo         int
	cdf, upper []float64
}

func newRef(lambda float64) refTails {
	mode := int(math.Floor(lambda))
	width := int(40*math.Sqrt(lambda)) + 60
	lo, hi := max(0, mode-width), mode+width
	p := make([]float64, hi-lo+1)
	p[mode-lo] = 1
	for j := mode; j > lo; j-- {
		p[j-1-lo] = p[j-lo] * float64(j) / lambda
	}
	for j := mode; j < hi; j++ {
		p[j+1-lo] = p[j-lo] * lambda / float64(j+1)
	}
	total := 0.0
	sorted := slices.Clone(p)
	slices.Sort(sorted) // smallest terms first
	for _, v := range sorted {
		total += v
	}
	r := refTails{lo: lo, cdf: make([]float64, len(p)), upper: make([]float64, len(p))}
	acc := 0.0
	for i, v := range p {
		acc += v
		r.cdf[i] = acc / total
	}
	acc = 0
	for i := len(p) - 1; i >= 0; i-- {
		r.upper[i] = acc / total
		acc += p[i]
	}
	return r
}

// reaches reports whether the reference CDF at k reaches q, comparing the
// tail nearer q, and how far from the boundary (relative) the comparison
// was.
func (r refTails) reaches(k int, q float64) (ok bool, margin float64) {
	if k < r.lo {
		return false, 1
	}
	i := k - r.lo
	if i >= len(r.cdf) {
		return true, 1
	}
	if q >= 0.5 {
		return r.upper[i] <= 1-q, math.Abs(r.upper[i]-(1-q)) / (1 - q)
	}
	return r.cdf[i] >= q, math.Abs(r.cdf[i]-q) / q
}

// checkAgainstRef fails unless k is the reference's quantile, up to ties
// closer than tol (relative, in the tail compared).
func checkAgainstRef(t *testing.T, r refTails, lambda, q float64, k uint64, tol float64) {
	t.Helper()
	ok, m := r.reaches(int(k), q)
	if !ok && m > tol {
		t.Errorf("PoissonQuantile(%v, %v) = %d, but the reference CDF there is below q (margin %.3g)", lambda, q, k, m)
	}
	if k > 0 {
		ok, m := r.reaches(int(k)-1, q)
		if ok && m > tol {
			t.Errorf("PoissonQuantile(%v, %v) = %d, but the reference CDF at %d already reaches q (margin %.3g)", lambda, q, k, k-1, m)
		}
	}
}

// randomQ draws q uniformly, and from both tails down to 1e-12.
func randomQ(rng *rand.Rand) float64 {
	switch rng.IntN(3) {
	case 0:
		return math.Pow(10, -1-11*rng.Float64())
	case 1:
		return 1 - math.Pow(10, -1-11*rng.Float64())
	}
	for {
		if q := rng.Float64(); q > 0 {
			return q
		}
	}
}

func TestPoissonQuantileAgainstSummation(t *testing.T) {
	seed := uint64(20260915)
	rng := rand.New(rand.NewPCG(seed, 1))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		lambda := math.Pow(10, -3+6*rng.Float64()) // 1e-3 … 1e3
		r := newRef(lambda)
		for range 3 {
			q := randomQ(rng)
			checkAgainstRef(t, r, lambda, q, PoissonQuantile(lambda, q), 1e-12)
		}
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

// Around every boundary: q just at, just under and just over CDF(k), as
// the reference computes it, must give k, k and k+1.
func TestPoissonQuantileBoundaries(t *testing.T) {
	for _, lambda := range []float64{0.05, 0.7, 1, 3.5, 12, 150, 999, 1000, 1001, 5000} {
		r := newRef(lambda)
		mode := int(lambda)
		for _, k := range []int{0, 1, mode / 2, mode, mode + 1, mode + int(2*math.Sqrt(lambda)) + 1} {
			i := k - r.lo
			if i < 0 || r.cdf[i] >= 1-1e-12 || r.cdf[i] < 1e-12 {
				continue
			}
			c := r.cdf[i]
			for _, tc := range []struct {
				q    float64
				want uint64
			}{{c * (1 - 1e-9), uint64(k)}, {c * (1 + 1e-9), uint64(k + 1)}} {
				if tc.q >= 0.5 { // move by a relative step of the upper tail
					up := r.upper[i]
					if tc.want == uint64(k) {
						tc.q = 1 - up*(1+1e-9)
					} else {
						tc.q = 1 - up*(1-1e-9)
					}
				}
				if got := PoissonQuantile(lambda, tc.q); got != tc.want {
					t.Errorf("PoissonQuantile(%v, %.17g) = %d, want %d (CDF(%d) = %.17g)", lambda, tc.q, got, tc.want, k, c)
				}
			}
		}
	}
}

func TestPoissonQuantileLarge(t *testing.T) {
	for _, lambda := range []float64{1e4, 1e5, 1e6} {
		r := newRef(lambda)
		for _, q := range []float64{1e-9, 0.01, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999, 1 - 1e-9} {
			checkAgainstRef(t, r, lambda, q, PoissonQuantile(lambda, q), 1e-9)
		}
	}
	// 1e9 and beyond: within the Cornish–Fisher neighbourhood, and exact
	// against the package's own CDF (which the smaller λ checked).
	for _, lambda := range []float64{1e6, 1e7, 1e9, 1e12, 1e15} {
		for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.95, 0.99, 0.999999} {
			k := PoissonQuantile(lambda, q)
			z := math.Sqrt2 * math.Erfinv(2*q-1)
			cf := lambda + z*math.Sqrt(lambda) + (z*z-1)/6 - 0.5
			if d := float64(k) - cf; math.Abs(d) > 2 {
				t.Errorf("PoissonQuantile(%v, %v) = %d, %.1f from Cornish–Fisher's %.1f", lambda, q, k, d, cf)
			}
			if CDF(k, lambda) < q || k > 0 && CDF(k-1, lambda) >= q {
				t.Errorf("PoissonQuantile(%v, %v) = %d: CDF(k−1), CDF(k) = %.17g, %.17g", lambda, q, k, CDF(k-1, lambda), CDF(k, lambda))
			}
		}
	}
}

func TestPoissonQuantileMonotone(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	qs := make([]float64, 300)
	for i := range qs {
		qs[i] = randomQ(rng)
	}
	slices.Sort(qs)
	lambdas := make([]float64, 300)
	for i := range lambdas {
		lambdas[i] = math.Pow(10, -3+12*rng.Float64()) // 1e-3 … 1e9
	}
	slices.Sort(lambdas)
	for i, lambda := range lambdas {
		if i%15 != 0 {
			continue
		}
		prev := uint64(0)
		for _, q := range qs {
			k := PoissonQuantile(lambda, q)
			if k < prev {
				t.Fatalf("λ = %v: PoissonQuantile falls from %d to %d as q rises to %v", lambda, prev, k, q)
			}
			prev = k
		}
	}
	for i, q := range qs {
		if i%15 != 0 {
			continue
		}
		prev := uint64(0)
		for _, lambda := range lambdas {
			k := PoissonQuantile(lambda, q)
			if k < prev {
				t.Fatalf("q = %v: PoissonQuantile falls from %d to %d as λ rises to %v", q, prev, k, lambda)
			}
			prev = k
		}
	}
}

func TestPoissonQuantileEdges(t *testing.T) {
	const maxU = math.MaxUint64
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		lambda, q float64
		want      uint64
	}{
		{0, 0.95, 0}, {-1, 0.95, 0}, {1e-300, 0.95, 0}, {5, 0, 0}, {5, -1, 0},
		{5, 1, maxU}, {5, 2, maxU}, {5, nan, maxU}, {nan, 0.5, maxU}, {inf, 0.5, maxU}, {-inf, 0.5, 0},
		{1, math.SmallestNonzeroFloat64, 0},
		// CDF(0) = e⁻¹ = 0.367879441171442321…: q a few ulps either side.
		{1, 0.5, 1}, {1, math.Exp(-1) * (1 + 1e-15), 1}, {1, math.Exp(-1) * (1 - 1e-15), 0},
		{0.1, 0.95, 1}, {1000, 0.95, 1052}, {100, 0.99, 124},
	} {
		if got := PoissonQuantile(tc.lambda, tc.q); got != tc.want {
			t.Errorf("PoissonQuantile(%v, %v) = %d, want %d", tc.lambda, tc.q, got, tc.want)
		}
	}
	// The largest q below 1 still has a finite answer.
	if k := PoissonQuantile(1, math.Nextafter(1, 0)); k == maxU || k < 10 {
		t.Errorf("PoissonQuantile(1, 1−2⁻⁵³) = %d, want a finite count ≥ 10", k)
	}
	for _, q := range []float64{0, 1, nan, -0.5} {
		if CheckQuantile(q) == nil {
			t.Errorf("CheckQuantile(%v) = nil, want an error", q)
		}
	}
	if err := CheckQuantile(0.95); err != nil {
		t.Errorf("CheckQuantile(0.95) = %v", err)
	}
}

func TestPoissonQuantileAllocs(t *testing.T) {
	for _, lambda := range []float64{0.5, 50, 5000, 1e9} {
		if n := testing.AllocsPerRun(100, func() { PoissonQuantile(lambda, 0.95) }); n != 0 {
			t.Errorf("PoissonQuantile(%v, 0.95) allocates %v times", lambda, n)
		}
	}
}

func FuzzPoissonQuantile(f *testing.F) {
	for _, s := range [][2]float64{{0.1, 0.95}, {1, 0.5}, {1000, 0.99}, {1e9, 0.95}, {0, 0.5}, {3, 1e-300}, {1e5, 1 - 1e-16}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, lambda, q float64) {
		k := PoissonQuantile(lambda, q) // never panics
		if !(lambda > 0 && lambda <= MaxExactLambda && q > 0 && q < 1) {
			return
		}
		if !cdfReaches(float64(k), lambda, q) {
			t.Fatalf("PoissonQuantile(%v, %v) = %d, whose CDF is below q", lambda, q, k)
		}
		if k > 0 && cdfReaches(float64(k-1), lambda, q) {
			t.Fatalf("PoissonQuantile(%v, %v) = %d, but k−1 already reaches q", lambda, q, k)
		}
		if lambda <= 1000 {
			checkAgainstRef(t, newRef(lambda), lambda, q, k, 1e-10)
		}
	})
}

func BenchmarkPoissonQuantile(b *testing.B) {
	for _, lambda := range []float64{0.1, 10, 900, 1000, 1e6, 1e9} {
		b.Run(fmtLambda(lambda), func(b *testing.B) {
			for b.Loop() {
				PoissonQuantile(lambda, 0.95)
			}
		})
	}
}

func fmtLambda(l float64) string { return "lambda=" + strconv.FormatFloat(l, 'g', -1, 64) }
