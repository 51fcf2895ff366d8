package sidecar

import (
	"cmp"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/heavy"
	"github.com/sluicehq/sluice/pkg/names"
)

// Strategy says how a Limiter turns a drop ratio into individual drops.
type Strategy uint8

const (
	// Diffuse is error diffusion: the k-th request of a bucket's counter
	// stripe is dropped when round(k·p) steps up, so the first k requests of
	// a stripe see exactly round(k·p) drops, and n requests of a bucket see
	// n·p drops give or take 4 (half its 8 stripes; a leaf priced by its
	// requests counts in 4 packed words: see packShift): no randomness in the
	// count, and at p ≥ 0.5 the first request is already dropped. A ratio
	// change restarts the rounding at the stripe's count, which can cost
	// one more drop or admit per stripe. The default.
	Diffuse Strategy = iota
	// Random drops each request independently with probability p, drawn
	// from the math/rand/v2 global source (allocation free, per-thread).
	Random
)

func (s Strategy) String() string {
	switch s {
	case Diffuse:
		return "diffuse"
	case Random:
		return "random"
	}
	return "Strategy(unknown)"
}

// DefaultMaxPeers is LimiterOptions.MaxPeers when it is not set.
const DefaultMaxPeers = 1024

// DefaultMaxLeaves is LimiterOptions.MaxLeaves when it is not set.
const DefaultMaxLeaves = 4096

// DefaultPeerIdle is LimiterOptions.PeerIdle when it is not set: sixty of
// the sidecar's default report intervals.
const DefaultPeerIdle = time.Minute

// LimiterOptions configure a Limiter. The zero value is ready to use.
type LimiterOptions struct {
	// MaxPeers bounds the distinct observed peers a service keeps counters
	// for, so that callers naming themselves at random can not grow
	// memory. Observed peers are the ones a request named and the policy
	// does not limit (see Rule.Limited). Once a service has MaxPeers of
	// them, requests from any other unlimited peer are counted and judged
	// as names.Overflow. Peers the policy limits always have counters of
	// their own and do not count against it, and neither do the reserved
	// peers names.Unknown and names.Overflow. 0 means DefaultMaxPeers.
	MaxPeers int
	// MaxLeaves is MaxPeers for a service whose policy declares
	// procedures or criticality: it bounds the distinct observed leaves
	// (peer, procedure, tier) the service keeps counters for; a caller
	// of four tiers fills four. Once a service has MaxLeaves of them, a
	// request of any other unlimited leaf (c, q, t) is counted and judged
	// as (names.Overflow, q, t). Leaves the policy limits, and the
	// reserved peers' leaves of every procedure and tier, do not count
	// against it. 0 means DefaultMaxLeaves.
	MaxLeaves int
	// PeerIdle is how long an observed peer keeps its counters without a
	// request: Expire evicts it then, which frees its place for another
	// caller, and a later request from it starts fresh counters under a
	// new PeerCounts.Incarnation. Limited peers are never evicted. A
	// holder that reads the counters periodically (sidecar/reporter) must
	// read them more often than PeerIdle, or the last requests of an
	// evicted peer go unread. 0 means DefaultPeerIdle; negative never
	// evicts. Without calls to Expire nothing is evicted.
	PeerIdle time.Duration
	// Strategy is how ratios become drops; an unknown value means Diffuse.
	Strategy Strategy
	// OneStripe counts every Diffuse decision on one counter stripe, so
	// that a single-threaded caller gets the same decisions in every run,
	// whatever the addresses of its goroutine's stack: the simulator needs
	// that. It costs contention when several cores decide at once.
	OneStripe bool

	// DescriptorCounters is the number of slots (a value's fingerprint
	// and count) of each descriptor's sketch per window
	// (heavy.Options.Counters): memory is 16 bytes per slot per
	// descriptor (two windows), whatever the number of values. 0 means
	// DefaultDescriptorCounters.
	DescriptorCounters int
	// DescriptorHeavy bounds the heavy values of each descriptor's sketch
	// per window (heavy.Options.K), and so the values of a descriptor in
	// one report. 0 means DefaultDescriptorHeavy.
	DescriptorHeavy int
	// DescriptorWindow is the window the local allowances are sized for:
	// the interval between RotateDescriptors calls, the sidecar's report
	// interval. 0 means DefaultDescriptorWindow.
	DescriptorWindow time.Duration
}

// Limiter decides requests locally from the drop policies it holds and counts
// what it saw, per (service, peer), or per (service, peer, procedure) for a
// service whose policy declares procedures (see procedures.go).
//
// A Limiter serves one direction: a sidecar that enforces both inbound
// ("callee/<svc>") and outbound ("caller/<svc>") policies keeps two Limiters,
// because callers and callees of the same service are different peers and
// are reported separately.
//
// All methods are safe for concurrent use. Decide never blocks on a lock and
// allocates nothing in the steady state (after a service's and a peer's
// first sighting); see ServiceLimiter.Decide.
type Limiter struct {
	maxPeers   int
	maxLeaves  int
	peerIdle   time.Duration // < 0: never evict
	random     bool
	stripeMask uint64 // nStripes-1, or 0 with OneStripe
	descOpts   heavy.Options
	descWindow time.Duration

	// services is an immutable map, replaced (copy on write) under mu when a
	// service is added. Services are never removed.
	services atomic.Pointer[map[string]*ServiceLimiter]
	mu       sync.Mutex // serialises writers of services
}

// NewLimiter returns a Limiter that holds no policy: it admits everything and
// counts it.
func NewLimiter(opts LimiterOptions) *Limiter {
	l := &Limiter{maxPeers: opts.MaxPeers, maxLeaves: opts.MaxLeaves, peerIdle: opts.PeerIdle, random: opts.Strategy == Random, stripeMask: nStripes - 1}
	if opts.OneStripe {
		l.stripeMask = 0
	}
	if l.maxPeers <= 0 {
		l.maxPeers = DefaultMaxPeers
	}
	if l.maxLeaves <= 0 {
		l.maxLeaves = DefaultMaxLeaves
	}
	if l.peerIdle == 0 {
		l.peerIdle = DefaultPeerIdle
	}
	l.descOpts, l.descWindow = opts.descOptions(), cmp.Or(opts.DescriptorWindow, DefaultDescriptorWindow)
	if l.descWindow < 0 {
		l.descWindow = DefaultDescriptorWindow
	}
	m := map[string]*ServiceLimiter{}
	l.services.Store(&m)
	return l
}

