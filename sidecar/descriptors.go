package sidecar

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/heavy"
	"github.com/sluicehq/sluice/pkg/wyhash"
)

// Descriptors (issue #15): the API the data plane's edges call. The HTTP
// middleware and the gRPC interceptor take each descriptor's value from the
// request by its source, in the order DescriptorSources gives, and call
// DecideDescriptor for each one after the request's bucket admitted it.
//
// What a sidecar keeps per descriptor: one heavy.Sketch per descriptor name
// per ServiceLimiter (sized by LimiterOptions.DescriptorCounters and
// DescriptorHeavy, fixed whatever the number of values), created when a
// policy first names the descriptor and kept across policy swaps while the
// name stays, and striped counters of what it decided. What a policy
// snapshot adds (compiled once in setPolicy, never per request): the
// sources, a hash table of the listed values and overrides, and the
// allowances of every other value and of descriptor.Missing
// (pkg/allowance, from the limit, the policy's LiveInstances,
// LimiterOptions.DescriptorWindow and the quantile).
//
// Per request (DecideDescriptor): v := descriptor.Value(raw); one hash of v
// serves both the sketch and the table; n := the sketch's count of v in
// this window, this request included. A listed value is dropped by its
// ratio, diffused over n (the k-th request of a value in a window is
// dropped when round(k·p) steps up); any other by the local rule,
// LocalDropRatio(A, n) = 1 − A/n once n > A, with a coin drawn from a hash
// of (v, n, the window's salt): no state per value, no allocation, no lock.
// Each regular report rotates the sketch (RotateDescriptors), and a surge
// report once the sketch's window is half an interval long.

// Descriptor defaults; see LimiterOptions.
const (
	DefaultDescriptorCounters = heavy.DefaultCounters
	DefaultDescriptorHeavy    = heavy.DefaultK
	DefaultDescriptorWindow   = time.Second
)

// descOptions returns the sketch options of o, defaults filled in.
func (o LimiterOptions) descOptions() heavy.Options {
	return heavy.Options{
		Counters:    cmp.Or(o.DescriptorCounters, DefaultDescriptorCounters),
		K:           cmp.Or(o.DescriptorHeavy, DefaultDescriptorHeavy),
		MaxValueLen: descriptor.MaxValueLen,
	}
}

// Validate reports every option out of its bounds, naming it; zero fields
// take their defaults and are valid. NewLimiter does not fail: it takes
// the descriptor defaults in place of sizes Validate rejects, so a binary
// should call Validate at start-up.
func (o LimiterOptions) Validate() error {
	var errs []error
	ho := o.descOptions()
	if err := (heavy.Options{Counters: ho.Counters}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("DescriptorCounters %d: %w", o.DescriptorCounters, err))
	}
	if err := (heavy.Options{K: ho.K, MaxValueLen: ho.MaxValueLen}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("DescriptorHeavy %d: %w", o.DescriptorHeavy, err))
	}
	if o.DescriptorWindow < 0 {
		errs = append(errs, fmt.Errorf("DescriptorWindow %v: must not be negative", o.DescriptorWindow))
	}
	return errors.Join(errs...)
}

// descState is what a ServiceLimiter keeps of one descriptor name across
// policies: its sketch and its counters. Created in setPolicy under the
// ServiceLimiter's mu, dropped when a policy no longer names it.
type descState struct {
	name    string
	sk      *heavy.Sketch
	stripes [nStripes]descStripe
	// salt changes at every rotation, so that the local rule's coin for
	// a value's n-th request is not the same in every window.
	salt atomic.Uint64

	mu        sync.Mutex // serialises RotateDescriptors; guards reported and rotations
	reported  descTotals // the totals the last rotation reported up to
	rotations uint64     // rotations so far
	// counts are the listed values' exact counts, by value: those of the
	// current policy's list, replaced (under mu) when a policy installs.
	counts map[string]*listedCount
}

