package controller_test

import (
	"cmp"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
	"github.com/sluicehq/sluice/sidecar"

	"github.com/sluicehq/sluice/internal/testkit"
)

// seed is one named input of the committed seed corpus.
type seed = testkit.Seed

var fuzzStart = time.Date(2026, 11, 30, 3, 3, 0, 0, time.UTC)

const (
	inbound  = sluicev1.Direction_DIRECTION_INBOUND
	outbound = sluicev1.Direction_DIRECTION_OUTBOUND
)

// rejectReasons are the reasons Apply may refuse a zone load for;
// dropReasons those it may leave a service entry out for.
var (
	rejectReasons = []string{"bad_name", "bad_interval", "too_many_aggregators"}
	dropReasons   = []string{"bad_name", "bad_direction", "duplicate_service", "duplicate_peer", "bad_rate", "dropped_above_offered", "bad_live_sidecars"}
	// descriptorReasons are those it may leave a descriptor entry or value
	// out for.
	descriptorReasons = []string{controller.ReasonDescriptorOutbound, controller.ReasonDescriptorName, controller.ReasonDescriptorDuplicate,
		controller.ReasonDescriptorTooMany, controller.ReasonDescriptorRate, controller.ReasonValue, controller.ReasonValueRate,
		controller.ReasonValueDuplicate, controller.ReasonValueTooMany}
)

func fuzzConfig() controller.StateConfig {
	cfg := controller.DefaultConfig().StateConfig
	cfg.Warmup = 0 // tick at once, before a zone load with a short interval goes stale
	cfg.MaxAggregators = 2
	cfg.MaxDescriptorValues = 4
	return cfg
}

// fuzzLimits bind: a limit, a shadow limit, a default limit, a capacity,
// and a blocked caller of a callee that may see no traffic at all; and a
// callee that declares procedures, with a capacity per procedure, a
// caller's limit across them and a leaf's.
func fuzzLimits() *limits.Set {
	inf := math.Inf(1)
	return limits.NewSet(map[string]*limits.Service{
		"payments": {Name: "payments", Capacity: 900, DefaultLimit: inf, FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{"web": {Limit: 300}, "abuser": {Limit: 0}},
			Routes:  []routes.Route{{Pattern: "POST /v1/charges", Procedure: "create-charge"}},
			Procedures: map[string]*limits.Procedure{
				"create-charge":      {Capacity: 200, Callers: map[string]float64{"web": 50, "mobile": 20}},
				"/shop.Payments/Pay": {Capacity: inf, Callers: map[string]float64{"batch": 10}},
				names.Other:          {Capacity: 100},
			},
			Declared: []string{"create-charge", "/shop.Payments/Pay"},
		},
		"checkout": {Name: "checkout", Capacity: 1000, DefaultLimit: 200, FailMode: dataplane.FailHold, Callers: map[string]limits.Bucket{
			"web": {Limit: 100}, "batch": {Limit: 50, Mode: dropratio.Shadow},
		}},
		"orders": {Name: "orders", Capacity: inf, DefaultLimit: inf, FailMode: dataplane.FailLocal, Callers: map[string]limits.Bucket{
			"abuser": {Limit: 0},
		}, Descriptors: []limits.Descriptor{
			{Name: "ip", Source: descriptor.Source{Kind: descriptor.ClientIP}, Limit: 0, Missing: 0, Quantile: 0.5},
			{Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant"}, Limit: 10, Missing: 2, Quantile: 0.95,
				Overrides: map[string]float64{"vip": 100, "zero": 0}},
		}},
	})
}

func rates(peerRates ...any) []*sluicev1.PeerRate {
	var out []*sluicev1.PeerRate
	for i := 0; i+3 < len(peerRates); i += 4 {
		out = append(out, &sluicev1.PeerRate{Peer: peerRates[i].(string), OfferedRps: peerRates[i+1].(float64),
			DroppedRps: peerRates[i+2].(float64), ShadowDroppedRps: peerRates[i+3].(float64)})
	}
	return out
}

// baseLoad is the zone load every fuzzed state holds before the fuzzed ones.
func baseLoad() *sluicev1.ZoneLoad {
	return &sluicev1.ZoneLoad{AggregatorId: "agg-base", Zone: "zone-a", Interval: durationpb.New(time.Second),
		Services: []*sluicev1.ServiceLoad{
			{Service: "checkout", Direction: inbound, LiveSidecars: 2,
				Peers: rates("web", 500.0, 0.0, 0.0, "batch", 80.0, 0.0, 30.0, "mobile", 150.0, 0.0, 0.0)},
		}}
}

