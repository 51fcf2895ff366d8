package heavy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func mustNew(t testing.TB, o Options) *Sketch {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// names returns n distinct values shaped like tenant ids.
// locate hashes value to its heavy-set key (never 0) and its place in the
// current window's table.
func (s *Sketch) locate(value string) (key uint64, at loc) {
	h := s.Hash(value)
	return h | 1, s.gen.Load().cur.loc(h, s.lineMask)
}

func names(n int) []string {
	v := make([]string, n)
	for i := range v {
		v[i] = fmt.Sprintf("tenant-%07d", i)
	}
	return v
}

// stream is a named way to draw value indices from [0, distinct).
type stream struct {
	name     string
	distinct int
	draw     func(r *rand.Rand) func() int
}

var streams = []stream{
	{"uniform-10", 10, uniform(10)},
	{"uniform-2k", 2000, uniform(2000)},
	{"uniform-50k", 50000, uniform(50000)},
	{"zipf-50k", 50000, zipf(1.1, 50000)},
}

func uniform(n int) func(r *rand.Rand) func() int {
	return func(r *rand.Rand) func() int { return func() int { return r.IntN(n) } }
}

func zipf(s float64, n int) func(r *rand.Rand) func() int {
	return func(r *rand.Rand) func() int {
		z := rand.NewZipf(r, s, 1, uint64(n-1))
		return func() int { return int(z.Uint64()) }
	}
}

// TestNeverUnderCounts checks, against an exact count, that no Add returns
// and no Estimate reads less than the value's true count, over many seeds,
// stream shapes and a narrow sketch that collides a lot.
func TestNeverUnderCounts(t *testing.T) {
	for _, st := range streams {
		vals := names(st.distinct)
		for _, counters := range []int{16, 64, 1024, DefaultCounters} { // the first: two lines, full at once
			t.Run(fmt.Sprintf("%s/counters-%d", st.name, counters), func(t *testing.T) {
				for seed := range uint64(10) {
					r := rand.New(rand.NewPCG(seed, 15))
					next := st.draw(r)
					s := mustNew(t, Options{Counters: counters})
					exact := make([]uint32, st.distinct)
					for range 10000 {
						i := next()
						exact[i]++
						if got := s.Add(vals[i]); got < exact[i] {
							t.Fatalf("seed %d: Add(%s) = %d after %d adds", seed, vals[i], got, exact[i])
						}
					}
					for i, want := range exact {
						if got := s.Estimate(vals[i]); got < want {
							t.Fatalf("seed %d: Estimate(%s) = %d, true count %d", seed, vals[i], got, want)
						}
					}
				}
			})
		}
	}
}

// TestOverCountWithinBound checks the stated bound, which holds for every
// value, serially: a value's estimate exceeds its count by at most its
// line's Adds / Ways. The table is narrow (32 lines for 5,000 values) so
// that lines overflow; a value absent from the window reads 0 in a line
// with a free slot. It also checks the bound is not loose: most values of
// a full line are over-counted.
func TestOverCountWithinBound(t *testing.T) {
	const n, distinct = 50000, 5000
	vals := names(distinct)
	o := Options{Counters: 32 * Ways}
	for _, st := range []stream{{"uniform", distinct, uniform(distinct)}, {"zipf", distinct, zipf(1.1, distinct)}} {
		t.Run(st.name, func(t *testing.T) {
			for seed := range uint64(10) {
				s := mustNew(t, o)
				next := st.draw(rand.New(rand.NewPCG(seed, 7)))
				exact := map[int]uint32{}
				lineAdds := map[uint32]uint32{}
				for range n {
					i := next()
					exact[i]++
					_, at := s.locate(vals[i])
					lineAdds[at.line]++
					s.Add(vals[i])
				}
				closest := 1.0 // the least share of its bound a value's over-count left unused
				for i, c := range exact {
					_, at := s.locate(vals[i])
					got := s.Estimate(vals[i])
					bound := lineAdds[at.line] / Ways
					if got < c || got-c > bound {
						t.Fatalf("seed %d: Estimate(%s) = %d, count %d: over by more than its line's Adds / Ways = %d", seed, vals[i], got, c, bound)
					}
					closest = min(closest, 1-float64(got-c)/float64(bound))
				}
				if closest > 0.1 {
					t.Errorf("seed %d: no value's over-count came within 10 %% of its bound: the test checks less than it says", seed)
				}
			}
		})
	}
	// A value never added reads 0 while its line has a free slot, though
	// other values hold some.
	s := mustNew(t, Options{Counters: 2 * Ways})
	vals = sameLine(t, s, Ways)
	for _, v := range vals[:Ways-1] {
		s.Add(v)
		s.Add(v)
	}
	if got := s.Estimate(vals[Ways-1]); got != 0 {
		t.Errorf("Estimate of a value never added = %d in a line with a free slot", got)
	}
}

// TestZipfTopValuesAreHeavy checks that the true top values of a Zipf
// stream over 100,000 values are in the heavy set, with estimates no lower
// than their counts, largest first.
func TestZipfTopValuesAreHeavy(t *testing.T) {
	const distinct, n, top = 100000, 300000, 10
	vals := names(distinct)
	for seed := range uint64(3) {
		s := mustNew(t, Options{K: 32, Threshold: 200})
		next := zipf(1.1, distinct)(rand.New(rand.NewPCG(seed, 3)))
		exact := make([]uint32, distinct)
		for range n {
			i := next()
			exact[i]++
			s.Add(vals[i])
		}
		s.Rotate()
		got := s.AppendHeavy(nil)
		if len(got) == 0 || len(got) > 32 {
			t.Fatalf("seed %d: %d heavy values, want 1 to K = 32", seed, len(got))
		}
		if !slices.IsSortedFunc(got, func(a, b Entry) int { return int(b.Estimate) - int(a.Estimate) }) {
			t.Errorf("seed %d: heavy values not largest first: %v", seed, got)
		}
		heavy := map[string]uint32{}
		for _, e := range got {
			heavy[e.Value] = e.Estimate
		}
		order := make([]int, distinct)
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int { return int(exact[b]) - int(exact[a]) })
		for _, i := range order[:top] {
			est, ok := heavy[vals[i]]
			if !ok {
				t.Errorf("seed %d: %s (count %d) not among the heavy values %v", seed, vals[i], exact[i], got)
			} else if est < exact[i] {
				t.Errorf("seed %d: %s: heavy estimate %d below its count %d", seed, vals[i], est, exact[i])
			}
		}
	}
}

