package dropratio

import (
	"math"
	"testing"
	"time"
)

func TestDebtStep(t *testing.T) {
	const L = 100.0
	p, s := 10*time.Second, time.Second
	inf, nan := math.Inf(1), math.NaN()
	for _, tc := range []struct {
		name                  string
		debt, admitted, limit float64
		dt                    time.Duration
		want                  float64
	}{
		{"under the limit accrues none", 0, 80, L, s, 0},
		{"at the limit accrues none", 0, L, L, s, 0},
		{"overshoot accrues", 0, 150, L, s, 50},
		{"over dt", 20, 150, L, 2 * s, 120},
		{"paid back", 500, 50, L, s, 450},
		{"never negative", 100, 0, L, 2 * s, 0},
		{"capped at a window of the limit", 900, 1000, L, s, L * 10},
		{"a small debt shrinking is forgiven", 9, 99, L, s, 0},
		{"a small debt growing is kept", 1, 101, L, s, 2},
		{"no limit holds none", 500, 1e9, inf, s, 0},
		{"a limit of 0 holds none", 500, 10, 0, s, 0},
		{"NaN admitted owes nothing", 300, nan, L, s, 200},
		{"infinite admitted owes nothing", 300, inf, L, s, 200},
		{"negative admitted owes nothing", 300, -1e9, L, s, 200},
		{"NaN debt is none", nan, 150, L, s, 50},
		{"NaN limit holds none", 300, 150, nan, s, 0},
		{"negative limit holds none", 300, 150, -1, s, 0},
		{"dt 0 keeps it", 300, 1e6, L, 0, 300},
		{"negative dt keeps it", 300, 1e6, L, -s, 300},
		{"dt 0 clamps it", 5000, 1e6, L, 0, L * 10},
	} {
		if got := DebtStep(tc.debt, tc.admitted, tc.limit, tc.dt, p); got != tc.want {
			t.Errorf("%s: DebtStep(%v, %v, %v, %v) = %v, want %v", tc.name, tc.debt, tc.admitted, tc.limit, tc.dt, got, tc.want)
		}
	}
	if got := DebtStep(100, 150, L, s, 0); got != 0 {
		t.Errorf("payback 0 holds %v", got)
	}
}

func TestDebtLimit(t *testing.T) {
	p := 10 * time.Second
	for _, tc := range []struct{ limit, debt, want float64 }{
		{100, 0, 100},
		{100, 200, 40},
		{100, 300, 10},
		{100, 1000, 0}, // a whole window: blocked for two thirds of a payback
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
// s, then admits what the lowered limit allows: its admitted cost over
// the whole run meets the limit within what is forgiven, its debt never
// exceeds a window, and its limit is back to L once it is paid.
func TestDebtPaidBack(t *testing.T) {
	const L = 100.0
	p, s := 10*time.Second, time.Second
	debt, admittedSum, steps := 0.0, 0.0, 0
	for i := range 4 {
		debt = DebtStep(debt, 1.5*L, L, s, p)
		admittedSum += 1.5 * L
		steps++
		if want := float64(i+1) * 50; debt != want {
			t.Fatalf("overshoot step %d: debt %v, want %v", i, debt, want)
		}
	}
	if lim := DebtLimit(L, debt, p); lim != L-60 {
		t.Fatalf("limit while owing 200: %v, want 40", lim)
	}
	for debt > 0 && steps < 1000 {
		a := DebtLimit(L, debt, p) // the law holds it to the lowered limit
		if a >= L {
			t.Fatalf("step %d: owing %v, allowed %v, not below %v", steps, debt, a, L)
		}
		debt = DebtStep(debt, a, L, s, p)
		admittedSum += a
		steps++
		if steps == 4+int(p/s) && debt > 0.05*200 {
			t.Errorf("one payback window after the overshoot, %v of its 200 still owed: want under 5 %%", debt)
		}
	}
	if debt != 0 || DebtLimit(L, debt, p) != L {
		t.Fatalf("after %d steps: debt %v, limit %v", steps, debt, DebtLimit(L, debt, p))
	}
	// Paid back but for the forgiven rest, under 1 % of a window.
	if over := admittedSum - L*float64(steps); over < 0 || over > DebtForgive*L*p.Seconds() {
		t.Errorf("over %d s the bucket admitted %v above its limit's %v", steps, over, L*float64(steps))
	}
}
