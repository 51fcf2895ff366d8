// Package controller is sluice's global controller: it sums the zone loads
// its aggregators stream to it, runs the control law every tick against the
// limits in force, and serves the resulting DropPolicy resources over xDS.
//
// The logic lives in State, which takes time as an argument and does no I/O;
// Service wraps it with gRPC streams, a ticker, metrics and the xDS server.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/recvfail"
	"github.com/sluicehq/sluice/internal/ticker"
	"github.com/sluicehq/sluice/internal/xdsserver"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/internal/zonewire"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/liveness"
	"github.com/sluicehq/sluice/pkg/shard"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// Config is the controller's configuration.
type Config struct {
	// ID names this replica in logs; default hostname.
	ID string
	// Tick is how often the control law runs.
	Tick time.Duration
	// Proxyless lists the callees served to proxyless gRPC clients, with
	// their backends (--proxyless-endpoints); empty serves none.
	Proxyless xdsserver.Endpoints
	// RequirePeerIdentity, set under mutual TLS, takes zone loads only from
	// aggregator identities (of the load's zone, when the identity names
	// one) and serves each xDS stream only its peer's own policies.
	RequirePeerIdentity bool
	StateConfig
}

// DefaultConfig returns the defaults README lists for the controller.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ID:   host,
		Tick: time.Second,
		StateConfig: StateConfig{
			StaleAfter: 3,
			Warmup:     5 * time.Second,
			// Long enough to outlive a restart: a policy is up to half a
			// TTL old when the controller dies (refreshes come every half
			// TTL), and a restarted controller publishes a warm-up after
			// it starts. 30s leaves 10s for the restart itself; at 10s
			// there was none (TestFaultControllerKilledAndRestarted).
			PolicyTTL:           30 * time.Second,
			FailOpenDecay:       30 * time.Second,
			RepublishThreshold:  0.005,
			MaxAggregators:      1000,
			MaxDescriptorValues: DefaultMaxDescriptorValues,
			DescriptorHold:      30 * time.Second,
			CostPayback:         DefaultCostPayback,
			Law:                 dropratio.DefaultConfig(),
		},
	}
}

// RestartMargin is how long a restart of the controller may take before
// the policies sidecars hold can expire: a policy is re-issued every half
// TTL, so it may be that old at the crash, and a restarted controller
// publishes a warm-up after it starts.
func (c Config) RestartMargin() time.Duration { return c.PolicyTTL/2 - c.Warmup }

// Validate reports every bad field at once.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Tick >= 10*time.Millisecond && c.Tick <= time.Minute, "tick: %v is outside [10ms, 1m]", c.Tick)
	check(c.StaleAfter >= 1 && c.StaleAfter <= 100, "stale-after: %d is outside [1, 100]", c.StaleAfter)
	check(c.Warmup >= 0 && c.Warmup <= 10*time.Minute, "warmup: %v is outside [0, 10m]", c.Warmup)
	check(c.PolicyTTL >= 2*c.Tick, "policy-ttl: %v must be at least two ticks (%v)", c.PolicyTTL, 2*c.Tick)
	check(c.FailOpenDecay >= 0, "fail-open-decay: %v is negative", c.FailOpenDecay)
	check(c.RepublishThreshold >= 0 && c.RepublishThreshold < 1, "republish-threshold: %v is outside [0, 1)", c.RepublishThreshold)
	check(c.MaxAggregators >= 1, "max-aggregators: %d must be at least 1", c.MaxAggregators)
	check(c.MaxDescriptorValues >= 1 && c.MaxDescriptorValues <= MaxDescriptorValuesBound,
		"max-descriptor-values: %d is outside [1, %d]", c.MaxDescriptorValues, MaxDescriptorValuesBound)
	check(c.DescriptorHold >= 0 && c.DescriptorHold <= maxDescriptorHold, "descriptor-hold: %v is outside [0, %v]", c.DescriptorHold, maxDescriptorHold)
	if c.Shard != (shard.Map{}) {
		if err := c.Shard.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	check(c.CostPayback > 0 && c.CostPayback <= 10*time.Minute, "cost-payback: %v is outside (0, 10m]", c.CostPayback)
	// The law's own Validate names its Go fields; the flags are what an
	// operator typed. It runs again in dropratio.New as the last word.
	check(c.Law.PMax > 0 && c.Law.PMax < 1, "p-max: %v is outside (0, 1)", c.Law.PMax)
	check(c.Law.MinRate >= 0 && !math.IsInf(c.Law.MinRate, 0), "min-rate: %v must be a finite rate >= 0", c.Law.MinRate)
	check(c.Law.ReleaseRate > 1 && !math.IsInf(c.Law.ReleaseRate, 0), "release-rate: %v must be a finite factor > 1", c.Law.ReleaseRate)
	check(c.Law.OpenBelow >= 0 && c.Law.OpenBelow < 1, "open-below: %v is outside [0, 1)", c.Law.OpenBelow)
	if err := c.Proxyless.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("proxyless-endpoints: %w", err))
	}
	return errors.Join(errs...)
}