// zoneLoadSeeds are FuzzZoneLoad's committed seeds, two zone loads each:
// good ones (taken whole), drop-… ones (taken, less a bad service entry),
// and bad-… ones (refused whole).
func zoneLoadSeeds(t testing.TB) []seed {
	zb := func(edit func(*sluicev1.ZoneLoad)) []byte {
		z := baseLoad()
		z.AggregatorId, z.Zone = "agg-b", "zone-b"
		z.Services[0].Peers = rates("web", 700.0, 600.0, 0.0, "mobile", 20.0, 0.0, 0.0)
		z.Services = append(z.Services, &sluicev1.ServiceLoad{Service: "orders", Direction: inbound, LiveSidecars: 1,
			Peers: rates("checkout", 30.0, 0.0, 0.0, "abuser", 5.0, 5.0, 0.0)})
		if edit != nil {
			edit(z)
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(z)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	one := func(name string, edit func(*sluicev1.ZoneLoad)) seed { // sent twice, as the next flush would
		b := zb(edit)
		return seed{Name: name, Args: []any{b, b}}
	}
	peer0 := func(edit func(*sluicev1.PeerRate)) func(*sluicev1.ZoneLoad) {
		return func(z *sluicev1.ZoneLoad) { edit(z.Services[0].Peers[0]) }
	}
	str := func(field protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, field, protowire.BytesType), s)
	}
	return []seed{
		one("good", nil),
		one("good-empty-zone", func(z *sluicev1.ZoneLoad) { z.Services = nil }),
		one("good-outbound", func(z *sluicev1.ZoneLoad) { z.Services[1].Direction = outbound }),
		one("good-urgent", func(z *sluicev1.ZoneLoad) { z.Urgent = true }),
		one("good-max-rate", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps, p.DroppedRps, p.ShadowDroppedRps = 1e10, 5e9, 5e9 })),
		one("drop-dropped-above-offered", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps, p.DroppedRps = 10, 1e10 })),
		one("drop-dropped-and-shadow-above-offered", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps, p.DroppedRps, p.ShadowDroppedRps = 10, 6, 5 })),
		one("good-dropped-all", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps, p.DroppedRps, p.ShadowDroppedRps = 0.1+0.2, 0.1, 0.2 })),
		one("good-negative-zero", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps, p.DroppedRps = math.Copysign(0, -1), 0 })),
		one("good-tiny-rates", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps, p.DroppedRps = 5e-324, 5e-324 })),
		one("drop-max-live-sidecars", func(z *sluicev1.ZoneLoad) { z.Services[0].LiveSidecars = math.MaxUint32 }),
		one("good-live-sidecars-bound", func(z *sluicev1.ZoneLoad) { z.Services[0].LiveSidecars = zoneload.MaxLiveSidecars }),
		one("good-zero-live-sidecars", func(z *sluicev1.ZoneLoad) { z.Services[0].LiveSidecars = 0 }),
		one("good-overflow-and-unknown-peers", peer0(func(p *sluicev1.PeerRate) { p.Peer = names.Overflow })),
		one("good-253-byte-names", func(z *sluicev1.ZoneLoad) {
			z.AggregatorId, z.Zone = strings.Repeat("a", names.MaxLen), strings.Repeat("z", names.MaxLen)
			z.Services[1].Service, z.Services[1].Peers[0].Peer = strings.Repeat("s", names.MaxLen), strings.Repeat("p", names.MaxLen)
		}),
		one("good-interval-bounds", func(z *sluicev1.ZoneLoad) { z.Interval = durationpb.New(10 * time.Millisecond) }),
		{Name: "good-replace", Args: []any{zb(nil), zb(func(z *sluicev1.ZoneLoad) { z.Services = z.Services[1:] })}},
		{Name: "bad-one-aggregator-too-many", Args: []any{zb(nil), zb(func(z *sluicev1.ZoneLoad) { z.AggregatorId = "agg-c" })}},
		one("drop-rate-nan", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps = math.NaN() })),
		one("drop-rate-inf", peer0(func(p *sluicev1.PeerRate) { p.DroppedRps = math.Inf(1) })),
		one("drop-rate-negative", peer0(func(p *sluicev1.PeerRate) { p.ShadowDroppedRps = -1e-300 })),
		one("drop-rate-absurd", peer0(func(p *sluicev1.PeerRate) { p.OfferedRps = math.Nextafter(1e10, math.Inf(1)) })),
		one("drop-overflow-service", func(z *sluicev1.ZoneLoad) { z.Services[1].Service = names.Overflow }),
		one("bad-empty-aggregator-id", func(z *sluicev1.ZoneLoad) { z.AggregatorId = "" }),
		one("bad-zone-charset", func(z *sluicev1.ZoneLoad) { z.Zone = "zone a" }),
		one("drop-254-byte-peer", peer0(func(p *sluicev1.PeerRate) { p.Peer = strings.Repeat("p", names.MaxLen+1) })),
		one("drop-duplicate-service", func(z *sluicev1.ZoneLoad) { z.Services[1].Service = "checkout" }),
		one("drop-duplicate-peer", func(z *sluicev1.ZoneLoad) { z.Services[0].Peers[1].Peer = "web" }),
		one("drop-direction", func(z *sluicev1.ZoneLoad) { z.Services[1].Direction = 0 }),
		// A callee with procedures: leaves per caller, an invented
		// procedure and an old sidecar's "" folding into _other; a bad
		// procedure costs its entry, a leaf listed twice its service.
		one("good-procedures", func(z *sluicev1.ZoneLoad) {
			z.Services = append(z.Services, &sluicev1.ServiceLoad{Service: "payments", Direction: inbound, LiveSidecars: 3,
				Peers: leafRates("web", "create-charge", 400.0, "web", "/shop.Payments/Pay", 30.0, "web", "made-up", 90.0, "web", "", 40.0,
					"mobile", "create-charge", 15.0, "batch", names.Other, 500.0, "unknown", "/shop.Payments/Pay", 5.0)})
		}),
		one("good-procedures-outbound", func(z *sluicev1.ZoneLoad) {
			z.Services = append(z.Services, &sluicev1.ServiceLoad{Service: "web", Direction: outbound, LiveSidecars: 1,
				Peers: leafRates("payments", "", 70.0, "checkout", "made-up", 5.0)})
		}),
		one("drop-bad-procedure", func(z *sluicev1.ZoneLoad) { z.Services[0].Peers[0].Procedure = "a//b" }),
		one("drop-duplicate-leaf", func(z *sluicev1.ZoneLoad) {
			z.Services[0].Peers = leafRates("web", "create-charge", 1.0, "web", "create-charge", 2.0)
		}),
		// A callee with descriptors: values summed and listed; bad
		// entries and values cost themselves.
		one("good-descriptors", func(z *sluicev1.ZoneLoad) {
			z.Services[1].Descriptors = []*sluicev1.DescriptorRates{
				{Descriptor_: "tenant", OfferedRps: 500, DroppedRps: 10, ValuesCut: 7, Values: []*sluicev1.ValueRate{
					{Value: "acme", OfferedRps: 300}, {Value: descriptor.Missing, OfferedRps: 50}, {Value: descriptor.Invalid, OfferedRps: 5},
					{Value: "vip", OfferedRps: 90}}},
				{Descriptor_: "ip", OfferedRps: 3, Values: []*sluicev1.ValueRate{{Value: "10.0.0.1", OfferedRps: 3}}},
				{Descriptor_: "unknown_to_limits", OfferedRps: 3, Values: []*sluicev1.ValueRate{{Value: "x", OfferedRps: 3}}},
			}
		}),
		one("drop-descriptors", func(z *sluicev1.ZoneLoad) {
			z.Services[1].Descriptors = []*sluicev1.DescriptorRates{
				{Descriptor_: "tenant", OfferedRps: 500, Values: []*sluicev1.ValueRate{
					{Value: "a", OfferedRps: 300}, {Value: "", OfferedRps: 1}, {Value: strings.Repeat("v", descriptor.MaxValueLen+1), OfferedRps: 1}, {Value: "b", OfferedRps: math.NaN()},
					{Value: "c", OfferedRps: 1}, {Value: "c", OfferedRps: 2}, {Value: "d", OfferedRps: 1}, {Value: "e", OfferedRps: 1},
					{Value: "f", OfferedRps: 1}, {Value: "g", OfferedRps: 1}}},
				{Descriptor_: "ip", OfferedRps: 1, DroppedRps: 2},
				{Descriptor_: "Tenant"},
			}
			z.Services[0].Descriptors = []*sluicev1.DescriptorRates{{Descriptor_: "tenant"}, {Descriptor_: "tenant"}}
		}),
		one("bad-no-interval", func(z *sluicev1.ZoneLoad) { z.Interval = nil }),
		one("bad-interval-invalid", func(z *sluicev1.ZoneLoad) { z.Interval = &durationpb.Duration{Seconds: -1, Nanos: 5} }),
		one("bad-interval-long", func(z *sluicev1.ZoneLoad) { z.Interval = durationpb.New(time.Minute + 1) }),
		one("bad-urgent", func(z *sluicev1.ZoneLoad) { z.Urgent, z.Zone = true, "" }),
		{Name: "wire-invalid-utf8", Args: []any{append(str(1, "agg-b"), str(2, "zone-\xff")...), []byte{}}},
		{Name: "wire-truncated", Args: []any{zb(nil)[:25], zb(nil)}},
	}
}

