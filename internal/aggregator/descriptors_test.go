package aggregator

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/descriptor"
)

// dc is a descriptor's counts; values are (value, offered) pairs.
func dc(name string, offered, dropped uint64, values ...any) *sluicev1.DescriptorCounts {
	d := &sluicev1.DescriptorCounts{Descriptor_: name, Offered: offered, Dropped: dropped}
	for i := 0; i+1 < len(values); i += 2 {
		d.Values = append(d.Values, &sluicev1.ValueCounts{Value: values[i].(string), Offered: uint64(values[i+1].(int))})
	}
	return d
}

// dr is a descriptor's zone rates; values are (value, offered rps) pairs.
func dr(name string, offered, dropped float64, cut uint32, values ...any) *sluicev1.DescriptorRates {
	d := &sluicev1.DescriptorRates{Descriptor_: name, OfferedRps: offered, DroppedRps: dropped, ValuesCut: cut}
	for i := 0; i+1 < len(values); i += 2 {
		d.Values = append(d.Values, &sluicev1.ValueRate{Value: values[i].(string), OfferedRps: float64(values[i+1].(int))})
	}
	return d
}

// withDescriptors returns r carrying ds.
func withDescriptors(r *sluicev1.LoadReport, ds ...*sluicev1.DescriptorCounts) *sluicev1.LoadReport {
	r.Descriptors = ds
	return r
}

// descriptorsOf flushes s at now and returns the descriptors of its one
// service.
func descriptorsOf(t *testing.T, s *State, now time.Time) []*sluicev1.DescriptorRates {
	t.Helper()
	zl := s.Flush(now, time.Second)
	if len(zl.GetServices()) != 1 {
		t.Fatalf("want one service, got %v", zl)
	}
	return zl.GetServices()[0].GetDescriptors()
}

func wantDescriptors(t *testing.T, got []*sluicev1.DescriptorRates, want ...*sluicev1.DescriptorRates) {
	t.Helper()
	g := &sluicev1.ServiceLoad{Descriptors: got}
	w := &sluicev1.ServiceLoad{Descriptors: want}
	if !proto.Equal(g, w) {
		t.Fatalf("descriptors\n got %v\nwant %v", g, w)
	}
}

// TestDescriptorsMergeAcrossSidecars: per (service, descriptor), the zone
// sums its sidecars' totals and their values, each value once, sorted by
// value, descriptors sorted by name; rates are counts over each report's
// window.
func TestDescriptorsMergeAcrossSidecars(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		withDescriptors(report("c1", "api", in, time.Second, pc("web", 300, 0, 0)),
			dc("tenant", 300, 40, "acme", 200, "beta", 50, descriptor.Missing, 10),
			dc("ip", 300, 0, "10.0.0.1", 120)),
		withDescriptors(report("c2", "api", in, 2*time.Second, pc("web", 600, 0, 0)),
			dc("tenant", 600, 20, "acme", 400, "gamma", 100)))
	wantDescriptors(t, descriptorsOf(t, s, t0),
		dr("ip", 300, 0, 0, "10.0.0.1", 120),
		dr("tenant", 600, 50, 0, descriptor.Missing, 10, "acme", 400, "beta", 50, "gamma", 50))
}

// TestDescriptorsReplaceOnDuplicate: a sidecar's report replaces its
// descriptors, never adds to them; a regular report without any clears
// them.
func TestDescriptorsReplaceOnDuplicate(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	r := withDescriptors(report("c1", "api", in, time.Second), dc("tenant", 100, 0, "acme", 80))
	apply(t, s, t0, r, r)
	wantDescriptors(t, descriptorsOf(t, s, t0), dr("tenant", 100, 0, 0, "acme", 80))
	apply(t, s, t0, withDescriptors(report("c1", "api", in, time.Second), dc("tenant", 30, 0, "beta", 20)))
	wantDescriptors(t, descriptorsOf(t, s, t0), dr("tenant", 30, 0, 0, "beta", 20))
	apply(t, s, t0, report("c1", "api", in, time.Second, pc("web", 1, 0, 0)))
	wantDescriptors(t, descriptorsOf(t, s, t0))
}

