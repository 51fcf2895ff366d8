package reporter

import (
	"time"

	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/sidecar"
)

// The health fast path (issue #18). The controller turns a callee's
// objective into a capacity from the fleet's health, a report, a flush and
// a tick after the callee began to miss it: one to three seconds in which
// a callee pushed past its knee queues, and its p99 runs away. A sidecar
// sees its own share of that at once. At each surge check it judges its
// callee's answers over the last healthSpan; when they miss the objective
// it sheds a share of what its enforced leaves admit (the least critical
// tiers first) and holds that cut for one report interval, the
// controller's tick: it bridges the first of the seconds the controller
// needs, and never the rest. Then it rests: the controller's estimate
// decides, and the gate acts again only after its callee has met the
// objective once more. Like Envoy's admission control it reacts to
// what the local instance sees; unlike it, it never decides on its own for
// longer than a tick, so a few sidecars with a noisy view cannot hold a
// fleet's capacity down.

// Tuning of the gate, in one place.
const (
	// healthSpan is how far back a check judges: ten checks at the
	// default 100 ms. A p99 turns as soon as one answer in a hundred is
	// slow, so a longer span hardly slows the gate down, and it lets a
	// sidecar of 100 rps judge at all.
	healthSpan = time.Second
	// minGateAnswers is how many answers a judgement needs: the p99 of
	// 100 is the second slowest, so one stray slow answer (a pause of
	// the app's runtime) is not a miss.
	minGateAnswers = 100
	// minGateCut and maxGateCut bound the share of the admitted load an
	// episode sheds: a miss worth acting on sheds at least a tenth, and
	// a single sidecar's view never sheds more than half before the
	// controller has the fleet's.
	minGateCut, maxGateCut = 0.1, 0.5
)

// HealthGate is one callee's health fast path: the pure rule the Window
// runs at each surge check. Not safe for concurrent use.
type HealthGate struct {
	hold time.Duration // how long an episode sheds: the report interval
	ring []gateSample  // the checks within healthSpan, oldest first

	state    gateState
	since    time.Time                      // when the episode began
	cut      float64                        // the share the episode sheds of what its leaves admit
	tierCut  [criticality.Count + 1]float64 // the share each tier loses (index: Tier)
	episodes uint64                         // episodes begun
	w        [health.Buckets]float64        // scratch: the span's latency weights
}

type gateState uint8

const (
	gateArmed    gateState = iota // judging; acts on a miss
	gateShedding                  // an episode sheds
	gateResting                   // the controller decides; re-armed once the objective is met
)

// gateSample is what the callee answered in one check window.
type gateSample struct {
	at time.Time // the window's end
	c  health.Counts
}

// NewHealthGate returns a gate whose episodes last hold, the controller's
// tick (the report interval).
func NewHealthGate(hold time.Duration) *HealthGate {
	return &HealthGate{hold: hold}
}

// Add records what the callee answered in the check window that ended at
// now, summed over its procedures, and forgets windows older than
// healthSpan. It allocates only while the ring grows to its size.
func (g *HealthGate) Add(now time.Time, c *health.Counts) {
	drop := 0
	for drop < len(g.ring) && now.Sub(g.ring[drop].at) >= healthSpan {
		drop++
	}
	if drop > 0 {
		n := copy(g.ring, g.ring[drop:])
		g.ring = g.ring[:n]
	}
	g.ring = append(g.ring, gateSample{at: now})
	g.ring[len(g.ring)-1].c = *c
}

// judge returns the span's p99 and error ratio, and whether it holds
// enough answers to judge.
func (g *HealthGate) judge() (p99 time.Duration, errs float64, ok bool) {
	clear(g.w[:])
	var answered, failed uint64
	for i := range g.ring {
		c := &g.ring[i].c
		for b, n := range c.Latency {
			g.w[b] += float64(n)
		}
		answered += c.Answered()
		failed += c.Failed + c.Late
	}
	if answered < minGateAnswers {
		return 0, 0, false
	}
	p99, ok = health.Quantile(g.w[:], 0.99)
	return p99, float64(failed) / float64(answered), ok
}

// missCut returns the share to shed for a callee answering at p99 with
// an error ratio errs against obj: 0 when it meets obj; else the latency's
// gradient (obj's p99 over the one seen: what the rate must fall by for a
// queue to drain to it) or the errors beyond the objective, whichever is
// larger, within [minGateCut, maxGateCut].
func missCut(obj adaptive.Objective, p99 time.Duration, errs float64) float64 {
	c := 0.0
	if obj.LatencyP99 > 0 && p99 > obj.LatencyP99 {
		c = 1 - float64(obj.LatencyP99)/float64(p99)
	}
	if obj.Errors > 0 && errs > obj.Errors {
		c = max(c, (errs-obj.Errors)/(1-obj.Errors))
	}
	if c == 0 {
		return 0
	}
	return min(max(c, minGateCut), maxGateCut)
}

// Step is a check at now against the policy's objective obj (zero: none,
// and the gate stands down). admitted returns each enforced leaf's
// admitted requests in the check window, asked for only when an episode
// may begin: it shares its cut among them by tier, the least critical
// first. Step reports whether the cuts in force changed (an episode began
// or ended).
func (g *HealthGate) Step(now time.Time, obj adaptive.Objective, admitted func() map[bucket]uint64) bool {
	if obj == (adaptive.Objective{}) {
		g.ring = g.ring[:0]
		was := g.state == gateShedding
		g.state = gateArmed
		return was
	}
	switch g.state {
	case gateShedding:
		if now.Sub(g.since) < g.hold {
			return false
		}
		g.state = gateResting
		return true
	case gateResting:
		if p99, errs, ok := g.judge(); ok && missCut(obj, p99, errs) == 0 {
			g.state = gateArmed
		}
		return false
	}
	p99, errs, ok := g.judge()
	if !ok {
		return false
	}
	cut := missCut(obj, p99, errs)
	if cut == 0 || !g.shareCut(cut, admitted()) {
		return false
	}
	g.state, g.since, g.cut = gateShedding, now, cut
	g.episodes++
	return true
}