// descStripe is one cache line of a descriptor's counters (see stripe).
type descStripe struct {
	offered atomic.Uint64 // every request decided
	listed  atomic.Uint64 // dropped by a listed value's ratio
	local   atomic.Uint64 // dropped by the local allowance
	invalid atomic.Uint64 // values descriptor.Value made descriptor.Invalid
	_       [32]byte
}

type descTotals struct{ offered, listed, local, invalid uint64 }

func (d *descState) totals() (t descTotals) {
	for i := range d.stripes {
		st := &d.stripes[i]
		// Drops before offered: a snapshot never has more dropped than
		// offered (see AppendCounts).
		t.listed += st.listed.Load()
		t.local += st.local.Load()
		t.invalid += st.invalid.Load()
		t.offered += st.offered.Load()
	}
	return t
}

// descTable is a policy's descriptors compiled for the request path:
// immutable, held by the table snapshot.
type descTable struct {
	sources []descriptor.Source
	// headerKeys are the sources' http.Header keys, by index: canonical,
	// as the server stores them (textproto's canonical form allocates
	// when it changes the name, so it is done here, once a policy); ""
	// for a source that is no header.
	headerKeys []string
	descs      []compiledDesc
}

// compiledDesc is one descriptor of a policy.
type compiledDesc struct {
	st     *descState
	values valueTable
	allow  uint64   // the allowance of a value neither listed nor overridden
	v      *verdict // what a dropped request is told; see Decision.Descriptor
	// threshold is the sketch's report threshold under this policy.
	threshold uint32
	pol       *DescriptorPolicy
	// keep, under an expired policy's fail mode open, is the share of
	// each listed ratio still in force (of 2³², as failState.keep); nil
	// otherwise.
	keep *atomic.Uint64
}

// failDescriptors returns dt as an expired policy p's fail mode has it:
// under open, listed ratios decay with keep, as the buckets' do, and give
// way to the values' allowances; under hold and local, dt: the listed
// ratios stay. (Under local a bucket gets its share of the limit, limit /
// live; a listed value's ratio is that share already, computed from its
// global rate, where the allowance, sized for a value pinned to one
// sidecar, would let a value spread over the fleet send live × its limit.)
// The sketches and counters stay: they are the descriptors' own, whatever
// decides.
func (s *ServiceLimiter) failDescriptors(dt *descTable, p *Policy, keep *atomic.Uint64) *descTable {
	if dt == nil || p.FailMode == dataplane.FailHold || p.FailMode == dataplane.FailLocal {
		return dt
	}
	// A copy of the whole table, so that every compiled field (the
	// sources' header keys too) goes along: only the descriptors change.
	nt := *dt
	nt.descs = slices.Clone(dt.descs)
	for i := range nt.descs {
		nt.descs[i].keep = keep
	}
	return &nt
}

// valueTable maps the listed and overridden values of a descriptor, by the
// sketch's hash of the value (heavy.Sketch.Hash), to their verdict: open
// addressing, linear probing, at most half full; built once per policy.
// The probe reads keys alone, 4 bytes a slot (16 KiB for the controller's
// default 1,024 listed values, within L1), so that the common case, a value
// the policy does not list, touches one cache line.
//
// In front of it, a one-bit filter, 4 bits a slot, set for each value's
// hash: a value the policy does not list reads one of its few lines, which
// every decision touches and so stay in the L1 cache, and passes to the
// keys only on a false positive (one in eight at most).
type valueTable struct {
	filter []uint64    // bit h>>58 of word (h>>32)&fmask; len(keys)/16 words
	keys   []uint32    // tag(h) of the slot's value; 0: free. A power of two long; nil: empty
	slots  []valueSlot // by the index of its key
}

// filterBit returns the word and the bit of h in a filter of mask+1 words.
func filterBit(h, mask uint64) (word uint64, bit uint64) {
	return (h >> 32) & mask, 1 << (h >> 58)
}

