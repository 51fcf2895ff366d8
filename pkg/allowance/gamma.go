package allowance

import "math"

// The regularized incomplete gamma functions P(a, x) and Q(a, x) = 1 − P(a, x),
// for a ≥ 1 and x ≥ 0: the Poisson CDF is P(X ≤ k) = Q(k+1, λ). Each is
// returned with its own relative precision, so that tails near 0 (or near 1,
// through the other function) are compared without cancellation.

// maxIter bounds the series and continued fraction. Both are used only where
// they converge in O(√a) terms with a < temmeMinA, or far from the transition
// x ≈ a, where they converge in O(1/|μ|); the bound is never reached.
const maxIter = 100000

// gammaQP returns Q(a, x) and P(a, x).
func gammaQP(a, x float64) (q, p float64) {
	if x <= 0 {
		return 1, 0
	}
	mu := (x - a) / a
	af := a * log1pmx(mu)
	if a >= temmeMinA {
		eta := math.Sqrt(2 * af / a)
		if mu < 0 {
			eta = -eta
		}
		if math.Abs(eta) <= temmeMaxEta {
			return temmeQP(a, eta, af)
		}
	}
	// front = x^a·e^(−x)/Γ(a), the factor both expansions share.
	var front float64
	if a >= 20 {
		front = math.Sqrt(a/(2*math.Pi)) * math.Exp(-af-lnGammaStar(a))
	} else if a == math.Floor(a) && x < 700 {
		// e^(−x)·x^a/(a−1)!, each factor exact to an ulp: the
		// logarithmic form below loses digits to a·ln x − x.
		front = math.Exp(-x) * x
		for i := 1.0; i < a; i++ {
			front *= x / i
		}
	} else {
		lg, _ := math.Lgamma(a)
		front = math.Exp(a*math.Log(x) - x - lg)
	}
	if front == 0 {
		if x < a {
			return 1, 0
		}
		return 0, 1
	}
	if x < a+1 {
		p = front * lowerSeries(a, x)
		return 1 - p, p
	}
	q = front * upperFraction(a, x)
	return q, 1 - q
}

// lowerSeries returns P(a, x)·Γ(a)/(x^a·e^(−x)) = Σ x^n/(a(a+1)…(a+n)).
func lowerSeries(a, x float64) float64 {
	term := 1 / a
	sum := term
	for n := 1; n < maxIter; n++ {
		term *= x / (a + float64(n))
		sum += term
		if term < sum*1e-17 {
			break
		}
	}
	return sum
}

// upperFraction returns Q(a, x)·Γ(a)/(x^a·e^(−x)) by Legendre's continued
// fraction, evaluated with the modified Lentz method.
func upperFraction(a, x float64) float64 {
	const tiny = 1e-300
	b := x + 1 - a
	c := 1 / tiny
	d := 1 / b
	h := d
	for i := 1; i < maxIter; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-17 {
			break
		}
	}
	return h
}

// log1pmx returns μ − ln(1+μ) for μ ≥ −1 without the cancellation of the
// direct form near 0: with s = μ/(2+μ), ln(1+μ) = 2·atanh(s), so
// μ − ln(1+μ) = s·μ − 2(s³/3 + s⁵/5 + …).
func log1pmx(mu float64) float64 {
	if mu <= -1 {
		return math.Inf(1)
	}
	s := mu / (2 + mu)
	if math.Abs(s) > 1.0/3 {
		return mu - math.Log1p(mu)
	}
	s2 := s * s
	pow, sum := s*s2, 0.0
	for n := 3.0; ; n += 2 {
		t := pow / n
		sum += t
		if math.Abs(t) <= math.Abs(sum)*1e-17 {
			break
		}
		pow *= s2
	}
	return s*mu - 2*sum
}

// lnGammaStar returns ln Γ*(a) = ln Γ(a) − (a − ½)ln a + a − ln √(2π), by
// Stirling's series; for a ≥ 20 the terms kept reach float64 precision.
func lnGammaStar(a float64) float64 {
	r := 1 / a
	r2 := r * r
	return r * (1.0/12 + r2*(-1.0/360+r2*(1.0/1260+r2*(-1.0/1680+r2*(1.0/1188+r2*(-691.0/360360+r2/156))))))
}
