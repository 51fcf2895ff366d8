package sidecar

import (
	"math/bits"
	"math/rand/v2"
)

// peerTable is the read side of a table's leaves: it finds the slot of a
// leaf (peer, index: a procedure index and a tier, see procedures.go and
// leafIndex) for Decide. A service without procedures or criticality has
// index 0 alone, and its leaves are its peers. A map[string]slot lookup was the largest part of Decide's cost (a
// call to the runtime's string hash, a probe, a call to compare strings).
// This is an open-addressing hash table with linear probing over a flat
// array, and for a name of at most 16 bytes (most service names) the hash
// is one multiply and the comparison three word compares, with no call to
// memequal. BenchmarkPeerLookup compares the two.
//
// A peerTable is built in one go from the leaves map of a new table snapshot
// (leaves change rarely: a new leaf's first sighting, a policy swap) and is
// never modified afterwards, so readers need no synchronisation. The map
// stays the source of truth for writers and for iteration.
//
// Peer names come from requests, so the table must stay fast for names an
// attacker picks. Every byte of a name goes into its hash, which is keyed
// with random keys drawn for each table, so names can not be chosen to
// collide (the defence of Go's maps, whose hash where AES is missing is
// wyhash too); and the array is at most half full, so the probe for an
// absent name reaches a free place after a couple of steps on average.
// Names longer than names.MaxLen never reach the table: Decide rejects them
// before hashing.
type peerTable struct {
	slots []peerSlot // a power of two long, at most half full
	hashKeys
}

// hashKeys are a table's random hash keys.
type hashKeys struct{ k0, k1 uint64 }

func newHashKeys() hashKeys { return hashKeys{k0: rand.Uint64(), k1: rand.Uint64()} }

// peerSlot is one place of a peerTable: a leaf (peer, procedure index) and
// its slot, or free when slot.e is nil. (The empty name can not mark a free
// place: "" is a name that Decide looks up.) lo and hi are the peer's words
// (see hash), kept here so that a comparison need not load the name's bytes
// from elsewhere; key is the peer's length and the procedure's index (see
// leafKey).
type peerSlot struct {
	peer   string
	lo, hi uint64
	key    uint64
	slot   slot
}

// leafKey packs a peer name's length and a leaf index (a procedure index
// and a tier, see leafIndex) into one word, the first thing a lookup
// compares and the seed of the hash: index 0 (a service without
// procedures, or names.Other, and without criticality) leaves the length
// alone, so that Decide of such a service hashes and compares exactly as
// it did before procedures.
func leafKey(n int, idx uint32) uint64 { return uint64(n) | uint64(idx)<<32 }

// shortName is the longest name that its words hold entirely.
const shortName = 16

// minPeerTableSize is the smallest array; the reserved peers alone need 4.
const minPeerTableSize = 8

// newPeerTable indexes the current leaves of leaves, those whose procedure
// procs declares (see procedures.index) and whose tier crit has (see
// critTable.current), whose slots must all have counters (e != nil).
func newPeerTable(leaves map[leaf]slot, procs *procedures, crit *critTable) peerTable {
	size := minPeerTableSize
	for size < 2*len(leaves) {
		size *= 2
	}
	t := peerTable{slots: make([]peerSlot, size), hashKeys: newHashKeys()}
	mask := uint64(size - 1)
	for k, sl := range leaves {
		if sl.e == nil {
			panic("sidecar: peer " + k.peer + " has no counters")
		}
		idx, ok := procs.index(k.proc)
		if !ok || !crit.current(k.tier) { // stale: its procedure or tier is gone, and it waits for eviction
			continue
		}
		key := leafKey(len(k.peer), leafIndex(idx, k.tier))
		lo, hi, i := t.hash(k.peer, key)
		for t.slots[i&mask].slot.e != nil { // the keys of a map are distinct
			i++
		}
		t.slots[i&mask] = peerSlot{peer: k.peer, lo: lo, hi: hi, key: key, slot: sl}
	}
	return t
}

// get returns the slot of the leaf (peer, idx), and whether there is one. It
// allocates nothing, and the probe ends because at least half of the
// places are free.
func (t *peerTable) get(peer string, idx uint32) (slot, bool) {
	key := leafKey(len(peer), idx)
	var lo, hi, h uint64
	if n := len(peer); n >= 8 && n <= shortName {
		// hash, inlined for the common length: the call cost 1–2 ns.
		lo, hi = le64(peer), le64(peer[n-8:])
		phi, plo := bits.Mul64(lo^t.k0, hi^t.k1^key)
		h = mix(plo^t.k1, phi^t.k0)
	} else {
		lo, hi, h = t.hash(peer, key)
	}
	mask := uint64(len(t.slots) - 1)
	for i := h; ; i++ {
		ps := &t.slots[i&mask]
		if ps.slot.e == nil {
			return slot{}, false
		}
		// A short name is its length and its words.
		if ps.lo == lo && ps.hi == hi && ps.key == key &&
			(len(peer) <= shortName || ps.peer == peer) {
			return ps.slot, true
		}
	}
}

