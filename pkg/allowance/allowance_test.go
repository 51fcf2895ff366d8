package allowance

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// Temme's expansion and the series or continued fraction agree where both
// hold (a ≥ temmeMinA, |η| ≤ temmeMaxEta), each tail to its own precision.
func TestTemmeAgreesWithSeries(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 400 {
		a := math.Round(math.Pow(10, 3+2*rng.Float64())) // 1e3 … 1e5
		mu := (rng.Float64()*2 - 1) * 0.25
		x := a * (1 + mu)
		af := a * log1pmx((x-a)/a)
		eta := math.Copysign(math.Sqrt(2*af/a), x-a)
		tq, tp := temmeQP(a, eta, af)
		front := math.Sqrt(a/(2*math.Pi)) * math.Exp(-af-lnGammaStar(a))
		var sq, sp float64
		if x < a+1 {
			sp = front * lowerSeries(a, x)
			sq = 1 - sp
		} else {
			sq = front * upperFraction(a, x)
			sp = 1 - sq
		}
		small, smallRef := tq, sq // compare the smaller tail, relatively
		if tp < tq {
			small, smallRef = tp, sp
		}
		if smallRef < 1e-300 {
			continue
		}
		if d := math.Abs(small-smallRef) / smallRef; d > 1e-12 {
			t.Errorf("a = %v, x = %v: Temme's tail %.17g, series %.17g (relative %.2g)", a, x, small, smallRef, d)
		}
	}
}

func TestLog1pmx(t *testing.T) {
	for _, mu := range []float64{-0.9, -0.5, -0.3, -1e-3, -1e-9, 1e-9, 1e-5, 0.1, 0.4, 1, 3, 100} {
		got := log1pmx(mu)
		// Taylor reference near 0, direct form away from it.
		var want float64
		if math.Abs(mu) < 1e-3 {
			want = mu*mu/2 - mu*mu*mu/3 + mu*mu*mu*mu/4
		} else {
			want = mu - math.Log1p(mu)
		}
		tol := 1e-15
		if math.Abs(mu) >= 1e-3 && math.Abs(mu) < 0.5 {
			tol = 1e-15 / (mu * mu) // the direct form's own cancellation
		}
		if d := math.Abs(got-want) / want; d > tol {
			t.Errorf("log1pmx(%v) = %.17g, want %.17g", mu, got, want)
		}
	}
}

func TestAllowance(t *testing.T) {
	const maxU = math.MaxUint64
	s := time.Second
	for _, tc := range []struct {
		limit    float64
		sidecars int
		window   time.Duration
		q        float64
		want     uint64
	}{
		{50, 300, s, 0.95, 1},        // λ = 0.17: the floor
		{3000, 300, s, 0.95, 15},     // λ = 10
		{30000, 300, s, 0.99, 124},   // λ = 100
		{100, 1, 10 * s, 0.95, 1052}, // λ = 1000
		{100, 0, 10 * s, 0.95, 1052}, // sidecars < 1 counts as 1
		{0, 300, s, 0.95, 0},         // a zero limit admits nothing
		{-5, 300, s, 0.95, 0},
		{math.NaN(), 300, s, 0.95, maxU}, // invalid input fails open
		{50, 300, 0, 0.95, maxU},
		{50, 300, s, math.NaN(), maxU},
		{50, 300, s, 1, maxU},
	} {
		if got := Allowance(tc.limit, tc.sidecars, tc.window, tc.q); got != tc.want {
			t.Errorf("Allowance(%v, %d, %v, %v) = %d, want %d", tc.limit, tc.sidecars, tc.window, tc.q, got, tc.want)
		}
	}
}

// The report threshold is the quantile at half the limit, at least 1, and
// never above the allowance.
func TestReportThreshold(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for range 2000 {
		limit := math.Pow(10, -1+6*rng.Float64())
		sidecars := 1 + rng.IntN(1000)
		window := time.Duration(1+rng.IntN(60)) * time.Second
		q := randomQ(rng)
		r, a := ReportThreshold(limit, sidecars, window, q), Allowance(limit, sidecars, window, q)
		want := max(1, PoissonQuantile(Mean(limit, sidecars, window)/2, q))
		if r != want || r > a || r < 1 {
			t.Fatalf("ReportThreshold(%v, %d, %v, %v) = %d, want %d, ≤ allowance %d", limit, sidecars, window, q, r, want, a)
		}
	}
}

func TestLocalDropRatio(t *testing.T) {
	for _, tc := range []struct {
		a, n uint64
		want float64
	}{{5, 0, 0}, {5, 5, 0}, {5, 10, 0.5}, {0, 1, 1}, {1, 4, 0.75}, {math.MaxUint64, math.MaxUint64, 0}} {
		if got := LocalDropRatio(tc.a, tc.n); got != tc.want {
			t.Errorf("LocalDropRatio(%d, %d) = %v, want %v", tc.a, tc.n, got, tc.want)
		}
	}
}

// ExpectedDropShare against a simulation of the rule it describes: Poisson
// counts per window, the n-th request dropped with LocalDropRatio(A, n).
func TestExpectedDropShareSimulated(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	for _, tc := range []struct {
		mean float64
		a    uint64
	}{{0.5, 1}, {3, 3}, {10, 12}, {40, 45}} {
		const windows = 200000
		var sent, dropped float64
		for range windows {
			n := poissonDraw(rng, tc.mean)
			for i := uint64(1); i <= n; i++ {
				sent++
				dropped += LocalDropRatio(tc.a, i) // expected drops, not a coin: less noise
			}
		}
		got, want := dropped/sent, ExpectedDropShare(tc.mean, tc.a)
		// 5 standard errors of the window-to-window variation.
		if math.Abs(got-want) > 0.05*want+5e-4 {
			t.Errorf("mean %v, A = %d: simulated share %.4g, ExpectedDropShare %.4g", tc.mean, tc.a, got, want)
		}
	}
	if got := ExpectedDropShare(0, 3); got != 0 {
		t.Errorf("ExpectedDropShare(0, 3) = %v, want 0", got)
	}
}

// poissonDraw is Knuth's method, fine for small means.
func poissonDraw(rng *rand.Rand, mean float64) uint64 {
	l, k, p := math.Exp(-mean), uint64(0), 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func BenchmarkAllowance(b *testing.B) {
	for b.Loop() {
		Allowance(50, 300, 30*time.Second, DefaultQuantile)
	}
}
