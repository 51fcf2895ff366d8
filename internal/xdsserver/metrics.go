package xdsserver

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/internal/recvfail"
)

// metrics are resolved once at construction, so callbacks on the stream
// path do no label lookups.
type metrics struct {
	streams        prometheus.Gauge
	resources      prometheus.Gauge
	updates        prometheus.Counter
	nacks          prometheus.Counter
	moved          prometheus.Counter
	movedFull      prometheus.Counter
	requestsSotW   prometheus.Counter
	requestsDelta  prometheus.Counter
	responsesSotW  prometheus.Counter
	responsesDelta prometheus.Counter
	badMessages    *prometheus.CounterVec // by recvfail reason
}

func newMetrics(reg prometheus.Registerer, logger *slog.Logger) metrics {
	const ns, sub = "sluice", "controller_xds"
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_total",
		Help: "xDS requests received (subscriptions, ACKs and NACKs), by protocol.",
	}, []string{"protocol"})
	responses := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "responses_total",
		Help: "xDS responses sent, by protocol.",
	}, []string{"protocol"})
	m := metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "streams",
			Help: "Open ADS streams, SotW and delta.",
		}),
		resources: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "resources",
			Help: "DropPolicy resources in the served table.",
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "updates_total",
			Help: "Batches applied to the served table (one per controller tick with changes).",
		}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "moved_answers_total",
			Help: "Callee policies asked of this controller shard that another shard owns, answered with where to go (at most once per name).",
		}),
		movedFull: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "moved_full_total",
			Help: "Streams ended because they asked for another shard's callee once this shard held as many moved answers as it may (100,000).",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "nacks_total",
			Help: "Responses rejected by clients (requests carrying error_detail).",
		}),
		requestsSotW:   requests.WithLabelValues("sotw"),
		requestsDelta:  requests.WithLabelValues("delta"),
		responsesSotW:  responses.WithLabelValues("sotw"),
		responsesDelta: responses.WithLabelValues("delta"),
		badMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "bad_messages_total",
			Help: "ADS streams ended on a message the server could not take, by reason: too_large (above the receive limit), unparseable (not a discovery request, invalid UTF-8).",
		}, []string{"reason"}),
	}
	for _, r := range []string{recvfail.TooLarge, recvfail.Unparseable} {
		m.badMessages.WithLabelValues(r)
	}
	if reg == nil {
		return m
	}
	for _, c := range []prometheus.Collector{m.streams, m.resources, m.updates, m.nacks, m.moved, m.movedFull, requests, responses, m.badMessages} {
		// Registering is best effort: a second Server on the same registry
		// (tests, or a process serving twice) must not panic. Its metrics
		// then stay unexported, which the log says.
		if err := reg.Register(c); err != nil {
			logger.Warn("xds server metric not registered", "error", err)
		}
	}
	return m
}
