package sim

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestZipfMatches draws from the alias table and checks every rank's count
// against its expected count within five standard deviations of the
// binomial count (the tolerance comes from the sample size), and the total
// probability of the tail ranks grouped together, where single counts are
// too small to say anything.
func TestZipfMatches(t *testing.T) {
	for _, tc := range []struct {
		n int
		s float64
	}{{1, 1}, {10, 0}, {1000, 1}, {1000, 0.5}, {50000, 1.2}} {
		z := newZipf(tc.n, tc.s)
		sum := 0.0
		for i := range tc.n {
			want := math.Pow(float64(i+1), -tc.s)
			if i > 0 && want > math.Pow(float64(i), -tc.s) {
				t.Fatalf("weights do not fall")
			}
			sum += z.Prob(i)
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("n=%d s=%v: probabilities add up to %v", tc.n, tc.s, sum)
		}
		const draws = 2_000_000
		r := rand.New(rand.NewPCG(7, uint64(tc.n)))
		counts := make([]int, tc.n)
		for range draws {
			counts[z.Draw(r)]++
		}
		tailP, tailN := 0.0, 0
		for i, c := range counts {
			p := z.Prob(i)
			mean := draws * p
			if mean < 100 {
				tailP += p
				tailN += c
				continue
			}
			if sd := math.Sqrt(mean * (1 - p)); math.Abs(float64(c)-mean) > 5*sd+1 {
				t.Errorf("n=%d s=%v rank %d: %d draws, want %.0f ± %.0f", tc.n, tc.s, i, c, mean, 5*sd)
			}
		}
		mean := draws * tailP
		if sd := math.Sqrt(mean * (1 - tailP)); math.Abs(float64(tailN)-mean) > 5*sd+1 {
			t.Errorf("n=%d s=%v tail: %d draws, want %.0f ± %.0f", tc.n, tc.s, tailN, mean, 5*sd)
		}
	}
}

// TestZipfCheapDraws: a draw does not allocate.
func TestZipfCheapDraws(t *testing.T) {
	z := newZipf(1000, 1)
	r := rand.New(rand.NewPCG(1, 2))
	if a := testing.AllocsPerRun(1000, func() { z.Draw(r) }); a != 0 {
		t.Fatalf("%v allocs per draw", a)
	}
}
