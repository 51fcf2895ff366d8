package xdsserver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	runtime "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

func TestPPM(t *testing.T) {
	for _, c := range []struct {
		ratio float64
		want  uint32
	}{
		{0, 0}, {-0.1, 0}, {0.3, 300000}, {0.1, 100000}, {0.99, 990000},
		{0.0000004, 0}, {0.0000005, 1}, {0.1234567, 123457}, {1, 1000000}, {1.5, 1000000},
	} {
		if got := PPM(c.ratio); got != c.want {
			t.Errorf("PPM(%v) = %d, want %d", c.ratio, got, c.want)
		}
	}
}

func TestEndpointsValidate(t *testing.T) {
	if err := (Endpoints{"checkout": {"10.0.0.1:8080", "[::1]:9000", "checkout-0.checkout:50051"}}).Validate(); err != nil {
		t.Fatalf("valid endpoints: %v", err)
	}
	if err := Endpoints(nil).Validate(); err != nil {
		t.Fatalf("no endpoints: %v", err)
	}
	bad := Endpoints{
		"checkout":  {"10.0.0.1", "10.0.0.2:0", ":8080", "10.0.0.3:80", "10.0.0.3:80"},
		"orders":    nil,
		"bad name!": {"10.0.0.1:80"},
		"_overflow": {"10.0.0.1:80"},
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad endpoints accepted")
	}
	for _, want := range []string{
		`services.checkout[0]: "10.0.0.1": not host:port`,
		`services.checkout[1]: "10.0.0.2:0": port "0"`,
		`services.checkout[2]: ":8080": empty host`,
		`services.checkout[4]: "10.0.0.3:80" listed twice`,
		`services.orders: no addresses`,
		`services.bad name!: not a service name`,
		`services._overflow: not a service name: reserved name`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\nlacks %q", err, want)
		}
	}
}

func TestLoadEndpoints(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	eps, err := LoadEndpoints(write("ok.yaml", "services:\n  checkout: [\"127.0.0.1:8080\", \"127.0.0.2:8080\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := eps["checkout"]; len(got) != 2 || got[1] != "127.0.0.2:8080" {
		t.Fatalf("loaded %v", eps)
	}
	for name, c := range map[string]struct{ body, want string }{
		"unknown key": {"service:\n  checkout: [\"127.0.0.1:8080\"]\n", "field service not found"},
		"bad address": {"services:\n  checkout: [\"127.0.0.1\"]\n", "services.checkout[0]"},
		"not a list":  {"services:\n  checkout: 127.0.0.1:8080\n", "cannot unmarshal"},
	} {
		_, err := LoadEndpoints(write(strings.ReplaceAll(name, " ", "-")+".yaml", c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", name, err, c.want)
		}
	}
	if _, err := LoadEndpoints(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

// served returns the route version and routes per callee a caller was
// last served.
func (p *proxyless) served(caller string) (string, map[string]servedRoute) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cr, ok := p.callers[caller]
	if !ok {
		return "", nil
	}
	return cr.version, cr.routes
}

// calleePolicy is an inbound policy with the given (caller, ratio) pairs;
// callers named "shadow-*" are in shadow mode.
func calleePolicy(callee string, ratios map[string]float64) *sluicev1.DropPolicy {
	p := &sluicev1.DropPolicy{Name: "callee/" + callee, Service: callee, Direction: sluicev1.Direction_DIRECTION_INBOUND}
	for caller, r := range ratios {
		mode := sluicev1.Mode_MODE_ENFORCE
		if strings.HasPrefix(caller, "shadow-") {
			mode = sluicev1.Mode_MODE_SHADOW
		}
		p.Peers = append(p.Peers, &sluicev1.PeerPolicy{Peer: caller, DropRatio: r, Mode: mode})
	}
	return p
}

func publish(t *testing.T, s *Server, policies ...*sluicev1.DropPolicy) {
	t.Helper()
	m := map[string]*sluicev1.DropPolicy{}
	for _, p := range policies {
		m[p.GetName()] = p
	}
	if err := s.Update(m, nil); err != nil {
		t.Fatal(err)
	}
}

// adsSub is one SotW ADS stream of one node, holding what it accepted per
// type, so that each request names the subscription and ACKs as a real
// client does.
type adsSub struct {
	t     *testing.T
	st    discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	ch    <-chan *discovery.DiscoveryResponse
	names map[string][]string
}

func newADSSub(t *testing.T, addr string, n *core.Node) *adsSub {
	t.Helper()
	st, err := dialADS(t, addr).StreamAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: n, TypeUrl: names.DropPolicyType, ResourceNames: []string{"callee/none"}}); err != nil {
		t.Fatal(err)
	}
	s := &adsSub{t: t, st: st, ch: responses(st.Recv), names: map[string][]string{}}
	next(t, s.ch) // SotW answers a first named request at once, empty here
	return s
}

// subscribe asks for names of typeURL and returns the answer, ACKed.
func (s *adsSub) subscribe(typeURL string, names ...string) *discovery.DiscoveryResponse {
	s.t.Helper()
	s.names[typeURL] = names
	if err := s.st.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}); err != nil {
		s.t.Fatal(err)
	}
	return s.recv()
}

