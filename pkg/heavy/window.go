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

// window is one window's table of counts and heavy set.
//
// The table is a set-associative Space-Saving summary: lines of Ways
// slots, each slot a value's tag and count (0: free). A value is counted
// in its line only, in the slot holding its tag. A value not in its line
// takes the first free slot, with count 1; once the line is full, it takes
// the slot with the least count m (the lowest such slot), with count m +
// 1, and the value that held it leaves. So:
//   - an Add of a value in its line is one atomic add, and a value alone
//     in its line is counted exactly;
//   - a slot's count never falls within a window (it grows, or changes
//     hands to a larger count), so neither does a line's least count; a
//     value that left its line had the least count when it left, and its
//     estimate, the line's least count, is never below its true count, nor
//     is a held value's (its count plus what it took over);
//   - serially, the counts of a line sum to its Adds, so no value is
//     over-counted by more than its line's Adds / Ways.
//
// Races: a slot may change hands between an Add's scan and its atomic
// add, which then counts for the new holder; the Add sees the tag it
// added to, and starts over (an over-count of the other value, never an
// under-count of its own). A value holds at most one slot at a time: of
// two Adds that take a slot for it while it holds none, each by a
// compare-and-swap of the whole word it read, the later read the
// earlier's slot before it was taken (else it would have found the value
// there) and chose its own as lower in (count, index); a slot's count only
// grows (a saturated one reads as 2³²−1 either way), so the earlier read
// that slot no higher and the later's no lower, and would have chosen the
// later's: a contradiction. Free slots are taken in order and are never
// freed within an epoch, so the later would have found the earlier's
// slot taken before its own free one.
//
// A tag is 27 bits of the value's hash, a bit always set (no tag is 0)
// and the window's epoch: three bits, advanced before and after reset
// clears the table. An Add stalled across its window's reset (a goroutine
// descheduled for a whole report interval) holds an older epoch's tag,
// which no word of the new one matches: its compare-and-swaps fail or
// take a slot for no value (whose holder, as any leaving value, reads the
// line's least count), its atomic add may raise another value's count by
// one, and its count is lost, as the package promises; it lowers no other
// value's, and it enters nothing in the new window's heavy set. The
// epoch repeats after four resets.
//
// The heavy set names the values that reached the threshold, for the
// report: they are counted in the table like any other (one atomic add on
// their slot already), and their estimates read from it.
type window struct {
	table []atomic.Uint64 // lines of Ways slots: tag<<33 | carry | count
	epoch atomic.Uint32   // advanced by reset; the low three bits tag slots

	// slots and slotEntry are the heavy set's membership, read without a
	// lock: an open-addressing table of keys (0: empty), linear probing,
	// and the index in entries of each slot's key. Written only under mu,
	// the index before the key. A reader may miss a key while mu's holder
	// moves it; it then counts in the table, which is only slower.
	slots     []atomic.Uint64
	slotEntry []atomic.Uint32
	// floor is, once the set is full, the smallest estimate a value must
	// exceed to be worth taking mu for (the smallest member's estimate
	// when last computed, plus slack); 0 while the set has room.
	floor atomic.Uint32

	mu      sync.Mutex // guards n, entries, arena, writes to slots
	n       int        // members: entries[:n]
	entries []entry    // K
	arena   []byte     // K × MaxValueLen: member i's value at i×MaxValueLen
	maxLen  int
}

// loc is a value's place in a window's table: the index of its line's
// first slot, and its tag there (never 0).
type loc struct{ line, tag uint32 }

// entry is a member of the heavy set; its value is in the arena.
type entry struct {
	key uint64
	at  loc
	len uint16
}

const entrySize = (8 + 8 + 2 + 7) / 8 * 8 // key, at, len, padded to a word

// A slot of the table: a tag in the upper 31 bits, a carry bit, and a
// count. An atomic add of 1 is used only while the count read is under
// addBelow, and an Add that read it lower and stalled while 2²⁴ others
// counted carries into the carry bit, never into the tag: a slot with its
// carry bit set reads as saturated, 2³²−1, as does a count there by
// compare-and-swap.
const (
	slotCount = 1<<32 - 1
	slotCarry = 1 << 32
	slotTag   = ^uint64(1<<33 - 1)
	addBelow  = math.MaxUint32 - 1<<24
)

// count returns a slot's count and carry bit: past 2³²−1 once it carried,
// which sat32 reads as 2³²−1.
func count(v uint64) uint64 { return v & (slotCarry | slotCount) }

// loc returns the place in w of the value whose hash is h: its line (from
// the hash's low bits) and its tag in w's epoch (from the high ones).
func (w *window) loc(h, lineMask uint64) loc {
	tag := uint32(h>>37)<<4 | 8 | w.epoch.Load()&7
	return loc{line: uint32(h&lineMask) * Ways, tag: tag}
}

func newWindow(slots, heavySlots, k, maxLen int) *window {
	return &window{
		table:     make([]atomic.Uint64, slots),
		slots:     make([]atomic.Uint64, heavySlots),
		slotEntry: make([]atomic.Uint32, heavySlots),
		entries:   make([]entry, k),
		arena:     make([]byte, k*maxLen),
		maxLen:    maxLen,
	}
}

