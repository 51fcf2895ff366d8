package routes

import (
	"maps"
	"math/bits"
	"slices"
	"strings"
)

// The matcher is bit-parallel (Shift-And): route i is bit i of a bitset,
// and the routes that can still match the request are the set bits.
// Matching starts from the routes of the request's method and walks the
// path once, segment by segment: each segment ANDs in the routes that
// accept it at its index, found by one lookup in that index's table of
// literals; the end ANDs in the routes that accept that many segments. The
// first route in declaration order that matches is the lowest bit left.
// Nothing backtracks, so a request costs one lookup per segment however
// many routes overlap.

// bitset holds a set of route indexes: route i is bit i%64 of word i/64.
// Four words hold MaxRoutes.
type bitset [MaxRoutes / 64]uint64

func (b *bitset) set(i int) { b[i/64] |= 1 << (i % 64) }

// Routes is a compiled, immutable list of routes: safe for concurrent
// Match calls. A nil *Routes matches nothing.
type Routes struct {
	std       [len(stdMethods)]bitset // by stdMethod: the routes of that method and those of none
	methods   []methodSet             // the other methods routes name, in order of first mention
	any       bitset                  // the routes with no method: those of every method no route names
	pos       []position              // by segment index, as many as the longest template has segments
	end       []bitset                // by segment count 0..len(pos): the routes that accept that many
	rest      bitset                  // the routes ending in "*": the only ones that accept more than len(pos)
	wide      bool                    // more than 64 routes: words 1 to 3 of a bitset are in use
	distinct  []string                // Procedures: the distinct procedures, in order of first mention
	procIndex []int32                 // index in distinct, by route index
}

type methodSet struct {
	method string
	routes bitset // the routes of method and those of none
}

