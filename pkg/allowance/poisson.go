package allowance

import "math"

// MaxExactLambda is the largest mean for which PoissonQuantile is exact: up
// to it every k near the answer is a float64 integer. Above it (no limit,
// window and fleet come near) the answer is still a quantile of the
// computed CDF, over float64-representable counts.
const MaxExactLambda = 1 << 50

// PoissonQuantile returns the smallest k with P(X ≤ k) ≥ q for X ~
// Poisson(lambda): the count that a Poisson source of mean lambda stays at
// or under with probability q.
//
// It is exact, not an approximation: the CDF is evaluated to float64
// precision (a q within a few ulps, ~1e-15 relative, of CDF(k) may land on
// either side of it) (a series or continued fraction for the incomplete gamma
// function; Temme's uniform expansion for large counts) and the answer k
// satisfies CDF(k−1) < q ≤ CDF(k) as computed, with the tail nearer q
// compared so that neither side loses digits. A Cornish–Fisher guess starts
// the search, which takes a few CDF evaluations (O(log) in the worst case),
// each O(1) for lambda ≥ 1000 and O(√lambda) below; nothing is allocated.
//
// Inputs outside the domain are clamped, never a panic, and the clamps
// fail open (a larger count, so fewer drops): q ≤ 0 returns 0 (every k
// qualifies); q ≥ 1, a NaN q or lambda, or lambda = +Inf return
// math.MaxUint64 (no finite count qualifies); lambda ≤ 0 returns 0 (X is
// 0). Use CheckQuantile to reject a bad q as a configuration error.
func PoissonQuantile(lambda, q float64) uint64 {
	switch {
	case math.IsNaN(q) || math.IsNaN(lambda) || q >= 1 || math.IsInf(lambda, 1):
		return math.MaxUint64
	case q <= 0 || lambda <= 0:
		return 0
	}
	reached := func(k float64) bool { return cdfReaches(k, lambda, q) }
	k0 := quantileGuess(lambda, q)
	// Bracket: lo = −1 or a k with CDF(k) < q; hi a k with CDF(k) ≥ q.
	lo, hi := -1.0, k0
	if reached(k0) {
		for step := 1.0; ; step *= 2 {
			c := k0 - step
			if c < 0 {
				break
			}
			if !reached(c) {
				lo = c
				break
			}
			hi = c
		}
	} else {
		lo = k0
		for step := 1.0; ; step *= 2 {
			c := k0 + step
			if reached(c) {
				hi = c
				break
			}
			lo = c
		}
	}
	for hi-lo > 1 {
		mid := math.Floor(lo + (hi-lo)/2)
		if mid <= lo || mid >= hi {
			break // above 2⁵³, where neighbouring counts are not floats
		}
		if reached(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if hi >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(hi)
}

// cdfReaches reports whether P(X ≤ k) ≥ q for X ~ Poisson(lambda), k ≥ 0.
// Above the median it compares upper tails, P(X > k) ≤ 1 − q, where 1 − q
// is exact and the tail keeps its relative precision.
func cdfReaches(k, lambda, q float64) bool {
	if math.IsInf(k, 1) {
		return true
	}
	cdf, upper := gammaQP(k+1, lambda)
	if q >= 0.5 {
		return upper <= 1-q
	}
	return cdf >= q
}

// quantileGuess returns the Cornish–Fisher estimate of the quantile,
// rounded to a count ≥ 0: λ + z√λ + (z² − 1)/6 with z the normal quantile,
// less ½ for the continuity of a discrete variable.
func quantileGuess(lambda, q float64) float64 {
	z := math.Sqrt2 * math.Erfinv(2*q-1)
	if q < 1e-3 {
		z = -math.Sqrt2 * math.Erfcinv(2*q)
	}
	g := lambda + z*math.Sqrt(lambda) + (z*z-1)/6 - 0.5
	if !(g > 0) { // also NaN
		return 0
	}
	return math.Ceil(g)
}

// CDF returns P(X ≤ k) for X ~ Poisson(lambda), lambda ≥ 0, to float64
// precision: the function PoissonQuantile inverts.
func CDF(k uint64, lambda float64) float64 {
	if !(lambda > 0) {
		return 1
	}
	cdf, _ := gammaQP(float64(k)+1, lambda)
	return cdf
}