// Service runs the controller. Its methods are safe for concurrent use.
type Service struct {
	sluicev1.UnimplementedZoneLoadServiceServer

	cfg    Config
	log    *slog.Logger
	limits limits.Source
	m      *metrics

	ticks     *ticker.Ticker // the tick loop; poked on a surge
	xds       *xdsserver.Server
	stopXDS   context.CancelFunc
	draining  chan struct{} // closed by Drain: zone streams end
	drainOnce sync.Once

	recorder *Recorder // nil without a history store; set before Run

	badMsgLog recvfail.Log // zone loads that ended their stream undecoded

	mu      sync.Mutex // protects state and streams
	state   *State
	streams map[string]int64 // aggregator id → the stream that owns it
	nextID  int64

	published bool // tick's: whether an Update has opened the xDS gate
}

// New builds a controller that reads limits from src.
func New(cfg Config, src limits.Source, logger *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid controller config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	state, err := NewState(cfg.StateConfig, time.Now())
	if err != nil {
		return nil, err
	}
	xctx, stopXDS := context.WithCancel(context.Background())
	s := &Service{
		cfg:    cfg,
		log:    logger,
		limits: src,
		m:      newMetrics(reg),
		xds: xdsserver.New(xctx, xdsserver.Options{Logger: logger, Registerer: reg, Proxyless: cfg.Proxyless,
			RequirePeerIdentity: cfg.RequirePeerIdentity, Shard: cfg.Shard}),
		stopXDS:  stopXDS,
		draining: make(chan struct{}),
		ticks:    ticker.New(cfg.Tick, ticker.MinGap(cfg.Tick)).Aligned(),
		state:    state,
		streams:  map[string]int64{},
	}
	s.m.shard.Set(float64(cfg.Shard.Index))
	s.m.shards.Set(float64(max(cfg.Shard.Count, 1)))
	return s, nil
}

// ServerOptions are what a controller's gRPC server needs beside TLS and
// the service's interceptor: room for a fleet-sized zone load, zone loads
// decoded by zonewire, and the keepalives every sluice server uses.
func ServerOptions() []grpc.ServerOption {
	return append([]grpc.ServerOption{grpc.MaxRecvMsgSize(zoneload.MaxMessageSize), zonewire.ServerOption()}, liveness.ServerOptions()...)
}

// Register adds the zone-load service and the xDS (ADS) service to g.
func (s *Service) Register(g *grpc.Server) {
	sluicev1.RegisterZoneLoadServiceServer(g, s)
	s.xds.Register(g)
}

// StreamInterceptor is the interceptor the gRPC server that Register
// registers on must install: it counts the xDS streams that end on a
// message the server can not take (the zone-load stream counts its own).
func (s *Service) StreamInterceptor() grpc.StreamServerInterceptor { return s.xds.StreamInterceptor() }