func TestFuzzZoneLoadCorpus(t *testing.T) {
	seeds := zoneLoadSeeds(t)
	testkit.CheckCorpus(t, "FuzzZoneLoad", seeds)
	// The seeds say what they are: in good ones every zone load is taken.
	for _, s := range seeds {
		st, err := controller.NewState(fuzzConfig(), fuzzStart)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(baseLoad(), fuzzStart); err != nil {
			t.Fatal(err)
		}
		var errs []error
		dropped := 0
		for _, b := range s.Args {
			z := new(sluicev1.ZoneLoad)
			err := proto.Unmarshal(b.([]byte), z)
			if err == nil {
				err = st.Apply(z, fuzzStart)
			}
			errs = append(errs, err)
			d := st.TakeDropped()
			dropped += d.BadProcedures
			for _, n := range d.ByReason {
				dropped += n
			}
			for _, n := range d.BadDescriptors {
				dropped += n
			}
		}
		taken := errors.Join(errs...) == nil
		switch {
		case strings.HasPrefix(s.Name, "good") && (!taken || dropped > 0),
			strings.HasPrefix(s.Name, "drop") && (!taken || dropped == 0),
			strings.HasPrefix(s.Name, "bad") && taken:
			t.Errorf("seed %s: %v, %d service entries dropped", s.Name, errs, dropped)
		}
	}
}

