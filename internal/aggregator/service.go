package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/recvfail"
	"github.com/sluicehq/sluice/internal/ticker"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// Config configures a Service. Start from DefaultConfig; New fills zero
// fields with their defaults too.
type Config struct {
	// ID identifies this aggregator instance to sidecars and the
	// controller. Default: hostname-pid.
	ID string
	// Zone is the zone every sidecar reporting here is accounted to.
	// Required.
	Zone string
	// FlushInterval is how often the zone's sums go to the controller.
	// Default 1s.
	FlushInterval time.Duration
	// StaleAfter is how many of its own report windows a sidecar may be
	// silent before it is dropped from the sums. Default 3.
	StaleAfter int
	// Controllers are the controller addresses, tried in order with
	// failover; with ControllerFanout, every one of them gets every flush.
	// Required.
	Controllers []string
	// ControllerFanout sends every flush to every address in Controllers,
	// each a replica: every replica then sums the same zone loads and,
	// deterministic, publishes the same ratios, so that a sidecar can take
	// its policy from any of them. Off, the addresses are one controller's
	// in failover order.
	ControllerFanout bool
	// ControllerShards is the shard count assumed at start when
	// Controllers name "{shard}" (pkg/shard): the aggregator then holds a
	// link per shard and sends each its callees, following the count the
	// shards announce (shards.go). 0 means 1.
	ControllerShards int
	// Bounds bound what a report may claim; zero fields take defaults.
	Bounds Bounds
	// MaxZoneLoadSize bounds a zone load sent to the controller, in bytes:
	// the controller's receive limit, which refuses a larger one whole.
	// A zone load over it goes without its largest services (FitZoneLoad).
	// Default zoneload.MaxMessageSize, the controller's.
	MaxZoneLoadSize int
	// DialOptions for the controller connection; default plaintext.
	DialOptions []grpc.DialOption
	// RequirePeerIdentity, set under mutual TLS, accepts a report only from
	// a workload whose identity (internal/identity) is the report's service,
	// and a sidecar id only from the identity that first reported it: a
	// sidecar may speak for its own service alone.
	RequirePeerIdentity bool
}

// DefaultConfig returns a Config with every default filled in; Zone and
// Controllers are left for the caller.
func DefaultConfig() Config {
	return Config{
		ID:            defaultID(),
		FlushInterval: time.Second,
		StaleAfter:    3,
		Bounds:        DefaultBounds(),

		MaxZoneLoadSize: zoneload.MaxMessageSize,
	}
}

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "aggregator"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ID == "" {
		c.ID = d.ID
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = d.FlushInterval
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = d.StaleAfter
	}
	if c.MaxZoneLoadSize == 0 {
		c.MaxZoneLoadSize = d.MaxZoneLoadSize
	}
	c.Bounds = c.Bounds.withDefaults()
	return c
}

// Bounds of Config fields that have no natural ones.
const (
	minFlushInterval = 10 * time.Millisecond
	maxFlushInterval = time.Minute
	maxStaleAfter    = 100
	// minZoneLoadSize leaves room for a zone load's header and a service.
	minZoneLoadSize = 64 << 10
)

