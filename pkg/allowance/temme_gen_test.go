package allowance

import (
	"flag"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"
)

var printCoeffs = flag.Bool("print-temme", false, "print the Temme coefficient table derived by TestTemmeCoefficients")

// genPrec is the working precision of the derivation, far above float64's,
// so that the derived table is exact to the last printed digit.
const genPrec = 320

type series []*big.Float

func newSeries(n int) series {
	s := make(series, n)
	for i := range s {
		s[i] = new(big.Float).SetPrec(genPrec)
	}
	return s
}

func ratio(p, q int64) *big.Float {
	a := new(big.Float).SetPrec(genPrec).SetInt64(p)
	return a.Quo(a, new(big.Float).SetPrec(genPrec).SetInt64(q))
}

// mul returns a·b truncated to len(a) terms.
func (a series) mul(b series) series {
	out := newSeries(len(a))
	t := new(big.Float).SetPrec(genPrec)
	for i := range a {
		for j := 0; i+j < len(a) && j < len(b); j++ {
			out[i+j].Add(out[i+j], t.Mul(a[i], b[j]))
		}
	}
	return out
}

// inv returns 1/a for a[0] = 1.
func (a series) inv() series {
	out := newSeries(len(a))
	out[0].SetInt64(1)
	t := new(big.Float).SetPrec(genPrec)
	for n := 1; n < len(a); n++ {
		for i := 1; i <= n; i++ {
			out[n].Sub(out[n], t.Mul(a[i], out[n-i]))
		}
	}
	return out
}

// sqrt returns √a for a[0] = 1.
func (a series) sqrt() series {
	out := newSeries(len(a))
	out[0].SetInt64(1)
	t := new(big.Float).SetPrec(genPrec)
	for n := 1; n < len(a); n++ {
		out[n].Set(a[n])
		for i := 1; i < n; i++ {
			out[n].Sub(out[n], t.Mul(out[i], out[n-i]))
		}
		out[n].Quo(out[n], ratio(2, 1))
	}
	return out
}

// compose returns a(b(η)) for b[0] = 0.
func (a series) compose(b series) series {
	out := newSeries(len(a))
	out[0].Set(a[len(a)-1])
	for i := len(a) - 2; i >= 0; i-- {
		out = out.mul(b)
		out[0].Add(out[0], a[i])
	}
	return out
}

// temmeSeries derives, independently of the table in temme.go, the Taylor
// coefficients in η of Temme's c_k(η), k < nk, each to n terms (DLMF 8.12):
// η²/2 = μ − ln(1+μ) is reverted to μ(η); c_0 = 1/μ − 1/η; and
// c_k = c'_{k−1}/η + (−1)^k g_k/μ with g_k Stirling's coefficients of Γ*.
func temmeSeries(nk, n int) [][]*big.Float {
	m := n + 2*nk + 2
	// h(μ)² = 2(μ − ln(1+μ))/μ² = Σ 2(−1)^j μ^j/(j+2); η = μ·h(μ).
	h2 := newSeries(m)
	for j := range h2 {
		sign := int64(1 - 2*(j%2))
		h2[j].Set(ratio(2*sign, int64(j+2)))
	}
	r := h2.sqrt().inv() // μ = η·r(μ)
	mu := newSeries(m)
	mu[1].SetInt64(1)
	for range m {
		next := newSeries(m)
		rc := r.compose(mu)
		for j := 1; j < m; j++ {
			next[j].Set(rc[j-1])
		}
		mu = next
	}
	u := newSeries(m) // μ/η
	for j := 0; j+1 < m; j++ {
		u[j].Set(mu[j+1])
	}
	w := u.inv() // η/μ: 1/μ = w/η
	g := []*big.Float{ratio(1, 1), ratio(1, 12), ratio(1, 288), ratio(-139, 51840),
		ratio(-571, 2488320), ratio(163879, 209018880)}
	c := newSeries(m - 1) // c_0,j = w_{j+1}
	for j := range c {
		c[j].Set(w[j+1])
	}
	out := [][]*big.Float{c[:n]}
	for k := 1; k < nk; k++ {
		next := newSeries(len(c) - 2)
		t := new(big.Float).SetPrec(genPrec)
		for j := range next {
			next[j].Mul(c[j+2], ratio(int64(j+2), 1))
			t.Mul(g[k], w[j+1])
			if k%2 == 1 {
				t.Neg(t)
			}
			next[j].Add(next[j], t)
		}
		c = next
		out = append(out, c[:n])
	}
	return out
}

func TestTemmeCoefficients(t *testing.T) {
	got := temmeSeries(len(temme), len(temme[0]))
	// The known leading values (DLMF 8.12.8-8.12.10; Temme 1979).
	for k, want := range []*big.Float{ratio(-1, 3), ratio(-1, 540), ratio(25, 6048)} {
		if d := new(big.Float).Sub(got[k][0], want); math.Abs(must(d.Float64())) > 1e-60 {
			t.Errorf("derived c_%d(0) = %v, want %v", k, got[k][0], want)
		}
	}
	for _, w := range []struct {
		k, j int
		p, q int64
	}{{0, 1, 1, 12}, {0, 2, -2, 135}, {0, 3, 1, 864}, {0, 4, 1, 2835}, {1, 1, -1, 288}, {1, 2, 1, 378}} {
		if d := new(big.Float).Sub(got[w.k][w.j], ratio(w.p, w.q)); math.Abs(must(d.Float64())) > 1e-60 {
			t.Errorf("derived c_%d's η^%d coefficient = %v, want %d/%d", w.k, w.j, got[w.k][w.j], w.p, w.q)
		}
	}
	if *printCoeffs {
		var b strings.Builder
		for _, row := range got {
			b.WriteString("\t{")
			for j, v := range row {
				f, _ := v.Float64()
				if j > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "%.17g", f)
			}
			b.WriteString("},\n")
		}
		t.Logf("\n%s", b.String())
	}
	for k, row := range temme {
		for j, v := range row {
			want, _ := got[k][j].Float64()
			if v != want {
				t.Errorf("temme[%d][%d] = %.17g, derived %.17g", k, j, v, want)
			}
		}
	}
}

func must(f float64, _ big.Accuracy) float64 { return f }