// FuzzZoneLoad decodes two zone loads from any bytes and applies them to a
// controller that already holds one, then runs two ticks. Apply must never
// panic; a rejected zone load must change nothing (a twin State that never
// sees it ticks to the same result), and a bad service entry must cost only
// itself (the twin is given the load as Apply left it, without the entry); and every policy a tick publishes must
// be one the sidecars accept (sidecar.PolicyFromProto), or they would NACK
// it and keep enforcing their last one, with its live instance count at
// least what any accepted zone reported.
func FuzzZoneLoad(f *testing.F) {
	set := fuzzLimits()
	f.Fuzz(func(t *testing.T, load1, load2 []byte) {
		var got, twin *controller.State
		for _, s := range []**controller.State{&got, &twin} {
			st, err := controller.NewState(fuzzConfig(), fuzzStart)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Apply(baseLoad(), fuzzStart); err != nil {
				t.Fatal(err)
			}
			st.TakeUrgent()
			*s = st
		}
		// By aggregator, then policy: what its last accepted zone load
		// claimed; a later load of the same aggregator replaces it.
		byAgg := map[string]map[string]uint32{"agg-base": {"callee/checkout": 2}}
		for i, data := range [][]byte{load1, load2} {
			z := new(sluicev1.ZoneLoad)
			if proto.Unmarshal(data, z) != nil {
				continue
			}
			now := fuzzStart.Add(time.Duration(i+1) * time.Millisecond)
			if err := got.Apply(z, now); err != nil {
				var rej *controller.RejectError
				if !errors.As(err, &rej) || !slices.Contains(rejectReasons, rej.Reason) {
					t.Fatalf("zone load %d: error %v is not a RejectError with a known reason", i, err)
				}
				continue
			}
			d := got.TakeDropped()
			for reason := range d.ByReason {
				if !slices.Contains(dropReasons, reason) {
					t.Fatalf("zone load %d: service entry dropped for an unknown reason %q", i, reason)
				}
			}
			for reason := range d.BadDescriptors {
				if !slices.Contains(descriptorReasons, reason) {
					t.Fatalf("zone load %d: descriptor entry dropped for an unknown reason %q", i, reason)
				}
			}
			if err := twin.Apply(z, now); err != nil {
				t.Fatalf("zone load %d: accepted once, then refused by an identical State: %v", i, err)
			}
			if got.TakeUrgent() != twin.TakeUrgent() {
				t.Fatalf("zone load %d: surge mark differs", i)
			}
			claimed := map[string]uint32{}
			for _, svc := range z.GetServices() {
				name := names.Callee(svc.GetService())
				if svc.GetDirection() == outbound {
					name = names.Caller(svc.GetService())
				}
				claimed[name] = svc.GetLiveSidecars()
			}
			byAgg[z.GetAggregatorId()] = claimed
		}
		live := map[string]uint32{} // by policy: the most one held zone load claimed
		for _, claimed := range byAgg {
			for name, n := range claimed {
				live[name] = max(live[name], n)
			}
		}
		for tick := range 2 {
			// The first tick sees every accepted zone load; by the second,
			// those with a short interval went stale.
			now := fuzzStart.Add(2*time.Millisecond + time.Duration(tick)*time.Second)
			res, want := got.Tick(now, set), twin.Tick(now, set)
			equalTicks(t, tick, res, want)
			checkTick(t, tick, res, live)
			clear(live)
		}
	})
}