// Validate reports every problem with c at once, naming the field by its
// flag and the bound. Zero fields that have a default are fine.
func (c Config) Validate() error {
	var errs []error
	if c.ID != "" && len(c.ID) > names.MaxLen {
		errs = append(errs, fmt.Errorf("id: at most %d bytes, got %d", names.MaxLen, len(c.ID)))
	}
	if c.Zone == "" {
		errs = append(errs, errors.New("zone: required"))
	} else if err := names.Check(c.Zone); err != nil {
		errs = append(errs, fmt.Errorf("zone: %w", err))
	}
	if c.FlushInterval != 0 && (c.FlushInterval < minFlushInterval || c.FlushInterval > maxFlushInterval) {
		errs = append(errs, fmt.Errorf("flush-interval: must be in [%v, %v], got %v", minFlushInterval, maxFlushInterval, c.FlushInterval))
	}
	if c.StaleAfter < 0 || c.StaleAfter > maxStaleAfter {
		errs = append(errs, fmt.Errorf("stale-after: must be in [1, %d] (0 for the default), got %d", maxStaleAfter, c.StaleAfter))
	}
	if len(c.Controllers) == 0 {
		errs = append(errs, errors.New("controllers: at least one address is required"))
	}
	for i, a := range c.Controllers {
		if a == "" {
			errs = append(errs, fmt.Errorf("controllers[%d]: empty address", i))
		}
	}
	if c.ControllerShards < 0 || c.ControllerShards > shard.MaxCount {
		errs = append(errs, fmt.Errorf("controller-shards: must be in [0, %d], got %d", shard.MaxCount, c.ControllerShards))
	}
	if c.ControllerShards > 1 && !shard.Templated(c.Controllers) {
		errs = append(errs, fmt.Errorf("controller-shards: %d shards need --controllers naming %s (sluice-controller-%s.sluice-controller:18000)", c.ControllerShards, shard.Placeholder, shard.Placeholder))
	}
	if c.MaxZoneLoadSize != 0 && (c.MaxZoneLoadSize < minZoneLoadSize || c.MaxZoneLoadSize > math.MaxInt32) {
		errs = append(errs, fmt.Errorf("max-zone-load-size: must be in [%d, %d] (0 for the default), got %d", minZoneLoadSize, math.MaxInt32, c.MaxZoneLoadSize))
	}
	if err := c.Bounds.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ReasonSidecarIDChanged rejects a report whose sidecar id differs from the
// one its stream reported first: a stream belongs to one sidecar, so that
// the end of a stream says which sidecar to forget. It is the Service's
// rule, not State's.
const ReasonSidecarIDChanged = "sidecar_id_changed"

// ReasonTooLarge counts a report larger than the gRPC server's receive
// limit: gRPC refuses it before it is decoded and ends the stream, so
// State never sees it.
const ReasonTooLarge = recvfail.TooLarge

// ReasonTooManyStreams refuses a stream opened while as many load-report
// streams are open as the aggregator keeps sidecars (--max-sidecars): each
// sidecar needs one, so more are idle streams that cost memory and report
// nothing. The stream ends RESOURCE_EXHAUSTED before its first report.
const ReasonTooManyStreams = "too_many_streams"

// ReasonUnparseable counts a report gRPC could not decode (not protobuf of
// the report's type, invalid UTF-8 in a string): the stream ends, as for
// ReasonTooLarge.
const ReasonUnparseable = recvfail.Unparseable

// ReasonIdentityMismatch rejects, under mutual TLS, a report whose service
// is not its sender's identity.
// The Service's rule, like ReasonSidecarIDChanged.
const ReasonIdentityMismatch = "identity_mismatch"

type (
	zoneReq    = sluicev1.StreamZoneLoadsRequest
	zoneUplink = uplink.Uplink[zoneReq, zoneResp]
	zoneResp   = sluicev1.StreamZoneLoadsResponse
)

// Service is a zone aggregator: the LoadReportService for the zone's
// sidecars, a flush loop, and the uplink to the controller. Its methods are
// safe for concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger
	// links are the controller links: one, or one per shard (shards.go).
	links links
	m     metrics

	// mu protects state. Every report takes it once, briefly.
	mu    sync.Mutex
	state *State

	flushes   *ticker.Ticker // the flush loop; poked on a surge
	draining  atomic.Bool
	rejectLog uplink.RejectLog // rejections of flushes by the controller
	reportLog uplink.RejectLog // rejections of reports that an operator should hear of
	foldLog   uplink.RejectLog // folded peers, per identity
	holders   atomic.Uint64    // the last stream's Sender.Holder
	open      atomic.Int64     // load-report streams open, bounded by Bounds.MaxSidecars
	badMsgLog recvfail.Log     // reports that ended their stream undecoded

	// seriesMu protects series: the (service, descriptor) series of
	// m.descriptorValues the last flush set.
	seriesMu sync.Mutex
	series   map[[2]string]bool
}

// stream is the identity of one StreamLoadReports call.
type stream struct {
	// holder numbers the stream: State lets only the holder of a live
	// sidecar report for it.
	holder uint64
	// sender and id are the sidecar of the first report accepted on the
	// stream, which every later report must be; id is empty before.
	sender, id string
	// peer is the sender's verified identity, with RequirePeerIdentity;
	// peerErr says why there is none.
	peer    identity.ID
	peerErr error
}

