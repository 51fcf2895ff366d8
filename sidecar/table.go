package sidecar

import "github.com/sluicehq/sluice/pkg/wyhash"

// peerTable is the read side of a table's leaves: it finds the slot of a
// leaf (peer, index: a procedure index and a tier, see procedures.go and
// leafIndex) for Decide. A service without procedures or criticality has
// index 0 alone, and its leaves are its peers. A map[string]slot lookup was the largest part of Decide's cost (a
// call to the runtime's string hash, a probe, a call to compare strings).
// This is an open-addressing hash table with linear probing over a flat
// array, and for a name of at most 16 bytes (most service names) the hash
// is two multiplies (pkg/wyhash) and the comparison three word compares,
// with no call to memequal. BenchmarkPeerLookup compares the two.
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
	wyhash.Keys
}

// peerSlot is one place of a peerTable: a leaf (peer, procedure index) and
// its slot, or free when slot.e is nil. (The empty name can not mark a free
// place: "" is a name that Decide looks up.) lo and hi are the peer's words
// (see wyhash.Keys.Hash), kept here so that a comparison need not load the
// name's bytes from elsewhere; key is the peer's length and the
// procedure's index (see leafKey).
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
	t := peerTable{slots: make([]peerSlot, size), Keys: wyhash.New()}
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
		lo, hi, i := t.Hash(k.peer, key)
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
	if n := len(peer); n >= 8 && n <= wyhash.Short {
		// The common length, inlined: the call cost 1–2 ns.
		lo, hi, h = t.Short(peer, key)
	} else {
		lo, hi, h = t.Hash(peer, key)
	}
	mask := uint64(len(t.slots) - 1)
	for i := h; ; i++ {
		ps := &t.slots[i&mask]
		if ps.slot.e == nil {
			return slot{}, false
		}
		// A short name is its length and its words.
		if ps.lo == lo && ps.hi == hi && ps.key == key &&
			(len(peer) <= wyhash.Short || ps.peer == peer) {
			return ps.slot, true
		}
	}
}

// nameTable maps the names a policy declares to their index, for a lookup
// per request (DecideGRPC): a peerTable without counters. Built once per
// policy, never modified.
type nameTable struct {
	slots []nameSlot // a power of two long, at most half full; nil: empty
	wyhash.Keys
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
	t := nameTable{slots: make([]nameSlot, size), Keys: wyhash.New()}
	mask := uint64(size - 1)
	for i, name := range names {
		key := leafKey(len(name), 0)
		lo, hi, h := t.Hash(name, key)
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
	lo, hi, h := t.Hash(name, key)
	mask := uint64(len(t.slots) - 1)
	for i := h; ; i++ {
		ns := &t.slots[i&mask]
		if !ns.used {
			return 0, false
		}
		if ns.lo == lo && ns.hi == hi && ns.key == key && (len(name) <= wyhash.Short || ns.name == name) {
			return ns.idx, true
		}
	}
}
