package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/log"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// dataplanes serves the controller's ratios to data planes that do not run
// sluice's sidecar, on the same ADS server as the DropPolicies: proxyless
// gRPC clients (Listener, RouteConfiguration, Cluster, ClusterLoadAssignment
// per caller node) and Envoys (one RTDS runtime layer per callee). Both are
// derived from the inbound "callee/<svc>" policies of each Update, so they
// follow the same ticks, thresholds and refreshes, and change only when a
// bucket's abort fraction moves by at least one part per million.
type dataplanes struct {
	proxyless *proxyless
	rtds      *rtds
}

func newDataplanes(ctx context.Context, eps Endpoints, prefix string, logger log.Logger) *dataplanes {
	return &dataplanes{
		proxyless: newProxyless(ctx, eps, prefix, logger),
		rtds:      newRTDS(prefix, logger),
	}
}

// mux puts the DropPolicy cache and the data-plane caches behind one ADS
// server, by type URL. A type served by none of them ends the stream with
// an error naming it.
func (d *dataplanes) mux(policies cache.Cache) cache.Cache {
	route := func(typeURL string) string {
		switch typeURL {
		case resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType:
			return "proxyless"
		case RuntimeTypeURL:
			return "rtds"
		}
		return typeURL // names.DropPolicyType, or unknown
	}
	return &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return route(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return route(r.GetTypeUrl()) },
		Caches: map[string]cache.Cache{
			names.DropPolicyType: policies,
			"proxyless":          d.proxyless,
			"rtds":               d.rtds.cache,
		},
	}
}

// update derives the data-plane resources from one batch of DropPolicies.
// Inbound policies only: their peers are the callers of the policy's
// service. A shadow caller is served ratio 0: shadow means counted, never
// dropped. A caller enforced upstream is MODE_SHADOW on the wire only so
// that old sidecars do not drop it twice (PeerPolicy.enforced_upstream):
// these data planes are the upstream, and are served its ratio.
//
// A callee that declares procedures is served per leaf by the proxyless
// routes, one route per gRPC method (leafRatios), and gets nothing from
// RTDS: Envoy's runtime keys name the downstream cluster (the caller)
// only, so a layer could carry one ratio per caller, never one per
// (caller, procedure), and the limits refuse enforcement upstream where
// that would matter (a callee with HTTP routes). Its layer is empty.
func (d *dataplanes) update(changed map[string]*sluicev1.DropPolicy, deleted []string) error {
	ratios := make(map[string]map[string]float64, len(changed))
	leaves := make(map[string]leafRatios, len(changed))
	for name, p := range changed {
		if !strings.HasPrefix(name, names.CalleePrefix) || p.GetDirection() == sluicev1.Direction_DIRECTION_OUTBOUND {
			continue
		}
		callee := strings.TrimPrefix(name, names.CalleePrefix)
		lr := newLeafRatios(p)
		m := make(map[string]float64, len(p.GetPeers()))
		for _, peer := range p.GetPeers() {
			r := servedRatio(peer)
			if peer.GetProcedure() == "" && !lr.leaves {
				m[peer.GetPeer()] = r
			}
			lr.set(peer.GetPeer(), peer.GetProcedure(), r)
		}
		ratios[callee], leaves[callee] = m, lr
	}
	var gone []string
	for _, name := range deleted {
		if svc, ok := strings.CutPrefix(name, names.CalleePrefix); ok {
			gone = append(gone, svc)
		}
	}
	if len(ratios) == 0 && len(gone) == 0 {
		return nil
	}
	var errs []error
	if err := d.proxyless.update(leaves, gone); err != nil {
		errs = append(errs, fmt.Errorf("update proxyless routes: %w", err))
	}
	if err := d.rtds.update(ratios, gone); err != nil {
		errs = append(errs, fmt.Errorf("update runtime layers: %w", err))
	}
	return errors.Join(errs...)
}

// servedRatio is the ratio these data planes carry out for peer: its
// drop ratio, but 0 for a plain shadow bucket.
func servedRatio(peer *sluicev1.PeerPolicy) float64 {
	if peer.GetMode() == sluicev1.Mode_MODE_SHADOW && !peer.GetEnforcedUpstream() {
		return 0
	}
	return peer.GetDropRatio()
}

// leafRatios is one callee's ratios as the proxyless routes carry them:
// the gRPC methods with a route of their own, in the policy's order, and
// per caller the ratio of each, then of the catch-all route. A callee
// without procedures has no methods: its one route carries the caller's
// bucket. A callee with procedures has a route per declared method, and
// its catch-all route carries the caller's names.Other leaf, as a sidecar
// puts an undeclared method there.
type leafRatios struct {
	methods []string             // never modified once built
	index   map[string]int       // method → its index in methods
	callers map[string][]float64 // caller → len(methods)+1 ratios
	leaves  bool                 // the callee declares procedures
	routed  bool                 // the callee routes HTTP requests: nothing served
}

// newLeafRatios takes the declared procedures of p. Only gRPC full
// methods get a route: a proxyless client's call is nothing else. A
// callee with HTTP routes is served nothing (ratio 0 on its one route,
// as before procedures): its procedures are not methods, a gRPC route
// can not tell them apart, and the limits refuse enforcement upstream on
// it. At most routes.MaxRoutes methods, the limits' own bound, so a
// RouteConfiguration has at most routes.MaxRoutes+1 routes.
func newLeafRatios(p *sluicev1.DropPolicy) leafRatios {
	lr := leafRatios{callers: map[string][]float64{}, leaves: len(p.GetProcedures()) > 0, routed: len(p.GetRoutes()) > 0}
	if lr.routed {
		return lr
	}
	for _, proc := range p.GetProcedures() {
		if len(lr.methods) == routes.MaxRoutes {
			break
		}
		if _, dup := lr.index[proc]; dup || !routes.IsGRPCMethod(proc) {
			continue
		}
		if lr.index == nil {
			lr.index = map[string]int{}
		}
		lr.index[proc] = len(lr.methods)
		lr.methods = append(lr.methods, proc)
	}
	return lr
}

// set records caller's ratio r for procedure ("" for a callee without
// procedures). A leaf of an undeclared procedure is ignored, as a bucket
// of procedure "" is for a callee that declares procedures.
func (lr leafRatios) set(caller, procedure string, r float64) {
	i := len(lr.methods) // the catch-all route
	switch {
	case lr.routed:
		return
	case procedure == "" && !lr.leaves:
	case procedure == names.Other && lr.leaves:
	default:
		j, ok := lr.index[procedure]
		if !ok {
			return
		}
		i = j
	}
	rs := lr.callers[caller]
	if rs == nil {
		rs = make([]float64, len(lr.methods)+1)
		lr.callers[caller] = rs
	}
	rs[i] = r
}
