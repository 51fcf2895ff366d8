package controller

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/uplink"
)

type metrics struct {
	tickSeconds   prometheus.Histogram
	aggregators   prometheus.Gauge
	buckets       prometheus.Gauge
	callees       *prometheus.GaugeVec
	warm          prometheus.Gauge
	published     prometheus.Counter
	deleted       prometheus.Counter
	publishErrors prometheus.Counter
	accepted      prometheus.Counter
	rejected      *prometheus.CounterVec
	svcRejected   *prometheus.CounterVec
	peerRejected  *prometheus.CounterVec // by reason: ReasonBadProcedure
	notOwned      prometheus.Counter
	shard, shards prometheus.Gauge
	claimsRefused *prometheus.CounterVec
	peersShed     prometheus.Counter
	streams       prometheus.Gauge
	limitServices prometheus.Gauge
	offered       *prometheus.GaugeVec
	dropped       *prometheus.GaugeVec
	// debt is per callee counting cost with a bucket in debt, bounded by
	// the limits; debtSeen holds those with a series.
	debt     *prometheus.GaugeVec
	debtSeen map[string]bool

	// Per (service, descriptor), both bounded by the limits
	// (descriptor.MaxPerService per service).
	descRejected *prometheus.CounterVec // by reason: the ReasonDescriptor* and ReasonValue* labels
	descListed   *prometheus.GaugeVec
	descCut      *prometheus.GaugeVec
	descAbusive  *prometheus.GaugeVec
	descZoneCut  *prometheus.GaugeVec
	descHeld     *prometheus.GaugeVec
	descSeen     map[descriptorKey]bool

	// Per (service, procedure), bounded as offered is: what the callee did
	// with admitted requests (health.go), "" the callee as a whole.
	healthRejected *prometheus.CounterVec // by reason: the ReasonHealth* labels
	healthP99      *prometheus.GaugeVec
	healthErrors   *prometheus.GaugeVec
	healthAnswered *prometheus.GaugeVec
	healthSeen     map[ServiceProcedure]bool
	// estimated is per callee and procedure with an objective, bounded by
	// the limits.
	estimated     *prometheus.GaugeVec
	estimatedSeen map[ServiceProcedure]string // the reason of each series

	// badLog throttles the lines about what the controller left out
	// (logDropped, logRefused, logShed), each at most once per logEvery:
	// a hostile or broken aggregator sends one zone load per flush.
	badLog uplink.RejectLog

	// (service, procedure) pairs with a series, so that vanished ones are
	// deleted; touched only by the tick goroutine.
	seen map[ServiceProcedure]bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		badLog: uplink.RejectLog{Every: logEvery},
		tickSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_controller_tick_duration_seconds",
			Help:    "Time to sum zone loads, run the control law and build policies, per tick.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		aggregators: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_aggregators", Help: "Aggregators whose zone loads are in the sums."}),
		buckets:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_buckets", Help: "Buckets, (callee, caller) pairs or (callee, caller, procedure) leaves, the control law ran over in the last tick."}),
		callees: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_controller_tick_callees",
			Help: "Callees of the last tick by what it did for them: stepped (the control law ran), quiet (nothing to drop, so the law was not run) and built (their policies were built, the rest unchanged; a quiet callee's only when it changed enough to publish or falls due)."}, []string{"work"}),
		warm:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_warm", Help: "1 once the start-up warm-up is over and policies are published."}),
		published:     prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_policies_published_total", Help: "DropPolicy resources pushed (changed or refreshed)."}),
		deleted:       prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_policies_deleted_total", Help: "DropPolicy resources removed after their service vanished."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_publish_errors_total", Help: "Ticks whose policies could not be handed to the xDS cache."}),
		accepted:      prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_zone_loads_total", Help: "Zone loads accepted from aggregators."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_zone_loads_rejected_total", Help: "Zone loads rejected, by reason.",
		}, []string{"reason"}),
		svcRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_service_loads_rejected_total",
			Help: "Service entries left out of zone loads, by reason; the rest of each zone load was applied.",
		}, []string{"reason"}),
		peerRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_peer_entries_rejected_total",
			Help: "Peer entries left out of service entries that were applied, by reason: bad_procedure, a procedure that is not a valid name; bad_criticality, a tier outside the enum.",
		}, []string{"reason"}),
		claimsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_outbound_claims_refused_total",
			Help: "Outbound claims left out of the law, once per tick and bucket, by reason: no_limit, the callee has a capacity and the bucket no finite limit; " +
				"callee_procedures, the callee declares procedures and its own sidecars count every call in its leaf; " +
				"callee_tiers, the callee declares tiers and its own sidecars count every call in its tier; " +
				"callee_cost, the callee counts cost, which only its own sidecars price.",
		}, []string{"reason"}),
		peersShed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_controller_policy_peers_shed_total",
			Help: "Peers left out of policies, once per tick and policy, because the policy would list more than a sidecar accepts; ratio 0 and the smallest offered rate go first.",
		}),
		streams:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_zone_streams", Help: "Open zone-load streams from aggregators."}),
		limitServices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_limit_services", Help: "Services with configured limits."}),
		offered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_offered_rps",
			Help: "Global offered rate per callee and procedure (empty for a callee without procedures), dropped requests included.",
		}, []string{"service", "procedure"}),
		dropped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_dropped_rps",
			Help: "Global rate of enforced drops per callee and procedure (empty for a callee without procedures), as sidecars reported them.",
		}, []string{"service", "procedure"}),
		seen: map[ServiceProcedure]bool{},
		debt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_cost_debt",
			Help: "Cost units a callee counting cost has admitted above its buckets' limits and not yet paid back, summed over its buckets; their limits are lowered meanwhile (--cost-payback).",
		}, []string{"service"}),
		debtSeen: map[string]bool{},
		descRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_descriptor_entries_rejected_total",
			Help: "Descriptor entries, or values of them, left out of zone loads' service entries that were applied, by reason.",
		}, []string{"reason"}),
		descListed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_descriptor_values",
			Help: "Values of a descriptor listed in its service's policy in the last tick, at most --max-descriptor-values.",
		}, []string{"service", "descriptor"}),
		descCut: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_descriptor_values_cut",
			Help: "Values of a descriptor with a verdict that --max-descriptor-values left out of its policy in the last tick; compliant and smallest first.",
		}, []string{"service", "descriptor"}),
		descAbusive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_descriptor_abusive_values",
			Help: "Values of a descriptor with a drop ratio above 0 in the last tick, listed or not.",
		}, []string{"service", "descriptor"}),
		descZoneCut: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_descriptor_zone_values_cut",
			Help: "Values of a descriptor the aggregators' bound left out of their zone loads, summed over live zones, in the last tick.",
		}, []string{"service", "descriptor"}),
		descHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_descriptor_held_values",
			Help: "Compliant values of a descriptor listed in its policy in the last tick though no zone reported them, within --descriptor-hold of their last report.",
		}, []string{"service", "descriptor"}),
		descSeen: map[descriptorKey]bool{},
		healthRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_health_entries_rejected_total",
			Help: "Health entries left out of zone loads' service entries that were applied, by reason.",
		}, []string{"reason"}),
		healthP99: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_upstream_latency_p99_seconds",
			Help: "The callee's p99 latency over the fleet's last reports, per procedure (empty: the callee as a whole); absent under one answer a second.",
		}, []string{"service", "procedure"}),
		healthErrors: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_upstream_error_ratio",
			Help: "The share of the callee's answers that failed (5xx but 504, gRPC UNKNOWN, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNAVAILABLE, DATA_LOSS) or timed out, per procedure (empty: the callee as a whole).",
		}, []string{"service", "procedure"}),
		healthAnswered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_upstream_answered_rps",
			Help: "Requests per second the callee answered, whatever the outcome, per procedure (empty: the callee as a whole).",
		}, []string{"service", "procedure"}),
		healthSeen: map[ServiceProcedure]bool{},
		notOwned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_controller_entries_not_owned_total",
			Help: "Zone-load entries of callees another controller shard owns, left out: service entries, and an outbound entry's peers. Aggregators send them while a reshard is under way; a steady rise means an aggregator uses another shard count.",
		}),
		shard: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_controller_shard",
			Help: "This controller's shard index (--shard), in [0, sluice_controller_shards).",
		}),
		shards: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_controller_shards",
			Help: "The shard count (--shards): callees are split across that many controllers by their name's hash.",
		}),
		estimated: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_estimated_capacity_rps",
			Help: "The capacity estimated from the objective (slo) of a callee or of one of its procedures (procedure empty: the callee as a whole) at the last tick, and why it moved (reason: no_data, holding, probing_up, backing_off); the law shares the smaller of it and a written capacity. 0 until the callee has answered.",
		}, []string{"service", "procedure", "reason"}),
		estimatedSeen: map[ServiceProcedure]string{},
	}
	m.peerRejected.WithLabelValues(ReasonBadProcedure) // at zero from the start
	m.peerRejected.WithLabelValues(ReasonBadCriticality)
	if reg != nil {
		reg.MustRegister(m.notOwned, m.shard, m.shards)
		reg.MustRegister(m.tickSeconds, m.aggregators, m.buckets, m.callees, m.warm, m.published, m.deleted, m.publishErrors,
			m.accepted, m.rejected, m.svcRejected, m.peerRejected, m.claimsRefused, m.peersShed, m.streams, m.limitServices, m.offered, m.dropped, m.debt,
			m.descRejected, m.descListed, m.descCut, m.descAbusive, m.descZoneCut, m.descHeld,
			m.healthRejected, m.healthP99, m.healthErrors, m.healthAnswered, m.estimated)
	}
	return m
}

