package reporter

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// Surge projection (issue #17). A surge report starts enforcement, but the
// controller's first answer is computed from the reports that have arrived
// by then, part of the fleet, and what gets through meanwhile is the surge's
// overshoot (uber-surge: +64 % in its first second). A sidecar that sees its
// own rate of a bucket jump holds what it needs to act at once: its share s
// of the bucket's global offered rate (its last regular report's rate over
// the policy's offered rate, both from before the jump: see shareOf) and
// the bucket's allowed rate A. Assuming its share holds, it may admit s·A
// per second; it drops, from the jump on, what keeps the requests it
// admitted since the window that showed the jump within s·A·elapsed, the
// next step's count predicted by the last check's rate: a token bucket of
// its share, which pays back what the first tenths of a second let
// through. Across the fleet the shares add up to A. The jump is seen by a
// surge report, or sooner by a projection step (Started).
//
// A fall is projected the same way: a bucket whose local rate fell under
// s·A, that is whose projected global rate is under the allowed rate, is
// admitted at once instead of waiting for the controller's release. The
// fall is seen by a surge report, or by a projection step once the
// controller's policy shows it (toldFall).
//
// The projection is provisional: it takes the controller's ratio's place
// (sidecar.Provisional) and ends at whichever comes first of
//   - for a rise, one report interval after the bucket's last surge
//     report, once the controller answers: every sidecar's regular report
//     has reached the controller by then; for a fall, the controller's
//     release (its ratio 0), or fallHolds intervals;
//   - the controller's denial: for a rise, a policy first seen a
//     confirmation delay (two surge checks) after the start whose
//     offered rate did not rise by the jump factor the way this sidecar's
//     did. The share did not hold: traffic moved to this sidecar (a
//     deploy, a zone failover), or only this sidecar's part of the bucket
//     surged, and the controller, which sees the whole fleet, is right;
//     for a fall, a policy whose offered rate has not fallen (see over).
//
// It never starts without what it needs: a policy rule with a finite
// allowed rate and a global offered rate, enforced by this sidecar, and a
// regular report of the bucket since the sidecar started (a new caller, a
// sidecar just started, a shadow or upstream-enforced rule, a service
// counting cost: the controller alone decides those).
type Projector struct {
	hold, confirm time.Duration
	minCount      uint64 // the surge detector's

	// regular holds the last regular report's rates, and regularG the
	// global offered rates of the policy in force when it went out: a
	// share is the one over the other, both from before a surge (the
	// policy's rate is the older by up to an interval, which errs towards
	// a later release, not an earlier one, while a rate falls).
	regular, regularG map[bucket]float64
	// prevRegular and prevRegularG are the same of the regular report
	// before (see shareOf).
	prevRegular, prevRegularG map[bucket]float64
	// regularAt is when the last regular report went out; an episode
	// that ends overwrites regular (and clears prevRegular) for its
	// bucket, not regularAt.
	regularAt time.Time
	// last holds the rates of the last report, surge reports included:
	// an episode goes on while its bucket's rate moves on from it.
	last map[bucket]float64
	eps  map[bucket]*episode

	pol   *sidecar.Policy // the policy last seen at a check, and when it was first
	polAt time.Time
	rules map[bucket]*sidecar.Rule // pol's enforced rules with an allowed and offered rate

	out []sidecar.Provisional // scratch, reused
}

// episode is one bucket's projection.
type episode struct {
	rise bool
	// start is the start of the surge report's window: the budget runs
	// from it. seen is when the first surge report went out, last when
	// the latest did.
	start, seen, last time.Time
	share             float64 // s: the bucket's last regular local rate over g0
	g0                float64 // the policy's global offered rate at the start
	admitted          float64 // requests admitted since start
	fresh             bool    // started at this step: its window is counted already
	told              bool    // a fall started from a policy that showed it (see toldFall)
	// recentN and recentE are the count and length of the last steps'
	// windows, about an interval's worth; winN and winE about a check's
	// worth: the rate a step's ratio is projected from, steadier than a
	// 25 ms step's own count (see decay).
	recentN, recentE float64
	winN, winE       float64
	ratio            float64 // the projection; NaN: none in force
}