// tag is the key of hash h in a valueTable: bits the slot's index does not
// use (a table has far fewer than 2³² slots), never 0. Values whose tags
// match are compared.
func tag(h uint64) uint32 { return uint32(h>>32) | 1 }

type valueSlot struct {
	value string
	// step is a listed value's ratio in 32.32 fixed point (see
	// phasedHit); allow the value's allowance (a listed value's decides
	// it only while an expired policy fails open).
	step, allow uint64
	listed      bool
	// count is a listed value's exact count, reported whatever the
	// sketch estimates (see listedCount).
	count *listedCount
}

// listedCount counts one listed value's requests exactly: the sketch's
// estimate of a value that is not in its heavy set is, once its line of
// the table is full, at least the line's least count, which other values
// raise (under a flood of distinct values, a value that sent nothing here
// reads it), and which, summed over a fleet, would give every listed value
// a rate it does not send. Kept in the descState by value across policies, so a
// policy swap loses no count; one atomic add per request of a listed
// value.
//
// A value listed during a window was counted for only the part of it after
// its listing, which would report it at a fraction of its rate: the
// controller's next ratio for a value spread thin over the fleet, reported
// almost only by these counts, would fall short of its offered rate for a
// second (tenants-zipf: the abusers' mean time to enforce 1.6–1.8 s, 1.3–1.5
// s with the scaling). That first count is scaled to the whole window by
// the descriptor's traffic: the window's requests over those since the
// listing (see scaledToWindow).
type listedCount struct {
	n        atomic.Uint64 // requests, cumulative
	reported uint64        // n at the last rotation; descState.mu
	heavyAt  uint64        // the rotation that reported it in the heavy set's entry; descState.mu
	// from is the descriptor's offered total when the value was listed:
	// the window that ends with fewer requests since from than in it is
	// the one the value was listed in; descState.mu.
	from uint64
}

// scaledToWindow returns n, a listed value's count in the window it was
// listed in, scaled to the whole window: window requests of the
// descriptor in it, of which since came after the listing.
//
// The scaled count is right on average but not for a listing late in the
// window: one request with a tenth of the window to go reports 10, and
// summed over a fleet whose windows the listing cut at scattered points, a
// compliant value spread thin could be reported at a multiple of its rate
// and dropped for an interval. rotate caps it by the sketch's count of the
// value in the window, which never undercounts.
func scaledToWindow(n uint32, window, since uint64) uint32 {
	if since == 0 || since >= window {
		return n
	}
	return uint32(min(float64(n)*float64(window)/float64(since), math.MaxUint32))
}

// take returns the requests since the last take and starts the next
// count; descState.mu held.
func (c *listedCount) take() uint32 {
	n := c.n.Load()
	d := n - c.reported
	c.reported = n
	return uint32(min(d, math.MaxUint32))
}

func newValueTable(n int) valueTable {
	if n == 0 {
		return valueTable{}
	}
	size := max(1<<bits.Len(uint(2*n-1)), 16)
	return valueTable{filter: make([]uint64, size/16), keys: make([]uint32, size), slots: make([]valueSlot, size)}
}

// put adds or replaces vs's value, whose hash is h.
func (t *valueTable) put(h uint64, vs valueSlot) {
	mask, key := uint64(len(t.keys)-1), tag(h)
	i := h & mask
	for t.keys[i] != 0 && !(t.keys[i] == key && t.slots[i].value == vs.value) {
		i = (i + 1) & mask
	}
	t.keys[i], t.slots[i] = key, vs
	w, b := filterBit(h, uint64(len(t.filter)-1))
	t.filter[w] |= b
}

