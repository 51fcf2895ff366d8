package sidecar

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// seed is one named input of the committed seed corpus.
type seed = testkit.Seed

func marshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatalf("marshal %T: %v", m, err)
	}
	return b
}

func f64(v float64) *float64 { return &v }

// policySeeds are FuzzPolicyFromProto's committed seeds: good policies and
// every way the edge must refuse one.
func policySeeds(t testing.TB) []seed {
	good := func(edit func(*sluicev1.DropPolicy)) []byte {
		m := &sluicev1.DropPolicy{
			Name: "callee/checkout", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
			Ttl: durationpb.New(10 * time.Second), LiveInstances: 6, FailMode: sluicev1.FailMode_FAIL_MODE_HOLD,
			FailOpenDecay: durationpb.New(30 * time.Second),
			IssuedAt:      timestamppb.New(time.Date(2026, 11, 30, 3, 3, 0, 5, time.UTC)),
			Peers: []*sluicev1.PeerPolicy{ // unsorted on purpose
				{Peer: "web", DropRatio: 0.9, Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: f64(100), AllowedRps: f64(100), OfferedRps: 1000, Reason: sluicev1.DropReason_DROP_REASON_LIMIT},
				{Peer: "batch", DropRatio: 0.5, Mode: sluicev1.Mode_MODE_SHADOW, LimitRps: f64(50), OfferedRps: 100},
				{Peer: "mobile", LimitRps: f64(0), OfferedRps: 3, Reason: sluicev1.DropReason_DROP_REASON_CAPACITY},
			},
		}
		if edit != nil {
			edit(m)
		}
		return marshal(t, m)
	}
	peer0 := func(edit func(*sluicev1.PeerPolicy)) []byte {
		return good(func(m *sluicev1.DropPolicy) { edit(m.Peers[0]) })
	}
	many := func(m *sluicev1.DropPolicy) {
		for i := range 300 {
			m.Peers = append(m.Peers, &sluicev1.PeerPolicy{Peer: fmt.Sprintf("caller-%03d", i), DropRatio: float64(i) / 300})
		}
	}
	// Wire forms the generated code never writes.
	str := func(field protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, field, protowire.BytesType), s)
	}
	badUTF8 := append(str(1, "callee/checkout"), str(2, "check\xffout")...)
	wrongWire := protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 7) // peers as a varint
	hugeLen := protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.BytesType), 1<<40)
	b := func(v []byte) []any { return []any{v} }
	withProcedures := func(edit func(*sluicev1.DropPolicy)) []byte {
		return good(func(m *sluicev1.DropPolicy) {
			m.Procedures = []string{"create-charge", "/shop.Checkout/Pay", "get-item"}
			m.Routes = []*sluicev1.Route{
				{Pattern: "POST /v1/charges", Procedure: "create-charge"},
				{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
				{Pattern: "/static/*", Procedure: "get-item"},
			}
			m.Peers[0].Procedure = "create-charge"
			m.Peers[1].Procedure = names.Other
			m.Peers[2].Procedure = "/shop.Checkout/Pay"
			m.Peers = append(m.Peers,
				&sluicev1.PeerPolicy{Peer: "web", Procedure: "/shop.Checkout/Pay", DropRatio: 0.5, LimitRps: f64(10), CallerLimitRps: f64(100), OfferedRps: 20},
				&sluicev1.PeerPolicy{Peer: "web", Procedure: names.Other, DropRatio: 0.25, LimitRps: f64(1), CallerLimitRps: f64(100)})
			if edit != nil {
				edit(m)
			}
		})
	}
	withDescriptors := func(edit func(*sluicev1.DropPolicy)) []byte {
		return good(func(m *sluicev1.DropPolicy) {
			m.Descriptors = []*sluicev1.DescriptorPolicy{
				{Name: "tenant", Source: "header x-tenant-id", LimitRps: 50, MissingLimitRps: 10, Quantile: 0.95,
					Overrides: []*sluicev1.ValueLimit{{Value: "_missing", LimitRps: 5}, {Value: "acme", LimitRps: 500}},
					Values: []*sluicev1.ValuePolicy{
						{Value: "_invalid", DropRatio: 0.5, LimitRps: 50, OfferedRps: 100},
						{Value: "acme", LimitRps: 500, OfferedRps: 400},
						{Value: "evil", DropRatio: 0.9, LimitRps: 50, OfferedRps: 500},
					}},
				{Name: "ip", Source: "xff 2", LimitRps: 0, Quantile: 0.99},
			}
			if edit != nil {
				edit(m)
			}
		})
	}
	desc0 := func(edit func(*sluicev1.DescriptorPolicy)) []byte {
		return withDescriptors(func(m *sluicev1.DropPolicy) { edit(m.Descriptors[0]) })
	}
	return []seed{
		{Name: "good-objective", Args: b(good(func(m *sluicev1.DropPolicy) {
			m.Objective = &sluicev1.HealthObjective{LatencyP99: durationpb.New(250 * time.Millisecond), Errors: 0.01}
		}))},
		{Name: "bad-objective-errors", Args: b(good(func(m *sluicev1.DropPolicy) { m.Objective = &sluicev1.HealthObjective{Errors: 2} }))},
		{Name: "good-descriptors", Args: b(withDescriptors(nil))},
		{Name: "good-descriptor-client-ip", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Source = "client-ip"; d.Overrides, d.Values = nil, nil }))},
		{Name: "bad-descriptor-name", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Name = "Tenant" }))},
		{Name: "bad-descriptor-duplicate", Args: b(withDescriptors(func(m *sluicev1.DropPolicy) { m.Descriptors[1].Name = "tenant" }))},
		{Name: "bad-descriptor-too-many", Args: b(withDescriptors(func(m *sluicev1.DropPolicy) {
			for _, n := range []string{"a", "b", "c"} {
				m.Descriptors = append(m.Descriptors, &sluicev1.DescriptorPolicy{Name: n, Source: "client-ip", Quantile: 0.5})
			}
		}))},
		{Name: "bad-descriptor-outbound", Args: b(withDescriptors(func(m *sluicev1.DropPolicy) {
			m.Name, m.Direction = "caller/checkout", sluicev1.Direction_DIRECTION_OUTBOUND
		}))},
		{Name: "bad-descriptor-source", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Source = "cookie session" }))},
		{Name: "bad-descriptor-limit-nan", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.LimitRps = math.NaN() }))},
		{Name: "bad-descriptor-missing-negative", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.MissingLimitRps = -1 }))},
		{Name: "bad-descriptor-quantile-one", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Quantile = 1 }))},
		{Name: "bad-descriptor-quantile-unset", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Quantile = 0 }))},
		{Name: "bad-descriptor-overrides-unsorted", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) {
			d.Overrides[0], d.Overrides[1] = d.Overrides[1], d.Overrides[0]
		}))},
		{Name: "bad-descriptor-override-invalid", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Overrides[0].Value = "_invalid" }))},
		{Name: "bad-descriptor-override-inf", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Overrides[1].LimitRps = math.Inf(1) }))},
		{Name: "bad-descriptor-value-duplicate", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Values[2].Value = "acme" }))},
		{Name: "bad-descriptor-value-long", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Values[2].Value = strings.Repeat("z", 257) }))},
		{Name: "bad-descriptor-value-empty", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Values[0].Value = "" }))},
		{Name: "bad-descriptor-ratio-one", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Values[2].DropRatio = 1 }))},
		{Name: "bad-descriptor-offered-nan", Args: b(desc0(func(d *sluicev1.DescriptorPolicy) { d.Values[1].OfferedRps = math.NaN() }))},
		{Name: "good", Args: b(good(nil))},
		{Name: "good-outbound", Args: b(good(func(m *sluicev1.DropPolicy) {
			m.Name, m.Direction = "caller/checkout", sluicev1.Direction_DIRECTION_OUTBOUND
		}))},
		{Name: "good-minimal", Args: b(marshal(t, &sluicev1.DropPolicy{Name: "callee/a", Service: "a", Direction: sluicev1.Direction_DIRECTION_INBOUND}))},
		{Name: "good-300-peers", Args: b(good(many))},
		{Name: "good-overflow-peer", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Peer = names.Overflow }))},
		{Name: "good-ratio-below-one", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.DropRatio = math.Nextafter(1, 0) }))},
		{Name: "good-ratio-negative-zero", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.DropRatio = math.Copysign(0, -1) }))},
		{Name: "good-huge-rates", Args: b(peer0(func(p *sluicev1.PeerPolicy) {
			p.LimitRps, p.AllowedRps, p.OfferedRps = f64(math.MaxFloat64), f64(1e300), math.MaxFloat64
		}))},
		{Name: "good-max-live-instances", Args: b(good(func(m *sluicev1.DropPolicy) { m.LiveInstances = math.MaxUint32 }))},
		{Name: "good-253-byte-names", Args: b(good(func(m *sluicev1.DropPolicy) {
			m.Service = strings.Repeat("s", names.MaxLen)
			m.Name = names.Callee(m.Service)
			m.Peers[0].Peer = strings.Repeat("p", names.MaxLen)
		}))},
		{Name: "good-unknown-reason", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Reason = 99 }))},
		{Name: "bad-empty", Args: b(nil)},
		{Name: "bad-ratio-nan", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.DropRatio = math.NaN() }))},
		{Name: "bad-ratio-one", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.DropRatio = 1 }))},
		{Name: "bad-ratio-negative", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.DropRatio = -1e-300 }))},
		{Name: "bad-ratio-inf", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.DropRatio = math.Inf(1) }))},
		{Name: "bad-limit-inf", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.LimitRps = f64(math.Inf(1)) }))},
		{Name: "bad-allowed-nan", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.AllowedRps = f64(math.NaN()) }))},
		{Name: "bad-offered-negative", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.OfferedRps = -1 }))},
		{Name: "bad-offered-neg-inf", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.OfferedRps = math.Inf(-1) }))},
		{Name: "bad-duplicate-peers", Args: b(good(func(m *sluicev1.DropPolicy) { m.Peers[2].Peer = m.Peers[0].Peer }))},
		{Name: "bad-empty-peer", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Peer = "" }))},
		{Name: "bad-254-byte-peer", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Peer = strings.Repeat("p", names.MaxLen+1) }))},
		{Name: "bad-peer-charset", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Peer = "web/../admin" }))},
		{Name: "bad-overflow-service", Args: b(good(func(m *sluicev1.DropPolicy) { m.Service, m.Name = names.Overflow, names.Callee(names.Overflow) }))},
		{Name: "bad-name-mismatch", Args: b(good(func(m *sluicev1.DropPolicy) { m.Name = "callee/orders" }))},
		{Name: "bad-direction-unspecified", Args: b(good(func(m *sluicev1.DropPolicy) { m.Direction = 0 }))},
		{Name: "bad-unknown-enums", Args: b(good(func(m *sluicev1.DropPolicy) {
			m.Direction, m.FailMode, m.Peers[0].Mode = 5, 9, 7
		}))},
		{Name: "bad-ttl-negative", Args: b(good(func(m *sluicev1.DropPolicy) { m.Ttl = durationpb.New(-time.Second) }))},
		{Name: "bad-ttl-out-of-range", Args: b(good(func(m *sluicev1.DropPolicy) { m.Ttl = &durationpb.Duration{Seconds: math.MaxInt64} }))},
		{Name: "bad-decay-mixed-signs", Args: b(good(func(m *sluicev1.DropPolicy) { m.FailOpenDecay = &durationpb.Duration{Seconds: 1, Nanos: -1} }))},
		{Name: "bad-issued-at", Args: b(good(func(m *sluicev1.DropPolicy) { m.IssuedAt = &timestamppb.Timestamp{Seconds: math.MinInt64} }))},
		{Name: "bad-every-field", Args: b(marshal(t, &sluicev1.DropPolicy{Name: "x", Service: "-x", Direction: 9, FailMode: 9,
			Ttl: &durationpb.Duration{Nanos: 2e9}, Peers: []*sluicev1.PeerPolicy{
				{Peer: "", DropRatio: math.NaN(), Mode: 9, LimitRps: f64(-1), AllowedRps: f64(math.Inf(-1)), OfferedRps: math.NaN()},
				{Peer: "", DropRatio: 2}}}))},
		{Name: "good-procedures", Args: b(withProcedures(nil))},
		{Name: "bad-procedure-undeclared", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Peers[3].Procedure = "refund" }))},
		{Name: "bad-procedure-without-procedures", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Procedure = "create-charge" }))},
		{Name: "bad-procedure-duplicate-leaf", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Peers[4].Procedure = "create-charge" }))},
		{Name: "bad-procedure-other-declared", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Procedures[1] = names.Other }))},
		{Name: "bad-procedure-outbound", Args: b(withProcedures(func(m *sluicev1.DropPolicy) {
			m.Name, m.Direction = "caller/checkout", sluicev1.Direction_DIRECTION_OUTBOUND
		}))},
		{Name: "bad-route-shadowed", Args: b(withProcedures(func(m *sluicev1.DropPolicy) {
			m.Routes = append(m.Routes, &sluicev1.Route{Pattern: "GET /static/app.js", Procedure: "create-charge"})
		}))},
		{Name: "good-procedures-caller-limit-zero", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Peers[0].CallerLimitRps = f64(0) }))},
		{Name: "bad-caller-limit-without-procedures", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.CallerLimitRps = f64(100) }))},
		{Name: "bad-caller-limit-nan", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Peers[3].CallerLimitRps = f64(math.NaN()) }))},
		{Name: "bad-caller-limit-inf", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Peers[3].CallerLimitRps = f64(math.Inf(1)) }))},
		{Name: "bad-caller-limit-negative", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Peers[3].CallerLimitRps = f64(-1) }))},
		{Name: "good-procedures-bounds", Args: b(withProcedures(func(m *sluicev1.DropPolicy) {
			m.Peers[0].Bound = sluicev1.DropBound_DROP_BOUND_LEAF
			m.Peers[1].Bound = sluicev1.DropBound_DROP_BOUND_CALLER
			m.Peers[2].Bound = sluicev1.DropBound_DROP_BOUND_PROCEDURE
			m.Peers[3].Bound = sluicev1.DropBound_DROP_BOUND_CALLEE
			m.Peers[4].Bound = 99 // unknown: the leaf itself
		}))},
		{Name: "good-bound-without-procedures", Args: b(peer0(func(p *sluicev1.PeerPolicy) { p.Bound = sluicev1.DropBound_DROP_BOUND_CALLEE }))},
		{Name: "bad-route-undeclared", Args: b(withProcedures(func(m *sluicev1.DropPolicy) { m.Routes[0].Procedure = "charges" }))},
		{Name: "wire-invalid-utf8", Args: b(badUTF8)},
		{Name: "wire-wrong-type", Args: b(wrongWire)},
		{Name: "wire-huge-length", Args: b(hugeLen)},
		{Name: "wire-truncated", Args: b(good(nil)[:40])},
	}
}

