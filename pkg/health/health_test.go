package health

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestBounds(t *testing.T) {
	b := Bounds()
	if len(b) != Buckets-1 || b[0] != 250*time.Microsecond {
		t.Fatalf("%d bounds from %v, want %d from 250µs", len(b), b[0], Buckets-1)
	}
	if last := b[len(b)-1]; last < 50*time.Second || last > 60*time.Second {
		t.Errorf("last bound %v, want about 52s", last)
	}
	for i := 1; i < len(b); i++ {
		if r := float64(b[i]) / float64(b[i-1]); math.Abs(r-math.Cbrt(2)) > 1e-3 {
			t.Errorf("bound %d is %.4f× bound %d, want 2^⅓", i, r, i-1)
		}
	}
}

func TestBucket(t *testing.T) {
	b := Bounds()
	for i, bound := range b {
		if got := Bucket(bound); got != i {
			t.Errorf("Bucket(%v) = %d, want %d (bounds are inclusive)", bound, got, i)
		}
		if got := Bucket(bound + 1); got != i+1 {
			t.Errorf("Bucket(%v+1ns) = %d, want %d", bound, got, i+1)
		}
	}
	for _, d := range []time.Duration{-time.Second, 0, 1} {
		if got := Bucket(d); got != 0 {
			t.Errorf("Bucket(%v) = %d, want 0", d, got)
		}
	}
	if got := Bucket(time.Hour); got != Buckets-1 {
		t.Errorf("Bucket(1h) = %d, want the open bucket %d", got, Buckets-1)
	}
}

func TestOutcomes(t *testing.T) {
	for status, want := range map[int]Outcome{200: OK, 204: OK, 302: OK, 404: OK, 429: OK, 499: Abandoned,
		500: Failed, 502: Failed, 503: Failed, 504: TimedOut} {
		if got := HTTPOutcome(status); got != want {
			t.Errorf("HTTPOutcome(%d) = %d, want %d", status, got, want)
		}
	}
	for code, want := range map[uint32]Outcome{0: OK, 1: Abandoned, 2: Failed, 3: OK, 4: TimedOut, 5: OK,
		8: Failed, 13: Failed, 14: Failed, 16: OK, 17: Failed, 1 << 31: Failed} {
		if got := GRPCOutcome(code); got != want {
			t.Errorf("GRPCOutcome(%d) = %d, want %d", code, got, want)
		}
	}
}

// TestQuantileAgainstExact: the p50, p99 and p999 read off the buckets of
// 100,000 latencies from a few distributions are within a bucket's ratio
// (26 %) of the exact ones, and within 5 % when the distribution is smooth
// across its bucket.
func TestQuantileAgainstExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for name, draw := range map[string]func() time.Duration{
		"exponential 20ms": func() time.Duration { return time.Duration(rng.ExpFloat64() * 20e6) },
		"lognormal 5ms":    func() time.Duration { return time.Duration(5e6 * math.Exp(rng.NormFloat64())) },
		"uniform 1-300ms":  func() time.Duration { return time.Duration(1e6 + rng.Float64()*299e6) },
		"bimodal 2ms/800ms": func() time.Duration {
			if rng.IntN(50) == 0 {
				return time.Duration(800e6 * (1 + rng.Float64()/10))
			}
			return time.Duration(2e6 * (1 + rng.Float64()))
		},
	} {
		var w [Buckets]float64
		xs := make([]time.Duration, 100_000)
		for i := range xs {
			xs[i] = draw()
			w[Bucket(xs[i])]++
		}
		slices.Sort(xs)
		for _, q := range []float64{0.5, 0.99, 0.999} {
			exact := xs[int(q*float64(len(xs)))]
			got, ok := Quantile(w[:], q)
			bound := 0.05
			if strings.HasPrefix(name, "bimodal") || strings.HasPrefix(name, "uniform") { // an edge inside a bucket
				bound = math.Cbrt(2) - 1
			}
			if !ok || math.Abs(float64(got)/float64(exact)-1) > bound {
				t.Errorf("%s: p%v = %v (ok %v), exact %v, want within %.0f %%", name, q*100, got, ok, exact, 100*bound)
			}
		}
	}
}

