package sim

import (
	"math"
	"math/rand/v2"
)

// poissonChunk bounds the mean of one inversion: e^-500 is still a normal
// float64, and the search stays short.
const poissonChunk = 500

// poisson draws from a Poisson distribution with mean lambda by inversion:
// one uniform per draw (per chunk of 500 for larger means, whose draws add
// up). Inversion was chosen over faster rejection samplers because it always
// consumes the same number of random numbers: a last-bit difference in a
// float can change one draw, never shift the rest of the stream.
func poisson(r *rand.Rand, lambda float64) int {
	if !(lambda > 0) {
		return 0
	}
	n := 0
	for lambda > poissonChunk {
		n += poissonInv(r, poissonChunk)
		lambda -= poissonChunk
	}
	return n + poissonInv(r, lambda)
}

func poissonInv(r *rand.Rand, lambda float64) int {
	u := r.Float64()
	p := math.Exp(-lambda)
	cdf := p
	// The bound ends the search if rounding keeps the sum just under u.
	limit := int(lambda + 20*math.Sqrt(lambda) + 20)
	k := 0
	for u > cdf && k < limit {
		k++
		p = float64(p*lambda) / float64(k)
		cdf += p
	}
	return k
}
