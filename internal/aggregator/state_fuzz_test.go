package aggregator_test

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"

	"github.com/sluicehq/sluice/internal/testkit"
)

// seed is one named input of the committed seed corpus.
type seed = testkit.Seed

var (
	fuzzNow    = time.Date(2026, 11, 30, 3, 3, 0, 0, time.UTC)
	fuzzBounds = aggregator.Bounds{MaxPeersPerReport: 8, MaxSidecars: 2, MaxPeersPerIdentity: 6, MaxValuesPerIdentity: 5, MaxReportValues: 4, MaxDescriptorValues: 3}
)

const (
	inbound  = sluicev1.Direction_DIRECTION_INBOUND
	outbound = sluicev1.Direction_DIRECTION_OUTBOUND
)

func pcs(peers ...any) []*sluicev1.PeerCounts {
	var out []*sluicev1.PeerCounts
	for i := 0; i+3 < len(peers); i += 4 {
		out = append(out, &sluicev1.PeerCounts{Peer: peers[i].(string), Offered: peers[i+1].(uint64),
			Dropped: peers[i+2].(uint64), ShadowDropped: peers[i+3].(uint64)})
	}
	return out
}

// dcs is a descriptor's counts; values are (value, offered) pairs.
func dcs(name string, offered, dropped uint64, values ...any) *sluicev1.DescriptorCounts {
	d := &sluicev1.DescriptorCounts{Descriptor_: name, Offered: offered, Dropped: dropped}
	for i := 0; i+1 < len(values); i += 2 {
		d.Values = append(d.Values, &sluicev1.ValueCounts{Value: values[i].(string), Offered: uint64(values[i+1].(int))})
	}
	return d
}

// baseReport is the report every fuzzed state holds before the fuzzed ones
// arrive, so that a rejected report has something to leave alone.
func baseReport() *sluicev1.LoadReport {
	return &sluicev1.LoadReport{
		SidecarId: "checkout-0", Service: "checkout", Direction: inbound, Zone: "zone-a",
		WindowStart: timestamppb.New(fuzzNow.Add(-time.Second)), Window: durationpb.New(time.Second),
		Interval: durationpb.New(time.Second),
		Peers:    pcs("web", uint64(1000), uint64(900), uint64(0), "batch", uint64(50), uint64(0), uint64(25)),
		Descriptors: []*sluicev1.DescriptorCounts{
			dcs("tenant", 1050, 900, "acme", 900, "beta", 100, descriptor.Missing, 50),
		},
	}
}

