package compare

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Op is one decision or one request for key. It reports whether the
// request was admitted; an error is counted, never retried.
type Op func(ctx context.Context, key string) (admitted bool, err error)

// LatencyResult is one closed-loop run.
type LatencyResult struct {
	Design      string
	Keys        int
	Concurrency int
	Hist        Histogram
	Elapsed     time.Duration // of the measured phase
	Ops         uint64        // completed in the measured phase
	Dropped     uint64
	Errors      uint64
}

// Throughput is operations per second over the measured phase.
func (r *LatencyResult) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Keys returns n key names with prefix, "prefix-00000" onwards.
func Keys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return keys
}

// phases of a closed-loop run, read by every worker after every operation.
const (
	phaseWarm = iota
	phaseMeasure
	phaseStop
)

// ClosedLoop runs op from concurrency goroutines, each starting the next
// operation as soon as the last returns, for warm then measure. Only the
// measured phase is recorded. Each goroutine walks keys with a stride from
// its own offset, so with many keys every goroutine touches all of them and
// two goroutines rarely hit the same key at once; with one key they all
// contend on it, which is the worst case for a shared counter.
//
// One operation in every is timed on its own, with two reads of the
// monotonic clock (about 30 ns here, which ClockFloor measures) that are in
// its latency. Timing every operation suits a Redis round trip; an
// in-process decision costs less than the clock, so timing a sample of them
// keeps the clock out of the throughput, while the sample still gives the
// distribution.
func ClosedLoop(ctx context.Context, design string, concurrency int, keys []string, warm, measure time.Duration, every int, op Op) *LatencyResult {
	every = max(every, 1)
	var phase atomic.Int32
	hists := make([]*Histogram, concurrency)
	type tally struct{ ops, dropped, errors uint64 }
	tallies := make([]tally, concurrency)
	var wg sync.WaitGroup
	for g := range concurrency {
		hists[g] = new(Histogram)
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, t := hists[g], &tallies[g]
			// A prime stride walks every key, and not in the order a cache
			// line or a prefetcher would favour.
			stride := 7919 % len(keys)
			i := g * len(keys) / concurrency
			for n := 0; ; n++ {
				key := keys[i]
				if i += stride; i >= len(keys) {
					i -= len(keys)
				}
				timed := n%every == 0
				var start time.Time
				if timed {
					start = time.Now()
				}
				ok, err := op(ctx, key)
				var lat time.Duration
				if timed {
					lat = time.Since(start)
				}
				switch phase.Load() {
				case phaseWarm:
					continue
				case phaseStop:
					return
				}
				if timed {
					h.Record(lat)
				}
				t.ops++
				if err != nil {
					t.errors++
				} else if !ok {
					t.dropped++
				}
			}
		}()
	}
	sleep(ctx, warm)
	begin := time.Now()
	phase.Store(phaseMeasure)
	sleep(ctx, measure)
	phase.Store(phaseStop)
	elapsed := time.Since(begin)
	wg.Wait()

	r := &LatencyResult{Design: design, Keys: len(keys), Concurrency: concurrency, Elapsed: elapsed}
	for g := range concurrency {
		r.Hist.Merge(hists[g])
		r.Ops += tallies[g].ops
		r.Dropped += tallies[g].dropped
		r.Errors += tallies[g].errors
	}
	return r
}

// ClockFloor is what ClosedLoop's timing adds to a decision: the latency it
// records for an operation that does nothing.
func ClockFloor(ctx context.Context, measure time.Duration) *LatencyResult {
	return ClosedLoop(ctx, "clock floor (empty operation)", 1, []string{"k"}, measure/4, measure, 1,
		func(context.Context, string) (bool, error) { return true, nil })
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
