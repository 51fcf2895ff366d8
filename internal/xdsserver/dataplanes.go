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
func (d *dataplanes) update(changed map[string]*sluicev1.DropPolicy, deleted []string) error {
	ratios := make(map[string]map[string]float64, len(changed))
	for name, p := range changed {
		if !strings.HasPrefix(name, names.CalleePrefix) || p.GetDirection() == sluicev1.Direction_DIRECTION_OUTBOUND {
			continue
		}
		m := make(map[string]float64, len(p.GetPeers()))
		for _, peer := range p.GetPeers() {
			if peer.GetProcedure() != "" {
				// A leaf of a callee with procedures: these data
				// planes hold one ratio per caller, and the limits
				// refuse enforcement upstream for such a callee.
				continue
			}
			r := peer.GetDropRatio()
			if peer.GetMode() == sluicev1.Mode_MODE_SHADOW && !peer.GetEnforcedUpstream() {
				r = 0
			}
			m[peer.GetPeer()] = r
		}
		ratios[strings.TrimPrefix(name, names.CalleePrefix)] = m
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
	if err := d.proxyless.update(ratios, gone); err != nil {
		errs = append(errs, fmt.Errorf("update proxyless routes: %w", err))
	}
	if err := d.rtds.update(ratios, gone); err != nil {
		errs = append(errs, fmt.Errorf("update runtime layers: %w", err))
	}
	return errors.Join(errs...)
}