// Projection margins.
const (
	// projectMinCount is the fewest requests since a check with which a
	// projection step starts a projection (see Started).
	projectMinCount = 8
	// projectPayback is over how many steps a projection pays back what
	// it let through above its share, or spends what it saved.
	projectPayback = DefaultProjectSteps
	// projectDepth is the depth of a projection's token bucket, in check
	// windows of the sidecar's share (see episode.project).
	projectDepth = 2
	// projectMaxRatio bounds a projected ratio, as the law's p_max does.
	projectMaxRatio = 0.99
	// fallDenied is the share of a fall's global offered rate at its start
	// that the controller's rate must still show for it to deny the fall.
	fallDenied = 0.9
	// fallHolds is how many report intervals a fall's projection may hold
	// without the controller's release. A fall opens only while the local
	// rate stays under this sidecar's share, so it may wait for the
	// controller longer than a rise: a caller whose retries keep its
	// offered rate near its limit after its surge (retry-storm) is
	// released by the controller only once the opening has let the
	// retries die out.
	fallHolds = 5
)

// jumped reports whether a bucket's count n in a surge report's window rose
// or fell from want, what its regular rate predicts for the window, as the
// SurgeDetector judges a first surge: by the jump factor, by surgeSigmas
// of a Poisson count and with minCount requests. A surge report names every
// bucket; only those that moved by themselves start an episode (a bystander
// with 2 requests in a 100ms window has not surged).
func jumped(n, want float64, minCount uint64) (rose, fell bool) {
	noise := surgeSigmas * math.Sqrt(max(want, 1))
	rose = n >= float64(minCount) && n >= dropratio.JumpFactor*want && n-want >= noise
	fell = want >= float64(minCount) && n*dropratio.JumpFactor <= want && want-n >= noise
	return rose, fell
}

// NewProjector returns a Projector for a sidecar reporting every interval
// and checking for surges every check.
func NewProjector(interval, check time.Duration, minCount uint64) *Projector {
	return &Projector{
		hold: interval, confirm: 2 * check, minCount: minCount,
		regular: make(map[bucket]float64), regularG: make(map[bucket]float64), last: make(map[bucket]float64),
		prevRegular: make(map[bucket]float64), prevRegularG: make(map[bucket]float64),
		eps: make(map[bucket]*episode),
	}
}

// Reported records a report the Window sent at now: a regular report's rates
// are the reference of the shares; a surge report starts or extends the
// episodes of the buckets whose rate in it jumped from their regular rate.
func (p *Projector) Reported(r *sluicev1.LoadReport, now time.Time) {
	secs := r.GetWindow().AsDuration().Seconds()
	if secs <= 0 {
		return
	}
	if !r.GetUrgent() {
		p.prevRegular, p.regular = p.regular, p.prevRegular
		p.prevRegularG, p.regularG = p.regularG, p.prevRegularG
		clear(p.regular)
		clear(p.regularG)
		p.regularAt = now
		clear(p.last)
		for _, pc := range r.GetPeers() {
			k := bucket{pc.GetPeer(), pc.GetProcedure(), criticality.Tier(pc.GetCriticality())}
			p.regular[k] += float64(pc.GetOffered()) / secs
			p.last[k] = p.regular[k]
			if rule := p.rules[k]; rule != nil {
				p.regularG[k] = rule.OfferedRPS
			}
		}
		return
	}
	for _, pc := range r.GetPeers() {
		k := bucket{pc.GetPeer(), pc.GetProcedure(), criticality.Tier(pc.GetCriticality())}
		n := float64(pc.GetOffered())
		before := p.last[k]
		p.last[k] = n / secs
		if e := p.eps[k]; e != nil {
			// Extended while it goes on climbing (or falling) from
			// report to report by as much as started it: the surge
			// reports that follow a surge by smaller steps keep
			// coming, from noise, for seconds after it has levelled.
			if rose, fell := jumped(n, before*secs, p.minCount); e.rise && rose || !e.rise && fell {
				e.last = now
			}
			continue
		}
		ref, g0 := p.regular[k], p.regularG[k]
		rose, fell := jumped(n, ref*secs, p.minCount)
		if !(ref > 0) || !(g0 > 0) || (!rose && !fell) {
			continue
		}
		if rule := p.rules[k]; rule == nil || fell && rule.DropRatio == 0 {
			continue // nothing to project from, or to open: the controller decides
		}
		share, g0 := p.shareOf(k, rose)
		p.eps[k] = &episode{
			rise: rose, start: now.Add(-r.GetWindow().AsDuration()), seen: now, last: now,
			share: share, g0: g0,
			admitted: float64(pc.GetOffered() - min(pc.GetDropped(), pc.GetOffered())),
			winN:     n, winE: secs,
			fresh: true, ratio: math.NaN(),
		}
	}
}

