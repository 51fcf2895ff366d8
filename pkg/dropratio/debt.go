package dropratio

import (
	"math"
	"time"
)

// Debt (issue #16): a callee whose limits count cost learns what an
// admitted request really cost only when its response reports it, after
// the law has already admitted it at a guessed price. The bucket's
// admitted cost can then run above its limit L. Rather than let it keep
// the overshoot, the controller carries it as the bucket's debt and
// lowers the limit it gives the law until the debt is paid back, so that
// over a payback window the bucket's admitted cost meets L.
//
// Each step of dt seconds, with A the bucket's admitted cost rate over the
// step and P the payback window, the debt grows by (A − L)·dt, capped at
// L·P (it is the negative side of the bucket's level: see LevelStep), and
// the law is given
//
//	limit = max(0, L − 4·debt/P)                (DebtLimit)
//
// The debt is measured against L itself, not against the lowered limit:
// while it is paid back the bucket admits about L − 4·debt/P, so the debt
// shrinks by 4·debt/P per second, e-folding four times in P: 98 % of an
// overshoot is paid back within one payback window, so that the window
// that saw it meets the limit within a few per cent. (With debt/P, one
// e-fold, a third of it would still be owed when the window ends; four,
// not three, because the controller gives the law the debt as it will
// stand a tick on, which slows each step by one.) It is capped at L·P, a
// whole window of the limit: a lie or a bug in a report blocks a bucket
// for three quarters of P and pays the rest back by P, no more. A bucket without a limit (L = +Inf) has no debt. The debt is
// measured against the bucket's own limit only: a capacity's share is the
// law's to keep from offered load.

// LevelBand is the fraction of a payback window (L·P) a bucket that pays
// back its overshoot is also credited for its undershoot: its level may
// rise that far above 0 even with no burst. A debt that is charged for
// every second above the limit but never credited for one below it
// would be a rectifier: the law's noise (a cost known a report late, a
// report a tick late, whole requests of uneven cost) would be paid back
// on one side only, and a bucket held at its limit would admit a few per
// cent under it, more after each overshoot, whose payback runs a report
// past the point where the debt is gone. Within the band the level moves
// both ways, so over a window the bucket's admitted cost meets its limit;
// the credit lets at most 1 % of a window through above the limit, once,
// which is below what the law's noise can tell.
const LevelBand = 0.01

// DebtLimit returns the limit the law holds a bucket to while it owes
// debt: max(0, limit − debtFolds·debt/payback). A bucket without debt, or
// without a limit, keeps its limit; a NaN debt counts as none.
func DebtLimit(limit, debt float64, payback time.Duration) float64 {
	if !(debt > 0) || payback <= 0 || math.IsInf(limit, 1) || math.IsNaN(limit) {
		return limit
	}
	return max(0, limit-debtFolds*debt/payback.Seconds())
}

// debtFolds is how many times a debt e-folds in one payback window.
const debtFolds = 4

// Burst (issue #17). Debt is one side of a bucket's level b, in
// requests or cost units: a bucket whose limit L allows a burst of N
// (the limits file's burst:) holds up to N tokens, and one whose limit
// pays back an overshoot (payback: P, or a cost callee's --cost-payback)
// may owe down to a whole window of its limit. One level in [−L·P, T]:
// negative is debt, positive is tokens, T is LevelTop: N, or for a bucket
// that pays back at least LevelBand of its window. Each step of dt with A the
// bucket's admitted rate over the step:
//
//	b     = clamp(b + (L − A)·dt, −L·P, T)    (LevelStep)
//	limit = L + b/spend       while b > 0      (LevelLimit)
//	        max(0, L − 4·(−b)/P) while b < 0   (DebtLimit)
//
// A bucket admitting under its limit fills at L − A up to T; one
// admitting above it spends its tokens first, then, with a payback, runs
// into debt. The law is allowed L plus the tokens held spread over spend
// (the controller's: one tick), so that a burst after a quiet period is
// admitted in full, and the bucket is held to L again once its tokens
// are spent. Without a payback (P = 0) the level never goes below 0: what
// the law lets through above L while it reacts is not paid back.
//
// A burst of 0 and no payback is the tightest edge: the level stays 0 and
// the limit is L. It is the default: a
// limit that says nothing about bursts must not let an unannounced burst
// through to a fragile callee.

// LevelStep returns a bucket's level (see Burst above) after a step of dt
// in which it admitted admitted units per second against its limit of
// limit units per second; burst is the most tokens it may hold, payback
// the window over which it pays back an overshoot (0: none). Hostile or
// broken inputs never make a level NaN or infinite: a NaN level counts as
// 0, a NaN, negative or infinite admitted rate as 0 (a broken count owes
// nothing and spends nothing), a NaN, negative or infinite burst as none;
// a NaN, negative or 0 limit holds no level (its bucket is blocked
// already), nor does an infinite one (no limit); a dt ≤ 0 leaves the
// level as it was, clamped to [−L·P, LevelTop]. A debt under a millionth
// of a window is rounded to 0.
func LevelStep(level, admitted, limit, burst float64, dt, payback time.Duration) float64 {
	if !(limit > 0) || math.IsInf(limit, 1) {
		return 0
	}
	top := LevelTop(limit, burst, payback)
	floor := 0.0 // −window: the most a bucket may owe
	if payback > 0 {
		floor = max(-limit*payback.Seconds(), -math.MaxFloat64)
	}
	if math.IsNaN(level) {
		level = 0
	}
	if !(admitted >= 0) || math.IsInf(admitted, 1) {
		admitted = 0
	}
	if dt > 0 {
		level += (limit - admitted) * dt.Seconds()
	}
	level = min(max(level, floor), top)
	if level < 0 && -level < debtRounding*-floor {
		level = 0
	}
	return level
}

// debtRounding is the fraction of a window under which a debt is
// rounding, not owed: a debt paid back at the rate DebtLimit sets shrinks
// geometrically and would otherwise never reach 0, keeping its bucket's
// level (and a debt in its policy) for ever.
const debtRounding = 1e-6

// LevelTop is the most a bucket's level may hold, a quiet bucket's level:
// its burst, or for a bucket that pays back (payback > 0) at least
// LevelBand of its window. A NaN, negative or infinite burst is none; a
// bucket without a finite limit above 0 holds nothing.
func LevelTop(limit, burst float64, payback time.Duration) float64 {
	if !(limit > 0) || math.IsInf(limit, 1) {
		return 0
	}
	if !(burst > 0) || math.IsInf(burst, 1) {
		burst = 0
	}
	if payback > 0 {
		burst = max(burst, min(LevelBand*limit*payback.Seconds(), math.MaxFloat64))
	}
	return burst
}

// LevelLimit returns the limit the law holds a bucket to at level: its
// limit raised by its tokens spread over spend (level > 0), lowered by
// its debt over payback (level < 0, DebtLimit), else its limit. A bucket
// without a limit keeps it; a NaN level counts as 0, a spend ≤ 0 spends
// no tokens. For a finite limit ≥ 0 the result is finite and ≥ 0.
func LevelLimit(limit, level float64, spend, payback time.Duration) float64 {
	if level > 0 && spend > 0 && !math.IsInf(limit, 1) && !math.IsNaN(limit) {
		return min(limit+level/spend.Seconds(), math.MaxFloat64)
	}
	return DebtLimit(limit, -level, payback)
}
