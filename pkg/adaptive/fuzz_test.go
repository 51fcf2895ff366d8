package adaptive

import (
	"math"
	"testing"
	"time"
)

// FuzzStep feeds arbitrary samples and intervals, four steps of them, and
// checks that the estimate is never NaN, infinite or negative, that a
// sample without information leaves it exactly as it was, and that an
// estimate, once there is one, is never under the floor.
func FuzzStep(f *testing.F) {
	nan, inf := math.NaN(), math.Inf(1)
	// offered, admitted, goodput, errors, inFlight, p99 (ns), dt (ns), then a second sample scaled by k
	f.Add(400.0, 400.0, 200.0, 0.25, 110.0, int64(545*time.Millisecond), int64(time.Second), 0.5)
	f.Add(100.0, 100.0, 100.0, 0.0, 5.0, int64(50*time.Millisecond), int64(time.Second), 3.0)
	f.Add(nan, inf, -1.0, 2.0, nan, int64(-1), int64(0), nan)
	f.Add(math.MaxFloat64, math.MaxFloat64, math.MaxFloat64, 0.0, math.MaxFloat64, int64(math.MaxInt64), int64(math.MaxInt64), 1e300)
	f.Add(1e-300, 1e-300, 1e-300, 1.0, 0.0, int64(0), int64(1), 1e-300)
	f.Add(10.0, 10.0, 0.0, 1.0, 0.0, int64(time.Second), int64(time.Second), 0.0)
	f.Fuzz(func(t *testing.T, offered, admitted, goodput, errs, inFlight float64, p99, dt int64, k float64) {
		for _, obj := range []Objective{objective, {LatencyP99: time.Nanosecond}, {Errors: 0.5}} {
			e := mustNew(t, DefaultConfig(obj))
			samples := []Sample{
				{offered, admitted, goodput, time.Duration(p99), errs, inFlight},
				{offered * k, admitted * k, goodput * k, time.Duration(p99) / 2, errs / 2, inFlight},
				{offered, admitted, goodput / 3, time.Duration(p99), errs, inFlight},
				{offered * k, admitted, goodput * k, time.Duration(p99) * 3, errs * k, inFlight * k},
			}
			for i, s := range samples {
				before := e.Estimate()
				got := e.Step(time.Duration(dt), s)
				c := got.Capacity
				if math.IsNaN(c) || math.IsInf(c, 0) || c < 0 {
					t.Fatalf("step %d %+v: capacity %v", i, s, c)
				}
				if got.Reason == NoData && c != before.Capacity {
					t.Fatalf("step %d %+v: no data moved the estimate from %v to %v", i, s, before.Capacity, c)
				}
				if (dt <= 0 || !s.valid()) && got.Reason != NoData {
					t.Fatalf("step %d %+v dt %v: %v, want no data", i, s, dt, got)
				}
				if c != 0 && c < e.cfg.MinRate {
					t.Fatalf("step %d %+v: capacity %v under the floor", i, s, c)
				}
			}
		}
	})
}
