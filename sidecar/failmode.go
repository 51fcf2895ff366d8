package sidecar

import (
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
)

// Fail modes: what a sidecar does once the controller has been silent for a
// policy's TTL.
//
// The controller re-issues every policy at least every half TTL, with a new
// IssuedAt, so a sidecar that hears from it never sees a policy expire. Age
// is measured from when this sidecar received the policy, on its own clock
// (SetPolicyAt, or the first Expire after SetPolicy): IssuedAt is on the
// controller's clock, and clocks differ across machines.
//
// Decide never reads a clock and its fresh path does not change: a fail
// mode is a different set of verdicts, derived from the policy once when it
// expires and installed with the same atomic table swap as a new policy. A
// new policy replaces them at once, which ends the fail mode. The owner of
// the clock calls Limiter.Expire periodically; Expire works out each
// service's state and moves the fail mode along:
//
//   - open (dataplane.FailOpen): every ratio falls linearly from the policy's to 0 over the
//     policy's FailOpenDecay (default 30s), starting at the TTL; afterwards
//     every request is admitted. Each derived verdict keeps the policy's own
//     ratio to pick requests, by the same error diffusion as ever; of the
//     picked ones it drops the share keep = 1 − decay, diffused over the
//     stripe's picked requests, which Expire lowers. A picked request that is
//     admitted is a fail-open decision (sluice_sidecar_fail_open_total): a
//     request the last policy would have dropped. A decision costs nothing
//     more unless it is picked; then one more atomic add.
//   - hold (dataplane.FailHold): the controller's last verdicts stay (a provisional
//     ratio laid over them, see provisional.go, is taken off); only the state says expired.
//   - local (dataplane.FailLocal): each peer with a limit gets a token bucket of
//     LimitRPS / LiveInstances tokens per second (LiveInstances < 1 counts as
//     1), holding at most LocalBurst's worth (at least one token, and at
//     least one refill) and the fraction of a token it carries over, full at
//     the start; Expire refills it. Every request
//     of such a peer goes to its bucket: one atomic compare-and-swap takes a
//     token, and a request that finds none is dropped (shadow rules: counted
//     as shadow dropped) without writing to the bucket. Peers without a limit
//     are admitted. In a service with procedures, the leaves of a caller
//     whose limit across procedures is known (Rule.CallerLimitRPS) also
//     share one bucket of CallerLimitRPS / LiveInstances: a request takes a
//     token from its leaf's bucket, then one from its caller's, and is
//     dropped unless it got both. Without the shared bucket each leaf would
//     admit the caller's whole limit (its LimitRPS is the tightest limit of
//     the leaf alone), a caller of P procedures P times its limit.
//     Capacities (the callee's, a procedure's) are not enforced locally.
//     In a service with criticality, the tiers of one (peer, procedure)
//     share its leaf's bucket, since limits are not per tier: each tier
//     with a bucket of its own would admit the limit once per tier. The
//     shared bucket serves tiers first come first served: it does not
//     shed the lower tiers first, as the controller's ratios do (the
//     local fallback holds the limit, not the tiers' order). A tier the
//     policy does not list (a sibling not seen before the controller
//     went quiet) has no verdict and is admitted, as an unlisted peer.
//
// Linear in the ratio is linear in the admitted share 1 − p: the admitted
// rate climbs at a constant pace from what the last policy let through to
// everything offered. The alternative, a constant factor per second in the
// admitted share (how the controller releases a ratio), would hold most of
// the stale ratio for most of the window (from 0.99 over 30s, 90% of the
// drops remain at half time). A sidecar in fail-open no longer knows the
// offered rate: its stale ratio may be protecting the callee from a surge
// that goes on, or dropping a caller whose surge ended with the outage; a
// linear ramp gives the callee a steady climb to follow while it stops
// wrongly dropping at a steady pace. The limiter must not become the outage.

// PolicyState says how current a service's policy is.
type PolicyState uint8

