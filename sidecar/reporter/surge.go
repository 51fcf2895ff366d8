package reporter

import (
	"math"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// Surge detection: the first report of a surge is what starts enforcement,
// and waiting out the rest of the report interval, then the aggregator's
// flush and the controller's tick, is most of the time to enforce. So a
// sidecar also looks at its counters ten times per interval and reports at
// once when a peer's rate has jumped; the aggregator and the controller pass
// such a report on at once too (LoadReport.urgent, ZoneLoad.urgent). Falls
// are reported as fast as rises (dropratio.Jumped says why): traffic that
// moves away from this sidecar is arriving at another, which reports its
// rise at once.

// Defaults of the surge detector.
const (
	// DefaultSurgeFactor is by how many times a peer's rate must differ
	// from its last reported rate, up or down, to be reported at once: the
	// rule every tier shares.
	DefaultSurgeFactor = dropratio.JumpFactor
	// DefaultSurgeMinCount is the fewest requests of a peer in one check
	// window, counted or expected, that can show a jump: below it, a jump
	// is noise.
	DefaultSurgeMinCount = 20
	// FollowFactor is the rise that is reported at once while a surge is
	// under way (after a surge report, until the next regular one): a surge
	// that ramps up is reported step by step as it climbs, so that the
	// ratio follows it rather than waiting for the next interval.
	FollowFactor = 1.1
	// surgeSigmas is how many standard deviations above what the last
	// report leads one to expect a check window's count must be: arrivals
	// are Poisson-like, and at a few dozen requests per check a plain factor
	// would mistake noise for a surge several times a second across a
	// fleet. While a surge is under way the bar is lower (followSigmas): a
	// false alarm then costs one report, and a climbing surge raises each
	// check's count by only a little more than its noise.
	surgeSigmas  = 4
	followSigmas = 2
)

// DefaultSurgeCheck is how often a sidecar with the given report interval
// checks for a surge: ten times per interval. The checks only read counters,
// and the check period is most of what a surge waits before it is reported.
func DefaultSurgeCheck(interval time.Duration) time.Duration {
	return max(interval/10, MinInterval)
}

// SurgeDetector tells, from successive snapshots of a sidecar's counters,
// when a peer's rate has jumped since the last report. It is pure: the
// reporter's loop and the simulator both drive it. Not safe for concurrent
// use.
type SurgeDetector struct {
	Factor   float64 // 0 means DefaultSurgeFactor
	MinCount uint64  // 0 means DefaultSurgeMinCount

	reported  map[string]float64 // offered rate per peer in the last report
	following bool               // the last report was a surge report
}

// Reported records the report just sent: jumps are judged against it. An
// urgent report (r.Urgent) makes the following checks report smaller
// changes (FollowFactor), until a regular report ends the surge.
func (d *SurgeDetector) Reported(r *sluicev1.LoadReport) {
	d.following = r.GetUrgent()
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

// Following reports whether a surge is under way: the last report was a
// surge report.
func (d *SurgeDetector) Following() bool { return d.following }

// Surging reports whether, between the snapshots prev and cur taken
// elapsed apart, some peer's count n jumped from what its last reported
// rate predicts for the window (want): by a factor of at least Factor
// (FollowFactor while a surge is under way), up or down, by four standard
// deviations of a Poisson count (two while a surge is under way), and with
// n (for a rise) or want (for a fall) at least MinCount. Before any report
// nothing surges: a starting sidecar has no rate to compare with.
func (d *SurgeDetector) Surging(prev, cur []sidecar.PeerCounts, elapsed time.Duration) bool {
	if d.reported == nil || elapsed <= 0 {
		return false
	}
	factor, minCount := d.Factor, d.MinCount
	if factor <= 0 {
		factor = DefaultSurgeFactor
	}
	sigmas := float64(surgeSigmas)
	if d.following {
		factor, sigmas = min(factor, FollowFactor), followSigmas
	}
	if minCount == 0 {
		minCount = DefaultSurgeMinCount
	}
	jumped := func(n, want float64) bool {
		noise := sigmas * math.Sqrt(max(want, 1))
		rose := n >= float64(minCount) && n >= factor*want && n-want >= noise
		fell := want >= float64(minCount) && n*factor <= want && want-n >= noise
		return rose || fell
	}
	before := sumByPeer(prev)
	now := sumByPeer(cur)
	for peer, c := range now {
		b := before[peer]
		if c.Offered < b.Offered {
			continue // reset: not a rate
		}
		if jumped(float64(c.Offered-b.Offered), d.reported[peer]*elapsed.Seconds()) {
			return true
		}
	}
	// A reported peer the snapshot no longer lists sent nothing.
	for peer, rate := range d.reported {
		if _, ok := now[peer]; !ok && jumped(0, rate*elapsed.Seconds()) {
			return true
		}
	}
	return false
}
