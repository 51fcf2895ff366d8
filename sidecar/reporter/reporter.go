// Package reporter sends a sidecar's load reports to its zone aggregator:
// once per interval, the requests per peer seen since the last report, over
// one long-lived stream with failover between aggregators.
//
// The reporter only reads the Limiter's counters (atomics, through Source)
// and hands the report to an uplink that never blocks, so neither a slow
// aggregator nor a dead one can hold up a request.
package reporter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/uplink"
	"github.com/sluicehq/sluice/sidecar"
)

// Source gives the cumulative counters of a service's peers; sidecar.Limiter
// implements it. AppendCounts appends one entry per peer to dst and returns
// it. Counters only grow, except that a peer's counters may start again
// from zero (a reset: the Limiter evicted the peer and saw it again, under a
// new Incarnation), which Build recognises. It is called from the
// reporter's goroutine once per interval and must be safe to call
// concurrently with the request path.
type Source interface {
	AppendCounts(service string, dst []sidecar.PeerCounts) []sidecar.PeerCounts
}

// DescriptorSource is a Source that also counts descriptor values
// (issue #15); sidecar.Limiter implements it. A Window whose Source
// implements it puts the service's descriptors in every regular report,
// and in an urgent one when their window is at least half an interval long
// (Window.sendUrgent; a tick that folded into a report without them leaves
// them due, and a check sends that tick's report itself once its window
// has grown to half an interval, Window.Check):
// RotateDescriptors ends the descriptors' window, and returns what it
// counted, reusing dst. Each call starts a new window,
// so a Limiter's service has one such reader: its Window (the reporter's,
// or the simulator's, which gets descriptors the same way by handing the
// Limiter to NewWindow).
type DescriptorSource interface {
	RotateDescriptors(service string, dst []sidecar.DescriptorCounts) []sidecar.DescriptorCounts
}

// Bounds of Config.Interval. They match the aggregator's defaults (its
// shortest window, its --max-report-interval): a report outside them would
// be rejected. The longest interval bounds how long one report keeps a
// sidecar in the zone's sums, so a forged one can not linger.
const (
	MinInterval = 10 * time.Millisecond
	MaxInterval = 10 * time.Second
)

