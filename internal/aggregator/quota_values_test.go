package aggregator

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/descriptor"
)

// checkHeldValues checks what MaxValuesPerIdentity relies on: each
// identity's count is a recount of its sidecars' values, reserved ones
// left out, and within the bound; and every sidecar's values take no
// more room than they hold.
func checkHeldValues(t *testing.T, s *State) {
	t.Helper()
	recount := map[string]int{}
	for k, sc := range s.sidecars {
		for _, d := range sc.descriptors {
			if cap(d.values) != len(d.values) {
				t.Errorf("%v/%s: %d values held in room for %d", k, d.name, len(d.values), cap(d.values))
			}
			for _, v := range d.values {
				if v.value != descriptor.Missing && v.value != descriptor.Invalid {
					recount[k.identity]++
				}
			}
		}
	}
	for id, il := range s.identities {
		if il.values != recount[id] {
			t.Errorf("%s: counts %d values, holds %d", id, il.values, recount[id])
		}
		if il.values > s.bounds.MaxValuesPerIdentity {
			t.Errorf("%s: holds %d values, at most %d", id, il.values, s.bounds.MaxValuesPerIdentity)
		}
	}
}

func wantQuotaValues(t *testing.T, s *State, want int) {
	t.Helper()
	if got := s.TakeRejectedEntries(); got.QuotaValues != want {
		t.Errorf("quota_values = %d, want %d (all: %+v)", got.QuotaValues, want, got)
	}
}

// TestValuesQuotaAcrossSidecars: the sidecars of one identity hold at
// most MaxValuesPerIdentity values between them, besides the reserved
// ones; the sidecars that came last lose theirs, those that came first
// keep theirs, and another identity, full of its own, loses nothing.
func TestValuesQuotaAcrossSidecars(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxValuesPerIdentity: 10})
	for i := range 6 {
		apply(t, s, t0, withDescriptors(report(fmt.Sprintf("a%d", i), "api", in, time.Second),
			dc("tenant", 1000, 0, descriptor.Missing, 1, fmt.Sprintf("t%d-x", i), 10, fmt.Sprintf("t%d-y", i), 20, fmt.Sprintf("t%d-z", i), 30)))
		checkHeldValues(t, s)
	}
	// a0..a2 hold 9; a3 has room for its largest; a4 and a5 for none.
	wantQuotaValues(t, s, 2+3+3)
	for i := range 2 {
		apply(t, s, t0, withDescriptors(report(fmt.Sprintf("w%d", i), "web", in, time.Second),
			dc("tenant", 1000, 0, "w-a", 1, "w-b", 2, "w-c", 3, "w-d", 4, fmt.Sprintf("w%d", i), 5)))
	}
	wantQuotaValues(t, s, 0)
	checkHeldValues(t, s)

	zl := s.Flush(t0, time.Second)
	var got []string
	for _, svc := range zl.GetServices() {
		for _, d := range svc.GetDescriptors() {
			if d.GetOfferedRps() != 1000*float64(svc.GetLiveSidecars()) {
				t.Errorf("%s: offered %v: the values left out left their descriptor's total", svc.GetService(), d.GetOfferedRps())
			}
			for _, v := range d.GetValues() {
				got = append(got, svc.GetService()+"/"+v.GetValue())
			}
		}
	}
	want := "api/_missing api/t0-x api/t0-y api/t0-z api/t1-x api/t1-y api/t1-z api/t2-x api/t2-y api/t2-z api/t3-z " +
		"web/w-a web/w-b web/w-c web/w-d web/w0 web/w1"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("values\n got %s\nwant %s", g, want)
	}
}