// Idle reports whether the projection has nothing to do: no rule of the
// policy to project from and no episode under way. A Window then reads
// no counters for it.
func (p *Projector) Idle() bool { return len(p.rules) == 0 && len(p.eps) == 0 }

// Since is a window of a sidecar's counters that a projection may start
// from: the counts at its start (then, by bucket) and when it began.
type Since struct {
	Then map[bucket]sidecar.PeerCounts
	At   time.Time
}

// shareOf returns the share of bucket k a projection starts from, and the
// global offered rate it is a share of: the last regular report's rate
// over the offered rate of the policy in force when it went out, unless
// that share jumped from the report before's (by the jump factor), or for
// a fall (rise false) fell from it: then the report before's. A surge
// that begins shortly before a regular report is in that report's rate
// already, not in the policy's offered rate: taken from it, a share came
// out three times too large on the sidecars whose report caught the onset
// (the demo: 34 rps of 60 on three of six sidecars, where each had 10),
// and their projections admitted 2.5× the limit between them. Taking the
// smaller of the two always erred the other way in the simulator: the
// share of a sidecar is noisy, and the smaller of two noisy shares is low
// (uber-surge under its limit for two seconds). A fall caught the same
// way made a share too small: half of the demo's report window was at 167
// rps and half at 10, the policy still said 1,000 rps, and the sidecars
// took 0.08 for their share where each had 1/6; their falls' token
// buckets then dropped a fifth of web's 10 rps, back under its limit,
// until the controller released it (18–40 of 660 requests after the first
// second). The fall's rule is not a
// rise's: a small sidecar's share is noisy from report to report, and a
// rise that took the report before's share whenever the last one had
// fallen by the factor took a larger one by chance (step-5x's peak +4.0 →
// +6.7 %, noisy-neighbour's +3.9 → +9.2 %).
func (p *Projector) shareOf(k bucket, rise bool) (share, g0 float64) {
	share, g0 = p.regular[k]/p.regularG[k], p.regularG[k]
	if prev, pg := p.prevRegular[k], p.prevRegularG[k]; prev > 0 && pg > 0 &&
		(rise && dropratio.JumpFactor*prev/pg <= share || !rise && dropratio.JumpFactor*share <= prev/pg) {
		share, g0 = prev/pg, pg
	}
	return share, g0
}

// reference returns the regular rate of bucket k that a projection step
// judges the count of a window begun at from against: the last regular
// report's, unless the window began before that report and the report's
// rate rose from the report before's by the jump factor. The report then
// caught a surge's onset (as shareOf takes the share), and the window
// holds the onset too: it is judged against the report before's rate. A
// report that went out 50ms into the demo's surge measured 16–18 rps
// where the calm was 10, and against it the jump showed only at 24
// requests, 150ms in, where it shows at 12 against 10. A window begun
// after the report is judged against it: a rate that climbs by half from
// report to report is a ramp the controller follows (against the report
// before, projections started on ramps, and burst's and surge-end's
// steady-state errors rose past 2 %).
func (p *Projector) reference(k bucket, from time.Time) float64 {
	ref := p.regular[k]
	if prev := p.prevRegular[k]; from.Before(p.regularAt) && prev > 0 && dropratio.JumpFactor*prev <= ref {
		return prev
	}
	return ref
}

// Started starts, at a projection step or a check at now, the episode of
// each bucket without one whose count since the start of one of ws, half a
// check or more ago, shows it rose from its regular rate, so that the
// projection does not wait for the surge report: a check reports a surge
// once 20 requests show it, 120 ms into a jump from 10 rps to 170 (the
// demo's), and a sidecar with fewer per check only once the window since
// its report convinces the detector, or at the next regular report.
// Judged by the Poisson tail of the count (beyondNoise), with at least
// projectMinCount requests rather than 20, and 1.5×. The Window calls it
// with the window since the last check (a large jump shows there first),
// the one since the check before (which holds an onset the last check
// fell just after) and the one since the last report (a small sidecar's
// jump adds up there). The budget runs from the window's start; the
// bucket's depth is its only saving from before.
func (p *Projector) Started(now time.Time, cur map[bucket]sidecar.PeerCounts, ws ...Since) {
	for _, win := range ws {
		p.started(now, win, cur)
	}
}

