package sim

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// zipf draws ranks 0..n-1 (rank 0 is the heaviest) with probability
// proportional to (rank+1)^-s, in O(1) per draw whatever n: Vose's alias
// table, built once in O(n). A draw takes one 64-bit random number: its
// product with n gives the column (the high word) and a uniform fraction
// within it (the low word), which picks the column's own rank or its alias.
// Memory is 12 bytes per rank.
type zipf struct {
	p     []float64 // p[i]: rank i's probability
	cut   []uint64  // a column keeps its own rank when the fraction < cut
	alias []uint32
}

// newZipf builds the table for n ranks and exponent s >= 0.
func newZipf(n int, s float64) *zipf {
	z := &zipf{p: make([]float64, n), cut: make([]uint64, n), alias: make([]uint32, n)}
	sum := 0.0
	for i := range n {
		z.p[i] = math.Pow(float64(i+1), -s)
		sum += z.p[i]
	}
	scaled := make([]float64, n) // p·n: 1 is a full column
	var small, large []uint32
	for i := range n {
		z.p[i] /= sum
		scaled[i] = z.p[i] * float64(n)
		if scaled[i] < 1 {
			small = append(small, uint32(i))
		} else {
			large = append(large, uint32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		l := small[len(small)-1]
		small = small[:len(small)-1]
		g := large[len(large)-1]
		z.cut[l], z.alias[l] = fraction(scaled[l]), g
		scaled[g] -= 1 - scaled[l]
		if scaled[g] < 1 {
			large = large[:len(large)-1]
			small = append(small, g)
		}
	}
	// What is left is full up to rounding: it keeps its own rank.
	for _, i := range append(small, large...) {
		z.cut[i], z.alias[i] = math.MaxUint64, i
	}
	return z
}

// fraction maps f in [0, 1) to the uint64 threshold a uniform 64-bit
// fraction is below with probability f.
func fraction(f float64) uint64 {
	if !(f > 0) {
		return 0
	}
	if f >= 1 {
		return math.MaxUint64
	}
	return uint64(f * (1 << 64))
}

// Len returns the number of ranks.
func (z *zipf) Len() int { return len(z.p) }

// Prob returns rank i's probability.
func (z *zipf) Prob(i int) float64 { return z.p[i] }

// Draw returns a rank.
func (z *zipf) Draw(r *rand.Rand) int {
	col, frac := bits.Mul64(r.Uint64(), uint64(len(z.cut)))
	if frac < z.cut[col] {
		return int(col)
	}
	return int(z.alias[col])
}
