// Package health measures what a callee does with the requests its
// sidecars let through (issue #18): how long it took to answer them, on a
// fixed latency scale every tier shares, and how they ended. A sidecar
// keeps one [Recorder] per callee and procedure; its reports carry the
// [Counts] of a window; aggregators and the controller add them up as
// rates, and the controller reads a fleet-wide p99 and error ratio off the
// sums ([Quantile], [Counts.Errors]) to estimate the callee's capacity
// (pkg/adaptive).
//
// The scale is fixed, not configured, so that counts from any sidecar add
// up without a negotiation: [Buckets] buckets, the first up to 250µs, each
// next one 2^⅓ (26 %) longer, the last open above 52s. A quantile read off
// it, interpolated inside its bucket, is within the bucket (26 %) of the
// truth, and within a few per cent where latencies spread smoothly across
// the bucket: finer than the noise of one second's p99 at a few hundred
// requests.
package health

import (
	"math"
	"sync/atomic"
	"time"
)

// Buckets is the number of latency buckets: len(Bounds()) bounded ones and
// one open above the last bound.
const Buckets = 55

const (
	firstBound = 250 * time.Microsecond
	perDouble  = 3 // buckets per doubling of latency
)

// bounds[i] is the upper bound of bucket i, inclusive.
var bounds = func() (b [Buckets - 1]time.Duration) {
	for i := range b {
		b[i] = time.Duration(math.Round(float64(firstBound) * math.Exp2(float64(i)/perDouble)))
	}
	return b
}()

// Bounds returns the buckets' upper bounds, inclusive; a latency above the
// last is in the open bucket, Buckets-1.
func Bounds() []time.Duration { return bounds[:] }

// Bucket returns the bucket of latency d. A negative d (a clock stepped
// back) is in bucket 0.
func Bucket(d time.Duration) int {
	lo, hi := 0, len(bounds) // the answer is in [lo, hi]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if d <= bounds[m] {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// Outcome is how an answered request ended, for the callee's error ratio.
type Outcome uint8

const (
	// OK: any answer but a failure: 1xx to 4xx, and gRPC codes that say
	// the request was wrong, not the callee (NOT_FOUND, INVALID_ARGUMENT, …).
	OK Outcome = iota
	// Failed: the callee could not serve it: 5xx but 504, gRPC UNKNOWN,
	// RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
	Failed
	// TimedOut: 504, gRPC DEADLINE_EXCEEDED, or no answer in time.
	TimedOut
	// Abandoned: the caller went away first (499, CANCELLED): neither the
	// callee's success nor its failure, and not counted.
	Abandoned
)

// StatusClientClosedRequest is the status a proxy records for a request
// whose caller went away (nginx's 499).
const StatusClientClosedRequest = 499

// HTTPOutcome classifies an HTTP status as Envoy's admission control does
// by default: 5xx fail.
func HTTPOutcome(status int) Outcome {
	switch {
	case status == StatusClientClosedRequest:
		return Abandoned
	case status == 504:
		return TimedOut
	case status >= 500:
		return Failed
	}
	return OK
}

// GRPCOutcome classifies a gRPC status code (0 OK … 16 UNAUTHENTICATED);
// an unknown code fails, as UNKNOWN does.
func GRPCOutcome(code uint32) Outcome {
	switch code {
	case 1: // CANCELLED
		return Abandoned
	case 4: // DEADLINE_EXCEEDED
		return TimedOut
	case 2, 8, 10, 13, 14, 15: // UNKNOWN, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNAVAILABLE, DATA_LOSS
		return Failed
	case 0, 3, 5, 6, 7, 9, 11, 12, 16:
		return OK
	}
	return Failed
}

// Counts is what a callee did with a window's requests.
type Counts struct {
	// Latency counts the answered requests (OK, Failed, TimedOut) by
	// latency bucket.
	Latency          [Buckets]uint64
	OK, Failed, Late uint64 // answers by Outcome; Late is TimedOut
	// InFlight is the requests sent and not yet answered at the window's
	// end.
	InFlight uint32
}

// Answered is the requests the counts cover.
func (c *Counts) Answered() uint64 { return c.OK + c.Failed + c.Late }

// Add adds o's answers to c's: two windows of one callee, or two of its
// procedures. InFlight, a reading, not a count, is left as it is.
func (c *Counts) Add(o *Counts) {
	for b, n := range o.Latency {
		c.Latency[b] += n
	}
	c.OK += o.OK
	c.Failed += o.Failed
	c.Late += o.Late
}

// Recorder counts one callee's (or procedure's) answers as they come. Its
// methods may be called concurrently; Start, Done and Take never allocate
// nor block. The zero value is ready.
type Recorder struct {
	latency          [Buckets]atomic.Uint64
	ok, failed, late atomic.Uint64
	inFlight         atomic.Int64
}

// Start counts a request sent to the callee; Done must follow.
func (r *Recorder) Start() { r.inFlight.Add(1) }

// Done counts the end of a request Start counted: it took d and ended so.
func (r *Recorder) Done(d time.Duration, o Outcome) {
	r.inFlight.Add(-1)
	switch o {
	case OK:
		r.ok.Add(1)
	case Failed:
		r.failed.Add(1)
	case TimedOut:
		r.late.Add(1)
	default:
		return
	}
	r.latency[Bucket(d)].Add(1)
}

// Take moves what r counted since the last Take into c, and reads the
// requests in flight. A request that ends during Take is counted in this
// window or the next, never both nor neither.
func (r *Recorder) Take(c *Counts) {
	for i := range r.latency {
		c.Latency[i] = r.latency[i].Swap(0)
	}
	c.OK, c.Failed, c.Late = r.ok.Swap(0), r.failed.Swap(0), r.late.Swap(0)
	c.InFlight = uint32(min(max(r.inFlight.Load(), 0), math.MaxUint32))
}

// Quantile returns the q-quantile (0 < q < 1) of the latencies whose
// bucket weights (counts, or rates) are w, len(w) == Buckets: log-linear
// inside its bucket, the last bound when it falls in the open bucket (the
// truth is at least that). ok is false when w weighs nothing, or holds a
// negative, NaN or infinite weight.
func Quantile(w []float64, q float64) (d time.Duration, ok bool) {
	if len(w) != Buckets || !(q > 0 && q < 1) {
		return 0, false
	}
	total := 0.0
	for _, x := range w {
		if !(x >= 0) || math.IsInf(x, 1) {
			return 0, false
		}
		total += x
	}
	if !(total > 0) || math.IsInf(total, 1) {
		return 0, false
	}
	rank, seen := q*total, 0.0
	for i, x := range w {
		if x == 0 || seen+x < rank {
			seen += x
			continue
		}
		if i == len(bounds) {
			return bounds[i-1], true
		}
		hi, frac := float64(bounds[i]), (rank-seen)/x
		if i == 0 {
			return time.Duration(hi * frac), true
		}
		lo := float64(bounds[i-1])
		return time.Duration(lo * math.Pow(hi/lo, frac)), true
	}
	return bounds[len(bounds)-1], true // rounding: rank just above the sum
}