func TestFuzzPolicyFromProtoCorpus(t *testing.T) {
	seeds := policySeeds(t)
	testkit.CheckCorpus(t, "FuzzPolicyFromProto", seeds)
	// The seeds say what they are: good ones are accepted, the others not.
	for _, s := range seeds {
		m := new(sluicev1.DropPolicy)
		err := proto.Unmarshal(s.Args[0].([]byte), m)
		if err == nil {
			_, err = PolicyFromProto(m)
		}
		if good := strings.HasPrefix(s.Name, "good"); good != (err == nil) {
			t.Errorf("seed %s: error %v", s.Name, err)
		}
	}
}

// FuzzPolicyFromProto decodes any bytes as a DropPolicy, as the xDS client
// does, and runs it through PolicyFromProto. It must never panic; an
// accepted policy must keep every invariant the Limiter relies on, survive
// Proto() and the wire unchanged, and be enforceable: a Limiter and its HTTP
// middleware take it and decide each listed peer without trouble.
func FuzzPolicyFromProto(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		m := new(sluicev1.DropPolicy)
		if proto.Unmarshal(data, m) != nil {
			return
		}
		p, err := PolicyFromProto(m)
		if err != nil {
			if p != nil {
				t.Fatalf("PolicyFromProto returned a policy and an error: %v", err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("error %q is not valid UTF-8", err)
			}
			return
		}
		checkPolicy(t, m, p)

		// Round trips: through Proto, and through the wire.
		back, err := PolicyFromProto(p.Proto())
		if err != nil {
			t.Fatalf("PolicyFromProto(p.Proto()): %v\npolicy %+v", err, p)
		}
		equalPolicies(t, "Proto()", p, back)
		wire := new(sluicev1.DropPolicy)
		if err := proto.Unmarshal(marshal(t, p.Proto()), wire); err != nil {
			t.Fatalf("p.Proto() does not survive the wire: %v", err)
		}
		back, err = PolicyFromProto(wire)
		if err != nil {
			t.Fatalf("PolicyFromProto(wire form of p.Proto()): %v", err)
		}
		equalPolicies(t, "the wire", p, back)

		enforce(t, p)
	})
}