// Config configures a Reporter. Zero fields that have a default take it.
type Config struct {
	// SidecarID identifies this sidecar for as long as its process lives,
	// e.g. pod name and a start time. Required.
	SidecarID string
	// Service is the service the sidecar runs next to. Required.
	Service string
	// Zone is the sidecar's zone as it knows it; informational, may be
	// empty. The aggregator decides the zone (see Reporter.Zone).
	Zone string
	// Direction is the side of the calls the sidecar counts, as the
	// Limiter it reports for enforces them. The zero value is Inbound.
	Direction sidecar.Direction
	// Interval between reports. Default 1s.
	Interval time.Duration
	// SurgeCheck is how often the counters are checked for a surge between
	// reports (see SurgeDetector); a surge is reported at once. Default a
	// tenth of Interval; negative turns surge reports off.
	SurgeCheck time.Duration
	// NoProjection turns the surge projection off (see Projector): the
	// sidecar then drops only with the controller's ratios. It needs
	// surge checks.
	NoProjection bool
	// NoHealthGate turns the health fast path off (see HealthGate): the
	// sidecar then sheds for its callee's health only with the
	// controller's ratios. It needs surge checks.
	NoHealthGate bool
	// Aggregators are the zone's aggregator addresses, tried in order with
	// failover. Required.
	Aggregators []string
	// DialOptions for the aggregator connection; default plaintext.
	DialOptions []grpc.DialOption
	// Logger; default discards.
	Logger *slog.Logger
	// Registerer for the reporter's metrics; nil registers none.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.SurgeCheck == 0 {
		c.SurgeCheck = DefaultSurgeCheck(c.Interval)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c at once, naming the field.
func (c Config) Validate() error {
	var errs []error
	if c.SidecarID == "" || len(c.SidecarID) > names.MaxLen {
		errs = append(errs, fmt.Errorf("SidecarID: must be 1 to %d bytes, got %d", names.MaxLen, len(c.SidecarID)))
	}
	if err := names.Check(c.Service); err != nil {
		errs = append(errs, fmt.Errorf("Service: %w", err))
	}
	if c.Zone != "" {
		if err := names.Check(c.Zone); err != nil {
			errs = append(errs, fmt.Errorf("Zone: %w", err))
		}
	}
	if c.Direction != sidecar.Inbound && c.Direction != sidecar.Outbound {
		errs = append(errs, fmt.Errorf("Direction: must be inbound or outbound, got %v", c.Direction))
	}
	if c.Interval != 0 && (c.Interval < MinInterval || c.Interval > MaxInterval) {
		errs = append(errs, fmt.Errorf("Interval: must be in [%v, %v], got %v", MinInterval, MaxInterval, c.Interval))
	}
	if c.SurgeCheck > 0 && (c.SurgeCheck < MinInterval || c.SurgeCheck > MaxInterval) {
		errs = append(errs, fmt.Errorf("SurgeCheck: must be in [%v, %v], or negative for none, got %v", MinInterval, MaxInterval, c.SurgeCheck))
	}
	if len(c.Aggregators) == 0 {
		errs = append(errs, errors.New("Aggregators: at least one address is required"))
	}
	for i, a := range c.Aggregators {
		if a == "" {
			errs = append(errs, fmt.Errorf("Aggregators[%d]: empty address", i))
		}
	}
	return errors.Join(errs...)
}

// Header is what every report of one sidecar repeats.
type Header struct {
	SidecarID, Service, Zone string
	Direction                sidecar.Direction
	// Interval is the sidecar's report interval, for the aggregator's
	// staleness check; 0 leaves it out.
	Interval time.Duration
}

// Build returns the report of the window [windowStart, windowStart+window)
// from two snapshots of cumulative counters, prev at the window's start and
// cur at its end. It is pure.
//
//   - Everything below is per bucket (peer, procedure, tier): one per leaf
//     for a service with procedures or criticality.
//   - A peer's count in the window is cur minus prev. A peer missing from
//     prev is new: all of cur counts. A peer whose counters went backwards,
//     or whose Incarnation changed, was reset: all of cur counts. (A
//     Limiter evicts only peers idle for longer than a report interval, so
//     the old incarnation's counts were all in prev.) A peer missing from
//     cur, evicted, sent nothing.
//   - Dropped and shadow-dropped are clamped to what offered allows, since
//     a snapshot reads a peer's counters one by one while requests go on.
//   - A peer that fails names.Check is counted as names.Unknown, and a
//     procedure that fails names.CheckProcedure as names.Other, and a tier
//     outside the four (from no Limiter) as criticality.Sheddable, the
//     lowest, rather than have the aggregator reject the whole report.
//   - Peers with nothing offered in the window are left out: a report is
//     the sidecar's complete picture, so a missing peer means rate 0. A
//     bucket that offered nothing but has requests in flight, or whose
//     admitted cost became known in the window (a long request reporting
//     its cost when it completes), is kept for those.
//   - A peer listed more than once in a snapshot is summed.
//   - For a callee counting cost, offered_cost and admitted_cost are the
//     window's deltas of the cumulative milli-unit costs, in units (see
//     sidecar.PeerCounts.OfferedCost); in_flight is cur's gauge. All
//     three are 0, and cost no bytes, for other callees.
//
// Entries are sorted by peer, procedure, then tier. An untiered bucket's
// entry leaves criticality unset: its report is what it was before tiers.
func Build(h Header, prev, cur []sidecar.PeerCounts, windowStart time.Time, window time.Duration) *sluicev1.LoadReport {
	before := sumByBucket(prev)
	deltas := make(map[bucket]*sluicev1.PeerCounts)
	for k, c := range sumByBucket(cur) {
		b := since(before[k], c)
		offered := c.Offered - b.Offered
		if offered == 0 && c.InFlight == 0 && costDelta(b.AdmittedCost, c.AdmittedCost) == 0 {
			continue
		}
		dropped := min(c.Dropped-b.Dropped, offered)
		shadow := min(c.ShadowDropped-b.ShadowDropped, offered-dropped)
		if names.Check(k.peer) != nil {
			k.peer = names.Unknown
		}
		if k.procedure != "" && names.CheckProcedure(k.procedure) != nil {
			k.procedure = names.Other
		}
		if !k.tier.Valid() {
			k.tier = criticality.Sheddable
		}
		d := deltas[k]
		if d == nil {
			d = &sluicev1.PeerCounts{Peer: k.peer, Procedure: k.procedure, Criticality: sluicev1.Criticality(k.tier)}
			deltas[k] = d
		}
		d.Offered += offered
		d.Dropped += dropped
		d.ShadowDropped += shadow
		d.OfferedCost += costDelta(b.OfferedCost, c.OfferedCost)
		d.AdmittedCost += costDelta(b.AdmittedCost, c.AdmittedCost)
		d.InFlight += c.InFlight
	}
	r := &sluicev1.LoadReport{
		SidecarId:   h.SidecarID,
		Service:     h.Service,
		Direction:   directionProto(h.Direction),
		Zone:        h.Zone,
		WindowStart: timestamppb.New(windowStart),
		Window:      durationpb.New(window),
		Peers:       slices.Collect(maps.Values(deltas)),
	}
	if h.Interval > 0 {
		r.Interval = durationpb.New(h.Interval)
	}
	slices.SortFunc(r.Peers, func(a, b *sluicev1.PeerCounts) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Procedure, b.Procedure), cmp.Compare(a.Criticality, b.Criticality))
	})
	return r
}