// shareCut sets tierCut so that the leaves in admitted lose cut of their
// admitted requests in all, the least critical tier first: a tier is shed
// whole before the next loses any. It reports false when they admitted
// nothing, leaving nothing to cut.
func (g *HealthGate) shareCut(cut float64, admitted map[bucket]uint64) bool {
	var byTier [criticality.Count + 1]float64
	total := 0.0
	for k, n := range admitted {
		byTier[k.tier] += float64(n)
		total += float64(n)
	}
	if !(total > 0) {
		return false
	}
	g.tierCut = [criticality.Count + 1]float64{}
	rest := cut * total
	// Sheddable (4) first, CriticalPlus (1) last; None (0), a callee's
	// only tier when it declares none, on its own.
	for _, t := range [...]criticality.Tier{criticality.Sheddable, criticality.SheddablePlus, criticality.Critical, criticality.CriticalPlus, criticality.None} {
		if rest <= 0 || byTier[t] == 0 {
			continue
		}
		share := min(rest/byTier[t], 1)
		g.tierCut[t] = share
		rest -= share * byTier[t]
	}
	return true
}

// Shedding returns the share of its admitted load an episode in force
// sheds, 0 when none is.
func (g *HealthGate) Shedding() float64 {
	if g.state != gateShedding {
		return 0
	}
	return g.cut
}

// Episodes returns how many episodes the gate began.
func (g *HealthGate) Episodes() uint64 { return g.episodes }

// Overlay copies proj, the surge projection's provisional ratios, into
// dst and returns it, with the episode in force (if any) laid over pol's
// enforced leaves: its cut on the ratio in force, proj's where it has one
// (which the gate cuts further), the policy's elsewhere. It never returns
// proj itself, whose array is the projector's scratch.
func (g *HealthGate) Overlay(dst []sidecar.Provisional, pol *sidecar.Policy, proj []sidecar.Provisional) []sidecar.Provisional {
	dst = append(dst[:0], proj...)
	if g.state != gateShedding || pol == nil {
		return dst
	}
	projected := len(dst)
	for i := range pol.Peers {
		r := &pol.Peers[i]
		c := g.tierCut[r.Tier]
		if c == 0 || !gateLeaf(r) {
			continue
		}
		in := r.DropRatio
		j := 0
		for ; j < projected; j++ {
			if p := &dst[j]; p.Peer == r.Peer && p.Procedure == r.Procedure && p.Tier == r.Tier {
				break
			}
		}
		if j < projected {
			in = dst[j].Ratio
			dst[j].Ratio = 1 - (1-in)*(1-c)
			continue
		}
		dst = append(dst, sidecar.Provisional{Peer: r.Peer, Procedure: r.Procedure, Tier: r.Tier, Ratio: 1 - (1-in)*(1-c)})
	}
	return dst
}

// gateLeaf reports whether the gate may cut r's leaf: one the sidecar
// enforces itself (not shadow, not enforced upstream, whose requests it
// never drops).
func gateLeaf(r *sidecar.Rule) bool {
	return r.Mode == dropratio.Enforce && r.Enforcement != dataplane.EnforceUpstream
}

// gateAdmitted returns the requests each leaf of pol the gate may cut
// admitted between the snapshots then and cur.
func gateAdmitted(pol *sidecar.Policy, then, cur []sidecar.PeerCounts) map[bucket]uint64 {
	a, b := sumByBucket(then), sumByBucket(cur)
	out := make(map[bucket]uint64, len(pol.Peers))
	for i := range pol.Peers {
		r := &pol.Peers[i]
		if !gateLeaf(r) {
			continue
		}
		k := bucket{r.Peer, r.Procedure, r.Tier}
		c, p := b[k], a[k]
		if c.Incarnation != p.Incarnation || c.Offered < p.Offered {
			p = sidecar.PeerCounts{}
		}
		n, d := c.Offered-p.Offered, c.Dropped-min(p.Dropped, c.Dropped)
		out[k] = n - min(d, n)
	}
	return out
}

// sumHealth sums hs, a check's health by procedure, into c.
func sumHealth(c *health.Counts, hs []sidecar.HealthCounts) *health.Counts {
	*c = health.Counts{}
	for i := range hs {
		c.Add(&hs[i].Counts)
	}
	return c
}

// mergeHealth adds src, a TakeHealth's counts by procedure, to dst, the
// window's so far, and returns it. Requests in flight are src's: the
// latest reading, and every procedure with one in flight is in src.
func mergeHealth(dst, src []sidecar.HealthCounts) []sidecar.HealthCounts {
	for i := range dst {
		dst[i].InFlight = 0
	}
	for i := range src {
		s := &src[i]
		j := 0
		for j < len(dst) && dst[j].Procedure != s.Procedure {
			j++
		}
		if j == len(dst) {
			dst = append(dst, sidecar.HealthCounts{Procedure: s.Procedure})
		}
		dst[j].Counts.Add(&s.Counts)
		dst[j].InFlight = s.InFlight
	}
	return dst
}
