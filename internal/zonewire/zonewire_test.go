package zonewire

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// randomRequest is a zone load with every field of every message the fast
// path decodes set at random, names drawn from a small set so that they
// repeat as a real load's do, and values at the edges of their types.
func randomRequest(r *rand.Rand) *sluicev1.StreamZoneLoadsRequest {
	names := []string{"", "web", "checkout", "/shop.Checkout/Pay", "_other", "ünïcode", "a-very-long-service-name-0001"}
	pick := func() string { return names[r.IntN(len(names))] }
	float := func() float64 {
		switch r.IntN(6) {
		case 0:
			return 0
		case 1:
			return math.Inf(1)
		case 2:
			return -r.Float64()
		case 3:
			return math.NaN()
		}
		return r.Float64() * 1e6
	}
	zl := &sluicev1.ZoneLoad{AggregatorId: pick(), Zone: pick(), Urgent: r.IntN(2) == 0}
	if r.IntN(4) > 0 {
		zl.Interval = durationpb.New(time.Duration(r.Int64N(1e10)))
	}
	for range r.IntN(5) {
		svc := &sluicev1.ServiceLoad{Service: pick(), Direction: sluicev1.Direction(r.Int32N(4) - 1), LiveSidecars: r.Uint32()}
		for range r.IntN(20) {
			svc.Peers = append(svc.Peers, &sluicev1.PeerRate{
				Peer: pick(), Procedure: pick(), Criticality: sluicev1.Criticality(r.Int32N(7) - 1),
				OfferedRps: float(), DroppedRps: float(), ShadowDroppedRps: float(),
				OfferedCostRps: float(), AdmittedCostRps: float(), InFlight: r.Uint32(),
			})
		}
		for range r.IntN(2) {
			d := &sluicev1.DescriptorRates{Descriptor_: pick(), OfferedRps: float(), DroppedRps: float(), ValuesCut: r.Uint32()}
			for range r.IntN(3) {
				d.Values = append(d.Values, &sluicev1.ValueRate{Value: pick(), OfferedRps: float()})
			}
			svc.Descriptors = append(svc.Descriptors, d)
		}
		for range r.IntN(2) {
			svc.Health = append(svc.Health, &sluicev1.HealthRates{Procedure: pick(), LatencyRps: []float64{float(), float()}, OkRps: float(), InFlight: r.Uint32()})
		}
		zl.Services = append(zl.Services, svc)
	}
	return &sluicev1.StreamZoneLoadsRequest{Load: zl}
}

// agree decodes b both ways and fails t unless the two agree: both refuse
// it, or both decode the same message.
func agree(t *testing.T, b []byte) (fast bool) {
	t.Helper()
	var want, got sluicev1.StreamZoneLoadsRequest
	wantErr := proto.Unmarshal(b, &want)
	gotErr := Unmarshal(b, &got)
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("proto.Unmarshal: %v, Unmarshal: %v, on %x", wantErr, gotErr, b)
	}
	if wantErr == nil && !proto.Equal(&want, &got) {
		t.Fatalf("decoded %v, proto.Unmarshal decodes %v", &got, &want)
	}
	var scratch sluicev1.StreamZoneLoadsRequest
	return decodeFast(b, &scratch)
}

func TestDecodesAsProtoDoes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b, err := proto.Marshal(randomRequest(r))
		if err != nil {
			t.Fatal(err)
		}
		if !agree(t, b) {
			t.Fatalf("what the aggregator sends took the generic decoder: %x", b)
		}
	}
}

// TestEveryFieldIsDecodedFast sets each field of the messages the fast
// path decodes itself, one at a time, and checks that it does: a field
// added to zone.proto and not here would send every load to the generic
// decoder, correct and slow.
func TestEveryFieldIsDecodedFast(t *testing.T) {
	for _, m := range []proto.Message{&sluicev1.ZoneLoad{}, &sluicev1.ServiceLoad{}, &sluicev1.PeerRate{}} {
		fields := m.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			msg := m.ProtoReflect().New()
			setNonZero(msg, fd)
			req := wrap(msg.Interface())
			b, err := proto.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			if !agree(t, b) {
				t.Errorf("%s: decoded by the generic decoder", fd.FullName())
			}
		}
	}
}

