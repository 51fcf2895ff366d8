package reporter

import "time"

// stallChecks is how many surge-check periods without a step of the
// Reporter's loop (a tick, a check or a projection step) make a stall.
const stallChecks = 2

// stalls spots the stalls of the Reporter's loop (see skip).
type stalls struct {
	gap    time.Duration // the longest time between steps that is not a stall; 0: none is
	settle time.Duration // how long the steps after a stall are skipped
	every  time.Duration // the shortest time between the starts of two skip periods
	// last is when the last step came; from and until bound the last
	// skip period.
	last, from, until time.Time
}

// newStalls returns the stalls of a loop that reports every interval and
// checks every check (0: no checks, and no stall is spotted), started at
// now.
func newStalls(interval, check time.Duration, now time.Time) stalls {
	return stalls{gap: stallChecks * check, settle: min(check, interval/4), every: interval, last: now}
}

// skip reports whether a step at now is skipped, and whether it ended a
// stall: the sidecar got no CPU for over stallChecks check periods (a
// busy host, a long GC pause under the race detector).
//
// The steps of the check period after a stall are skipped, moving no
// window of the Window on, so the first step after them runs over windows
// that span the stall. The requests that arrived during a stall of the
// whole process waited in the kernel's queues, and are served in a bunch
// in the moments after it: a window begun at a step just after the stall
// held the whole stall's requests in a few hundredths of a second, which
// looked like a surge of ten times the rate, and the projection dropped
// most of them from a caller that had offered three quarters of its limit
// all along (TestSidecarStallIsNotASurge: web kept 90–94 % of what it
// offered; so did TestHostileDecidedMark's on a busy host). A tick and a
// check are often both due when a stall ends: skipping only the first
// step let the second start the windows there.
//
// A skip period starts at most once a report interval: a sidecar that
// gets the CPU only every quarter of a second stalls at every step, and
// skipping each time would stop its reports and checks for good (the
// aggregator drops a sidecar silent for three intervals). The Reporter
// sends a skipped tick's report at the first step that runs.
//
// A client that stalls and then sends its backlog at once is not excused:
// the sidecar cannot tell that burst from a surge, and a limit says how
// much burst it allows.
func (s *stalls) skip(now time.Time) (skip, stalled bool) {
	gap := now.Sub(s.last)
	s.last = now
	stalled = s.gap > 0 && gap > s.gap
	if stalled && now.Sub(s.from) >= s.every {
		s.from, s.until = now, now.Add(s.settle)
	}
	return now.Before(s.until), stalled
}
