package identity

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// sourceMetrics are per process: every Source of a process shares them
// (registering twice reuses the first collectors).
type sourceMetrics struct {
	reloadOK, reloadErr prometheus.Counter
	expiry              prometheus.Gauge
	rejectedVec         *prometheus.CounterVec
}

func newSourceMetrics(reg prometheus.Registerer) sourceMetrics {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_tls_reloads_total",
		Help: "Reloads of the TLS certificate, key and CA bundle after their files changed, by result: ok or error (the previous ones stay).",
	}, []string{"result"})
	expiry := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_tls_cert_expiry_timestamp_seconds",
		Help: "NotAfter of this process's TLS certificate, in Unix seconds.",
	})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_tls_handshakes_rejected_total",
		Help: "TLS handshakes refused because of the peer's certificate, by reason: no_certificate, bad_certificate, untrusted, trust_domain, bad_identity, not_allowed.",
	}, []string{"reason"})
	reloads = register(reg, reloads)
	expiry = register(reg, expiry)
	rejected = register(reg, rejected)
	// Every reason exists from the start, at zero, so that a rate alert
	// sees the first refusal.
	for _, r := range []string{"no_certificate", "bad_certificate", "untrusted", "trust_domain", "bad_identity", "not_allowed"} {
		rejected.WithLabelValues(r)
	}
	return sourceMetrics{
		reloadOK:    reloads.WithLabelValues("ok"),
		reloadErr:   reloads.WithLabelValues("error"),
		expiry:      expiry,
		rejectedVec: rejected,
	}
}

// rejected is called per refused handshake, never per request.
func (m sourceMetrics) rejected(reason string) prometheus.Counter {
	return m.rejectedVec.WithLabelValues(reason)
}

// register registers c, or returns the collector already registered under
// its name (a process with two Sources, or tests sharing a registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