// TestValuesQuotaKeepsReservedAndLargest: a report beyond its identity's
// room keeps its reserved values whatever the room, then its largest
// values across its descriptors, ties to the smaller descriptor name.
func TestValuesQuotaKeepsReservedAndLargest(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxValuesPerIdentity: 2})
	apply(t, s, t0, withDescriptors(report("c1", "api", in, time.Second),
		dc("tenant", 200, 0, "a", 5, "b", 50, descriptor.Missing, 1),
		dc("ip", 200, 0, "c", 50, "d", 60, descriptor.Invalid, 2)))
	wantQuotaValues(t, s, 2)
	checkHeldValues(t, s)
	wantDescriptors(t, descriptorsOf(t, s, t0),
		dr("ip", 200, 0, 0, descriptor.Invalid, 2, "c", 50, "d", 60),
		dr("tenant", 200, 0, 0, descriptor.Missing, 1))

	// No room at all: the reserved values stay.
	apply(t, s, t0, withDescriptors(report("c2", "api", in, time.Second),
		dc("tenant", 100, 0, descriptor.Missing, 3, descriptor.Invalid, 4, "e", 90)))
	wantQuotaValues(t, s, 1)
	checkHeldValues(t, s)
	wantDescriptors(t, descriptorsOf(t, s, t0),
		dr("ip", 200, 0, 0, descriptor.Invalid, 2, "c", 50, "d", 60),
		dr("tenant", 300, 0, 0, descriptor.Invalid, 4, descriptor.Missing, 4))
}

// TestValuesQuotaCountsWhatIsHeld: a sidecar's report replaces its values
// in the count, a duplicate too; a surge report that keeps them keeps
// their count; a sidecar removed or gone stale gives its values back.
func TestValuesQuotaCountsWhatIsHeld(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxValuesPerIdentity: 3})
	r := withDescriptors(report("c1", "api", in, time.Second), dc("tenant", 100, 0, "a", 1, "b", 2, "c", 3))
	r.Interval = durationpb.New(time.Second)
	apply(t, s, t0, r, r, r)
	wantQuotaValues(t, s, 0)
	apply(t, s, t0, withDescriptors(report("c1", "api", in, time.Second), dc("tenant", 100, 0, "d", 1, "e", 2, "f", 3)))
	wantQuotaValues(t, s, 0)
	apply(t, s, t0, withDescriptors(report("c2", "api", in, time.Second), dc("tenant", 100, 0, "g", 9)))
	wantQuotaValues(t, s, 1)
	checkHeldValues(t, s)

	surge := report("c1", "api", in, 250*time.Millisecond, pc("web", 10, 0, 0))
	surge.Interval, surge.Urgent = durationpb.New(time.Second), true
	apply(t, s, t0, surge)
	wantQuotaValues(t, s, 0)
	checkHeldValues(t, s)
	if il := s.identities["api"]; il.values != 3 {
		t.Errorf("after a surge report, api holds %d values, want c1's 3", il.values)
	}
	apply(t, s, t0, withDescriptors(report("c2", "api", in, time.Second), dc("tenant", 100, 0, "g", 9)))
	wantQuotaValues(t, s, 1)

	s.Remove("api", "c1", 0)
	apply(t, s, t0, withDescriptors(report("c2", "api", in, time.Second), dc("tenant", 100, 0, "g", 9, "h", 8)))
	wantQuotaValues(t, s, 0)
	checkHeldValues(t, s)

	// c2 goes stale: api holds nothing, and a new sidecar has the room.
	s.Flush(t0.Add(4*time.Second), time.Second)
	if len(s.identities) != 0 {
		t.Fatalf("identities left: %v", s.identities)
	}
	apply(t, s, t0.Add(4*time.Second), withDescriptors(report("c3", "api", in, time.Second), dc("tenant", 100, 0, "x", 1, "y", 1, "z", 1)))
	wantQuotaValues(t, s, 0)
	checkHeldValues(t, s)
}