// TestConcurrentAddsOfOneValue: Adds of one value from several goroutines
// return each estimate from 1 to the total exactly once, each goroutine's
// in increasing order, and the final estimate is the total: a value that
// holds its slot is counted by one atomic add.
func TestConcurrentAddsOfOneValue(t *testing.T) {
	const goroutines, each = 4, 100000
	s := mustNew(t, Options{})
	got := make([][]uint32, goroutines)
	var wg sync.WaitGroup
	start := make(chan struct{}) // so that the goroutines overlap
	for g := range goroutines {
		got[g] = make([]uint32, 0, each)
		wg.Go(func() {
			<-start
			for range each {
				got[g] = append(got[g], s.Add("acme"))
			}
		})
	}
	close(start)
	wg.Wait()
	var all []uint32
	for g, ns := range got {
		if !slices.IsSorted(ns) {
			t.Errorf("goroutine %d: estimates not increasing", g)
		}
		all = append(all, ns...)
	}
	slices.Sort(all)
	for i, n := range all {
		if n != uint32(i+1) {
			t.Fatalf("the %d-th smallest estimate returned is %d, want %d: lost or doubled Adds", i+1, n, i+1)
		}
	}
	if est := s.Estimate("acme"); est != goroutines*each {
		t.Errorf("Estimate = %d, want %d", est, goroutines*each)
	}
}

