package envoy

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	runtime "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/xdsserver"
)

// These imports register the extension types envoy.yaml names in its Any
// fields, so that protojson can resolve them.
var (
	_ = hcm.HttpConnectionManager{}
	_ = fault.HTTPFault{}
	_ = router.Router{}
	_ = upstreamhttp.HttpProtocolOptions{}
)

// validator is what protoc-gen-validate generates for every Envoy message:
// the constraints of Envoy's own schema (required fields, ranges, enums).
type validator interface{ ValidateAll() error }

// load parses envoy.yaml strictly (unknown fields are errors) as Envoy's v3
// Bootstrap and checks every message against Envoy's constraints, the
// extensions inside Any fields included.
func load(t *testing.T) *bootstrap.Bootstrap {
	t.Helper()
	return loadFile(t, "envoy.yaml")
}

// loadFile is load of the bootstrap file name.
func loadFile(t *testing.T, name string) *bootstrap.Bootstrap {
	t.Helper()
	y, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	b := new(bootstrap.Bootstrap)
	if err := protojson.Unmarshal(j, b); err != nil {
		t.Fatalf("%s is not a valid v3 Bootstrap: %v", name, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s breaks Envoy's constraints: %v", name, err)
	}
	return b
}

// unpack resolves an Any and validates what it holds (ValidateAll does not
// look inside Any fields).
func unpack[T proto.Message](t *testing.T, a *anypb.Any, m T) T {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: %v", a.GetTypeUrl(), err)
	}
	if v, ok := any(m).(validator); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", a.GetTypeUrl(), err)
		}
	}
	return m
}

// inboundFault returns the fault filter of the inbound listener's HTTP
// connection manager, checking the chain on the way.
func inboundFault(t *testing.T, b *bootstrap.Bootstrap) *fault.HTTPFault {
	t.Helper()
	var found *fault.HTTPFault
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
					if f.GetName() == xdsserver.FaultFilterName {
						found = unpack(t, f.GetTypedConfig(), new(fault.HTTPFault))
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
		t.Fatal("no fault filter in the inbound listener")
	}
	return found
}

func TestEnvoyBootstrapIsValid(t *testing.T) {
	b := load(t)
	f := inboundFault(t, b)

	// The runtime keys apply only through an abort block; its own share is
	// the default when no key is set, and must be 0.
	ab := f.GetAbort()
	if ab.GetHttpStatus() != xdsserver.AbortHTTPStatus {
		t.Errorf("abort http_status %d, want %d as sluice's sidecar answers", ab.GetHttpStatus(), xdsserver.AbortHTTPStatus)
	}
	if ab.GetPercentage().GetNumerator() != 0 || ab.GetPercentage().GetDenominator() != typev3.FractionalPercent_MILLION {
		t.Errorf("abort default %v, want 0 per MILLION", ab.GetPercentage())
	}
	// downstream_nodes would limit the filter to some callers; custom
	// runtime key names would not change the per-caller keys, which Envoy
	// builds as fault.http.<downstream-cluster>.abort.*, but would be a
	// trap for the next reader.
	if len(f.GetDownstreamNodes()) > 0 || f.GetAbortPercentRuntime() != "" || f.GetAbortHttpStatusRuntime() != "" {
		t.Errorf("fault filter restricts callers or renames runtime keys: %v", f)
	}

	// The sluice layer: RTDS over ADS, named for the callee this Envoy
	// fronts, and the ADS cluster speaks HTTP/2.
	var layer string
	for _, l := range b.GetLayeredRuntime().GetLayers() {
		if r := l.GetRtdsLayer(); r != nil {
			if r.GetRtdsConfig().GetAds() == nil {
				t.Errorf("rtds layer %s is not over ADS", r.GetName())
			}
			layer = r.GetName()
		}
	}
	if want := xdsserver.RuntimeLayerName(b.GetNode().GetCluster()); layer != want {
		t.Errorf("rtds layer %q, want %q for node cluster %q", layer, want, b.GetNode().GetCluster())
	}
	ads := b.GetDynamicResources().GetAdsConfig().GetGrpcServices()
	if len(ads) != 1 {
		t.Fatalf("ads_config has %d gRPC services, want 1", len(ads))
	}
	var controller *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == ads[0].GetEnvoyGrpc().GetClusterName() {
			controller = c
		}
	}
	if controller == nil {
		t.Fatalf("ADS cluster %q is not defined", ads[0].GetEnvoyGrpc().GetClusterName())
	}
	opts := unpack(t, controller.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], new(upstreamhttp.HttpProtocolOptions))
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Error("the controller's cluster does not speak HTTP/2, which gRPC needs")
	}
}

