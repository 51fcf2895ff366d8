package reporter

import (
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// Surge detection: the first report of a surge is what starts enforcement,
// and waiting out the rest of the report interval, then the aggregator's
// flush and the controller's tick, is most of the time to enforce. So a
// sidecar also looks at its counters several times per interval and
// reports at once when a peer's rate has jumped; the aggregator and the
// controller pass such a jump on at once too (see aggregator.State.Urgent
// and controller.State.Urgent). Only rises travel fast: a falling rate waits
// for the next report, as the control law's slow release would anyway.

// Defaults of the surge detector.
const (
	// DefaultSurgeFactor is how many times its last reported rate a
	// peer's rate must reach to count as a surge: the rule every tier
	// shares.
	DefaultSurgeFactor = dropratio.SurgeFactor
	// DefaultSurgeMinCount is the fewest requests of a peer in one check
	// window that can show a surge: below it, a jump is noise.
	DefaultSurgeMinCount = 20
)

// SurgeDetector tells, from successive snapshots of a sidecar's counters,
// when a peer's rate has jumped since the last report. It is pure: the
// reporter's loop and the simulator both drive it. Not safe for concurrent
// use.
type SurgeDetector struct {
	Factor   float64 // 0 means DefaultSurgeFactor
	MinCount uint64  // 0 means DefaultSurgeMinCount

	reported map[string]float64 // offered rate per peer in the last report
}

// Reported records the report just sent: surges are judged against it.
func (d *SurgeDetector) Reported(r *sluicev1.LoadReport) {
	if d.reported == nil {
		d.reported = make(map[string]float64, len(r.GetPeers()))
	}
	clear(d.reported)
	secs := r.GetWindow().AsDuration().Seconds()
	if secs <= 0 {
		return
	}
	for _, p := range r.GetPeers() {
		d.reported[p.GetPeer()] += float64(p.GetOffered()) / secs
	}
}

// Surging reports whether, between the snapshots prev and cur taken
// elapsed apart, some peer offered at least MinCount requests at a rate of
// at least Factor times its last reported rate. Before any report nothing
// surges: a starting sidecar has no rate to compare with.
func (d *SurgeDetector) Surging(prev, cur []sidecar.PeerCounts, elapsed time.Duration) bool {
	if d.reported == nil || elapsed <= 0 {
		return false
	}
	factor, minCount := d.Factor, d.MinCount
	if factor <= 0 {
		factor = DefaultSurgeFactor
	}
	if minCount == 0 {
		minCount = DefaultSurgeMinCount
	}
	before := sumByPeer(prev)
	for peer, c := range sumByPeer(cur) {
		b := before[peer]
		if c.Offered < b.Offered {
			continue // reset: not a rate
		}
		n := c.Offered - b.Offered
		if n < minCount {
			continue
		}
		if float64(n)/elapsed.Seconds() >= factor*d.reported[peer] {
			return true
		}
	}
	return false
}