// recv returns the next response, ACKed.
func (s *adsSub) recv() *discovery.DiscoveryResponse {
	s.t.Helper()
	r := next(s.t, s.ch)
	ack := &discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: s.names[r.GetTypeUrl()],
		VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}
	if err := s.st.Send(ack); err != nil {
		s.t.Fatal(err)
	}
	return r
}

func unmarshal[T proto.Message](t *testing.T, r *discovery.DiscoveryResponse, m T) T {
	t.Helper()
	if len(r.GetResources()) != 1 {
		t.Fatalf("%s response with %d resources, want 1", r.GetTypeUrl(), len(r.GetResources()))
	}
	if err := r.GetResources()[0].UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// routeAbort returns the abort a RouteConfiguration carries for every call.
func routeAbort(t *testing.T, rc *route.RouteConfiguration) *fault.FaultAbort {
	t.Helper()
	rts := rc.GetVirtualHosts()[0].GetRoutes()
	if len(rc.GetVirtualHosts()) != 1 || len(rts) != 1 || rts[0].GetRoute().GetCluster() != rc.GetName() {
		t.Fatalf("route configuration %v: want one route to the cluster of the same name", rc)
	}
	f := new(fault.HTTPFault)
	if err := rts[0].GetTypedPerFilterConfig()[FaultFilterName].UnmarshalTo(f); err != nil {
		t.Fatalf("fault override: %v", err)
	}
	if f.GetAbort().GetGrpcStatus() != 8 || f.GetAbort().GetPercentage().GetDenominator() != typev3.FractionalPercent_MILLION {
		t.Fatalf("abort %v: want gRPC status 8 per million", f.GetAbort())
	}
	return f.GetAbort()
}

// versionN is the counter of a version "<prefix><n>".
func versionN(t *testing.T, v string) int {
	t.Helper()
	i := strings.LastIndexByte(v, '-')
	n, err := strconv.Atoi(v[i+1:])
	if err != nil {
		t.Fatalf("version %q: %v", v, err)
	}
	return n
}

func TestProxylessResourcesPerCaller(t *testing.T) {
	s := newServerOpts(t, Options{Proxyless: Endpoints{
		"checkout": {"127.0.0.1:8080", "127.0.0.2:8080"},
		"orders":   {"127.0.0.3:9090"},
	}})
	publish(t, s,
		calleePolicy("checkout", map[string]float64{"web": 0.3, "shadow-batch": 0.5, "mobile": 0}),
		calleePolicy("orders", map[string]float64{"web": 0.25}),
		calleePolicy("search", map[string]float64{"web": 0.9}), // not proxyless
	)
	addr := serve(t, s)
	web := newADSSub(t, addr, &core.Node{Id: "web-1", Cluster: "web"})

	lis := unmarshal(t, web.subscribe(resourcev3.ListenerType, "checkout"), new(listener.Listener))
	m := new(hcm.HttpConnectionManager)
	if err := lis.GetApiListener().GetApiListener().UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
	if lis.GetName() != "checkout" || m.GetRds().GetRouteConfigName() != "checkout" || m.GetRds().GetConfigSource().GetAds() == nil {
		t.Fatalf("listener %v: want RDS checkout over ADS", lis)
	}
	if fs := m.GetHttpFilters(); len(fs) != 2 || fs[0].GetName() != FaultFilterName || fs[1].GetName() != routerFilterName {
		t.Fatalf("filters %v: want fault, router", fs)
	}
	rr := web.subscribe(resourcev3.RouteType, "checkout")
	if got := routeAbort(t, unmarshal(t, rr, new(route.RouteConfiguration))).GetPercentage().GetNumerator(); got != 300000 {
		t.Fatalf("web → checkout aborts %d ppm, want 300000", got)
	}
	cl := unmarshal(t, web.subscribe(resourcev3.ClusterType, "checkout"), new(clusterv3.Cluster))
	if cl.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil || cl.GetEdsClusterConfig().GetServiceName() != "checkout" {
		t.Fatalf("cluster %v: want EDS checkout over ADS", cl)
	}
	cla := unmarshal(t, web.subscribe(resourcev3.EndpointType, "checkout"), new(endpoint.ClusterLoadAssignment))
	if eps := cla.GetEndpoints(); len(eps) != 1 || eps[0].GetLoadBalancingWeight().GetValue() != 1 || len(eps[0].GetLbEndpoints()) != 2 ||
		eps[0].GetLbEndpoints()[1].GetEndpoint().GetAddress().GetSocketAddress().GetAddress() != "127.0.0.2" ||
		eps[0].GetLbEndpoints()[1].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue() != 8080 {
		t.Fatalf("endpoints %v", cla)
	}

	// Each caller has its own routes: a shadow caller and a caller with
	// ratio 0 are not aborted; a caller with no cluster is "unknown".
	for caller, want := range map[string]uint32{"shadow-batch": 0, "mobile": 0, "": 0} {
		sub := newADSSub(t, addr, &core.Node{Id: "x", Cluster: caller})
		if got := routeAbort(t, unmarshal(t, sub.subscribe(resourcev3.RouteType, "checkout"), new(route.RouteConfiguration))).GetPercentage().GetNumerator(); got != want {
			t.Errorf("caller %q → checkout aborts %d ppm, want %d", caller, got, want)
		}
	}
	mobileVersion, _ := s.dp.proxyless.served("mobile")
	if v, _ := s.dp.proxyless.served("unknown"); v == "" {
		t.Error("a node without a cluster has no snapshot as caller unknown")
	}

	// A ratio change resends the route, and nothing else: the next
	// response on the stream is RDS. A republish at the same ppm sends
	// nothing and sets no snapshot: the change after it is the very next
	// route version.
	v0 := versionN(t, rr.GetVersionInfo())
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.1, "shadow-batch": 0.5, "mobile": 0}))
	r := web.recv()
	if r.GetTypeUrl() != resourcev3.RouteType {
		t.Fatalf("after a ratio change got %s, want only RDS", r.GetTypeUrl())
	}
	if got := routeAbort(t, unmarshal(t, r, new(route.RouteConfiguration))).GetPercentage().GetNumerator(); got != 100000 {
		t.Fatalf("after the change web → checkout aborts %d ppm, want 100000", got)
	}
	v1 := versionN(t, r.GetVersionInfo())
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.1000001, "shadow-batch": 0.5, "mobile": 0}))
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.2, "shadow-batch": 0.5, "mobile": 0}))
	r = web.recv()
	if r.GetTypeUrl() != resourcev3.RouteType || routeAbort(t, unmarshal(t, r, new(route.RouteConfiguration))).GetPercentage().GetNumerator() != 200000 {
		t.Fatalf("got %v, want RDS at 200000 ppm", r)
	}
	if v2 := versionN(t, r.GetVersionInfo()); v1 <= v0 || v2 != v1+1 {
		t.Fatalf("route versions %d, %d, %d: want each change to be the next version, the republish none", v0, v1, v2)
	}
	if v, _ := s.dp.proxyless.served("mobile"); v != mobileVersion {
		t.Errorf("mobile's routes were reset (%s → %s) by a change of web's ratio", mobileVersion, v)
	}

	// A deleted policy releases its callers.
	if err := s.Update(nil, []string{"callee/checkout"}); err != nil {
		t.Fatal(err)
	}
	r = web.recv()
	if got := routeAbort(t, unmarshal(t, r, new(route.RouteConfiguration))).GetPercentage().GetNumerator(); got != 0 {
		t.Fatalf("after the delete web → checkout aborts %d ppm, want 0", got)
	}
}