func (p *Projector) started(now time.Time, win Since, cur map[bucket]sidecar.PeerCounts) {
	e := now.Sub(win.At).Seconds()
	if e < p.confirm.Seconds()/4 {
		return // under half a check: too lumpy a window (arrivals come in bursts)
	}
	w := p.hold.Seconds() // the regular report's window, about
	for k, c := range cur {
		if p.eps[k] != nil {
			continue
		}
		ref, g0 := p.reference(k, win.At), p.regularG[k]
		if !(ref > 0) || !(g0 > 0) || p.rules[k] == nil {
			continue
		}
		b := win.Then[k]
		if c.Incarnation != b.Incarnation || c.Offered < b.Offered {
			b = sidecar.PeerCounts{}
		}
		n, want := float64(c.Offered-b.Offered), ref*e
		rose := n >= projectMinCount && n >= dropratio.JumpFactor*want && beyondNoise(n, want, ref*w)
		if !rose && !p.toldFall(k, n, want) {
			continue
		}
		share, g0 := p.shareOf(k, rose)
		p.eps[k] = &episode{
			rise: rose, told: !rose, start: win.At, seen: now, last: now,
			share: share, g0: g0,
			admitted: n - float64(c.Dropped-min(b.Dropped, c.Dropped)),
			winN:     n, winE: e,
			fresh: true, ratio: math.NaN(),
		}
	}
}

// toldFall reports whether bucket k's count n in a window where its
// regular rate predicts want shows a fall the controller has told of
// already: the policy in force shows the bucket's global offered rate
// fallen by the jump factor from the rate of the policy when the last
// regular report went out, and this sidecar's count fell by as much, so
// a projection step may start the fall's episode (Started) without waiting
// for the surge detector. A small sidecar reports a fall late: at 17 rps
// after a fall from 167, the bar of a surge over the window since the
// report (six standard deviations) took 0.7 s to reach, and the three
// sidecars of six whose reports had caught half the fall kept the
// controller's ratio, released a step a tick, until their own fall
// reports 0.9 s after the fall (live step-5x: web back under its limit
// lost 9–12 of 99 in its second second). The controller's rate is the
// fleet's, so a fall it shows is no sidecar's noise; the count's own fall
// keeps a sidecar whose traffic did not fall (traffic moved to it) from
// opening, and a sidecar that opens admits no more than its share
// (episode.project). The controller still confirms and ends it (see over).
func (p *Projector) toldFall(k bucket, n, want float64) bool {
	rule := p.rules[k]
	return rule.DropRatio > 0 && dropratio.JumpFactor*rule.OfferedRPS <= p.regularG[k] &&
		want >= projectMinCount && dropratio.JumpFactor*n <= want
}

// startLogP is the log of the chance, under which a count counts as a
// jump (see beyondNoise): 10⁻⁷. A fleet of 300 sidecars with ten buckets
// each, judged 40 times a second on windows that overlap, sees a false
// start every few minutes; it drops nothing unless the bucket's rate then
// stays over the sidecar's share (episode.project).
var startLogP = math.Log(1e-7)

// beyondNoise reports whether a count n is beyond the noise of a Poisson
// count of mean want, the regular rate's prediction from a reference count
// of refCount: whether the Chernoff bound of its upper tail,
// P(X ≥ n) ≤ e^(−λ)·(e·λ/n)^n, is under e^startLogP, with λ the mean
// raised by two standard deviations of the reference's own noise (a rate
// measured low makes any next count look high). A Gaussian bar of a few
// σ is far too strict for the few requests a small sidecar sees in a
// tenth of a second, where the tail is long, not normal: 21 from an
// expected 4 (a 5× jump at 17 rps, a quarter of a second in) is one
// chance in 10⁷; a 6σ bar asked for 40.
func beyondNoise(n, want, refCount float64) bool {
	lambda := want * (1 + 2/math.Sqrt(max(refCount, 1)))
	if n <= lambda {
		return false
	}
	return -lambda+n*(1+math.Log(lambda/n)) < startLogP
}