// checkPolicy checks what every accepted policy must hold.
func checkPolicy(t *testing.T, m *sluicev1.DropPolicy, p *Policy) {
	t.Helper()
	if err := names.Check(p.Service); err != nil || p.Service == names.Overflow {
		t.Errorf("accepted service %q: %v", p.Service, err)
	}
	switch {
	case p.Direction == Inbound && p.Name == names.Callee(p.Service):
	case p.Direction == Outbound && p.Name == names.Caller(p.Service):
	default:
		t.Errorf("accepted name %q for %v service %q", p.Name, p.Direction, p.Service)
	}
	if p.FailMode > dataplane.FailLocal || p.TTL < 0 || p.FailOpenDecay < 0 || p.LiveInstances < 0 {
		t.Errorf("accepted fail mode %v, TTL %v, decay %v, live instances %d", p.FailMode, p.TTL, p.FailOpenDecay, p.LiveInstances)
	}
	if len(p.Peers) != len(m.GetPeers()) {
		t.Errorf("%d peers in, %d out", len(m.GetPeers()), len(p.Peers))
	}
	if len(p.Procedures) > routes.MaxRoutes || len(p.Routes) > routes.MaxRoutes ||
		len(p.Procedures) > 0 && p.Direction != Inbound || len(p.Procedures) == 0 && len(p.Routes) > 0 {
		t.Errorf("accepted %d procedures and %d routes in a %v policy", len(p.Procedures), len(p.Routes), p.Direction)
	}
	for i, q := range p.Procedures {
		if names.CheckProcedure(q) != nil || q == names.Other || slices.Index(p.Procedures, q) != i {
			t.Errorf("procedures[%d]: accepted %q", i, q)
		}
	}
	for i, rt := range p.Routes {
		if !slices.Contains(p.Procedures, rt.Procedure) {
			t.Errorf("routes[%d]: accepted undeclared procedure %q", i, rt.Procedure)
		}
	}
	if _, err := routes.CompileRoutes(p.Routes); err != nil {
		t.Errorf("accepted routes that do not compile: %v", err)
	}
	checkDescriptors(t, p)
	for i, r := range p.Peers {
		if names.Check(r.Peer) != nil {
			t.Errorf("peers[%d]: accepted name %q", i, r.Peer)
		}
		if i > 0 && cmpRule(p.Peers[i-1].Peer, p.Peers[i-1].Procedure, p.Peers[i-1].Tier, leaf{r.Peer, r.Procedure, r.Tier}) >= 0 {
			t.Errorf("peers[%d]: %q/%q after %q/%q: not sorted, or listed twice", i, r.Peer, r.Procedure, p.Peers[i-1].Peer, p.Peers[i-1].Procedure)
		}
		switch {
		case len(p.Procedures) == 0 && r.Procedure != "":
			t.Errorf("peers[%d]: accepted procedure %q in a policy without procedures", i, r.Procedure)
		case len(p.Procedures) > 0 && r.Procedure != names.Other && !slices.Contains(p.Procedures, r.Procedure):
			t.Errorf("peers[%d]: accepted undeclared procedure %q", i, r.Procedure)
		}
		if !(r.DropRatio >= 0 && r.DropRatio < 1) {
			t.Errorf("peers[%d]: accepted ratio %v", i, r.DropRatio)
		}
		if r.Mode > dropratio.Shadow || r.Enforcement > dataplane.EnforceUpstream ||
			r.upstream() && (r.Mode != dropratio.Enforce || p.Direction != Inbound) {
			t.Errorf("peers[%d]: accepted mode %v, enforcement %v in a %v policy", i, r.Mode, r.Enforcement, p.Direction)
		}
		for _, v := range []float64{r.LimitRPS, r.CallerLimitRPS, r.AllowedRPS} {
			if !(v >= 0) {
				t.Errorf("peers[%d]: accepted limit %v, caller limit %v, allowed %v", i, r.LimitRPS, r.CallerLimitRPS, r.AllowedRPS)
			}
		}
		if r.Procedure == "" && (r.CallerLimitRPS != 0 || r.Bound != dropratio.BoundNone) {
			t.Errorf("peers[%d]: accepted caller limit %v, bound %v without a procedure", i, r.CallerLimitRPS, r.Bound)
		}
		if r.Bound > dropratio.BoundCallee {
			t.Errorf("peers[%d]: accepted bound %v", i, r.Bound)
		}
		if !(r.OfferedRPS >= 0) || math.IsInf(r.OfferedRPS, 0) {
			t.Errorf("peers[%d]: accepted offered %v", i, r.OfferedRPS)
		}
		if got := p.Leaf(r.Peer, r.Procedure); got != &p.Peers[i] {
			t.Errorf("Leaf(%q, %q) = %p, want &Peers[%d]", r.Peer, r.Procedure, got, i)
		}
	}
}

