package sidecar

import (
	"math"
	"net/http"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
)

// Cost units and concurrency caps (issue #16, step 2).
//
// A service whose policy counts cost (UnitCost) prices every request when
// it is decided (see costTable.price), and each leaf counts, besides its
// requests, the cost it was offered and admitted, in milli-units (integers,
// atomics: no float on the request path):
//
//   - a price static per leaf (no request header, no response header) adds
//     nothing per request: AppendCounts multiplies the leaf's counts by it;
//   - with a request header, each request adds its price to the leaf's
//     offered cost (and a dropped one to its dropped cost);
//   - with a response header, each request adds its price to the offered
//     cost, and each admitted one adds its real cost, the reported one or
//     else its price, to the admitted cost when its edge calls Done.
//
// A request priced on its own (the last two) is counted and priced in one
// atomic add: the count and the price share a word (see packShift), so
// that it costs what a request of a service counting requests does.
//
// A rule with MaxConcurrency caps the leaf's requests in flight at the
// sidecar's share of the cap (see shareOf): an admitted request takes a
// slot, Done gives it back, and one that finds no slot free is refused (a
// drop, counted in the leaf's dropped and in ConcurrencyDropped).
//
// A policy with neither (the common case) compiles no costTable, and Decide
// pays one nil check for all of this.

// Cost sources, for the invalid and clamped counters.
const (
	costFromRequest  = 0
	costFromResponse = 1
)

// costStatus is what parsing a cost found.
type costStatus uint8

const (
	costAbsent  costStatus = iota // no value
	costOK                        // a valid cost
	costClamped                   // above max: clamped to it
	costInvalid                   // not a finite number ≥ 0: as if absent
)

// DefaultMaxCost is CostPolicy.Max when a policy counting cost has no
// CostPolicy: the limits file's default.
const DefaultMaxCost = 1e6

// maxCostMilli bounds a compiled max cost, 10¹² units, so that a window's
// sums of milli-units stay far from wrapping a uint64 (and a price fits
// the 56 bits a Decision keeps it in).
const maxCostMilli = 1e15

// noStatic marks a procedure without a static price in costTable.static.
const noStatic = math.MaxUint64

// costMeanDecay is what a window's reported costs still weigh in a leaf's
// running mean one window later: the mean is the decayed sum of reported
// costs over the decayed count, so the last window counts most, each
// window by how many responses it had. Weighing by count, not by window,
// lets the first window that reports anything replace the policy's
// default at once (a default of 1 against real costs of 10 would
// otherwise price requests at a tenth of their cost for several windows,
// and admit ten times too many), and keeps a window with one odd response
// from moving a mean many responses made. A short memory follows a
// change of cost within a window or two: with 0.8 (about five windows)
// the simulator's cost-debt scenario, whose costs double at 30 s, priced
// requests low for seconds and missed its limit by +6.7 % and −5.9 % in
// the two windows after the step; with 0.3, +0.5 % and −1.5 %.
const costMeanDecay = 0.3

// costTable is a policy's pricing and caps compiled for the request path,
// once per policy; nil when the policy neither counts cost nor caps any
// concurrency. Immutable.
type costTable struct {
	priced bool // the policy counts cost; false: only concurrency caps
	// static is each procedure index's price in milli-units when no
	// request header prices the request: its static cost, else the
	// default, or noStatic for a callee priced by its responses, whose
	// price is then the leaf's running mean.
	static   []uint64
	def, max uint64       // milli-units
	maxHits  uint64       // max in whole units: the most a hits prices unclamped (a division, once)
	reqKey   string       // lower case, the gRPC metadata key; "": none trusted
	httpReq  string       // reqKey canonical, an http.Header key
	respKey  string       // lower case; "": the price at admission stands
	httpResp responseKeys // respKey's keys in a response's header map
	response bool         // respKey != ""
	dynamic  bool         // a request header or a response: each request adds its price
	packs    bool         // dynamic, and max fits a packed word: see packShift
	// lean: priced statically or by the request alone, in a packed word;
	// decide decides such a policy's uncapped leaves itself.
	lean bool
}

// compileCost compiles p's cost and caps against its procedures; nil when
// it has neither.
// Metered reports whether p's leaves are metered one by one: it counts
// cost, or caps a leaf's concurrency. Such a service is decided through a
// cost table, and takes no provisional ratios (see SetProvisional). A nil
// policy is not.
func (p *Policy) Metered() bool {
	if p == nil {
		return false
	}
	if p.Unit == UnitCost {
		return true
	}
	for i := range p.Peers {
		if p.Peers[i].MaxConcurrency > 0 {
			return true
		}
	}
	return false
}

