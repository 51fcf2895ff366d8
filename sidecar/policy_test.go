package sidecar

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// goodPolicy is a valid inbound policy with every field set and explicit
// enums, so that it round-trips through PolicyFromProto and Proto.
func goodPolicy() *sluicev1.DropPolicy {
	return &sluicev1.DropPolicy{
		Name:      "callee/checkout",
		Service:   "checkout",
		Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Peers: []*sluicev1.PeerPolicy{
			{Peer: "_overflow", DropRatio: 0.1, Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: proto.Float64(10), AllowedRps: proto.Float64(10), OfferedRps: 11.5, Reason: sluicev1.DropReason_DROP_REASON_LIMIT},
			{Peer: "cart", DropRatio: 0, Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: proto.Float64(100), AllowedRps: proto.Float64(100), OfferedRps: 20},
			{Peer: "search", DropRatio: 0.25, Mode: sluicev1.Mode_MODE_SHADOW, LimitRps: proto.Float64(300), AllowedRps: proto.Float64(250), OfferedRps: 400, Reason: sluicev1.DropReason_DROP_REASON_CAPACITY},
			{Peer: "unknown", DropRatio: 0.5, Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: proto.Float64(1), AllowedRps: proto.Float64(1), OfferedRps: 2, Reason: sluicev1.DropReason_DROP_REASON_LIMIT},
		},
		Ttl:           durationpb.New(10 * time.Second),
		LiveInstances: 12,
		FailMode:      sluicev1.FailMode_FAIL_MODE_LOCAL,
		FailOpenDecay: durationpb.New(30 * time.Second),
		IssuedAt:      timestamppb.New(time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)),
	}
}

func TestPolicyFromProtoRoundTrip(t *testing.T) {
	for _, m := range []*sluicev1.DropPolicy{
		goodPolicy(),
		func() *sluicev1.DropPolicy {
			m := goodPolicy()
			m.Name, m.Direction = "caller/checkout", sluicev1.Direction_DIRECTION_OUTBOUND
			m.FailMode = sluicev1.FailMode_FAIL_MODE_HOLD
			return m
		}(),
		{Name: "callee/a", Service: "a", Direction: sluicev1.Direction_DIRECTION_INBOUND, FailMode: sluicev1.FailMode_FAIL_MODE_OPEN},
		{Name: "callee/a", Service: "a", Direction: sluicev1.Direction_DIRECTION_INBOUND, FailMode: sluicev1.FailMode_FAIL_MODE_OPEN,
			Objective: &sluicev1.HealthObjective{LatencyP99: durationpb.New(200 * time.Millisecond), Errors: 0.01}},
		{Name: "callee/a", Service: "a", Direction: sluicev1.Direction_DIRECTION_INBOUND, FailMode: sluicev1.FailMode_FAIL_MODE_OPEN,
			Objective: &sluicev1.HealthObjective{Errors: 0.05}},
	} {
		p, err := PolicyFromProto(m)
		if err != nil {
			t.Fatalf("PolicyFromProto(%v): %v", m, err)
		}
		if got := p.Proto(); !proto.Equal(got, m) {
			t.Errorf("round trip:\n got %v\nwant %v", got, m)
		}
	}

	p, err := PolicyFromProto(goodPolicy())
	if err != nil {
		t.Fatal(err)
	}
	want := Rule{Peer: "search", DropRatio: 0.25, Mode: dropratio.Shadow, LimitRPS: 300, AllowedRPS: 250, OfferedRPS: 400, Reason: ReasonCapacity}
	if got := p.Rule("search"); got == nil || *got != want {
		t.Errorf("Rule(search) = %+v, want %+v", got, want)
	}
	if p.Rule("nobody") != nil {
		t.Error("Rule(nobody) is not nil")
	}
	if p.TTL != 10*time.Second || p.FailOpenDecay != 30*time.Second || p.FailMode != dataplane.FailLocal ||
		p.LiveInstances != 12 || p.Direction != Inbound || !p.IssuedAt.Equal(time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)) {
		t.Errorf("policy fields: %+v", p)
	}
}