func equalPolicies(t *testing.T, via string, want, got *Policy) {
	t.Helper()
	same := want.Name == got.Name && want.Service == got.Service && want.Direction == got.Direction &&
		want.TTL == got.TTL && want.LiveInstances == got.LiveInstances && want.FailMode == got.FailMode &&
		want.FailOpenDecay == got.FailOpenDecay && want.IssuedAt.Equal(got.IssuedAt) &&
		want.IssuedAt.IsZero() == got.IssuedAt.IsZero() && len(want.Peers) == len(got.Peers) &&
		slices.Equal(want.Procedures, got.Procedures) && slices.Equal(want.Routes, got.Routes)
	for i := 0; same && i < len(want.Peers); i++ {
		a, b := want.Peers[i], got.Peers[i]
		// Bits, not ==: -0 must stay -0.
		same = a.Peer == b.Peer && a.Procedure == b.Procedure && a.Mode == b.Mode && a.Enforcement == b.Enforcement && a.Reason == b.Reason && a.Bound == b.Bound &&
			math.Float64bits(a.DropRatio) == math.Float64bits(b.DropRatio) &&
			math.Float64bits(a.LimitRPS) == math.Float64bits(b.LimitRPS) &&
			math.Float64bits(a.CallerLimitRPS) == math.Float64bits(b.CallerLimitRPS) &&
			math.Float64bits(a.AllowedRPS) == math.Float64bits(b.AllowedRPS) &&
			math.Float64bits(a.OfferedRPS) == math.Float64bits(b.OfferedRPS)
	}
	same = same && slices.EqualFunc(want.Descriptors, got.Descriptors, func(a, b DescriptorPolicy) bool {
		return a.Name == b.Name && a.Source == b.Source &&
			math.Float64bits(a.LimitRPS) == math.Float64bits(b.LimitRPS) &&
			math.Float64bits(a.MissingLimitRPS) == math.Float64bits(b.MissingLimitRPS) &&
			math.Float64bits(a.Quantile) == math.Float64bits(b.Quantile) &&
			slices.Equal(a.Overrides, b.Overrides) && slices.Equal(a.Values, b.Values)
	})
	if !same {
		t.Fatalf("round trip through %s changed the policy:\n was %+v\n now %+v", via, want, got)
	}
}