func compileCost(p *Policy, procs *procedures) *costTable {
	if !p.Metered() {
		return nil
	}
	c := &costTable{priced: p.Unit == UnitCost}
	cp := p.Cost
	if cp == nil {
		cp = &CostPolicy{Default: 1, Max: DefaultMaxCost}
	}
	c.max = milli(min(cp.Max, maxCostMilli/1000), maxCostMilli)
	c.def = milli(cp.Default, c.max)
	c.maxHits = c.max / 1000
	c.reqKey, c.respKey = cp.RequestHeader, cp.ResponseHeader
	c.response = c.respKey != ""
	c.dynamic = c.response || c.reqKey != ""
	c.packs = c.priced && c.dynamic && c.max <= maxPackedPrice
	c.lean = !c.response && (!c.dynamic || c.packs)
	if c.reqKey != "" {
		c.httpReq = textproto.CanonicalMIMEHeaderKey(c.reqKey)
	}
	if c.response {
		c.httpResp = newResponseKeys(c.respKey)
	}
	c.static = make([]uint64, len(procs.names))
	for i := range c.static {
		c.static[i] = c.def
		if c.response {
			c.static[i] = noStatic
		}
	}
	for _, q := range cp.Procedures {
		if i, ok := procs.index(q.Procedure); ok {
			c.static[i] = milli(q.Cost, c.max)
		}
	}
	return c
}

// milli converts a cost to milli-units, clamped to [0, max]; NaN is 0
// (only in hand-built policies: PolicyFromProto refuses it).
func milli(v float64, max uint64) uint64 {
	if !(v > 0) {
		return 0
	}
	return uint64(min(math.Round(v*1000), float64(max)))
}

// mult is the price AppendCounts multiplies the leaf of procedure q's
// counts by: its static price when nothing prices a request on its own,
// else 0 (the requests add their prices themselves).
func (c *costTable) mult(procs *procedures, q string) uint64 {
	if c == nil || !c.priced || c.dynamic {
		return 0
	}
	i, ok := procs.index(q)
	if !ok {
		return 0
	}
	return c.static[i]
}

// price returns the price in milli-units of a request whose procedure's
// static price is static (noStatic: none) and whose request header holds
// raw ("": none), and whether the header set it; m is its leaf's meter
// (nil: none yet).
func (s *ServiceLimiter) price(c *costTable, static uint64, raw string, m *meter) (uint64, bool) {
	if raw != "" {
		switch v, st := parseCost(raw, c.max); st {
		case costOK:
			return v, true
		case costClamped:
			s.costClamped[costFromRequest].Add(1)
			return v, true
		default:
			s.costInvalid[costFromRequest].Add(1)
		}
	}
	if static != noStatic {
		return static, false
	}
	if m != nil {
		return min(m.mean.Load(), c.max), false
	}
	return c.def, false
}

// parseCost parses a cost as a header carries it, a decimal number ("12",
// "0.25", "3."), in milli-units rounded half up, clamped to max. Anything
// else (signs, exponents, NaN, Inf, spaces inside) is invalid. It
// allocates nothing, unlike strconv.ParseFloat on an error, since the
// value comes from a request.
func parseCost(s string, max uint64) (uint64, costStatus) {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	var v uint64 // milli-units, saturated past max
	digits, frac, over := 0, -1, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.' && frac < 0:
			frac = 0
		case c >= '0' && c <= '9':
			digits++
			d := uint64(c - '0')
			switch {
			case frac < 0:
				if v > (math.MaxUint64-9000)/10 {
					over = true
				} else {
					v = v*10 + d*1000
				}
			case frac < 3:
				frac++
				v += d * [3]uint64{100, 10, 1}[frac-1]
			case frac == 3:
				frac++
				if d >= 5 {
					v++
				}
			}
		default:
			return 0, costInvalid
		}
	}
	if digits == 0 {
		return 0, costInvalid
	}
	if over || v > max {
		return max, costClamped
	}
	return v, costOK
}

// costOf is parseCost for a float64 an app reports through Done.
func costOf(v float64, max uint64) (uint64, costStatus) {
	switch {
	case !(v >= 0) || math.IsInf(v, 1):
		return 0, costInvalid
	case v*1000 > float64(max):
		return max, costClamped
	}
	return uint64(math.Round(v * 1000)), costOK
}