// TestDescriptorsLeaveWithTheirSidecar: a sidecar gone silent, or whose
// stream ended, takes its values out of the zone's sums.
func TestDescriptorsLeaveWithTheirSidecar(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0, withDescriptors(report("c1", "api", in, time.Second), dc("tenant", 100, 0, "acme", 80, "beta", 10)))
	apply(t, s, t0.Add(2*time.Second), withDescriptors(report("c2", "api", in, time.Second), dc("tenant", 50, 0, "acme", 40)))
	wantDescriptors(t, descriptorsOf(t, s, t0.Add(3*time.Second)), dr("tenant", 150, 0, 0, "acme", 120, "beta", 10))
	// c1 last reported more than 3 windows ago.
	wantDescriptors(t, descriptorsOf(t, s, t0.Add(3*time.Second+1)), dr("tenant", 50, 0, 0, "acme", 40))
	s.Remove("api", "c2", 0)
	if zl := s.Flush(t0.Add(3*time.Second+1), time.Second); len(zl.GetServices()) != 0 {
		t.Fatalf("no sidecar left, got %v", zl)
	}
}

// TestUrgentReportKeepsDescriptors: a surge report without descriptors
// leaves the sidecar's last ones in the sums, until they are stale by
// their own report time; one that carries descriptors replaces them.
func TestUrgentReportKeepsDescriptors(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	regular := withDescriptors(report("c1", "api", in, time.Second, pc("web", 100, 0, 0)), dc("tenant", 100, 0, "acme", 80))
	regular.Interval = durationpb.New(time.Second)
	apply(t, s, t0, regular)
	surge := func(at time.Time) {
		r := report("c1", "api", in, 250*time.Millisecond, pc("web", 100, 0, 0))
		r.Interval, r.Urgent = durationpb.New(time.Second), true
		apply(t, s, at, r)
	}
	surge(t0.Add(2 * time.Second))
	wantDescriptors(t, descriptorsOf(t, s, t0.Add(3*time.Second)), dr("tenant", 100, 0, 0, "acme", 80))
	// The surge kept the sidecar live, not its descriptors of t0.
	wantDescriptors(t, descriptorsOf(t, s, t0.Add(3*time.Second+1)))
	// Surges again: still none (they were not renewed).
	surge(t0.Add(4 * time.Second))
	wantDescriptors(t, descriptorsOf(t, s, t0.Add(4*time.Second)))

	r := withDescriptors(report("c1", "api", in, 250*time.Millisecond), dc("tenant", 10, 0, "beta", 10))
	r.Urgent = true
	apply(t, s, t0.Add(4*time.Second), r)
	wantDescriptors(t, descriptorsOf(t, s, t0.Add(4*time.Second)), dr("tenant", 40, 0, 0, "beta", 40))
}

// TestDescriptorCutKeepsTheLargest: beyond MaxDescriptorValues, the zone
// keeps the largest values by summed rate, ties to the smaller value, and
// counts the rest in values_cut.
func TestDescriptorCutKeepsTheLargest(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxDescriptorValues: 3})
	apply(t, s, t0,
		withDescriptors(report("c1", "api", in, time.Second), dc("tenant", 1000, 0, "a", 10, "b", 50, "c", 30, "d", 30, "e", 5)),
		withDescriptors(report("c2", "api", in, time.Second), dc("tenant", 1000, 0, "a", 40, "f", 29, "g", 1)))
	// Sums: a 50, b 50, c 30, d 30, f 29, e 5, g 1: a, b and c (c before d).
	wantDescriptors(t, descriptorsOf(t, s, t0), dr("tenant", 2000, 0, 4, "a", 50, "b", 50, "c", 30))
}

// TestTopValuesMatchesSorting: topValues keeps what a full sort keeps.
func TestTopValuesMatchesSorting(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		vs := make([]valueRate, rng.IntN(60))
		for i := range vs {
			vs[i] = valueRate{value: fmt.Sprint(rng.IntN(100)), offered: float64(rng.IntN(8))}
		}
		n := rng.IntN(70)
		want := slices.Clone(vs)
		slices.SortFunc(want, largerValue)
		want = want[:min(n, len(want))]
		got := topValues(slices.Clone(vs), n)
		slices.SortFunc(got, largerValue)
		if !slices.Equal(got, want) {
			t.Fatalf("top %d of %v:\n got %v\nwant %v", n, vs, got, want)
		}
	}
}

