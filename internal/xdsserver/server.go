// Package xdsserver serves sluice's DropPolicy resources over ADS with go-control-plane.
//
// The controller publishes one DropPolicy per enforcing service ("callee/<svc>",
// "caller/<svc>"); sidecars and zone relays subscribe to them by name, over
// delta or state-of-the-world (SotW) xDS. A go-control-plane LinearCache holds
// the table: it works for custom types (SnapshotCache does not), indexes named
// subscriptions, and sends each stream only the resources that changed.
package xdsserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/config"
	"github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/recvfail"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Options configure a Server. The zero value is usable.
type Options struct {
	// Logger receives stream and NACK events; nil discards them.
	Logger *slog.Logger
	// Registerer receives the server's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Proxyless lists the callees served to proxyless gRPC clients and
	// their backends (see dataplanes.go); it must pass Validate. RTDS
	// layers for Envoy are served for every callee regardless.
	Proxyless Endpoints
	// RequirePeerIdentity, set under mutual TLS, serves each stream only
	// what its peer's identity may have (see authz.go).
	RequirePeerIdentity bool
	// Shard is the controller's shard; a sharded server answers a request
	// for another shard's callee with where to go (moved.go).
	Shard shard.Map
}

// Server holds the DropPolicy table and serves it over ADS. Its methods are
// safe for concurrent use.
type Server struct {
	log   *slog.Logger
	cache *cache.LinearCache
	dp    *dataplanes // proxyless gRPC and RTDS resources, derived in Update
	xds   serverv3.Server
	ctx   context.Context
	m     metrics
	bad   recvfail.Log // streams ended on a message; one line a minute per reason

	streams atomic.Int64

	// deltaNodes maps open delta stream ids to their node, for NACK logs:
	// the node comes only in a stream's first request, and go-control-plane
	// copies it into later ones only after OnStreamDeltaRequest (SotW copies
	// it before OnStreamRequest).
	deltaNodesMu sync.Mutex
	deltaNodes   map[int64]*core.Node

	// ready is closed by the first Update. Streams wait for it: a controller
	// that has just started has an empty table, and a delta client resuming
	// with initial_resource_versions would otherwise be told that every
	// policy it holds was removed (LinearCache answers a known version of a
	// missing resource with removed_resources).
	ready     chan struct{}
	readyOnce sync.Once

	shard   shard.Map
	movedMu sync.Mutex
	moved   map[string]bool // the names answerMoved answered
}

// New returns a Server with an empty table. ctx bounds go-control-plane's
// stream handlers: once it is done they return and their streams end.
// Streams opened before the first Update wait for it (so a GracefulStop
// before the first Update waits until ctx is done or the clients leave).
func New(ctx context.Context, opts Options) *Server {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		log:   logger,
		ctx:   ctx,
		m:     newMetrics(opts.Registerer, logger),
		ready: make(chan struct{}),

		deltaNodes: make(map[int64]*core.Node),
		shard:      opts.Shard,
		moved:      map[string]bool{},
	}
	cpLog := cpLogger{logger.With("component", "go-control-plane")}
	// The version prefix is unique per Server. A SotW client that reconnects
	// with a version from another controller replica or an earlier process
	// then always gets an answer, even when none of its resources exist here.
	prefix := instancePrefix()
	s.cache = cache.NewLinearCache(names.DropPolicyType,
		cache.WithVersionPrefix(prefix),
		cache.WithLogger(cpLog))
	s.dp = newDataplanes(ctx, opts.Proxyless, prefix, cpLog)
	s.xds = serverv3.NewServer(ctx, s.dp.mux(s.cache), withAuthz(opts, callbacks{s}, logger),
		sotw.WithLogger(cpLog),
		// A request naming no resource subscribes to nothing instead of to
		// everything: wildcard watches make LinearCache walk the whole table
		// per stream per update, and a sidecar never needs one. An explicit
		// "*" still works, for tools.
		config.DeactivateLegacyWildcard())
	return s
}