// nCostStripes is the number of cost counter stripes per meter: fewer than
// the request stripes, since only priced requests write them.
const nCostStripes = 4

// costStripe is one cache line of a meter's cost counters, in milli-units.
// A request priced on its own is counted in pOff or pResp (packed: see
// packShift) when its policy packs and the limiter diffuses, and in the
// entry's request stripe and off or respOff otherwise (under Random too).
type costStripe struct {
	off     atomic.Uint64 // prices of requests decided without a response to report them
	drop    atomic.Uint64 // of those, the dropped ones'
	respOff atomic.Uint64 // prices of requests decided to be priced by their response
	adm     atomic.Uint64 // of those, the real costs of the admitted ones that completed
	repSum  atomic.Uint64 // of those, the costs their responses reported
	repN    atomic.Uint64 // and how many reported one
	pOff    atomic.Uint64 // packed: requests and prices, as off
	pResp   atomic.Uint64 // packed: requests and prices, as respOff
}

// A packed word counts requests in its low packShift bits and sums their
// prices (milli-units) above, both wrapping: a request adds 1 | price<<packShift.
// The meter's fold reads the words' differences since its last fold into
// 64-bit sums; a difference decodes exactly while fewer than 2^packShift
// requests were added since, and the price field can not wrap then, a
// price being at most maxPackedPrice (price clamps a leaf's mean to the
// policy's max, which may have come down since the mean was learned).
// The request that brings a word's count to a multiple of packFoldEvery
// folds (one in 4,096 takes the meter's fold lock, held for a few loads),
// however rarely the reporter reads: a word loses count only if a fold's
// holder stalls while 2^16 − 2^12 more requests are decided on the same
// stripe of the same leaf. A policy whose max cost is above
// maxPackedPrice does not pack: its requests pay two adds.
//
// Diffuse's sequence is the word's count, which wraps at 2^16: each 2^16
// requests of a word see round(2^16·p) drops, so a ratio under 2^-17
// (7.6·10⁻⁶) drops none of them.
const (
	packShift      = 16
	packCountMask  = 1<<packShift - 1
	packFoldEvery  = 1 << 12
	maxPackedPrice = 1<<(64-2*packShift) - 1 // milli-units: 4,294,967 units
)

// meter holds a leaf's cost counters and in-flight count, for a leaf of a
// service whose policy has a costTable. An entry gets one when a policy
// that needs it is installed (or when it is created under one) and keeps
// it, so that a request holding a slot gives it back to the count it took
// it from whatever policy is installed meanwhile.
type meter struct {
	s    *ServiceLimiter
	c    [nCostStripes]costStripe
	pool *slotPool     // the in-flight count and share of a cap, shared by a (peer, procedure)'s tiers; set once
	mean atomic.Uint64 // the running mean of reported costs, milli-units; starts at the default
	// offBase and admBase keep the cumulative costs continuous when the
	// leaf's static price changes (see foldPrice): wrapping arithmetic.
	offBase, admBase atomic.Uint64

	// Guarded by foldMu: each packed word as the last fold read it, and
	// what the folds read from them: requests, and their prices by word.
	foldMu                       sync.Mutex
	packedSeen                   [nCostStripes][2]uint64
	packedN, packedOff, packedRe uint64

	// Guarded by s.mu: the counts as the last rate window ended
	// (EndWindow), and the leaf's offered rate in the last three rate
	// windows, the last first (units or requests per second; rates holds
	// how many have ended, up to 3). A rate window is at least
	// shareWindow long: report windows a surge report cut short add up
	// (acc) until it is.
	seenOffered, seenN, seenSum uint64
	rate                        [3]float64
	rates                       int
	acc                         time.Duration
	wSum, wN                    float64 // the decayed reported costs (milli-units) and their count; see costMeanDecay
}

func newMeter(s *ServiceLimiter, mean uint64, pool *slotPool) *meter {
	if pool == nil {
		pool = new(slotPool)
		pool.share.Store(math.MaxInt64)
	}
	m := &meter{s: s, pool: pool}
	m.mean.Store(mean)
	return m
}