// TestDescriptorEntriesRejectedOneByOne: every bad entry is left out and
// counted by its reason, and only it: the report's peers, its other
// descriptors and their other values still count.
func TestDescriptorEntriesRejectedOneByOne(t *testing.T) {
	good := func() *sluicev1.DescriptorCounts { return dc("tenant", 100, 10, "acme", 60, "beta", 20) }
	goodRates := dr("tenant", 100, 10, 0, "acme", 60, "beta", 20)
	many := func(n int) *sluicev1.DescriptorCounts {
		d := dc("ip", 1000, 0)
		for i := range n {
			d.Values = append(d.Values, &sluicev1.ValueCounts{Value: fmt.Sprintf("10.0.0.%d", i), Offered: 1})
		}
		return d
	}
	for _, tc := range []struct {
		name  string
		descs []*sluicev1.DescriptorCounts
		want  RejectedEntries
		rates []*sluicev1.DescriptorRates // besides goodRates, sorted
	}{
		{"bad name", []*sluicev1.DescriptorCounts{dc("Tenant", 5, 0, "x", 5)}, RejectedEntries{BadDescriptor: 1}, nil},
		{"empty name", []*sluicev1.DescriptorCounts{dc("", 5, 0)}, RejectedEntries{BadDescriptor: 1}, nil},
		{"long name", []*sluicev1.DescriptorCounts{dc(strings.Repeat("a", descriptor.MaxNameLen+1), 5, 0)}, RejectedEntries{BadDescriptor: 1}, nil},
		{"dropped above offered", []*sluicev1.DescriptorCounts{dc("ip", 5, 6, "x", 5)}, RejectedEntries{BadDescriptorCounts: 1}, nil},
		{"absurd rate", []*sluicev1.DescriptorCounts{dc("ip", 1e7+1, 0)}, RejectedEntries{BadDescriptorCounts: 1}, nil},
		{"duplicate descriptor", []*sluicev1.DescriptorCounts{dc("tenant", 5, 0, "x", 5)}, RejectedEntries{DuplicateDescriptor: 1}, nil},
		{"too many descriptors", []*sluicev1.DescriptorCounts{dc("a", 1, 0), dc("b", 1, 0), dc("c", 1, 0), dc("d", 1, 0)},
			RejectedEntries{TooManyDescriptors: 1}, []*sluicev1.DescriptorRates{dr("a", 1, 0, 0), dr("b", 1, 0, 0), dr("c", 1, 0, 0)}},
		{"empty value", []*sluicev1.DescriptorCounts{dc("ip", 10, 0, "", 3, "x", 2)}, RejectedEntries{BadValue: 1},
			[]*sluicev1.DescriptorRates{dr("ip", 10, 0, 0, "x", 2)}},
		{"long value", []*sluicev1.DescriptorCounts{dc("ip", 10, 0, strings.Repeat("v", descriptor.MaxValueLen+1), 3, strings.Repeat("v", descriptor.MaxValueLen), 2)},
			RejectedEntries{BadValue: 1}, []*sluicev1.DescriptorRates{dr("ip", 10, 0, 0, strings.Repeat("v", descriptor.MaxValueLen), 2)}},
		{"reserved values", []*sluicev1.DescriptorCounts{dc("ip", 10, 0, descriptor.Missing, 3, descriptor.Invalid, 2)}, RejectedEntries{},
			[]*sluicev1.DescriptorRates{dr("ip", 10, 0, 0, descriptor.Invalid, 2, descriptor.Missing, 3)}},
		{"duplicate value", []*sluicev1.DescriptorCounts{dc("ip", 10, 0, "x", 3, "y", 1, "x", 7)}, RejectedEntries{DuplicateValue: 1},
			[]*sluicev1.DescriptorRates{dr("ip", 10, 0, 0, "x", 3, "y", 1)}},
		{"too many values", []*sluicev1.DescriptorCounts{many(7)}, RejectedEntries{TooManyValues: 2},
			[]*sluicev1.DescriptorRates{dr("ip", 1000, 0, 0, "10.0.0.0", 1, "10.0.0.1", 1, "10.0.0.2", 1, "10.0.0.3", 1, "10.0.0.4", 1)}},
		{"value above its total, clamped", []*sluicev1.DescriptorCounts{dc("ip", 10, 0, "x", 11)}, RejectedEntries{ValueClamped: 1},
			[]*sluicev1.DescriptorRates{dr("ip", 10, 0, 0, "x", 10)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState("zone-a", "agg-1", 3, Bounds{MaxReportValues: 5})
			apply(t, s, t0, withDescriptors(report("c1", "api", in, time.Second, pc("web", 100, 0, 0)), slices.Concat([]*sluicev1.DescriptorCounts{good()}, tc.descs)...))
			if got := s.TakeRejectedEntries(); got != tc.want {
				t.Errorf("rejected entries %+v, want %+v", got, tc.want)
			}
			zl := s.Flush(t0, time.Second)
			if p := zl.GetServices()[0].GetPeers(); len(p) != 1 || p[0].GetOfferedRps() != 100 {
				t.Errorf("peers %v, want web's", p)
			}
			want := slices.SortedFunc(slices.Values(append([]*sluicev1.DescriptorRates{goodRates}, tc.rates...)), func(a, b *sluicev1.DescriptorRates) int {
				return cmp.Compare(a.GetDescriptor_(), b.GetDescriptor_())
			})
			wantDescriptors(t, zl.GetServices()[0].GetDescriptors(), want...)
		})
	}
}

