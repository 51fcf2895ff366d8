package dropratio

import (
	"math"
	"testing"
	"time"
)

// TestLevelStepDebt: the debt side of a level, of a bucket with no burst
// that pays back over p: a window of 10 s of 100 a second, so a band of
// 10 credited.
func TestLevelStepDebt(t *testing.T) {
	const L, band = 100.0, 10.0
	p, s := 10*time.Second, time.Second
	inf, nan := math.Inf(1), math.NaN()
	for _, tc := range []struct {
		name                   string
		level, admitted, limit float64
		dt                     time.Duration
		want                   float64
	}{
		{"under the limit is credited up to the band", 0, 80, L, s, band},
		{"at the limit stays", 0, L, L, s, 0},
		{"overshoot accrues", 0, 150, L, s, -50},
		{"over dt", -20, 150, L, 2 * s, -120},
		{"paid back", -500, 50, L, s, -450},
		{"paid back past 0, credited up to the band", -100, 0, L, 2 * s, band},
		{"credit spent, then debt", band, 130, L, s, -20},
		{"capped at a window of the limit", -900, 1000, L, s, -L * 10},
		{"a small debt shrinking is carried", -9, 99, L, s, -8},
		{"a small debt growing is kept", -1, 101, L, s, -2},
		{"no limit holds none", -500, 1e9, inf, s, 0},
		{"a limit of 0 holds none", -500, 10, 0, s, 0},
		{"NaN admitted owes nothing", -300, nan, L, s, -200},
		{"infinite admitted owes nothing", -300, inf, L, s, -200},
		{"negative admitted owes nothing", -300, -1e9, L, s, -200},
		{"NaN level is none", nan, 150, L, s, -50},
		{"NaN limit holds none", -300, 150, nan, s, 0},
		{"negative limit holds none", -300, 150, -1, s, 0},
		{"dt 0 keeps it", -300, 1e6, L, 0, -300},
		{"negative dt keeps it", -300, 1e6, L, -s, -300},
		{"dt 0 clamps it", -5000, 1e6, L, 0, -L * 10},
	} {
		if got := LevelStep(tc.level, tc.admitted, tc.limit, 0, tc.dt, p); got != tc.want {
			t.Errorf("%s: LevelStep(%v, %v, %v, 0, %v, %v) = %v, want %v", tc.name, tc.level, tc.admitted, tc.limit, tc.dt, p, got, tc.want)
		}
	}
	if got := LevelStep(-100, 150, L, 0, s, 0); got != 0 {
		t.Errorf("payback 0 holds %v", got)
	}
}

func TestLevelTop(t *testing.T) {
	p := 10 * time.Second
	for _, tc := range []struct {
		limit, burst float64
		payback      time.Duration
		want         float64
	}{
		{100, 0, 0, 0},          // no burst, no payback: nothing
		{100, 50, 0, 50},        // its burst
		{100, 0, p, 10},         // the band of a window of 1,000
		{100, 5, p, 10},         // a burst under the band: the band
		{100, 50, p, 50},        // a burst over it: the burst
		{math.Inf(1), 50, p, 0}, // no limit holds nothing
		{0, 50, p, 0},
		{math.NaN(), 50, p, 0},
		{100, math.NaN(), 0, 0},
		{100, math.Inf(1), 0, 0},
		{math.MaxFloat64, 0, 1000 * time.Hour, math.MaxFloat64},
	} {
		if got := LevelTop(tc.limit, tc.burst, tc.payback); got != tc.want {
			t.Errorf("LevelTop(%v, %v, %v) = %v, want %v", tc.limit, tc.burst, tc.payback, got, tc.want)
		}
	}
}

func TestDebtLimit(t *testing.T) {
	p := 10 * time.Second
	for _, tc := range []struct{ limit, debt, want float64 }{
		{100, 0, 100},
		{100, 150, 40},
		{100, 225, 10},
		{100, 300, 0},
		{100, 1000, 0}, // a whole window: blocked for three quarters of a payback
		{100, 5000, 0}, // never below 0
		{math.Inf(1), 5000, math.Inf(1)},
		{100, math.NaN(), 100},
		{100, -5, 100},
	} {
		if got := DebtLimit(tc.limit, tc.debt, p); got != tc.want {
			t.Errorf("DebtLimit(%v, %v) = %v, want %v", tc.limit, tc.debt, got, tc.want)
		}
	}
}

// TestDebtPaidBack runs a bucket that admits 50 % above its limit for 4
// s, then admits what the lowered limit allows: 98 % of its debt is paid
// back within a payback window, none of it is ever forgiven (its admitted
// cost over the run is its limit's plus what it still owes, exactly), and
// its limit returns to L as the debt goes.
func TestDebtPaidBack(t *testing.T) {
	const L = 100.0
	p, s := 10*time.Second, time.Second
	level, admittedSum, steps := 0.0, 0.0, 0
	for i := range 4 {
		level = LevelStep(level, 1.5*L, L, 0, s, p)
		admittedSum += 1.5 * L
		steps++
		if want := -float64(i+1) * 50; level != want {
			t.Fatalf("overshoot step %d: level %v, want %v", i, level, want)
		}
	}
	if lim := LevelLimit(L, level, s, p); lim != L-80 {
		t.Fatalf("limit while owing 200: %v, want 20", lim)
	}
	for level < 0 && steps < 4+3*int(p/s) {
		a := LevelLimit(L, level, s, p) // the law holds it to the lowered limit
		if a >= L {
			t.Fatalf("step %d: at level %v, allowed %v, not below %v", steps, level, a, L)
		}
		level = LevelStep(level, a, L, 0, s, p)
		admittedSum += a
		steps++
		if steps == 4+int(p/s) && -level > 0.02*200 {
			t.Errorf("one payback window after the overshoot, %v of its 200 still owed: want under 2 %%", -level)
		}
	}
	// Nothing forgiven but rounding: a millionth of the window.
	if over := admittedSum - L*float64(steps); math.Abs(over+level) > 1e-6*L*p.Seconds() {
		t.Errorf("over %d s the bucket admitted %v above its limit's %v, owing %v: the difference was forgiven or lost", steps, over, L*float64(steps), -level)
	}
	if lim := LevelLimit(L, level, s, p); level != 0 || lim != L {
		t.Errorf("three windows on: level %v, limit %v; want the debt paid and the limit back", level, lim)
	}
}
