package compare

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// oracleQuantile is the nearest-rank quantile of the raw samples.
func oracleQuantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[nearestRank(uint64(len(sorted)), q)-1]
}

func TestHistogramQuantilesMatchTheSortedSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() time.Duration{
		"tiny exact":  func() time.Duration { return time.Duration(rng.IntN(200)) },
		"lognormal":   func() time.Duration { return time.Duration(20e3 * (1 + rng.ExpFloat64()*rng.ExpFloat64())) },
		"bimodal":     func() time.Duration { return []time.Duration{45, 30e6}[rng.IntN(2)] + time.Duration(rng.IntN(1000)) },
		"heavy tails": func() time.Duration { return time.Duration(1 / (rng.Float64() + 1e-7)) },
	}
	for name, draw := range dists {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{1, 7, 1000, 100_000} {
				var h Histogram
				raw := make([]time.Duration, n)
				for i := range raw {
					raw[i] = draw()
					h.Record(raw[i])
				}
				slices.Sort(raw)
				if h.Count() != uint64(n) || h.Max() != raw[n-1] {
					t.Fatalf("n=%d: count %d max %v, want %d and %v", n, h.Count(), h.Max(), n, raw[n-1])
				}
				for _, q := range []float64{0.001, 0.5, 0.9, 0.99, 0.999, 1} {
					got, want := h.Quantile(q), oracleQuantile(raw, q)
					// Within its bucket: 1/128 of the value either way, or exact
					// below 256 ns.
					tol := want / 128
					if want < 256 {
						tol = 0
					}
					if d := got - want; d < -tol || d > tol {
						t.Errorf("n=%d q=%v: got %v, want %v ± %v", n, q, got, want, tol)
					}
				}
			}
		})
	}
}

func TestBucketsTileTheLine(t *testing.T) {
	// Every bucket starts where the one before ended, and every value maps
	// to the bucket whose range holds it.
	var next uint64
	for i := range histBuckets {
		lo, hi := bucketRange(i)
		if lo != next || hi < lo {
			t.Fatalf("bucket %d = [%d, %d], want it to start at %d", i, lo, hi, next)
		}
		for _, v := range []uint64{lo, hi, lo + (hi-lo)/2} {
			if b := bucketOf(v); b != i {
				t.Fatalf("value %d in bucket %d, want %d", v, b, i)
			}
		}
		next = hi + 1
	}
}

func TestNearestRank(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		q    float64
		want uint64
	}{
		{1000, 0.999, 999}, {1000, 0.99, 990}, {1000, 0.5, 500}, {1001, 0.5, 501},
		{10, 0.001, 1}, {10, 1, 10}, {3, 0, 1}, {100, 0.991, 100},
	} {
		if got := nearestRank(c.n, c.q); got != c.want {
			t.Errorf("nearestRank(%d, %v) = %d, want %d", c.n, c.q, got, c.want)
		}
	}
}

func TestHistogramMergeAndEmpty(t *testing.T) {
	var a, b, empty Histogram
	if empty.Quantile(0.5) != 0 || empty.Mean() != 0 {
		t.Fatal("an empty histogram has no quantiles")
	}
	for i := range 100 {
		a.Record(time.Duration(i))
		b.Record(time.Duration(1000 + i))
	}
	a.Merge(&b)
	if a.Count() != 200 || a.Quantile(0.5) != 99 || a.Max() != 1099 {
		t.Fatalf("merged: count %d p50 %v max %v, want 200, 99ns, 1.099µs", a.Count(), a.Quantile(0.5), a.Max())
	}
	if got, want := a.Mean(), time.Duration((99*100/2+1000*100+99*100/2)/200); got != want {
		t.Fatalf("mean %v, want %v", got, want)
	}
}