// TestEvictionRacingAdds: two values take turns in a heavy set of one,
// each evicted while its own Adds run; their estimates end exactly at
// their counts (each holds a slot of its own), in the set and out.
func TestEvictionRacingAdds(t *testing.T) {
	phases := []struct{ a, b int }{ // Adds per goroutine, two goroutines per value
		{2000, 0},     // a enters
		{500, 10000},  // b overtakes a and evicts it while a is counted
		{20000, 500},  // a evicts b while b is counted
		{1000, 30000}, // and b a again
	}
	for trial := range 10 {
		s := mustNew(t, Options{K: 1, Threshold: 10})
		var total [2]uint32
		for _, p := range phases {
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range 4 {
				v, n := "a", p.a
				if g >= 2 {
					v, n = "b", p.b
				}
				total[g/2] += uint32(n)
				wg.Go(func() {
					<-start
					for range n {
						s.Add(v)
					}
				})
			}
			close(start)
			wg.Wait()
		}
		if got := s.Stats(); got.Evicted < 3 {
			t.Fatalf("trial %d: Stats = %+v, want at least 3 evictions: the test checks less than it says", trial, got)
		}
		a, b := s.Estimate("a"), s.Estimate("b")
		if a != total[0] || b != total[1] {
			t.Fatalf("trial %d: Estimate(a) = %d, Estimate(b) = %d; want %d, %d", trial, a, b, total[0], total[1])
		}
		s.Rotate()
		want := []Entry{{"b", total[1]}}
		if got := s.AppendHeavy(nil); !slices.Equal(got, want) {
			t.Fatalf("trial %d: AppendHeavy = %v, want %v", trial, got, want)
		}
	}
}

// TestConcurrentAddsNeverUnderCount: goroutines add overlapping values on
// a narrow sketch; every estimate ends at or above the total count.
func TestConcurrentAddsNeverUnderCount(t *testing.T) {
	t.Run("32-lines", func(t *testing.T) { concurrentAdds(t, Options{Counters: 256, K: 8, Threshold: 50}, 300) })
	// Two lines for 24 values: every Add of a value out of its line takes
	// a slot from another, and Adds of one value race to take one.
	t.Run("2-lines", func(t *testing.T) { concurrentAdds(t, Options{Counters: 16, K: 2, Threshold: 1000}, 24) })
}

func concurrentAdds(t *testing.T, o Options, distinct int) {
	const goroutines, each = 4, 20000
	vals := names(distinct)
	s := mustNew(t, o)
	counts := make([][]uint32, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		counts[g] = make([]uint32, distinct)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range each {
				i := r.IntN(distinct)
				counts[g][i]++
				s.Add(vals[i])
			}
		})
	}
	wg.Wait()
	for i, v := range vals {
		var want uint32
		for g := range goroutines {
			want += counts[g][i]
		}
		if got := s.Estimate(v); got < want {
			t.Errorf("Estimate(%s) = %d, true count %d", v, got, want)
		}
	}
}

func TestRotate(t *testing.T) {
	s := mustNew(t, Options{Threshold: 2})
	check := func(step string, wantCur, wantPrev uint32, wantHeavy ...Entry) {
		t.Helper()
		if cur, prev := s.Estimates("a"); cur != wantCur || prev != wantPrev {
			t.Errorf("%s: Estimates(a) = %d, %d; want %d, %d", step, cur, prev, wantCur, wantPrev)
		}
		if got := s.AppendHeavy(nil); !slices.Equal(got, wantHeavy) {
			t.Errorf("%s: AppendHeavy = %v, want %v", step, got, wantHeavy)
		}
	}
	for range 3 {
		s.Add("a")
	}
	s.Add("b")
	check("window 1", 3, 0)
	s.Rotate()
	check("after 1st Rotate", 0, 3, Entry{"a", 3})
	s.Add("a")
	check("window 2", 1, 3, Entry{"a", 3})
	s.Rotate()
	check("after 2nd Rotate", 0, 1)
	s.Rotate()
	check("after 3rd Rotate", 0, 0)
}