// slotPool is the concurrency slots of one (peer, procedure): a cap is
// the caller's, whatever tier its requests claim, so the tiers of a
// tiered leaf share one pool (a caller spreading its calls over four tiers
// would otherwise hold four times its cap). A meter gets its pool when it
// is created, a sibling tier's if one has a meter already, and keeps it.
type slotPool struct {
	held  atomic.Int64 // requests holding a slot
	share atomic.Int64 // the slots the sidecar may hold: its share of the cap

	// Scratch of sharesLocked, guarded by the ServiceLimiter's mu.
	cap           uint32
	local, global float64
	hasLocal      bool
}

// sums returns m's counters summed over its stripes, the packed ones'
// prices included.
func (m *meter) sums() (c struct{ off, drop, respOff, adm, repSum, repN uint64 }) {
	_, c.off, c.respOff = m.fold()
	for i := range m.c {
		st := &m.c[i]
		c.off += st.off.Load()
		c.drop += st.drop.Load()
		c.respOff += st.respOff.Load()
		c.adm += st.adm.Load()
		c.repSum += st.repSum.Load()
		c.repN += st.repN.Load()
	}
	return c
}

// fold reads the packed words into m's sums and returns them, cumulative
// (wrapping): the requests the words counted, and their prices, as off and
// respOff would have summed them. Safe for concurrent use: the request
// path calls it too (see packShift).
func (m *meter) fold() (n, off, resp uint64) {
	m.foldMu.Lock()
	defer m.foldMu.Unlock()
	for i := range m.c {
		for j, w := range [2]*atomic.Uint64{&m.c[i].pOff, &m.c[i].pResp} {
			v := w.Load()
			d := v - m.packedSeen[i][j]
			m.packedSeen[i][j] = v
			m.packedN += d & packCountMask
			if j == 0 {
				m.packedOff += d >> packShift
			} else {
				m.packedRe += d >> packShift
			}
		}
	}
	return m.packedN, m.packedOff, m.packedRe
}

// totals returns the leaf's cumulative offered and admitted cost in
// milli-units (wrapping), given its static multiplier and request counts.
func (m *meter) totals(mult, offered, dropped uint64) (off, adm uint64) {
	c := m.sums()
	off = m.offBase.Load() + mult*offered + c.off + c.respOff
	adm = m.admBase.Load() + mult*(offered-dropped) + (c.off - c.drop) + c.adm
	return off, adm
}

// foldPrice keeps m's cumulative costs continuous when its static
// multiplier changes from old to nu, at the leaf's counts offered and
// dropped. Requests decided while the policy is swapped may be priced at
// either multiplier.
func (m *meter) foldPrice(old, nu, offered, dropped uint64) {
	if old == nu {
		return
	}
	m.offBase.Add(offered*old - offered*nu)
	m.admBase.Add((offered-dropped)*old - (offered-dropped)*nu)
}

// inFlight returns the requests holding a slot, never negative.
func (m *meter) inFlight() uint32 {
	return uint32(min(max(m.pool.held.Load(), 0), math.MaxUint32))
}

// shareOf is a sidecar's share of a bucket's global cap: the cap times
// the sidecar's part of the bucket's offered rate (local of global), at
// least 1, at most the cap; before the bucket has a global rate, or before
// the sidecar measured its own, the cap split evenly over the live
// instances. Shares round down, so that the sidecars' shares add up to no
// more than the cap whatever their parts (rounding up, two sidecars at
// 51 % and 49 % of a cap of 10 would hold 6 + 5); only the floor of 1 can
// lift the sum over it, when the cap is smaller than the sidecars that
// see the bucket. A policy that counts no live sidecar (the controller has
// had no report of the service yet: a fleet's first seconds) gives 1: any
// more could add up past the cap over sidecars nobody has counted.
func shareOf(cap uint32, local float64, hasLocal bool, global float64, live int) int64 {
	var share float64
	switch {
	case hasLocal && global > 0 && !math.IsInf(global, 0) && local >= 0:
		share = math.Floor(float64(cap)*local/global + shareSlack)
	case live > 0:
		share = math.Floor(float64(cap) / float64(live))
	}
	return int64(max(1, min(share, float64(cap))))
}

// shareSlack is the part of a slot a share rounds up from: two sidecars
// at 49.8 % of a rate of 200.9 rps (the global rate is never exactly the
// sum of the sidecars' windows) held 4 + 4 of a cap of 10. Parts that add
// up to a whole round up past it only where their fractions are each
// within shareSlack of a slot, and fractions adding up to k slots round
// up at most k of them below twenty sidecars.
const shareSlack = 0.05