// costDelta is a window's cost, in units, from the cumulative milli-unit
// costs b and c, which wrap; a delta that went backwards (a price folded
// while a snapshot was read) is 0.
func costDelta(b, c uint64) float64 {
	d := c - b
	if d >= 1<<63 {
		return 0
	}
	return float64(d) / 1000
}

// since returns the counters of b, an earlier snapshot of c's bucket, that
// c counts from: b itself, or zero when c's counters were reset since (a
// new incarnation, or counters that went backwards).
func since(b, c sidecar.PeerCounts) sidecar.PeerCounts {
	if c.Incarnation != b.Incarnation || c.Offered < b.Offered || c.Dropped < b.Dropped || c.ShadowDropped < b.ShadowDropped {
		return sidecar.PeerCounts{}
	}
	return b
}

// bucket is a report entry's key: a peer, a procedure ("" for a service
// without procedures) and a tier (None for a service without
// criticality). Incarnations are per bucket: the Limiter evicts and sees
// again each leaf on its own.
type bucket struct {
	peer, procedure string
	tier            criticality.Tier
}

// sumByBucket sums the counters of each bucket of s. A bucket listed more
// than once (not by a Limiter) keeps its last entry's incarnation.
func sumByBucket(s []sidecar.PeerCounts) map[bucket]sidecar.PeerCounts {
	m := make(map[bucket]sidecar.PeerCounts, len(s))
	for _, p := range s {
		k := bucket{p.Peer, p.Procedure, p.Tier}
		t := m[k]
		t.Offered += p.Offered
		t.Dropped += p.Dropped
		t.ShadowDropped += p.ShadowDropped
		t.Incarnation = p.Incarnation
		t.OfferedCost += p.OfferedCost
		t.AdmittedCost += p.AdmittedCost
		t.InFlight += p.InFlight
		m[k] = t
	}
	return m
}

type (
	loadReq  = sluicev1.StreamLoadReportsRequest
	loadResp = sluicev1.StreamLoadReportsResponse
)