func reportBytes(t testing.TB, edit func(*sluicev1.LoadReport)) []byte {
	r := baseReport()
	r.SidecarId = "checkout-1"
	if edit != nil {
		edit(r)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// loadReportSeeds are FuzzLoadReport's committed seeds, two reports each: good
// ones, and every way a report must be refused.
func loadReportSeeds(t testing.TB) []seed {
	rb := func(edit func(*sluicev1.LoadReport)) []byte { return reportBytes(t, edit) }
	one := func(name string, edit func(*sluicev1.LoadReport)) seed { // sent twice, as a retry would
		b := rb(edit)
		return seed{Name: name, Args: []any{b, b}}
	}
	str := func(field protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, field, protowire.BytesType), s)
	}
	return []seed{
		one("good", nil),
		one("good-outbound-no-peers", func(r *sluicev1.LoadReport) { r.Direction, r.Peers = outbound, nil }),
		one("good-reserved-peers", func(r *sluicev1.LoadReport) {
			r.Peers = pcs(names.Unknown, uint64(5), uint64(0), uint64(0), names.Overflow, uint64(7), uint64(7), uint64(0))
		}),
		one("good-at-max-rate", func(r *sluicev1.LoadReport) { r.Peers = pcs("web", uint64(1e7), uint64(1e7), uint64(0)) }),
		one("good-shortest-window", func(r *sluicev1.LoadReport) { r.Window = durationpb.New(10 * time.Millisecond) }),
		one("good-longest-window", func(r *sluicev1.LoadReport) { r.Window = durationpb.New(time.Minute) }),
		one("good-surge", func(r *sluicev1.LoadReport) { r.Urgent, r.Window = true, durationpb.New(100*time.Millisecond) }),
		one("good-longest-interval", func(r *sluicev1.LoadReport) { r.Interval = durationpb.New(10 * time.Second) }),
		one("bad-huge-interval", func(r *sluicev1.LoadReport) { r.Interval = &durationpb.Duration{Seconds: math.MaxInt64} }),
		one("good-253-byte-names", func(r *sluicev1.LoadReport) {
			r.SidecarId, r.Service = strings.Repeat("i", names.MaxLen), strings.Repeat("s", names.MaxLen)
			r.Peers[0].Peer = strings.Repeat("p", names.MaxLen)
		}),
		{Name: "good-replace-then-leave", Args: []any{rb(nil), rb(func(r *sluicev1.LoadReport) { r.Peers = nil })}},
		// Another service's id is another sidecar: a third, one too many.
		{Name: "bad-same-id-other-service", Args: []any{rb(nil), rb(func(r *sluicev1.LoadReport) { r.Service = "orders" })}},
		{Name: "bad-one-sidecar-too-many", Args: []any{rb(nil), rb(func(r *sluicev1.LoadReport) { r.SidecarId = "checkout-2" })}},
		one("bad-overflow-service", func(r *sluicev1.LoadReport) { r.Service = names.Overflow }),
		one("bad-empty", func(r *sluicev1.LoadReport) { proto.Reset(r) }),
		one("bad-empty-sidecar-id", func(r *sluicev1.LoadReport) { r.SidecarId = "" }),
		one("bad-254-byte-sidecar-id", func(r *sluicev1.LoadReport) { r.SidecarId = strings.Repeat("i", names.MaxLen+1) }),
		one("bad-254-byte-peer", func(r *sluicev1.LoadReport) { r.Peers[0].Peer = strings.Repeat("p", names.MaxLen+1) }),
		one("bad-empty-peer", func(r *sluicev1.LoadReport) { r.Peers[1].Peer = "" }),
		one("bad-peer-charset", func(r *sluicev1.LoadReport) { r.Peers[1].Peer = "batch\n" }),
		one("bad-duplicate-peer", func(r *sluicev1.LoadReport) { r.Peers[1].Peer = r.Peers[0].Peer }),
		// A peer's leaves, one per procedure; a bad procedure costs its
		// entry alone; a leaf listed twice rejects the report.
		one("good-procedures", func(r *sluicev1.LoadReport) {
			r.Peers = pcs("web", uint64(5), uint64(1), uint64(0), "web", uint64(3), uint64(0), uint64(0), "web", uint64(2), uint64(0), uint64(0),
				names.Unknown, uint64(1), uint64(0), uint64(0))
			r.Peers[0].Procedure, r.Peers[1].Procedure, r.Peers[2].Procedure, r.Peers[3].Procedure = "create-charge", "/shop.Checkout/Pay", names.Other, names.Other
		}),
		one("good-bad-procedure-left-out", func(r *sluicev1.LoadReport) { r.Peers[1].Procedure = "a//b" }),
		one("bad-duplicate-leaf", func(r *sluicev1.LoadReport) {
			r.Peers[1].Peer, r.Peers[0].Procedure, r.Peers[1].Procedure = r.Peers[0].Peer, "get-item", "get-item"
		}),
		// A leaf's tiers are leaves; a tier outside the enum, or one
		// beside the same leaf untiered, costs its entry alone.
		one("good-tiers", func(r *sluicev1.LoadReport) {
			r.Peers[1].Peer, r.Peers[0].Criticality, r.Peers[1].Criticality = r.Peers[0].Peer, sluicev1.Criticality_CRITICALITY_CRITICAL, sluicev1.Criticality_CRITICALITY_SHEDDABLE
		}),
		one("good-bad-tier-left-out", func(r *sluicev1.LoadReport) { r.Peers[1].Criticality = 7 }),
		one("good-mixed-tier-left-out", func(r *sluicev1.LoadReport) {
			r.Peers[1].Peer, r.Peers[1].Criticality = r.Peers[0].Peer, sluicev1.Criticality_CRITICALITY_SHEDDABLE
		}),
		// Invented procedures of unknown are leaves like any: beyond the
		// report's bound of 8 they fold into (_overflow, _other).
		one("good-folds-leaves", func(r *sluicev1.LoadReport) {
			r.Peers = nil
			for i := range 9 {
				r.Peers = append(r.Peers, pcs(names.Unknown, uint64(1+i), uint64(0), uint64(0))...)
				r.Peers[i].Procedure = fmt.Sprintf("made-up-%d", i)
			}
		}),
		// Beyond the report's bound of 8, the smallest fold into _overflow.
		one("good-folds-beyond-report-bound", func(r *sluicev1.LoadReport) {
			r.Peers = nil
			for i := range 9 {
				r.Peers = append(r.Peers, pcs(fmt.Sprintf("caller-%d", i), uint64(1+i), uint64(i/2), uint64(0))...)
			}
		}),
		// web and batch, then 7 new: the identity's 6 keep 4 of them.
		one("good-folds-beyond-identity-quota", func(r *sluicev1.LoadReport) {
			r.Peers = pcs("web", uint64(5), uint64(0), uint64(0), names.Overflow, uint64(3), uint64(1), uint64(1))
			for i := range 7 {
				r.Peers = append(r.Peers, pcs(fmt.Sprintf("caller-%d", i), uint64(7-i), uint64(0), uint64(7-i))...)
			}
		}),
		// Descriptors: a bad entry costs itself alone, never the report.
		one("good-descriptors", func(r *sluicev1.LoadReport) {
			r.Descriptors = append(r.Descriptors, dcs("ip", 1050, 0, "10.0.0.1", 600, "10.0.0.2", 400, descriptor.Invalid, 2))
		}),
		one("good-descriptors-cut", func(r *sluicev1.LoadReport) {
			r.Descriptors[0].Values = append(r.Descriptors[0].Values, &sluicev1.ValueCounts{Value: "gamma", Offered: 100})
		}),
		one("good-bad-descriptor-entries", func(r *sluicev1.LoadReport) {
			r.Descriptors = append(r.Descriptors,
				dcs("Tenant", 5, 0, "x", 5),                            // bad name
				dcs("tenant", 5, 0, "x", 5),                            // duplicate
				dcs("ip", 5, 6, "x", 5),                                // dropped above offered
				dcs("key", 1e8, 0, "x", 5),                             // absurd rate
				dcs("a", 9, 0, "", 1, "x", 2, "x", 3, "y", 10),         // bad value, duplicate value, clamped
				dcs("b", 9, 0, "1", 1, "2", 1, "3", 1, "4", 1, "5", 1), // too many values
				dcs("c", 1, 0), dcs("d", 1, 0),                         // too many descriptors
				dcs(strings.Repeat("v", 64), 1, 0), // a name too long
				dcs("e", 9, 0, strings.Repeat("v", descriptor.MaxValueLen+1), 1),
			)
		}),
		one("good-outbound-descriptors", func(r *sluicev1.LoadReport) { r.Direction = outbound }),
		{Name: "good-surge-keeps-descriptors", Args: []any{rb(nil), rb(func(r *sluicev1.LoadReport) {
			r.Urgent, r.Window, r.Descriptors = true, durationpb.New(100*time.Millisecond), nil
		})}},
		one("bad-absurdly-many-peers", func(r *sluicev1.LoadReport) {
			r.Peers = nil
			for i := range 81 {
				r.Peers = append(r.Peers, pcs(fmt.Sprintf("caller-%d", i), uint64(1), uint64(0), uint64(0))...)
			}
		}),
		one("bad-dropped-above-offered", func(r *sluicev1.LoadReport) { r.Peers[0].Dropped = r.Peers[0].Offered + 1 }),
		one("bad-counts-overflow", func(r *sluicev1.LoadReport) {
			r.Peers = pcs("web", uint64(1<<63+1), uint64(1<<63), uint64(1<<63))
		}),
		one("bad-huge-count", func(r *sluicev1.LoadReport) { r.Peers = pcs("web", uint64(math.MaxUint64), uint64(0), uint64(0)) }),
		one("bad-absurd-rate", func(r *sluicev1.LoadReport) { r.Peers = pcs("web", uint64(1e7+1), uint64(0), uint64(0)) }),
		one("bad-no-window", func(r *sluicev1.LoadReport) { r.Window = nil }),
		one("bad-negative-window", func(r *sluicev1.LoadReport) { r.Window = durationpb.New(-time.Second) }),
		one("bad-window-too-long", func(r *sluicev1.LoadReport) { r.Window = durationpb.New(time.Minute + 1) }),
		one("bad-window-invalid", func(r *sluicev1.LoadReport) { r.Window = &durationpb.Duration{Seconds: 1, Nanos: -5} }),
		one("bad-direction", func(r *sluicev1.LoadReport) { r.Direction = 3 }),
		one("bad-urgent", func(r *sluicev1.LoadReport) { r.Urgent, r.Service = true, "" }),
		{Name: "wire-invalid-utf8", Args: []any{append(str(1, "checkout-1"), str(2, "check\xc3out")...), []byte{}}},
		{Name: "wire-truncated", Args: []any{rb(nil)[:30], rb(nil)}},
	}
}