// Decision flags.
const (
	holdsSlot       = 1 << iota // the request took a concurrency slot: Done gives it back
	responsePriced              // the response reports its cost: Done counts it
	priceFromHeader             // the request header set its price
)

// Done tells the limiter that the request d admitted has completed, its
// response written in full (after its trailers): cost is what the app
// reported the request cost, in the policy's units, when reported is true.
// It gives back the request's concurrency slot and, for a service priced by
// its responses, counts the request's real cost as admitted in the current
// window: cost (clamped to the policy's max; invalid ones counted and
// ignored), or else the price it was admitted at.
//
// Every edge that serves the requests Decide admitted must call it exactly
// once per admitted request, whether its handler succeeded, failed or
// panicked; the edges of this package do (Middleware, the server
// interceptors). A second call of the same Decision would give back a slot
// twice: a Decision is a value, and Done can not tell. For a drop, and a
// request that neither holds a slot nor is priced by its response (every
// request of a service without caps and response header), it does nothing.
// It allocates nothing.
func (d Decision) Done(cost float64, reported bool) {
	if d.flags()&(holdsSlot|responsePriced) == 0 {
		return
	}
	v, st := uint64(0), costAbsent
	if reported && d.flags()&responsePriced != 0 {
		v, st = costOf(cost, d.v.m.s.costMax.Load())
		d.v.m.s.countReported(st)
	}
	d.finish(v, st)
}

// Price returns the price d's request was decided at, in the policy's
// units: 0 for a service that does not count cost.
func (d Decision) Price() float64 { return float64(d.price()) / 1000 }

// pending reports whether d's edge must call Done (or doneRaw).
func (d Decision) pending() bool { return d.flags()&(holdsSlot|responsePriced) != 0 }

// doneRaw is Done for a cost as a header or trailer carried it: raw, when
// present is true.
func (d Decision) doneRaw(raw string, present bool) {
	if !d.pending() {
		return
	}
	v, st := uint64(0), costAbsent
	if present && d.flags()&responsePriced != 0 {
		v, st = parseCost(raw, d.v.m.s.costMax.Load())
		d.v.m.s.countReported(st)
	}
	d.finish(v, st)
}

// doneHTTP is Done for an HTTP response complete in w: the cost is the
// response header, or the trailer, of the current policy's name.
func (d Decision) doneHTTP(w http.ResponseWriter) {
	if d.flags()&responsePriced == 0 {
		d.finish(0, costAbsent)
		return
	}
	c := d.v.m.s.table.Load().cost
	if c == nil || !c.response {
		d.finish(0, costAbsent)
		return
	}
	d.doneRaw(c.httpResp.value(w.Header()))
}

// countReported counts a reported cost that was invalid or clamped.
func (s *ServiceLimiter) countReported(st costStatus) {
	switch st {
	case costInvalid:
		s.costInvalid[costFromResponse].Add(1)
	case costClamped:
		s.costClamped[costFromResponse].Add(1)
	}
}

// finish gives back d's slot and counts its real cost, v when st says the
// response reported a (valid or clamped) one, else its price.
func (d Decision) finish(v uint64, st costStatus) {
	m := d.v.m
	if d.flags()&holdsSlot != 0 {
		m.pool.held.Add(-1)
	}
	if d.flags()&responsePriced == 0 {
		return
	}
	c := &m.c[stackStripe()&(nCostStripes-1)]
	if st == costOK || st == costClamped {
		c.repSum.Add(v)
		c.repN.Add(1)
	} else {
		v = d.price()
	}
	c.adm.Add(v)
}