// get returns value's slot, nil if it has none. It allocates nothing; the
// probe ends because at least half of the slots are free.
func (t *valueTable) get(h uint64, value string) *valueSlot {
	if len(t.keys) == 0 {
		return nil
	}
	if w, b := filterBit(h, uint64(len(t.filter)-1)); t.filter[w]&b == 0 {
		return nil
	}
	mask, key := uint64(len(t.keys)-1), tag(h)
	for i := h & mask; ; i = (i + 1) & mask {
		switch t.keys[i] {
		case 0:
			return nil
		case key:
			if vs := &t.slots[i]; vs.value == value {
				return vs
			}
		}
	}
}

// compileDescriptors compiles p's descriptors; s.mu held. It creates the
// state of a name no earlier policy named, keeps the others', and forgets
// the states of names p no longer names (a decision in flight on the old
// table may still count in one, unreported).
func (s *ServiceLimiter) compileDescriptors(p *Policy) *descTable {
	if p == nil || len(p.Descriptors) == 0 {
		s.descStates = nil
		return nil
	}
	states := make(map[string]*descState, len(p.Descriptors))
	dt := &descTable{}
	for i := range p.Descriptors {
		d := &p.Descriptors[i]
		st := s.descStates[d.Name]
		if st == nil {
			st = newDescState(d.Name, s.descOpts)
		}
		states[d.Name] = st
		dt.sources = append(dt.sources, d.Source)
		key := ""
		if d.Source.Kind == descriptor.Header {
			key = textproto.CanonicalMIMEHeaderKey(d.Source.Header)
		}
		dt.headerKeys = append(dt.headerKeys, key)
		dt.descs = append(dt.descs, compileDescriptor(s.name, st, d, p.LiveInstances, s.descWindow))
		st.sk.SetThreshold(dt.descs[i].threshold)
	}
	s.descStates = states
	return dt
}

// listValues makes st count exactly the values of vs, and returns their
// counters: their counts of the previous list kept, a newly listed value's
// from 0, and those no longer listed dropped (their requests since the
// last rotation go unreported as exact counts; the sketch counted them
// too).
func (st *descState) listValues(vs []ValueRule) map[string]*listedCount {
	counts := make(map[string]*listedCount, len(vs))
	st.mu.Lock()
	defer st.mu.Unlock()
	offered := st.totals().offered
	for _, v := range vs {
		c := st.counts[v.Value]
		if c == nil {
			c = &listedCount{from: offered}
		}
		counts[v.Value] = c
	}
	st.counts = counts
	return counts
}

// newDescState returns a descriptor's state with a fresh sketch. o was
// validated or is the defaults: an invalid size falls back to them.
func newDescState(name string, o heavy.Options) *descState {
	sk, err := heavy.New(o)
	if err != nil {
		sk, _ = heavy.New(LimiterOptions{}.descOptions())
	}
	st := &descState{name: strings.Clone(name), sk: sk}
	st.salt.Store(uint64(time.Now().UnixNano()))
	return st
}

