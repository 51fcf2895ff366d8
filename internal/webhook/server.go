package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// Config is the injector's configuration.
type Config struct {
	// Inject is what every sidecar gets.
	Inject inject.Config
	// CertFile and KeyFile hold the serving certificate (PEM), e.g. the
	// tls.crt and tls.key of a cert-manager Secret mounted as a volume.
	CertFile, KeyFile string
	// ClientCAFile, when set, makes the webhook require a client
	// certificate that chains to this bundle (the API server's, configured
	// through its admission kubeconfig); re-read when it changes. Empty, any
	// client that reaches the port is served.
	ClientCAFile string
	// SidecarTLS, with a trust domain, gives injected sidecars mutual TLS.
	SidecarTLS SidecarTLS
	// ShutdownTimeout bounds the graceful end of the HTTPS server.
	ShutdownTimeout time.Duration
}

// Validate reports every bad field at once, by flag name.
func (c Config) Validate() error {
	var errs []error
	if err := c.inject().Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.SidecarTLS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.CertFile == "" {
		errs = append(errs, errors.New("tls-cert-file: required"))
	}
	if c.KeyFile == "" {
		errs = append(errs, errors.New("tls-key-file: required"))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("shutdown-timeout: %v is not positive", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// inject is what every sidecar gets: Inject, told whether SidecarTLS gives
// sidecars certificates.
func (c Config) inject() inject.Config {
	in := c.Inject
	in.TLS = c.SidecarTLS.TrustDomain != ""
	return in
}

// Server is the webhook's HTTPS server.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler *Handler
	keys    *KeyPair
	clients *clientCAs // nil without ClientCAFile
}

// New loads the key pair and builds the handler; it starts nothing.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := NewHandler(cfg.inject(), log, reg)
	if err != nil {
		return nil, err
	}
	h.sidecarTLS = cfg.SidecarTLS
	keys, err := LoadKeyPair(cfg.CertFile, cfg.KeyFile, log)
	if err != nil {
		return nil, err
	}
	notAfter := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_injector_cert_expiry_timestamp_seconds",
		Help: "NotAfter of the serving certificate, in Unix seconds.",
	})
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_injector_cert_reloads_total",
		Help: "Reloads of the serving certificate after its files changed, by result: ok or error (the previous certificate stays).",
	}, []string{"result"})
	ok, failed := reloads.WithLabelValues("ok"), reloads.WithLabelValues("error")
	notAfter.Set(float64(keys.Leaf().NotAfter.Unix()))
	keys.OnLoad = func(cert *x509.Certificate, err error) {
		if err != nil {
			failed.Inc()
			return
		}
		ok.Inc()
		notAfter.Set(float64(cert.NotAfter.Unix()))
	}
	if reg != nil {
		reg.MustRegister(notAfter, reloads)
	}
	srv := &Server{cfg: cfg, log: log, handler: h, keys: keys}
	if cfg.ClientCAFile != "" {
		if srv.clients, err = loadClientCAs(cfg.ClientCAFile, log); err != nil {
			return nil, err
		}
	} else {
		log.Warn("no --tls-client-ca-file: the webhook does not authenticate its callers; " +
			"any client that reaches its port may ask for patches (they reveal the injected sidecar's configuration)")
	}
	return srv, nil
}

// Handler is the webhook's HTTP handler, without TLS.
func (s *Server) Handler() http.Handler { return s.handler }

// KeyPair is the serving certificate.
func (s *Server) KeyPair() *KeyPair { return s.keys }

// TLSConfig is the server side of the TLS: TLS 1.3, the reloading
// certificate and, with ClientCAFile, a client certificate required and
// verified against the reloading bundle.
func (s *Server) TLSConfig() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: s.keys.GetCertificate}
	if s.clients != nil {
		// Per handshake, so that a new bundle applies without a restart.
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion:     tls.VersionTLS13,
				GetCertificate: s.keys.GetCertificate,
				ClientAuth:     tls.RequireAndVerifyClientCert,
				ClientCAs:      s.clients.get(),
			}, nil
		}
	}
	return cfg
}

// Serve serves HTTPS on ln until ctx ends, then shuts down gracefully
// within the shutdown timeout. It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		TLSConfig:         s.TLSConfig(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug), // TLS handshake noise
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-served:
		return fmt.Errorf("serve the webhook: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve the webhook: %w", err)
	}
	return nil
}