// TestRotateRacingAdds: Adds racing with one Rotate count toward exactly
// one of the two windows: current and previous sum to the total, and the
// previous holds at least the Adders' first halves (their second halves
// start as Rotate does, and race with it).
func TestRotateRacingAdds(t *testing.T) {
	const goroutines, each = 4, 10000
	for trial := range 20 {
		s := mustNew(t, Options{})
		var half, done sync.WaitGroup
		rotating := make(chan struct{})
		half.Add(goroutines)
		for range goroutines {
			done.Go(func() {
				for range each / 2 {
					s.Add("v")
				}
				half.Done()
				<-rotating
				for range each - each/2 {
					s.Add("v")
				}
			})
		}
		half.Wait()
		close(rotating)
		s.Rotate()
		done.Wait()
		cur, prev := s.Estimates("v")
		if cur+prev != goroutines*each || prev < goroutines*each/2 {
			t.Fatalf("trial %d: current %d + previous %d, want a total of %d with at least %d previous",
				trial, cur, prev, goroutines*each, goroutines*each/2)
		}
	}
}

func TestHeavySetKeepsTheLargest(t *testing.T) {
	s := mustNew(t, Options{K: 2, Threshold: 1})
	add := func(v string, n int) {
		for range n {
			s.Add(v)
		}
	}
	add("a", 100)
	add("b", 50)
	add("c", 52) // within slack of b (50 + 50/16 + 1): turned away once, then the floor is 54
	if st := s.Stats(); st != (Stats{Entered: 2, TurnedAway: 1}) {
		t.Errorf("after a, b, c: Stats = %+v, want 2 entered, 1 turned away", st)
	}
	add("c", 10) // 62 > 50 + 50/16 + 1: replaces b
	add("d", 5)  // under the floor: never takes the mutex
	before := s.Stats()
	add("e", 3)
	if s.Stats() != before {
		t.Errorf("a value under the floor changed Stats: %+v, then %+v", before, s.Stats())
	}
	if n, k := s.Heavy(); n != 2 || k != 2 {
		t.Errorf("Heavy() = %d, %d; want 2, 2", n, k)
	}
	s.Rotate()
	want := []Entry{{"a", 100}, {"c", 62}}
	if got := s.AppendHeavy(nil); !slices.Equal(got, want) {
		t.Errorf("AppendHeavy = %v, want %v", got, want)
	}
	if st := s.Stats(); st.Entered != 3 || st.Evicted != 1 {
		t.Errorf("Stats = %+v, want 3 entered, 1 evicted", st)
	}
}