func (m *metrics) observeTick(res TickResult, set *limits.Set, took time.Duration) {
	m.tickSeconds.Observe(took.Seconds())
	m.aggregators.Set(float64(res.Aggregators))
	m.limitServices.Set(float64(set.Len()))
	if !res.Warm {
		return
	}
	m.warm.Set(1)
	m.buckets.Set(float64(res.Buckets))
	m.callees.WithLabelValues("stepped").Set(float64(len(res.Services) - res.Quiet))
	m.callees.WithLabelValues("quiet").Set(float64(res.Quiet))
	m.callees.WithLabelValues("built").Set(float64(res.Rendered))
	m.published.Add(float64(len(res.Changed)))
	m.deleted.Add(float64(len(res.Deleted)))
	// The procedures are bounded: foldBuckets leaves a callee's
	// declared ones and names.Other, or "".
	for k, tot := range res.Procedures {
		m.offered.WithLabelValues(k.Service, k.Procedure).Set(tot.Offered)
		m.dropped.WithLabelValues(k.Service, k.Procedure).Set(tot.Dropped)
		m.seen[k] = true
	}
	for k := range m.seen {
		if _, ok := res.Procedures[k]; !ok {
			m.offered.DeleteLabelValues(k.Service, k.Procedure)
			m.dropped.DeleteLabelValues(k.Service, k.Procedure)
			delete(m.seen, k)
		}
	}
	m.observeDescriptors(res.Descriptors)
	m.observeHealth(res.Health)
	m.observeEstimates(res.Estimates)
	for svc, d := range res.Debts {
		m.debt.WithLabelValues(svc).Set(d)
		m.debtSeen[svc] = true
	}
	for svc := range m.debtSeen {
		if _, ok := res.Debts[svc]; !ok {
			m.debt.DeleteLabelValues(svc)
			delete(m.debtSeen, svc)
		}
	}
}