// StreamInterceptor counts the ADS streams that end on a message the
// server can not take (too large, not decodable), by reason, and logs them
// at most once a minute per reason: go-control-plane's handlers see only a
// Recv error. Install it on the gRPC server that Register registers on.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return recvfail.StreamInterceptor("/"+discovery.AggregatedDiscoveryService_ServiceDesc.ServiceName+"/",
		func(ctx context.Context, method, reason string, err error) {
			s.m.badMessages.WithLabelValues(reason).Inc()
			s.bad.Note(ctx, s.log, method, reason, err)
		})
}

// Register registers the aggregated discovery service, which serves both
// SotW (StreamAggregatedResources) and delta (DeltaAggregatedResources).
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
}

// Update applies one controller tick: changed resources are set, deleted
// ones removed, as one cache version with one notification pass, so every
// stream receives at most one response per tick and only the resources that
// changed. Each key must equal its policy's name, because SotW clients learn
// the name from the message alone. On a validation error nothing is applied.
//
// The server keeps the policies it is given; the caller must not modify them
// afterwards (they are marshalled lazily, when first sent).
//
// The first Update opens the gate for waiting streams, so it should carry the
// whole table: a resource missing from it reads as removed to resuming delta
// clients.
//
// SotW clients are not told about deletions of a custom type: LinearCache
// sends nothing for them. Delta clients get removed_resources.
func (s *Server) Update(changed map[string]*sluicev1.DropPolicy, deleted []string) error {
	var errs []error
	res := make(map[string]types.Resource, len(changed))
	for name, p := range changed {
		switch {
		case name == "":
			errs = append(errs, errors.New("update resource: empty name"))
		case p == nil:
			errs = append(errs, fmt.Errorf("update resource %q: nil policy", name))
		case p.GetName() != name:
			errs = append(errs, fmt.Errorf("update resource %q: policy is named %q", name, p.GetName()))
		default:
			res[name] = p
		}
	}
	for _, name := range deleted {
		if _, ok := changed[name]; ok {
			errs = append(errs, fmt.Errorf("update resource %q: both changed and deleted", name))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := s.cache.UpdateResources(res, deleted); err != nil {
		return fmt.Errorf("update xds cache: %w", err)
	}
	// The policies are out whatever happens to the data-plane resources
	// derived from them, so an error there is reported, not a reason to
	// hold streams back.
	dpErr := s.dp.update(changed, deleted)
	s.m.updates.Inc()
	s.m.resources.Set(float64(s.cache.NumResources()))
	s.readyOnce.Do(func() { close(s.ready) })
	if dpErr != nil {
		return fmt.Errorf("update data-plane resources: %w", dpErr)
	}
	return nil
}

// Streams returns the number of open ADS streams, SotW and delta.
func (s *Server) Streams() int { return int(s.streams.Load()) }

// Resources returns the number of resources in the table.
func (s *Server) Resources() int { return s.cache.NumResources() }

// waitReady blocks a new stream until the first Update, or until the stream
// or the server ends. An error closes the stream.
func (s *Server) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func instancePrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:]) + "-"
}

// callbacks implements go-control-plane's server callbacks. They run
// synchronously on the stream's goroutine, so they only count and log.
type callbacks struct{ s *Server }

var _ serverv3.Callbacks = callbacks{}

func (c callbacks) OnStreamOpen(ctx context.Context, _ int64, _ string) error {
	c.streamOpened()
	return c.s.waitReady(ctx)
}

// OnStreamClosed is called for every stream OnStreamOpen saw, even one whose
// OnStreamOpen returned an error.
func (c callbacks) OnStreamClosed(int64, *core.Node) { c.streamClosed() }

func (c callbacks) OnDeltaStreamOpen(ctx context.Context, _ int64, _ string) error {
	c.streamOpened()
	return c.s.waitReady(ctx)
}