// checkDescriptors checks what every accepted policy's descriptors must
// hold: what the Limiter and the reports rely on.
func checkDescriptors(t *testing.T, p *Policy) {
	t.Helper()
	if len(p.Descriptors) > descriptor.MaxPerService || len(p.Descriptors) > 0 && p.Direction != Inbound {
		t.Errorf("accepted %d descriptors in a %v policy", len(p.Descriptors), p.Direction)
	}
	for i, d := range p.Descriptors {
		if descriptor.CheckName(d.Name) != nil || slices.IndexFunc(p.Descriptors, func(e DescriptorPolicy) bool { return e.Name == d.Name }) != i {
			t.Errorf("descriptors[%d]: accepted name %q", i, d.Name)
		}
		if back, err := descriptor.ParseSource(d.Source.String()); err != nil || back != d.Source {
			t.Errorf("descriptors[%d]: accepted source %+v", i, d.Source)
		}
		if !(d.LimitRPS >= 0) || !(d.MissingLimitRPS >= 0) || math.IsInf(d.LimitRPS, 0) || math.IsInf(d.MissingLimitRPS, 0) ||
			!(d.Quantile > 0 && d.Quantile < 1) {
			t.Errorf("descriptors[%d]: accepted limit %v, missing %v, quantile %v", i, d.LimitRPS, d.MissingLimitRPS, d.Quantile)
		}
		for j, o := range d.Overrides {
			if descriptor.CheckValue(o.Value) != nil || j > 0 && o.Value <= d.Overrides[j-1].Value || !(o.LimitRPS >= 0) || math.IsInf(o.LimitRPS, 0) {
				t.Errorf("descriptors[%d].overrides[%d]: accepted %+v", i, j, o)
			}
		}
		for j, v := range d.Values {
			if descriptor.CheckValue(v.Value) != nil && !descriptor.Reserved(v.Value) || j > 0 && v.Value <= d.Values[j-1].Value ||
				!(v.DropRatio >= 0 && v.DropRatio < 1) || !(v.LimitRPS >= 0) || math.IsInf(v.LimitRPS, 0) || !(v.OfferedRPS >= 0) || math.IsInf(v.OfferedRPS, 0) {
				t.Errorf("descriptors[%d].values[%d]: accepted %+v", i, j, v)
			}
		}
	}
}

