package heavy

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// window is one window's count-min sketch and heavy set.
//
// A member of the heavy set is counted in its own counter (entry.word), one
// atomic operation instead of a compare-and-swap on each of its rows, which
// a heavy value, alone in its counters, would otherwise pay on every Add.
// Its estimate is its rows' minimum plus that count. A member leaves the set
// only by eviction, which closes its counter, adds the count to its rows
// (flushes it) and only then removes it from slots.
type window struct {
	counters []atomic.Uint32 // Rows rows of Width counters, row after row

	// slots and slotEntry are the heavy set's membership, read without a
	// lock: an open-addressing table of keys (0: empty), linear probing,
	// and the index in entries of each slot's key. Written only under mu,
	// the index before the key. A reader may miss a key while mu's holder
	// moves it; it then counts in the rows, which is only slower.
	slots     []atomic.Uint64
	slotEntry []atomic.Uint32
	// floor is, once the set is full, the smallest estimate a value must
	// exceed to be worth taking mu for (the smallest member's estimate
	// when last computed, plus slack); 0 while the set has room.
	floor atomic.Uint32

	mu      sync.Mutex // guards n, entries' off and len, arena, writes to slots
	n       int        // members: entries[:n]
	entries []entry    // K
	arena   []byte     // K × MaxValueLen: member i's value at i×MaxValueLen
	maxLen  int
}

// entry is a member of the heavy set; its value is in the arena.
type entry struct {
	key  atomic.Uint64 // read by Adds to check a slot's index is still theirs
	word atomic.Uint64 // generation | flushed | closed | count
	off  [Rows]uint32
	len  uint16
}

// An entry's word: the count of Adds since the value entered (no window
// sees 2⁴⁸), closed once eviction began (Adds then count in the rows),
// flushed once the count is in the rows, and a generation bumped each time
// the entry is reused, so that a compare-and-swap of a word read before
// the entry changed hands fails.
const (
	countMask = 1<<48 - 1
	closed    = 1 << 48
	flushed   = 1 << 49
	genUnit   = 1 << 50
)

const entrySize = (8 + 8 + 4*Rows + 2 + 7) / 8 * 8 // key, word, off, len, padded to a word

func newWindow(counters, slots, k, maxLen int) *window {
	return &window{
		counters:  make([]atomic.Uint32, counters),
		slots:     make([]atomic.Uint64, slots),
		slotEntry: make([]atomic.Uint32, slots),
		entries:   make([]entry, k),
		arena:     make([]byte, k*maxLen),
		maxLen:    maxLen,
	}
}

func sat32(n uint64) uint32 { return uint32(min(n, math.MaxUint32)) }

// add adds c to the value at off by conservative update and returns its
// new estimate in the rows: with e the rows' minimum, each row under e+c is
// raised to e+c by a compare-and-swap from the value read; a lost
// compare-and-swap starts over. Rows are raised in row order, so two
// successful adds of one value never raise from overlapping ranges: the
// rows end at least at the sum of the successful adds, and each add
// returns at least the sum of those that completed before it began, plus
// its own. Counters saturate at 2³²−1.
func (w *window) add(off *[Rows]uint32, c uint32) uint32 {
	cs := w.counters
	c0, c1, c2 := &cs[off[0]], &cs[off[1]], &cs[off[2]]
	for {
		v0, v1, v2 := c0.Load(), c1.Load(), c2.Load()
		e := min(v0, v1, v2)
		if e == math.MaxUint32 {
			return e
		}
		t := e + min(c, math.MaxUint32-e)
		if (v0 < t && !c0.CompareAndSwap(v0, t)) ||
			(v1 < t && !c1.CompareAndSwap(v1, t)) ||
			(v2 < t && !c2.CompareAndSwap(v2, t)) {
			continue
		}
		return t
	}
}

func (w *window) estimate(off *[Rows]uint32) uint32 {
	c := w.counters
	return min(c[off[0]].Load(), c[off[1]].Load(), c[off[2]].Load())
}

