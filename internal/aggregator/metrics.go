package aggregator

import (
	"log/slog"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/uplink"
)

// metrics are resolved once at construction, so the report path does no
// label lookups beyond a map read for a rejection.
type metrics struct {
	reports            prometheus.Counter
	rejectedBy         map[string]prometheus.Counter // by reason; every known reason up front
	rejectedOther      prometheus.Counter
	sidecars           prometheus.Gauge
	streams            prometheus.Gauge
	flushes            prometheus.Counter
	flushBuckets       prometheus.Gauge
	controllerRejected prometheus.Counter
	sumsCapped         prometheus.Counter
	shedServices       prometheus.Counter
	folded             map[string]prometheus.Counter // by bound; every FoldReasons up front
	entriesRejected    map[string]prometheus.Counter // by reason; every EntryReasons up front
	valuesClamped      prometheus.Counter
	// descriptorValues is per (service, descriptor) of the last zone load
	// only: Service.noteDescriptors deletes the series of those gone, so
	// its series are bounded as the zone load is.
	descriptorValues *prometheus.GaugeVec
	valuesCut        prometheus.Counter
	descriptorsCut   prometheus.Counter
	healthCut        prometheus.Counter
}

func (m *metrics) rejected(reason string) prometheus.Counter {
	if c, ok := m.rejectedBy[reason]; ok {
		return c
	}
	return m.rejectedOther
}

func newMetrics[Req, Resp any](reg prometheus.Registerer, logger *slog.Logger, ups func() []*uplink.Uplink[Req, Resp]) metrics {
	const ns, sub = "sluice", "aggregator"
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "reports_rejected_total",
		Help: "Load reports rejected whole, by reason.",
	}, []string{"reason"})
	folded := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "peers_folded_total",
		Help: "Peers of accepted load reports folded into _overflow (their rates kept, their own buckets not), by the bound they were beyond.",
	}, []string{"bound"})
	entries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "entries_rejected_total",
		Help: "Entries of accepted load reports left out (their load lost), by reason; the rest of each report was applied. A descriptor value's load stays in its descriptor's total.",
	}, []string{"reason"})
	m := metrics{
		reports: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reports_total",
			Help: "Load reports received, rejected ones included.",
		}),
		rejectedBy:      make(map[string]prometheus.Counter, len(Reasons)+1),
		folded:          make(map[string]prometheus.Counter, len(FoldReasons)),
		entriesRejected: make(map[string]prometheus.Counter, len(EntryReasons)),
		rejectedOther:   rejected.WithLabelValues("other"),
		sidecars: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "sidecars",
			Help: "Sidecars whose latest rates are kept.",
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "streams",
			Help: "Open load report streams.",
		}),
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flushes_total",
			Help: "Zone loads built and offered to the controller uplink.",
		}),
		flushBuckets: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "flush_buckets",
			Help: "(service, direction, peer, procedure) entries in the last zone load.",
		}),
		controllerRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "controller_rejected_total",
			Help: "Zone loads the controller answered with accepted=false.",
		}),
		sumsCapped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "sums_capped_total",
			Help: "Per-(service, caller, procedure) sums above the most the controller accepts (1e10 rps), capped at it.",
		}),
		valuesClamped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "descriptor_values_clamped_total",
			Help: "Descriptor values of accepted load reports that claimed more requests than their descriptor's total, clamped to it.",
		}),
		descriptorValues: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "descriptor_values",
			Help: "Distinct values of a descriptor that the zone's live sidecars reported, at the last flush, before the cut to --max-descriptor-values.",
		}, []string{"service", "descriptor"}),
		valuesCut: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "descriptor_values_cut_total",
			Help: "Descriptor values left out of zone loads beyond --max-descriptor-values, the smallest first; once per value per flush.",
		}),
		descriptorsCut: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "descriptors_cut_total",
			Help: "Descriptors of a service left out of zone loads beyond twice the most a service may declare, the smallest first; once per descriptor per flush.",
		}),
		healthCut: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "health_cut_total",
			Help: "Procedures' health of a service left out of zone loads beyond twice the most a policy may declare, the least answered first; once per procedure per flush.",
		}),
		shedServices: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "zone_load_shed_services_total",
			Help: "Services left out of a zone load, the largest first, to fit the controller's receive limit; once per service per flush.",
		}),
	}
	for _, r := range slices.Concat(Reasons, []string{ReasonSidecarIDChanged, ReasonTooLarge, ReasonUnparseable, ReasonIdentityMismatch, ReasonTooManyStreams}) {
		m.rejectedBy[r] = rejected.WithLabelValues(r)
	}
	for _, b := range FoldReasons {
		m.folded[b] = folded.WithLabelValues(b)
	}
	for _, r := range EntryReasons {
		m.entriesRejected[r] = entries.WithLabelValues(r)
	}
	if reg == nil {
		return m
	}
	for _, c := range append([]prometheus.Collector{
		m.reports, rejected, m.sidecars, m.streams, m.flushes, m.flushBuckets, m.controllerRejected,
		m.sumsCapped, m.shedServices, folded, entries,
		m.valuesClamped, m.descriptorValues, m.valuesCut, m.descriptorsCut, m.healthCut,
	}, uplinkCollectors(ups)...) {
		// Registering is best effort, as in the other services: a second
		// aggregator on the same registry must not fail or panic. Its
		// metrics then stay unexported, which the log says.
		if err := reg.Register(c); err != nil {
			logger.Warn("aggregator metric not registered", "error", err)
		}
	}
	return m
}

// uplinkCollectors are the metrics of the controller link, read from ups at
// scrape time. With fan-out there is one uplink per controller replica;
// the metrics add them up.
func uplinkCollectors[Req, Resp any](ups func() []*uplink.Uplink[Req, Resp]) []prometheus.Collector {
	const ns, sub = "sluice", "aggregator"
	stat := func(f func(uplink.Stats) uint64) func() float64 {
		return func() float64 {
			var n uint64
			for _, up := range ups() {
				n += f(up.Stats())
			}
			return float64(n)
		}
	}
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "controller_connected",
		Help: "Controller streams open that have answered: 1 for a single controller, the number of replicas reached with fan-out.",
	}, func() float64 {
		n := 0
		for _, up := range ups() {
			if up.Connected() {
				n++
			}
		}
		return float64(n)
	})
	superseded := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "uplink_superseded_total",
		Help: "Zone loads replaced by a newer one before they could be sent to the controller.",
	}, stat(func(s uplink.Stats) uint64 { return s.Superseded }))
	sent := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "uplink_sent_total",
		Help: "Zone loads sent to the controller (to each replica, with fan-out).",
	}, stat(func(s uplink.Stats) uint64 { return s.Sent }))
	failovers := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "controller_failovers_total",
		Help: "Failed or ended controller streams after which the aggregator moved to the next address.",
	}, stat(func(s uplink.Stats) uint64 { return s.Failovers }))
	return []prometheus.Collector{connected, superseded, sent, failovers}
}