// RecordTo makes every tick's bucket loads go to r, the minute-row
// recorder of the history store. Call it before Run.
func (s *Service) RecordTo(r *Recorder) { s.recorder = r }

// Ready says why the controller can not serve yet: its limits are not
// loaded, or it is still warming up.
func (s *Service) Ready() error {
	if err := s.limitsReady(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.state.Warm(time.Now()) {
		return errors.New("warming up: collecting zone loads before publishing")
	}
	return nil
}

// limitsReady is nil when the limits source has limits to serve. A source
// that reads a database has none until its first read, and publishing
// without limits would open every gate.
func (s *Service) limitsReady() error {
	if r, ok := s.limits.(interface{ Ready() error }); ok {
		return r.Ready()
	}
	return nil
}

// Drain ends every zone and xDS stream so that a graceful stop does not
// wait for streams that never end by themselves. Idempotent.
func (s *Service) Drain() {
	s.drainOnce.Do(func() {
		close(s.draining)
		s.stopXDS()
	})
}

// Run ticks every Tick, and soon after a zone load shows a surge, until ctx
// is cancelled.
func (s *Service) Run(ctx context.Context) error {
	defer s.Drain()
	s.ticks.Run(ctx, s.tick)
	return nil
}

func (s *Service) tick(now time.Time) {
	if err := s.limitsReady(); err != nil {
		return
	}
	set := s.limits.Limits()
	start := time.Now()
	s.mu.Lock()
	res := s.state.Tick(now, set)
	s.mu.Unlock()
	for _, id := range res.Stale {
		s.log.Warn("aggregator went silent; its zone load left the sums", "aggregator_id", id)
	}
	s.m.noteRefused(s.log, res.RefusedClaims, now)
	s.m.noteShed(s.log, res.Shed, now)
	if s.recorder != nil && res.Warm {
		s.recorder.Observe(now, res.Loads)
	}
	// The first warm tick opens the xDS gate even with nothing to publish:
	// a shard that owns no callee yet still answers the sidecars that ask
	// it for one (with where to go instead).
	if len(res.Changed) > 0 || len(res.Deleted) > 0 || (res.Warm && !s.published) {
		s.published = true
		if err := s.xds.Update(res.Changed, res.Deleted); err != nil {
			s.log.Error("publish policies", "err", err)
			s.m.publishErrors.Inc()
		}
	}
	s.m.observeTick(res, set, time.Since(start))
}

// StreamZoneLoads takes one aggregator's flushes until it disconnects or the
// controller drains.
func (s *Service) StreamZoneLoads(stream grpc.BidiStreamingServer[sluicev1.StreamZoneLoadsRequest, sluicev1.StreamZoneLoadsResponse]) error {
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	s.mu.Lock()
	s.nextID++
	streamID := s.nextID
	s.mu.Unlock()
	owned := map[string]bool{}
	// The peer's identity is fixed for the stream: read it once.
	var (
		peer    identity.ID
		peerErr error
	)
	if s.cfg.RequirePeerIdentity {
		peer, peerErr = identity.Peer(stream.Context())
	}
	defer func() {
		s.mu.Lock()
		for id := range owned {
			// Another stream may have taken the aggregator over since
			// (it reconnected before this one noticed it was dead).
			if s.streams[id] == streamID {
				delete(s.streams, id)
				s.state.Remove(id)
			}
		}
		s.mu.Unlock()
	}()

	// Recv blocks; a goroutine feeds it to the loop so that Drain can end the
	// stream. It ends when the handler returns and the stream's context ends.
	type recv struct {
		req *sluicev1.StreamZoneLoadsRequest
		err error
	}
	reqs := make(chan recv)
	ctx := stream.Context()
	go func() {
		for {
			req, err := stream.Recv()
			if reason := recvfail.Reason(err); reason != "" {
				// Larger than the gRPC server's receive limit, or not
				// decodable: the stream ends. Counted here: the handler
				// may see the stream's end first.
				s.m.rejected.WithLabelValues(reason).Inc()
				s.badMsgLog.Note(ctx, s.log, "zone loads", reason, err)
			}
			select {
			case reqs <- recv{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r recv
		select {
		case <-s.draining:
			return status.Error(codes.Unavailable, "controller shutting down")
		case <-ctx.Done():
			return ctx.Err()
		case r = <-reqs:
		}
		if r.err != nil {
			return nil // the aggregator went away; its load goes with it
		}
		resp := s.applyZoneLoad(r.req.GetLoad(), peer, peerErr, streamID, owned)
		if err := stream.Send(resp); err != nil {
			return nil
		}
	}
}

// applyZoneLoad takes one zone load of stream streamID, whose peer is peer
// (or peerErr), and answers it; owned collects the aggregators the stream
// has spoken for, which leave the sums when it ends.
func (s *Service) applyZoneLoad(load *sluicev1.ZoneLoad, peer identity.ID, peerErr error, streamID int64, owned map[string]bool) *sluicev1.StreamZoneLoadsResponse {
	var err error
	if s.cfg.RequirePeerIdentity {
		err = authorizeZoneLoad(peer, peerErr, load)
	}
	// Checked on this aggregator's stream, outside the lock: the check is
	// most of Apply, and each stream's runs on its own core.
	var checked CheckedLoad
	if err == nil {
		checked, err = CheckZoneLoad(s.cfg.StateConfig, load)
	}
	s.mu.Lock()
	if err == nil {
		err = s.state.ApplyChecked(checked, time.Now())
	}
	if err == nil {
		s.streams[load.GetAggregatorId()] = streamID
		owned[load.GetAggregatorId()] = true
	}
	urgent := s.state.TakeUrgent()
	dropped := s.state.TakeDropped()
	s.mu.Unlock()
	s.m.noteDropped(s.log, dropped, time.Now())
	if urgent {
		// A surge: run the law now rather than at the next tick.
		s.ticks.Poke()
	}
	resp := &sluicev1.StreamZoneLoadsResponse{Accepted: err == nil, Shard: ShardInfo(s.cfg.Shard, true)}
	if err != nil {
		var rej *RejectError
		reason := "invalid"
		if errors.As(err, &rej) {
			reason = rej.Reason
		}
		s.m.rejected.WithLabelValues(reason).Inc()
		resp.RejectReason = err.Error()
	} else {
		s.m.accepted.Inc()
	}
	return resp
}

// authorizeZoneLoad takes a zone load only from an aggregator identity, and
// only for the zone its identity names, if it names one: a sidecar, or the
// aggregator of another zone, must not be able to speak for a zone.
func authorizeZoneLoad(peer identity.ID, peerErr error, load *sluicev1.ZoneLoad) error {
	switch {
	case peerErr != nil:
		return &RejectError{Reason: "identity_mismatch", Detail: peerErr.Error()}
	case peer.Kind != identity.Aggregator:
		return &RejectError{Reason: "identity_mismatch", Detail: fmt.Sprintf("peer %s is a %v, not an aggregator", peer.URI, peer.Kind)}
	case peer.Zone != "" && load.GetZone() != peer.Zone:
		return &RejectError{Reason: "identity_mismatch", Detail: fmt.Sprintf("peer %s may speak for zone %q only, the load is for %q", peer.URI, peer.Zone, uplink.Truncate(load.GetZone()))}
	}
	return nil
}

// Policies returns the policies last published.
func (s *Service) Policies() []*sluicev1.DropPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.Policies()
}

// XDSStreams is the number of open xDS streams.
func (s *Service) XDSStreams() int { return s.xds.Streams() }

// PoliciesHandler serves the published policies as JSON, for operators
// (mounted at /debug/sluice/policies on the admin port).
func (s *Service) PoliciesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "[")
		for i, p := range s.Policies() {
			if i > 0 {
				fmt.Fprint(w, ",")
			}
			b, err := protojson.Marshal(p)
			if err != nil {
				continue
			}
			w.Write(b)
		}
		fmt.Fprintln(w, "]")
	})
}
