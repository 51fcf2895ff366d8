// Package zonewire decodes the zone loads the controller receives, faster
// than the generic protobuf runtime and into the same messages.
//
// A zone load at fleet scale is one entry per bucket: 110,000 PeerRate
// messages, 2.7 MB, a second from each of a dozen aggregators. The generic
// decoder allocates every entry and every name on its own (two allocations
// an entry, 23 ms a load on the 2-core machine), and decoding was the
// largest part of the controller's CPU (docs/benchmarks.md). Here a
// service's entries share one allocation, and a name repeated across the
// load (a caller calls many callees; procedures repeat under every caller)
// is one string.
//
// Unmarshal decodes only the shape the aggregator sends: every field it
// knows, each singular message at most once, valid UTF-8. Anything else,
// an unknown field, a wire type that does not match, a malformed or
// truncated field, is handed whole to proto.Unmarshal, so the result (or
// the error) is always exactly the generic decoder's; the tests check that
// on random and fuzzed input.
package zonewire

import (
	"math"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// Unmarshal decodes b into m, which it resets first, as proto.Unmarshal
// does.
func Unmarshal(b []byte, m *sluicev1.StreamZoneLoadsRequest) error {
	if decodeFast(b, m) {
		return nil
	}
	proto.Reset(m)
	return proto.Unmarshal(b, m)
}

// decodeFast decodes b into m and reports whether it could; when it could
// not, m holds part of b and must be reset.
func decodeFast(b []byte, m *sluicev1.StreamZoneLoadsRequest) bool {
	proto.Reset(m)
	d := decoders.Get().(*decoder)
	defer d.release()
	return d.request(b, m)
}

// maxKeptNames bounds the names a pooled decoder keeps its map's room
// for: a load with more distinct names than this (a hostile one) leaves
// its map to the collector rather than to the pool.
const maxKeptNames = 1 << 16

var decoders = sync.Pool{New: func() any { return &decoder{names: map[string]string{}} }}

// decoder holds what one decode shares across the load: one string per
// distinct name. Not safe for concurrent use; each decode takes its own
// from the pool.
type decoder struct {
	names map[string]string
}

func (d *decoder) release() {
	if len(d.names) > maxKeptNames {
		d.names = map[string]string{}
	} else {
		clear(d.names) // do not keep this load's names alive
	}
	decoders.Put(d)
}

// name returns b as a string, one per distinct name in the load; ok is
// false when b is not valid UTF-8, which the generic decoder refuses.
func (d *decoder) name(b []byte) (s string, ok bool) {
	if s, ok := d.names[string(b)]; ok {
		return s, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	s = string(b)
	d.names[s] = s
	return s, true
}

// text returns b as a string, for a field that seldom repeats.
func text(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// field is one field of a message: its number and type, and its value,
// the varint or fixed64 as v, bytes as b.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	b   []byte
}

// next consumes the field at the start of b; n is its length, 0 when b
// does not start with a well-formed field of a type the messages here use
// (varint, fixed64, bytes).
func next(b []byte) (f field, n int) {
	num, typ, tn := protowire.ConsumeTag(b)
	if tn < 0 {
		return f, 0
	}
	f.num, f.typ = num, typ
	var vn int
	switch typ {
	case protowire.VarintType:
		f.v, vn = protowire.ConsumeVarint(b[tn:])
	case protowire.Fixed64Type:
		f.v, vn = protowire.ConsumeFixed64(b[tn:])
	case protowire.BytesType:
		f.b, vn = protowire.ConsumeBytes(b[tn:])
	default:
		return f, 0
	}
	if vn < 0 {
		return f, 0
	}
	return f, tn + vn
}

func (d *decoder) request(b []byte, m *sluicev1.StreamZoneLoadsRequest) bool {
	for len(b) > 0 {
		f, n := next(b)
		if n == 0 {
			return false
		}
		b = b[n:]
		if f.num != 1 || f.typ != protowire.BytesType || m.Load != nil {
			return false
		}
		m.Load = &sluicev1.ZoneLoad{}
		if !d.zoneLoad(f.b, m.Load) {
			return false
		}
	}
	return true
}

func (d *decoder) zoneLoad(b []byte, m *sluicev1.ZoneLoad) bool {
	services := count(b, 4)
	if services < 0 {
		return false
	}
	var slab []sluicev1.ServiceLoad
	if services > 0 { // else nil, as the generic decoder leaves it
		slab = make([]sluicev1.ServiceLoad, services)
		m.Services = make([]*sluicev1.ServiceLoad, 0, services)
	}
	var ok bool
	for len(b) > 0 {
		f, n := next(b)
		if n == 0 {
			return false
		}
		b = b[n:]
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			if m.AggregatorId, ok = text(f.b); !ok {
				return false
			}
		case f.num == 2 && f.typ == protowire.BytesType:
			if m.Zone, ok = text(f.b); !ok {
				return false
			}
		case f.num == 3 && f.typ == protowire.BytesType && m.Interval == nil:
			m.Interval = &durationpb.Duration{}
			if proto.Unmarshal(f.b, m.Interval) != nil {
				return false
			}
		case f.num == 4 && f.typ == protowire.BytesType:
			s := &slab[len(m.Services)]
			if !d.serviceLoad(f.b, s) {
				return false
			}
			m.Services = append(m.Services, s)
		case f.num == 5 && f.typ == protowire.VarintType:
			m.Urgent = f.v != 0
		default:
			return false
		}
	}
	return true
}

func (d *decoder) serviceLoad(b []byte, m *sluicev1.ServiceLoad) bool {
	peers := count(b, 4)
	if peers < 0 {
		return false
	}
	var slab []sluicev1.PeerRate
	if peers > 0 { // else nil, as the generic decoder leaves it
		slab = make([]sluicev1.PeerRate, peers)
		m.Peers = make([]*sluicev1.PeerRate, 0, peers)
	}
	var ok bool
	for len(b) > 0 {
		f, n := next(b)
		if n == 0 {
			return false
		}
		b = b[n:]
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			if m.Service, ok = d.name(f.b); !ok {
				return false
			}
		case f.num == 2 && f.typ == protowire.VarintType:
			m.Direction = sluicev1.Direction(int32(f.v))
		case f.num == 3 && f.typ == protowire.VarintType:
			m.LiveSidecars = uint32(f.v)
		case f.num == 4 && f.typ == protowire.BytesType:
			p := &slab[len(m.Peers)]
			if !d.peerRate(f.b, p) {
				return false
			}
			m.Peers = append(m.Peers, p)
		case f.num == 5 && f.typ == protowire.BytesType:
			x := &sluicev1.DescriptorRates{}
			if proto.Unmarshal(f.b, x) != nil {
				return false
			}
			m.Descriptors = append(m.Descriptors, x)
		case f.num == 6 && f.typ == protowire.BytesType:
			x := &sluicev1.HealthRates{}
			if proto.Unmarshal(f.b, x) != nil {
				return false
			}
			m.Health = append(m.Health, x)
		default:
			return false
		}
	}
	return true
}

