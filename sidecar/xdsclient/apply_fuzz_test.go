package xdsclient

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"

	"github.com/sluicehq/sluice/internal/testkit"
)

// seed is one named input of the committed seed corpus.
type seed = testkit.Seed

// subscribed are the resources of the fuzzed clients: two services, so
// that a response can mix them up.
var subscribed = []string{"callee/checkout", "callee/orders"}

// limiterHandler is what the sidecar process does with a policy
// (internal/agent): validate it, check it is for the service the name
// says, and make it the Limiter's.
type limiterHandler struct{ l *sidecar.Limiter }

func (h *limiterHandler) Update(name string, m *sluicev1.DropPolicy) error {
	p, err := sidecar.PolicyFromProto(m)
	if err != nil {
		return err
	}
	if names.Callee(p.Service) != name {
		return fmt.Errorf("policy %s is for service %q", name, p.Service)
	}
	h.l.SetPolicy(p)
	return nil
}

func (h *limiterHandler) Remove(name string) {
	h.l.RemovePolicy(strings.TrimPrefix(name, "callee/"))
}

func policyAny(t testing.TB, edit func(*sluicev1.DropPolicy)) *anypb.Any {
	m := &sluicev1.DropPolicy{Name: "callee/checkout", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Ttl: durationpb.New(10 * time.Second), Peers: []*sluicev1.PeerPolicy{{Peer: "web", DropRatio: 0.5}}}
	if edit != nil {
		edit(m)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: names.DropPolicyType, Value: b}
}

func orders(m *sluicev1.DropPolicy) { m.Name, m.Service = "callee/orders", "orders" }

// responseSeeds are FuzzResponse's seeds: each a delta response and a
// state-of-the-world response, each applied twice, then the other.
func responseSeeds(t testing.TB) []seed {
	pa := func(edit func(*sluicev1.DropPolicy)) *anypb.Any { return policyAny(t, edit) }
	res := func(name string, a *anypb.Any) *discovery.Resource {
		return &discovery.Resource{Name: name, Version: fmt.Sprintf("v%d", len(a.GetValue())), Resource: a}
	}
	mk := func(name string, delta *discovery.DeltaDiscoveryResponse, sotw *discovery.DiscoveryResponse) seed {
		d, err := proto.Marshal(delta)
		if err != nil {
			t.Fatal(err)
		}
		s, err := proto.Marshal(sotw)
		if err != nil {
			t.Fatal(err)
		}
		return seed{Name: name, Args: []any{d, s}}
	}
	both := func(name string, anys ...*anypb.Any) seed {
		delta := &discovery.DeltaDiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "1", SystemVersionInfo: "sv"}
		for _, a := range anys {
			p := new(sluicev1.DropPolicy)
			_ = proto.Unmarshal(a.GetValue(), p)
			delta.Resources = append(delta.Resources, res(p.GetName(), a))
		}
		return mk(name, delta, &discovery.DiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "1", VersionInfo: "7", Resources: anys})
	}
	long := strings.Repeat("x", 5000)
	return []seed{
		both("good", pa(nil), pa(orders)),
		both("good-empty"),
		both("good-same-twice", pa(nil), pa(nil)),
		both("bad-policy", pa(func(m *sluicev1.DropPolicy) { m.Peers[0].DropRatio = math.NaN() })),
		both("bad-and-good", pa(func(m *sluicev1.DropPolicy) { m.Peers[0].DropRatio = 1 }), pa(orders)),
		both("bad-wrong-service", pa(func(m *sluicev1.DropPolicy) { m.Service = "orders" })),
		both("bad-not-subscribed", pa(func(m *sluicev1.DropPolicy) { m.Name, m.Service = "callee/payments", "payments" })),
		both("bad-wrong-type", &anypb.Any{TypeUrl: "type.googleapis.com/sluice.v1.LoadReport", Value: pa(nil).GetValue()}),
		both("bad-undecodable", &anypb.Any{TypeUrl: names.DropPolicyType, Value: []byte{0x0a, 0xff}}),
		both("bad-long-errors", pa(func(m *sluicev1.DropPolicy) {
			m.Peers = nil
			for i := range 200 {
				m.Peers = append(m.Peers, &sluicev1.PeerPolicy{Peer: fmt.Sprintf("%s-%d-\u00e9", long[:200], i), DropRatio: -1})
			}
		})),
		mk("delta-envelope-mismatch",
			&discovery.DeltaDiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "2", Resources: []*discovery.Resource{res("callee/orders", pa(nil))}},
			&discovery.DiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "2", Resources: []*anypb.Any{nil}}),
		mk("delta-remove",
			&discovery.DeltaDiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "3", RemovedResources: []string{"callee/checkout", "callee/nothing", ""}},
			&discovery.DiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "3"}),
		mk("delta-no-body",
			&discovery.DeltaDiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "4", Resources: []*discovery.Resource{{Name: "callee/checkout", Version: "v"}}},
			&discovery.DiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "4", Resources: []*anypb.Any{{TypeUrl: names.DropPolicyType}}}),
		mk("other-type",
			&discovery.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "5"},
			&discovery.DiscoveryResponse{TypeUrl: "", Nonce: "5"}),
		{Name: "wire-garbage", Args: []any{[]byte{0x12, 0x05, 0xff, 0xfe}, []byte{0x0a, 0x03, 'a', 0xc3}}},
	}
}

func TestFuzzResponseCorpus(t *testing.T) { testkit.CheckCorpus(t, "FuzzResponse", responseSeeds(t)) }