// New returns a Service; it serves nothing until Register and does not
// flush until Run. Metrics go to reg unless it is nil.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("aggregator config: %w", err)
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		cfg:     cfg,
		log:     logger,
		flushes: ticker.New(cfg.FlushInterval, ticker.MinGap(cfg.FlushInterval)),
		state:   NewState(cfg.Zone, cfg.ID, cfg.StaleAfter, cfg.Bounds),
	}
	s.links.make = func(index int) (*shardLink, error) {
		sl := &shardLink{index: index}
		addrs := shard.Addrs(cfg.Controllers, index)
		targets := [][]string{addrs}
		if cfg.ControllerFanout {
			targets = targets[:0]
			for _, a := range addrs {
				targets = append(targets, []string{a})
			}
		}
		for _, t := range targets {
			up, err := s.newUplink(cfg, t, logger, sl)
			if err != nil {
				return nil, err
			}
			sl.ups = append(sl.ups, up)
		}
		return sl, nil
	}
	links := 1
	if shard.Templated(cfg.Controllers) {
		links = max(cfg.ControllerShards, 1)
	}
	if err := s.links.grow(links); err != nil {
		return nil, err
	}
	s.m = newMetrics(reg, logger, s.links.uplinks)
	return s, nil
}

// newUplink is the link to one controller replica, failing over across
// addrs.
func (s *Service) newUplink(cfg Config, addrs []string, logger *slog.Logger, sl *shardLink) (*zoneUplink, error) {
	up, err := uplink.New(uplink.Config[zoneReq, zoneResp]{
		Addrs:       addrs,
		DialOptions: cfg.DialOptions,
		Open: func(ctx context.Context, cc grpc.ClientConnInterface) (grpc.BidiStreamingClient[zoneReq, zoneResp], error) {
			return sluicev1.NewZoneLoadServiceClient(cc).StreamZoneLoads(ctx)
		},
		OnResponse: func(r *zoneResp) {
			// An unsharded controller owns every callee: a count of 1.
			n := 1
			if si := r.GetShard(); si != nil && si.GetCount() >= 1 && si.GetCount() <= shard.MaxCount {
				n = int(si.GetCount())
			}
			sl.announced.Store(int32(n))
			sl.answered.Store(time.Now().UnixNano())
			s.onControllerResponse(r)
		},
		// Few aggregators dial the controller, so a short backoff cannot
		// storm it; a restarted controller waits for every zone before it
		// publishes, and a long backoff would make it wait longer.
		BackoffMax: time.Second,
		// The controller answers every flush; one that stays silent for
		// many flushes is wedged, and another replica may not be.
		ResponseTimeout: max(10*cfg.FlushInterval, 5*time.Second),
		Logger:          logger.With("uplink", "controller", "shard", sl.index),
	})
	if err != nil {
		return nil, fmt.Errorf("controller uplink: %w", err)
	}
	return up, nil
}

// Register adds the LoadReportService to g.
func (s *Service) Register(g grpc.ServiceRegistrar) {
	sluicev1.RegisterLoadReportServiceServer(g, loadServer{s: s})
}

// Ready reports whether the aggregator is connected to a controller (its
// stream delivered a response) — to one replica at least, with fan-out —
// and not draining.
func (s *Service) Ready() bool {
	if s.draining.Load() {
		return false
	}
	return slices.ContainsFunc(s.links.uplinks(), (*zoneUplink).Connected)
}

// Drain makes every sidecar stream end at its next report with UNAVAILABLE,
// unapplied, so that its sidecar fails over to another replica and resends
// it there; and makes Ready false. Call it before GracefulStop, which would
// otherwise wait for streams that never end on their own. Idempotent.
func (s *Service) Drain() { s.draining.Store(true) }

// Run flushes every FlushInterval and keeps the controller uplink until ctx
// is cancelled; it returns nil after its goroutines stopped.
func (s *Service) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		s.links.run(ctx)
		return nil
	})
	g.Go(func() error {
		s.flushes.Run(ctx, func(time.Time) { s.FlushNow() })
		return nil
	})
	return g.Wait()
}

