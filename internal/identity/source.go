package identity

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// DefaultCheckInterval is how often, at most, a Source looks at its files
// again. Handshakes are rare (streams are long-lived), so a stat of three
// files per second at most costs nothing, and rotation tools renew
// certificates days before they expire.
const DefaultCheckInterval = time.Second

// Config says where a Source finds its files.
type Config struct {
	CertFile, KeyFile, CAFile string
	TrustDomain               string
	// CheckInterval bounds how often the files are looked at; 0 means
	// DefaultCheckInterval, negative on every handshake (tests).
	CheckInterval time.Duration
	Logger        *slog.Logger
	// Registerer receives sluice_tls_* metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Source holds this process's certificate, key and CA bundle, re-read when
// the files change, and builds the TLS configurations of both ends of a
// link from them. Its methods are safe for concurrent use; every handshake
// sees the newest good files.
type Source struct {
	cfg Config
	log *slog.Logger
	m   sourceMetrics

	mu        sync.Mutex // guards the fields below
	cert      *tls.Certificate
	id        ID // of cert
	roots     *x509.CertPool
	sum       [sha256.Size]byte // of the three files' contents when loaded
	failedSum [sha256.Size]byte // of contents that failed to load, so a bad set is reported once
	checked   time.Time
}

// NewSource reads the three files once; failing here is a start-up error.
// The certificate must carry exactly one URI SAN in the trust domain.
func NewSource(cfg Config) (*Source, error) {
	if err := CheckTrustDomain(cfg.TrustDomain); err != nil {
		return nil, fmt.Errorf("trust-domain: %w", err)
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{cfg: cfg, log: log, m: newSourceMetrics(cfg.Registerer)}
	data, sum, err := s.read()
	if err != nil {
		return nil, err
	}
	if err := s.load(data, sum); err != nil {
		return nil, err
	}
	s.checked = time.Now()
	return s, nil
}

// ID is this process's own identity, from its current certificate.
func (s *Source) ID() ID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// TrustDomain is the trust domain every peer must be in.
func (s *Source) TrustDomain() string { return s.cfg.TrustDomain }

// Leaf is the current certificate.
func (s *Source) Leaf() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert.Leaf
}

// refresh re-reads the files if CheckInterval has passed and they changed.
// A set that does not load (a certificate renewed before its key, a CA
// bundle half written) is logged and counted once, and the last good one
// stays until the files change again.
func (s *Source) refresh() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.cfg.CheckInterval > 0 && now.Sub(s.checked) < s.cfg.CheckInterval {
		return
	}
	s.checked = now
	data, sum, err := s.read()
	switch {
	case err != nil:
		// Files missing for a moment (a symlink swap): keep what we have.
		if sum != s.failedSum {
			s.failedSum = sum
			s.m.reloadErr.Inc()
			s.log.Error("reload TLS files; the previous certificate stays", "err", err)
		}
		return
	case sum == s.sum, sum == s.failedSum:
		return
	}
	if err := s.load(data, sum); err != nil {
		s.failedSum = sum
		s.m.reloadErr.Inc()
		s.log.Error("reload TLS files; the previous certificate stays", "err", err)
		return
	}
	s.m.reloadOK.Inc()
	s.log.Info("TLS certificate reloaded", "identity", s.id.URI,
		"not_after", s.cert.Leaf.NotAfter.UTC().Format(time.RFC3339), "serial", s.cert.Leaf.SerialNumber.String())
}

// read returns the contents of the three files and a digest of them.
// Contents, not modification times, decide whether anything changed: the
// kubelet's atomic symlink swap and a copy that keeps the mtime both show.
func (s *Source) read() ([3][]byte, [sha256.Size]byte, error) {
	var data [3][]byte
	h := sha256.New()
	var errs []error
	for i, f := range []string{s.cfg.CertFile, s.cfg.KeyFile, s.cfg.CAFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", f, err))
		}
		data[i] = b
		h.Write(b)
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return data, sum, errors.Join(errs...)
}

