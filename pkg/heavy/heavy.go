package heavy

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/sluicehq/sluice/pkg/wyhash"
)

const (
	// Ways is the number of slots of a line: a value is counted in one of
	// its line's slots, and a line is one 64-byte cache line.
	Ways = 8

	DefaultCounters    = 1 << 16 // slots per window: 8,192 lines, 512 KiB
	DefaultK           = 256
	DefaultMaxValueLen = 256

	// Invalid is the reserved key of values that are too long or not valid
	// UTF-8. Add counts a too-long value under it by itself.
	Invalid = "_invalid"

	minCounters = 2 * Ways
	maxCounters = 1 << 30
	maxK        = 1 << 16
	maxValueLen = math.MaxUint16
	maxArena    = 64 << 20 // a window's copies of its heavy values
)

// Options sizes a Sketch. The zero value of a field means its default.
type Options struct {
	// Counters is the number of slots per window, each a value's tag
	// and count: in lines of Ways slots, the number of lines
	// the largest power of two at most Counters/Ways. Memory is 16 bytes
	// per slot (8 per window, two windows).
	Counters int
	// K bounds the heavy set of each window.
	K int
	// MaxValueLen is the longest value Add hashes and the heavy set stores,
	// in bytes.
	MaxValueLen int
	// Threshold is the estimate at which a value enters the heavy set, until
	// SetThreshold changes it; 0: no value enters.
	Threshold uint32
}

func (o Options) withDefaults() Options {
	if o.Counters == 0 {
		o.Counters = DefaultCounters
	}
	if o.K == 0 {
		o.K = DefaultK
	}
	if o.MaxValueLen == 0 {
		o.MaxValueLen = DefaultMaxValueLen
	}
	return o
}

// Validate reports every field out of its bounds (zero fields take their
// defaults and are valid).
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.Counters < minCounters || o.Counters > maxCounters {
		errs = append(errs, fmt.Errorf("heavy: Counters %d: must be in [%d, %d]", o.Counters, minCounters, maxCounters))
	}
	if o.K < 1 || o.K > maxK {
		errs = append(errs, fmt.Errorf("heavy: K %d: must be in [1, %d]", o.K, maxK))
	}
	if o.MaxValueLen < len(Invalid) || o.MaxValueLen > maxValueLen {
		errs = append(errs, fmt.Errorf("heavy: MaxValueLen %d: must be in [%d, %d]", o.MaxValueLen, len(Invalid), maxValueLen))
	}
	if o.K*o.MaxValueLen > maxArena {
		errs = append(errs, fmt.Errorf("heavy: K × MaxValueLen = %d: must be at most %d bytes", o.K*o.MaxValueLen, maxArena))
	}
	return errors.Join(errs...)
}

// Slots returns the number of slots of each window: Lines × Ways.
func (o Options) Slots() int { return o.Lines() * Ways }

// Lines returns the number of lines of each window.
func (o Options) Lines() int {
	o = o.withDefaults()
	return 1 << (bits.Len(uint(o.Counters/Ways)) - 1)
}

// slots is the size of a heavy set's hash table: at most half full.
func (o Options) slots() int {
	o = o.withDefaults()
	return 1 << bits.Len(uint(2*o.K-1))
}

// Bytes returns the memory a Sketch built from o holds, whatever it
// counts: both windows' tables, heavy-set tables and value arenas.
func (o Options) Bytes() int {
	o = o.withDefaults()
	perWindow := o.Slots()*8 + // slots
		o.slots()*(8+4) + // membership table: keys and entry indices
		o.K*o.MaxValueLen + // value arena
		o.K*entrySize // entry metadata
	return 2 * perWindow
}

// Valid reports whether value may be counted and reported under its own
// name with the default MaxValueLen: at most DefaultMaxValueLen bytes of
// valid UTF-8. It allocates nothing.
func Valid(value string) bool {
	return len(value) <= DefaultMaxValueLen && utf8.ValidString(value)
}

// Sketch counts values per window; see the package documentation. All its
// methods are safe for concurrent use.
type Sketch struct {
	gen       atomic.Pointer[generation]
	gens      [2]generation // gens[i].cur = windows[i], .prev = windows[1-i]
	windows   [2]*window
	threshold atomic.Uint32
	keys      wyhash.Keys
	lineMask  uint64 // Lines − 1
	maxLen    int
	k         int

	mu sync.Mutex // serialises Rotate with AppendHeavy and Estimates, which read prev

	entered, evicted, turnedAway atomic.Uint64
}

// generation names the current and previous windows: immutable, swapped
// whole so that a reader never sees the same window as both.
type generation struct{ cur, prev *window }

