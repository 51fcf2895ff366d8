package identity

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// DefaultTrustDomain is Istio's default trust domain.
const DefaultTrustDomain = "cluster.local"

// Flags are the TLS flags every sluice binary that serves or dials has.
// All three files, or none: none is plaintext mode, for local development.
type Flags struct {
	Cert, Key, CA string
	TrustDomain   string
}

// AddFlags declares --tls-cert, --tls-key, --tls-ca and --trust-domain.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Cert, "tls-cert", "", "this process's certificate (PEM, with its chain): one spiffe:// URI SAN; re-read when it changes. Without the three --tls-* flags: plaintext, for local development only")
	fs.StringVar(&f.Key, "tls-key", "", "the certificate's private key (PEM); re-read when it changes")
	fs.StringVar(&f.CA, "tls-ca", "", "CA bundle (PEM) that every peer's certificate must chain to; re-read when it changes")
	fs.StringVar(&f.TrustDomain, "trust-domain", DefaultTrustDomain, "SPIFFE trust domain of every identity; peers of another are refused")
}

// Enabled reports whether any TLS file is given.
func (f Flags) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Validate names every missing flag of a partial configuration.
func (f Flags) Validate() error {
	var errs []error
	if f.Enabled() {
		for _, x := range []struct{ flag, v string }{{"tls-cert", f.Cert}, {"tls-key", f.Key}, {"tls-ca", f.CA}} {
			if x.v == "" {
				errs = append(errs, fmt.Errorf("%s: required with the other --tls-* flags (give --tls-cert, --tls-key and --tls-ca, or none for plaintext)", x.flag))
			}
		}
	}
	if err := CheckTrustDomain(f.TrustDomain); err != nil {
		errs = append(errs, fmt.Errorf("trust-domain: %w", err))
	}
	return errors.Join(errs...)
}

// Setup loads the files, or, without them, warns loudly that the process
// runs in plaintext mode. Either way it sets the gauge sluice_tls_enabled.
// A nil Source means plaintext.
func (f Flags) Setup(log *slog.Logger, reg prometheus.Registerer) (*Source, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	enabled := register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_tls_enabled",
		Help: "1 when every link of this process is mutual TLS; 0 in plaintext mode (local development only).",
	}))
	if !f.Enabled() {
		enabled.Set(0)
		if log != nil {
			log.Warn("PLAINTEXT MODE: no --tls-cert, --tls-key, --tls-ca: links are neither encrypted nor authenticated, " +
				"and any process that reaches this port may report any service's load or read any policy; for local development only")
		}
		return nil, nil
	}
	src, err := NewSource(Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: f.TrustDomain, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	enabled.Set(1)
	if log != nil {
		log.Info("mutual TLS on every link", "identity", src.ID().URI, "trust_domain", f.TrustDomain,
			"not_after", src.Leaf().NotAfter.UTC())
	}
	return src, nil
}

// Require checks that this process's own identity is of kind and, for a
// workload, of service name (for an aggregator, of zone name or zone-less):
// with a wrong certificate every peer would refuse it, and start-up is the
// place to say why.
func (s *Source) Require(kind Kind, name string) error {
	id := s.ID()
	switch {
	case id.Kind != kind:
		return fmt.Errorf("tls-cert: identity %s is a %v, this binary is a %v", id, id.Kind, kind)
	case kind == Workload && id.Service != name:
		return fmt.Errorf("tls-cert: identity %s is service %q, this sidecar fronts %q", id, id.Service, name)
	case kind == Aggregator && id.Zone != "" && id.Zone != name:
		return fmt.Errorf("tls-cert: identity %s is for zone %q, this aggregator's zone is %q", id, id.Zone, name)
	}
	return nil
}