const (
	NoPolicy PolicyState = iota // the service has no policy: everything is admitted
	Fresh                       // received within half its TTL
	Stale                       // no new policy for half its TTL: informative, nothing changes
	Expired                     // no new policy for its TTL: the fail mode is in force
)

func (s PolicyState) String() string {
	switch s {
	case NoPolicy:
		return "none"
	case Fresh:
		return "fresh"
	case Stale:
		return "stale"
	case Expired:
		return "expired"
	}
	return "PolicyState(" + strconv.Itoa(int(s)) + ")"
}

const (
	// DefaultPolicyTTL applies to a policy whose TTL is not set (DESIGN.md).
	DefaultPolicyTTL = 10 * time.Second
	// DefaultFailOpenDecay applies to a policy whose FailOpenDecay is not
	// set (DESIGN.md).
	DefaultFailOpenDecay = 30 * time.Second
	// LocalBurst is how much of its rate a fail-local token bucket holds:
	// a peer idle for a while may send this much at once. Short, so that
	// the admitted rate per second stays close to the local share.
	LocalBurst = 100 * time.Millisecond
)

// ExpiryPeriod is how often the owner of a Limiter's clock calls Expire (the
// sidecar agent, the simulator's sidecars): the step of a fail-open decay
// and of local token-bucket refills. Ten steps a second keep both smooth (a
// 30s decay moves the ratio by 1/300 of its start per step) at the cost of a
// lock and a few loads each.
const ExpiryPeriod = 100 * time.Millisecond

// Expiry is the step of the worker that owns a Limiter's policy clock,
// without its timer: every ExpiryPeriod it calls Expire and looks at one
// service's policy state. The sidecar agent runs it on a real ticker and
// logs the changes; the simulator runs it on its virtual clock and notes
// them. Not safe for concurrent use.
type Expiry struct {
	Limiter *Limiter
	Service string
	last    PolicyState
}

// Step calls Expire at now and returns the service's policy status after
// it; changed says that its state differs from the previous Step's, prev
// (NoPolicy before the first).
func (x *Expiry) Step(now time.Time) (st PolicyStatus, prev PolicyState, changed bool) {
	x.Limiter.Expire(now)
	st = x.Limiter.Status(x.Service)
	prev, x.last = x.last, st.State
	return st, prev, st.State != prev
}

// PolicyStatus is the state of a service's policy as of the last Expire.
type PolicyStatus struct {
	State    PolicyState
	FailMode dataplane.FailMode // the policy's
	// Received is when the policy was received, on the holder's clock;
	// zero after SetPolicy until the next Expire.
	Received time.Time
	// Age is the time from Received to the last Expire.
	Age time.Duration
	// Decay is, under fail mode open, how far the decay has gone: 0 at the TTL,
	// 1 at the end of the window. The ratios in force are the policy's
	// times (1 − Decay). 0 otherwise.
	Decay float64
}

// failState is what a ServiceLimiter knows about its policy's age and fail
// mode. Guarded by ServiceLimiter.mu.
type failState struct {
	received time.Time     // zero: stamp at the next Expire
	last     time.Time     // the last Expire's now; zero before the first since the policy
	state    PolicyState   // as of last
	age      time.Duration // as of last
	decay    float64       // fail open: see PolicyStatus.Decay
	derived  bool          // the table holds verdicts derived for the fail mode
	keep     *atomic.Uint64
	buckets  []*tokenBucket // fail local: refilled by Expire
}

// reset starts the record of a new policy p (nil: none) received at
// received.
func (f *failState) reset(p *Policy, received time.Time) {
	*f = failState{received: received}
	if p != nil {
		f.state = Fresh
	}
}