// enforce installs p in a Limiter with fewer peers (and leaves) allowed
// than the policy may list, and sends two requests per listed bucket, and
// one from an unlisted peer, through the HTTP middleware. A bucket's request
// goes to the path of its procedure (see requestPath); which leaf it lands
// in is worked out with the routes' own Match, as DecideHTTP should.
func enforce(t *testing.T, p *Policy) {
	t.Helper()
	const maxPeers = 8
	l := NewLimiter(LimiterOptions{MaxPeers: maxPeers, MaxLeaves: maxPeers})
	l.SetPolicy(p)
	if l.Policy(p.Service) != p {
		t.Fatal("Limiter does not hold the policy it was given")
	}
	s := l.Service(p.Service)
	rts, err := routes.CompileRoutes(p.Routes)
	if err != nil {
		t.Fatal(err)
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := s.Middleware(app, HTTPOptions{})
	sent := 0
	send := func(peer, path string) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path = path
		req.Header.Set(DefaultCallerHeader, peer)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		sent++
		switch rec.Code {
		case http.StatusNoContent:
		case http.StatusTooManyRequests:
			if d := descriptorNamed(rec.Body.String(), p); d != "" {
				break // a descriptor's drop: enforceDescriptors checks those
			}
			proc := ""
			if len(p.Procedures) > 0 {
				proc = rts.Match(http.MethodGet, path)
				if proc == names.Other && slices.Contains(p.Procedures, path) {
					proc = path
				}
			}
			r := p.Leaf(peer, proc)
			if r == nil || r.Mode != dropratio.Enforce || r.upstream() || r.DropRatio == 0 {
				t.Fatalf("peer %q, path %q dropped under rule %+v", peer, path, r)
			}
			checkRejection(t, rec, p.Service, r)
		default:
			t.Fatalf("peer %q: status %d", peer, rec.Code)
		}
	}
	for _, r := range p.Peers {
		send(r.Peer, requestPath(r.Procedure))
		send(r.Peer, requestPath(r.Procedure))
	}
	send("never-listed-peer-x", "/")
	// The middleware's requests went through the descriptors too; count
	// theirs from a limiter of their own.
	ld := NewLimiter(LimiterOptions{MaxPeers: maxPeers, MaxLeaves: maxPeers})
	ld.SetPolicy(p)
	enforceDescriptors(t, ld, p)

	var offered uint64
	counts := l.AppendCounts(p.Service, nil)
	for _, c := range counts {
		offered += c.Offered
		if c.Dropped+c.ShadowDropped > c.Offered {
			t.Errorf("peer %q: dropped %d + shadow %d above offered %d", c.Peer, c.Dropped, c.ShadowDropped, c.Offered)
		}
	}
	// A request of a caller enforced upstream stands for the ones the
	// upstream data plane dropped before it arrived, p/(1−p) each, which
	// count as offered too (in whole requests, the fraction carried).
	var inferred uint64
	for _, r := range p.Peers {
		if r.upstream() {
			inferred += 2 * upstreamWeight(clampRatio(r.DropRatio)) // sent twice
		}
	}
	if want := uint64(sent) + inferred/upstreamOne; offered != want {
		t.Errorf("%d requests sent, %d counted, want %d (with %d inferred upstream)", sent, offered, want, inferred/upstreamOne)
	}
	limited := 0
	for _, r := range p.Peers {
		if r.Limited() && r.Peer != names.Unknown && r.Peer != names.Overflow {
			limited++
		}
	}
	reserved := 2 * (len(p.Procedures) + 1)
	if len(counts) > maxPeers+reserved+limited {
		t.Errorf("%d leaves with counters, at most %d + the %d reserved + %d limited", len(counts), maxPeers, reserved, limited)
	}
}

