package xdsserver

import (
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	runtime "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
	"github.com/sluicehq/sluice/pkg/names"
)

// A caller enforced upstream is MODE_SHADOW on the wire (for old sidecars)
// but these data planes are the upstream: they carry its ratio. A plain
// shadow caller is still served 0.
func TestUpstreamCallersServedTheirRatio(t *testing.T) {
	s := newServerOpts(t, Options{Proxyless: Endpoints{"checkout": {"127.0.0.1:8080"}}})
	p := calleePolicy("checkout", map[string]float64{"shadow-batch": 0.5})
	p.Peers = append(p.Peers, &sluicev1.PeerPolicy{Peer: "web", DropRatio: 0.3, Mode: sluicev1.Mode_MODE_SHADOW, EnforcedUpstream: true})
	publish(t, s, p)
	addr := serve(t, s)

	web := newADSSub(t, addr, &core.Node{Id: "web-1", Cluster: "web"})
	unmarshal(t, web.subscribe(resourcev3.ListenerType, "checkout"), new(listener.Listener))
	rc := unmarshal(t, web.subscribe(resourcev3.RouteType, "checkout"), new(route.RouteConfiguration))
	if got := routeAbort(t, rc).GetPercentage().GetNumerator(); got != 300000 {
		t.Errorf("proxyless web → checkout aborts %d ppm, want 300000", got)
	}

	envoy := newADSSub(t, addr, &core.Node{Id: "checkout-envoy-1", Cluster: "checkout"})
	f := unmarshal(t, envoy.subscribe(RuntimeTypeURL, RuntimeLayerName("checkout")), new(runtime.Runtime)).GetLayer().AsMap()
	for caller, want := range map[string]float64{"web": 300000, "shadow-batch": 0} {
		if got := f[AbortPercentKey(caller)].(map[string]any)["numerator"]; got != want {
			t.Errorf("runtime layer: %s abort_percent numerator %v, want %v", caller, got, want)
		}
	}
}

// Under mutual TLS a workload's proxyless node must name its own service as
// cluster: without one it would be served the "unknown" caller's ratios.
// A delta stream that named its node first may leave it out later.
func TestProxylessNodeWithoutClusterRefused(t *testing.T) {
	p := &tlsPKI{t: t, dir: t.TempDir()}
	var err error
	if p.ca, err = devpki.NewCA("xds test ca", time.Hour); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := newServerOpts(t, Options{Registerer: reg, RequirePeerIdentity: true, Proxyless: Endpoints{"checkout": {"127.0.0.1:8080"}}})
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.3, "unknown": 0.9}))
	addr := serveTLS(t, s, p.source("controller", identity.ControllerURI(trustDomain)))
	web := dialTLS(t, addr, p.source("web", "spiffe://example.org/ns/shop/sa/web"))

	sotw := func(n *core.Node) (*discovery.DiscoveryResponse, error) {
		t.Helper()
		st, err := web.StreamAggregatedResources(streamCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		var last error
		ch := responses(func() (*discovery.DiscoveryResponse, error) {
			r, err := st.Recv()
			last = err
			return r, err
		})
		if err := st.Send(&discovery.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{"checkout"}}); err != nil {
			t.Fatal(err)
		}
		select {
		case r, ok := <-ch:
			if ok {
				return r, nil
			}
			return nil, last
		case <-time.After(waitFor):
			t.Fatal("no answer and no end")
		}
		return nil, nil
	}
	if _, err := sotw(&core.Node{Id: "web-1"}); grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "node has no cluster") {
		t.Errorf("SotW listener request without a cluster ended with %v, want PERMISSION_DENIED for the missing cluster", err)
	}
	if r, err := sotw(&core.Node{Id: "web-1", Cluster: "web"}); err != nil || len(r.GetResources()) != 1 {
		t.Errorf("SotW listener request as cluster web: %v, %v; want the listener", r, err)
	}

	delta := func(first, second *discovery.DeltaDiscoveryRequest) (*discovery.DeltaDiscoveryResponse, error) {
		t.Helper()
		st, err := web.DeltaAggregatedResources(streamCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		var last error
		ch := responses(func() (*discovery.DeltaDiscoveryResponse, error) {
			r, err := st.Recv()
			last = err
			return r, err
		})
		for _, req := range []*discovery.DeltaDiscoveryRequest{first, second} {
			if req == nil {
				continue
			}
			if err := st.Send(req); err != nil {
				t.Fatal(err)
			}
		}
		timer := time.NewTimer(waitFor)
		defer timer.Stop()
		for {
			select {
			case r, ok := <-ch:
				if !ok {
					return nil, last
				}
				if r.GetTypeUrl() == resourcev3.ListenerType {
					return r, nil
				}
			case <-timer.C:
				t.Fatal("no listener and no end")
			}
		}
	}
	listenerReq := &discovery.DeltaDiscoveryRequest{TypeUrl: resourcev3.ListenerType, ResourceNamesSubscribe: []string{"checkout"}}
	withNode := func(n *core.Node, r *discovery.DeltaDiscoveryRequest) *discovery.DeltaDiscoveryRequest {
		c := &discovery.DeltaDiscoveryRequest{Node: n, TypeUrl: r.GetTypeUrl(), ResourceNamesSubscribe: r.GetResourceNamesSubscribe()}
		return c
	}
	if _, err := delta(withNode(&core.Node{Id: "web-1"}, listenerReq), nil); grpcstatus.Code(err) != codes.PermissionDenied {
		t.Errorf("delta listener request without a cluster ended with %v, want PERMISSION_DENIED", err)
	}
	// The node first, on a DropPolicy subscription; the listener request
	// after it names none, as clients do.
	policyReq := &discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "web-1", Cluster: "web"}, TypeUrl: names.DropPolicyType, ResourceNamesSubscribe: []string{"caller/web"}}
	if r, err := delta(policyReq, listenerReq); err != nil || len(r.GetResources()) != 1 {
		t.Errorf("delta listener request after a node with cluster web: %v, %v; want the listener", r, err)
	}
	// The same, with a node without cluster first: still refused later.
	policyReq.Node = &core.Node{Id: "web-1"}
	if _, err := delta(policyReq, listenerReq); grpcstatus.Code(err) != codes.PermissionDenied {
		t.Errorf("delta listener request after a node without cluster ended with %v, want PERMISSION_DENIED", err)
	}
	if v := metric(t, reg, "sluice_controller_xds_denied_total"); v != 3 {
		t.Errorf("denied_total = %v, want 3", v)
	}
}
