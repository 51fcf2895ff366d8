package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/ticker"
)

// The aggregator's flushes and the controller's ticks follow internal/ticker's
// Schedule on the virtual clock: a poke runs at once unless the last run was
// less than the gap ago, then as soon as the gap allows; pokes before that
// run coalesce.
func TestPokeOnTheVirtualClock(t *testing.T) {
	e := &engine{sc: &Scenario{Duration: time.Minute}}
	tk := ticker.NewSchedule(ticker.MinGap(2 * time.Second)) // gap 100ms: a twentieth
	var runs []time.Duration
	run := func() { runs = append(runs, e.now) }
	ms := time.Millisecond
	for _, at := range []time.Duration{0, 50 * ms, 60 * ms, 90 * ms, 300 * ms, 350 * ms} {
		e.at(at, func() { e.poke(&tk, run) })
	}
	// A periodic run at 500ms moves the gap: the poke at 550 waits for 600.
	e.at(500*ms, func() { tk.Ran(Epoch.Add(e.now)); run() })
	e.at(550*ms, func() { e.poke(&tk, run) })
	e.run()
	// 0: runs at once; 50, 60, 90: one run at 100; 300: at once; 350: at
	// 400; 500 periodic; 550: at 600.
	if want := []time.Duration{0, 100 * ms, 300 * ms, 400 * ms, 500 * ms, 600 * ms}; !slices.Equal(runs, want) {
		t.Errorf("runs at %v, want %v", runs, want)
	}
}