func TestQuantileRefuses(t *testing.T) {
	good := make([]float64, Buckets)
	good[3] = 1
	for name, tc := range map[string]struct {
		w []float64
		q float64
	}{
		"empty":       {make([]float64, Buckets), 0.99},
		"short":       {[]float64{1}, 0.99},
		"q 0":         {good, 0},
		"q 1":         {good, 1},
		"q NaN":       {good, math.NaN()},
		"NaN weight":  {append(slices.Clone(good[:Buckets-1]), math.NaN()), 0.5},
		"negative":    {append(slices.Clone(good[:Buckets-1]), -1), 0.5},
		"infinite":    {append(slices.Clone(good[:Buckets-1]), math.Inf(1)), 0.5},
		"huge totals": {append(slices.Repeat([]float64{math.MaxFloat64}, Buckets-1), math.MaxFloat64), 0.5},
	} {
		if d, ok := Quantile(tc.w, tc.q); ok {
			t.Errorf("%s: Quantile = %v, want refused", name, d)
		}
	}
	open := make([]float64, Buckets)
	open[Buckets-1] = 5
	if d, ok := Quantile(open, 0.99); !ok || d != Bounds()[Buckets-2] {
		t.Errorf("all in the open bucket: %v %v, want the last bound", d, ok)
	}
}

// TestRecorderTakesEachOnce: answers recorded from many goroutines while
// another takes windows are each counted in exactly one window, and the
// requests in flight are counted.
func TestRecorderTakesEachOnce(t *testing.T) {
	var r Recorder
	const workers, each = 8, 5000
	var wg sync.WaitGroup
	var sum Counts
	stop := make(chan struct{})
	taken := make(chan struct{})
	go func() {
		defer close(taken)
		var c Counts
		for {
			select {
			case <-stop:
				r.Take(&c)
				add(&sum, &c)
				return
			default:
			}
			r.Take(&c)
			add(&sum, &c)
		}
	}()
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				r.Start()
				r.Done(time.Duration(i)*time.Millisecond, Outcome((w+i)%4))
			}
		})
	}
	wg.Wait()
	close(stop)
	<-taken
	answered := uint64(workers * each * 3 / 4)
	if sum.Answered() != answered || sum.OK != answered/3 || sum.Failed != answered/3 || sum.Late != answered/3 {
		t.Errorf("took %d OK, %d failed, %d late, want %d each", sum.OK, sum.Failed, sum.Late, answered/3)
	}
	var inBuckets uint64
	for _, n := range sum.Latency {
		inBuckets += n
	}
	if inBuckets != answered {
		t.Errorf("%d latencies, want %d (abandoned ones are not)", inBuckets, answered)
	}
	r.Start()
	var c Counts
	r.Take(&c)
	if c.InFlight != 1 || c.Answered() != 0 {
		t.Errorf("one request in flight: %+v", c)
	}
}

func add(sum, c *Counts) {
	for i := range c.Latency {
		sum.Latency[i] += c.Latency[i]
	}
	sum.OK += c.OK
	sum.Failed += c.Failed
	sum.Late += c.Late
}

func TestRecorderAllocatesNothing(t *testing.T) {
	var r Recorder
	var c Counts
	if n := testing.AllocsPerRun(1000, func() {
		r.Start()
		r.Done(3*time.Millisecond, OK)
		r.Take(&c)
	}); n != 0 {
		t.Errorf("%v allocations a request, want 0", n)
	}
}

func BenchmarkRecord(b *testing.B) {
	var r Recorder
	d := 7 * time.Millisecond
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Start()
			r.Done(d, OK)
		}
	})
}
