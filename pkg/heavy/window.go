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
type window struct {
	counters []atomic.Uint32 // Rows rows of Width counters, row after row

	// slots is the heavy set's membership, read without a lock: an
	// open-addressing table of keys (0: empty), linear probing. Written
	// only under mu. A reader may miss a key while mu's holder moves it;
	// it then takes mu and finds it there.
	slots []atomic.Uint64
	// floor is, once the set is full, the smallest estimate a value must
	// exceed to be worth taking mu for (the smallest member's estimate
	// when last computed, plus slack); 0 while the set has room.
	floor atomic.Uint32

	mu      sync.Mutex // guards entries, arena and writes to slots
	entries []entry    // len: members; cap: K
	arena   []byte     // K × MaxValueLen: member i's value at i×MaxValueLen
	maxLen  int
}

// entry is a member of the heavy set; its value is in the arena.
type entry struct {
	key uint64
	off [Rows]uint32
	n   uint16 // value length
}

const entrySize = 8 + 4*Rows + 8 // with padding

func newWindow(counters, slots, k, maxLen int) *window {
	return &window{
		counters: make([]atomic.Uint32, counters),
		slots:    make([]atomic.Uint64, slots),
		entries:  make([]entry, 0, k),
		arena:    make([]byte, k*maxLen),
		maxLen:   maxLen,
	}
}

// add increments the value at off by conservative update and returns its
// new estimate: each row at the minimum e is raised to e+1 by a
// compare-and-swap from e, the others are left alone; a lost
// compare-and-swap starts over. Rows are raised in row order, so two Adds
// of one value can not both succeed from the same e: successful Adds of a
// value get distinct estimates, and the last leaves every row at least at
// its own, hence at least at the number of successful Adds. A saturated
// value (e = 2³²−1) stays there.
func (w *window) add(off *[Rows]uint32) uint32 {
	c := w.counters
	c0, c1, c2, c3 := &c[off[0]], &c[off[1]], &c[off[2]], &c[off[3]]
	for {
		v0, v1, v2, v3 := c0.Load(), c1.Load(), c2.Load(), c3.Load()
		e := min(v0, v1, v2, v3)
		if e == math.MaxUint32 {
			return e
		}
		n := e + 1
		if (v0 == e && !c0.CompareAndSwap(e, n)) ||
			(v1 == e && !c1.CompareAndSwap(e, n)) ||
			(v2 == e && !c2.CompareAndSwap(e, n)) ||
			(v3 == e && !c3.CompareAndSwap(e, n)) {
			continue
		}
		return n
	}
}

func (w *window) estimate(off *[Rows]uint32) uint32 {
	c := w.counters
	return min(c[off[0]].Load(), c[off[1]].Load(), c[off[2]].Load(), c[off[3]].Load())
}

// has reports whether key is in the heavy set, without a lock.
func (w *window) has(key uint64) bool {
	mask := uint64(len(w.slots) - 1)
	for i := key & mask; ; i = (i + 1) & mask {
		switch w.slots[i].Load() {
		case key:
			return true
		case 0:
			return false
		}
	}
}

// insertKey puts key into slots; w.mu held, key absent, a free slot left.
func (w *window) insertKey(key uint64) {
	mask := uint64(len(w.slots) - 1)
	i := key & mask
	for w.slots[i].Load() != 0 {
		i = (i + 1) & mask
	}
	w.slots[i].Store(key)
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
			w.slots[i].Store(k)
			i = j
		}
	}
	w.slots[i].Store(0)
}

// value returns member i's value, backed by the arena; w.mu held.
func (w *window) value(i int) []byte {
	at := i * w.maxLen
	return w.arena[at : at+int(w.entries[i].n)]
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
	if len(w.entries) < cap(w.entries) {
		w.entries = append(w.entries, entry{})
		w.put(len(w.entries)-1, key, off, value)
		s.entered.Add(1)
		if len(w.entries) == cap(w.entries) {
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
	w.deleteKey(w.entries[i].key)
	w.put(i, key, off, value)
	s.evicted.Add(1)
	s.entered.Add(1)
	_, least = w.smallest()
	w.floor.Store(least + slack(least))
}

// put stores member i; w.mu held.
func (w *window) put(i int, key uint64, off *[Rows]uint32, value string) {
	w.entries[i] = entry{key: key, off: *off, n: uint16(len(value))}
	copy(w.arena[i*w.maxLen:], value)
	w.insertKey(key)
}

// smallest returns the member with the smallest estimate now, and that
// estimate; w.mu held, the set not empty.
func (w *window) smallest() (int, uint32) {
	at, least := 0, uint32(math.MaxUint32)
	for i := range w.entries {
		if e := w.estimate(&w.entries[i].off); e < least {
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
	w.entries = w.entries[:0]
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
	for i := range w.entries {
		dst = append(dst, Entry{Value: string(w.value(i)), Estimate: w.estimate(&w.entries[i].off)})
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
	return len(w.entries), s.k
}