// requestPath is the path of a request meant for procedure q: q itself
// when it is a path (a gRPC method), "/"+q otherwise. A route may send it
// elsewhere: enforce works out where.
func requestPath(q string) string {
	if strings.HasPrefix(q, "/") {
		return q
	}
	return "/" + q
}

// checkRejection checks a 429's headers against its rule, of service.
func checkRejection(t *testing.T, rec *httptest.ResponseRecorder, service string, r *Rule) {
	t.Helper()
	hdr := rec.Header()
	if want := strconv.Itoa(retryAfter(r.DropRatio, r.LimitRPS)); hdr.Get("Retry-After") != want {
		t.Errorf("Retry-After %q, want %s", hdr.Get("Retry-After"), want)
	}
	if got := hdr.Values("X-Envoy-Ratelimited"); len(got) != 1 || got[0] != "true" {
		t.Errorf("X-Envoy-Ratelimited %q, want true", got)
	}
	if n, err := strconv.Atoi(hdr.Get("Content-Length")); err != nil || n != rec.Body.Len() {
		t.Errorf("Content-Length %q for a body of %d bytes", hdr.Get("Content-Length"), rec.Body.Len())
	}
	quota := min(r.AllowedRPS, r.LimitRPS)
	pol := hdr.Get("RateLimit-Policy")
	if math.IsInf(quota, 1) {
		if pol != "" {
			t.Errorf("RateLimit-Policy %q for an unbounded rule", pol)
		}
		return
	}
	q, ok := strings.CutPrefix(pol, `"`+policyName(service, r)+`";q=`)
	q, ok2 := strings.CutSuffix(q, ";w=1")
	n, err := strconv.ParseInt(q, 10, 64)
	if !ok || !ok2 || err != nil || n < 0 || n > maxSFInteger || float64(n) > quota {
		t.Errorf("RateLimit-Policy %q for quota %v", pol, quota)
	}
}

