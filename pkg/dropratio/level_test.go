package dropratio

import (
	"math"
	"testing"
	"time"
)

func TestLevelStep(t *testing.T) {
	const L, N = 100.0, 200.0
	p, s := 10*time.Second, time.Second
	inf, nan := math.Inf(1), math.NaN()
	for _, tc := range []struct {
		name                          string
		level, admitted, limit, burst float64
		dt, payback                   time.Duration
		want                          float64
	}{
		{"quiet fills at L − A", 0, 40, L, N, s, 0, 60},
		{"fills up to the burst", 180, 0, L, N, s, 0, N},
		{"full stays full at the limit", N, L, L, N, s, 0, N},
		{"spends what is admitted above L", N, 250, L, N, s, 0, 50},
		{"spent, without payback, stays at 0", 50, 400, L, N, s, 0, 0},
		{"spent, with payback, runs into debt", 50, 400, L, N, s, p, -250},
		{"debt capped at a window", -900, 1000, L, N, s, p, -L * 10},
		{"debt paid back, then tokens", -30, 0, L, N, s, p, 70},
		{"a small debt shrinking is carried", -9, 99, L, 0, s, p, -8},
		{"no burst, no payback: always 0", 0, 500, L, 0, s, 0, 0},
		{"no burst, no payback: under the limit, 0", 0, 0, L, 0, s, 0, 0},
		{"no limit holds nothing", N, 1e9, inf, N, s, p, 0},
		{"a limit of 0 holds nothing", N, 0, 0, N, s, p, 0},
		{"NaN limit holds nothing", N, 0, nan, N, s, p, 0},
		{"NaN level counts as 0", nan, 0, L, N, s, p, L},
		{"NaN admitted spends nothing", 0, nan, L, N, s, 0, L},
		{"infinite admitted spends nothing", 0, inf, L, N, s, 0, L},
		{"NaN burst is none", 0, 0, L, nan, s, 0, 0},
		{"infinite burst is none", 0, 0, L, inf, s, 0, 0},
		{"negative burst is none", 0, 0, L, -5, s, 0, 0},
		{"dt 0 keeps it", 120, 1e6, L, N, 0, p, 120},
		{"dt 0 clamps it", 5000, 0, L, N, 0, p, N},
	} {
		if got := LevelStep(tc.level, tc.admitted, tc.limit, tc.burst, tc.dt, tc.payback); got != tc.want {
			t.Errorf("%s: LevelStep(%v, %v, %v, %v, %v, %v) = %v, want %v",
				tc.name, tc.level, tc.admitted, tc.limit, tc.burst, tc.dt, tc.payback, got, tc.want)
		}
	}
}

func TestLevelLimit(t *testing.T) {
	p, s := 10*time.Second, time.Second
	for _, tc := range []struct {
		limit, level   float64
		spend, payback time.Duration
		want           float64
	}{
		{100, 0, s, p, 100},
		{100, 200, s, p, 300},                 // tokens spent within a tick
		{100, 200, 2 * s, p, 200},             // or over two
		{100, 200, 0, p, 100},                 // no spend, no tokens
		{100, -200, s, p, 20},                 // debt: DebtLimit
		{100, -200, s, 0, 100},                // debt without payback lowers nothing
		{100, math.NaN(), s, p, 100},          // NaN counts as 0
		{math.Inf(1), 200, s, p, math.Inf(1)}, // no limit
		{0, 200, s, p, 200},                   // a limit of 0 holds no tokens (LevelStep), but spends what it is given
	} {
		if got := LevelLimit(tc.limit, tc.level, tc.spend, tc.payback); got != tc.want {
			t.Errorf("LevelLimit(%v, %v, %v, %v) = %v, want %v", tc.limit, tc.level, tc.spend, tc.payback, got, tc.want)
		}
	}
}

// TestLevelBurst runs a bucket of limit L and burst N as the controller
// does, one step a second, admitting min(offered, LevelLimit): after a
// quiet period the bucket is full, a burst of N above L is admitted in
// full, and then the bucket admits L.
func TestLevelBurst(t *testing.T) {
	const L, N = 1000.0, 2000.0
	s := time.Second
	level := 0.0
	offered := func(i int) float64 {
		switch {
		case i < 20:
			return 200
		case i < 23:
			return 1600
		}
		return 3000
	}
	over := 0.0
	for i := range 40 {
		a := min(offered(i), LevelLimit(L, level, s, 0))
		if a < 0 || math.IsNaN(a) {
			t.Fatalf("step %d: admitted %v", i, a)
		}
		if i >= 20 && i < 23 && a != offered(i) {
			t.Errorf("step %d: burst admitted %v of %v", i, a, offered(i))
		}
		if i >= 25 && a != L {
			t.Errorf("step %d: after the burst admitted %v, want %v", i, a, L)
		}
		over += max(a-L, 0)
		level = LevelStep(level, a, L, N, s, 0)
	}
	if over != N {
		t.Errorf("admitted %v above the limit in all, want the burst %v", over, N)
	}
}

// FuzzLevel checks that no input makes a level or the limit it gives NaN,
// infinite or negative (for a finite limit ≥ 0), that a level stays in
// [−L·P, N], and that a bucket with burst 0 and no payback is the
// identity: level 0, limit L.
func FuzzLevel(f *testing.F) {
	f.Add(0.0, 150.0, 100.0, 200.0, int64(time.Second), int64(10*time.Second))
	f.Add(-1e308, 1e308, 1e308, 1e308, int64(time.Hour), int64(time.Hour))
	f.Add(math.NaN(), math.Inf(1), 1e-300, math.Inf(1), int64(1), int64(-1))
	f.Add(1e308, 0.0, 1e308, 1e308, int64(time.Hour), int64(time.Hour)) // the band above a burst
	f.Fuzz(func(t *testing.T, level, admitted, limit, burst float64, dt, payback int64) {
		l := LevelStep(level, admitted, limit, burst, time.Duration(dt), time.Duration(payback))
		if math.IsNaN(l) || math.IsInf(l, 0) {
			t.Fatalf("LevelStep(%v, %v, %v, %v, %v, %v) = %v", level, admitted, limit, burst, dt, payback, l)
		}
		top := LevelTop(limit, burst, time.Duration(payback))
		if l > 0 && !(l <= top) {
			t.Fatalf("level %v above the top %v (burst %v)", l, top, burst)
		}
		if band := LevelBand * limit * time.Duration(payback).Seconds(); top > 0 && !(top <= burst || top <= band) {
			t.Fatalf("top %v above both the burst %v and the band %v", top, burst, band)
		}
		if l < 0 && (payback <= 0 || -l > limit*time.Duration(payback).Seconds()) {
			t.Fatalf("level %v below a window of %v over %v", l, limit, payback)
		}
		if limit >= 0 && !math.IsInf(limit, 1) {
			got := LevelLimit(limit, l, time.Second, time.Duration(payback))
			if math.IsNaN(got) || math.IsInf(got, 0) || got < 0 {
				t.Fatalf("LevelLimit(%v, %v) = %v", limit, l, got)
			}
		}
		if id := LevelStep(0, admitted, limit, 0, time.Duration(dt), 0); id != 0 {
			t.Fatalf("burst 0, no payback: level %v", id)
		}
		if !math.IsNaN(limit) {
			if got := LevelLimit(limit, 0, time.Second, 0); got != limit {
				t.Fatalf("level 0: limit %v, want %v", got, limit)
			}
		}
	})
}