// setNonZero sets fd of msg to a value that is not its default.
func setNonZero(msg protoreflect.Message, fd protoreflect.FieldDescriptor) {
	var v protoreflect.Value
	switch fd.Kind() {
	case protoreflect.StringKind:
		v = protoreflect.ValueOfString("x")
	case protoreflect.DoubleKind:
		v = protoreflect.ValueOfFloat64(1.5)
	case protoreflect.BoolKind:
		v = protoreflect.ValueOfBool(true)
	case protoreflect.Uint32Kind:
		v = protoreflect.ValueOfUint32(7)
	case protoreflect.EnumKind:
		v = protoreflect.ValueOfEnum(1)
	case protoreflect.MessageKind:
		if fd.IsList() {
			msg.Mutable(fd).List().AppendMutable()
		} else {
			msg.Mutable(fd)
		}
		return
	default:
		panic("zonewire test: no value for kind " + fd.Kind().String())
	}
	if fd.IsList() {
		msg.Mutable(fd).List().Append(v)
		return
	}
	msg.Set(fd, v)
}

// wrap puts m in a request where the aggregator would send it.
func wrap(m proto.Message) *sluicev1.StreamZoneLoadsRequest {
	switch m := m.(type) {
	case *sluicev1.ZoneLoad:
		return &sluicev1.StreamZoneLoadsRequest{Load: m}
	case *sluicev1.ServiceLoad:
		return wrap(&sluicev1.ZoneLoad{Services: []*sluicev1.ServiceLoad{m}})
	case *sluicev1.PeerRate:
		return wrap(&sluicev1.ServiceLoad{Peers: []*sluicev1.PeerRate{m}})
	}
	panic("zonewire test: cannot wrap " + string(proto.MessageName(m)))
}

// TestOddInputIsTheGenericDecoders: what the aggregator never sends goes
// to proto.Unmarshal, which keeps or refuses it as it always did.
func TestOddInputIsTheGenericDecoders(t *testing.T) {
	good, err := proto.Marshal(&sluicev1.StreamZoneLoadsRequest{Load: &sluicev1.ZoneLoad{
		Zone: "z", Interval: durationpb.New(1e9),
		Services: []*sluicev1.ServiceLoad{{Service: "checkout", Peers: []*sluicev1.PeerRate{{Peer: "web", OfferedRps: 1}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	load := func(inner []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)
	}
	service := func(inner []byte) []byte {
		return load(protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), inner))
	}
	peer := func(inner []byte) []byte {
		return service(protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), inner))
	}
	cases := map[string][]byte{
		"unknown field in a peer":    peer(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1)),
		"unknown field in a request": protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1),
		"invalid UTF-8 peer":         peer(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff")),
		"invalid UTF-8 zone":         load(protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xc3")),
		"offered as a varint":        peer(protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 3)),
		"interval twice":             append(load(protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), []byte{8, 1})), load(protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), []byte{16, 5}))...),
		"load twice":                 append(slices.Clone(good), good...),
		"truncated":                  good[:len(good)-3],
		"a group":                    peer(protowire.AppendTag(nil, 1, protowire.StartGroupType)),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if agree(t, b) {
				t.Errorf("the fast path decoded it")
			}
		})
	}
}

func FuzzUnmarshal(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		// Small seeds: the fuzzer minimizes every new input it finds,
		// for up to a minute each, and a load of a hundred entries kept
		// it minimizing for the whole of a short run.
		req := randomRequest(r)
		zl := req.GetLoad()
		zl.Services = zl.Services[:min(len(zl.Services), 2)]
		for _, svc := range zl.Services {
			svc.Peers = svc.Peers[:min(len(svc.Peers), 2)]
		}
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { agree(t, b) })
}

// TestNamesAreShared: a name that repeats across a load is one string,
// which is what keeps a decoded load small.
func TestNamesAreShared(t *testing.T) {
	in := &sluicev1.StreamZoneLoadsRequest{Load: &sluicev1.ZoneLoad{Services: []*sluicev1.ServiceLoad{
		{Service: "a", Peers: []*sluicev1.PeerRate{{Peer: "web"}}},
		{Service: "b", Peers: []*sluicev1.PeerRate{{Peer: "web"}}},
	}}}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out sluicev1.StreamZoneLoadsRequest
	if err := Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	p, q := out.Load.Services[0].Peers[0].Peer, out.Load.Services[1].Peers[0].Peer
	if unsafe.StringData(p) != unsafe.StringData(q) {
		t.Errorf("the two peers named web are two strings")
	}
}