// Policy records the policy in force at a check at now; Reported projects
// from the rules of the last one recorded.
func (p *Projector) Policy(pol *sidecar.Policy, now time.Time) {
	if pol == p.pol {
		return
	}
	p.pol, p.polAt = pol, now
	clear(p.rules)
	if p.rules == nil {
		p.rules = make(map[bucket]*sidecar.Rule)
	}
	if pol == nil || pol.Unit == sidecar.UnitCost {
		return
	}
	for i := range pol.Peers {
		r := &pol.Peers[i]
		if r.Mode != dropratio.Enforce || r.Enforcement == dataplane.EnforceUpstream ||
			!(r.AllowedRPS > 0) || math.IsInf(r.AllowedRPS, 1) || !(r.OfferedRPS > 0) || math.IsInf(r.OfferedRPS, 1) {
			continue
		}
		p.rules[bucket{r.Peer, r.Procedure, r.Tier}] = r
	}
}

// Check moves every episode on to a check at now, whose window of e
// counted the per-bucket deltas then → cur, and returns the provisional
// ratios in force (nil when none), valid until the next call.
func (p *Projector) Check(now time.Time, then, cur map[bucket]sidecar.PeerCounts, e time.Duration) []sidecar.Provisional {
	p.out = p.out[:0]
	for k, ep := range p.eps {
		rule := p.rules[k]
		c, b := cur[k], then[k]
		if c.Incarnation != b.Incarnation || c.Offered < b.Offered {
			b = sidecar.PeerCounts{}
		}
		n := float64(c.Offered - b.Offered)
		adm := n - float64(c.Dropped-min(b.Dropped, c.Dropped))
		if !ep.fresh {
			ep.admitted += max(adm, 0)
		}
		ep.recentN, ep.recentE = decay(ep.recentN+n, ep.recentE+e.Seconds(), p.hold.Seconds())
		if !ep.fresh {
			ep.winN, ep.winE = decay(ep.winN+n, ep.winE+e.Seconds(), p.confirm.Seconds()/2)
		}
		if rule == nil || p.over(ep, rule, now) {
			delete(p.eps, k)
			// The reference of the next episode, until a regular
			// report (which the surge reports may fold for a while)
			// sets one: the rate over the last checks, as long a
			// window as a report's, against the controller's rate now.
			// A surge report's rate, over a check window or two, is too
			// noisy to take a share from.
			if rule != nil && ep.recentE >= p.hold.Seconds()/2 {
				p.regular[k], p.regularG[k] = ep.recentN/ep.recentE, rule.OfferedRPS
			} else {
				delete(p.regular, k)
				delete(p.regularG, k)
			}
			// Nor the report before: the episode has dealt with the
			// rise a report caught, and judged against the rate before
			// it (reference, shareOf) the rise would start one again
			// right after the controller ended it, or denied it.
			delete(p.prevRegular, k)
			delete(p.prevRegularG, k)
			continue
		}
		ep.ratio = math.NaN()
		if ep.rise || p.fallSeen(ep, rule) {
			ep.ratio = ep.project(rule.AllowedRPS, now, e)
		}
		ep.fresh = false
		if !math.IsNaN(ep.ratio) {
			p.out = append(p.out, sidecar.Provisional{Peer: k.peer, Procedure: k.procedure, Tier: k.tier, Ratio: ep.ratio})
		}
	}
	if len(p.out) == 0 {
		return nil
	}
	slices.SortFunc(p.out, compareBuckets)
	return p.out
}

// over reports whether ep ends at now (see Projector): a rise held for an
// interval since its last surge report or denied by the controller, once
// the controller answers (a controller that restarts, or is cut off, leaves
// the projection in force until the policy expires and its fail mode
// takes over: released after the interval, the bucket was open until the
// controller came back, and its ratio turned twice), a fall
// held for fallHolds intervals or released by the controller, or denied
// by it. A fall is denied only when the controller's offered rate has not
// fallen at all (by fallDenied): while a bucket's rate falls over a second,
// the controller's view lags a tick behind, and its first policy after the
// fall report shows less of a fall than the sidecar saw. A fall that is
// traffic moving away (a zone drain) leaves the global rate where it was:
// the sidecars it left would admit their whole share of the allowed rate
// while the sidecars it reached admit theirs at the controller's ratio
// (zone-imbalance: 26,860 admitted against 20,000 before the denial).
func (p *Projector) over(ep *episode, rule *sidecar.Rule, now time.Time) bool {
	// The controller has answered when a policy first seen the
	// confirmation delay after the start is in force, or when the policy
	// in force, older, already shows the rise: a controller whose ratio
	// does not move publishes nothing new until its refresh, half a TTL
	// later, and waiting for a new policy held a projection for 12 s (the
	// demo: a share measured from a report that caught the onset, 1.7×
	// the limit admitted for 12 s).
	g := rule.OfferedRPS
	answered := p.polAt.Sub(ep.seen) >= p.confirm ||
		ep.rise && now.Sub(ep.seen) >= p.confirm && g >= dropratio.JumpFactor*ep.g0
	if ep.rise {
		return answered && (now.Sub(ep.last) >= p.hold || g < dropratio.JumpFactor*ep.g0)
	}
	return now.Sub(ep.seen) >= fallHolds*p.hold || answered && (rule.DropRatio == 0 || g >= fallDenied*ep.g0)
}