// expire is Limiter.Expire for one service.
func (s *ServiceLimiter) expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.table.Load().policy
	if p == nil {
		return
	}
	f := &s.fail
	if f.received.IsZero() {
		f.received = now
	}
	var dt time.Duration
	if !f.last.IsZero() {
		dt = max(now.Sub(f.last), 0)
	}
	f.last = now
	f.age = max(now.Sub(f.received), 0)
	ttl := p.TTL
	if ttl <= 0 {
		ttl = DefaultPolicyTTL
	}
	switch {
	case f.derived || f.age >= ttl: // once derived, expired until a new policy
		f.state = Expired
	case f.age >= ttl/2:
		f.state = Stale
		return
	default:
		f.state = Fresh
		return
	}

	switch p.FailMode {
	case dataplane.FailHold:
		// The controller's last ratios, not a projection laid over them
		// (provisional.go): no controller has confirmed it since.
		if len(s.prov) > 0 {
			s.prov = nil
			old := s.table.Load()
			s.installLocked(p, old.procs, old.crit, s.base, old.desc, old.cost)
		}
	case dataplane.FailLocal:
		if !f.derived {
			s.deriveLocked(p) // buckets start full
			return
		}
		for _, b := range f.buckets {
			b.refill(dt)
		}
	default: // dataplane.FailOpen, and unknown modes of hand-built policies
		decay := p.FailOpenDecay
		if decay <= 0 {
			decay = DefaultFailOpenDecay
		}
		f.decay = min(max(float64(f.age-ttl)/float64(decay), 0), 1)
		keep := uint64((1 - f.decay) * (1 << 32))
		if !f.derived {
			f.keep = new(atomic.Uint64)
			f.keep.Store(keep)
			s.deriveLocked(p)
			return
		}
		f.keep.Store(keep)
	}
}

// deriveLocked installs p's verdicts for its fail mode. s.mu must be held.
func (s *ServiceLimiter) deriveLocked(p *Policy) {
	old := s.table.Load()
	var b localBuckets
	if p.FailMode == dataplane.FailLocal {
		b.callers = s.callerBucketsLocked(p)
		b.leaves = make(map[leaf]*tokenBucket)
	}
	verdicts := make(map[leaf]*verdict, len(s.base))
	for k, v := range s.base { // the controller's, without provisional ratios
		verdicts[k] = s.failVerdict(p, v, b)
	}
	s.installLocked(p, old.procs, old.crit, verdicts, s.failDescriptors(old.desc, p, s.fail.keep), old.cost)
	s.fail.derived = true
}

// callerBucketsLocked returns the fail-local buckets that p's callers
// with a limit across procedures share among their leaves, by caller:
// one each, at the caller's CallerLimitRPS / LiveInstances. Leaves of one
// caller that disagree on the limit (no controller sends that) get the
// least of theirs. s.mu must be held.
func (s *ServiceLimiter) callerBucketsLocked(p *Policy) map[string]*tokenBucket {
	var rates map[string]float64
	for i := range p.Peers {
		r := &p.Peers[i]
		if r.Procedure == "" || !isLimit(r.CallerLimitRPS) {
			continue
		}
		if rates == nil {
			rates = make(map[string]float64)
		}
		if old, ok := rates[r.Peer]; !ok || r.CallerLimitRPS < old {
			rates[r.Peer] = r.CallerLimitRPS
		}
	}
	callers := make(map[string]*tokenBucket, len(rates))
	for peer, limit := range rates {
		b := newTokenBucket(limit / float64(max(p.LiveInstances, 1)))
		s.fail.buckets = append(s.fail.buckets, b)
		callers[peer] = b
	}
	return callers
}

// localBuckets are the fail-local buckets shared by several leaves: by
// caller (callerBucketsLocked), and by (peer, procedure) with tier None,
// which the tiers of a leaf share (see the fail modes above).
type localBuckets struct {
	callers map[string]*tokenBucket
	leaves  map[leaf]*tokenBucket
}

// isLimit reports whether rate is a limit: not +Inf (none), nor NaN or
// negative (a hand-built policy; PolicyFromProto refuses them).
func isLimit(rate float64) bool { return rate >= 0 && !math.IsInf(rate, 1) }

