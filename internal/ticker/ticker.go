// Package ticker runs a tier's periodic work — the aggregator's flush, the
// controller's tick — on its period, and also soon after it is poked, but
// never twice within a minimum gap. A poke is how a surge skips the rest of
// an interval: see dropratio.Jumped.
package ticker

import (
	"context"
	"time"
)

// MinGap is the least time between the runs pokes cause, for a tier with
// the given period: a twentieth of it, at least 10ms. A fleet that reports
// one surge then costs a tier a few extra runs, not one per report.
func MinGap(period time.Duration) time.Duration {
	return max(period/20, 10*time.Millisecond)
}

// Ticker is safe for concurrent Pokes; Run runs once at a time.
type Ticker struct {
	period, minGap time.Duration
	aligned        bool
	poke           chan struct{}
}

// Aligned makes the periodic runs fall on multiples of the period since the
// Unix epoch, so that processes with the same period run at the same
// instants: controller replicas then tick on the same zone loads. Call it
// before Run.
func (t *Ticker) Aligned() *Ticker {
	t.aligned = true
	return t
}

// New returns a Ticker with the given period and minimum gap between runs
// caused by pokes.
func New(period, minGap time.Duration) *Ticker {
	return &Ticker{period: period, minGap: minGap, poke: make(chan struct{}, 1)}
}

// Poke asks for a run soon. It never blocks; pokes before the run coalesce.
func (t *Ticker) Poke() {
	select {
	case t.poke <- struct{}{}:
	default:
	}
}

// Run calls f every period and after pokes until ctx ends. f runs on Run's
// goroutine, with the time it was called for.
func (t *Ticker) Run(ctx context.Context, f func(now time.Time)) {
	var first time.Time // an aligned ticker's first run, at the boundary
	if t.aligned {
		now := time.Now()
		wait := time.NewTimer(now.Truncate(t.period).Add(t.period).Sub(now))
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case first = <-wait.C:
		}
	}
	tick := time.NewTicker(t.period)
	defer tick.Stop()
	// gap fires once a poked run that had to wait out the minimum gap may
	// go; nil while none waits.
	var gap *time.Timer
	var gapC <-chan time.Time
	defer func() {
		if gap != nil {
			gap.Stop()
		}
	}()
	var last time.Time
	run := func(now time.Time) {
		last = now
		f(now)
	}
	if !first.IsZero() {
		run(first)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			run(now)
		case <-t.poke:
			if gapC != nil {
				continue // a run is already scheduled
			}
			now := time.Now()
			if wait := t.minGap - now.Sub(last); wait > 0 {
				if gap == nil {
					gap = time.NewTimer(wait)
				} else {
					gap.Reset(wait)
				}
				gapC = gap.C
				continue
			}
			run(now)
		case now := <-gapC:
			gapC = nil
			run(now)
		}
	}
}
