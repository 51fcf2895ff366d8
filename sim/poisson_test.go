package sim

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestPoisson(t *testing.T) {
	for _, lambda := range []float64{0.05, 1, 12, 120, 1700} {
		r := rand.New(rand.NewPCG(1, uint64(lambda*100)))
		const n = 20000
		var sum, sq float64
		for range n {
			k := float64(poisson(r, lambda))
			sum += k
			sq += k * k
		}
		mean := sum / n
		variance := sq/n - mean*mean
		// Mean and variance of a Poisson distribution are both lambda;
		// the bounds are many standard errors wide, and the seed fixed.
		if se := math.Sqrt(lambda / n); math.Abs(mean-lambda) > 6*se {
			t.Errorf("lambda %v: mean %v", lambda, mean)
		}
		if math.Abs(variance-lambda) > 0.1*lambda+0.01 {
			t.Errorf("lambda %v: variance %v", lambda, variance)
		}
	}
	if got := poisson(rand.New(rand.NewPCG(1, 1)), 0); got != 0 {
		t.Errorf("lambda 0: %d", got)
	}
}

// One draw consumes one uniform (per 500 of mean), so a draw can never
// shift the rest of the stream.
func TestPoissonConsumesOneUniform(t *testing.T) {
	for _, lambda := range []float64{0.3, 7, 499} {
		a := rand.New(rand.NewPCG(9, 9))
		b := rand.New(rand.NewPCG(9, 9))
		for range 100 {
			poisson(a, lambda)
			b.Float64()
		}
		if a.Uint64() != b.Uint64() {
			t.Errorf("lambda %v: the streams diverged", lambda)
		}
	}
}

func TestRate(t *testing.T) {
	ramp := Rate{Kind: Ramp, Points: []Point{{At: time.Second, RPS: 100}, {At: 3 * time.Second, RPS: 300}}}
	steps := Rate{Kind: Steps, Points: ramp.Points}
	day := Rate{Kind: Diurnal, Min: 10, Max: 110, PeakAt: 6 * time.Hour, Period: 24 * time.Hour}
	for _, c := range []struct {
		name string
		r    Rate
		t    time.Duration
		want float64
	}{
		{"constant", ConstantRate(42), time.Hour, 42},
		{"ramp before", ramp, 0, 100},
		{"ramp middle", ramp, 2 * time.Second, 200},
		{"ramp after", ramp, time.Minute, 300},
		{"steps middle", steps, 2999 * time.Millisecond, 100},
		{"steps at point", steps, 3 * time.Second, 300},
		{"diurnal peak", day, 6 * time.Hour, 110},
		{"diurnal trough", day, 18 * time.Hour, 10},
		{"diurnal before peak", day, 0, 60},
		{"diurnal next day", day, 30 * time.Hour, 110},
	} {
		if got := c.r.At(c.t); !near(got, c.want) {
			t.Errorf("%s: At(%v) = %v, want %v", c.name, c.t, got, c.want)
		}
	}
}
