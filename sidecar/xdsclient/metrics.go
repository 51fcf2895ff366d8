package xdsclient

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	connected  prometheus.Gauge
	updates    prometheus.Counter
	nacks      prometheus.Counter
	reconnects prometheus.Counter
	moves      prometheus.Counter
	lastUpdate prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, logger *slog.Logger) metrics {
	const ns, sub = "sluice", "sidecar_xds"
	m := metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "connected",
			Help: "1 while an xDS stream is open and has received a response, else 0.",
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "updates_total",
			Help: "DropPolicy versions accepted and removals applied.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "nacks_total",
			Help: "xDS responses rejected (NACKed).",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reconnects_total",
			Help: "xDS stream attempts after the first.",
		}),
		moves: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "shard_moves_total",
			Help: "Moves to another controller shard: the shard asked said another owns the callee, or announced a shard count that moves it.",
		}),
		lastUpdate: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_update_timestamp_seconds",
			Help: "Unix time of the last accepted DropPolicy update or removal.",
		}),
	}
	if reg == nil {
		return m
	}
	for _, c := range []prometheus.Collector{m.connected, m.updates, m.nacks, m.reconnects, m.moves, m.lastUpdate} {
		// Best effort, so that two clients on one registry (tests) do not
		// panic; the second one's metrics then stay unexported.
		if err := reg.Register(c); err != nil {
			logger.Warn("xds client metric not registered", "error", err)
		}
	}
	return m
}