// TestValuesQuotaRandom drives reports, replacements and removals of two
// identities' sidecars at random and checks after each step that the
// counts are recounts within the bound, and that a report is cut to its
// reserved values and its largest ones, as a naive oracle ranks them.
func TestValuesQuotaRandom(t *testing.T) {
	const bound = 40
	rng := rand.New(rand.NewPCG(7, 15))
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxValuesPerIdentity: bound, MaxReportValues: 16})
	for step := range 2000 {
		svc := []string{"api", "web"}[rng.IntN(2)]
		id := fmt.Sprintf("c%d", rng.IntN(8))
		if rng.IntN(10) == 0 {
			s.Remove(svc, id, 0)
			checkHeldValues(t, s)
			continue
		}
		r := report(id, svc, in, time.Second)
		var sent []rankedValue // the report's values the quota counts
		for _, name := range []string{"ip", "tenant"}[:1+rng.IntN(2)] {
			d, seen := dc(name, 1000, 0), map[string]bool{}
			for range rng.IntN(12) {
				v := []string{descriptor.Missing, descriptor.Invalid, fmt.Sprintf("v%d", rng.IntN(30))}[min(2, rng.IntN(8))]
				if seen[v] {
					continue // one of each: duplicates are another reason's
				}
				seen[v] = true
				o := rng.IntN(20)
				d.Values = append(d.Values, &sluicev1.ValueCounts{Value: v, Offered: uint64(o)})
				if !descriptor.Reserved(v) {
					sent = append(sent, rankedValue{name, valueRate{v, float64(o)}})
				}
			}
			r.Descriptors = append(r.Descriptors, d)
		}
		others := 0
		if il := s.identities[svc]; il != nil {
			others = il.values
		}
		if old := s.sidecars[sidecarKey{svc, id}]; old != nil {
			others -= heldValues(old.descriptors)
		}
		apply(t, s, t0, r)
		checkHeldValues(t, s)
		room := max(0, bound-others)
		if got := s.TakeRejectedEntries().QuotaValues; got != max(0, len(sent)-room) {
			t.Fatalf("step %d: quota_values %d, sent %d with room for %d", step, got, len(sent), room)
		}
		// The oracle: a value is kept iff fewer than room values rank above it.
		for _, v := range sent {
			above := 0
			for _, w := range sent {
				if w.offered > v.offered || w.offered == v.offered && (w.descriptor < v.descriptor || w.descriptor == v.descriptor && w.value < v.value) {
					above++
				}
			}
			if kept := holds(s.sidecars[sidecarKey{svc, id}], v); kept != (above < room) {
				t.Fatalf("step %d: %v kept %v with %d ranked above it and room for %d", step, v, kept, above, room)
			}
		}
	}
}

func holds(sc *sidecarLoad, v rankedValue) bool {
	for _, d := range sc.descriptors {
		if d.name == v.descriptor {
			for _, w := range d.values {
				if w.value == v.value {
					return true
				}
			}
		}
	}
	return false
}

// TestHeldValuesTakeNoMoreRoom: values left out as bad or repeated free
// their room, which the quota could not count otherwise.
func TestHeldValuesTakeNoMoreRoom(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	d := dc("tenant", 100, 0)
	for range 1000 {
		d.Values = append(d.Values, &sluicev1.ValueCounts{Value: "acme", Offered: 1}, &sluicev1.ValueCounts{Value: "", Offered: 1})
	}
	apply(t, s, t0, withDescriptors(report("c1", "api", in, time.Second), d))
	checkHeldValues(t, s)
	if e := s.TakeRejectedEntries(); e.DuplicateValue != 999 || e.BadValue != 1000 {
		t.Errorf("left out %+v, want 999 duplicates and 1000 bad", e)
	}
}

func TestValuesQuotaValidate(t *testing.T) {
	err := Bounds{MaxValuesPerIdentity: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "max-values-per-identity") {
		t.Errorf("error %v does not name max-values-per-identity", err)
	}
	if got := (Bounds{}).withDefaults().MaxValuesPerIdentity; got != DefaultBounds().MaxValuesPerIdentity || got <= 0 {
		t.Errorf("zero MaxValuesPerIdentity takes %d", got)
	}
}