// Hash is wyhash's, seeded with the length, at every length, its inlined
// short form included; and a value too long is Invalid's.
func TestHashIsWyhash(t *testing.T) {
	for _, maxLen := range []int{len(Invalid) + 2, DefaultMaxValueLen} {
		s := mustNew(t, Options{MaxValueLen: maxLen})
		for n := range DefaultMaxValueLen + 2 {
			v := strings.Repeat("v", n)
			w := v
			if n > maxLen {
				w = Invalid
			}
			if _, _, want := s.keys.Hash(w, uint64(len(w))); s.Hash(v) != want {
				t.Errorf("MaxValueLen %d, length %d: Hash = %#x, wyhash %#x", maxLen, n, s.Hash(v), want)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	long := strings.Repeat("x", DefaultMaxValueLen+1)
	for _, c := range []struct {
		v    string
		want bool
	}{
		{"acme", true},
		{"", true},
		{"ünïcode", true},
		{strings.Repeat("x", DefaultMaxValueLen), true},
		{long, false},
		{"a\xff", false},
		{"a\xc3", false},
	} {
		if got := Valid(c.v); got != c.want {
			t.Errorf("Valid(%.20q) = %v, want %v", c.v, got, c.want)
		}
	}
	s := mustNew(t, Options{MaxValueLen: 16, Threshold: 1})
	if s.Valid(strings.Repeat("x", 17)) || !s.Valid(strings.Repeat("x", 16)) {
		t.Error("Sketch.Valid does not use MaxValueLen")
	}
	s.Add(strings.Repeat("x", 17))
	s.Add(strings.Repeat("y", 100))
	if got := s.Estimate(Invalid); got != 2 {
		t.Errorf("Estimate(Invalid) = %d after two too-long values, want 2", got)
	}
	// Too long for a MaxValueLen below 16, at the lengths Hash writes out.
	short := mustNew(t, Options{MaxValueLen: len(Invalid) + 2, Threshold: 1})
	for n := len(Invalid) + 3; n <= 16; n++ {
		short.Add(strings.Repeat("z", n))
	}
	if got, want := short.Estimate(Invalid), uint32(16-len(Invalid)-2); got != want {
		t.Errorf("Estimate(Invalid) = %d after %d values of 11 to 16 bytes, MaxValueLen 10; want %d", got, want, want)
	}
	s.Add("a\xff")
	s.Rotate()
	want := []Entry{{Invalid, 2}}
	if got := s.AppendHeavy(nil); !slices.Equal(got, want) {
		t.Errorf("AppendHeavy = %+v, want %+v (invalid UTF-8 is never stored)", got, want)
	}
	if st := s.Stats(); st.TurnedAway != 1 {
		t.Errorf("Stats().TurnedAway = %d, want 1 (the invalid UTF-8)", st.TurnedAway)
	}
}

func TestSaturates(t *testing.T) {
	s := mustNew(t, Options{})
	s.Add("a")
	_, at := s.locate("a")
	w := s.gen.Load().cur
	for i := range Ways {
		if v := w.table[at.line+uint32(i)].Load(); v&slotTag == uint64(at.tag)<<33 {
			w.table[at.line+uint32(i)].Store(v&slotTag | (math.MaxUint32 - 1))
		}
	}
	if got := s.Add("a"); got != math.MaxUint32 {
		t.Errorf("Add = %d, want %d", got, uint32(math.MaxUint32))
	}
	if got := s.Add("a"); got != math.MaxUint32 {
		t.Errorf("Add past saturation = %d, want %d (never wraps)", got, uint32(math.MaxUint32))
	}
}

// TestAddAllocatesNothing covers every request-path case: light values,
// heavy members, and values entering a full set or turned away from it.
func TestAddAllocatesNothing(t *testing.T) {
	vals := names(10000)
	for _, c := range []struct {
		name string
		o    Options
	}{
		{"light", Options{Threshold: math.MaxUint32}},
		{"no-threshold", Options{}},
		{"heavy-churn", Options{K: 4, Threshold: 1}},
		{"narrow", Options{Counters: 64, Threshold: 1}},
	} {
		s := mustNew(t, c.o)
		i := 0
		if a := testing.AllocsPerRun(20000, func() {
			s.Add(vals[i%len(vals)])
			i++
		}); a != 0 {
			t.Errorf("%s: Add allocates %v per call", c.name, a)
		}
		if a := testing.AllocsPerRun(1000, func() { s.Estimates(vals[0]) }); a != 0 {
			t.Errorf("%s: Estimates allocates %v per call", c.name, a)
		}
	}
	if a := testing.AllocsPerRun(1000, func() { Valid("tenant-ünïcode") }); a != 0 {
		t.Errorf("Valid allocates %v per call", a)
	}
}

// TestMemoryIsFixed: New allocates about Options.Bytes, and counting a
// quarter of a million distinct values, many of them churning through the heavy set,
// allocates nothing more.
func TestMemoryIsFixed(t *testing.T) {
	o := Options{Counters: 1 << 15, K: 256, MaxValueLen: 256, Threshold: 2}
	want := 2 * (1<<15*8 + 512*12 + 256*256 + 256*24)
	if unsafe.Sizeof(entry{}) != entrySize {
		t.Fatalf("an entry is %d bytes, entrySize says %d", unsafe.Sizeof(entry{}), entrySize)
	}
	if got := o.Bytes(); got != want {
		t.Fatalf("Bytes() = %d, want %d", got, want)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var m0, m1, m2 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s := mustNew(t, o)
	runtime.ReadMemStats(&m1)
	if got := m1.TotalAlloc - m0.TotalAlloc; got < uint64(want) || got > uint64(want)*11/10 {
		t.Errorf("New allocated %d bytes, Bytes() = %d", got, want)
	}
	vals := names(1 << 18)
	runtime.ReadMemStats(&m1)
	for range 2 {
		for _, v := range vals {
			s.Add(v)
		}
	}
	runtime.ReadMemStats(&m2)
	if got := m2.Mallocs - m1.Mallocs; got != 0 {
		t.Errorf("counting %d distinct values twice made %d allocations (%d bytes)", len(vals), got, m2.TotalAlloc-m1.TotalAlloc)
	}
	if st := s.Stats(); st.Entered < 256 {
		t.Errorf("Stats = %+v: the heavy set never filled; the test checks less than it says", st)
	}
}

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		o         Options
		slots     int
		wantError string
	}{
		{Options{}, 1 << 16, ""},
		{Options{Counters: 1000}, 512, ""},
		{Options{Counters: 16}, 16, ""},
		{Options{Counters: 15}, 0, "Counters 15"},
		{Options{Counters: 1 << 31}, 0, "Counters"},
		{Options{K: -1, MaxValueLen: 4}, 0, "K -1"},
		{Options{K: -1, MaxValueLen: 4}, 0, "MaxValueLen 4"},
		{Options{K: 1 << 16, MaxValueLen: 4096}, 0, "K × MaxValueLen"},
	} {
		err := c.o.Validate()
		switch {
		case c.wantError == "" && err != nil:
			t.Errorf("%+v: Validate() = %v", c.o, err)
		case c.wantError != "" && (err == nil || !strings.Contains(err.Error(), c.wantError)):
			t.Errorf("%+v: Validate() = %v, want an error naming %q", c.o, err, c.wantError)
		case c.wantError == "" && c.o.Slots() != c.slots:
			t.Errorf("%+v: Slots() = %d, want %d", c.o, c.o.Slots(), c.slots)
		}
	}
}

// TestSlotsAgainstMap drives the membership table's insert and delete
// (backward shift) against a map, in a tiny table where keys collide.
func TestSlotsAgainstMap(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 0))
		w := newWindow(2*Ways, 16, 8, 8)
		ref := map[uint64]*entry{}
		for range 500 {
			key := r.Uint64N(40)*16 + r.Uint64N(4) | 1 // few homes, many collisions
			switch {
			case ref[key] != nil:
				w.deleteKey(key)
				delete(ref, key)
			case len(ref) < 8:
				i := r.IntN(8)
				w.insertKey(key, i)
				ref[key] = &w.entries[i]
			}
			for k := uint64(1); k < 40*16+4; k += 2 {
				if e, ok := w.member(k); ok != (ref[k] != nil) || e != ref[k] {
					t.Fatalf("seed %d: member(%d) = %p, %v; want %p", seed, k, e, ok, ref[k])
				}
			}
		}
	}
}