// Decide decides one request to service from peer and counts it. peer is
// the caller for inbound enforcement, the callee for outbound; "" counts as
// names.Unknown. service is the sidecar's own configured service, never a
// value taken from the request: the first sighting of a service creates its
// table. Callers that know their service up front should bind it with
// Service and call ServiceLimiter.Decide, which skips one map lookup.
func (l *Limiter) Decide(service, peer string) Decision {
	if s := (*l.services.Load())[service]; s != nil {
		return s.Decide(peer)
	}
	return l.Service(service).Decide(peer)
}

// Service returns the bound handle for service, creating its (empty) table
// on first use. The handle stays valid for the Limiter's life and sees every
// later policy of the service.
func (l *Limiter) Service(name string) *ServiceLimiter {
	if s := (*l.services.Load())[name]; s != nil {
		return s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.services.Load()
	if s := old[name]; s != nil {
		return s
	}
	s := newServiceLimiter(strings.Clone(name), l.maxPeers, l.random, l.stripeMask)
	s.peerIdle, s.maxLeaves = l.peerIdle, l.maxLeaves
	s.descOpts, s.descWindow = l.descOpts, l.descWindow
	m := maps.Clone(old)
	m[s.name] = s
	l.services.Store(&m)
	return s
}

func (l *Limiter) lookup(service string) *ServiceLimiter { return (*l.services.Load())[service] }

// SetPolicy makes p the policy of p.Service, replacing the previous one; a
// nil p is ignored. The swap is atomic: a concurrent Decide sees either the
// old policy for every peer or the new one for every peer. p must not be
// modified afterwards (see Policy). SetPolicy does not validate p (that is
// PolicyFromProto's job) but stays safe with hand-built policies: ratios
// outside [0, 1) are clamped, peers with invalid names are ignored because
// Decide never accounts a request to them.
//
// The new policy is fresh: whatever fail mode the previous one was in ends
// here. Its TTL runs from the next Expire; a holder that knows when it
// received p calls SetPolicyAt instead.
func (l *Limiter) SetPolicy(p *Policy) {
	if p == nil {
		return
	}
	l.Service(p.Service).setPolicy(p, time.Time{})
}

// SetPolicyAt is SetPolicy for a holder that acts on policy TTLs (see
// Expire): now is when p was received, on the holder's own clock, and p's
// TTL runs from it (not from p.IssuedAt: the controller's clock is not
// this machine's). A zero now is SetPolicy's "from the next Expire".
func (l *Limiter) SetPolicyAt(p *Policy, now time.Time) {
	if p == nil {
		return
	}
	l.Service(p.Service).setPolicy(p, now)
}

// Expire brings every service's policy state up to date at now (see
// PolicyState) and puts the policy's fail mode in force once its TTL has run
// out without a new policy: open lowers the ratios in force towards 0 over
// the decay window, hold keeps them, local has a token bucket per limited
// peer decide instead (see dataplane.FailMode). It also refills those token
// buckets. Decide never reads a clock: a holder that wants fail modes
// calls Expire periodically (the sidecar agent every 100ms), and the decay
// and refills move in steps of that period. Without Expire a policy is kept
// for ever, as it was before fail modes.
//
// Expire also evicts the observed peers that have been idle for
// LimiterOptions.PeerIdle (see evictIdle).
//
// now must not go backwards between calls; Expire is cheap (a lock and a
// few loads per service, a read of every peer's counters every PeerIdle/8,
// and a new table once when a policy expires or a peer is evicted).
func (l *Limiter) Expire(now time.Time) {
	for _, s := range *l.services.Load() {
		s.expire(now)
		s.evictIdle(now)
	}
}

// Status returns the state of service's policy as of the last Expire; the
// zero PolicyStatus (NoPolicy) for a service it has no table for.
func (l *Limiter) Status(service string) PolicyStatus {
	if s := l.lookup(service); s != nil {
		return s.Status()
	}
	return PolicyStatus{}
}

// RemovePolicy drops service's policy, if any: every peer is admitted again.
// Counters are kept.
func (l *Limiter) RemovePolicy(service string) {
	if s := l.lookup(service); s != nil {
		s.setPolicy(nil, time.Time{})
	}
}

// Policy returns the current policy of service, nil if it has none.
func (l *Limiter) Policy(service string) *Policy {
	if s := l.lookup(service); s != nil {
		return s.Policy()
	}
	return nil
}

// AppendCounts appends the cumulative counters of every bucket of service
// (names.Unknown and names.Overflow included, even at zero) to dst, sorted by
// peer, procedure and tier, and returns the extended slice. An unknown service appends nothing.
// An evicted peer is left out; see PeerCounts.Incarnation.
func (l *Limiter) AppendCounts(service string, dst []PeerCounts) []PeerCounts {
	if s := l.lookup(service); s != nil {
		return s.AppendCounts(dst)
	}
	return dst
}

// Services returns the names of the services the Limiter has tables for,
// sorted.
func (l *Limiter) Services() []string {
	return slices.Sorted(maps.Keys(*l.services.Load()))
}

// Decision is the verdict on one request: a small value, free to copy.
type Decision struct {
	Drop   bool // reject the request: an enforced ratio picked it
	Shadow bool // a shadow ratio picked it; the request is admitted
	// owed is, for a service with a costTable (see cost.go), what Done
	// owes the request: its flags (holdsSlot, responsePriced,
	// priceFromHeader) in the top byte and its price in milli-units
	// below; 0 otherwise. One field, not two: the compiler keeps a struct
	// of at most four fields in registers, and copies a larger one
	// through memory, which cost every decision about 5 ns.
	owed uint64
	// v is the verdict the request was decided under: a bucket's, or a
	// descriptor's (v.desc set) for a drop by DecideDescriptor. Under a
	// policy with a costTable every leaf has one (see meterLocked).
	v *verdict
}

// Rule returns the rule the decision was made under, nil when the policy did
// not list the bucket (or there was no policy). It points into the Policy that
// was current, which is immutable: do not modify it. Once that policy has
// expired, the rule is still the policy's as received: the ratio in force
// may be lower (ServiceLimiter.Ratio).
func (d Decision) Rule() *Rule {
	if d.v == nil {
		return nil
	}
	return d.v.rule
}

// verdict is a Rule compiled for the hot path. Immutable, but for the
// atomics that the fail modes of an expired policy keep in it.
type verdict struct {
	rule *Rule
	// desc is set, and rule nil, on the verdict of a descriptor's drops
	// (see DecideDescriptor): its rejection names the descriptor.
	desc *DescriptorPolicy
	// step is the ratio in 32.32 fixed point: Diffuse drops the k-th
	// request of a stripe when (k-1)·step + ½ and k·step + ½ have different
	// integer parts.
	step uint64
	// thresh is the ratio scaled to 2^(64-stripeBits): Random drops when
	// the random bits above the stripe index are below it.
	thresh uint64
	// kind says what a request that the ratio picked gets (see hitOther).
	kind verdictKind
	// shadow: the rule is in shadow mode. Redundant with kindShadow; the
	// fail-mode kinds need it.
	shadow bool
	// ratio is the ratio step and thresh encode, clamped to [0, 1).
	ratio float64
	// Pre-rendered rejections, set only when the verdict can drop (enforced
	// and ratio > 0, or a token bucket), so that the drop path does no
	// formatting.
	http    *httpRejection
	grpcErr error
	// admit is what an admitted request is told about its quota when the
	// middleware or interceptors are asked to (RateLimitHeaders); nil when
	// the rule announces nothing (renderAdmit) and in outbound policies,
	// whose admitted requests are answered by the callee.
	admit *admitHeaders

	// Fail modes only (see failmode.go).
	keep   *atomic.Uint64 // kindOpen: the share of picked requests still dropped, 32.32; Expire lowers it
	bucket *tokenBucket   // kindLocal: the leaf's own; nil when it has no limit of its own
	caller *tokenBucket   // kindLocal: shared by the caller's leaves (failmode.go); nil: none

	// conc is, for a rule with a concurrency cap (not enforced
	// upstream), the verdict of a request refused because the sidecar's
	// share of the cap is taken: the same rule, its own rejection. nil:
	// no cap.
	conc *verdict
	// m is the leaf's meter under a policy with a costTable: every leaf
	// of such a table has a verdict, an unlisted one a verdict without a
	// rule that admits everything (see meterLocked). nil otherwise.
	m *meter

	// kindUpstream only: the requests each arrival stands for that the
	// upstream data plane dropped, p/(1−p), in 1/upstreamOne units:
	// round(upstreamOne/(1−p)) − upstreamOne.
	upWeight uint64
}

// verdictKind is what happens to a request that a verdict's ratio picked.
type verdictKind uint8

const (
	kindEnforce  verdictKind = iota // dropped: the fresh path
	kindShadow                      // counted as shadow dropped, admitted
	kindOpen                        // expired, fail-open: dropped with the decaying share keep, else admitted and counted as fail-open
	kindLocal                       // expired, fail-local: every request is picked, and the token buckets decide
	kindUpstream                    // enforced upstream: every request is picked, admitted, and counts upWeight inferred drops
)

// upstreamOne is one request in the fixed point of the inferred upstream
// drops: 2^16, so that the weight of a ratio is exact to 2^-17 of a request
// per arrival, and 2^48 inferred drops (2.8·10^14: nine years at a million
// a second) fit a counter before it wraps.
const upstreamOne = 1 << 16

// maxUpstreamRatio bounds the ratio an upstream weight is computed from: at
// p → 1 an arrival would stand for an unbounded number of requests. The law
// never publishes 1 (its p_max defaults to 0.99); at 0.999 an arrival stands
// for 1,000 requests, and any ratio above counts as 0.999.
const maxUpstreamRatio = 0.999

// upstreamWeight is verdict.upWeight for ratio p, already clamped to
// [0, 1).
func upstreamWeight(p float64) uint64 {
	p = min(p, maxUpstreamRatio)
	return uint64(math.Round(upstreamOne/(1-p))) - upstreamOne
}

// clampRatio is a rule's ratio as the Limiter applies it: NaN and
// negatives are 0, and 1 or more is just below 1.
func clampRatio(p float64) float64 {
	if !(p > 0) { // also NaN
		return 0
	}
	return min(p, math.Nextafter(1, 0))
}

// compile compiles rule r of service's policy for direction dir, and renders
// what its requests are told (see headers.go): once per policy, so that no
// request formats anything.
func compile(service string, dir Direction, r *Rule) *verdict {
	p := clampRatio(r.DropRatio)
	var admit *admitHeaders
	if dir == Inbound {
		admit = renderAdmit(service, r, p)
	}
	if r.upstream() {
		// Picked, every request (as kindLocal), so that the fresh
		// path of the other verdicts pays nothing for this one: its
		// work is in hitOther. Never dropped, so no rejection is
		// rendered.
		return &verdict{
			rule: r, ratio: p, kind: kindUpstream,
			step: 1 << 32, thresh: 1 << (64 - stripeBits),
			upWeight: upstreamWeight(p),
			admit:    admit,
		}
	}
	v := &verdict{
		rule:   r,
		step:   uint64(p * (1 << 32)),
		thresh: uint64(p * (1 << (64 - stripeBits))),
		shadow: r.Mode == dropratio.Shadow,
		ratio:  p,
		admit:  admit,
	}
	if v.shadow {
		v.kind = kindShadow
	}
	if !v.shadow && (v.step != 0 || v.thresh != 0) {
		v.http, v.grpcErr = renderRejection(service, dir, r)
	}
	return v
}

// admitsAll reports whether v's ratio never picks a request.
func (v *verdict) admitsAll() bool { return v.step == 0 && v.thresh == 0 }

const (
	stripeBits = 3
	nStripes   = 1 << stripeBits
)

// stripe is one cache line of an entry's counters. Decide spreads requests
// over the stripes (Diffuse by goroutine, see stackStripe; Random by its
// coin) so that cores hitting the same peer rarely share a line; readers sum
// the stripes.
//
// offered doubles as Diffuse's sequence number, so the common case, an
// admitted request, costs a single atomic add. It is incremented before
// dropped and shadow; see ServiceLimiter.AppendCounts. A request priced on
// its own is counted in its meter's packed word instead (see packShift),
// whose count is then its sequence number.
//
// The other five count only while a policy has expired and its fail mode is
// in force; they fill the rest of the line (a test checks that a stripe is
// one line).
type stripe struct {
	offered atomic.Uint64
	dropped atomic.Uint64
	shadow  atomic.Uint64

	picked        atomic.Uint64 // fail-open: requests the policy's own ratio picked; the sequence that thins them out
	failOpen      atomic.Uint64 // fail-open: of those, admitted (enforced rules only)
	localAdmitted atomic.Uint64 // fail-local: a token was taken
	localDropped  atomic.Uint64 // fail-local: no token; dropped. Part of the peer's Dropped
	localShadow   atomic.Uint64 // fail-local: no token, but the rule is shadow; admitted. Part of the peer's ShadowDropped
}

// entry holds the counters of one peer of one service. stripes comes first
// and the entry is larger than 512 bytes, so the Go allocator puts it in a
// size class that is a multiple of 64 bytes and every stripe starts on its
// own cache line. If that ever stops being true, only speed suffers.
type entry struct {
	stripes [nStripes]stripe
	// up counts the requests of the peer while it is enforced upstream.
	// Apart from stripes, so that a stripe stays one cache line, and
	// packed (four stripes' counters share a line): only upstream-enforced
	// peers write them, and they cost every peer 128 bytes, not 512.
	up          [nUpStripes]upCounters
	peer        string
	incarnation uint64 // see PeerCounts.Incarnation
	// meter is the leaf's cost and concurrency counters, once a policy
	// with a costTable has been installed (see cost.go); never removed.
	meter atomic.Pointer[meter]

	// Idleness, as the last sweeps saw it (see evictIdle); guarded by
	// the ServiceLimiter's mu.
	seen     uint64    // offered as of activeAt
	activeAt time.Time // the sweep that first saw offered at seen; zero: not swept yet
}

// nUpStripes is the number of upstream counter pairs per entry: one per
// stripe.
const nUpStripes = nStripes

// upCounters are one stripe's counters of an upstream-enforced peer.
type upCounters struct {
	arrived  atomic.Uint64 // requests that arrived, admitted undecided; in the leaf's offered too
	inferred atomic.Uint64 // requests the upstream data plane dropped, inferred, in 1/upstreamOne units
}

// counts sums e's counters. The inferred upstream drops, whole requests,
// count in both Offered and Dropped (so the reporter carries them to the
// controller), and are returned on their own too; their fraction stays in
// the fixed-point counters and carries over to the next call, so that
// successive snapshots never lose a part of a request. Reading dropped
// before offered keeps Dropped ≤ Offered (see AppendCounts).
func (e *entry) counts() (c PeerCounts, arrived, inferred uint64) {
	var fixed uint64
	for i := range e.up {
		arrived += e.up[i].arrived.Load()
		fixed += e.up[i].inferred.Load()
	}
	for i := range e.stripes {
		st := &e.stripes[i]
		c.ShadowDropped += st.shadow.Load() + st.localShadow.Load()
		c.Dropped += st.dropped.Load() + st.localDropped.Load()
		c.Offered += st.offered.Load()
	}
	if m := e.meter.Load(); m != nil {
		n, _, _ := m.fold()
		c.Offered += n
	}
	inferred = fixed / upstreamOne
	c.Offered += inferred
	c.Dropped += inferred
	return c, arrived, inferred
}

// incarnations numbers entries, so that no two have the same incarnation.
var incarnations atomic.Uint64

func newEntry(peer string) *entry { return &entry{peer: peer, incarnation: incarnations.Add(1)} }

// slot is what the peer table maps a name to: the peer's counters and its
// current verdict (nil: not listed, admit).
type slot struct {
	e *entry
	v *verdict
}

// random decides a request under Random. The coin picks the stripe too.
// (Decide does Diffuse itself.)
func (sl slot) random() Decision {
	r := rand.Uint64()
	i := r & (nStripes - 1)
	st := &sl.e.stripes[i]
	st.offered.Add(1)
	if sl.v == nil || r>>stripeBits >= sl.v.thresh {
		return Decision{v: sl.v} // a nil v: not listed, admit
	}
	if sl.v.kind != kindEnforce {
		return sl.v.hitOther(sl.e, i)
	}
	st.dropped.Add(1)
	return Decision{Drop: true, v: sl.v}
}

// hitOther decides a request that v's ratio picked, already counted as
// offered in e's stripe i, when v is not a plain enforced verdict: a shadow
// rule, an upstream-enforced one, or a fail mode of an expired policy (see
// failmode.go). Decide and random write out the enforced drop, the fresh
// policy's case, themselves:
//
//	if v.kind != kindEnforce {
//		return v.hitOther(e, i)
//	}
//	st.dropped.Add(1)
//	return Decision{Drop: true, v: v}
//
// As a method, with its call to hitOther, that is too large to inline, and
// the call cost the drop path about 3 ns.
func (v *verdict) hitOther(e *entry, i uint64) Decision {
	st := &e.stripes[i]
	switch v.kind {
	case kindUpstream:
		// Admitted: the upstream data plane has decided it. It was
		// counted offered as it arrived; it stands for upWeight more
		// requests, offered and dropped before they got here.
		u := &e.up[i&(nUpStripes-1)]
		u.arrived.Add(1)
		u.inferred.Add(v.upWeight)
		return Decision{v: v}
	case kindOpen:
		// The policy's own ratio picked this request; of those, the
		// share keep is still dropped, by error diffusion over the
		// stripe's picked requests, so that dropped ≈ picked·keep and
		// failOpen ≈ picked·(1-keep), give or take one per stripe.
		if diffuseHit(st.picked.Add(1), v.keep.Load()) {
			return v.pickedDrop(st)
		}
		if !v.shadow {
			st.failOpen.Add(1)
		}
		return Decision{v: v}
	case kindLocal:
		if v.takeLocal() {
			st.localAdmitted.Add(1)
			return Decision{v: v}
		}
		// localDropped and localShadow count in Dropped and
		// ShadowDropped too (AppendCounts adds them), so that the
		// drop path, the common one in an overload, costs one add.
		if v.shadow {
			st.localShadow.Add(1)
			return Decision{Shadow: true, v: v}
		}
		st.localDropped.Add(1)
		return Decision{Drop: true, v: v}
	}
	return v.pickedDrop(st) // kindShadow
}

// pickedDrop drops a picked request, or counts it as shadow dropped under a
// shadow rule.
func (v *verdict) pickedDrop(st *stripe) Decision {
	if v.shadow {
		st.shadow.Add(1)
		return Decision{Shadow: true, v: v}
	}
	st.dropped.Add(1)
	return Decision{Drop: true, v: v}
}

// stackStripe picks a counter stripe for Diffuse without a random number
// (math/rand/v2 costs about 6 ns, a third of a decision): it hashes the
// address of a variable on the calling goroutine's stack. Goroutines that
// run at the same time have different stacks, so they spread over the
// stripes about as random choices would, and a goroutine keeps its stripe
// (and that cache line) from one request to the next.
//
// Spreading is all that is needed, not uniqueness. Goroutines that land on
// the same stripe share its sequence: the atomic add still gives each
// request its own k, so each stripe stays its own exact sequence, and
// Diffuse's bound holds however requests are spread over the stripes. A
// collision costs only cache-line contention, as it did with random
// stripes.
//
// The address is only hashed, never turned back into a pointer, so a stack
// that moves between calls merely moves its goroutine to another stripe.
// x does not escape (go build -gcflags=-m), so this allocates nothing;
// TestDecideAllocatesNothing would catch it if that changed.
func stackStripe() uint64 {
	var x byte
	// Fibonacci hashing: the top bits of the product depend on all the
	// bits of the address below them, the per-goroutine ones included.
	return uint64(uintptr(unsafe.Pointer(&x))) * 0x9e3779b97f4a7c15 >> (64 - stripeBits)
}

// diffuseHit reports whether the k-th request (k ≥ 1) at ratio step/2^32 is
// dropped: whether round(k·p) > round((k-1)·p), rounding half up.
func diffuseHit(k, step uint64) bool { return diffuseFrom(k, step, 1<<31) }

// diffuseFrom is error diffusion from phase (of 2^32; 2^31 rounds half
// up): whether the integer part of phase + k·p passes one more step at the
// k-th request. Computed in wrapping fixed point: only whether the integer
// part changes matters, and a wrap past 2^64 is such a change. It inlines.
func diffuseFrom(k, step, phase uint64) bool {
	x := (k-1)*step + phase
	return (x+step)>>32 != x>>32
}

// table is an immutable snapshot of one service's leaves and policy.
type table struct {
	// leaves holds every leaf with counters: the reserved peers' of every
	// procedure, the limited ones, the observed ones, and stale ones, whose
	// procedure an earlier policy declared and this one does not: they are
	// counted and reported no more, and evicted once idle (evictIdle).
	leaves   map[leaf]slot
	index    peerTable   // the current (not stale) leaves, for Decide's lookup
	procs    *procedures // the policy's procedures; noProcedures without
	crit     *critTable  // the policy's criticality; nil without
	unknown  []slot      // by reservedAt(index): leaves[{names.Unknown, procedure, tier}]
	overflow []slot      // by reservedAt(index): leaves[{names.Overflow, procedure, tier}]
	counted  int         // observed leaves (see observed); new ones are added while it is under limit
	limit    int         // MaxPeers, or MaxLeaves for a service with procedures or criticality
	policy   *Policy
	verdicts map[leaf]*verdict  // the policy compiled, by leaf, for leaves added later
	desc     *descTable         // the policy's descriptors compiled; nil: none
	cost     *costTable         // the policy's pricing and caps compiled; nil: none (see cost.go)
	health   []*health.Recorder // by procedure index: what the callee does with admitted requests
}

// ServiceLimiter is a Limiter bound to one service: it skips the service
// lookup. Safe for concurrent use.
type ServiceLimiter struct {
	name       string
	maxPeers   int
	maxLeaves  int
	peerIdle   time.Duration // see LimiterOptions.PeerIdle; < 0: never evict
	random     bool
	stripeMask uint64 // see LimiterOptions.OneStripe

	// table is replaced, never modified. Readers load it once per decision;
	// writers build a new one under mu: a new peer's first sighting,
	// policy swaps and evictions.
	table atomic.Pointer[table]
	mu    sync.Mutex // serialises writers of table; guards fail, sweptAt and the entries' idleness

	fail failState // the policy's age and fail mode; see failmode.go
	// base is the current policy's verdicts as the controller set them,
	// and prov the provisional ratios laid over them in the table (see
	// provisional.go).
	base    map[leaf]*verdict
	prov    map[leaf]Provisional
	sweptAt time.Time // the last sweep for idle peers; see evictIdle
	evicted atomic.Uint64

	invalidPeers atomic.Uint64    // requests whose peer name failed the name check
	critInvalid  atomic.Uint64    // requests whose tier header named no tier: see critTable.resolve
	critLowered  atomic.Uint64    // requests whose tier claim was above their caller's max
	upstream     atomic.Uint64    // inbound requests their caller had decided already (DecidedHeader); see client.go
	costInvalid  [2]atomic.Uint64 // by source (costFromRequest, costFromResponse): costs that were not a finite number ≥ 0
	costClamped  [2]atomic.Uint64 // by source: costs above the policy's max
	costMax      atomic.Uint64    // the current policy's max cost, milli-units, for Done
	concDropped  atomic.Uint64    // requests refused for their bucket's concurrency share
	ident        identityCounts

	descOpts   heavy.Options
	descWindow time.Duration
	descStates map[string]*descState // by descriptor name, those the current policy names; guarded by mu
	// recorders count what the callee does with admitted requests, by
	// procedure name (see upstream.go); guarded by mu.
	recorders map[string]*health.Recorder
}

func newServiceLimiter(name string, maxPeers int, random bool, stripeMask uint64) *ServiceLimiter {
	s := &ServiceLimiter{name: name, maxPeers: maxPeers, maxLeaves: DefaultMaxLeaves, random: random, stripeMask: stripeMask}
	unknown, overflow := slot{e: newEntry(names.Unknown)}, slot{e: newEntry(names.Overflow)}
	t := &table{
		leaves:   map[leaf]slot{{names.Unknown, "", criticality.None}: unknown, {names.Overflow, "", criticality.None}: overflow},
		procs:    noProcedures,
		unknown:  []slot{unknown},
		overflow: []slot{overflow},
		limit:    maxPeers,
	}
	t.health = s.healthRecorders(t.procs)
	t.index = newPeerTable(t.leaves, t.procs, t.crit)
	s.table.Store(t)
	return s
}

// Name returns the service name.
func (s *ServiceLimiter) Name() string { return s.name }

// Policy returns the current policy as received, nil if none. Once it has
// expired, the ratios in force may differ from its rules': see Ratio and
// Status.
func (s *ServiceLimiter) Policy() *Policy { return s.table.Load().policy }

// Decide decides one request from peer and counts it. It is the hot path:
// no allocation and no lock once peer has been seen, and none for names that
// land on a reserved peer:
//   - "" counts as names.Unknown;
//   - a name that is not a valid service name (names.Check: too long, odd
//     characters) counts as names.Unknown too: the caller has not told us who
//     it is in a form we accept. The hostile string is never stored;
//   - a new valid name is added to the table (this first sighting allocates
//     and briefly takes a lock) unless the table already holds MaxPeers
//     observed peers, in which case it counts as names.Overflow. A peer
//     the policy limits is always in the table already.
//
// Decide knows no procedure: for a service whose policy declares
// procedures it counts and decides the request in the leaf (peer,
// names.Other). Requests whose procedure is known go through DecideHTTP
// or DecideGRPC. Nor does it know a tier header: for a service with
// criticality the request takes the defaults (see DecideTier).
//
// Concurrent callers may assume that every call is counted exactly once and
// that the decision follows one policy snapshot.
//
// Cost: one atomic load, one peerTable lookup (for a name of at most 16
// bytes: one multiply and three compares) and one atomic add (two when the
// request is dropped or shadow dropped); Random adds a random number. The
// goal is ≤ 15 ns and 0 allocations per call; BenchmarkDecide measures it.
// An expired policy's fail mode (see Limiter.Expire) costs nothing on this
// path: it is a different verdict in the table, and its work starts where
// a drop's would (see hitOther).
func (s *ServiceLimiter) Decide(peer string) Decision {
	return s.decide(s.table.Load(), peer, 0, "", "", 0)
}

// DecideTier is Decide for a request whose tier header (CriticalityHeader)
// has the value tierValue, "" when it has none: for a service with
// criticality the leaf is the request's tier's (see CriticalityPolicy),
// and a value that names no tier takes the default (counted, as is a
// claim lowered to the caller's max); for a service without it is
// Decide. No allocation.
func (s *ServiceLimiter) DecideTier(peer, tierValue string) Decision {
	return s.decide(s.table.Load(), peer, 0, tierValue, "", 0)
}

// DecideHTTP is Decide for an HTTP request of method to path (its
// URL.Path, without the query): the leaf is peer's of the procedure the
// policy's first matching route names (routes.Routes.MatchIndex); a path
// that is a declared procedure, the full method of a gRPC call through an
// HTTP proxy, is that procedure's; any other request is names.Other's. For
// a service without procedures it is Decide. No allocation; the match adds
// its cost to Decide's (BenchmarkDecideProcedure).
//
// For a service with criticality the request takes the defaults; an edge
// that has the request's headers calls DecideHTTPTier.
func (s *ServiceLimiter) DecideHTTP(peer, method, path string) Decision {
	return s.DecideHTTPTier(peer, method, path, "")
}

// DecideHTTPTier is DecideHTTP for a request whose tier header
// (CriticalityHeader) has the value tierValue, "" when it has none: see
// DecideTier. No allocation.
func (s *ServiceLimiter) DecideHTTPTier(peer, method, path, tierValue string) Decision {
	t := s.table.Load()
	return s.decide(t, peer, t.procs.http(method, path), tierValue, "", 0)
}

// DecideGRPC is Decide for a gRPC call of fullMethod ("/pkg.Service/Method",
// grpc.UnaryServerInfo.FullMethod): the leaf is peer's of that procedure
// when the policy declares it, else of names.Other. For a service without
// procedures it is Decide. No allocation: the method is looked up in a
// hash table of the declared names built once per policy.
//
// For a service with criticality the call takes the defaults; an edge that
// has the call's metadata calls DecideGRPCTier.
func (s *ServiceLimiter) DecideGRPC(peer, fullMethod string) Decision {
	return s.DecideGRPCTier(peer, fullMethod, "")
}

// DecideGRPCTier is DecideGRPC for a call whose tier metadata
// (CriticalityHeader) has the value tierValue, "" when it has none: see
// DecideTier. No allocation.
func (s *ServiceLimiter) DecideGRPCTier(peer, fullMethod, tierValue string) Decision {
	t := s.table.Load()
	return s.decide(t, peer, t.procs.grpc(fullMethod), tierValue, "", 0)
}

// decide decides a request of peer to the procedure of index proc of t,
// whose tier header has the value tierValue ("": none), in its leaf: for
// a service with criticality, the leaf of the tier tierIndex resolves;
// else index proc's. The tier is resolved here, not by the callers, so
// that Decide stays small enough to inline. A service whose policy meters
// its leaves (a price, a cap) is priced by costValue, its cost header's
// value ("": none), or by hits when above 0 (DecideHits); its uncapped
// leaves priced statically or by the request alone are decided here, the
// rest by decideMetered, in the leaf found here.
func (s *ServiceLimiter) decide(t *table, peer string, proc uint32, tierValue, costValue string, hits uint64) Decision {
	idx := proc
	if t.crit != nil {
		idx = s.tierIndex(t, peer, proc, tierValue)
	}
	var sl slot
	ok := false
	if len(peer) <= names.MaxLen { // do not hash a hostile megabyte
		sl, ok = t.index.get(peer, idx)
	}
	if !ok {
		sl = s.miss(t, peer, idx)
	}
	h := stackStripe() // one stripe of each kind for the request: counts and costs
	var owed, k uint64
	var cs *costStripe // a leaf priced by its request: a drop adds its price to cs.drop
	if c := t.cost; c != nil {
		// A leaf without a cap, priced statically or by its request alone
		// (a header's value, a hits), is decided here, as any leaf is: a
		// static price adds nothing per request (the reporter multiplies
		// the leaf's requests by it: mult), and a request's own price is
		// counted with the request, in one add of a packed word (see
		// packShift). The rest, and a header value that is not a plain
		// cost (counted as such), are decideMetered's.
		if !c.lean || s.random || sl.v == nil || sl.v.conc != nil || sl.v.m == nil || (hits > 0 && !c.dynamic) {
			return s.decideMetered(t, sl, proc, costValue, hits)
		}
		if c.priced {
			var price uint64
			var flags uint8
			if !c.dynamic {
				price = c.static[proc]
			} else {
				if hits > 0 {
					price, flags = s.hitsPrice(c, hits), priceFromHeader
				} else if v, st := parseCost(costValue, c.max); st == costOK {
					price, flags = v, priceFromHeader
				} else if costValue != "" {
					return s.decideMetered(t, sl, proc, costValue, hits)
				} else {
					price = c.static[proc]
				}
				m := sl.v.m
				cs = &m.c[h&s.stripeMask&(nCostStripes-1)] // as decideMetered's
				n := cs.pOff.Add(1 | price<<packShift)
				if n&(packFoldEvery-1) == 0 {
					m.fold()
				}
				k = (n-1)&packCountMask + 1
			}
			owed = owe(flags, price)
		}
	}
	if s.random {
		return sl.random()
	}
	// Diffuse, written out here: as a method it would be too large for
	// the compiler to inline, and the call cost about 3 ns.
	i := h & s.stripeMask
	st := &sl.e.stripes[i]
	if k == 0 { // not counted in a packed word
		k = st.offered.Add(1)
	}
	if sl.v == nil || !diffuseHit(k, sl.v.step) {
		return Decision{v: sl.v, owed: owed} // a nil v: not listed, admit
	}
	// A picked request; see hitOther.
	d := Decision{Drop: true, v: sl.v}
	if sl.v.kind != kindEnforce {
		d = sl.v.hitOther(sl.e, i)
	} else {
		st.dropped.Add(1)
	}
	if d.Drop && cs != nil {
		cs.drop.Add(owed & (1<<56 - 1))
	}
	d.owed = owed
	return d
}

// verdictOf returns the verdict decide would decide a request of the leaf
// (peer, idx) of t under (nil: none), without deciding, counting or adding
// the leaf: for the headers of a request its caller decided already. It
// allocates nothing.
func (s *ServiceLimiter) verdictOf(t *table, peer string, idx uint32) *verdict {
	if len(peer) <= names.MaxLen {
		if sl, ok := t.index.get(peer, idx); ok {
			return sl.v
		}
	}
	switch {
	case peer == "" || !validName(peer):
		return t.unknown[t.reservedAt(idx)].v
	case t.counted >= t.limit:
		return t.overflow[t.reservedAt(idx)].v
	}
	return t.verdicts[t.leafAt(peer, idx)]
}

// miss resolves a leaf (peer, idx) that is not in the table t.
func (s *ServiceLimiter) miss(t *table, peer string, idx uint32) slot {
	if peer == "" {
		return t.unknown[t.reservedAt(idx)]
	}
	if !validName(peer) {
		s.invalidPeers.Add(1)
		return t.unknown[t.reservedAt(idx)]
	}
	if t.counted >= t.limit {
		// An overflowing leaf keeps its procedure and its tier: the
		// sheddable requests of callers beyond the bound are still
		// shed before critical ones.
		return t.overflow[t.reservedAt(idx)]
	}
	return s.addLeaf(t.leafAt(peer, idx))
}

// leafAt returns the leaf of peer at index idx of t.
func (t *table) leafAt(peer string, idx uint32) leaf {
	return leaf{peer, t.procs.names[idx&procMask], criticality.Tier(idx >> tierShift)}
}

// reservedAt returns the place of index idx in t.unknown and t.overflow:
// the procedure index without criticality, else the procedure's four
// tiers side by side. idx's tier is one of the four then (tierIndex
// resolves none to None).
func (t *table) reservedAt(idx uint32) uint32 {
	if t.crit == nil {
		return idx
	}
	return (idx&procMask)*criticality.Count + (idx>>tierShift - 1)
}

// addLeaf adds the leaf k to the table, copy on write. Each insertion
// copies the map and indexes it again, so filling a table costs
// O(limit²) map operations and hashes once, off the steady state. A
// policy installed since the caller's snapshot may no longer declare k's
// procedure: then the request is names.Other's; nor have k's tier: then
// the request takes the new policy's service default (None without
// criticality).
func (s *ServiceLimiter) addLeaf(k leaf) slot {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.table.Load()
	proc, ok := t.procs.index(k.proc)
	if !ok {
		proc, k.proc = 0, t.procs.names[0]
	}
	if !t.crit.current(k.tier) {
		k.tier = t.crit.fallback()
	}
	if sl, ok := t.leaves[k]; ok {
		return sl
	}
	if t.counted >= t.limit {
		return t.overflow[t.reservedAt(leafIndex(proc, k.tier))]
	}
	// Not a limited leaf: installLocked gave those their counters. Clone:
	// peer may point into a larger request buffer.
	k.peer = strings.Clone(k.peer)
	sl := slot{e: newEntry(k.peer), v: t.verdicts[k]}
	if t.cost != nil {
		sl = s.meterLocked(nil, t, k, sl)
	}
	nt := *t
	nt.leaves = maps.Clone(t.leaves)
	nt.leaves[k] = sl
	nt.index = newPeerTable(nt.leaves, nt.procs, nt.crit)
	nt.counted++
	s.table.Store(&nt)
	return sl
}

// setPolicy installs p (nil: none) as one new table, received at received
// (zero: at the next Expire).
func (s *ServiceLimiter) setPolicy(p *Policy, received time.Time) {
	procs := compileProcedures(p)
	crit := compileCriticality(p, procs)
	cost := compileCost(p, procs)
	var verdicts map[leaf]*verdict
	if p != nil {
		verdicts = make(map[leaf]*verdict, len(p.Peers))
		for i := range p.Peers {
			r := &p.Peers[i]
			if proc, ok := procs.index(r.Procedure); ok && crit.current(r.Tier) && validName(r.Peer) {
				v := compile(s.name, p.Direction, r)
				cost.decorate(s.name, p.Direction, v, proc)
				verdicts[leaf{r.Peer, r.Procedure, r.Tier}] = v
			}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.base = verdicts
	if p != nil {
		verdicts = s.overlayLocked(p, cost)
	}
	s.installLocked(p, procs, crit, verdicts, s.compileDescriptors(p), cost)
	s.fail.reset(p, received)
}

// installLocked installs p with its procedures, criticality and verdicts,
// by leaf, as one new table. s.mu must be held.
func (s *ServiceLimiter) installLocked(p *Policy, procs *procedures, crit *critTable, verdicts map[leaf]*verdict, desc *descTable, cost *costTable) {
	old := s.table.Load()
	nt := &table{
		cost:     cost,
		leaves:   make(map[leaf]slot, len(old.leaves)),
		procs:    procs,
		crit:     crit,
		limit:    s.maxPeers,
		policy:   p,
		verdicts: verdicts,
		desc:     desc,
		health:   s.healthRecorders(procs),
	}
	if procs != noProcedures || crit != nil {
		nt.limit = s.maxLeaves
	}
	for k, sl := range old.leaves {
		if !nt.current(k) && sl.e.offered() == 0 {
			// Stale and never counted (the reserved leaves of the
			// procedures before): nothing to report, gone now. A
			// decision in flight on the old table may still count
			// in it, unreported, as in an eviction (evictIdle).
			continue
		}
		nt.leaves[k] = slot{e: sl.e, v: verdicts[k]}
	}
	// The reserved peers have a leaf of every procedure and tier, from
	// the start.
	tiers := []criticality.Tier{criticality.None}
	if crit != nil {
		tiers = criticality.Tiers[:]
	}
	nt.unknown = make([]slot, len(procs.names)*len(tiers))
	nt.overflow = make([]slot, len(procs.names)*len(tiers))
	nt.fillReserved()
	// Limited leaves get their counters now, whatever the number of
	// observed ones: their first request is already allocation free, and
	// no flood of made-up names, before or after, can leave a limited
	// caller without its own slot (it would be judged as _overflow).
	// Their number is bounded by the policy's (MaxPolicyPeers). Other
	// listed leaves get counters when a request names them, as observed
	// ones.
	for k, v := range verdicts {
		if _, ok := nt.leaves[k]; !ok && v.rule.Limited() {
			nt.leaves[k] = slot{e: newEntry(k.peer), v: v}
		}
	}
	// A leaf the old policy limited and this one does not is observed
	// now; the count may exceed the limit until idle leaves are evicted.
	for k, sl := range nt.leaves {
		if nt.observed(k, sl) {
			nt.counted++
		}
	}
	// Meters before the table is published: a decision under it finds
	// every leaf's.
	for k, sl := range nt.leaves {
		nt.leaves[k] = s.meterLocked(old, nt, k, sl)
	}
	s.sharesLocked(nt)
	if cost != nil {
		s.costMax.Store(cost.max)
		nt.fillReserved()
	}
	nt.index = newPeerTable(nt.leaves, procs, crit)
	s.table.Store(nt)
}

// fillReserved sets t.unknown and t.overflow from t.leaves, giving the
// reserved leaves counters if they have none yet.
func (t *table) fillReserved() {
	tiers := []criticality.Tier{criticality.None}
	if t.crit != nil {
		tiers = criticality.Tiers[:]
	}
	for i, q := range t.procs.names {
		for _, tier := range tiers {
			at := t.reservedAt(leafIndex(uint32(i), tier))
			t.unknown[at] = t.reserved(leaf{names.Unknown, q, tier})
			t.overflow[at] = t.reserved(leaf{names.Overflow, q, tier})
		}
	}
}

// fineLeaves reports whether t decides requests in leaves finer than a
// (service, peer) bucket (by procedure or by tier), or meters them (a
// price, a concurrency cap). A caller's outbound decision, per callee,
// can not stand for such a leaf, nor price a request or hold its slot
// (see resolveCaller): the controller publishes no outbound rule toward
// such a callee, and its sidecars decide every request themselves.
func (t *table) fineLeaves() bool { return t.procs != noProcedures || t.crit != nil || t.cost != nil }

// current reports whether the leaf k is one of t's current leaves, whose
// procedure t's policy declares and whose tier it may have; any other is
// stale (see table.leaves).
func (t *table) current(k leaf) bool {
	_, ok := t.procs.index(k.proc)
	return ok && t.crit.current(k.tier)
}

// reserved returns the slot of a reserved peer's leaf k, giving it
// counters if it has none yet.
func (t *table) reserved(k leaf) slot {
	sl, ok := t.leaves[k]
	if !ok {
		sl = slot{e: newEntry(k.peer), v: t.verdicts[k]}
		t.leaves[k] = sl
	}
	return sl
}

// AppendCounts appends the cumulative counters of every bucket (names.Unknown
// and names.Overflow included, even at zero) to dst, sorted by peer,
// procedure and tier: one per leaf for a service with procedures or
// criticality, Procedure "" and Tier None for one without (see
// PeerCounts.Procedure and PeerCounts.Tier).
//
// Each counter only grows between calls, and within one PeerCounts Dropped
// and ShadowDropped never exceed Offered, even while requests are being
// decided: offered is incremented before them and read after them.
// Offered - Dropped may shrink by the number of decisions in flight,
// counted offered by one call and dropped by the next.
//
// A peer enforced upstream (dataplane.EnforceUpstream) has its inferred
// upstream drops in Offered and Dropped, in whole requests, the fraction
// carried to the next call: what its caller offered, not only what arrived.
func (s *ServiceLimiter) AppendCounts(dst []PeerCounts) []PeerCounts {
	t := s.table.Load()
	start := len(dst)
	for k, sl := range t.leaves {
		c, _, _ := sl.e.counts()
		c.Peer, c.Procedure, c.Tier = k.peer, k.proc, k.tier
		c.Incarnation = sl.e.incarnation
		if m := sl.e.meter.Load(); m != nil {
			c.OfferedCost, c.AdmittedCost = m.totals(t.cost.mult(t.procs, k.proc), c.Offered, c.Dropped)
			c.InFlight = m.inFlight()
		}
		dst = append(dst, c)
	}
	slices.SortFunc(dst[start:], func(a, b PeerCounts) int {
		return cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier})
	})
	return dst
}

// peerCount returns the number of leaves in the table, reserved ones
// included: for a service without procedures, its peers.
func (s *ServiceLimiter) peerCount() int { return len(s.table.Load().leaves) }

// validName is names.Check without the error: Decide calls it for every
// request from an unlisted peer, where building an error would allocate.
// TestValidNameMatchesCheck keeps the two in step.
func validName(s string) bool {
	if s == names.Overflow {
		return true
	}
	if len(s) == 0 || len(s) > names.MaxLen || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