// FuzzResponse decodes any bytes as a delta and as a state-of-the-world
// response and applies each twice, then the other one, to a Client whose
// handler is the sidecar's: PolicyFromProto into a Limiter. It must never
// panic; every response of ours gets an ACK or NACK echoing its nonce that
// can go on the wire (valid UTF-8, bounded); and what the client holds —
// and would name to a server on reconnect — is exactly what the Limiter
// enforces.
func FuzzResponse(f *testing.F) {
	// A client per protocol, made once (New builds a gRPC client to check
	// its options, which costs more than the rest of an input), and
	// started afresh for each input: nothing held, a new Limiter.
	handlers := map[Protocol]*limiterHandler{}
	clients := map[Protocol]*Client{}
	for _, protocol := range []Protocol{Delta, SotW} {
		handlers[protocol] = new(limiterHandler)
		c, err := New(Config{Servers: []string{"127.0.0.1:1"}, NodeID: "pod", Protocol: protocol, Resources: subscribed},
			handlers[protocol])
		if err != nil {
			f.Fatal(err)
		}
		clients[protocol] = c
	}
	f.Fuzz(func(t *testing.T, deltaBytes, sotwBytes []byte) {
		delta, sotw := new(discovery.DeltaDiscoveryResponse), new(discovery.DiscoveryResponse)
		deltaOK := proto.Unmarshal(deltaBytes, delta) == nil
		sotwOK := proto.Unmarshal(sotwBytes, sotw) == nil
		for _, protocol := range []Protocol{Delta, SotW} {
			l := sidecar.NewLimiter(sidecar.LimiterOptions{})
			handlers[protocol].l = l
			c := clients[protocol]
			c.held = map[string]heldResource{}
			accepted := ""
			for i := range 3 {
				if deltaOK && (protocol == Delta) == (i < 2) {
					checkDelta(t, c, delta)
				}
				if sotwOK && (protocol == SotW) == (i < 2) {
					accepted = checkSotW(t, c, sotw, accepted)
				}
				checkHeld(t, c, l)
			}
		}
	})
}

func checkDelta(t *testing.T, c *Client, resp *discovery.DeltaDiscoveryResponse) {
	t.Helper()
	req := c.applyDelta(resp)
	if resp.GetTypeUrl() != names.DropPolicyType {
		if req != nil {
			t.Fatalf("answered a response of type %q", resp.GetTypeUrl())
		}
		return
	}
	if req == nil || req.GetTypeUrl() != names.DropPolicyType || req.GetResponseNonce() != resp.GetNonce() {
		t.Fatalf("request %v does not answer nonce %q", req, resp.GetNonce())
	}
	checkDetail(t, req)
}

func checkSotW(t *testing.T, c *Client, resp *discovery.DiscoveryResponse, accepted string) string {
	t.Helper()
	req := c.applySotW(resp, accepted)
	if resp.GetTypeUrl() != names.DropPolicyType {
		if req != nil {
			t.Fatalf("answered a response of type %q", resp.GetTypeUrl())
		}
		return accepted
	}
	if req == nil || req.GetTypeUrl() != names.DropPolicyType || req.GetResponseNonce() != resp.GetNonce() {
		t.Fatalf("request %v does not answer nonce %q", req, resp.GetNonce())
	}
	checkDetail(t, req)
	if req.GetErrorDetail() != nil {
		if req.GetVersionInfo() != accepted {
			t.Fatalf("NACK carries version %q, want the last accepted %q", req.GetVersionInfo(), accepted)
		}
		return accepted
	}
	if req.GetVersionInfo() != resp.GetVersionInfo() {
		t.Fatalf("ACK carries version %q, want %q", req.GetVersionInfo(), resp.GetVersionInfo())
	}
	return req.GetVersionInfo()
}

// checkDetail checks that an ACK or NACK can be sent.
func checkDetail(t *testing.T, req proto.Message) {
	t.Helper()
	if _, err := proto.Marshal(req); err != nil {
		t.Fatalf("the answer can not be sent: %v", err)
	}
	var msg string
	switch r := req.(type) {
	case *discovery.DeltaDiscoveryRequest:
		msg = r.GetErrorDetail().GetMessage()
	case *discovery.DiscoveryRequest:
		msg = r.GetErrorDetail().GetMessage()
	}
	if len(msg) > maxErrorDetail+len("…") || !utf8.ValidString(msg) {
		t.Fatalf("NACK message of %d bytes, valid UTF-8 %v", len(msg), utf8.ValidString(msg))
	}
}

// checkHeld compares what the client holds with what the Limiter enforces.
func checkHeld(t *testing.T, c *Client, l *sidecar.Limiter) {
	t.Helper()
	for _, name := range subscribed {
		service := strings.TrimPrefix(name, "callee/")
		held, ok := c.Policy(name)
		enforced := l.Policy(service)
		switch {
		case !ok && enforced == nil:
		case !ok:
			t.Fatalf("%s: the Limiter enforces a policy the client does not hold", name)
		case enforced == nil:
			t.Fatalf("%s: the client holds a policy the Limiter does not enforce", name)
		default:
			want, err := sidecar.PolicyFromProto(held)
			if err != nil {
				t.Fatalf("%s: the client holds a policy the handler refuses: %v", name, err)
			}
			if !proto.Equal(want.Proto(), enforced.Proto()) {
				t.Fatalf("%s: the client holds\n%v\nthe Limiter enforces\n%v", name, want.Proto(), enforced.Proto())
			}
		}
	}
	for name := range c.heldVersions() {
		if _, ok := c.names[name]; !ok {
			t.Fatalf("holds a version of %q, which is not subscribed", name)
		}
	}
}