func TestFuzzLoadReportCorpus(t *testing.T) {
	seeds := loadReportSeeds(t)
	testkit.CheckCorpus(t, "FuzzLoadReport", seeds)
	// The seeds say what they are: in good ones every report is taken.
	for _, s := range seeds {
		st := aggregator.NewState("zone-a", "agg-a", 3, fuzzBounds)
		if err := st.Apply(baseReport(), fuzzNow); err != nil {
			t.Fatal(err)
		}
		var errs []error
		for _, b := range s.Args {
			r := new(sluicev1.LoadReport)
			err := proto.Unmarshal(b.([]byte), r)
			if err == nil {
				err = st.Apply(r, fuzzNow)
			}
			errs = append(errs, err)
		}
		if good := strings.HasPrefix(s.Name, "good"); good != (errors.Join(errs...) == nil) {
			t.Errorf("seed %s: %v", s.Name, errs)
		}
	}
}

// FuzzLoadReport decodes two reports from any bytes and applies them to a
// State that already holds one, as the aggregator's stream does. Apply must
// never panic; a rejected report must change nothing (a twin State that
// never sees it flushes the same zone load, surge mark included); the zone
// load built from accepted ones must hold finite, non-negative rates with
// dropped ≤ offered, valid names, at most MaxPeersPerIdentity peers per
// service besides the reserved ones (an identity's peers beyond it are
// folded, not kept), and be accepted by the controller, since a zone load
// the controller refuses hides the whole zone from it.
func FuzzLoadReport(f *testing.F) {
	f.Fuzz(func(t *testing.T, report1, report2 []byte) {
		got := aggregator.NewState("zone-a", "agg-a", 3, fuzzBounds)
		twin := aggregator.NewState("zone-a", "agg-a", 3, fuzzBounds)
		for _, s := range []*aggregator.State{got, twin} {
			if err := s.Apply(baseReport(), fuzzNow); err != nil {
				t.Fatal(err)
			}
			s.TakeUrgent()
		}
		for i, data := range [][]byte{report1, report2} {
			r := new(sluicev1.LoadReport)
			if proto.Unmarshal(data, r) != nil {
				continue
			}
			before := proto.Clone(r)
			now := fuzzNow.Add(time.Duration(i) * time.Millisecond)
			err := got.Apply(r, now)
			if !proto.Equal(before, r) {
				t.Fatalf("report %d: Apply changed the report", i)
			}
			if err != nil {
				var rej *aggregator.RejectError
				if !errors.As(err, &rej) || !slices.Contains(aggregator.Reasons, rej.Reason) {
					t.Fatalf("report %d: error %v is not a RejectError with a known reason", i, err)
				}
				continue
			}
			if err := twin.Apply(r, now); err != nil {
				t.Fatalf("report %d: accepted once, then refused by an identical State: %v", i, err)
			}
			if got.TakeUrgent() != twin.TakeUrgent() {
				t.Fatalf("report %d: surge mark differs", i)
			}
			if f, g := got.TakeFolds(), twin.TakeFolds(); f != g {
				t.Fatalf("report %d: folded %+v, then %+v by an identical State", i, f, g)
			}
			if e, g := got.TakeRejectedEntries(), twin.TakeRejectedEntries(); e != g {
				t.Fatalf("report %d: left out %+v, then %+v by an identical State", i, e, g)
			}
		}
		if got.Sidecars() > fuzzBounds.MaxSidecars {
			t.Errorf("%d sidecars kept, at most %d", got.Sidecars(), fuzzBounds.MaxSidecars)
		}
		flushAt := fuzzNow.Add(time.Second)
		zl := got.Flush(flushAt, time.Second)
		if want := twin.Flush(flushAt, time.Second); !proto.Equal(zl, want) {
			t.Fatalf("a rejected report changed the zone load:\n got %v\nwant %v", zl, want)
		}
		checkZoneLoad(t, zl, got.Sidecars())

		ctl, err := controller.NewState(controller.DefaultConfig().StateConfig, fuzzNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := ctl.Apply(zl, flushAt); err != nil {
			t.Fatalf("the controller refuses the zone load built from accepted reports: %v\n%v", err, zl)
		}
	})
}

func checkZoneLoad(t *testing.T, zl *sluicev1.ZoneLoad, sidecars int) {
	t.Helper()
	live := 0
	for _, svc := range zl.GetServices() {
		if err := names.Check(svc.GetService()); err != nil {
			t.Errorf("service %q: %v", svc.GetService(), err)
		}
		live += int(svc.GetLiveSidecars())
		own := 0
		for _, p := range svc.GetPeers() {
			reserved := (p.GetPeer() == names.Unknown || p.GetPeer() == names.Overflow) && (p.GetProcedure() == "" || p.GetProcedure() == names.Other)
			if !reserved {
				own++
			}
		}
		// In Apply the identity is the service.
		if own > fuzzBounds.MaxPeersPerIdentity {
			t.Errorf("%s: %d leaves besides the reserved ones, its identity may hold %d", svc.GetService(), own, fuzzBounds.MaxPeersPerIdentity)
		}
		for i, p := range svc.GetPeers() {
			if err := names.Check(p.GetPeer()); err != nil {
				t.Errorf("%s: peer %q: %v", svc.GetService(), p.GetPeer(), err)
			}
			if proc := p.GetProcedure(); proc != "" && names.CheckProcedure(proc) != nil {
				t.Errorf("%s: peer %q: procedure %q", svc.GetService(), p.GetPeer(), proc)
			}
			if c := p.GetCriticality(); c < 0 || c > sluicev1.Criticality_CRITICALITY_SHEDDABLE {
				t.Errorf("%s: peer %q: criticality %v", svc.GetService(), p.GetPeer(), c)
			}
			if i > 0 {
				q := svc.GetPeers()[i-1]
				if c := cmp.Or(strings.Compare(q.GetPeer(), p.GetPeer()), strings.Compare(q.GetProcedure(), p.GetProcedure()),
					cmp.Compare(q.GetCriticality(), p.GetCriticality())); c >= 0 {
					t.Errorf("%s: leaves not sorted or repeated at %q %q %v", svc.GetService(), p.GetPeer(), p.GetProcedure(), p.GetCriticality())
				}
			}
			o, d, sh := p.GetOfferedRps(), p.GetDroppedRps(), p.GetShadowDroppedRps()
			for _, v := range []float64{o, d, sh} {
				if !(v >= 0) || math.IsInf(v, 0) {
					t.Errorf("%s/%s: rates %v, %v, %v", svc.GetService(), p.GetPeer(), o, d, sh)
				}
			}
			// Sums of rates, each dropped ≤ offered: allow for rounding.
			if d+sh > o*(1+1e-12) {
				t.Errorf("%s/%s: dropped %v + shadow %v above offered %v", svc.GetService(), p.GetPeer(), d, sh, o)
			}
		}
		checkDescriptors(t, svc)
	}
	if live != sidecars {
		t.Errorf("live sidecars add up to %d, the state keeps %d", live, sidecars)
	}
}

// checkDescriptors checks what the controller may assume of a service's
// descriptors: inbound only, at most twice descriptor.MaxPerService, each
// named validly, once, sorted; rates finite, non-negative, dropped and
// every value within offered; at most MaxDescriptorValues values, each
// what a sidecar would send, once, sorted.
func checkDescriptors(t *testing.T, svc *sluicev1.ServiceLoad) {
	t.Helper()
	ds := svc.GetDescriptors()
	if len(ds) > 0 && svc.GetDirection() != inbound {
		t.Errorf("%s: descriptors in %v load", svc.GetService(), svc.GetDirection())
	}
	if len(ds) > 2*descriptor.MaxPerService {
		t.Errorf("%s: %d descriptors", svc.GetService(), len(ds))
	}
	ok := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }
	for i, d := range ds {
		name := d.GetDescriptor_()
		if err := descriptor.CheckName(name); err != nil {
			t.Errorf("%s: %v", svc.GetService(), err)
		}
		if i > 0 && ds[i-1].GetDescriptor_() >= name {
			t.Errorf("%s: descriptors not sorted or repeated at %q", svc.GetService(), name)
		}
		o := d.GetOfferedRps()
		if !ok(o) || !ok(d.GetDroppedRps()) || d.GetDroppedRps() > o*(1+1e-12) {
			t.Errorf("%s/%s: offered %v, dropped %v", svc.GetService(), name, o, d.GetDroppedRps())
		}
		if len(d.GetValues()) > fuzzBounds.MaxDescriptorValues {
			t.Errorf("%s/%s: %d values", svc.GetService(), name, len(d.GetValues()))
		}
		for j, v := range d.GetValues() {
			if descriptor.Value(v.GetValue()) != v.GetValue() {
				t.Errorf("%s/%s: value %q", svc.GetService(), name, v.GetValue())
			}
			if j > 0 && d.GetValues()[j-1].GetValue() >= v.GetValue() {
				t.Errorf("%s/%s: values not sorted or repeated at %q", svc.GetService(), name, v.GetValue())
			}
			if !ok(v.GetOfferedRps()) || v.GetOfferedRps() > o*(1+1e-12) {
				t.Errorf("%s/%s/%s: offered %v, the descriptor's %v", svc.GetService(), name, v.GetValue(), v.GetOfferedRps(), o)
			}
		}
	}
}