// decideMetered decides a request of the leaf sl, which decide found in t,
// a table with a costTable: it prices the request (hits, when not 0, is
// its cost in whole units, as Envoy's hits_addend gives it; else raw is
// its request header's cost, "" for none), counts its price and holds its
// concurrency slot. Written out as decide is, for speed.
func (s *ServiceLimiter) decideMetered(t *table, sl slot, proc uint32, raw string, hits uint64) Decision {
	c, m := t.cost, (*meter)(nil)
	h := stackStripe() // one stripe of each kind for the request: counts and costs
	if sl.v != nil {
		m = sl.v.m
	}
	var price uint64
	var flags uint8
	var k uint64 // the request's number in a packed word; 0: counted below
	if c.priced && m != nil {
		// A static price is a load; only a header or a mean costs more.
		if price = c.static[proc]; hits > 0 {
			price, flags = s.hitsPrice(c, hits), priceFromHeader
		} else if v, st := parseCost(raw, c.max); st == costOK {
			price, flags = v, priceFromHeader // the common header, without price's call
		} else if raw != "" || price == noStatic {
			var fromHeader bool
			if price, fromHeader = s.price(c, price, raw, m); fromHeader {
				flags = priceFromHeader
			}
		}
		switch {
		case c.packs && !s.random:
			// Counted and priced in one add, in stripe h's packed word
			// (pResp for a request its response prices): k is its number
			// in the word's count, 1 to 2^packShift, the sequence Diffuse
			// picks from. The stripe follows the request stripes' mask:
			// with OneStripe (the simulator) the sequence is one, and
			// does not hang on where a goroutine's stack is.
			cs := &m.c[h&s.stripeMask&(nCostStripes-1)]
			w := &cs.pOff
			if c.response {
				w = &cs.pResp
			}
			n := w.Add(1 | price<<packShift)
			if n&(packFoldEvery-1) == 0 {
				m.fold()
			}
			k = (n-1)&packCountMask + 1
		case c.dynamic:
			cs := &m.c[h&(nCostStripes-1)]
			if c.response {
				cs.respOff.Add(price)
			} else {
				cs.off.Add(price)
			}
		case hits > 0:
			// A static price counts by multiplying the leaf's requests
			// (mult): this request adds what its price differs by,
			// wrapping, as totals sums.
			m.c[h&(nCostStripes-1)].off.Add(price - c.static[proc])
		}
	}
	var d Decision
	i := h & s.stripeMask
	if s.random {
		d = sl.random()
	} else {
		st := &sl.e.stripes[i]
		if k == 0 {
			k = st.offered.Add(1)
		}
		switch {
		case sl.v == nil || !diffuseHit(k, sl.v.step):
			d = Decision{v: sl.v}
		case sl.v.kind != kindEnforce:
			d = sl.v.hitOther(sl.e, i)
		default:
			st.dropped.Add(1)
			d = Decision{Drop: true, v: sl.v}
		}
	}
	if m == nil { // a leaf a newer policy added: metered from the next request
		return d
	}
	if !d.Drop && sl.v.conc != nil {
		var held bool
		if d, held = s.takeSlot(d, sl, m, i); held {
			flags |= holdsSlot
		}
	}
	if d.Drop {
		switch {
		case c.priced && c.dynamic && !c.response:
			m.c[h&(nCostStripes-1)].drop.Add(price)
		case c.priced && !c.dynamic && hits > 0:
			m.c[h&(nCostStripes-1)].drop.Add(price - c.static[proc])
		}
		d.owed = owe(flags, price)
		return d
	}
	if c.priced && c.response {
		flags |= responsePriced
	}
	d.owed = owe(flags, price)
	return d
}

// owe packs a Decision's flags and price into its owed.
func owe(flags uint8, price uint64) uint64 { return uint64(flags)<<56 | price }

// flags returns d's flags (holdsSlot, responsePriced, priceFromHeader).
func (d Decision) flags() uint8 { return uint8(d.owed >> 56) }

// price returns d's price in milli-units.
func (d Decision) price() uint64 { return d.owed & (1<<56 - 1) }

// takeSlot takes a concurrency slot of the capped leaf sl for the request d
// admitted, and says whether it holds one; or refuses it (counted in
// stripe i's dropped) when the sidecar's share is taken: a shadow rule
// admits it all the same, counted as shadow dropped, and it holds a slot.
func (s *ServiceLimiter) takeSlot(d Decision, sl slot, m *meter, i uint64) (Decision, bool) {
	if m.pool.held.Add(1) <= m.pool.share.Load() {
		return d, true
	}
	s.concDropped.Add(1)
	if sl.v.shadow {
		sl.e.stripes[i].shadow.Add(1)
		d.Shadow = true
		return d, true
	}
	m.pool.held.Add(-1)
	sl.e.stripes[i].dropped.Add(1)
	return Decision{Drop: true, v: sl.v.conc}, false
}

// hitsPrice is the price in milli-units of a request that stands for hits
// units (Envoy's hits_addend), clamped to the policy's max (counted as a
// clamped request cost).
func (s *ServiceLimiter) hitsPrice(c *costTable, hits uint64) uint64 {
	if hits > c.maxHits {
		s.costClamped[costFromRequest].Add(1)
		return c.max
	}
	return hits * 1000
}

