package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/log"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/pkg/names"
)

const (
	// FaultFilterName is the HTTP filter that carries the abort, in the
	// listener's filter chain and in each route's override. gRPC-Go matches
	// the override to the filter by this name.
	FaultFilterName  = "envoy.filters.http.fault"
	routerFilterName = "envoy.filters.http.router"

	// AbortGRPCStatus is what an aborted proxyless call fails with:
	// RESOURCE_EXHAUSTED, as sluice's own sidecar answers a drop.
	AbortGRPCStatus = codes.ResourceExhausted

	// maxProxylessCallers bounds the caller nodes that get a snapshot of
	// their own. Node clusters are chosen by clients; past the bound a new
	// one is served the "_overflow" caller's ratios, as the sidecar does
	// with callers past --max-peers.
	maxProxylessCallers = 10000
)

// PPM turns a drop ratio into the abort fraction served, in parts per
// million: the finest denominator xDS has. The rounding error is at most
// 0.5 ppm.
func PPM(ratio float64) uint32 {
	if math.IsNaN(ratio) || ratio <= 0 {
		return 0
	}
	if ratio >= 1 {
		return 1_000_000
	}
	return uint32(math.Round(ratio * 1e6))
}

// proxyless serves Listener, RouteConfiguration, Cluster and
// ClusterLoadAssignment resources to proxyless gRPC clients: one snapshot
// per caller service (the node's cluster), because gRPC-Go's fault filter
// ignores the headers and downstream_nodes an Envoy would match callers on.
// Every caller sees the same listeners, clusters and endpoints (built once,
// one version for the process); only its routes differ, each carrying the
// abort fraction of its (callee, caller) bucket, or for a callee that
// declares gRPC methods of its (callee, caller, method) leaf, under a
// version of the caller's own. A ratio change therefore resends RDS to
// that caller only.
//
// It implements cache.Cache so that MuxCache can hand it the four types:
// a watch from a caller seen for the first time builds that caller's
// snapshot before go-control-plane's SnapshotCache looks for it.
type proxyless struct {
	snaps  cache.SnapshotCache
	ctx    context.Context // bounds SetSnapshot's sends to open watches
	prefix string          // versions are unique per process, as the DropPolicy cache's

	// Built once: they do not depend on the caller.
	callees   []string // sorted, the keys of the endpoints
	listeners []types.Resource
	clusters  []types.Resource
	loads     []types.Resource

	// idsMu protects ids. It is separate from mu and never held while
	// calling into the SnapshotCache, which calls back into ID.
	idsMu sync.RWMutex
	ids   map[string]bool // caller node ids with a snapshot

	// mu protects what follows. SetSnapshot is called under it, so a
	// caller's snapshots are set in version order.
	mu      sync.Mutex
	ratios  map[string]*calleePPM // callee → its routes' abort fractions
	callers map[string]*callerRoutes
	next    uint64 // last route version handed out
}

// calleePPM is one callee's abort fractions: the gRPC methods with a
// route of their own, and per caller the ppm of each route, the
// catch-all's last. Never modified once built: a change builds another.
type calleePPM struct {
	methods []string
	ppm     map[string][]uint32 // caller → len(methods)+1 ppm; callers with some non-zero only
	zero    []uint32            // len(methods)+1 zeros, for every other caller
}

// servedRoute is one callee's RouteConfiguration for one caller: its
// methods and their ppm, the catch-all's last. Its slices are a
// calleePPM's, shared and never modified.
type servedRoute struct {
	methods []string
	ppm     []uint32
}

func (a servedRoute) equal(b servedRoute) bool {
	return slices.Equal(a.methods, b.methods) && slices.Equal(a.ppm, b.ppm)
}

// callerRoutes is what one caller was last served.
type callerRoutes struct {
	routes  map[string]servedRoute // callee → its route configuration
	version string
}

func newProxyless(ctx context.Context, eps Endpoints, prefix string, logger log.Logger) *proxyless {
	p := &proxyless{
		ctx:     ctx,
		prefix:  prefix,
		callees: slices.Sorted(maps.Keys(eps)),
		ids:     map[string]bool{},
		ratios:  map[string]*calleePPM{},
		callers: map[string]*callerRoutes{},
	}
	// Not ADS mode: in ADS mode go-control-plane answers a request only
	// when it names every resource of the type in the snapshot, and a
	// client names only the callees it dials.
	p.snaps = cache.NewSnapshotCache(false, p, logger)
	for _, c := range p.callees {
		p.listeners = append(p.listeners, proxylessListener(c))
		p.clusters = append(p.clusters, proxylessCluster(c))
		p.loads = append(p.loads, proxylessLoad(c, eps[c]))
	}
	return p
}