// compileDescriptor compiles one descriptor of a policy of service whose
// sidecars number live, with allowances per window of window.
func compileDescriptor(service string, st *descState, d *DescriptorPolicy, live int, window time.Duration) compiledDesc {
	q := d.Quantile
	if allowance.CheckQuantile(q) != nil { // hand-built policies only
		q = allowance.DefaultQuantile
	}
	// The allowance is the q-quantile of what a value at its limit puts on
	// one sidecar when all of its traffic lands there (sticky routing,
	// consistent hashing on the value), not when it spreads over the live
	// sidecars: only then does the local rule never over-enforce a
	// compliant value, whatever its routing. At the numbers (50 rps
	// over 300 sidecars, 1 s windows) the spread sizing gave an allowance
	// of 1, and compliant tenants pinned to one sidecar lost 3.6 % of their
	// requests (tenants-zipf, docs/simulation.md). An abuser spread over the
	// fleet is the controller's to catch; the report threshold, sized for
	// the spread, makes sure it hears of it at once.
	allow := func(limit float64) uint64 { return allowance.Allowance(limit, 1, window, q) }
	c := compiledDesc{st: st, allow: allow(d.LimitRPS), pol: d}
	counts := st.listValues(d.Values)
	c.values = newValueTable(len(d.Overrides) + len(d.Values) + 1)
	// The missing limit, then overrides (which may name Missing too), then
	// the listed values: each replaces what came before for its value.
	c.values.put(st.sk.Hash(descriptor.Missing), valueSlot{value: descriptor.Missing, allow: allow(d.MissingLimitRPS)})
	for _, o := range d.Overrides {
		c.values.put(st.sk.Hash(o.Value), valueSlot{value: o.Value, allow: allow(o.LimitRPS)})
	}
	for _, v := range d.Values {
		step := uint64(clampRatio(v.DropRatio) * (1 << 32))
		if v.LimitRPS == 0 && v.DropRatio > 0 {
			step = 1 << 32 // blocked: the law's ratio stops at PMax, a block does not
		}
		c.values.put(st.sk.Hash(v.Value), valueSlot{value: v.Value, step: step, allow: allow(v.LimitRPS), listed: true, count: counts[v.Value]})
	}
	// The report threshold of the smallest positive limit: a value with a
	// low override must reach the controller as soon as one at the
	// descriptor's limit would. All limits 0: everything is dropped
	// locally, nothing needs reporting, and 0 lets no value in.
	least := math.Inf(1)
	for _, l := range append([]float64{d.LimitRPS, d.MissingLimitRPS}, overrideLimits(d)...) {
		if l > 0 {
			least = min(least, l)
		}
	}
	if !math.IsInf(least, 1) {
		// ReportThreshold is the count a value must pass; the sketch
		// takes a value in once its count reaches the threshold.
		c.threshold = uint32(min(allowance.ReportThreshold(least, live, window, allowance.DefaultQuantile), math.MaxUint32-1) + 1)
	}
	c.v = &verdict{desc: d}
	c.v.http, c.v.grpcErr = renderDescriptorRejection(service, d.Name)
	return c
}

func overrideLimits(d *DescriptorPolicy) []float64 {
	ls := make([]float64, len(d.Overrides))
	for i, o := range d.Overrides {
		ls[i] = o.LimitRPS
	}
	return ls
}

// renderDescriptorRejection renders what a request a descriptor of
// service dropped gets: a 429 or RESOURCE_EXHAUSTED naming the descriptor
// (never the value: it came from the request), told to come back after
// MinRetryAfter, one report window, when the local allowance starts again
// and a listed ratio may have changed.
func renderDescriptorRejection(service, name string) (*httpRejection, error) {
	msg := "request to service " + service + " was rate limited by sluice: its " + name + " is over its limit"
	grpcErr := status.New(codes.ResourceExhausted, msg).Err()
	h := &httpRejection{retryAfter: seconds[MinRetryAfter], body: []byte(msg + "\n")}
	h.contentLength = []string{strconv.Itoa(len(h.body))}
	h.grpcTrailerDraft = envoyRateLimitedMD
	h.grpcTrailerX = envoyRateLimitedMD
	h.grpcStatus, h.grpcMessage, h.grpcDetails = grpcTrailers(status.Convert(grpcErr))
	return h, grpcErr
}

// DescriptorSources returns where the current policy's descriptors take
// their values from, in the policy's order: index i is DecideDescriptor's
// i. Nil when the policy names none. The slice belongs to the policy
// snapshot: callers must not modify it. It allocates nothing.
func (s *ServiceLimiter) DescriptorSources() []descriptor.Source {
	if dt := s.table.Load().desc; dt != nil {
		return dt.sources
	}
	return nil
}