// Reporter sends a sidecar's load reports. Zone and Connected are safe for
// concurrent use; Run runs once at a time.
type Reporter struct {
	cfg Config
	hdr Header
	src Source
	log *slog.Logger
	up  *uplink.Uplink[loadReq, loadResp]

	zone     atomic.Pointer[string] // the zone the aggregator accounts us to; nil until it said
	rejected prometheus.Counter
	surges   prometheus.Counter
	stalls   prometheus.Counter // stalls of the loop, whose next steps were skipped
	// healthShed and healthEpisodes are the health gate's: the share its
	// episode in force sheds, and the episodes it began.
	healthShed     prometheus.Gauge
	healthEpisodes prometheus.Counter
	rejectLog      uplink.RejectLog
}

// New checks cfg and returns a Reporter that reports nothing until Run.
func New(cfg Config, src Source) (*Reporter, error) {
	err := cfg.Validate()
	if src == nil {
		err = errors.Join(err, errors.New("source: required"))
	}
	if err != nil {
		return nil, fmt.Errorf("reporter config: %w", err)
	}
	cfg = cfg.withDefaults()
	r := &Reporter{
		cfg: cfg,
		hdr: Header{SidecarID: cfg.SidecarID, Service: cfg.Service, Zone: cfg.Zone, Direction: cfg.Direction, Interval: cfg.Interval},
		src: src,
		log: cfg.Logger,
	}
	up, err := uplink.New(uplink.Config[loadReq, loadResp]{
		Addrs:       cfg.Aggregators,
		DialOptions: cfg.DialOptions,
		Open: func(ctx context.Context, cc grpc.ClientConnInterface) (grpc.BidiStreamingClient[loadReq, loadResp], error) {
			return sluicev1.NewLoadReportServiceClient(cc).StreamLoadReports(ctx)
		},
		OnResponse: r.onResponse,
		// The aggregator answers every report; one that stays silent for
		// many intervals is wedged, and another replica may not be.
		ResponseTimeout: max(10*cfg.Interval, 5*time.Second),
		Logger:          cfg.Logger.With("uplink", "aggregator"),
	})
	if err != nil {
		return nil, fmt.Errorf("aggregator uplink: %w", err)
	}
	r.up = up
	r.rejected, r.surges, r.stalls, r.healthShed, r.healthEpisodes = registerMetrics(cfg, up)
	return r, nil
}

// Zone returns the zone the aggregator said it accounts this sidecar to, or
// Config.Zone until an aggregator answered.
func (r *Reporter) Zone() string {
	if z := r.zone.Load(); z != nil {
		return *z
	}
	return r.cfg.Zone
}

// Connected reports whether the stream to an aggregator is open and has
// answered.
func (r *Reporter) Connected() bool { return r.up.Connected() }

// Run reports every Interval until ctx is cancelled, and returns nil once
// its goroutines stopped. The first report covers the first interval after
// Run started; counts from before Run are the baseline, not reported.
func (r *Reporter) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.up.Run(ctx) })
	g.Go(func() error {
		r.loop(ctx, func(rep *sluicev1.LoadReport) { r.up.Offer(&loadReq{Report: rep}) })
		return nil
	})
	return g.Wait()
}