// FlushNow drops stale sidecars, sums the rest, offers the result to the
// controller uplink and returns it. Run calls it every FlushInterval; tests
// call it to see the zone's sums. The caller must not modify the result.
func (s *Service) FlushNow() *sluicev1.ZoneLoad {
	s.mu.Lock()
	zl := s.state.Flush(time.Now(), s.cfg.FlushInterval)
	n := s.state.Sidecars()
	stale := s.state.TakeStale()
	capped := s.state.Capped()
	descriptorsCut := s.state.DescriptorsCut()
	healthCut := s.state.HealthCut()
	s.mu.Unlock()
	s.noteDescriptors(zl, descriptorsCut)
	s.m.healthCut.Add(float64(healthCut))
	for _, id := range stale {
		s.log.Warn("sidecar went silent; its load left the zone's sums", "sidecar_id", id)
	}
	s.fit(zl, capped)

	buckets := 0
	for _, sl := range zl.GetServices() {
		buckets += len(sl.GetPeers())
	}
	s.m.sidecars.Set(float64(n))
	s.m.flushes.Inc()
	s.m.flushBuckets.Set(float64(buckets))
	s.offer(zl)
	return zl
}

// offer hands zl to the controller links: whole to an unsharded
// controller, each shard its part (shards.go). Each uplink sends the
// message it is offered; sharing read-only entries is safe.
func (s *Service) offer(zl *sluicev1.ZoneLoad) {
	if !shard.Templated(s.cfg.Controllers) {
		for _, up := range s.links.uplinks() {
			up.Offer(&zoneReq{Load: zl})
		}
		return
	}
	counts := s.links.counts(s.cfg.ControllerShards, time.Now())
	if err := s.links.grow(counts[len(counts)-1]); err != nil {
		s.log.Error("controller shards announce more than the links made", "err", err)
	}
	ls := s.links.list()
	for i, part := range SplitZoneLoad(zl, len(ls), counts) {
		for _, up := range ls[i].ups {
			up.Offer(&zoneReq{Load: part})
		}
	}
}

// fit counts the sums the state capped and makes zl fit the controller's
// receive limit, counting and logging (at most once a minute) the services
// it leaves out: better the rest of the zone than none of it.
func (s *Service) fit(zl *sluicev1.ZoneLoad, capped int) {
	s.m.sumsCapped.Add(float64(capped))
	if capped > 0 && s.reportLog.Allow("sums_capped", time.Now()) {
		s.log.Warn("zone sums above what the controller accepts were capped", "sums", capped, "max_rps", zoneload.MaxRate)
	}
	shed := FitZoneLoad(zl, s.cfg.MaxZoneLoadSize)
	if len(shed) == 0 {
		return
	}
	s.m.shedServices.Add(float64(len(shed)))
	if s.reportLog.Allow("zone_load_shed", time.Now()) {
		var list []string
		for _, sl := range shed[:min(len(shed), 10)] {
			list = append(list, fmt.Sprintf("%s/%v (%d peers)", uplink.Truncate(sl.GetService()), sl.GetDirection(), len(sl.GetPeers())))
		}
		s.log.Warn("zone load over the controller's receive limit; its largest services left out",
			"shed", len(shed), "largest", list, "max_bytes", s.cfg.MaxZoneLoadSize)
	}
}

// Sidecars returns how many sidecars the aggregator keeps.
func (s *Service) Sidecars() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.Sidecars()
}

func (s *Service) onControllerResponse(r *zoneResp) {
	if r.GetAccepted() {
		return
	}
	s.m.controllerRejected.Inc()
	if reason := r.GetRejectReason(); s.rejectLog.Allow(reason, time.Now()) {
		s.log.Warn("controller rejected zone load", "reject_reason", uplink.Truncate(reason))
	}
}

// apply takes one report of stream st under the lock and says why it was
// rejected, if it was.
func (s *Service) apply(st *stream, r *sluicev1.LoadReport) error {
	folds, bad, err := s.applyLocked(st, r)
	if folds.Total() > 0 {
		s.noteFolds(st.sender, folds)
	}
	s.noteRejectedEntries(r, bad)
	var rej *RejectError
	if errors.As(err, &rej) && operatorReasons[rej.Reason] && s.reportLog.Allow(rej.Reason, time.Now()) {
		s.log.Warn("load report rejected", "reason", rej.Reason, "detail", uplink.Truncate(rej.Detail),
			"service", uplink.Truncate(r.GetService()), "sidecar_id", uplink.Truncate(r.GetSidecarId()), "peer", uplink.Truncate(st.peer.URI))
	}
	return err
}