// DecideDescriptor decides one request's value of descriptor i (an index
// of DescriptorSources) and counts it. A policy swap between the two calls
// may give i to another descriptor, or to none (then it admits); the
// middleware and the interceptors take the sources and decide under one
// snapshot. value is the raw
// attribute, "" when the request has none: DecideDescriptor maps it with
// descriptor.Value. It allocates nothing and takes no lock.
//
// A dropped request's Decision has Drop set and names the descriptor
// (Decision.Descriptor); its rejection is rendered once per policy, like a
// bucket's. An admitted one is the zero Decision. Concurrent callers may
// assume that every call is counted once, in offered and, if dropped, in
// one of the listed or local drops. BenchmarkDecideDescriptor measures
// the cost.
func (s *ServiceLimiter) DecideDescriptor(i int, value string) Decision {
	return s.decideDescriptor(s.table.Load().desc, i, value)
}

// decideDescriptor is DecideDescriptor of descriptor i of dt, one policy's
// descriptors: the edges decide all of a request's under the snapshot
// whose sources they took its values by.
func (s *ServiceLimiter) decideDescriptor(dt *descTable, i int, value string) Decision {
	if dt == nil || uint(i) >= uint(len(dt.descs)) {
		return Decision{}
	}
	d := &dt.descs[i]
	v := descriptor.Value(value)
	sk := d.st.sk
	h := sk.Hash(v)
	// Every load that may miss the cache (the value's slot, the sketch's
	// counters) before the first locked instruction, which would hold
	// them back until it completes: they then wait on memory together.
	vs := d.values.get(h, v)
	n := uint64(sk.AddHash(h, v))
	st := &d.st.stripes[stackStripe()&s.stripeMask]
	st.offered.Add(1)
	if len(v) == len(descriptor.Invalid) && v == descriptor.Invalid {
		st.invalid.Add(1)
	}
	allow := d.allow
	if vs != nil {
		allow = vs.allow
		if vs.listed {
			vs.count.n.Add(1)
			step := vs.step
			if d.keep != nil { // an expired policy, failing open
				step = step * d.keep.Load() >> 32
			}
			if phasedHit(n, step, h^d.st.salt.Load()) {
				st.listed.Add(1)
				return Decision{Drop: true, v: d.v}
			}
			if d.keep == nil {
				return Decision{}
			}
			// Failing open, the decayed ratio gives way to the value's
			// allowance, as for any value the policy does not list: the
			// heaviest values are not the ones left unlimited.
		}
	}
	if n <= allow || !localHit(h^d.st.salt.Load(), n, allow) {
		return Decision{}
	}
	st.local.Add(1)
	return Decision{Drop: true, v: d.v}
}

// phasedHit reports whether a listed value's n-th request of a window is
// dropped at ratio step/2³²: error diffusion over the value's own count,
// as diffuseHit, but from a phase hashed from the value and the window
// (h, salted). A value spread over many sidecars has a count of one or two
// on each in a window: diffusion from a fixed phase would drop each one's
// first requests, nearly all of them at a high ratio; from a random phase
// each request is dropped with probability step/2³² exactly, and a value
// concentrated on one sidecar still loses n·step/2³² ± 1 of n.
func phasedHit(n, step, h uint64) bool {
	return diffuseFrom(n, step, uint64(uint32(wyhash.Mix(h, h>>32^0x9e3779b97f4a7c15))))
}

// localHit reports whether the local rule drops a value's n-th request of
// a window (n > allow): with probability 1 − allow/n, from a coin that is
// a hash of the value's hash (salted per window) and n. u·n / 2⁶⁴ is
// uniform over [0, n) for a uniform u, and below n − allow with that
// probability.
func localHit(h, n, allow uint64) bool {
	u := wyhash.Mix(h^n*0x9e3779b97f4a7c15, h+n)
	hi, _ := bits.Mul64(u, n)
	return hi < n-allow
}

// Descriptor returns the name of the descriptor that dropped the request,
// "" when it was not a descriptor's decision (a bucket's, or an admission).
// The edges name it in their answer; Rule is nil for such a decision.
func (d Decision) Descriptor() string {
	if d.v == nil || d.v.desc == nil {
		return ""
	}
	return d.v.desc.Name
}