// raceHook and estimateHook, nil outside tests, run where a concurrent Add
// may change a line: between an add's scan and its atomic operation, and
// after an estimate's first scan read slot i.
var (
	raceHook     func(line []atomic.Uint64)
	estimateHook func(i int)
)

func sat32(n uint64) uint32 { return uint32(min(n, math.MaxUint32)) }

// add counts one Add of the value at `at` and returns its estimate: at
// least the Adds of it that completed before this one began, plus one.
// See window for the rules; the loop starts over when a slot it read
// changed before its atomic operation.
func (w *window) add(at *loc) uint32 {
	line := w.table[at.line : at.line+Ways : at.line+Ways]
	tag := uint64(at.tag) << 33
	for {
		var seen [Ways]uint64
		// least is the least count of another value's slot, shifted, and
		// the slot's index below it: a branch-free running minimum (the
		// counts' order is random, and a mispredicted branch costs more
		// than the scan).
		mine, free, least := -1, -1, uint64(math.MaxUint64)
		for i := range line {
			v := line[i].Load()
			seen[i] = v
			if v == 0 {
				free = i // the slots after the first free one are free
				break
			}
			if v&slotTag == tag {
				mine = i
				break
			}
			least = min(least, count(v)<<3|uint64(i))
		}
		if raceHook != nil {
			raceHook(line)
		}
		switch {
		case mine >= 0:
			if v := seen[mine]; count(v) < addBelow {
				if n := line[mine].Add(1); n&slotTag == tag {
					return sat32(count(n))
				}
				continue // the slot changed hands: the add counted for its new holder
			} else if n := sat32(count(v) + 1); line[mine].CompareAndSwap(v, tag|uint64(n)) {
				return n
			}
		case free >= 0:
			if line[free].CompareAndSwap(0, tag|1) {
				return 1
			}
		default:
			k := int(least & (Ways - 1))
			v := seen[k]
			n := sat32(count(v) + 1)
			if line[k].CompareAndSwap(v, tag|uint64(n)) {
				return n
			}
		}
	}
}

// estimate returns the value's estimate: its slot's count, 0 if its line
// has a free slot and no slot of its, the line's least count otherwise.
// It scans the line until two scans see the same tags in the same slots,
// so that a value that left its line during the first is judged by counts
// read after it left. Under a line changing hands on every scan it gives
// up after a few and returns the largest count it read in the last, which
// is no less than any value's in the line.
func (w *window) estimate(at *loc) uint32 {
	line := w.table[at.line : at.line+Ways : at.line+Ways]
	tag := uint64(at.tag) << 33
	var prev [Ways]uint64
	for try := 0; ; try++ {
		var held, least, most uint64 = 0, math.MaxUint64, 0
		found, stable := false, try > 0
		for i := range line {
			v := line[i].Load()
			if try == 0 && estimateHook != nil {
				estimateHook(i)
			}
			if try > 0 && v&slotTag != prev[i]&slotTag {
				stable = false
			}
			prev[i] = v
			c := count(v)
			most = max(most, c)
			switch {
			case v == 0:
				least = 0
			case v&slotTag == tag && !found:
				held, found = c, true
			default:
				least = min(least, c)
			}
		}
		switch {
		case stable && found:
			return sat32(held)
		case stable:
			return sat32(least)
		case try == 8:
			return sat32(most)
		}
	}
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
func (s *Sketch) enter(w *window, key uint64, at *loc, value string, n uint32) {
	if !utf8.ValidString(value) {
		s.turnedAway.Add(1)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if at.tag&7 != w.epoch.Load()&7 {
		return // counted before w was reset: its tag is no longer w's
	}
	if w.has(key) {
		return // another Add of value got here first
	}
	if w.n < len(w.entries) {
		w.n++
		w.put(w.n-1, key, at, value)
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
	w.put(i, key, at, value)
	s.evicted.Add(1)
	s.entered.Add(1)
	_, least = w.smallest()
	w.floor.Store(least + slack(least))
}

// evict removes member i from slots; w.mu held. Its count stays in the
// table.
func (w *window) evict(i int) { w.deleteKey(w.entries[i].key) }

// put makes value member i, in an entry unused or evicted; w.mu held.
func (w *window) put(i int, key uint64, at *loc, value string) {
	e := &w.entries[i]
	e.at, e.len = *at, uint16(len(value))
	copy(w.arena[i*w.maxLen:], value)
	e.key = key
	w.insertKey(key, i)
}

// estimateOf returns member i's estimate; w.mu held.
func (w *window) estimateOf(i int) uint32 { return w.estimate(&w.entries[i].at) }

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
	// An epoch before the clearing and another after it: whatever a
	// stalled Add writes during it is tagged with an epoch no later Add
	// holds.
	w.epoch.Add(1)
	for i := range w.table {
		w.table[i].Store(0)
	}
	w.epoch.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.slots {
		w.slots[i].Store(0)
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
