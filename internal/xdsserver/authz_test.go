package xdsserver

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
	"github.com/sluicehq/sluice/pkg/names"
)

const trustDomain = "example.org"

// tlsPKI issues certificates from an in-test CA and loads them as the
// binaries do from their --tls-* flags.
type tlsPKI struct {
	t   *testing.T
	ca  *devpki.CA
	dir string
}

func (p *tlsPKI) source(name, uri string) *identity.Source {
	p.t.Helper()
	leaf, err := p.ca.Issue(uri, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	f, err := p.ca.WriteLeaf(p.dir, name, leaf)
	if err != nil {
		p.t.Fatal(err)
	}
	src, err := identity.NewSource(identity.Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: trustDomain})
	if err != nil {
		p.t.Fatal(err)
	}
	return src
}

// serveTLS serves s behind mutual TLS on loopback, as the controller does.
func serveTLS(t *testing.T, s *Server, src *identity.Source) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(src.ServerOption())
	s.Register(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return lis.Addr().String()
}

func dialTLS(t *testing.T, addr string, src *identity.Source) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, src.DialOption(identity.Kinds(identity.Controller)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(cc)
}

// ended waits for a stream's end and returns its error.
func ended[T any](t *testing.T, ch <-chan T, recvErr func() error) error {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return recvErr()
			}
			t.Fatalf("a refused stream received %v", r)
		case <-timer.C:
			t.Fatal("stream did not end")
		}
	}
}

func TestPolicyServedOnlyToItsService(t *testing.T) {
	p := &tlsPKI{t: t, dir: t.TempDir()}
	var err error
	if p.ca, err = devpki.NewCA("xds test ca", time.Hour); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := newServerOpts(t, Options{Registerer: reg, RequirePeerIdentity: true})
	if err := s.Update(map[string]*sluicev1.DropPolicy{
		"callee/checkout": policy("callee/checkout", 0.1),
		"callee/payments": policy("callee/payments", 0.2),
	}, nil); err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, s, p.source("controller", identity.ControllerURI(trustDomain)))
	checkout := dialTLS(t, addr, p.source("checkout", "spiffe://example.org/ns/shop/sa/checkout"))
	checkoutNode := &core.Node{Id: "checkout-1", Cluster: "checkout"}

	// deltaSubscribe opens a delta stream with one subscription and returns
	// its responses and a way to read how it ended.
	deltaSubscribe := func(c discovery.AggregatedDiscoveryServiceClient, n *core.Node, resources ...string) (<-chan *discovery.DeltaDiscoveryResponse, func() error) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		st, err := c.DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var last error
		ch := responses(func() (*discovery.DeltaDiscoveryResponse, error) {
			r, err := st.Recv()
			last = err
			return r, err
		})
		if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: n, TypeUrl: names.DropPolicyType, ResourceNamesSubscribe: resources}); err != nil {
			t.Fatal(err)
		}
		return ch, func() error { return last }
	}

	t.Run("own policy served", func(t *testing.T) {
		ch, _ := deltaSubscribe(checkout, checkoutNode, "callee/checkout")
		resp := next(t, ch)
		if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != "callee/checkout" {
			t.Fatalf("response = %v, want callee/checkout", resp)
		}
	})
	t.Run("another service's policy refused (delta)", func(t *testing.T) {
		ch, errOf := deltaSubscribe(checkout, checkoutNode, "callee/payments")
		err := ended(t, ch, errOf)
		if grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `"callee/payments"`) {
			t.Fatalf("stream ended with %v, want PERMISSION_DENIED naming callee/payments", err)
		}
	})
	t.Run("another service's policy refused (SotW)", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := checkout.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var last error
		ch := responses(func() (*discovery.DiscoveryResponse, error) {
			r, err := st.Recv()
			last = err
			return r, err
		})
		if err := st.Send(&discovery.DiscoveryRequest{Node: checkoutNode, TypeUrl: names.DropPolicyType, ResourceNames: []string{"callee/checkout", "callee/payments"}}); err != nil {
			t.Fatal(err)
		}
		if err := ended(t, ch, func() error { return last }); grpcstatus.Code(err) != codes.PermissionDenied {
			t.Fatalf("stream ended with %v, want PERMISSION_DENIED", err)
		}
	})
	t.Run("a wildcard refused", func(t *testing.T) {
		ch, errOf := deltaSubscribe(checkout, checkoutNode, "*")
		if err := ended(t, ch, errOf); grpcstatus.Code(err) != codes.PermissionDenied {
			t.Fatalf("stream ended with %v, want PERMISSION_DENIED", err)
		}
	})
	t.Run("a node claiming another service refused", func(t *testing.T) {
		ch, errOf := deltaSubscribe(checkout, &core.Node{Id: "x", Cluster: "payments"}, "callee/checkout")
		if err := ended(t, ch, errOf); grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node cluster") {
			t.Fatalf("stream ended with %v, want PERMISSION_DENIED for the node cluster", err)
		}
	})
	t.Run("an aggregator relay may read any policy", func(t *testing.T) {
		agg := dialTLS(t, addr, p.source("aggregator", identity.AggregatorURI(trustDomain, "zone-a")))
		ch, _ := deltaSubscribe(agg, &core.Node{Id: "agg-1"}, "callee/checkout", "callee/payments")
		resp := next(t, ch)
		if len(resp.GetResources()) != 2 {
			t.Fatalf("response = %v, want both policies", resp)
		}
	})
	if v := metric(t, reg, "sluice_controller_xds_denied_total"); v != 4 {
		t.Errorf("denied_total = %v, want 4", v)
	}
}