// observeHealth sets the health gauges of a tick and deletes the series
// of (service, procedure) pairs it no longer has health of.
func (m *metrics) observeHealth(hs map[ServiceProcedure]UpstreamHealth) {
	for k, h := range hs {
		if h.HasP99 {
			m.healthP99.WithLabelValues(k.Service, k.Procedure).Set(h.P99.Seconds())
		} else {
			m.healthP99.DeleteLabelValues(k.Service, k.Procedure)
		}
		m.healthErrors.WithLabelValues(k.Service, k.Procedure).Set(h.Errors())
		m.healthAnswered.WithLabelValues(k.Service, k.Procedure).Set(h.Answered())
		m.healthSeen[k] = true
	}
	for k := range m.healthSeen {
		if _, ok := hs[k]; !ok {
			for _, g := range []*prometheus.GaugeVec{m.healthP99, m.healthErrors, m.healthAnswered} {
				g.DeleteLabelValues(k.Service, k.Procedure)
			}
			delete(m.healthSeen, k)
		}
	}
}

// observeEstimates sets each estimated capacity, one series per callee
// or procedure under its last reason: a series whose reason changed, or
// that lost its objective, is deleted.
func (m *metrics) observeEstimates(est map[ServiceProcedure]adaptive.Estimate) {
	for k, reason := range m.estimatedSeen {
		if e, ok := est[k]; !ok || e.Reason.String() != reason {
			m.estimated.DeleteLabelValues(k.Service, k.Procedure, reason)
			delete(m.estimatedSeen, k)
		}
	}
	for k, e := range est {
		m.estimated.WithLabelValues(k.Service, k.Procedure, e.Reason.String()).Set(e.Capacity)
		m.estimatedSeen[k] = e.Reason.String()
	}
}