// load parses a set of files and installs it; s.mu is held or s is new.
func (s *Source) load(data [3][]byte, sum [sha256.Size]byte) error {
	cert, err := tls.X509KeyPair(data[0], data[1])
	if err != nil {
		return fmt.Errorf("load the key pair %s, %s: %w", s.cfg.CertFile, s.cfg.KeyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("parse %s: %w", s.cfg.CertFile, err)
		}
	}
	id, err := idOf(cert.Leaf, s.cfg.TrustDomain)
	if err != nil {
		return fmt.Errorf("%s: %w", s.cfg.CertFile, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data[2]) {
		return fmt.Errorf("%s: no PEM certificate in the CA bundle", s.cfg.CAFile)
	}
	// Our own certificate must verify against our own bundle: if it does
	// not, every peer would refuse us, and saying so here names the cause.
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("%s does not verify against the CA bundle %s: %w", s.cfg.CertFile, s.cfg.CAFile, err)
	}
	s.cert, s.id, s.roots, s.sum, s.failedSum = &cert, id, roots, sum, [sha256.Size]byte{}
	s.m.expiry.Set(float64(cert.Leaf.NotAfter.Unix()))
	return nil
}

// idOf reads the one URI SAN of a certificate.
func idOf(c *x509.Certificate, trustDomain string) (ID, error) {
	if len(c.URIs) != 1 {
		return ID{}, fmt.Errorf("certificate %q has %d URI SANs, want exactly one spiffe:// ID", c.Subject.CommonName, len(c.URIs))
	}
	return Parse(c.URIs[0].String(), trustDomain)
}

func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert, s.roots
}

// verify checks a peer's chain against the current CA bundle for the given
// usage, reads its identity and asks allow.
func (s *Source) verify(raw [][]byte, usage x509.ExtKeyUsage, allow Allow) (ID, error) {
	if len(raw) == 0 {
		s.m.rejected("no_certificate").Inc()
		return ID{}, errors.New("peer sent no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, der := range raw {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			s.m.rejected("bad_certificate").Inc()
			return ID{}, fmt.Errorf("parse peer certificate: %w", err)
		}
		certs[i] = c
	}
	_, roots := s.current()
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		s.m.rejected("untrusted").Inc()
		return ID{}, fmt.Errorf("verify peer certificate: %w", err)
	}
	id, err := idOf(certs[0], s.cfg.TrustDomain)
	if err != nil {
		if errors.Is(err, ErrTrustDomain) {
			s.m.rejected("trust_domain").Inc()
		} else {
			s.m.rejected("bad_identity").Inc()
		}
		return ID{}, err
	}
	if allow != nil {
		if err := allow(id); err != nil {
			s.m.rejected("not_allowed").Inc()
			return ID{}, err
		}
	}
	return id, nil
}

// ServerTLS is the server end: TLS 1.3 only, our current certificate, and a
// client certificate required, verified against the current CA bundle and
// its identity passed to allow (nil allows the whole trust domain).
func (s *Source) ServerTLS(allow Allow) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// RequireAnyClientCert plus our own verification, rather than
		// ClientCAs: the CA bundle can change under a running server.
		ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _ := s.current()
			return c, nil
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := s.verify(raw, x509.ExtKeyUsageClientAuth, allow)
			return err
		},
	}
}

// ClientTLS is the dialing end: TLS 1.3 only, our current certificate, and
// the server verified by its SPIFFE identity (passed to allow), not by a
// DNS name: a Kubernetes Service name says nothing about who answers.
func (s *Source) ClientTLS(allow Allow) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain and identity are checked in VerifyPeerCertificate
		// against the current bundle; host names are not what we trust.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _ := s.current()
			return c, nil
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := s.verify(raw, x509.ExtKeyUsageServerAuth, allow)
			return err
		},
	}
}

// ServerOption is the gRPC server option for ServerTLS(nil): every identity
// of the trust domain may connect; each service decides per stream.
func (s *Source) ServerOption() grpc.ServerOption {
	return grpc.Creds(credentials.NewTLS(s.ServerTLS(nil)))
}

// DialOption is the gRPC dial option for ClientTLS(allow).
func (s *Source) DialOption(allow Allow) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(s.ClientTLS(allow)))
}

// ErrNoIdentity is returned by Peer for a stream without a verified
// certificate (a plaintext connection).
var ErrNoIdentity = errors.New("no TLS client identity")

// Peer returns the identity of the peer of a gRPC stream or call. Its
// certificate was verified at the handshake, trust domain included; this
// only reads it.
func Peer(ctx context.Context) (ID, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return ID{}, ErrNoIdentity
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return ID{}, ErrNoIdentity
	}
	return idOf(info.State.PeerCertificates[0], "")
}