func (d *decoder) peerRate(b []byte, m *sluicev1.PeerRate) bool {
	var ok bool
	for len(b) > 0 {
		f, n := next(b)
		if n == 0 {
			return false
		}
		b = b[n:]
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			if m.Peer, ok = d.name(f.b); !ok {
				return false
			}
		case f.num == 2 && f.typ == protowire.Fixed64Type:
			m.OfferedRps = math.Float64frombits(f.v)
		case f.num == 3 && f.typ == protowire.Fixed64Type:
			m.DroppedRps = math.Float64frombits(f.v)
		case f.num == 4 && f.typ == protowire.Fixed64Type:
			m.ShadowDroppedRps = math.Float64frombits(f.v)
		case f.num == 5 && f.typ == protowire.BytesType:
			if m.Procedure, ok = d.name(f.b); !ok {
				return false
			}
		case f.num == 6 && f.typ == protowire.VarintType:
			m.Criticality = sluicev1.Criticality(int32(f.v))
		case f.num == 7 && f.typ == protowire.Fixed64Type:
			m.OfferedCostRps = math.Float64frombits(f.v)
		case f.num == 8 && f.typ == protowire.Fixed64Type:
			m.AdmittedCostRps = math.Float64frombits(f.v)
		case f.num == 9 && f.typ == protowire.VarintType:
			m.InFlight = uint32(f.v)
		default:
			return false
		}
	}
	return true
}

// count returns how many bytes fields numbered num b holds, so that their
// messages can share one allocation; -1 when b is malformed.
func count(b []byte, num protowire.Number) int {
	c := 0
	for len(b) > 0 {
		n, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 {
			return -1
		}
		vn := protowire.ConsumeFieldValue(n, typ, b[tn:])
		if vn < 0 {
			return -1
		}
		if n == num && typ == protowire.BytesType {
			c++
		}
		b = b[tn+vn:]
	}
	return c
}