// observeDescriptors sets the descriptor gauges of a tick and deletes the
// series of descriptors the limits no longer give.
func (m *metrics) observeDescriptors(stats []DescriptorStat) {
	current := make(map[descriptorKey]bool, len(stats))
	for _, st := range stats {
		m.descListed.WithLabelValues(st.Service, st.Descriptor).Set(float64(st.Listed))
		m.descCut.WithLabelValues(st.Service, st.Descriptor).Set(float64(st.Cut))
		m.descAbusive.WithLabelValues(st.Service, st.Descriptor).Set(float64(st.Abusive))
		m.descZoneCut.WithLabelValues(st.Service, st.Descriptor).Set(float64(st.ZoneCut))
		m.descHeld.WithLabelValues(st.Service, st.Descriptor).Set(float64(st.Held))
		k := descriptorKey{st.Service, st.Descriptor}
		current[k], m.descSeen[k] = true, true
	}
	for k := range m.descSeen {
		if !current[k] {
			for _, g := range []*prometheus.GaugeVec{m.descListed, m.descCut, m.descAbusive, m.descZoneCut, m.descHeld} {
				g.DeleteLabelValues(k.service, k.descriptor)
			}
			delete(m.descSeen, k)
		}
	}
}

// noteDropped counts the service entries dropped from a zone load and logs
// the first of them, at most once per logEvery with how many went
// unlogged: a hostile or broken aggregator sends one per flush.
func (m *metrics) noteDropped(log *slog.Logger, d Dropped, now time.Time) {
	m.peerRejected.WithLabelValues(ReasonBadProcedure).Add(float64(d.BadProcedures))
	m.notOwned.Add(float64(d.NotOwned))
	m.peerRejected.WithLabelValues(ReasonBadCriticality).Add(float64(d.BadCriticality))
	nd := 0
	for reason, c := range d.BadDescriptors {
		m.descRejected.WithLabelValues(reason).Add(float64(c))
		nd += c
	}
	if nd > 0 {
		if ok, unlogged := m.badLog.AllowN(logDescriptors, now, nd); ok {
			log.Warn("descriptor entries or values left out of a zone load; the rest of the zone was applied",
				"aggregator_id", d.AggregatorID, "first", d.FirstDescriptor, "dropped", nd, "dropped_unlogged_before", unlogged)
		}
	}
	nh := 0
	for reason, c := range d.BadHealth {
		m.healthRejected.WithLabelValues(reason).Add(float64(c))
		nh += c
	}
	if nh > 0 {
		if ok, unlogged := m.badLog.AllowN(logHealth, now, nh); ok {
			log.Warn("health entries left out of a zone load; the rest of the zone was applied",
				"aggregator_id", d.AggregatorID, "first", d.FirstHealth, "dropped", nh, "dropped_unlogged_before", unlogged)
		}
	}
	n := 0
	for reason, c := range d.ByReason {
		m.svcRejected.WithLabelValues(reason).Add(float64(c))
		n += c
	}
	if n == 0 {
		return
	}
	if ok, unlogged := m.badLog.AllowN(logDropped, now, n); ok {
		log.Warn("service entries left out of a zone load; the rest of the zone was applied",
			"aggregator_id", d.AggregatorID, "first", d.First.Error(), "dropped", n, "dropped_unlogged_before", unlogged)
	}
}

// logEvery is how often each of noteDropped, noteRefused and noteShed
// logs at most.
const logEvery = 10 * time.Second

// The reasons of badLog.
const (
	logDropped = "service_entries_dropped"
	logRefused = "outbound_claims_refused"
	logShed    = "policy_peers_shed"
	// logDescriptors: noteDropped's descriptor entries and values.
	logDescriptors = "descriptor_entries_dropped"
	// logHealth: noteDropped's health entries.
	logHealth = "health_entries_dropped"
)

// noteRefused counts the outbound claims a tick refused and logs the first,
// at most once per logEvery.
func (m *metrics) noteRefused(log *slog.Logger, refused []RefusedClaim, now time.Time) {
	if len(refused) == 0 {
		return
	}
	for _, c := range refused {
		m.claimsRefused.WithLabelValues(c.Reason).Inc()
	}
	if ok, unlogged := m.badLog.AllowN(logRefused, now, len(refused)); ok {
		c := refused[0]
		log.Warn("outbound claims left out of the law",
			"callee", c.Callee, "caller", c.Caller, "reason", c.Reason, "claimed_offered_rps", c.Offered, "refused", len(refused), "refused_unlogged_before", unlogged)
	}
}

// noteShed counts the peers a tick left out of policies and logs the first
// policy, at most once per logEvery.
func (m *metrics) noteShed(log *slog.Logger, shed []ShedPeers, now time.Time) {
	n := 0
	for _, sp := range shed {
		n += sp.Shed
	}
	if n == 0 {
		return
	}
	m.peersShed.Add(float64(n))
	if ok, unlogged := m.badLog.AllowN(logShed, now, n); ok {
		sp := shed[0]
		log.Warn("policy peers shed: the policy would list more peers than a sidecar accepts",
			"policy", sp.Policy, "shed", sp.Shed, "kept", sp.Kept, "largest_shed_offered_rps", sp.Largest,
			"policies", len(shed), "shed_unlogged_before", unlogged)
	}
}