// TestOutboundDescriptorsLeftOut: descriptors limit a callee's inbound
// requests; an outbound report's are left out and counted, the report kept.
func TestOutboundDescriptorsLeftOut(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0, withDescriptors(report("c1", "api", out, time.Second, pc("db", 5, 0, 0)), dc("tenant", 5, 0), dc("ip", 5, 0)))
	if got := s.TakeRejectedEntries(); got != (RejectedEntries{OutboundDescriptor: 2}) {
		t.Errorf("rejected entries %+v, want 2 outbound descriptors", got)
	}
	wantDescriptors(t, descriptorsOf(t, s, t0))
}

// TestDescriptorsPerServiceBounded: the sidecars of one service together
// can not put more than maxZoneDescriptors descriptors in a zone load; the
// largest stay.
func TestDescriptorsPerServiceBounded(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	var want []*sluicev1.DescriptorRates
	for i := range 3 * descriptor.MaxPerService {
		name := fmt.Sprintf("d%02d", i)
		apply(t, s, t0, withDescriptors(report(fmt.Sprintf("c%d", i), "api", in, time.Second), dc(name, uint64(100+i), 0)))
		if i >= descriptor.MaxPerService {
			want = append(want, dr(name, float64(100+i), 0, 0))
		}
	}
	wantDescriptors(t, descriptorsOf(t, s, t0), want...)
	if got := s.DescriptorsCut(); got != descriptor.MaxPerService {
		t.Errorf("DescriptorsCut = %d, want %d", got, descriptor.MaxPerService)
	}
}

// TestRejectedEntriesByReason: ByReason follows EntryReasons.
func TestRejectedEntriesByReason(t *testing.T) {
	e := RejectedEntries{BadProcedure: 1, BadCriticality: 2, MixedCriticality: 3, BadCost: 4, BadInFlight: 5, BadDescriptor: 6, BadDescriptorCounts: 7, DuplicateDescriptor: 8,
		TooManyDescriptors: 9, OutboundDescriptor: 10, BadValue: 11, DuplicateValue: 12, TooManyValues: 13, QuotaValues: 14,
		BadHealth: 15, DuplicateHealth: 16, TooManyHealth: 17, OutboundHealth: 18, HealthOverclaim: 19, ValueClamped: 100}
	by := e.ByReason()
	if len(by) != len(EntryReasons) {
		t.Fatalf("ByReason has %d counts, EntryReasons %d", len(by), len(EntryReasons))
	}
	for i, n := range by {
		if n != i+1 {
			t.Errorf("ByReason()[%d] (%s) = %d, want %d", i, EntryReasons[i], n, i+1)
		}
	}
	if e.Total() != 190 {
		t.Errorf("Total = %d, want 190", e.Total())
	}
}

