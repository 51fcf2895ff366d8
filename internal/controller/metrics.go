package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/limits"
)

type metrics struct {
	tickSeconds   prometheus.Histogram
	aggregators   prometheus.Gauge
	buckets       prometheus.Gauge
	warm          prometheus.Gauge
	published     prometheus.Counter
	deleted       prometheus.Counter
	publishErrors prometheus.Counter
	accepted      prometheus.Counter
	rejected      *prometheus.CounterVec
	streams       prometheus.Gauge
	limitServices prometheus.Gauge
	offered       *prometheus.GaugeVec
	dropped       *prometheus.GaugeVec

	// services with a per-service series, so that vanished ones are deleted;
	// touched only by the tick goroutine.
	seen map[string]bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		tickSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_controller_tick_duration_seconds",
			Help:    "Time to sum zone loads, run the control law and build policies, per tick.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		aggregators:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_aggregators", Help: "Aggregators whose zone loads are in the sums."}),
		buckets:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_buckets", Help: "(callee, caller) buckets the control law ran over in the last tick."}),
		warm:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_warm", Help: "1 once the start-up warm-up is over and policies are published."}),
		published:     prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_policies_published_total", Help: "DropPolicy resources pushed (changed or refreshed)."}),
		deleted:       prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_policies_deleted_total", Help: "DropPolicy resources removed after their service vanished."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_publish_errors_total", Help: "Ticks whose policies could not be handed to the xDS cache."}),
		accepted:      prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_controller_zone_loads_total", Help: "Zone loads accepted from aggregators."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_controller_zone_loads_rejected_total", Help: "Zone loads rejected, by reason.",
		}, []string{"reason"}),
		streams:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_zone_streams", Help: "Open zone-load streams from aggregators."}),
		limitServices: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_controller_limit_services", Help: "Services with configured limits."}),
		offered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_offered_rps", Help: "Global offered rate per callee, dropped requests included.",
		}, []string{"service"}),
		dropped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_controller_dropped_rps", Help: "Global rate of enforced drops per callee, as sidecars reported them.",
		}, []string{"service"}),
		seen: map[string]bool{},
	}
	if reg != nil {
		reg.MustRegister(m.tickSeconds, m.aggregators, m.buckets, m.warm, m.published, m.deleted, m.publishErrors,
			m.accepted, m.rejected, m.streams, m.limitServices, m.offered, m.dropped)
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
	m.published.Add(float64(len(res.Changed)))
	m.deleted.Add(float64(len(res.Deleted)))
	for svc, tot := range res.Services {
		m.offered.WithLabelValues(svc).Set(tot.Offered)
		m.dropped.WithLabelValues(svc).Set(tot.Dropped)
		m.seen[svc] = true
	}
	for svc := range m.seen {
		if _, ok := res.Services[svc]; !ok {
			m.offered.DeleteLabelValues(svc)
			m.dropped.DeleteLabelValues(svc)
			delete(m.seen, svc)
		}
	}
}