// loop owns the timers and hands what they send to send (the uplink); what
// a tick or a check sends is the Window's to say.
func (r *Reporter) loop(ctx context.Context, send func(*sluicev1.LoadReport)) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	// A nil channel never fires: no surge checks when they are off.
	var check, project <-chan time.Time
	if r.cfg.SurgeCheck > 0 {
		ct := time.NewTicker(r.cfg.SurgeCheck)
		defer ct.Stop()
		check = ct.C
	}
	if r.cfg.SurgeCheck > 0 && !r.cfg.NoProjection {
		// Projection steps between the checks (Window.Project): the
		// steps that fall on a check are the check's own.
		pt := time.NewTicker(r.cfg.SurgeCheck / DefaultProjectSteps)
		defer pt.Stop()
		project = pt.C
	}
	w := NewWindow(WindowConfig{Header: r.hdr, Interval: r.cfg.Interval, SurgeChecks: r.cfg.SurgeCheck > 0, Project: !r.cfg.NoProjection,
		Check: r.cfg.SurgeCheck, HealthGate: !r.cfg.NoHealthGate}, time.Now(), r.src)
	var episodes uint64 // the gate's, counted so far
	st := newStalls(r.cfg.Interval, r.cfg.SurgeCheck, time.Now())
	// tickDue says a tick is due: one skipped after a stall is sent by
	// the first step that runs.
	tickDue := false
	// step reports whether the step at now runs, sending a tick's report
	// first when one is due.
	step := func(now time.Time) bool {
		skip, stalled := st.skip(now)
		if stalled {
			r.stalls.Inc()
		}
		if skip {
			return false
		}
		if tickDue {
			tickDue = false
			// A tick read late makes a longer window, which Tick
			// measures, and the monotonic reading keeps it immune
			// to wall-clock steps.
			if rep := w.Tick(now, r.src); rep != nil {
				send(rep)
			}
		}
		return true
	}
	for {
		var rep *sluicev1.LoadReport
		// Every step reads time.Now, not its ticker's time (when it
		// fired): a step read late would count the requests up to now
		// over a window that ends when it fired, and a sidecar that got
		// no CPU for half a second saw a surge.
		select {
		case <-ctx.Done():
			return
		case <-check:
			now := time.Now()
			if !step(now) {
				continue
			}
			// A check also sends a folded tick's report when its
			// descriptors are due (Window.Check): not a surge.
			if rep = w.Check(now, r.src); rep.GetUrgent() {
				r.surges.Inc()
			}
			cut, n := w.HealthGate()
			r.healthShed.Set(cut)
			r.healthEpisodes.Add(float64(n - episodes))
			episodes = n
		case <-project:
			if now := time.Now(); step(now) {
				w.Project(now, r.src)
			}
			continue
		case <-t.C:
			tickDue = true
			step(time.Now())
			continue
		}
		if rep != nil {
			send(rep)
		}
	}
}

func (r *Reporter) onResponse(resp *loadResp) {
	if z := resp.GetZone(); z != "" && names.Check(z) == nil {
		if old := r.zone.Load(); old == nil || *old != z {
			r.zone.Store(&z)
		}
	}
	if resp.GetAccepted() {
		return
	}
	r.rejected.Inc()
	if reason := resp.GetRejectReason(); r.rejectLog.Allow(reason, time.Now()) {
		r.log.Warn("aggregator rejected load report", "reject_reason", uplink.Truncate(reason),
			"aggregator_id", uplink.Truncate(resp.GetAggregatorId()))
	}
}

