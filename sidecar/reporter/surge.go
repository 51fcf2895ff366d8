package reporter

import (
	"math"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/criticality"
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
	// reportSigmas is the bar of SurgingSinceReport.
	reportSigmas = 6
)

// DefaultSurgeCheck is how often a sidecar with the given report interval
// checks for a surge: ten times per interval. The checks only read counters,
// and the check period is most of what a surge waits before it is reported.
func DefaultSurgeCheck(interval time.Duration) time.Duration {
	return max(interval/10, MinInterval)
}

// SurgeDetector tells, from successive snapshots of a sidecar's counters,
// when a peer's rate has jumped since the last report. It is pure; Window
// drives it. Not safe for concurrent use.
type SurgeDetector struct {
	Factor   float64 // 0 means DefaultSurgeFactor
	MinCount uint64  // 0 means DefaultSurgeMinCount

	reported  map[bucket]float64 // offered rate per bucket in the last report
	window    float64            // the last report's window, seconds
	following bool               // the last report was a surge report
	// confirm arms the check after a surge report: see Reported.
	// confirmed says the check just made was that one, so that the report
	// it causes does not arm another.
	confirm, confirmed bool
}

// Reported records the report just sent: jumps are judged against it. An
// urgent report (r.Urgent) makes the following checks report smaller
// changes (FollowFactor), until a regular report ends the surge.
//
// It also makes the next check a confirmation: that check reports again
// when its rate differs from the surge report's by FollowFactor, whatever
// the noise. A surge report's window holds the onset, so part of it is the
// calm before, and its rate is low by up to a fifth (the check fires once
// MinCount arrive, which a window mostly before the onset does not hold);
// the next window is all surge. Without it, a sidecar that reported 100 of
// its 125 rps kept the fleet's ratio 5 % short until its next regular report
// had gone through a flush and a tick: the "partial first ratio" that took
// enforcement from one second to three. A confirmation's own report arms
// none, so one surge costs a sidecar at most twice its surge reports.
func (d *SurgeDetector) Reported(r *sluicev1.LoadReport) {
	d.following = r.GetUrgent()
	d.confirm = d.following && !d.confirmed
	d.confirmed = false
	if d.reported == nil {
		d.reported = make(map[bucket]float64, len(r.GetPeers()))
	}
	clear(d.reported)
	secs := r.GetWindow().AsDuration().Seconds()
	d.window = secs
	if secs <= 0 {
		return
	}
	for _, p := range r.GetPeers() {
		d.reported[bucket{p.GetPeer(), p.GetProcedure(), criticality.Tier(p.GetCriticality())}] += float64(p.GetOffered()) / secs
	}
}

// Surging reports whether, between the snapshots prev and cur taken
// elapsed apart, some peer's count n jumped from what its last reported
// rate predicts for the window (want): by a factor of at least Factor
// (FollowFactor while a surge is under way), up or down, by four standard
// deviations of a Poisson count (two while a surge is under way), and with
// n (for a rise) or want (for a fall) at least MinCount. Before any report
// nothing surges: a starting sidecar has no rate to compare with.
func (d *SurgeDetector) Surging(prev, cur []sidecar.PeerCounts, elapsed time.Duration) bool {
	d.confirmed, d.confirm = d.confirm, false
	return d.surging(prev, cur, elapsed, false)
}

// SurgingSinceReport judges the window since the last report, prev being
// the snapshot the report was built from, when no surge is under way: a
// sidecar with a few requests per check never sees MinCount in one check
// window (a 10× surge to 170 rps is 17 per 100ms), but the window since
// the report adds up to it a check or two later. Its windows overlap from
// check to check and are long, so it asks for more: reportSigmas, against
// the noise of the report's own count as well as n's (two Poisson counts
// of one rate λ, over the report's window w and elapsed e, differ by
// sqrt(λe(1+e/w)) once scaled). Judged like the check window, a peer that
// happened to be reported low "rose" whenever a second's worth was
// checked: 312 false surges in 35 s of uber-surge without its surge.
func (d *SurgeDetector) SurgingSinceReport(prev, cur []sidecar.PeerCounts, elapsed time.Duration) bool {
	if d.following || d.window <= 0 {
		return false
	}
	return d.surging(prev, cur, elapsed, true)
}

func (d *SurgeDetector) surging(prev, cur []sidecar.PeerCounts, elapsed time.Duration, sinceReport bool) bool {
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
	if d.confirmed && !sinceReport {
		sigmas = 0 // see Reported
	}
	if minCount == 0 {
		minCount = DefaultSurgeMinCount
	}
	e := elapsed.Seconds()
	jumped := func(n, want float64) bool {
		noise := sigmas * math.Sqrt(max(want, 1))
		if sinceReport {
			lambdaE := (want*d.window/e + n) / (d.window + e) * e // pooled
			noise = reportSigmas * math.Sqrt(max(lambdaE, 1)*(1+e/d.window))
		}
		rose := n >= float64(minCount) && n >= factor*want && n-want >= noise
		fell := want >= float64(minCount) && n*factor <= want && want-n >= noise
		return rose || fell
	}
	before := sumByBucket(prev)
	now := sumByBucket(cur)
	for k, c := range now {
		b := before[k]
		if c.Incarnation != b.Incarnation {
			b = sidecar.PeerCounts{} // evicted and seen again: all new (see Build)
		}
		if c.Offered < b.Offered {
			continue // reset: not a rate
		}
		if jumped(float64(c.Offered-b.Offered), d.reported[k]*e) {
			return true
		}
	}
	// A reported peer the snapshot no longer lists sent nothing.
	for k, rate := range d.reported {
		if _, ok := now[k]; !ok && jumped(0, rate*e) {
			return true
		}
	}
	return false
}

// surgeMinCount is d's MinCount, or its default.
func surgeMinCount(d SurgeDetector) uint64 {
	if d.MinCount == 0 {
		return DefaultSurgeMinCount
	}
	return d.MinCount
}

// Trail keeps the snapshots of the surge checks since the last report, so
// that a surge SurgingSinceReport finds is reported over the recent part of
// that window, not diluted by the calm before it. Window keeps one. Not safe
// for concurrent use; its buffers are reused from report to report.
type Trail struct {
	snaps [][]sidecar.PeerCounts
	at    []time.Time
	n     int
}

// Reset starts a new report window whose start is the snapshot from, at at.
func (t *Trail) Reset(from []sidecar.PeerCounts, at time.Time) {
	t.n = 0
	t.Add(from, at)
}

// Add records the snapshot of a check (copied).
func (t *Trail) Add(snap []sidecar.PeerCounts, at time.Time) {
	if t.n == len(t.snaps) {
		t.snaps = append(t.snaps, nil)
		t.at = append(t.at, at)
	}
	t.snaps[t.n] = append(t.snaps[t.n][:0], snap...)
	t.at[t.n] = at
	t.n++
}

// Since returns the newest recorded snapshot from which cur has counted at
// least minCount requests in all (or the oldest, the report's start), and
// its time: the shortest recent window whose rate means something.
func (t *Trail) Since(cur []sidecar.PeerCounts, minCount uint64) ([]sidecar.PeerCounts, time.Time) {
	total := func(s []sidecar.PeerCounts) (n uint64) {
		for _, c := range s {
			n += c.Offered
		}
		return n
	}
	now := total(cur)
	for i := t.n - 1; i > 0; i-- {
		if then := total(t.snaps[i]); now >= then && now-then >= minCount {
			return t.snaps[i], t.at[i]
		}
	}
	return t.snaps[0], t.at[0]
}