func (c callbacks) OnDeltaStreamClosed(id int64, _ *core.Node) {
	c.s.deltaNodesMu.Lock()
	delete(c.s.deltaNodes, id)
	c.s.deltaNodesMu.Unlock()
	c.streamClosed()
}

func (c callbacks) OnStreamRequest(id int64, req *discovery.DiscoveryRequest) error {
	c.s.m.requestsSotW.Inc()
	if err := c.s.answerMoved(req.GetTypeUrl(), req.GetResourceNames()); err != nil {
		return err
	}
	if d := req.GetErrorDetail(); d != nil {
		c.nack("sotw", id, req.GetNode(), req.GetResponseNonce(), d.GetMessage())
	}
	return nil
}

func (c callbacks) OnStreamResponse(context.Context, int64, *discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {
	c.s.m.responsesSotW.Inc()
}

func (c callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	c.s.m.requestsDelta.Inc()
	node := req.GetNode()
	c.s.deltaNodesMu.Lock()
	if node != nil {
		c.s.deltaNodes[id] = node
	} else {
		node = c.s.deltaNodes[id]
	}
	c.s.deltaNodesMu.Unlock()
	if err := c.s.answerMoved(req.GetTypeUrl(), req.GetResourceNamesSubscribe()); err != nil {
		return err
	}
	if len(req.GetInitialResourceVersions()) > 0 {
		if err := c.s.answerMoved(req.GetTypeUrl(), slices.Collect(maps.Keys(req.GetInitialResourceVersions()))); err != nil {
			return err
		}
	}
	if d := req.GetErrorDetail(); d != nil {
		c.nack("delta", id, node, req.GetResponseNonce(), d.GetMessage())
	}
	return nil
}

func (c callbacks) OnStreamDeltaResponse(int64, *discovery.DeltaDiscoveryRequest, *discovery.DeltaDiscoveryResponse) {
	c.s.m.responsesDelta.Inc()
}

// Fetch (REST xDS) is not registered; LinearCache does not implement it.
func (c callbacks) OnFetchRequest(context.Context, *discovery.DiscoveryRequest) error {
	return errors.New("fetch is not supported")
}

func (c callbacks) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

func (c callbacks) streamOpened() {
	c.s.streams.Add(1)
	c.s.m.streams.Inc()
}

func (c callbacks) streamClosed() {
	c.s.streams.Add(-1)
	c.s.m.streams.Dec()
}

// nack logs a rejected response. A NACK means a sidecar keeps an older
// policy, so it is worth a warning; it happens at most once per response.
func (c callbacks) nack(protocol string, stream int64, node *core.Node, nonce, detail string) {
	c.s.m.nacks.Inc()
	c.s.log.Warn("xds client rejected a response",
		"protocol", protocol, "stream", stream, "node_id", node.GetId(),
		"cluster", node.GetCluster(), "nonce", nonce, "error_detail", detail)
}

// cpLogger adapts slog to go-control-plane's logger. LinearCache logs every
// watch it opens at Info, which is per request; those go to Debug here.
type cpLogger struct{ l *slog.Logger }

func (l cpLogger) Debugf(format string, args ...any) { l.logf(slog.LevelDebug, format, args) }
func (l cpLogger) Infof(format string, args ...any)  { l.logf(slog.LevelDebug, format, args) }
func (l cpLogger) Warnf(format string, args ...any)  { l.logf(slog.LevelWarn, format, args) }
func (l cpLogger) Errorf(format string, args ...any) { l.logf(slog.LevelError, format, args) }

func (l cpLogger) logf(level slog.Level, format string, args []any) {
	// Formatting is skipped when the level is off: the debug lines are many.
	if !l.l.Enabled(context.Background(), level) {
		return
	}
	l.l.Log(context.Background(), level, fmt.Sprintf(format, args...))
}