// failVerdict derives v's verdict under p's fail mode, open or local. s.mu
// must be held.
//
// What requests are told (rejections, admitted headers) stays what was
// rendered from the policy as received: the quota is still the quota, and
// the ratio the controller last saw is the best measure left of how far
// over it the caller is. Under fail mode open the ratio in force only falls from
// there, so Retry-After and the reset may err long, never short; remaining
// is as old as the policy.
//
// b are the buckets shared under fail mode local.
func (s *ServiceLimiter) failVerdict(p *Policy, v *verdict, b localBuckets) *verdict {
	r := v.rule
	if v.kind == kindUpstream {
		// This side never drops the peer, fresh or not. The upstream
		// data planes keep their last ratio when the controller is
		// gone (docs/dataplanes.md: hold), so the weights of that
		// ratio stay right.
		return v
	}
	if p.FailMode == dataplane.FailLocal {
		var caller *tokenBucket
		if r.Procedure != "" {
			caller = b.callers[r.Peer]
		}
		own := isLimit(r.LimitRPS)
		if !own && caller == nil {
			if v.admitsAll() {
				return v
			}
			// Admitted, all of it: no quota is enforced (not even a
			// share of capacity), so none is announced.
			return &verdict{rule: r, kind: v.kind, shadow: v.shadow, conc: v.conc}
		}
		var bucket *tokenBucket
		if own {
			// Shared by the leaf's tiers; a leaf without tiers is its
			// own one. Siblings that disagree on the limit (no
			// controller sends that) share the first one's.
			k := leaf{r.Peer, r.Procedure, 0}
			if bucket = b.leaves[k]; bucket == nil {
				bucket = newTokenBucket(r.LimitRPS / float64(max(p.LiveInstances, 1)))
				s.fail.buckets = append(s.fail.buckets, bucket)
				b.leaves[k] = bucket
			}
		}
		nv := &verdict{
			rule: r,
			// Ratio 1: every request is picked, and goes to the bucket.
			step:   1 << 32,
			thresh: 1 << (64 - stripeBits),
			kind:   kindLocal,
			shadow: v.shadow,
			http:   v.http, grpcErr: v.grpcErr,
			admit:  v.admit,
			bucket: bucket,
			caller: caller,
			conc:   v.conc,
		}
		if !nv.shadow && nv.http == nil {
			nv.http, nv.grpcErr = renderRejection(s.name, p.Direction, r)
		}
		return nv
	}
	if v.admitsAll() {
		return v
	}
	return &verdict{
		rule: r, step: v.step, thresh: v.thresh,
		kind: kindOpen, shadow: v.shadow, ratio: v.ratio,
		http: v.http, grpcErr: v.grpcErr,
		admit: v.admit,
		keep:  s.fail.keep,
		conc:  v.conc,
	}
}

// Status returns the state of the policy as of the last Expire.
func (s *ServiceLimiter) Status() PolicyStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.table.Load().policy
	if p == nil {
		return PolicyStatus{}
	}
	f := &s.fail
	return PolicyStatus{State: f.state, FailMode: p.FailMode, Received: f.received, Age: f.age, Decay: f.decay}
}

// Ratio returns the drop ratio in force for peer: the policy's (clamped to
// [0, 1)), decayed under fail mode open; 0 for a peer the policy does not list or
// without a policy. Under fail mode local a peer with a limit has no ratio, a
// token bucket decides: ok is false.
func (s *ServiceLimiter) Ratio(peer string) (ratio float64, ok bool) {
	return s.table.Load().ratio(leaf{peer, "", criticality.None})
}

// LeafRatio is Ratio for the leaf (peer, procedure) of a service with
// procedures.
func (s *ServiceLimiter) LeafRatio(peer, procedure string) (ratio float64, ok bool) {
	return s.LeafTierRatio(peer, procedure, criticality.None)
}

// LeafTierRatio is Ratio for the leaf (peer, procedure, tier) of a service
// with criticality.
func (s *ServiceLimiter) LeafTierRatio(peer, procedure string, tier criticality.Tier) (ratio float64, ok bool) {
	return s.table.Load().ratio(leaf{peer, procedure, tier})
}

func (t *table) ratio(k leaf) (float64, bool) {
	v := t.verdicts[k]
	switch {
	case v == nil:
		return 0, true
	case v.kind == kindLocal:
		return 0, false
	case v.kind == kindOpen:
		return v.ratio * float64(v.keep.Load()) / (1 << 32), true
	}
	return v.ratio, true
}

