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
// step and P the payback window:
//
//	debt  = clamp(debt + (A − L)·dt, 0, L·P)   (DebtStep)
//	limit = max(0, L − 3·debt/P)                (DebtLimit)
//
// The debt is measured against L itself, not against the lowered limit:
// while it is paid back the bucket admits about L − 3·debt/P, so the debt
// shrinks by 3·debt/P per second, e-folding three times in P: 95 % of an
// overshoot is paid back within one payback window, so that the window
// that saw it meets the limit within a few per cent. (With debt/P, one
// e-fold, a third of it would still be owed when the window ends.) It is
// capped at L·P, a whole window of the limit: a lie or a bug in a report
// blocks a bucket for two thirds of P and pays the rest back by P, no
// more. A
// bucket at or under its limit accrues none, and one without a limit
// (L = +Inf) has no debt. The debt is measured against the bucket's own
// limit only: a capacity's share is the law's to keep from offered load.

// DebtForgive is the fraction of a window of the limit (L·P) under which
// a shrinking debt is forgiven, set to 0: it lowers the limit by under 1 %,
// below what the law's noise can tell, and a bucket's state is forgotten
// only once its debt is 0.
const DebtForgive = 0.01

// DebtStep returns a bucket's debt, in cost units, after a step of dt in
// which it admitted admitted units per second against its limit of limit
// units per second; payback is the payback window. Hostile or broken
// inputs never make a debt NaN, infinite or negative: a NaN, negative or
// infinite admitted rate counts as 0 (a broken count owes nothing), a NaN
// or negative debt as 0, a NaN or negative limit as 0 (which can hold no
// debt: its bucket is blocked already), an infinite limit or a
// non-positive payback hold none; a dt ≤ 0 leaves the debt as it was,
// clamped.
func DebtStep(debt, admitted, limit float64, dt, payback time.Duration) float64 {
	if !(limit > 0) || math.IsInf(limit, 1) || payback <= 0 {
		return 0
	}
	if !(debt > 0) {
		debt = 0
	}
	if !(admitted >= 0) || math.IsInf(admitted, 1) {
		admitted = 0
	}
	window := limit * payback.Seconds()
	if dt > 0 {
		debt += (admitted - limit) * dt.Seconds()
	}
	debt = min(max(debt, 0), window)
	if admitted <= limit && debt < DebtForgive*window {
		debt = 0
	}
	return debt
}

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
const debtFolds = 3