// New returns a Sketch sized by o.
func New(o Options) (*Sketch, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	s := &Sketch{
		keys:     wyhash.New(),
		lineMask: uint64(o.Lines() - 1),
		maxLen:   o.MaxValueLen,
		k:        o.K,
	}
	for i := range s.windows {
		s.windows[i] = newWindow(o.Slots(), o.slots(), o.K, o.MaxValueLen)
	}
	s.gens[0] = generation{cur: s.windows[0], prev: s.windows[1]}
	s.gens[1] = generation{cur: s.windows[1], prev: s.windows[0]}
	s.gen.Store(&s.gens[0])
	s.threshold.Store(o.Threshold)
	return s, nil
}

// Valid is the package's Valid with this Sketch's MaxValueLen.
func (s *Sketch) Valid(value string) bool {
	return len(value) <= s.maxLen && utf8.ValidString(value)
}

// Add counts one occurrence of value in the current window and returns
// its estimate there, this Add included: at least the number of Adds of
// value that completed in the window before this one began, plus one. A
// value longer than MaxValueLen is counted under Invalid.
//
// It takes no lock and allocates nothing. A value whose estimate is at or
// above the threshold and not yet in the window's heavy set takes the
// set's mutex once to enter it (copied into memory reserved at New).
func (s *Sketch) Add(value string) uint32 { return s.AddHash(s.Hash(value), value) }

// Hash returns the hash under which the Sketch counts value (a value longer
// than MaxValueLen: Invalid's), for AddHash: a caller that also looks value
// up in a table of its own keyed by this hash hashes it once. It is keyed
// by keys drawn at New and constant for the Sketch's life, so a table
// built from it stays valid, and values can not be chosen to collide in
// it. It allocates nothing.
func (s *Sketch) Hash(value string) uint64 {
	if len(value) > s.maxLen {
		value = Invalid
	}
	var h uint64
	if n := len(value); n >= 8 && n <= wyhash.Short {
		// The common length of a tenant ID or an address, inlined: the
		// call cost 1–2 ns of a decision.
		_, _, h = s.keys.Short(value, uint64(n))
	} else {
		_, _, h = s.keys.Hash(value, uint64(n))
	}
	return h
}

// AddHash is Add of value for h = s.Hash(value), without hashing value
// again.
func (s *Sketch) AddHash(h uint64, value string) uint32 {
	if len(value) > s.maxLen {
		value = Invalid
	}
	return s.add(h, value)
}

func (s *Sketch) add(h uint64, value string) uint32 {
	key, w := h|1, s.gen.Load().cur
	at := w.loc(h, s.lineMask)
	n := w.add(&at)
	if th := s.threshold.Load(); n >= th && th != 0 && n > w.floor.Load() && !w.has(key) {
		s.enter(w, key, &at, value, n)
	}
	return n
}

// Estimate returns value's count in the current window.
// It takes no lock: a window is cleared only once it is the previous one.
func (s *Sketch) Estimate(value string) uint32 {
	w := s.gen.Load().cur
	at := w.loc(s.Hash(value), s.lineMask)
	return w.estimate(&at)
}

// Estimates returns value's count in the current and the previous window:
// a caller may smooth a rate over both (prev·(1−f) + cur, f the elapsed
// fraction of the current window). It waits for a Rotate in progress: it
// is for the reporter, off the request path.
func (s *Sketch) Estimates(value string) (cur, prev uint32) {
	h := s.Hash(value)
	s.mu.Lock() // no Rotate clears prev while it is read
	defer s.mu.Unlock()
	g := s.gen.Load()
	c, p := g.cur.loc(h, s.lineMask), g.prev.loc(h, s.lineMask)
	return g.cur.estimate(&c), g.prev.estimate(&p)
}

// SetThreshold sets the estimate at which a value enters the current
// window's heavy set, from now on; 0: no value enters. The reporter sets it
// for each window, before Rotate.
func (s *Sketch) SetThreshold(n uint32) { s.threshold.Store(n) }

// Rotate ends the current window: it becomes the previous one, and the
// older window, cleared, becomes current. Call it off the request path
// (the reporter's tick); it costs a pass over one window's slots.
//
// An Add racing with Rotate counts toward the window it loaded: the one
// that was current when it began, which is previous after Rotate. It is
// never counted in both, and the window it counted in is cleared only at
// the next Rotate.
func (s *Sketch) Rotate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gen.Load()
	g.prev.reset()
	if g == &s.gens[0] {
		s.gen.Store(&s.gens[1])
	} else {
		s.gen.Store(&s.gens[0])
	}
}