// ID implements cache.NodeHash: a caller's snapshot is keyed by its service,
// the node's cluster. A node without a valid one is the "unknown" caller,
// as a request without a caller name is at a sidecar; a node past the
// bound of distinct callers is "_overflow".
func (p *proxyless) ID(node *core.Node) string {
	c := node.GetCluster()
	if names.Check(c) != nil || c == names.Overflow {
		return names.Unknown
	}
	p.idsMu.RLock()
	known, n := p.ids[c], len(p.ids)
	p.idsMu.RUnlock()
	if known || n < maxProxylessCallers {
		return c
	}
	return names.Overflow
}

// ensure gives the node's caller a snapshot if it has none yet.
func (p *proxyless) ensure(node *core.Node) error {
	id := p.ID(node)
	p.idsMu.RLock()
	known := p.ids[id]
	p.idsMu.RUnlock()
	if known {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.callers[id]; ok {
		return nil // another stream of the same caller got here first
	}
	if err := p.set(id, p.routesFor(id)); err != nil {
		return err
	}
	p.idsMu.Lock()
	p.ids[id] = true
	p.idsMu.Unlock()
	return nil
}

// noPPM is the routes of a callee without a policy: one route, at 0.
var noPPM = servedRoute{ppm: []uint32{0}}

// routesFor is the routes per proxyless callee for caller. Call with mu
// held.
func (p *proxyless) routesFor(caller string) map[string]servedRoute {
	out := make(map[string]servedRoute, len(p.callees))
	for _, c := range p.callees {
		cp := p.ratios[c]
		switch {
		case cp == nil:
			out[c] = noPPM
		case cp.ppm[caller] != nil:
			out[c] = servedRoute{methods: cp.methods, ppm: cp.ppm[caller]}
		default:
			out[c] = servedRoute{methods: cp.methods, ppm: cp.zero}
		}
	}
	return out
}

// set serves rs to caller under a new route version. Call with mu held.
func (p *proxyless) set(caller string, rs map[string]servedRoute) error {
	p.next++
	cr := &callerRoutes{routes: rs, version: p.prefix + strconv.FormatUint(p.next, 10)}
	routes := make([]types.Resource, 0, len(p.callees))
	for _, c := range p.callees {
		routes = append(routes, proxylessRoute(c, rs[c].methods, rs[c].ppm))
	}
	var snap cache.Snapshot
	static := p.prefix + "0"
	snap.Resources[types.Listener] = cache.NewResources(static, p.listeners)
	snap.Resources[types.Cluster] = cache.NewResources(static, p.clusters)
	snap.Resources[types.Endpoint] = cache.NewResources(static, p.loads)
	snap.Resources[types.Route] = cache.NewResources(cr.version, routes)
	// No snap.Consistent(): it expects listeners to name their routes
	// through a network filter, which an api_listener does not.
	if err := p.snaps.SetSnapshot(p.ctx, caller, &snap); err != nil {
		return fmt.Errorf("set proxyless snapshot of caller %s: %w", caller, err)
	}
	p.callers[caller] = cr
	return nil
}

// update takes the ratios of the callees whose policies changed (callee →
// its leafRatios, enforced callers only) and of those deleted, and resends
// routes to the callers of which some route's abort fraction moved by at
// least one ppm, or whose callee's methods changed.
func (p *proxyless) update(changed map[string]leafRatios, deleted []string) error {
	if len(p.callees) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	touched := false
	for callee, lr := range changed {
		if _, ok := slices.BinarySearch(p.callees, callee); !ok {
			continue
		}
		p.ratios[callee] = newCalleePPM(lr)
		touched = true
	}
	for _, callee := range deleted {
		if _, ok := p.ratios[callee]; ok {
			delete(p.ratios, callee)
			touched = true
		}
	}
	if !touched {
		return nil
	}
	var errs []error
	for caller, cr := range p.callers {
		want := p.routesFor(caller)
		if maps.EqualFunc(want, cr.routes, servedRoute.equal) {
			continue
		}
		if err := p.set(caller, want); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newCalleePPM turns a callee's ratios into ppm, keeping the callers with
// some route above 0.
func newCalleePPM(lr leafRatios) *calleePPM {
	cp := &calleePPM{methods: lr.methods, ppm: make(map[string][]uint32, len(lr.callers)), zero: make([]uint32, len(lr.methods)+1)}
	for caller, rs := range lr.callers {
		ppm := make([]uint32, len(rs))
		some := false
		for i, r := range rs {
			ppm[i] = PPM(r)
			some = some || ppm[i] > 0
		}
		if some {
			cp.ppm[caller] = ppm
		}
	}
	return cp
}

// CreateWatch implements cache.Cache.
func (p *proxyless) CreateWatch(req *cache.Request, sub cache.Subscription, ch chan cache.Response) (func(), error) {
	if err := p.ensure(req.GetNode()); err != nil {
		return nil, err
	}
	return p.snaps.CreateWatch(req, sub, ch)
}

// CreateDeltaWatch implements cache.Cache.
func (p *proxyless) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	if err := p.ensure(req.GetNode()); err != nil {
		return nil, err
	}
	return p.snaps.CreateDeltaWatch(req, sub, ch)
}

// Fetch implements cache.Cache; REST xDS is not served.
func (p *proxyless) Fetch(ctx context.Context, req *cache.Request) (cache.Response, error) {
	return nil, errors.New("fetch is not supported")
}

// adsSource is "over the same ADS stream", the only config source gRPC-Go
// accepts besides "self".
func adsSource() *core.ConfigSource {
	return &core.ConfigSource{
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		ResourceApiVersion:    core.ApiVersion_V3,
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err)) // only for messages built here, never fails
	}
	return a
}