// leafRates is rates for leaves: (peer, procedure, offered) triples.
func leafRates(leaves ...any) []*sluicev1.PeerRate {
	var out []*sluicev1.PeerRate
	for i := 0; i+2 < len(leaves); i += 3 {
		out = append(out, &sluicev1.PeerRate{Peer: leaves[i].(string), Procedure: leaves[i+1].(string), OfferedRps: leaves[i+2].(float64)})
	}
	return out
}

func equalTicks(t *testing.T, tick int, got, want controller.TickResult) {
	t.Helper()
	same := got.Warm == want.Warm && got.Aggregators == want.Aggregators && got.Buckets == want.Buckets &&
		slices.Equal(got.Deleted, want.Deleted) && len(got.Changed) == len(want.Changed) &&
		len(got.Services) == len(want.Services) && len(got.Loads) == len(want.Loads)
	for name, p := range got.Changed {
		same = same && proto.Equal(p, want.Changed[name])
	}
	if !same {
		t.Fatalf("tick %d: a rejected zone load changed the result:\n got %+v\nwant %+v", tick, got, want)
	}
}

func checkTick(t *testing.T, tick int, res controller.TickResult, live map[string]uint32) {
	t.Helper()
	if !res.Warm {
		t.Fatalf("tick %d: not warm", tick)
	}
	for name, m := range res.Changed {
		checkProcedures(t, tick, m)
		checkDescriptors(t, tick, m)
		p, err := sidecar.PolicyFromProto(m)
		if err != nil {
			t.Fatalf("tick %d: published a policy the sidecars refuse: %v\n%v", tick, err, m)
		}
		if p.Name != name {
			t.Errorf("tick %d: policy %q published as %q", tick, p.Name, name)
		}
		if uint32(p.LiveInstances) < live[name] {
			t.Errorf("tick %d: %s: live instances %d, but one zone alone reported %d", tick, name, p.LiveInstances, live[name])
		}
	}
	for svc, tot := range res.Services {
		for _, v := range []float64{tot.Offered, tot.Dropped, tot.ShadowDropped} {
			if !(v >= 0) || math.IsInf(v, 0) {
				t.Errorf("tick %d: %s totals %+v", tick, svc, tot)
			}
		}
	}
	for _, l := range res.Loads {
		if names.Check(l.Callee) != nil || names.Check(l.Caller) != nil || !(l.Offered >= 0) || math.IsInf(l.Offered, 0) ||
			l.Procedure != "" && names.CheckProcedure(l.Procedure) != nil {
			t.Errorf("tick %d: history row %+v", tick, l)
		}
	}
	for k := range res.Procedures {
		// Bounded: what the limits declare, _other, or "".
		lim := fuzzLimits().Service(k.Service)
		if k.Procedure != "" && k.Procedure != names.Other && (lim == nil || !slices.Contains(lim.Declared, k.Procedure)) {
			t.Errorf("tick %d: metrics for %s procedure %q, which it does not declare", tick, k.Service, k.Procedure)
		}
	}
}