// sameLine returns n values that share a line of s (a sketch of few lines).
func sameLine(t *testing.T, s *Sketch, n int) []string {
	t.Helper()
	var out []string
	var line uint32
	for i := 0; len(out) < n; i++ {
		if i > 1000000 {
			t.Fatalf("found %d values in one line", len(out))
		}
		v := fmt.Sprintf("v%d", i)
		if _, at := s.locate(v); len(out) == 0 || at.line == line {
			line = at.line
			out = append(out, v)
		}
	}
	return out
}

// TestAddLosingItsSlotCountsAgain: an Add whose slot is taken by another
// value between its scan and its atomic add (the add counts for the
// taker) counts again. The line's other values tie at the count the taken
// value had, so that an add not counted again would read short: the value,
// out of its line, reads the line's least count.
func TestAddLosingItsSlotCountsAgain(t *testing.T) {
	s := mustNew(t, Options{Counters: 2 * Ways})
	vals := sameLine(t, s, Ways+1)
	x, y := vals[0], vals[Ways]
	for _, v := range vals[:Ways] { // x in slot 0, then seven others; three Adds each
		for range 3 {
			s.Add(v)
		}
	}
	_, yAt := s.locate(y)
	raceHook = func(line []atomic.Uint64) {
		raceHook = nil
		line[0].Store(uint64(yAt.tag)<<33 | 4) // y took x's slot: x's 3, plus its own Add
	}
	t.Cleanup(func() { raceHook = nil })
	if got := s.Add(x); got < 4 {
		t.Errorf("Add(x) = %d after 4 Adds of it", got)
	}
	if got := s.Estimate(x); got < 4 {
		t.Errorf("Estimate(x) = %d after 4 Adds of it", got)
	}
	if got := s.Estimate(y); got < 1 {
		t.Errorf("Estimate(y) = %d after 1 Add of it", got)
	}
}

