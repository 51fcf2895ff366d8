package live

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// A live run measures the loop only while the machine runs every process
// on time. The load generator's per-second counts show a machine that fell
// behind by a good part of a second (LoadStats.Late), but not one that
// stalls for tens of milliseconds many times a second: the load then goes
// out in bursts, and a sidecar's surge check, which looks at 100 ms windows,
// sees jumps that are the scheduler's. The probe measures that directly: a
// goroutine that asks to wake every probeTick and notes how late it woke.
// It shares the machine with the processes, so its stalls are theirs too.
const (
	probeTick = 5 * time.Millisecond // as internal/loadgen's pacing tick
	// maxStallRate is how many stalls per second of load a run may see
	// and still count as on schedule (Healthy).
	maxStallRate = 0.5
)

// stallThreshold is the lateness counted as a stall in a scenario run with
// the given surge check (or, with surge checks off, report interval): a
// fifth of a check, enough to move one check's count by 20 %, which is
// where a climbing surge's follow-up reports start to see the scheduler
// rather than the traffic. 20 ms at the default 100 ms checks.
func stallThreshold(loop sim.Loop) time.Duration {
	check := loop.SurgeCheck
	if check <= 0 {
		check = loop.ReportInterval / 10
	}
	return max(check/5, 2*probeTick)
}

// probe counts the stalls of the scheduler until ctx ends. It is not safe
// for concurrent use: read it after run has returned.
type probe struct {
	threshold time.Duration
	stalls    int
	maxStall  time.Duration
}

// run wakes every probeTick until ctx ends.
func (p *probe) run(ctx context.Context) {
	t := time.NewTicker(probeTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Measured from the clock, not from the tick's time: a late
			// wake-up reads the tick that was due, stamped when it was due.
			wall := time.Now()
			if late := wall.Sub(last) - probeTick; late >= p.threshold {
				p.stalls++
				p.maxStall = max(p.maxStall, late)
			}
			last = wall
		}
	}
}
