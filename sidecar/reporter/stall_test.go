package reporter

import (
	"testing"
	"time"
)

// TestStallsSkipTheCheckAfterAStall: a step over two check periods after
// the last one ends a stall, and every step of the check period after it
// is skipped, ticks included; the steps after that run. A skip period
// starts at most once an interval, so a sidecar that is always late still
// runs most of its steps.
func TestStallsSkipTheCheckAfterAStall(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	st := newStalls(time.Second, 100*time.Millisecond, t0)
	steps := []struct {
		ms            int
		skip, stalled bool
	}{
		{25, false, false},
		{50, false, false},
		{150, false, false}, // 100ms late: not a stall
		{750, true, true},   // 600ms: a stall
		{750, true, false},  // the tick due at the same moment
		{775, true, false},
		{849, true, false},
		{850, false, false}, // a check period on: windows span the stall
		{875, false, false},
		{1300, false, true}, // 425ms: a stall within an interval of the last skip: counted, not skipped
		{1400, false, false},
		{1800, true, true}, // an interval on: skipped again
		{1850, true, false},
		{1900, false, false},
	}
	for _, s := range steps {
		skip, stalled := st.skip(at(s.ms))
		if skip != s.skip || stalled != s.stalled {
			t.Errorf("step at %dms: skip %v, stalled %v; want %v, %v", s.ms, skip, stalled, s.skip, s.stalled)
		}
	}

	// Always late: a step every 250ms, each one a stall. One skip
	// period a second, and most steps run.
	late := newStalls(time.Second, 100*time.Millisecond, t0)
	var ran, stalls int
	for ms := 250; ms <= 10_000; ms += 250 {
		skip, stalled := late.skip(at(ms))
		if !skip {
			ran++
		}
		if stalled {
			stalls++
		}
	}
	if stalls != 40 || ran < 30 {
		t.Errorf("a step every 250ms for 10s: %d stalls, %d of 40 steps ran; want 40 stalls and at least 30 run", stalls, ran)
	}

	off := newStalls(time.Second, 0, t0) // no surge checks: nothing is a stall
	if skip, stalled := off.skip(at(5000)); skip || stalled {
		t.Errorf("without checks: skip %v, stalled %v after 5s", skip, stalled)
	}
}