// decay returns the count n and length e of a sliding window cut back to
// span seconds, the oldest part forgotten in proportion.
func decay(n, e, span float64) (float64, float64) {
	if e > span {
		return n * span / e, span
	}
	return n, e
}

// fallSeen reports whether the controller has seen a fall too: a policy
// first seen after the fall report (a check reads the policy before it
// reports) shows at least half the fall this sidecar projects from its
// rate over the last check, from the bucket's global rate at the start
// (g0) to the rate over its share. Traffic that moved away from this sidecar has not fallen: in a
// zone drain the sidecars it leaves see their rate halve while the global
// rate holds, and opened on their own they let through their share of the
// allowed rate on top of what the controller's ratio admits where the
// traffic went (zone-imbalance: 24,000 admitted against 20,000). What the
// policy shows, not when it came, proves the controller saw the report: a
// policy computed before it shows the old rate. Waiting the confirmation
// delay as well let the first policy after the report go by, and the
// sidecar waited for the controller's next tick, a second later (step-5x
// live: web back under its limit lost 11–19 % in its second second).
func (p *Projector) fallSeen(ep *episode, rule *sidecar.Rule) bool {
	if !(p.polAt.After(ep.seen) || ep.told) || !(ep.winE > 0) {
		return false
	}
	projected := ep.winN / ep.winE / ep.share
	return ep.g0-rule.OfferedRPS >= (ep.g0-projected)/2
}

// project returns the episode's ratio for the next check window, given
// the bucket's allowed rate and its count n in the last check window of
// e, or NaN for none: the controller's ratio.
//
// Both ways it is a token bucket of the sidecar's share: the ratio keeps
// what it admits since the episode began within its share of the allowed
// rate, as the next window's count is predicted by the last one's. Its
// depth is projectDepth check windows, so that a sidecar whose rate fell
// under its share opens, but saves no more than that for a burst after (a
// caller that pulses its traffic to make its sidecars see falls gets its
// share, and no more).
//
// A rise's ratio applies only while the last check's rate is over the
// sidecar's share by four standard deviations of a Poisson count: a
// check's count is noisy, and a sidecar that dropped on one high count
// would drop what its bucket, under its limit, never needed dropped. The
// budget runs from the start of the window that started the episode, so
// what the checks let through meanwhile is paid back.
func (ep *episode) project(allowed float64, now time.Time, e time.Duration) float64 {
	if !(ep.winN > 0) || !(ep.winE > 0) || e <= 0 {
		return math.NaN()
	}
	own := ep.share * allowed // this sidecar's part of the allowed rate
	budget := own*(now.Sub(ep.start)+e).Seconds() - ep.admitted
	if depth := own * projectDepth * ep.winE; budget > depth {
		ep.admitted += budget - depth // the bucket is full: the rest is lost
		budget = depth
	}
	if ep.rise {
		if want := own * ep.winE; ep.winN-want < surgeSigmas*math.Sqrt(max(want, 1)) {
			return math.NaN()
		}
	}
	// The next step's count, as the last check's rate predicts, and what
	// it may admit: its share, and a quarter of what the bucket owes or
	// holds (budget less one step's share), so that a step's noise is
	// paid back over a check, not in the next step alone (which made a
	// held ratio swing by points from step to step).
	next := ep.winN / ep.winE * e.Seconds()
	step := own * e.Seconds()
	allow := step + (budget-step)/projectPayback
	return min(max(1-allow/next, 0), projectMaxRatio)
}

func compareBuckets(a, b sidecar.Provisional) int {
	return cmp.Or(strings.Compare(a.Peer, b.Peer), strings.Compare(a.Procedure, b.Procedure), cmp.Compare(a.Tier, b.Tier))
}