// DecideHits is DecideHTTPTier for a request that says what it costs as a
// whole number of units, hits (Envoy's rate limit service's hits_addend),
// rather than in a header: the edge for Envoy's ShouldRateLimit (see
// sidecar/rls). hits 0 means the request did not say: it is priced as
// DecideHTTPTier prices it. For a service whose policy counts cost
// (UnitCost), a hits above 0 is the request's price, clamped to the
// policy's max; for a service counting requests the request is one
// request, whatever hits. Cost is counted as a request header's would be.
// No allocation.
func (s *ServiceLimiter) DecideHits(peer, method, path, tierValue string, hits uint64) Decision {
	t := s.table.Load()
	if t.cost == nil || !t.cost.priced {
		hits = 0 // one request, whatever hits
	}
	return s.decide(t, peer, t.procs.http(method, path), tierValue, "", hits)
}

// CountsCost reports whether the current policy counts cost (UnitCost):
// whether DecideHits prices a request by its hits.
func (s *ServiceLimiter) CountsCost() bool {
	c := s.table.Load().cost
	return c != nil && c.priced
}

// DecideHTTPCost is DecideHTTPTier for a request whose cost header (the
// policy's CostPolicy.RequestHeader, see CostHeader) has the value
// costValue, "" when it has none. No allocation.
func (s *ServiceLimiter) DecideHTTPCost(peer, method, path, tierValue, costValue string) Decision {
	t := s.table.Load()
	return s.decide(t, peer, t.procs.http(method, path), tierValue, costValue, 0)
}

// DecideGRPCCost is DecideGRPCTier for a call whose cost metadata (see
// CostHeader) has the value costValue, "" when it has none. No allocation.
func (s *ServiceLimiter) DecideGRPCCost(peer, fullMethod, tierValue, costValue string) Decision {
	t := s.table.Load()
	return s.decide(t, peer, t.procs.grpc(fullMethod), tierValue, costValue, 0)
}

// CostHeader returns the lower-case request header (gRPC metadata key) the
// current policy reads a request's own cost from; "" when it trusts none.
func (s *ServiceLimiter) CostHeader() string {
	if c := s.table.Load().cost; c != nil {
		return c.reqKey
	}
	return ""
}

// ConcurrencyDropped returns the requests refused because the sidecar's
// share of their bucket's concurrency cap was taken.
func (s *ServiceLimiter) ConcurrencyDropped() uint64 { return s.concDropped.Load() }

// EndWindow ends the window of service's counters that began at the
// previous call (window long): every leaf priced by its responses moves
// its running mean towards the window's mean reported cost, and every
// capped leaf's share of its cap follows its part of the bucket's offered
// rate (see shareOf). The reporter calls it once per report window.
func (l *Limiter) EndWindow(service string, window time.Duration) {
	if s := l.lookup(service); s != nil {
		s.EndWindow(window)
	}
}

// EndWindow is Limiter.EndWindow for s.
func (s *ServiceLimiter) EndWindow(window time.Duration) {
	if window <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.table.Load()
	for k, sl := range t.leaves {
		m := sl.e.meter.Load()
		if m == nil {
			continue
		}
		c := m.sums()
		if n := c.repN - m.seenN; n < 1<<62 {
			m.wN = costMeanDecay*m.wN + float64(n)
			m.wSum = costMeanDecay*m.wSum + float64(c.repSum-m.seenSum)
			if m.wN > 0 {
				m.mean.Store(uint64(math.Round(m.wSum / m.wN)))
			}
		}
		m.seenN, m.seenSum = c.repN, c.repSum
		pc, _, _ := sl.e.counts()
		cur, scale := pc.Offered, 1.0
		if t.cost != nil && t.cost.priced {
			cur, _ = m.totals(t.cost.mult(t.procs, k.proc), pc.Offered, pc.Dropped)
			scale = 1000
		}
		if m.acc += window; m.acc < shareWindow {
			continue // counts carry over to the next window
		}
		if d := cur - m.seenOffered; d < 1<<62 {
			m.rate[2], m.rate[1], m.rate[0] = m.rate[1], m.rate[0], float64(d)/scale/m.acc.Seconds()
			m.rates = min(m.rates+1, len(m.rate))
		}
		m.seenOffered, m.acc = cur, 0
	}
	s.sharesLocked(t) // from the rates before this window's
}