// TestServiceDescriptorMetrics: over gRPC, the zone load carries the
// descriptors, and the metrics count what was left out, cut and held.
func TestServiceDescriptorMetrics(t *testing.T) {
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}, Bounds: Bounds{MaxDescriptorValues: 1}})
	s1, s2 := dialSidecar(t, h.addr), dialSidecar(t, h.addr)
	s1.mustAccept(t, withDescriptors(report("s1", "api", in, time.Second), dc("tenant", 100, 0, "acme", 60, "", 1, "beta", 200)))
	s2.mustAccept(t, withDescriptors(report("s2", "api", in, time.Second), dc("tenant", 50, 0, "acme", 30), dc("Bad", 1, 0)))
	sl := serviceLoad("api", in, 2)
	sl.Descriptors = []*sluicev1.DescriptorRates{dr("tenant", 150, 0, 1, "beta", 100)}
	ctrl.await(t, sl)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"sluice_aggregator_entries_rejected_total", []string{"reason", EntryBadValue}, 1},
		{"sluice_aggregator_entries_rejected_total", []string{"reason", EntryBadDescriptor}, 1},
		{"sluice_aggregator_descriptor_values_clamped_total", nil, 1},
		{"sluice_aggregator_descriptor_values", []string{"service", "api", "descriptor", "tenant"}, 2},
	} {
		if v := metric(t, h.reg, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if v := metric(t, h.reg, "sluice_aggregator_descriptor_values_cut_total"); v < 1 {
		t.Errorf("descriptor_values_cut_total = %v, want at least 1 (one per flush)", v)
	}
	// The sidecars leave: so does the gauge's series (set before the
	// zone load is offered).
	s1.cancel()
	s2.cancel()
	ctrl.await(t)
	if v := metric(t, h.reg, "sluice_aggregator_descriptor_values", "service", "api"); v != -1 {
		t.Errorf("the gauge of a descriptor no sidecar reports is still there: %v", v)
	}
}

// BenchmarkFlushDescriptors: a flush of 300 sidecars of one service, each
// reporting a heavy set of 256 tenants out of 20000, cut to 1024: the cost
// is linear in the values reported.
func BenchmarkFlushDescriptors(b *testing.B) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		d := dc("tenant", 1e6, 0)
		for _, v := range rng.Perm(20000)[:256] {
			d.Values = append(d.Values, &sluicev1.ValueCounts{Value: fmt.Sprintf("tenant-%05d", v), Offered: uint64(1 + rng.IntN(1000))})
		}
		if err := s.Apply(withDescriptors(report(fmt.Sprintf("c%d", i), "api", in, time.Second), d), t0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Flush(t0, time.Second)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(300*256), "ns/value")
}

func TestDescriptorBoundsValidate(t *testing.T) {
	err := Bounds{MaxReportValues: -1, MaxDescriptorValues: maxValuesBound + 1}.Validate()
	for _, flag := range []string{"max-report-values", "max-descriptor-values"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("error %v does not name %s", err, flag)
		}
	}
	if err := (Bounds{MaxReportValues: maxValuesBound, MaxDescriptorValues: 1}).Validate(); err != nil {
		t.Errorf("bounds within range: %v", err)
	}
}

// The descriptors' rates are over their own window when the report gives
// one: a surge report since the last regular one cut the report's window
// short, not the sketch's. A descriptor window shorter than the report's,
// or beyond the longest, is bad: the report's descriptors are left out,
// counted, and the rest of it counts.
func TestDescriptorWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		want   []*sluicev1.DescriptorRates
	}{
		{"its own", 2 * time.Second, []*sluicev1.DescriptorRates{dr("tenant", 100, 0, 0, "acme", 50)}},
		{"shorter than the report's", 500 * time.Millisecond, nil},
		{"too long", time.Hour, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState("zone-a", "agg-1", 3, Bounds{})
			r := withDescriptors(report("c1", "api", in, time.Second, pc("web", 100, 0, 0)), dc("tenant", 200, 0, "acme", 100))
			r.DescriptorWindow = durationpb.New(tc.window)
			apply(t, s, t0, r)
			wantDescriptors(t, descriptorsOf(t, s, t0), tc.want...)
			if bad := s.TakeRejectedEntries().BadDescriptorCounts; (tc.want == nil) != (bad == 1) {
				t.Errorf("bad_descriptor_counts = %d", bad)
			}
		})
	}
}