// checkProcedures checks what a policy says of procedures: an outbound
// policy, or one of a callee without them, has none, and its entries none;
// an inbound policy of a callee with procedures has every entry's
// procedure declared or _other, sorted by (peer, procedure), each once.
// (sidecar.PolicyFromProto refuses what is not declared and repeats, but
// not what is out of order.)
func checkProcedures(t *testing.T, tick int, m *sluicev1.DropPolicy) {
	t.Helper()
	var declared []string
	if lim := fuzzLimits().Service(m.GetService()); lim != nil {
		declared = lim.Declared
	}
	if m.GetDirection() == outbound || len(declared) == 0 {
		for _, pp := range m.GetPeers() {
			if pp.GetProcedure() != "" || len(m.GetProcedures()) > 0 || len(m.GetRoutes()) > 0 {
				t.Errorf("tick %d: %s: procedures in a policy without them: %v", tick, m.GetName(), m)
			}
		}
		return
	}
	if !slices.Equal(m.GetProcedures(), declared) && len(m.GetPeers()) > 0 {
		t.Errorf("tick %d: %s: procedures %q, want %q", tick, m.GetName(), m.GetProcedures(), declared)
	}
	for i, pp := range m.GetPeers() {
		if pp.GetProcedure() != names.Other && !slices.Contains(declared, pp.GetProcedure()) {
			t.Errorf("tick %d: %s: peers[%d] procedure %q not declared", tick, m.GetName(), i, pp.GetProcedure())
		}
		if i > 0 {
			q := m.GetPeers()[i-1]
			if c := cmp.Or(strings.Compare(q.GetPeer(), pp.GetPeer()), strings.Compare(q.GetProcedure(), pp.GetProcedure())); c >= 0 {
				t.Errorf("tick %d: %s: peers not sorted by (peer, procedure) or repeated at %d", tick, m.GetName(), i)
			}
		}
		if !(pp.GetDropRatio() >= 0 && pp.GetDropRatio() < 1) {
			t.Errorf("tick %d: %s: peers[%d] ratio %v", tick, m.GetName(), i, pp.GetDropRatio())
		}
	}
}

// checkDescriptors checks what a policy says of descriptors: only an
// inbound policy of a callee whose limits give descriptors has them, all
// of them, with their limits; each lists at most the bound of values,
// sorted, each once, valid, with a ratio in [0, 1) and its own limit.
func checkDescriptors(t *testing.T, tick int, m *sluicev1.DropPolicy) {
	t.Helper()
	var want []limits.Descriptor
	if lim := fuzzLimits().Service(m.GetService()); lim != nil && m.GetDirection() == inbound && len(m.GetPeers())+len(m.GetDescriptors()) > 0 {
		want = lim.Descriptors
	}
	if len(m.GetDescriptors()) != len(want) {
		t.Fatalf("tick %d: %s: descriptors %v, want %d", tick, m.GetName(), m.GetDescriptors(), len(want))
	}
	for i, dp := range m.GetDescriptors() {
		d := want[i]
		if dp.GetName() != d.Name || dp.GetSource() != d.Source.String() || dp.GetLimitRps() != d.Limit || dp.GetMissingLimitRps() != d.Missing ||
			dp.GetQuantile() != d.Quantile || len(dp.GetOverrides()) != len(d.Overrides) {
			t.Errorf("tick %d: %s: descriptor %v, want %+v", tick, m.GetName(), dp, d)
		}
		if len(dp.GetValues()) > fuzzConfig().MaxDescriptorValues {
			t.Errorf("tick %d: %s/%s: %d values", tick, m.GetName(), d.Name, len(dp.GetValues()))
		}
		for j, v := range dp.GetValues() {
			val := v.GetValue()
			limit := d.Limit
			if l, ok := d.Overrides[val]; ok {
				limit = l
			} else if val == descriptor.Missing {
				limit = d.Missing
			}
			if descriptor.Value(val) != val || j > 0 && dp.GetValues()[j-1].GetValue() >= val ||
				!(v.GetDropRatio() >= 0 && v.GetDropRatio() < 1) || v.GetLimitRps() != limit || !(v.GetOfferedRps() >= 0) {
				t.Errorf("tick %d: %s/%s: values[%d] %v", tick, m.GetName(), d.Name, j, v)
			}
		}
	}
}