// nameTable maps the names a policy declares to their index, for a lookup
// per request (DecideGRPC): a peerTable without counters. Built once per
// policy, never modified.
type nameTable struct {
	slots []nameSlot // a power of two long, at most half full; nil: empty
	hashKeys
}

type nameSlot struct {
	name   string
	lo, hi uint64
	key    uint64 // the name's length, leafKey(len(name), 0)
	idx    uint32
	used   bool
}

// newNameTable indexes names, which must be distinct, by idx(i).
func newNameTable(names []string, idx func(i int) uint32) nameTable {
	if len(names) == 0 {
		return nameTable{}
	}
	size := minPeerTableSize
	for size < 2*len(names) {
		size *= 2
	}
	t := nameTable{slots: make([]nameSlot, size), hashKeys: newHashKeys()}
	mask := uint64(size - 1)
	for i, name := range names {
		key := leafKey(len(name), 0)
		lo, hi, h := t.hash(name, key)
		for t.slots[h&mask].used {
			h++
		}
		t.slots[h&mask] = nameSlot{name: name, lo: lo, hi: hi, key: key, idx: idx(i), used: true}
	}
	return t
}

// get returns the index of name, and whether t has it. It allocates
// nothing. name may be of any length: the caller bounds it.
func (t *nameTable) get(name string) (uint32, bool) {
	if len(t.slots) == 0 {
		return 0, false
	}
	key := leafKey(len(name), 0)
	lo, hi, h := t.hash(name, key)
	mask := uint64(len(t.slots) - 1)
	for i := h; ; i++ {
		ns := &t.slots[i&mask]
		if !ns.used {
			return 0, false
		}
		if ns.lo == lo && ns.hi == hi && ns.key == key && (len(name) <= shortName || ns.name == name) {
			return ns.idx, true
		}
	}
}

// hash returns the words of s and its hash, seeded with key (see leafKey).
//
// The words are s read as two little-endian words the way wyhash reads
// short inputs, first and last bytes overlapping, so that a name of at most
// shortName bytes is determined by its length and its words. A longer name
// gets its last sixteen bytes.
//
// The hash follows wyhash, keyed with the table's random keys:
// each sixteen bytes of a long name, then the words, go through mix, so
// every byte of s goes into the hash; the words' product is mixed once
// more, as wyhash does, so that the place depends on all of its bits.
func (t *hashKeys) hash(s string, key uint64) (lo, hi, h uint64) {
	n := len(s)
	h = t.k1 ^ key
	switch {
	case n > shortName:
		// The last block may overlap the words; that only costs a mix.
		for b := s; len(b) > shortName; b = b[16:] {
			h = mix(le64(b)^t.k0, le64(b[8:])^h)
		}
		lo, hi = le64(s[n-16:]), le64(s[n-8:])
	case n >= 8:
		lo, hi = le64(s), le64(s[n-8:])
	case n >= 4:
		lo, hi = le32(s), le32(s[n-4:])
	case n > 0:
		lo = uint64(s[0])<<16 | uint64(s[n/2])<<8 | uint64(s[n-1])
	}
	// wyhash's last two steps: the 128-bit product of the keyed words,
	// then its halves multiplied once more. With one multiply, names that
	// differ only in their last bytes (the words' high bits) share the low
	// bits of the product's low half, which leaves the place to its high
	// half alone; for about one key in 300 that piled most of a half-full
	// table (1024 such names) into one run hundreds of places long, which
	// every request from an unlisted caller then probes
	// (FuzzPeerTableProbes).
	phi, plo := bits.Mul64(lo^t.k0, hi^h)
	return lo, hi, mix(plo^t.k1, phi^t.k0)
}

// mix is wyhash's mixing step: the two halves of the 128-bit product,
// folded, so that the high bits of the operands reach the low bits of the
// result too, which pick the place.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// le64 returns the first 8 bytes of s, little endian: one load.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// le32 returns the first 4 bytes of s, little endian: one load.
func le32(s string) uint64 {
	_ = s[3]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}