// failCounts are a service's fail-mode counters, summed over its peers.
type failCounts struct {
	failOpen                                 uint64
	localAdmitted, localDropped, localShadow uint64
}

func (s *ServiceLimiter) failCounts() failCounts {
	var c failCounts
	for _, sl := range s.table.Load().leaves {
		for i := range sl.e.stripes {
			st := &sl.e.stripes[i]
			c.failOpen += st.failOpen.Load()
			c.localAdmitted += st.localAdmitted.Load()
			c.localDropped += st.localDropped.Load()
			c.localShadow += st.localShadow.Load()
		}
	}
	return c
}

// tokenUnit is one token in a tokenBucket's fixed point: fractions of a
// token carry over, so a bucket refilled with 3.3 tokens per period admits
// 33 requests in ten periods, not 30.
const tokenUnit = 1 << 20

// maxTokens bounds a bucket's contents and one refill, so that their sum
// never overflows.
const maxTokens = 1 << 61

// tokenBucket is a fail-local peer's token bucket: Decide takes tokens
// without a lock (a compare-and-swap loop, which a request that finds the
// bucket empty leaves without writing), Expire refills it.
type tokenBucket struct {
	tokens atomic.Int64 // in 1/tokenUnit of a token; 0 ≤ tokens ≤ maxTokens
	// Every core that decides for the peer writes tokens: keep the next
	// bucket's counter off this cache line.
	_      [56]byte
	perSec float64 // refill, in units per second
	burst  int64   // capacity, in units
}

// newTokenBucket returns a full bucket of rate tokens per second.
func newTokenBucket(rate float64) *tokenBucket {
	b := &tokenBucket{perSec: rate * tokenUnit}
	burst := rate * LocalBurst.Seconds() * tokenUnit
	if rate > 0 {
		burst = max(burst, tokenUnit)
	}
	b.burst = int64(min(burst, maxTokens))
	b.tokens.Store(b.burst)
	return b
}

// take takes one token if there is one.
func (b *tokenBucket) take() bool {
	for {
		t := b.tokens.Load()
		if t < tokenUnit {
			return false
		}
		if b.tokens.CompareAndSwap(t, t-tokenUnit) {
			return true
		}
	}
}

// giveBack returns a token take took for a request that was dropped after
// all (its caller's bucket was empty), so that a leaf is not charged for
// requests it never admitted. A refill between the two may have filled the
// bucket: it then holds one token over its cap until the next refill,
// which brings it back down.
func (b *tokenBucket) giveBack() { b.tokens.Add(tokenUnit) }

// takeLocal takes a token from v's own bucket and one from its caller's,
// each when it has one, and reports whether it got every token it needed;
// it keeps none when it did not. Lock-free, allocation-free: the request
// path of fail mode local.
func (v *verdict) takeLocal() bool {
	if v.bucket != nil && !v.bucket.take() {
		return false
	}
	if v.caller == nil || v.caller.take() {
		return true
	}
	if v.bucket != nil {
		v.bucket.giveBack()
	}
	return false
}

// refill adds dt's worth of tokens, up to the burst and a fraction of a
// token; a refill larger than the burst (Expire ran late) is kept whole, so
// that a late refill does not lose rate.
//
// The fraction is the part of a token a drained bucket carries over. A
// bucket that a steady excess drains at every refill holds only that part
// when the next refill brings a burst's worth; capped at the burst, it lost
// the part each time and admitted whole tokens only: 2 of 2.5 a refill, 20
// of a 25 rps share (the controller-outage scenario's live run at 1 %).
func (b *tokenBucket) refill(dt time.Duration) {
	add := int64(min(math.Round(b.perSec*dt.Seconds()), maxTokens))
	limit := max(b.burst, add) + tokenUnit - 1
	for {
		t := b.tokens.Load()
		n := min(t+add, limit)
		if n == t || b.tokens.CompareAndSwap(t, n) {
			return
		}
	}
}