// TestRacingTakersShareOneSlot: an Add of a value new to a full line
// whose least slot grows, while another Add takes the next least slot for
// the same value, between its scan and its compare-and-swap, fails its
// compare-and-swap, finds the value, and counts in that slot: the value
// holds one slot, with both Adds.
func TestRacingTakersShareOneSlot(t *testing.T) {
	s := mustNew(t, Options{Counters: 2 * Ways})
	vals := sameLine(t, s, Ways+1)
	x := vals[Ways]
	for i, v := range vals[:Ways] {
		for range 10 + i { // slot i holds 10 + i
			s.Add(v)
		}
	}
	raceHook = func([]atomic.Uint64) {
		raceHook = nil
		s.Add(vals[0])
		s.Add(vals[0]) // slot 0: 12, no longer the least
		s.Add(x)       // the other Add takes slot 1 (11) for x: 12
	}
	t.Cleanup(func() { raceHook = nil })
	if got := s.Add(x); got != 13 {
		t.Errorf("Add(x) = %d, want 13: the slot the other Add took, and this Add", got)
	}
	_, at := s.locate(x)
	w := s.gen.Load().cur
	held := 0
	for i := range Ways {
		if w.table[at.line+uint32(i)].Load()&slotTag == uint64(at.tag)<<33 {
			held++
		}
	}
	if held != 1 {
		t.Errorf("x holds %d slots, want 1", held)
	}
	if got := s.Estimate(vals[0]); got != 12 {
		t.Errorf("Estimate(%s) = %d, want 12: its slot was not the one taken", vals[0], got)
	}
}

// TestStalledAddSparesTheNextWindow: an Add stalled between its scan and
// its compare-and-swap while its window is reset and reused must not take
// a slot that holds, by chance, the very word it read: the new window's
// words carry a new epoch. Without it, b (re-added once, its slot word as
// before) would lose its slot to the stalled Add and read 0.
func TestStalledAddSparesTheNextWindow(t *testing.T) {
	s := mustNew(t, Options{Counters: 2 * Ways})
	vals := sameLine(t, s, Ways+1)
	b, x := vals[0], vals[Ways]
	for i, v := range vals[:Ways] { // b in slot 0 with the least count, 1
		for range 1 + i {
			s.Add(v)
		}
	}
	raceHook = func([]atomic.Uint64) {
		raceHook = nil
		s.Rotate()
		s.Rotate() // x's window cleared and current again
		s.Add(b)
	}
	t.Cleanup(func() { raceHook = nil })
	s.Add(x)
	if got := s.Estimate(b); got != 1 {
		t.Errorf("Estimate(b) = %d after 1 Add in the window, want 1", got)
	}
}