// operatorReasons are the rejections logged (at most once a minute each):
// a sidecar id held twice or an identity over its quotas is a hostile or
// misconfigured workload, not a passing glitch.
var operatorReasons = map[string]bool{
	ReasonIDInUse: true, ReasonQuotaSidecars: true, ReasonTooManyPeers: true,
	ReasonIdentityMismatch: true, ReasonTooManySidecars: true,
}

// noteRejectedEntries counts the entries of r left out, by reason, and
// logs each reason at most once a minute.
func (s *Service) noteRejectedEntries(r *sluicev1.LoadReport, bad RejectedEntries) {
	s.m.valuesClamped.Add(float64(bad.ValueClamped))
	for i, n := range bad.ByReason() {
		if n == 0 {
			continue
		}
		reason := EntryReasons[i]
		s.m.entriesRejected[reason].Add(float64(n))
		if s.reportLog.Allow(reason, time.Now()) {
			s.log.Warn("load report entries left out; the rest of the report applied", "reason", reason,
				"entries", n, "service", uplink.Truncate(r.GetService()), "sidecar_id", uplink.Truncate(r.GetSidecarId()))
		}
	}
}

// noteDescriptors sets the descriptor gauges from zl, a zone load before
// FitZoneLoad, and deletes the series of descriptors it no longer holds.
func (s *Service) noteDescriptors(zl *sluicev1.ZoneLoad, descriptorsCut int) {
	s.m.descriptorsCut.Add(float64(descriptorsCut))
	s.seriesMu.Lock()
	defer s.seriesMu.Unlock()
	now := make(map[[2]string]bool, len(s.series))
	for _, sl := range zl.GetServices() {
		for _, d := range sl.GetDescriptors() {
			k := [2]string{sl.GetService(), d.GetDescriptor_()}
			if now[k] {
				continue // both directions of a service: descriptors are inbound
			}
			now[k] = true
			s.m.descriptorValues.WithLabelValues(k[0], k[1]).Set(float64(len(d.GetValues()) + int(d.GetValuesCut())))
			s.m.valuesCut.Add(float64(d.GetValuesCut()))
		}
	}
	for k := range s.series {
		if !now[k] {
			s.m.descriptorValues.DeleteLabelValues(k[0], k[1])
		}
	}
	s.series = now
}

// noteFolds counts the peers of identity's report folded into
// names.Overflow, and logs them at most once a minute per identity: a
// service whose callers outgrow the bounds, or a flood of made-up names.
// The metric has no service label; names from the network are not trusted
// to be few.
func (s *Service) noteFolds(identity string, f Folds) {
	s.m.folded[FoldReport].Add(float64(f.Report))
	s.m.folded[FoldEntries].Add(float64(f.Entries))
	s.m.folded[FoldPeers].Add(float64(f.Identity))
	if s.foldLog.Allow(identity, time.Now()) {
		s.log.Warn("peers beyond the bounds folded into "+names.Overflow, "identity", uplink.Truncate(identity),
			FoldReport, f.Report, FoldEntries, f.Entries, FoldPeers, f.Identity)
	}
}

// applyLocked applies r under the lock and returns the peers it folded and
// the entries it left out.
func (s *Service) applyLocked(st *stream, r *sluicev1.LoadReport) (Folds, RejectedEntries, error) {
	s.mu.Lock()
	defer func() {
		n := s.state.Sidecars()
		s.mu.Unlock()
		s.m.sidecars.Set(float64(n))
	}()
	// The identity: the verified one under mutual TLS, else the report's
	// service, which anyone can claim. Plaintext thus keys a sidecar by
	// (service, id) and keeps a live stream's id from being taken over,
	// but can not stop a client from claiming an id first.
	sender := r.GetService()
	if s.cfg.RequirePeerIdentity {
		if err := s.authorize(st, r); err != nil {
			return Folds{}, RejectedEntries{}, err
		}
		sender = st.peer.Service
	}
	if st.id != "" && (r.GetSidecarId() != st.id || sender != st.sender) {
		return Folds{}, RejectedEntries{}, reject(ReasonSidecarIDChanged, "stream of sidecar %q of %q reported for %q of %q",
			uplink.Truncate(st.id), uplink.Truncate(st.sender), uplink.Truncate(r.GetSidecarId()), uplink.Truncate(sender))
	}
	if err := s.state.ApplyFrom(Sender{Identity: sender, Holder: st.holder}, r, time.Now()); err != nil {
		return Folds{}, RejectedEntries{}, err
	}
	if s.state.TakeUrgent() {
		// A surge: the controller hears of it now, not at the next
		// flush (at most every ticker.MinGap).
		s.flushes.Poke()
	}
	st.sender, st.id = sender, r.GetSidecarId()
	return s.state.TakeFolds(), s.state.TakeRejectedEntries(), nil
}

