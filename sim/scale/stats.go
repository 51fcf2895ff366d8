package scale

import (
	"math"
	"math/bits"
	"slices"
	"time"
)

// Samples keeps every measurement: for calls made a few times a second
// (ticks, flushes), where exact quantiles are cheap.
type Samples []time.Duration

// Quantile returns the q-quantile (nearest rank), 0 when empty.
func (s Samples) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	i := int(math.Ceil(q*float64(len(c)))) - 1
	return c[min(max(i, 0), len(c)-1)]
}

// Max returns the largest sample, 0 when empty.
func (s Samples) Max() time.Duration {
	if len(s) == 0 {
		return 0
	}
	return slices.Max(s)
}

// Mean returns the mean, 0 when empty.
func (s Samples) Mean() time.Duration {
	if len(s) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return sum / time.Duration(len(s))
}

// Hist summarises calls made millions of times (one per report) in constant
// memory: exact count, sum and max, and quantiles to within 1/16 (6.25 %) of
// the value from log-linear buckets: 16 per power of two.
type Hist struct {
	Count  int64
	Sum    time.Duration
	MaxDur time.Duration
	counts [64 * histSub]int64
}

const histSubBits = 4
const histSub = 1 << histSubBits

// Add records one duration.
func (h *Hist) Add(d time.Duration) {
	h.Count++
	h.Sum += d
	h.MaxDur = max(h.MaxDur, d)
	h.counts[histIndex(uint64(max(d, 0)))]++
}

// histIndex maps v to its bucket: values below histSub get one bucket each;
// above, the position of the top bit and the next histSubBits bits.
func histIndex(v uint64) int {
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - 1 - histSubBits // shift that leaves histSubBits+1 bits
	return (e+1)*histSub + int(v>>e) - histSub
}

// histUpper is the largest value of bucket i.
func histUpper(i int) uint64 {
	if i < histSub {
		return uint64(i)
	}
	e := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return (m+1)<<e - 1
}

// Mean returns the mean duration, 0 when empty.
func (h *Hist) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / time.Duration(h.Count)
}

// Quantile returns the upper bound of the bucket holding the q-quantile
// (never above the maximum seen), 0 when empty.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.Count)))
	rank = min(max(rank, 1), h.Count)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(histUpper(i)), h.MaxDur)
		}
	}
	return h.MaxDur
}
