package xdsserver

import (
	"fmt"
	"slices"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	runtime "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// methodRoute is one route of a RouteConfiguration: the full method it
// matches exactly ("" for the catch-all) and its abort in ppm.
type methodRoute struct {
	path string
	ppm  uint32
}

// methodRoutes returns the routes of rc, checking that each goes to the
// cluster of its name with a gRPC abort per million, and that the last one,
// and only it, is the catch-all.
func methodRoutes(t *testing.T, rc *route.RouteConfiguration) []methodRoute {
	t.Helper()
	if len(rc.GetVirtualHosts()) != 1 {
		t.Fatalf("route configuration %v: want one virtual host", rc)
	}
	rts := rc.GetVirtualHosts()[0].GetRoutes()
	out := make([]methodRoute, 0, len(rts))
	for i, r := range rts {
		m := r.GetMatch()
		catchAll := m.GetPathSpecifier() != nil && m.GetPrefix() == "" && m.GetPath() == ""
		if r.GetRoute().GetCluster() != rc.GetName() || catchAll != (i == len(rts)-1) || (!catchAll && m.GetPath() == "") {
			t.Fatalf("route %d of %d: %v: want an exact path, or last the catch-all, to cluster %s", i, len(rts), r, rc.GetName())
		}
		f := new(fault.HTTPFault)
		if err := r.GetTypedPerFilterConfig()[FaultFilterName].UnmarshalTo(f); err != nil {
			t.Fatalf("route %d: fault override: %v", i, err)
		}
		if f.GetAbort().GetGrpcStatus() != uint32(AbortGRPCStatus) || f.GetAbort().GetPercentage().GetDenominator() != typev3.FractionalPercent_MILLION {
			t.Fatalf("route %d: abort %v: want gRPC status 8 per million", i, f.GetAbort())
		}
		out = append(out, methodRoute{path: m.GetPath(), ppm: f.GetAbort().GetPercentage().GetNumerator()})
	}
	return out
}

const (
	pay    = "/shop.Checkout/Pay"
	refund = "/shop.Checkout/Refund"
)

// methodsPolicy is checkout's inbound policy declaring Pay and Refund:
// web's Pay leaf is enforced upstream at payRatio, its Refund leaf listed
// at 0, its _other leaf enforced at 0.1; mobile's Pay leaf is plain shadow
// (served 0), its _other at 0.2. A bucket of procedure "", which such a
// policy never carries, would be ignored.
func methodsPolicy(payRatio float64) *sluicev1.DropPolicy {
	limit := 5.0
	return &sluicev1.DropPolicy{
		Name: "callee/checkout", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Procedures: []string{pay, refund},
		Peers: []*sluicev1.PeerPolicy{
			{Peer: "mobile", Procedure: pay, DropRatio: 0.5, Mode: sluicev1.Mode_MODE_SHADOW},
			{Peer: "mobile", Procedure: names.Other, DropRatio: 0.2, Mode: sluicev1.Mode_MODE_ENFORCE},
			{Peer: "web", DropRatio: 0.9, Mode: sluicev1.Mode_MODE_ENFORCE},
			{Peer: "web", Procedure: pay, DropRatio: payRatio, Mode: sluicev1.Mode_MODE_SHADOW, EnforcedUpstream: true},
			{Peer: "web", Procedure: refund, DropRatio: 0, LimitRps: &limit, Mode: sluicev1.Mode_MODE_SHADOW, EnforcedUpstream: true},
			{Peer: "web", Procedure: names.Other, DropRatio: 0.1, Mode: sluicev1.Mode_MODE_ENFORCE},
			{Peer: "web", Procedure: "/shop.Checkout/Gone", DropRatio: 0.7, Mode: sluicev1.Mode_MODE_ENFORCE}, // not declared
		},
	}
}

// A callee that declares gRPC methods is served one route per method, at
// its leaf's ratio, then the catch-all at the caller's names.Other leaf;
// a caller with no leaf listed gets every route at 0. RTDS carries none of
// it.
func TestProxylessRoutesPerMethod(t *testing.T) {
	s := newServerOpts(t, Options{Proxyless: Endpoints{"checkout": {"127.0.0.1:8080"}}})
	publish(t, s, methodsPolicy(0.8))
	addr := serve(t, s)

	want := func(payPPM, refundPPM, otherPPM uint32) []methodRoute {
		return []methodRoute{{pay, payPPM}, {refund, refundPPM}, {"", otherPPM}}
	}
	web := newADSSub(t, addr, &core.Node{Id: "web-1", Cluster: "web"})
	unmarshal(t, web.subscribe(resourcev3.ListenerType, "checkout"), new(listener.Listener))
	rr := web.subscribe(resourcev3.RouteType, "checkout")
	if got := methodRoutes(t, unmarshal(t, rr, new(route.RouteConfiguration))); !slices.Equal(got, want(800000, 0, 100000)) {
		t.Fatalf("web → checkout routes %v, want %v", got, want(800000, 0, 100000))
	}
	for caller, w := range map[string][]methodRoute{"mobile": want(0, 0, 200000), "batch": want(0, 0, 0)} {
		sub := newADSSub(t, addr, &core.Node{Id: caller + "-1", Cluster: caller})
		if got := methodRoutes(t, unmarshal(t, sub.subscribe(resourcev3.RouteType, "checkout"), new(route.RouteConfiguration))); !slices.Equal(got, w) {
			t.Errorf("%s → checkout routes %v, want %v", caller, got, w)
		}
	}

	// A leaf's move of under one ppm sends nothing; of one ppm, the next
	// route version.
	s.dp.proxyless.mu.Lock()
	v0 := int(s.dp.proxyless.next) // the last version handed out, to any caller
	s.dp.proxyless.mu.Unlock()
	publish(t, s, methodsPolicy(0.8000004))
	publish(t, s, methodsPolicy(0.800001))
	r := web.recv()
	if got := methodRoutes(t, unmarshal(t, r, new(route.RouteConfiguration))); r.GetTypeUrl() != resourcev3.RouteType || !slices.Equal(got, want(800001, 0, 100000)) {
		t.Fatalf("after Pay moved by 1 ppm: %s %v, want RDS %v", r.GetTypeUrl(), got, want(800001, 0, 100000))
	}
	if v1 := versionN(t, r.GetVersionInfo()); v1 != v0+1 {
		t.Errorf("route versions %d, %d: want the 1 ppm move the next version, the smaller one none", v0, v1)
	}

	// The callee stops declaring procedures: one route again, web's bucket.
	publish(t, s, calleePolicy("checkout", map[string]float64{"web": 0.3}))
	r = web.recv()
	if got := methodRoutes(t, unmarshal(t, r, new(route.RouteConfiguration))); !slices.Equal(got, []methodRoute{{"", 300000}}) {
		t.Errorf("without procedures web → checkout routes %v, want the one catch-all at 300000", got)
	}

	// Envoy's runtime keys are per caller: a callee with procedures has
	// an empty layer.
	publish(t, s, methodsPolicy(0.8))
	envoy := newADSSub(t, addr, &core.Node{Id: "checkout-envoy-1", Cluster: "checkout"})
	if f := unmarshal(t, envoy.subscribe(RuntimeTypeURL, RuntimeLayerName("checkout")), new(runtime.Runtime)).GetLayer().GetFields(); len(f) != 0 {
		t.Errorf("runtime layer of a callee with procedures: %v, want empty", f)
	}
}

// A callee with HTTP routes is served as before procedures: one route, at
// 0 (its procedures are not methods, and the limits refuse enforcement
// upstream on it). At most routes.MaxRoutes methods get a route, only
// gRPC full methods, each once.
func TestProxylessMethodsBounded(t *testing.T) {
	routed := methodsPolicy(0.8)
	routed.Routes = []*sluicev1.Route{{Pattern: "POST /shop.Checkout/Pay", Procedure: pay}}
	lr := newLeafRatios(routed)
	for _, peer := range routed.GetPeers() {
		lr.set(peer.GetPeer(), peer.GetProcedure(), servedRatio(peer))
	}
	cp := newCalleePPM(lr)
	if rc := proxylessRoute("checkout", cp.methods, cp.zero); len(cp.methods) != 0 || len(cp.ppm) != 0 ||
		!slices.Equal(methodRoutes(t, rc), []methodRoute{{"", 0}}) {
		t.Errorf("routed callee: methods %q, ppm %v; want none: one route at 0", cp.methods, cp.ppm)
	}

	many := &sluicev1.DropPolicy{Name: "callee/checkout", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND}
	for i := range routes.MaxRoutes + 10 {
		many.Procedures = append(many.Procedures, fmt.Sprintf("/s.S/M%d", i))
	}
	many.Procedures = append([]string{"create-charge", "/s.S/M0"}, many.Procedures...)
	lr = newLeafRatios(many)
	lr.set("web", "/s.S/M3", 0.5)
	lr.set("web", names.Other, 0.25)
	lr.set("web", fmt.Sprintf("/s.S/M%d", routes.MaxRoutes+5), 0.9) // past the bound: no route
	cp = newCalleePPM(lr)
	rts := methodRoutes(t, proxylessRoute("checkout", cp.methods, cp.ppm["web"]))
	if len(rts) != routes.MaxRoutes+1 || rts[0].path != "/s.S/M0" || rts[1].path != "/s.S/M1" {
		t.Fatalf("%d routes starting %v, want %d from /s.S/M0, each once, create-charge none", len(rts), rts[:2], routes.MaxRoutes+1)
	}
	for i, r := range rts {
		w := uint32(0)
		switch i {
		case 3:
			w = 500000
		case len(rts) - 1:
			w = 250000
		}
		if r.ppm != w {
			t.Errorf("route %d (%s) at %d ppm, want %d", i, r.path, r.ppm, w)
		}
	}
}