// member returns key's entry, if key is in the heavy set; without a lock.
func (w *window) member(key uint64) (*entry, bool) {
	mask := uint64(len(w.slots) - 1)
	for i := key & mask; ; i = (i + 1) & mask {
		switch w.slots[i].Load() {
		case key:
			return &w.entries[w.slotEntry[i].Load()], true
		case 0:
			return nil, false
		}
	}
}

func (w *window) has(key uint64) bool {
	_, ok := w.member(key)
	return ok
}

// addMember counts an Add of key in its member counter, if key is a
// member, and returns its estimate. Otherwise the Add counts in the rows,
// plus unflushed: the count of a member being evicted, not yet in its rows.
func (w *window) addMember(key uint64, off *[Rows]uint32) (n uint32, unflushed uint64, ok bool) {
	e, ok := w.member(key)
	if !ok {
		return 0, 0, false
	}
	for {
		v := e.word.Load()
		if e.key.Load() != key { // evicted and reused since the slot was read
			return 0, 0, false
		}
		if v&closed != 0 {
			if v&flushed == 0 {
				return 0, v & countMask, false
			}
			return 0, 0, false
		}
		if e.word.CompareAndSwap(v, v+1) {
			return sat32(uint64(w.estimate(off)) + v&countMask + 1), 0, true
		}
	}
}

// estimateMember returns key's estimate in w, member or not.
func (w *window) estimateMember(key uint64, off *[Rows]uint32) uint32 {
	n := uint64(w.estimate(off))
	if e, ok := w.member(key); ok {
		if v := e.word.Load(); e.key.Load() == key && v&flushed == 0 {
			n += v & countMask
		}
	}
	return sat32(n)
}

// insertKey puts key, member i, into slots; w.mu held, key absent, a free
// slot left.
func (w *window) insertKey(key uint64, i int) {
	mask := uint64(len(w.slots) - 1)
	s := key & mask
	for w.slots[s].Load() != 0 {
		s = (s + 1) & mask
	}
	w.slotEntry[s].Store(uint32(i))
	w.slots[s].Store(key)
}

// deleteKey removes key from slots by backward shift (no tombstones, so
// the table never fills with them); w.mu held, key present.
func (w *window) deleteKey(key uint64) {
	mask := uint64(len(w.slots) - 1)
	i := key & mask
	for w.slots[i].Load() != key {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		k := w.slots[j].Load()
		if k == 0 {
			break
		}
		// k may move back to i unless its home lies cyclically in (i, j].
		if home := k & mask; (j-home)&mask >= (j-i)&mask {
			w.slotEntry[i].Store(w.slotEntry[j].Load())
			w.slots[i].Store(k)
			i = j
		}
	}
	w.slots[i].Store(0)
}

// value returns member i's value, backed by the arena; w.mu held.
func (w *window) value(i int) []byte {
	at := i * w.maxLen
	return w.arena[at : at+int(w.entries[i].len)]
}