func TestPolicyFromProtoDefaults(t *testing.T) {
	m := &sluicev1.DropPolicy{
		Name:      "callee/checkout",
		Service:   "checkout",
		Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Peers: []*sluicev1.PeerPolicy{ // unsorted, unspecified mode, a reason from the future
			{Peer: "web", DropRatio: 0.5, Reason: 42},
			{Peer: "api"},
		},
	}
	p, err := PolicyFromProto(m)
	if err != nil {
		t.Fatal(err)
	}
	if p.FailMode != dataplane.FailOpen || p.TTL != 0 || p.FailOpenDecay != 0 || !p.IssuedAt.IsZero() {
		t.Errorf("defaults: %+v", p)
	}
	if len(p.Peers) != 2 || p.Peers[0].Peer != "api" || p.Peers[1].Peer != "web" {
		t.Fatalf("peers not sorted: %+v", p.Peers)
	}
	if p.Peers[1].Mode != dropratio.Enforce || p.Peers[1].Enforcement != dataplane.EnforceSidecar {
		t.Errorf("MODE_UNSPECIFIED became %v, want enforce", p.Peers[1].Mode)
	}
	if p.Peers[1].Reason != 42 || p.Proto().Peers[1].Reason != 42 {
		t.Errorf("unknown reason not carried through: %v", p.Peers[1].Reason)
	}
	if _, err := PolicyFromProto(nil); err == nil {
		t.Error("PolicyFromProto(nil) did not fail")
	}
}

func TestPolicyFromProtoRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(m *sluicev1.DropPolicy)
		want   []string // each must appear in the error
	}{
		{"direction unspecified", func(m *sluicev1.DropPolicy) { m.Direction = sluicev1.Direction_DIRECTION_UNSPECIFIED }, []string{"direction: "}},
		{"direction unknown", func(m *sluicev1.DropPolicy) { m.Direction = 9 }, []string{"direction: "}},
		{"name for other service", func(m *sluicev1.DropPolicy) { m.Name = "callee/cart" }, []string{`name: "callee/cart"`, `want "callee/checkout"`}},
		{"name for other direction", func(m *sluicev1.DropPolicy) { m.Direction = sluicev1.Direction_DIRECTION_OUTBOUND }, []string{`want "caller/checkout"`}},
		{"name empty", func(m *sluicev1.DropPolicy) { m.Name = "" }, []string{"name: "}},
		{"service empty", func(m *sluicev1.DropPolicy) { m.Service, m.Name = "", "callee/" }, []string{"service: empty name"}},
		{"service bad chars", func(m *sluicev1.DropPolicy) { m.Service, m.Name = "check out", "callee/check out" }, []string{"service: "}},
		{"service reserved", func(m *sluicev1.DropPolicy) { m.Service, m.Name = names.Overflow, names.Callee(names.Overflow) }, []string{"service: ", "reserved"}},
		{"peer empty", func(m *sluicev1.DropPolicy) { m.Peers[1].Peer = "" }, []string{"peers[1].peer: empty name"}},
		{"peer too long", func(m *sluicev1.DropPolicy) { m.Peers[2].Peer = strings.Repeat("x", names.MaxLen+1) }, []string{"peers[2].peer: "}},
		{"peer bad chars", func(m *sluicev1.DropPolicy) { m.Peers[2].Peer = "a/b" }, []string{"peers[2].peer: "}},
		{"peer duplicate", func(m *sluicev1.DropPolicy) { m.Peers[3].Peer = "cart" }, []string{`peers[3].peer: "cart" is listed again, first at peers[1]`}},
		{"ratio above one", func(m *sluicev1.DropPolicy) { m.Peers[3].DropRatio = 1.2 }, []string{"peers[3].drop_ratio: 1.2 is outside [0, 1)"}},
		{"ratio one", func(m *sluicev1.DropPolicy) { m.Peers[0].DropRatio = 1 }, []string{"peers[0].drop_ratio: 1 is outside"}},
		{"ratio negative", func(m *sluicev1.DropPolicy) { m.Peers[0].DropRatio = -0.1 }, []string{"peers[0].drop_ratio: -0.1 is outside"}},
		{"ratio NaN", func(m *sluicev1.DropPolicy) { m.Peers[0].DropRatio = math.NaN() }, []string{"peers[0].drop_ratio: NaN"}},
		{"ratio Inf", func(m *sluicev1.DropPolicy) { m.Peers[0].DropRatio = math.Inf(1) }, []string{"peers[0].drop_ratio: +Inf"}},
		{"limit negative", func(m *sluicev1.DropPolicy) { m.Peers[1].LimitRps = proto.Float64(-1) }, []string{"peers[1].limit_rps: -1 is negative"}},
		{"allowed NaN", func(m *sluicev1.DropPolicy) { m.Peers[1].AllowedRps = proto.Float64(math.NaN()) }, []string{"peers[1].allowed_rps: NaN is not a finite number"}},
		{"offered Inf", func(m *sluicev1.DropPolicy) { m.Peers[1].OfferedRps = math.Inf(-1) }, []string{"peers[1].offered_rps: -Inf is not a finite number"}},
		{"mode unknown", func(m *sluicev1.DropPolicy) { m.Peers[2].Mode = 7 }, []string{"peers[2].mode: unknown value 7"}},
		{"ttl negative", func(m *sluicev1.DropPolicy) { m.Ttl = durationpb.New(-time.Second) }, []string{"ttl: -1s is negative"}},
		{"ttl malformed", func(m *sluicev1.DropPolicy) { m.Ttl = &durationpb.Duration{Seconds: 1, Nanos: -1} }, []string{"ttl: "}},
		{"decay negative", func(m *sluicev1.DropPolicy) { m.FailOpenDecay = durationpb.New(-time.Second) }, []string{"fail_open_decay: -1s is negative"}},
		{"fail mode unknown", func(m *sluicev1.DropPolicy) { m.FailMode = 5 }, []string{"fail_mode: unknown value 5"}},
		{"objective empty", func(m *sluicev1.DropPolicy) { m.Objective = &sluicev1.HealthObjective{} }, []string{"objective: latency_p99, errors: neither is set"}},
		{"objective errors out of range", func(m *sluicev1.DropPolicy) { m.Objective = &sluicev1.HealthObjective{Errors: 1} }, []string{"objective: errors: 1"}},
		{"objective latency negative", func(m *sluicev1.DropPolicy) {
			m.Objective = &sluicev1.HealthObjective{LatencyP99: durationpb.New(-time.Second), Errors: 0.01}
		}, []string{"objective.latency_p99: -1s is negative"}},
		{"issued_at malformed", func(m *sluicev1.DropPolicy) { m.IssuedAt = &timestamppb.Timestamp{Nanos: -1} }, []string{"issued_at: "}},
		{"every problem at once", func(m *sluicev1.DropPolicy) {
			m.Ttl = durationpb.New(-time.Second)
			m.Peers[0].DropRatio = 2
			m.Peers[2].LimitRps = proto.Float64(-3)
			m.Peers[3].Mode = 9
		}, []string{"ttl: ", "peers[0].drop_ratio: ", "peers[2].limit_rps: ", "peers[3].mode: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := goodPolicy()
			tc.mutate(m)
			p, err := PolicyFromProto(m)
			if err == nil {
				t.Fatalf("accepted: %+v", p)
			}
			if p != nil {
				t.Errorf("returned a policy along with error %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestAbsentLimitsMeanUnbounded(t *testing.T) {
	m := &sluicev1.DropPolicy{
		Name: "callee/checkout", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Peers: []*sluicev1.PeerPolicy{
			{Peer: "free"},
			{Peer: "blocked", DropRatio: 0.99, LimitRps: proto.Float64(0), AllowedRps: proto.Float64(0)},
		},
	}
	p, err := PolicyFromProto(m)
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Rule("free"); !math.IsInf(r.LimitRPS, 1) || !math.IsInf(r.AllowedRPS, 1) {
		t.Errorf("free = %+v, want unbounded limit and allowance", r)
	}
	if r := p.Rule("blocked"); r.LimitRPS != 0 || r.AllowedRPS != 0 {
		t.Errorf("blocked = %+v, want limit and allowance 0", r)
	}
	back := p.Proto()
	for _, pp := range back.GetPeers() {
		switch pp.GetPeer() {
		case "free":
			if pp.LimitRps != nil || pp.AllowedRps != nil {
				t.Errorf("free round-trips with limits %v/%v, want absent", pp.LimitRps, pp.AllowedRps)
			}
		case "blocked":
			if pp.LimitRps == nil || *pp.LimitRps != 0 {
				t.Errorf("blocked round-trips with limit %v, want 0", pp.LimitRps)
			}
		}
	}
}