// TestEnvoyLayerFromTheController subscribes, as envoy.yaml's node, to the
// layer envoy.yaml names, from a real controller xDS server on loopback,
// and checks every key it gets against what Envoy's fault filter reads:
// fault.http.<downstream-cluster>.abort.abort_percent, a FractionalPercent
// (Envoy's runtime takes a struct with numerator/denominator as one), and
// fault.http.<downstream-cluster>.abort.http_status, an integer.
func TestEnvoyLayerFromTheController(t *testing.T) {
	b := load(t)
	callee := b.GetNode().GetCluster()
	var layer string
	for _, l := range b.GetLayeredRuntime().GetLayers() {
		if r := l.GetRtdsLayer(); r != nil {
			layer = r.GetName()
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := xdsserver.New(ctx, xdsserver.Options{})
	policy := &sluicev1.DropPolicy{Name: "callee/" + callee, Service: callee, Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Peers: []*sluicev1.PeerPolicy{
			{Peer: "mobile", DropRatio: 0},
			{Peer: "web", DropRatio: 0.3, Mode: sluicev1.Mode_MODE_ENFORCE},
		}}
	if err := s.Update(map[string]*sluicev1.DropPolicy{policy.GetName(): policy}, nil); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sctx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: b.GetNode(), TypeUrl: xdsserver.RuntimeTypeURL, ResourceNames: []string{layer}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetResources()) != 1 {
		t.Fatalf("got %d resources for layer %q, want 1", len(r.GetResources()), layer)
	}
	rt := new(runtime.Runtime)
	if err := r.GetResources()[0].UnmarshalTo(rt); err != nil {
		t.Fatal(err)
	}
	if err := rt.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint32{"web": 300000, "mobile": 0}
	seen := map[string]bool{}
	for key, v := range rt.GetLayer().GetFields() {
		caller, field, ok := envoyKey(key)
		if !ok {
			t.Errorf("key %q is not one Envoy's fault filter reads per downstream cluster", key)
			continue
		}
		switch field {
		case "abort_percent":
			// Envoy converts a struct with numerator or denominator to a
			// FractionalPercent through its JSON form.
			j, err := protojson.Marshal(v.GetStructValue())
			if err != nil {
				t.Fatal(err)
			}
			pct := new(typev3.FractionalPercent)
			if err := protojson.Unmarshal(j, pct); err != nil {
				t.Errorf("%s: %s is not a FractionalPercent: %v", key, j, err)
				continue
			}
			if pct.GetDenominator() != typev3.FractionalPercent_MILLION || pct.GetNumerator() != want[caller] {
				t.Errorf("%s = %v, want %d per MILLION", key, pct, want[caller])
			}
		case "http_status":
			if v.GetNumberValue() != xdsserver.AbortHTTPStatus {
				t.Errorf("%s = %v, want %d", key, v, xdsserver.AbortHTTPStatus)
			}
		}
		seen[caller+" "+field] = true
	}
	for caller := range want {
		for _, field := range []string{"abort_percent", "http_status"} {
			if !seen[caller+" "+field] {
				t.Errorf("layer lacks %s's %s", caller, field)
			}
		}
	}
}

// envoyKey splits a runtime key of the form Envoy's fault filter builds from
// the x-envoy-downstream-service-cluster header (fault_filter.cc:
// "fault.http.{}.abort.abort_percent", "fault.http.{}.abort.http_status").
func envoyKey(key string) (caller, field string, ok bool) {
	rest, ok := strings.CutPrefix(key, "fault.http.")
	if !ok {
		return "", "", false
	}
	for _, f := range []string{"abort_percent", "http_status"} {
		if c, ok := strings.CutSuffix(rest, ".abort."+f); ok && c != "" {
			return c, f, true
		}
	}
	return "", "", false
}