// registerMetrics registers the reporter's metrics and returns the ones
// it sets itself. The others read the uplink's counters when scraped.
func registerMetrics(cfg Config, up *uplink.Uplink[loadReq, loadResp]) (rejected, surges, stalls prometheus.Counter, healthShed prometheus.Gauge, healthEpisodes prometheus.Counter) {
	const ns, sub = "sluice", "sidecar_report"
	// A sidecar may report both directions; the label keeps their
	// reporters' metrics apart on one registry.
	labels := prometheus.Labels{"direction": cfg.Direction.String()}
	rejected = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "rejected_total", ConstLabels: labels,
		Help: "Load reports the aggregator answered with accepted=false.",
	})
	surges = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "surges_total", ConstLabels: labels,
		Help: "Load reports sent before the interval was up because a caller's rate jumped.",
	})
	stalls = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "stalls_total", ConstLabels: labels,
		Help: "Times the reporter got no CPU for over two surge-check periods; the steps of the check period after each were skipped.",
	})
	// The health gate judges the service's own app: its metrics say
	// which service, as the limiter's do.
	svc := prometheus.Labels{"service": cfg.Service}
	healthShed = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: "sidecar", Name: "health_fast_path_shed_ratio", ConstLabels: svc,
		Help: "The share of the admitted load the health fast path sheds while its app misses the objective, until the controller's next tick; 0 when it is not shedding.",
	})
	healthEpisodes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "sidecar", Name: "health_fast_path_episodes_total", ConstLabels: svc,
		Help: "Times the health fast path began to shed because the app missed the objective its policy declares.",
	})
	if cfg.Registerer == nil {
		return rejected, surges, stalls, healthShed, healthEpisodes
	}
	counter := func(name, help string, f func(uplink.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: name, ConstLabels: labels, Help: help,
		}, func() float64 { return float64(f(up.Stats())) })
	}
	collectors := []prometheus.Collector{
		rejected,
		surges,
		stalls,
		counter("sent_total", "Load reports sent to an aggregator.",
			func(s uplink.Stats) uint64 { return s.Sent }),
		counter("superseded_total", "Load reports replaced by a newer one before they could be sent.",
			func(s uplink.Stats) uint64 { return s.Superseded }),
		counter("failovers_total", "Failed or ended aggregator streams after which the reporter moved to the next address.",
			func(s uplink.Stats) uint64 { return s.Failovers }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "connected", ConstLabels: labels,
			Help: "1 while the aggregator stream is open and has answered, else 0.",
		}, func() float64 {
			if up.Connected() {
				return 1
			}
			return 0
		}),
	}
	if cfg.Direction == sidecar.Inbound {
		collectors = append(collectors, healthShed, healthEpisodes)
	}
	for _, c := range collectors {
		// Best effort, as in the other packages: a second reporter of the
		// same direction on one registry must not fail the sidecar.
		if err := cfg.Registerer.Register(c); err != nil {
			cfg.Logger.Warn("reporter metric not registered", "error", err)
		}
	}
	return rejected, surges, stalls, healthShed, healthEpisodes
}

// directionProto puts a validated direction on the wire.
func directionProto(d sidecar.Direction) sluicev1.Direction {
	if d == sidecar.Outbound {
		return sluicev1.Direction_DIRECTION_OUTBOUND
	}
	return sluicev1.Direction_DIRECTION_INBOUND
}

// descriptorsProto puts a window's descriptor counts on the wire. The
// Limiter bounds them: at most descriptor.MaxPerService descriptors, each
// with at most its heavy-set size of values, names checked by its policy
// and values by descriptor.Value before they were counted.
func descriptorsProto(ds []sidecar.DescriptorCounts) []*sluicev1.DescriptorCounts {
	if len(ds) == 0 {
		return nil
	}
	out := make([]*sluicev1.DescriptorCounts, len(ds))
	for i, d := range ds {
		m := &sluicev1.DescriptorCounts{Descriptor_: d.Descriptor, Offered: d.Offered, Dropped: d.Dropped}
		m.Values = make([]*sluicev1.ValueCounts, len(d.Values))
		for j, e := range d.Values {
			m.Values[j] = &sluicev1.ValueCounts{Value: e.Value, Offered: uint64(e.Estimate)}
		}
		out[i] = m
	}
	return out
}

// healthProto renders a window's health counts, sorted by procedure so
// that a report does not depend on a map's order.
func healthProto(hs []sidecar.HealthCounts) []*sluicev1.UpstreamHealth {
	if len(hs) == 0 {
		return nil
	}
	slices.SortFunc(hs, func(a, b sidecar.HealthCounts) int { return strings.Compare(a.Procedure, b.Procedure) })
	out := make([]*sluicev1.UpstreamHealth, len(hs))
	for i := range hs {
		h := &hs[i]
		out[i] = &sluicev1.UpstreamHealth{Procedure: h.Procedure, Latency: slices.Clone(h.Latency[:]),
			Ok: h.OK, Failed: h.Failed, TimedOut: h.Late, InFlight: h.InFlight}
	}
	return out
}