// proxylessListener is the api_listener a client dialling xds:///<callee>
// asks for: an HTTP connection manager with the fault filter (no fault of
// its own: each route overrides it) and the router, routes over RDS.
func proxylessListener(callee string) *listener.Listener {
	m := &hcm.HttpConnectionManager{
		StatPrefix: callee,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: callee,
		}},
		HttpFilters: []*hcm.HttpFilter{
			{Name: FaultFilterName, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&fault.HTTPFault{})}},
			{Name: routerFilterName, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}},
		},
	}
	return &listener.Listener{
		Name:        callee,
		ApiListener: &listener.ApiListener{ApiListener: mustAny(m)},
	}
}

// proxylessRoute sends every call to the callee's cluster and aborts
// ppm[i] of every million calls of methods[i], and ppm[len(methods)] of
// every other call, with RESOURCE_EXHAUSTED, before it is sent: one route
// per method, matching its full method exactly, then a catch-all. gRPC-Go
// takes the first route that matches, as Envoy does, so a declared method
// never reaches the catch-all, and every other method does, as a sidecar
// puts it in names.Other. A ppm of 0 keeps the override, so the
// resource's shape changes only with the methods.
func proxylessRoute(callee string, methods []string, ppm []uint32) *route.RouteConfiguration {
	rts := make([]*route.Route, 0, len(methods)+1)
	for i, m := range methods {
		rts = append(rts, faultRoute(callee, &route.RouteMatch{PathSpecifier: &route.RouteMatch_Path{Path: m}}, ppm[i]))
	}
	rts = append(rts, faultRoute(callee, &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}}, ppm[len(methods)]))
	return &route.RouteConfiguration{
		Name: callee,
		VirtualHosts: []*route.VirtualHost{{
			Name:    callee,
			Domains: []string{"*"},
			Routes:  rts,
		}},
	}
}

// faultRoute sends the calls match takes to the callee's cluster, and
// aborts ppm of every million.
func faultRoute(callee string, match *route.RouteMatch, ppm uint32) *route.Route {
	abort := &fault.HTTPFault{Abort: &fault.FaultAbort{
		ErrorType:  &fault.FaultAbort_GrpcStatus{GrpcStatus: uint32(AbortGRPCStatus)},
		Percentage: &typev3.FractionalPercent{Numerator: ppm, Denominator: typev3.FractionalPercent_MILLION},
	}}
	return &route.Route{
		Match:  match,
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: callee}}},
		TypedPerFilterConfig: map[string]*anypb.Any{
			FaultFilterName: mustAny(abort),
		},
	}
}

func proxylessCluster(callee string) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 callee,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: callee},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
	}
}

// proxylessLoad puts every address in one locality of weight 1 (gRPC-Go
// ignores localities of weight 0).
func proxylessLoad(callee string, addrs []string) *endpoint.ClusterLoadAssignment {
	lbs := make([]*endpoint.LbEndpoint, 0, len(addrs))
	for _, a := range addrs {
		host, port, _ := net.SplitHostPort(a) // checked by Endpoints.Validate
		n, _ := strconv.Atoi(port)
		lbs = append(lbs, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address:       host,
					PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(n)},
				}}},
			}},
		})
	}
	return &endpoint.ClusterLoadAssignment{
		ClusterName: callee,
		Endpoints: []*endpoint.LocalityLbEndpoints{{
			Locality:            &core.Locality{},
			LoadBalancingWeight: wrapperspb.UInt32(1),
			LbEndpoints:         lbs,
		}},
	}
}
