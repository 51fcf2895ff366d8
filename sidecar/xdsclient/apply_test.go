package xdsclient

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

// fakeHandler records calls and refuses policies of service "bad".
type fakeHandler struct {
	updated []string
	removed []string
}

func (f *fakeHandler) Update(name string, p *sluicev1.DropPolicy) error {
	if p.GetService() == "bad" {
		return errors.New("refused")
	}
	f.updated = append(f.updated, name)
	return nil
}

func (f *fakeHandler) Remove(name string) { f.removed = append(f.removed, name) }

func newTestClient(t *testing.T, p Protocol) (*Client, *fakeHandler) {
	t.Helper()
	h := &fakeHandler{}
	c, err := New(Config{Servers: []string{"127.0.0.1:1"}, NodeID: "pod", Protocol: p,
		Resources: []string{"callee/a", "callee/b"}}, h)
	if err != nil {
		t.Fatal(err)
	}
	return c, h
}

func anyOf(t *testing.T, name, service string) *anypb.Any {
	t.Helper()
	b, err := proto.Marshal(&sluicev1.DropPolicy{Name: name, Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return &anypb.Any{TypeUrl: names.DropPolicyType, Value: b}
}

// TestSotWRejects: every bad resource makes the response a NACK with the
// previous version; the good ones in it are still taken (as Envoy does).
func TestSotWRejects(t *testing.T) {
	cases := map[string]struct {
		res  *anypb.Any
		want string // in error_detail
	}{
		"not subscribed": {res: anyOf(t, "callee/z", "z"), want: `"callee/z": not subscribed`},
		"wrong type":     {res: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}, want: "type"},
		"undecodable":    {res: &anypb.Any{TypeUrl: names.DropPolicyType, Value: []byte{0xff}}, want: "decode"},
		"handler error":  {res: anyOf(t, "callee/b", "bad"), want: "refused"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c, h := newTestClient(t, SotW)
			req := c.applySotW(&discovery.DiscoveryResponse{TypeUrl: names.DropPolicyType, VersionInfo: "v2", Nonce: "7",
				Resources: []*anypb.Any{anyOf(t, "callee/a", "a"), tc.res}}, "v1")
			if req.GetErrorDetail() == nil || !strings.Contains(req.GetErrorDetail().GetMessage(), tc.want) {
				t.Fatalf("request %v, want a NACK mentioning %q", req, tc.want)
			}
			if req.GetVersionInfo() != "v1" || req.GetResponseNonce() != "7" {
				t.Fatalf("NACK version %q nonce %q, want v1 and 7", req.GetVersionInfo(), req.GetResponseNonce())
			}
			if !slices.Equal(h.updated, []string{"callee/a"}) {
				t.Fatalf("updated %v, want the good callee/a only", h.updated)
			}
			if _, ok := c.Policy("callee/b"); ok {
				t.Fatal("rejected resource held")
			}
		})
	}
}

func TestDeltaRejectsAndRemoves(t *testing.T) {
	c, h := newTestClient(t, Delta)
	req := c.applyDelta(&discovery.DeltaDiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "1", Resources: []*discovery.Resource{
		{Name: "callee/a", Version: "h1", Resource: anyOf(t, "callee/a", "a")},
		{Name: "callee/b", Version: "h2", Resource: anyOf(t, "callee/a", "a")}, // envelope and body disagree
		{Name: "callee/b", Version: "h3"},                                      // no body
	}})
	if req.GetErrorDetail() == nil || req.GetResponseNonce() != "1" || req.GetTypeUrl() != names.DropPolicyType {
		t.Fatalf("request %v, want a NACK of nonce 1", req)
	}
	for _, want := range []string{"is named", "no body"} {
		if !strings.Contains(req.GetErrorDetail().GetMessage(), want) {
			t.Errorf("error_detail %q lacks %q", req.GetErrorDetail().GetMessage(), want)
		}
	}
	if got := c.heldVersions(); !maps.Equal(got, map[string]string{"callee/a": "h1"}) {
		t.Fatalf("held versions %v", got)
	}

	// A removal of something never held is ignored; of something held, applied.
	req = c.applyDelta(&discovery.DeltaDiscoveryResponse{TypeUrl: names.DropPolicyType, Nonce: "2",
		RemovedResources: []string{"callee/b", "callee/a"}})
	if req.GetErrorDetail() != nil || req.GetResponseNonce() != "2" {
		t.Fatalf("request %v, want an ACK of nonce 2", req)
	}
	if !slices.Equal(h.removed, []string{"callee/a"}) {
		t.Fatalf("removed %v, want [callee/a]", h.removed)
	}

	// Another type's response is not ours to answer.
	if req := c.applyDelta(&discovery.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/x.Y", Nonce: "3"}); req != nil {
		t.Fatalf("answered a foreign type with %v", req)
	}
}