// TestEstimatesWhileAdding: Estimates read while other goroutines Add
// never fall below the Adds of the value that completed before the read
// began, in a table of two lines where values take each other's slots on
// almost every Add.
func TestEstimatesWhileAdding(t *testing.T) {
	const adders, each, distinct = 3, 30000, 24
	vals := names(distinct)
	s := mustNew(t, Options{Counters: 2 * Ways})
	done := make([]atomic.Uint32, distinct) // Adds completed, per value
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range adders {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			for range each {
				i := r.IntN(distinct)
				s.Add(vals[i])
				done[i].Add(1)
			}
		})
	}
	var reads, low atomic.Int64
	var rg sync.WaitGroup
	rg.Go(func() {
		for i := 0; ; i = (i + 1) % distinct {
			select {
			case <-stop:
				return
			default:
			}
			floor := done[i].Load()
			if got := s.Estimate(vals[i]); got < floor {
				low.Add(1)
				t.Errorf("Estimate(%s) = %d while %d Adds of it had completed", vals[i], got, floor)
			}
			reads.Add(1)
		}
	})
	wg.Wait()
	close(stop)
	rg.Wait()
	if reads.Load() < 1000 {
		t.Errorf("only %d reads raced the Adds: the test checks less than it says", reads.Load())
	}
}

// TestEstimateOfAValueLeavingDuringTheScan: an Estimate whose scan read a
// slot before it grew, and the value's own slot after another value took
// it, must not judge the value by the stale, smaller count: it scans again.
func TestEstimateOfAValueLeavingDuringTheScan(t *testing.T) {
	s := mustNew(t, Options{Counters: 2 * Ways})
	vals := sameLine(t, s, Ways+1)
	a, x, y := vals[0], vals[1], vals[Ways]
	s.Add(a)      // slot 0: 1
	for range 5 { // slot 1: 5
		s.Add(x)
	}
	for _, v := range vals[2:Ways] { // slots 2–7: 9 each
		for range 9 {
			s.Add(v)
		}
	}
	estimateHook = func(i int) {
		if i != 0 {
			return
		}
		estimateHook = nil
		for range 6 { // a passes x, which is now the least
			s.Add(a)
		}
		s.Add(y) // and y takes x's slot, with 6
	}
	t.Cleanup(func() { estimateHook = nil })
	if got := s.Estimate(x); got < 5 {
		t.Errorf("Estimate(x) = %d after 5 Adds of it: judged by a count read before it left", got)
	}
}

// TestStaleAddCarriesIntoTheCarryBit: an Add that read its count under
// the guard and stalled while others counted it to 2³²−1 carries on its
// atomic add; the carry lands in the carry bit, not the tag, and the value
// reads as saturated.
func TestStaleAddCarriesIntoTheCarryBit(t *testing.T) {
	s := mustNew(t, Options{})
	s.Add("a")
	_, at := s.locate("a")
	raceHook = func(line []atomic.Uint64) {
		raceHook = nil
		for i := range line {
			if v := line[i].Load(); v&slotTag == uint64(at.tag)<<33 {
				line[i].Store(v&slotTag | math.MaxUint32) // the others' Adds
			}
		}
	}
	t.Cleanup(func() { raceHook = nil })
	if got := s.Add("a"); got != math.MaxUint32 {
		t.Errorf("Add = %d, want %d", got, uint32(math.MaxUint32))
	}
	if got := s.Estimate("a"); got != math.MaxUint32 {
		t.Errorf("Estimate = %d, want %d: saturated", got, uint32(math.MaxUint32))
	}
}

// TestStalledAddEntersNothing: an Add that counted in a window and stalled
// before entering the heavy set while the window was reset and reused does
// not enter the value under its old tag, which no new Add writes (the
// member would read the line's least count, and keep the value, a member,
// from entering with its real one).
func TestStalledAddEntersNothing(t *testing.T) {
	s := mustNew(t, Options{Threshold: 1})
	key, at := s.locate("a")
	w := s.gen.Load().cur
	s.Rotate()
	s.Rotate() // w cleared and current again
	s.enter(w, key, &at, "a", 5)
	if n, _ := s.Heavy(); n != 0 {
		t.Fatalf("the stalled Add entered the heavy set (%d members)", n)
	}
	s.Add("a")
	if n, _ := s.Heavy(); n != 1 {
		t.Errorf("a's own Add did not enter it: %d members", n)
	}
}