// enter is the slow path of an Add whose estimate n reached the
// threshold: it adds value to w's heavy set, if still absent. When the set
// is full, value replaces the smallest member (by estimate now) if it
// exceeds it by more than slack, and is turned away otherwise; either way
// the floor is raised to what the next candidate must exceed.
func (s *Sketch) enter(w *window, key uint64, off *[Rows]uint32, value string, n uint32) {
	if !utf8.ValidString(value) {
		s.turnedAway.Add(1)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.has(key) {
		return // another Add of value got here first
	}
	if w.n < len(w.entries) {
		w.n++
		w.put(w.n-1, key, off, value)
		s.entered.Add(1)
		if w.n == len(w.entries) {
			_, least := w.smallest()
			w.floor.Store(least + slack(least))
		}
		return
	}
	i, least := w.smallest()
	if n <= least+slack(least) {
		w.floor.Store(least + slack(least))
		s.turnedAway.Add(1)
		return
	}
	w.evict(i)
	w.put(i, key, off, value)
	s.evicted.Add(1)
	s.entered.Add(1)
	_, least = w.smallest()
	w.floor.Store(least + slack(least))
}

// evict closes member i's counter, adds its count to its rows and removes
// it from slots, in that order: an Add that finds it closed but not yet
// flushed adds the count to the estimate it returns; w.mu held.
func (w *window) evict(i int) {
	e := &w.entries[i]
	v := e.word.Or(closed)
	if c := v & countMask; c > 0 {
		w.add(&e.off, sat32(c))
	}
	e.word.Or(flushed)
	w.deleteKey(e.key.Load())
}

// put makes value member i, in an entry unused or evicted; w.mu held.
func (w *window) put(i int, key uint64, off *[Rows]uint32, value string) {
	e := &w.entries[i]
	e.off, e.len = *off, uint16(len(value))
	copy(w.arena[i*w.maxLen:], value)
	e.key.Store(key)
	e.word.Store((e.word.Load() &^ (genUnit - 1)) + genUnit) // a new generation, count 0, open
	w.insertKey(key, i)
}

// estimateOf returns member i's estimate; w.mu held.
func (w *window) estimateOf(i int) uint32 {
	e := &w.entries[i]
	n := uint64(w.estimate(&e.off))
	if v := e.word.Load(); v&flushed == 0 {
		n += v & countMask
	}
	return sat32(n)
}

// smallest returns the member with the smallest estimate now, and that
// estimate; w.mu held, the set not empty.
func (w *window) smallest() (int, uint32) {
	at, least := 0, uint32(math.MaxUint32)
	for i := range w.n {
		if e := w.estimateOf(i); e < least {
			at, least = i, e
		}
	}
	return at, least
}

// slack is by how much a candidate must exceed the smallest member to
// replace it: a sixteenth, so that two values neck and neck do not take
// turns (and the mutex) on every Add. The set keeps the K largest values
// to within that.
func slack(least uint32) uint32 {
	s := least/16 + 1
	if least > math.MaxUint32-s {
		return math.MaxUint32 - least
	}
	return s
}

// reset clears the window for reuse as the current one; no Add may have
// loaded it since it was last current, but one stalled since then could
// still write (see Rotate).
func (w *window) reset() {
	for i := range w.counters {
		w.counters[i].Store(0)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.slots {
		w.slots[i].Store(0)
	}
	for i := range w.n {
		w.entries[i].key.Store(0)
	}
	w.n = 0
	w.floor.Store(0)
}

// Entry is a heavy value of a window and its count there.
type Entry struct {
	Value    string
	Estimate uint32
}

// AppendHeavy appends the previous window's heavy set (the window Rotate
// just ended), largest estimate first, to dst and returns it. It allocates
// one string per entry, and dst's growth: it is the reporter's, off the
// request path.
func (s *Sketch) AppendHeavy(dst []Entry) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.gen.Load().prev
	w.mu.Lock()
	start := len(dst)
	for i := range w.n {
		dst = append(dst, Entry{Value: string(w.value(i)), Estimate: w.estimateOf(i)})
	}
	w.mu.Unlock()
	slices.SortFunc(dst[start:], func(a, b Entry) int {
		if c := cmp.Compare(b.Estimate, a.Estimate); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	return dst
}

// Stats counts the heavy sets' traffic since New, over all windows.
type Stats struct {
	Entered    uint64 // values that entered a heavy set
	Evicted    uint64 // members replaced by a larger value in a full set
	TurnedAway uint64 // values over the threshold that did not enter: the set was full of larger ones, or the value was not valid UTF-8
}

// Stats returns the heavy sets' counts so far; each is read atomically.
func (s *Sketch) Stats() Stats {
	return Stats{Entered: s.entered.Load(), Evicted: s.evicted.Load(), TurnedAway: s.turnedAway.Load()}
}

// Heavy returns the number of values in the current window's heavy set and
// its capacity K: how full it is, for a gauge.
func (s *Sketch) Heavy() (n, k int) {
	w := s.gen.Load().cur
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, s.k
}