// authorize checks a report against its sender's identity; s.mu is held.
// The message's own claims (service, sidecar id) are trusted only as far as
// the certificate backs them; its zone never is (the aggregator's wins).
// Sidecar ids are the identity's own (State keys sidecars by both).
func (s *Service) authorize(st *stream, r *sluicev1.LoadReport) error {
	switch {
	case st.peerErr != nil:
		return reject(ReasonIdentityMismatch, "no verified peer identity: %v", st.peerErr)
	case st.peer.Kind != identity.Workload:
		return reject(ReasonIdentityMismatch, "peer %s is a %v, not a workload", uplink.Truncate(st.peer.URI), st.peer.Kind)
	case r.GetService() != st.peer.Service:
		return reject(ReasonIdentityMismatch, "peer %s is service %q, the report is for %q", uplink.Truncate(st.peer.URI), st.peer.Service, uplink.Truncate(r.GetService()))
	}
	return nil
}

// end forgets the sidecar of a stream that ended, unless another stream
// took it over after it went stale.
func (s *Service) end(st *stream) {
	s.mu.Lock()
	defer func() {
		n := s.state.Sidecars()
		s.mu.Unlock()
		s.m.sidecars.Set(float64(n))
	}()
	if st.id != "" {
		s.state.Remove(st.sender, st.id, st.holder)
	}
}

// loadServer keeps the generated server's methods off Service's API.
type loadServer struct {
	sluicev1.UnimplementedLoadReportServiceServer
	s *Service
}

var errDraining = status.Error(codes.Unavailable, "aggregator is draining; report to another replica")

func (l loadServer) StreamLoadReports(g grpc.BidiStreamingServer[sluicev1.StreamLoadReportsRequest, sluicev1.StreamLoadReportsResponse]) error {
	s := l.s
	if n := s.open.Add(1); n > int64(s.cfg.Bounds.MaxSidecars) {
		s.open.Add(-1)
		s.m.reports.Inc()
		s.m.rejected(ReasonTooManyStreams).Inc()
		if s.reportLog.Allow(ReasonTooManyStreams, time.Now()) {
			s.log.Warn("load-report stream refused: as many are open as sidecars are kept (--max-sidecars)", "open", n-1)
		}
		return status.Errorf(codes.ResourceExhausted, "%s: %d load-report streams open, at most --max-sidecars", ReasonTooManyStreams, n-1)
	}
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	defer s.open.Add(-1) // before the gauge falls: who sees it fall may open one
	st := &stream{holder: s.holders.Add(1)}
	if s.cfg.RequirePeerIdentity {
		st.peer, st.peerErr = identity.Peer(g.Context())
	}
	defer s.end(st)
	for {
		req, err := g.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if reason := recvfail.Reason(err); reason != "" {
				s.m.reports.Inc()
				s.m.rejected(reason).Inc()
				s.badMsgLog.Note(g.Context(), s.log, "load reports", reason, err)
			}
			return err // the stream is gone; gRPC has its status
		}
		if s.draining.Load() {
			return errDraining
		}
		s.m.reports.Inc()
		resp := &sluicev1.StreamLoadReportsResponse{Accepted: true, Zone: s.cfg.Zone, AggregatorId: s.cfg.ID}
		if err := s.apply(st, req.GetReport()); err != nil {
			resp.Accepted = false
			resp.RejectReason = err.Error()
			var rej *RejectError
			if errors.As(err, &rej) {
				s.m.rejected(rej.Reason).Inc()
			} else {
				s.m.rejected("other").Inc()
			}
		}
		if err := g.Send(resp); err != nil {
			return err
		}
	}
}
