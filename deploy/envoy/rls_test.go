package envoy

import (
	"context"
	"math"
	"net"
	"testing"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/rls"
)

var _ = ratelimitfilter.RateLimit{}

// rlsFilter returns the ratelimit filter of envoy-rls.yaml's inbound
// listener, checking the chain on the way: the router last, after it.
func rlsFilter(t *testing.T, b *bootstrap.Bootstrap) *ratelimitfilter.RateLimit {
	t.Helper()
	var found *ratelimitfilter.RateLimit
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				m := unpack(t, nf.GetTypedConfig(), new(hcm.HttpConnectionManager))
				fs := m.GetHttpFilters()
				if len(fs) == 0 || fs[len(fs)-1].GetName() != "envoy.filters.http.router" {
					t.Fatalf("listener %s: the last HTTP filter must be the router", l.GetName())
				}
				unpack(t, fs[len(fs)-1].GetTypedConfig(), new(router.Router))
				for _, f := range fs {
					if f.GetName() == "envoy.filters.http.ratelimit" {
						found = unpack(t, f.GetTypedConfig(), new(ratelimitfilter.RateLimit))
					}
				}
			}
		}
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		for _, a := range c.GetTypedExtensionProtocolOptions() {
			unpack(t, a, new(upstreamhttp.HttpProtocolOptions))
		}
	}
	if found == nil {
		t.Fatal("no ratelimit filter in the inbound listener")
	}
	return found
}

// descriptorsFor builds the descriptors Envoy's filter sends for a request
// with headers hdr from the request_headers actions of limits: a
// header's value under its descriptor key; a missing one leaves its entry
// out with skip_if_absent, else the whole descriptor (Envoy's
// RequestHeadersAction). Only request_headers actions are expected.
func descriptorsFor(t *testing.T, limits []*routev3.RateLimit, hdr map[string]string) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitv3.RateLimitDescriptor
next:
	for _, rl := range limits {
		d := &ratelimitv3.RateLimitDescriptor{}
		for _, a := range rl.GetActions() {
			rh := a.GetRequestHeaders()
			if rh == nil {
				t.Fatalf("action %v: only request_headers actions are checked here", a)
			}
			v, ok := hdr[rh.GetHeaderName()]
			switch {
			case !ok && rh.GetSkipIfAbsent():
				continue
			case !ok:
				continue next
			}
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rh.GetDescriptorKey(), Value: v})
		}
		out = append(out, d)
	}
	return out
}

// TestEnvoyRLSBootstrapIsValid checks envoy-rls.yaml against Envoy's protos
// and then against a sluice rate limit service with the sidecar's
// defaults (DefaultMapping of node.cluster) on loopback: the descriptors
// its actions build for a request of a blocked caller are OVER_LIMIT,
// for another caller OK, and for a request without a caller counted as
// the unknown caller's.
func TestEnvoyRLSBootstrapIsValid(t *testing.T) {
	b := loadFile(t, "envoy-rls.yaml")
	f := rlsFilter(t, b)
	callee := b.GetNode().GetCluster()
	if f.GetDomain() != callee {
		t.Errorf("domain %q, want the callee %q: the sidecar's default --rls-domain is its --service", f.GetDomain(), callee)
	}
	svc := f.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("rate_limit_service transport %v, want V3: sluice serves envoy.service.ratelimit.v3", svc.GetTransportApiVersion())
	}
	if f.GetFailureModeDeny() {
		t.Error("failure_mode_deny: a sidecar that does not answer must not refuse every request")
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var cluster bool
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != name {
			continue
		}
		cluster = true
		opts := unpack(t, c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], new(upstreamhttp.HttpProtocolOptions))
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", name)
		}
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, le := range e.GetLbEndpoints() {
				if a := le.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(); a != "127.0.0.1" {
					t.Errorf("cluster %s points at %s, want the sidecar on localhost", name, a)
				}
			}
		}
	}
	if !cluster {
		t.Fatalf("rate limit cluster %q is not defined", name)
	}

	// A sluice rate limit service with the sidecar's defaults, web blocked.
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	l.SetPolicy(&sidecar.Policy{Name: names.Callee(callee), Service: callee, Direction: sidecar.Inbound,
		Peers: []sidecar.Rule{{Peer: "web", DropRatio: math.Nextafter(1, 0), LimitRPS: 0, AllowedRPS: 0}}})
	s, err := rls.New(l.Service(callee), rls.DefaultMapping(callee), nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(rls.ServerOptions()...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)

	for _, tc := range []struct {
		caller string // "": no header
		want   rlsv3.RateLimitResponse_Code
	}{{"web", rlsv3.RateLimitResponse_OVER_LIMIT}, {"mobile", rlsv3.RateLimitResponse_OK}, {"", rlsv3.RateLimitResponse_OK}} {
		hdr := map[string]string{":path": "/v1/charges", ":method": "POST"}
		if tc.caller != "" {
			hdr["x-envoy-downstream-service-cluster"] = tc.caller
		}
		ds := descriptorsFor(t, f.GetRateLimits(), hdr)
		if len(ds) != 1 {
			t.Fatalf("caller %q: %d descriptors, want 1", tc.caller, len(ds))
		}
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: f.GetDomain(), Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != tc.want {
			t.Errorf("caller %q: %v, want %v", tc.caller, resp.GetOverallCode(), tc.want)
		}
	}
	got := map[string]uint64{}
	for _, c := range l.AppendCounts(callee, nil) {
		got[c.Peer] += c.Offered
	}
	if got["web"] != 1 || got["mobile"] != 1 || got[names.Unknown] != 1 {
		t.Errorf("counted %v, want one request each of web, mobile and %s", got, names.Unknown)
	}
}