func TestRuntimeLayers(t *testing.T) {
	s := newServerOpts(t, Options{})
	publish(t, s,
		calleePolicy("checkout", map[string]float64{"web": 0.3, "shadow-batch": 0.5, "mobile": 0, "unknown": 0.4, "_overflow": 0.4}),
		calleePolicy("orders", map[string]float64{"checkout": 0.7}),
	)
	envoy := newADSSub(t, serve(t, s), &core.Node{Id: "checkout-envoy-1", Cluster: "checkout"})
	r := envoy.subscribe(RuntimeTypeURL, RuntimeLayerName("checkout"))
	layer := unmarshal(t, r, new(runtime.Runtime))
	if layer.GetName() != "sluice/checkout" {
		t.Fatalf("layer named %q", layer.GetName())
	}
	f := layer.GetLayer().AsMap()
	pct := func(caller string) any {
		v, ok := f["fault.http."+caller+".abort.abort_percent"].(map[string]any)
		if !ok {
			return nil
		}
		if v["denominator"] != "MILLION" {
			t.Errorf("%s: denominator %v", caller, v["denominator"])
		}
		return v["numerator"]
	}
	for caller, want := range map[string]float64{"web": 300000, "shadow-batch": 0, "mobile": 0} {
		if got := pct(caller); got != want {
			t.Errorf("%s: abort_percent numerator %v, want %v", caller, got, want)
		}
		if got := f["fault.http."+caller+".abort.http_status"]; got != float64(429) {
			t.Errorf("%s: http_status %v, want 429", caller, got)
		}
	}
	if len(f) != 6 {
		t.Errorf("layer has %d keys, want 6 (unknown and _overflow left out): %v", len(f), f)
	}

	// Republishing the same ratios sends nothing; a change is the next
	// cache version.
	v0 := versionN(t, r.GetVersionInfo())
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.3, "shadow-batch": 0.5, "mobile": 0, "unknown": 0.4, "_overflow": 0.4}))
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.1, "shadow-batch": 0.5, "mobile": 0}))
	r = envoy.recv()
	if v := versionN(t, r.GetVersionInfo()); v != v0+1 {
		t.Errorf("version %d after %d: the republish was sent", v, v0)
	}
	if got := unmarshal(t, r, new(runtime.Runtime)).GetLayer().AsMap()[AbortPercentKey("web")].(map[string]any)["numerator"]; got != float64(100000) {
		t.Errorf("after the change web's abort_percent numerator is %v, want 100000", got)
	}
	if _, ok := s.dp.rtds.cache.GetResources()[RuntimeLayerName("orders")]; !ok {
		t.Error("no layer for orders")
	}
	if err := s.Update(nil, []string{"callee/orders"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.dp.rtds.cache.GetResources()[RuntimeLayerName("orders")]; ok {
		t.Error("the layer of a deleted policy is still served")
	}
}
