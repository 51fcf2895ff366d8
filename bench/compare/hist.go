package compare

import (
	"math/bits"
	"time"
)

// Histogram records latencies in nanoseconds in log-linear buckets: exact
// below 256 ns, then 128 buckets per power of two, so a quantile read from
// it is within 0.8 % of the true sample. A run at 64-way concurrency makes
// tens of millions of in-process decisions; keeping every sample would cost
// more memory and cache than the decisions measured.
//
// A Histogram is not safe for concurrent use: each load goroutine owns one,
// and they are merged after the run.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    uint64 // ns, for the mean
	max    uint64
}

const (
	subBits     = 7 // 128 sub-buckets per power of two
	histBuckets = (64 - subBits) << subBits
)

// bucketOf maps v to its bucket: values below 2^(subBits+1) are their own
// bucket; above, the top subBits+1 bits of v pick it.
func bucketOf(v uint64) int {
	if v < 1<<(subBits+1) {
		return int(v)
	}
	shift := bits.Len64(v) - (subBits + 1)
	return shift<<subBits + int(v>>shift)
}

// bucketRange is the smallest and largest value that fall in bucket i.
func bucketRange(i int) (lo, hi uint64) {
	if i < 1<<(subBits+1) {
		return uint64(i), uint64(i)
	}
	shift := i>>subBits - 1
	sub := uint64(i - shift<<subBits)
	lo = sub << shift
	return lo, lo + 1<<shift - 1
}

// Record adds one sample; a negative duration counts as 0.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	i := bucketOf(v)
	if i >= histBuckets {
		i = histBuckets - 1
	}
	h.counts[i]++
	h.n++
	h.sum += v
	h.max = max(h.max, v)
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Mean is the mean sample, 0 when there are none.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// Max is the largest sample.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Quantile is the nearest-rank q-quantile (0 < q ≤ 1): the smallest sample
// at or above which a fraction q of the samples lie, given as the middle of
// its bucket (never above the largest sample). 0 when there are none.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := nearestRank(h.n, q)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketRange(i)
			return time.Duration(min(lo+(hi-lo)/2, h.max))
		}
	}
	return time.Duration(h.max)
}

// nearestRank is the 1-based rank of the q-quantile of n samples,
// ceil(q·n) clamped to [1, n]. It works in integers so that 0.999 of 1000
// samples is rank 999, not 1000 as float rounding would make it.
func nearestRank(n uint64, q float64) uint64 {
	const scale = 1_000_000
	qs := uint64(q*scale + 0.5)
	rank := (n*qs + scale - 1) / scale
	return min(max(rank, 1), n)
}
