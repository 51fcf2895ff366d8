package xdsserver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// authz refuses, under mutual TLS, every subscription a stream's peer may
// not have. A workload (a sidecar, an Envoy, a proxyless client) may have
// only its own service's resources: the DropPolicies callee/<svc> and
// caller/<svc>, the RTDS layer of <svc>, and proxyless resources for a node
// whose cluster is <svc> (an empty cluster included: proxyless resources
// are served per node cluster, and a node without one would get the
// "unknown" caller's ratios, which are not its own). A sluice aggregator or
// controller (a zone relay, a tool) may have anything, wildcards included. Refusing ends the stream
// with PERMISSION_DENIED: a client that asks for what it may not have is
// misconfigured or hostile, and either way should hear it at once.
//
// It wraps the server's own callbacks, so that serving code need not know
// about identities. Its methods are safe for concurrent use.
type authz struct {
	serverv3.Callbacks
	log    *slog.Logger
	denied *prometheus.CounterVec

	mu    sync.Mutex            // guards sotw, delta and nodes
	sotw  map[int64]identity.ID // open SotW streams' peers
	delta map[int64]identity.ID // open delta streams' peers (ids are per protocol)
	// nodes holds the node of each open delta stream, from the last
	// request that named one: go-control-plane hands the delta callback a
	// request as received, and a client names its node in the first
	// request only, while the cache keys the later ones by it all the
	// same. (SotW requests reach the callback with the node filled in.)
	nodes map[int64]*core.Node
}

// Reasons of sluice_controller_xds_denied_total.
const (
	DeniedNoIdentity = "no_identity"   // no verified client certificate
	DeniedResource   = "resource"      // a resource of another service, or a wildcard
	DeniedNode       = "node_cluster"  // a node claiming another service
	DeniedKind       = "identity_kind" // an identity sluice does not serve
)

// withAuthz returns cb itself when opts do not ask for identities
// (plaintext), else cb behind an authz.
func withAuthz(opts Options, cb serverv3.Callbacks, log *slog.Logger) serverv3.Callbacks {
	if !opts.RequirePeerIdentity {
		return cb
	}
	denied := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "sluice", Subsystem: "controller_xds", Name: "denied_total",
		Help: "xDS streams ended because their peer asked for resources its identity may not have, by reason.",
	}, []string{"reason"})
	for _, r := range []string{DeniedNoIdentity, DeniedResource, DeniedNode, DeniedKind} {
		denied.WithLabelValues(r)
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(denied); err != nil {
			log.Warn("xds authorization metrics not registered", "err", err)
		}
	}
	return &authz{Callbacks: cb, log: log, denied: denied,
		sotw: map[int64]identity.ID{}, delta: map[int64]identity.ID{}, nodes: map[int64]*core.Node{}}
}

func (a *authz) open(streams map[int64]identity.ID, ctx context.Context, id int64) error {
	peer, err := identity.Peer(ctx)
	if err != nil {
		return a.deny(DeniedNoIdentity, identity.ID{}, "%v", err)
	}
	if peer.Kind != identity.Workload && peer.Kind != identity.Aggregator && peer.Kind != identity.Controller {
		return a.deny(DeniedKind, peer, "identity kind %v", peer.Kind)
	}
	a.mu.Lock()
	streams[id] = peer
	a.mu.Unlock()
	return nil
}

func (a *authz) peer(streams map[int64]identity.ID, id int64) identity.ID {
	a.mu.Lock()
	defer a.mu.Unlock()
	return streams[id]
}

func (a *authz) close(streams map[int64]identity.ID, id int64) {
	a.mu.Lock()
	delete(streams, id)
	a.mu.Unlock()
}

func (a *authz) OnStreamOpen(ctx context.Context, id int64, typeURL string) error {
	if err := a.open(a.sotw, ctx, id); err != nil {
		return err
	}
	return a.Callbacks.OnStreamOpen(ctx, id, typeURL)
}

func (a *authz) OnDeltaStreamOpen(ctx context.Context, id int64, typeURL string) error {
	if err := a.open(a.delta, ctx, id); err != nil {
		return err
	}
	return a.Callbacks.OnDeltaStreamOpen(ctx, id, typeURL)
}

func (a *authz) OnStreamClosed(id int64, node *core.Node) {
	a.close(a.sotw, id)
	a.Callbacks.OnStreamClosed(id, node)
}

func (a *authz) OnDeltaStreamClosed(id int64, node *core.Node) {
	a.mu.Lock()
	delete(a.nodes, id)
	a.mu.Unlock()
	a.close(a.delta, id)
	a.Callbacks.OnDeltaStreamClosed(id, node)
}

func (a *authz) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	if err := a.check(a.peer(a.sotw, id), req.GetNode(), req.GetTypeUrl(), req.GetResourceNames()); err != nil {
		return err
	}
	return a.Callbacks.OnStreamRequest(id, req)
}

func (a *authz) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	// A delta stream names its node in the first request, usually only
	// there; the later ones are checked against it (see nodes).
	subscribed := req.GetResourceNamesSubscribe()
	for name := range req.GetInitialResourceVersions() {
		subscribed = append(subscribed, name)
	}
	a.mu.Lock()
	node := req.GetNode()
	if node != nil {
		a.nodes[id] = node
	} else {
		node = a.nodes[id]
	}
	a.mu.Unlock()
	if err := a.check(a.peer(a.delta, id), node, req.GetTypeUrl(), subscribed); err != nil {
		return err
	}
	return a.Callbacks.OnStreamDeltaRequest(id, req)
}

// check decides one request of a stream whose peer is p.
func (a *authz) check(p identity.ID, node *core.Node, typeURL string, resources []string) error {
	switch p.Kind {
	case identity.Aggregator, identity.Controller:
		return nil // relays and tools may read every policy
	case identity.Workload:
	default:
		return a.deny(DeniedNoIdentity, p, "stream has no verified identity")
	}
	if c := node.GetCluster(); c != "" && c != p.Service {
		return a.deny(DeniedNode, p, "node cluster %q is not the identity's service %q", uplink.Truncate(c), p.Service)
	}
	var own []string
	switch typeURL {
	case names.DropPolicyType:
		own = []string{names.Callee(p.Service), names.Caller(p.Service)}
	case RuntimeTypeURL:
		own = []string{RuntimeLayerName(p.Service)}
	default:
		// Proxyless listeners, routes, clusters and endpoints: served per
		// node cluster, checked above when set. Unset, the node would be
		// served the "unknown" caller's ratios: refused, so that a
		// workload is only ever served its own.
		if node.GetCluster() == "" {
			return a.deny(DeniedNode, p, "node has no cluster; proxyless resources of type %s are served per node cluster, which must be the identity's service %q", typeURL, p.Service)
		}
		return nil
	}
	for _, r := range resources {
		ok := false
		for _, o := range own {
			ok = ok || r == o
		}
		if !ok {
			return a.deny(DeniedResource, p, "resource %q of type %s is not service %q's", uplink.Truncate(r), typeURL, p.Service)
		}
	}
	return nil
}

// deny counts and logs a refusal and returns the stream's end. Refusals end
// streams, so they cannot be more frequent than stream opens.
func (a *authz) deny(reason string, p identity.ID, format string, args ...any) error {
	a.denied.WithLabelValues(reason).Inc()
	msg := fmt.Sprintf(format, args...)
	a.log.Warn("xds subscription refused", "reason", reason, "peer", p.URI, "detail", msg)
	return status.Errorf(codes.PermissionDenied, "peer %s: %s", p.URI, msg)
}