// shareRate is the leaf's rate for its share of a cap: of the window
// before the last (see sharesLocked), or of the one before that when it
// was lower, and false before the window before the last has ended. The
// policy a sidecar shares by may have been computed from either: the
// report, the flush and the tick each take their time, longer on a busy
// machine. A rising bucket's sidecars each taking the later window's rate
// against the earlier global one would hold more than the cap between
// them; the lower of the two never does while the global rate is no
// older. A falling bucket gets fewer slots for a window.
func (m *meter) shareRate() (float64, bool) {
	switch m.rates {
	case 0, 1:
		return 0, false
	case 2:
		return m.rate[1], true
	}
	return min(m.rate[1], m.rate[2]), true
}

// shareWindow is the shortest window a leaf's rate for its share of a cap
// is taken over. A surge report ends a report window early, and a rate
// over a tenth of a second of requests that came bunched (a busy machine's
// load generator catching up) is many times the leaf's part: two sidecars
// each taking such a share held more than the cap between them.
const shareWindow = 500 * time.Millisecond

// meterLocked gives the leaf k's entry of the new table nt a meter when nt
// needs one, keeps its cumulative costs continuous from the old table's
// price, and sets its share of a cap. s.mu must be held.
func (s *ServiceLimiter) meterLocked(old, nt *table, k leaf, sl slot) slot {
	m := sl.e.meter.Load()
	if m == nil {
		if nt.cost == nil {
			return sl
		}
		m = newMeter(s, nt.cost.def, siblingPool(old, nt, k))
		sl.e.meter.Store(m)
	}
	var om, nm uint64
	if old != nil {
		om = old.cost.mult(old.procs, k.proc)
	}
	nm = nt.cost.mult(nt.procs, k.proc)
	if om != nm {
		pc, _, _ := sl.e.counts()
		m.foldPrice(om, nm, pc.Offered, pc.Dropped)
	}
	if nt.cost == nil {
		return sl
	}
	switch {
	case sl.v == nil:
		sl.v = &verdict{m: m} // no rule: admits everything, counts its cost
	case sl.v.m == nil: // fresh from compile, in no slot yet
		sl.v.m = m
	case sl.v.m != m: // a slot of an older table (an evicted entry's) has it: leave that one be
		nv := *sl.v
		nv.m = m
		sl.v = &nv
	}
	return sl
}

// siblingPool returns the slot pool of another tier of k's (peer,
// procedure) in nt or old, nil if none has a meter yet.
func siblingPool(old, nt *table, k leaf) *slotPool {
	if k.tier == criticality.None {
		return nil
	}
	for _, tier := range criticality.Tiers {
		if tier == k.tier {
			continue
		}
		sib := leaf{k.peer, k.proc, tier}
		for _, t := range [...]*table{nt, old} {
			if t == nil {
				continue
			}
			if sl, ok := t.leaves[sib]; ok {
				if m := sl.e.meter.Load(); m != nil {
					return m.pool
				}
			}
		}
	}
	return nil
}

// sharesLocked sets every capped pool's share of its cap from t's rules
// and its leaves' rates. A pool's part of its bucket's load is the sum of
// its tiers' local rates over the sum of their global ones. The local
// rates are of the window before the one that ended last (shareRate),
// at a window's end and at a policy's install alike: that is the window
// the policy in force was most likely computed from (the report, a flush
// and a tick later). The last window's rate against it would take a
// rising bucket's share for more than its part, on every sidecar at once,
// and their shares would add up to more than the cap; so would two
// sidecars, one sharing by the last window (a policy installed) and one
// by the window before. s.mu must be held.
func (s *ServiceLimiter) sharesLocked(t *table) {
	if t.cost == nil || t.policy == nil {
		return
	}
	var pools []*slotPool
	for _, sl := range t.leaves {
		if sl.v == nil || sl.v.conc == nil || sl.v.m == nil {
			continue
		}
		p, m := sl.v.m.pool, sl.v.m
		if p.cap == 0 {
			pools = append(pools, p)
			p.cap = sl.v.rule.MaxConcurrency
		}
		p.cap = min(p.cap, sl.v.rule.MaxConcurrency)
		if r, ok := m.shareRate(); ok {
			p.local, p.hasLocal = p.local+r, true
		}
		if g := sl.v.rule.OfferedRPS; g > 0 && !math.IsInf(g, 0) {
			p.global += g
		}
	}
	for _, p := range pools {
		p.share.Store(shareOf(p.cap, p.local, p.hasLocal, p.global, t.policy.LiveInstances))
		p.cap, p.local, p.global, p.hasLocal = 0, 0, 0, false
	}
}