// DescriptorCounts is what one descriptor counted in one report window:
// the requests it decided, dropped, and its heavy values.
type DescriptorCounts struct {
	Descriptor string
	Offered    uint64
	Dropped    uint64 // listed and local drops
	// Values are the window's heavy values, largest estimate first, at
	// most the sketch's heavy-set size (LimiterOptions.DescriptorHeavy),
	// listed values included while there is room.
	Values []heavy.Entry
}

// RotateDescriptors ends the report window of service's descriptors: for
// each descriptor of the current policy, in its order, it sets the
// sketch's report threshold, rotates the sketch and appends what the
// window counted to dst, reusing dst's Values slices (dst[:cap]), and
// returns it. Only a service with a policy naming descriptors appends.
//
// It is the regular report's step (sidecar/reporter calls it once per
// report interval, and for a surge report once the window is at least
// half an interval long): each call starts a new window of the sketches
// and of the totals, so one holder must call it, and call it about once
// per LimiterOptions.DescriptorWindow, the window the allowances are
// sized for.
func (l *Limiter) RotateDescriptors(service string, dst []DescriptorCounts) []DescriptorCounts {
	s := l.lookup(service)
	if s == nil {
		return dst
	}
	dt := s.table.Load().desc
	if dt == nil {
		return dst
	}
	for i := range dt.descs {
		var out *DescriptorCounts
		if len(dst) < cap(dst) {
			dst = dst[:len(dst)+1]
			out = &dst[len(dst)-1]
		} else {
			dst = append(dst, DescriptorCounts{})
			out = &dst[len(dst)-1]
		}
		dt.descs[i].rotate(out)
	}
	return dst
}

// rotate ends d's window and puts what it counted in out.
func (d *compiledDesc) rotate(out *DescriptorCounts) {
	st := d.st
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sk.SetThreshold(d.threshold)
	st.sk.Rotate()
	st.salt.Add(0x9e3779b97f4a7c15)
	t := st.totals()
	out.Descriptor = st.name
	out.Offered = t.offered - st.reported.offered
	out.Dropped = min(t.listed-st.reported.listed+t.local-st.reported.local, out.Offered)
	st.reported = t
	out.Values = st.sk.AppendHeavy(out.Values[:0])
	// Listed values are reported whenever they sent a request here, by
	// their exact count, beside the heavy set and outside its bound (the
	// list bounds them): the controller needs a listed value's rate on
	// every sidecar to keep its ratio right, and a value spread thin has
	// a count of one or two on most. A listed value in the heavy set
	// keeps the larger of its two counts: the exact count of a value
	// listed during the window began when it was listed, the heavy set's
	// when it became heavy.
	if len(st.counts) == 0 {
		return
	}
	st.rotations++
	for i := range out.Values {
		if c := st.counts[out.Values[i].Value]; c != nil {
			// The heavy set counted this value since it became heavy,
			// which a first window's exact count does not need to make up.
			out.Values[i].Estimate = max(out.Values[i].Estimate, c.take())
			c.heavyAt = st.rotations
		}
	}
	for v, c := range st.counts {
		if c.heavyAt == st.rotations {
			continue // reported in its heavy-set entry above
		}
		n := c.take()
		if since := t.offered - c.from; since < out.Offered { // listed in this window
			// No more than the sketch counted of it in the window, which
			// never undercounts: scaled up from a listing late in the
			// window, one request would report a compliant value at a
			// multiple of its rate (ten requests to go: one becomes 40).
			_, whole := st.sk.Estimates(v)
			n = min(scaledToWindow(n, out.Offered, since), max(n, whole))
		}
		if n > 0 {
			out.Values = append(out.Values, heavy.Entry{Value: v, Estimate: n})
		}
	}
	slices.SortFunc(out.Values, func(a, b heavy.Entry) int {
		return cmp.Or(cmp.Compare(b.Estimate, a.Estimate), strings.Compare(a.Value, b.Value))
	})
}