// stdMethods are the methods HTTP defines, found by a switch (stdMethod)
// rather than compared one by one.
var stdMethods = [...]string{"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}

// stdMethod returns m's index in stdMethods, or -1.
func stdMethod(m string) int {
	switch m {
	case "GET":
		return 0
	case "HEAD":
		return 1
	case "POST":
		return 2
	case "PUT":
		return 3
	case "DELETE":
		return 4
	case "CONNECT":
		return 5
	case "OPTIONS":
		return 6
	case "TRACE":
		return 7
	case "PATCH":
		return 8
	}
	return -1
}

// A position is what the routes accept at one segment index k.
type position struct {
	// slots is an open-addressing table of the literals of the routes at
	// k, by hash of the segment; nil when no route has one at k. Its
	// length is a power of two at least twice the literals, so that most
	// misses end at an empty slot; no literal is more than probes-1 slots
	// past its hash's.
	slots  []slot
	mult   uint64 // the hash's odd multiplier, chosen by fill
	probes uint16
	wild   bitset // any non-empty segment: "{name}" at k, or "*" at or before k
	empty  bitset // an empty segment: "*" at or before k; at k 0 also the root "/"
	star   bitset // "*" at or before k: anything from segment k on
}

type slot struct {
	word   uint64 // lit's first 8 bytes, little-endian, zero-padded (segWord)
	lit    string // "" for an empty slot
	routes bitset // the routes with lit at this position, and wild
}

// MatchIndex is Match for a table indexed by procedure: it returns the
// index in Procedures of the procedure Match would return, or -1 for
// names.Other. It allocates nothing.
//
// For at most 64 routes and a path of 8 to 64 bytes, the common case, it
// matches in one loop that calls nothing: a call costs about as much as a
// segment's lookup, and would make the loop keep its variables on the
// stack. It finds every '/' first, so that a segment's end costs two
// instructions that do not wait on reading the segment, and the lookups of
// successive segments overlap. Other cases go to matchN.
func (r *Routes) MatchIndex(method, path string) int {
	if r == nil || path == "" || path[0] != '/' {
		return -1
	}
	var ms *bitset
	if j := stdMethod(method); j >= 0 {
		ms = &r.std[j]
	} else {
		ms = r.otherMethod(method)
	}
	if r.wide || len(path) < 8 || len(path) > 64 {
		return r.index(r.matchN(ms, path))
	}
	m := ms[0]
	var sl uint64 // bit j: path[j] is a '/' not yet passed
	for j := 0; j < len(path); j += 8 {
		l := min(j, len(path)-8) // word, inlined: one load, from j or of the last 8 bytes
		t := load8(path[l:])>>((j-l)*8&63) ^ slash*lows
		z := ^((t&sevens + sevens) | t | sevens) // the high bit of each zero byte of t
		sl |= (z >> 7 * gather) >> 56 << (j & 63)
	}
	sl &^= 1 // the leading '/'
	stars := r.rest[0] != 0
	for k, i := 0, 1; k < len(r.pos); k++ {
		end := len(path)
		if sl != 0 {
			end = bits.TrailingZeros64(sl)
			sl &= sl - 1
		}
		pos := &r.pos[k]
		if stars && m&-m&pos.star[0] != 0 { // the first route left takes the rest of the path
			return int(r.procIndex[bits.TrailingZeros64(m)])
		}
		b := &pos.wild
		switch n := end - i; {
		case n == 0:
			b = &pos.empty
		case pos.slots != nil:
			l := min(i, len(path)-8) // word, inlined
			w := load8(path[l:]) >> ((i - l) * 8 & 63) & lowBytes[min(n, 8)]
			h := w ^ uint64(n)<<56 // segHash, inlined
			if n > 8 {
				h ^= bits.RotateLeft64(load8(path[end-8:]), 29)
			}
			h = h * pos.mult >> hashShift
			for range pos.probes {
				s := &pos.slots[h&uint64(len(pos.slots)-1)]
				if s.word == w && len(s.lit) == n && (n <= 8 || tailEqual(s.lit, path[i:end])) {
					b = &s.routes
					break
				}
				if s.lit == "" {
					break
				}
				h++
			}
		}
		if m &= b[0]; m == 0 {
			return -1
		}
		if end == len(path) {
			m &= r.end[k+1][0]
			goto done
		}
		i = end + 1
	}
	m &= r.rest[0]
done:
	if m == 0 {
		return -1
	}
	return int(r.procIndex[bits.TrailingZeros64(m)])
}

// index returns the procedure index of route i, or -1 for none.
func (r *Routes) index(i int) int {
	if i < 0 {
		return -1
	}
	return int(r.procIndex[i])
}

// otherMethod returns the routes of method, not one of stdMethods, and
// those of none.
func (r *Routes) otherMethod(method string) *bitset {
	for i := range r.methods {
		if r.methods[i].method == method {
			return &r.methods[i].routes
		}
	}
	return &r.any
}

// matchN returns the first route of ms that matches path, which starts
// with '/', or -1. It reads each segment once, and none past the
// len(r.pos)-th: only a "*" route takes more segments, whatever they are.
func (r *Routes) matchN(ms *bitset, path string) int {
	m := *ms
	var sl slashes
	sl.init(path)
	for k, i := 0, 1; k < len(r.pos); k++ {
		end := sl.next(path)
		b := r.pos[k].accept(path, i, end)
		m = bitset{m[0] & b[0], m[1] & b[1], m[2] & b[2], m[3] & b[3]}
		if m == (bitset{}) {
			return -1
		}
		if end == len(path) {
			b = &r.end[k+1]
			return first(m[0]&b[0], m[1]&b[1], m[2]&b[2], m[3]&b[3])
		}
		i = end + 1
	}
	return first(m[0]&r.rest[0], m[1]&r.rest[1], m[2]&r.rest[2], m[3]&r.rest[3])
}

// tailEqual reports whether a and b, of one length, agree past their first
// 8 bytes. It inlines.
func tailEqual(a, b string) bool {
	for j := 8; j < len(a) && j < len(b); j++ {
		if a[j] != b[j] {
			return false
		}
	}
	return true
}

// Constants of the search for '/'s 8 bytes at a time: with t a word of
// path bytes XOR slash*lows, ^((t&sevens+sevens)|t|sevens) has the high
// bit of each byte of t that is zero, of each '/'; shifted down 7 and
// multiplied by gather, its top byte has bit k for byte k.
const lows, sevens, slash, gather = 0x0101010101010101, 0x7f7f7f7f7f7f7f7f, 0x2f, 0x0102040810204080

// slashes finds the '/'s of a path, 64 bytes at a time: a segment's end
// costs a few instructions that do not wait on reading its bytes, so the
// lookups of successive segments overlap.
type slashes struct {
	base int    // where the window of 64 bytes starts
	bits uint64 // bit j: path[base+j] is a '/' not yet returned
}

// init loads the first window, past path's leading '/'.
func (s *slashes) init(path string) {
	s.base, s.bits = 0, slashMask(path, 0)&^1
}

// next returns the index of the next '/' of path, or len(path). Past the
// window it skips to the next '/' with strings.IndexByte, so a long
// segment costs what scanning it once does.
func (s *slashes) next(path string) int {
	if s.bits == 0 {
		if s.base+64 >= len(path) {
			return len(path)
		}
		j := strings.IndexByte(path[s.base+64:], '/')
		if j < 0 {
			s.base = len(path)
			return len(path)
		}
		s.base += 64 + j
		s.bits = slashMask(path, s.base)
	}
	j := s.base + bits.TrailingZeros64(s.bits)
	s.bits &= s.bits - 1
	return j
}

// slashMask returns the '/'s of path[base:base+64], bit j for
// path[base+j]. It reads the bytes 8 at a time.
func slashMask(path string, base int) uint64 {
	var mask uint64
	for j := 0; j < 64 && base+j < len(path); j += 8 {
		t := word(path, base+j) ^ slash*lows
		z := ^((t&sevens + sevens) | t | sevens) // the high bit of each zero byte of t
		mask |= (z >> 7 * gather) >> 56 << j
	}
	return mask
}

// word returns the 8 bytes of path from i, zeros past its end.
func word(path string, i int) uint64 {
	switch {
	case i+8 <= len(path):
		return load8(path[i:])
	case len(path) >= 8:
		return load8(path[len(path)-8:]) >> ((i + 8 - len(path)) * 8 & 63)
	}
	return segWord(path[i:])
}

// lowBytes[n] keeps the n low bytes of a word.
var lowBytes = [16]uint64{0, 0xff, 0xffff, 0xffffff, 0xffffffff, 0xff_ffffffff, 0xffff_ffffffff, 0xffffff_ffffffff, 0xffffffff_ffffffff}

// accept returns the routes that accept path[i:end], a segment, at pos. A
// lookup reads at most pos.probes slots (fewer than the literals at pos)
// and compares bytes past the 8th only with a literal of the segment's
// length and first 8 bytes.
func (pos *position) accept(path string, i, end int) *bitset {
	n := end - i
	switch {
	case n == 0:
		return &pos.empty
	case pos.slots == nil:
		return &pos.wild
	}
	w := word(path, i) & lowBytes[min(n, 8)]
	seg := path[i:end]
	h := segHash(seg, w) * pos.mult >> hashShift
	for range pos.probes {
		s := &pos.slots[h&uint64(len(pos.slots)-1)]
		if s.word == w && len(s.lit) == n && (n <= 8 || s.lit[8:] == seg[8:]) {
			return &s.routes
		}
		if s.lit == "" {
			break
		}
		h++
	}
	return &pos.wild
}

// hashShift drops the low half of segHash times a position's multiplier;
// the low bits of the rest index its slots.
const hashShift = 32

// segHash mixes a segment's first 8 bytes w, its length and its last 8
// bytes.
func segHash(seg string, w uint64) uint64 {
	h := w ^ uint64(len(seg))<<56
	if len(seg) > 8 {
		h ^= bits.RotateLeft64(load8(seg[len(seg)-8:]), 29)
	}
	return h
}

// first returns the lowest route index in the bitset {m0, m1, m2, m3}, or -1.
func first(m0, m1, m2, m3 uint64) int {
	switch {
	case m0 != 0:
		return bits.TrailingZeros64(m0)
	case m1 != 0:
		return 64 + bits.TrailingZeros64(m1)
	case m2 != 0:
		return 128 + bits.TrailingZeros64(m2)
	case m3 != 0:
		return 192 + bits.TrailingZeros64(m3)
	}
	return -1
}

// load8 returns s's first 8 bytes, little-endian: one load.
func load8(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// segWord returns s's first 8 bytes, little-endian, zeros past its end.
func segWord(s string) uint64 {
	var w uint64
	for i := 0; i < len(s) && i < 8; i++ {
		w |= uint64(s[i]) << (8 * i)
	}
	return w
}

// maxScan is the longest probe fill accepts without trying another
// multiplier; after a few it keeps the best.
const maxScan = 16

// compile builds r's matcher from the checked templates and the methods
// they name, in order of first mention.
func (r *Routes) compile(tmpls []template, methods []string) {
	np := 0
	for _, t := range tmpls {
		np = max(np, len(t.segs))
	}
	r.pos = make([]position, np)
	r.end = make([]bitset, np+1)
	r.wide = len(tmpls) > 64
	lits := make([]map[string]*bitset, np)
	for i, t := range tmpls {
		r.addRoute(i, t, lits)
		if t.method == "" {
			r.any.set(i)
		}
	}
	for j := range r.std {
		r.std[j] = r.any
	}
	for _, m := range methods {
		b := &r.any
		if j := stdMethod(m); j >= 0 {
			b = &r.std[j]
		} else {
			r.methods = append(r.methods, methodSet{method: m, routes: r.any})
			b = &r.methods[len(r.methods)-1].routes
		}
		for i, t := range tmpls {
			if t.method == m {
				b.set(i)
			}
		}
	}
	for k := range r.pos {
		r.pos[k].fill(lits[k])
	}
}

// addRoute sets route i, of template t, in the position and end sets, and
// in lits, the routes by literal at each position.
func (r *Routes) addRoute(i int, t template, lits []map[string]*bitset) {
	star := len(r.pos) // where t's "*" is; len(r.pos) for none
	if t.segs[len(t.segs)-1].kind == rest {
		star = len(t.segs) - 1
		r.rest.set(i)
	}
	for n := range r.end {
		if n >= star || n == len(t.segs) {
			r.end[n].set(i)
		}
	}
	for k, s := range t.segs {
		pos := &r.pos[k]
		switch {
		case k >= star:
		case s.kind == param:
			pos.wild.set(i)
		case s.lit == "": // the root "/"
			pos.empty.set(i)
		default:
			if lits[k] == nil {
				lits[k] = map[string]*bitset{}
			}
			if lits[k][s.lit] == nil {
				lits[k][s.lit] = new(bitset)
			}
			lits[k][s.lit].set(i)
		}
	}
	for k := star; k < len(r.pos); k++ {
		r.pos[k].wild.set(i)
		r.pos[k].empty.set(i)
		r.pos[k].star.set(i)
	}
}

// fill builds pos's table of lits, the routes by literal, trying
// multipliers until no literal is more than maxScan slots past its hash's,
// or keeping the best of a few. The table is the same for the same lits.
func (pos *position) fill(lits map[string]*bitset) {
	if len(lits) == 0 {
		return
	}
	size := 4
	for size < 2*len(lits) {
		size *= 2
	}
	keys := slices.Sorted(maps.Keys(lits))
	var best []slot
	var bestMult uint64
	bestProbes := 0
	for try := range 8 {
		mult := 0x9e3779b97f4a7c15 + uint64(try)*0xbf58476d1ce4e5b8 // odd
		slots := make([]slot, size)
		probes := 0
		for _, lit := range keys {
			w := segWord(lit)
			h := segHash(lit, segWord(lit)) * mult >> hashShift
			d := uint64(0)
			for slots[(h+d)&uint64(size-1)].lit != "" {
				d++
			}
			slots[(h+d)&uint64(size-1)] = slot{word: w, lit: lit, routes: or(lits[lit], &pos.wild)}
			probes = max(probes, int(d)+1)
		}
		if best == nil || probes < bestProbes {
			best, bestMult, bestProbes = slots, mult, probes
		}
		if probes <= maxScan {
			break
		}
	}
	pos.slots, pos.mult, pos.probes = best, bestMult, uint16(bestProbes)
}

func or(a, b *bitset) bitset {
	return bitset{a[0] | b[0], a[1] | b[1], a[2] | b[2], a[3] | b[3]}
}
