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

// Schedule is the rule for the runs pokes cause, without the timers: a poke
// asks for a run at once, unless the last run was less than the gap ago, then
// as soon as the gap allows; pokes before that run coalesce into it. It takes
// time as an argument: Ticker.Run keeps one with real timers, and the
// simulator keeps one per tier on its virtual clock, so both follow the same
// rule. The zero Schedule has no gap. Not safe for concurrent use.
type Schedule struct {
	gap     time.Duration
	last    time.Time // the last run; zero before the first
	next    time.Time // when the poked run is due, while pending
	pending bool      // a poked run is wanted
}

// NewSchedule returns a Schedule whose poked runs come at least minGap after
// the run before them.
func NewSchedule(minGap time.Duration) Schedule { return Schedule{gap: minGap} }

// Poke records a poke at now. It reports whether the poke asks for a new run,
// due at Next: now, or the end of the gap since the last run. False means a
// poked run is already wanted, and the poke coalesces into it.
func (s *Schedule) Poke(now time.Time) bool {
	if s.pending {
		return false
	}
	s.pending, s.next = true, now
	if !s.last.IsZero() {
		if end := s.last.Add(s.gap); end.After(now) {
			s.next = end
		}
	}
	return true
}

// Next returns when the poked run is due, and false when none is wanted.
func (s *Schedule) Next() (time.Time, bool) { return s.next, s.pending }

// Fire reports whether the poked run is due at now. If it is, it is taken as
// run at now (see Ran), and the next poke asks for a new one.
func (s *Schedule) Fire(now time.Time) bool {
	if !s.pending || now.Before(s.next) {
		return false
	}
	s.pending = false
	s.last = now
	return true
}

// Ran records a periodic run at now: the gap of later pokes counts from it.
// A poked run already wanted still comes at its time, though the periodic
// run may have taken in what the poke was about: one run more, within the
// gap of the poke, and the tiers' timing stays as it was measured.
func (s *Schedule) Ran(now time.Time) { s.last = now }

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
	sched := NewSchedule(t.minGap)
	// gap fires once a poked run that had to wait out the minimum gap is
	// due; gapC is nil while none waits.
	var gap *time.Timer
	var gapC <-chan time.Time
	defer func() {
		if gap != nil {
			gap.Stop()
		}
	}()
	if !first.IsZero() {
		sched.Ran(first)
		f(first)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			sched.Ran(now)
			f(now)
		case <-t.poke:
			now := time.Now()
			if !sched.Poke(now) {
				continue // a run is already scheduled
			}
			if sched.Fire(now) {
				f(now)
				continue
			}
			next, _ := sched.Next()
			if gap == nil {
				gap = time.NewTimer(next.Sub(now))
			} else {
				gap.Reset(next.Sub(now))
			}
			gapC = gap.C
		case now := <-gapC:
			gapC = nil
			if sched.Fire(now) {
				f(now)
			}
		}
	}
}
