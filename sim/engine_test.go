package sim

import (
	"slices"
	"testing"
	"time"
)

// The aggregator's flushes and the controller's ticks follow internal/ticker:
// a poke runs at once unless the last run was less than the gap ago, then
// as soon as the gap allows; pokes before that run coalesce.
func TestPokeTicker(t *testing.T) {
	e := &engine{sc: &Scenario{Duration: time.Minute}}
	tk := newPokeTicker(2 * time.Second) // gap 100ms: a twentieth
	var runs []time.Duration
	run := func() { tk.last = e.now; runs = append(runs, e.now) }
	ms := time.Millisecond
	for _, at := range []time.Duration{0, 50 * ms, 60 * ms, 90 * ms, 300 * ms, 350 * ms} {
		e.at(at, func() { e.poke(&tk, run) })
	}
	e.run()
	// 0: runs at once; 50, 60, 90: one run at 100; 300: at once; 350: at 400.
	if want := []time.Duration{0, 100 * ms, 300 * ms, 400 * ms}; !slices.Equal(runs, want) {
		t.Errorf("runs at %v, want %v", runs, want)
	}
	if g := newPokeTicker(100 * time.Millisecond).gap; g != 10*time.Millisecond {
		t.Errorf("gap for a 100ms period: %v, want the 10ms floor", g)
	}
}