// enforceDescriptors decides each listed value and override of p's
// descriptors, an unlisted one and a missing one, and checks what the
// Limiter counted and reports.
// descriptorNamed returns the name of the descriptor of p that a refusal's
// body names, or "".
func descriptorNamed(body string, p *Policy) string {
	for _, d := range p.Descriptors {
		if strings.Contains(body, "its "+d.Name+" is over its limit") {
			return d.Name
		}
	}
	return ""
}

func enforceDescriptors(t *testing.T, l *Limiter, p *Policy) {
	t.Helper()
	s := l.Service(p.Service)
	if got := s.DescriptorSources(); len(got) != len(p.Descriptors) {
		t.Fatalf("DescriptorSources() = %v for %d descriptors", got, len(p.Descriptors))
	}
	sent := make([]uint64, len(p.Descriptors))
	for i, d := range p.Descriptors {
		vals := []string{"", "never-listed-value", strings.Repeat("x", 300)}
		for _, v := range d.Values {
			vals = append(vals, v.Value)
		}
		for _, o := range d.Overrides {
			vals = append(vals, o.Value)
		}
		for _, v := range vals {
			if dec := s.DecideDescriptor(i, v); dec.Drop && dec.Descriptor() != d.Name {
				t.Fatalf("descriptor %q dropped %.20q naming %q", d.Name, v, dec.Descriptor())
			}
			sent[i]++
		}
	}
	for i, c := range l.RotateDescriptors(p.Service, nil) {
		if c.Descriptor != p.Descriptors[i].Name || c.Offered != sent[i] || c.Dropped > c.Offered {
			t.Errorf("descriptor %d: reported %+v, sent %d", i, c, sent[i])
		}
		for _, e := range c.Values {
			if descriptor.Value(e.Value) != e.Value {
				t.Errorf("descriptor %d: reported value %.20q", i, e.Value)
			}
		}
	}
}
