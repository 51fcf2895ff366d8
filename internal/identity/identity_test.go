package identity

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/identity/devpki"
)

const td = "example.org"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		uri     string
		want    ID
		wantErr string
	}{
		{uri: "spiffe://example.org/ns/shop/sa/checkout", want: ID{Kind: Workload, Namespace: "shop", Service: "checkout"}},
		{uri: "spiffe://example.org/sluice/service/checkout", want: ID{Kind: Workload, Service: "checkout"}},
		{uri: "spiffe://example.org/sluice/aggregator/zone-a", want: ID{Kind: Aggregator, Zone: "zone-a"}},
		{uri: "spiffe://example.org/sluice/aggregator", want: ID{Kind: Aggregator}},
		{uri: "spiffe://example.org/sluice/controller", want: ID{Kind: Controller}},
		{uri: "spiffe://other.org/sluice/controller", wantErr: "wrong trust domain"},
		{uri: "https://example.org/sluice/controller", wantErr: "not a spiffe://"},
		{uri: "spiffe://example.org/sluice/controller/x", wantErr: "unknown path"},
		{uri: "spiffe://example.org/ns/shop/sa/_overflow", wantErr: "reserved"},
		{uri: "spiffe://example.org/sluice/service/bad%20name", wantErr: "service"},
		{uri: "spiffe://example.org:8443/sluice/controller", wantErr: "not a spiffe://"},
	} {
		got, err := Parse(tc.uri, td)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse(%q) = %+v, %v; want error containing %q", tc.uri, got, err, tc.wantErr)
			}
			continue
		}
		tc.want.URI, tc.want.TrustDomain = tc.uri, td
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.uri, got, err, tc.want)
		}
	}
}

func TestFlagsValidate(t *testing.T) {
	for _, tc := range []struct {
		f       Flags
		wantErr []string // every one must be named
	}{
		{f: Flags{TrustDomain: td}},
		{f: Flags{Cert: "c", Key: "k", CA: "a", TrustDomain: td}},
		{f: Flags{Cert: "c", TrustDomain: td}, wantErr: []string{"tls-key: required", "tls-ca: required"}},
		{f: Flags{Key: "k", CA: "a", TrustDomain: td}, wantErr: []string{"tls-cert: required"}},
		{f: Flags{CA: "a", TrustDomain: "Bad Domain"}, wantErr: []string{"tls-cert", "tls-key", "trust-domain"}},
	} {
		err := tc.f.Validate()
		if len(tc.wantErr) == 0 && err != nil {
			t.Errorf("%+v: unexpected error %v", tc.f, err)
		}
		if len(tc.wantErr) > 0 && err == nil {
			t.Errorf("%+v: no error, want %v", tc.f, tc.wantErr)
		}
		for _, w := range tc.wantErr {
			if err != nil && !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not name %q", tc.f, err, w)
			}
		}
	}
}

func TestPlaintextSaysSo(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs strings.Builder
	src, err := Flags{TrustDomain: td}.Setup(slogTo(&logs), reg)
	if err != nil || src != nil {
		t.Fatalf("Setup() = %v, %v; want nil, nil", src, err)
	}
	if !strings.Contains(logs.String(), "PLAINTEXT MODE") || !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("no loud warning in %q", logs.String())
	}
	if v := gaugeValue(t, reg, "sluice_tls_enabled"); v != 0 {
		t.Errorf("sluice_tls_enabled = %v, want 0", v)
	}
}

// pki is an in-test CA with helpers that write certificates to files.
type pki struct {
	t   *testing.T
	ca  *devpki.CA
	dir string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := devpki.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, ca: ca, dir: t.TempDir()}
}

func (p *pki) files(name, uri string) devpki.Files {
	p.t.Helper()
	leaf, err := p.ca.Issue(uri, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	f, err := p.ca.WriteLeaf(p.dir, name, leaf)
	if err != nil {
		p.t.Fatal(err)
	}
	return f
}

func (p *pki) source(name, uri string, reg prometheus.Registerer) *Source {
	p.t.Helper()
	f := p.files(name, uri)
	s, err := NewSource(Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: td, CheckInterval: -1, Registerer: reg})
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// serveTLS accepts connections on loopback with cfg, handshakes, writes
// "ok" and closes; it reports each handshake's result.
func serveTLS(t *testing.T, cfg *tls.Config) (string, <-chan error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			err = c.(*tls.Conn).Handshake()
			if err == nil {
				_, err = c.Write([]byte("ok"))
			}
			c.Close()
			select {
			case results <- err:
			default:
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), results
}

// dial handshakes with cfg and reads the server's "ok": in TLS 1.3 the
// client finishes its handshake before the server has checked its
// certificate, so only the read shows a refusal.
func dial(addr string, cfg *tls.Config) error {
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ok" {
		return errors.New("unexpected answer " + string(buf))
	}
	return nil
}

func wait(t *testing.T, results <-chan error) error {
	t.Helper()
	select {
	case err := <-results:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("server saw no handshake")
		return nil
	}
}

func TestHandshakes(t *testing.T) {
	p := newPKI(t)
	reg := prometheus.NewRegistry()
	server := p.source("controller", ControllerURI(td), reg)
	addr, results := serveTLS(t, server.ServerTLS(nil))
	client := p.source("checkout", WorkloadURI(td, "checkout"), nil)

	t.Run("workload to controller", func(t *testing.T) {
		if err := dial(addr, client.ClientTLS(Kinds(Controller))); err != nil {
			t.Fatalf("dial: %v", err)
		}
		if err := wait(t, results); err != nil {
			t.Fatalf("server: %v", err)
		}
	})
	t.Run("dialer refuses a server of the wrong kind", func(t *testing.T) {
		err := dial(addr, client.ClientTLS(Kinds(Aggregator)))
		if err == nil || !strings.Contains(err.Error(), "want [aggregator]") {
			t.Fatalf("dial = %v, want the server's identity refused", err)
		}
		wait(t, results)
	})
	t.Run("wrong trust domain refused", func(t *testing.T) {
		other := p.files("other-td", "spiffe://other.org/sluice/service/checkout")
		cert, err := tls.LoadX509KeyPair(other.Cert, other.Key)
		if err != nil {
			t.Fatal(err)
		}
		cfg := client.ClientTLS(Kinds(Controller))
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		if err := dial(addr, cfg); err == nil {
			t.Fatal("a client of another trust domain was served")
		}
		if err := wait(t, results); err == nil || !strings.Contains(err.Error(), "wrong trust domain") {
			t.Fatalf("server: %v, want wrong trust domain", err)
		}
		if v := counterValue(t, reg, "sluice_tls_handshakes_rejected_total", "trust_domain"); v != 1 {
			t.Errorf("rejected{trust_domain} = %v, want 1", v)
		}
	})
	t.Run("client without a certificate refused", func(t *testing.T) {
		cfg := client.ClientTLS(Kinds(Controller))
		cfg.GetClientCertificate = nil
		if err := dial(addr, cfg); err == nil {
			t.Fatal("a client without a certificate was served")
		}
		if err := wait(t, results); err == nil {
			t.Fatal("server accepted a client without a certificate")
		}
	})
	t.Run("certificate of another CA refused", func(t *testing.T) {
		stranger := newPKI(t).source("checkout", WorkloadURI(td, "checkout"), nil)
		// The stranger trusts our server's CA, so that only the server's
		// check of the client is tested.
		cfg := stranger.ClientTLS(Kinds(Controller))
		cfg.VerifyPeerCertificate = nil
		if err := dial(addr, cfg); err == nil {
			t.Fatal("a client of another CA was served")
		}
		if err := wait(t, results); err == nil || !strings.Contains(err.Error(), "verify peer certificate") {
			t.Fatalf("server: %v, want an unverified chain", err)
		}
	})
	t.Run("TLS 1.2 refused", func(t *testing.T) {
		cfg := client.ClientTLS(Kinds(Controller))
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		err := dial(addr, cfg)
		if err == nil || !strings.Contains(err.Error(), "protocol version") {
			t.Fatalf("dial with TLS 1.2 = %v, want a protocol version alert", err)
		}
		wait(t, results)
	})
}

func TestRotation(t *testing.T) {
	p := newPKI(t)
	reg := prometheus.NewRegistry()
	server := p.source("controller", ControllerURI(td), reg)
	client := p.source("checkout", WorkloadURI(td, "checkout"), nil)
	addr, results := serveTLS(t, server.ServerTLS(nil))

	serialSeen := func() string {
		t.Helper()
		var got string
		cfg := client.ClientTLS(Kinds(Controller))
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			got = cs.PeerCertificates[0].SerialNumber.String()
			return nil
		}
		if err := dial(addr, cfg); err != nil {
			t.Fatalf("dial: %v", err)
		}
		if err := wait(t, results); err != nil {
			t.Fatalf("server: %v", err)
		}
		return got
	}
	first := serialSeen()
	if first != server.Leaf().SerialNumber.String() {
		t.Fatalf("served serial %s, loaded %s", first, server.Leaf().SerialNumber)
	}

	// A renewal: new files under the same names; no restart.
	p.files("controller", ControllerURI(td))
	second := serialSeen()
	if second == first {
		t.Fatalf("after rotation the server still presents serial %s", first)
	}
	if v := counterValue(t, reg, "sluice_tls_reloads_total", "ok"); v != 1 {
		t.Errorf("reloads{ok} = %v, want 1", v)
	}

	// A bad new certificate: the last good one stays, the error is counted.
	if err := os.WriteFile(filepath.Join(p.dir, "controller.crt"), []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := serialSeen(); got != second {
		t.Fatalf("after a bad file the server presents %s, want the last good %s", got, second)
	}
	if v := counterValue(t, reg, "sluice_tls_reloads_total", "error"); v != 1 {
		t.Errorf("reloads{error} = %v, want 1", v)
	}
	if got := serialSeen(); got != second {
		t.Fatalf("server presents %s, want %s", got, second)
	}
	if v := counterValue(t, reg, "sluice_tls_reloads_total", "error"); v != 1 {
		t.Errorf("a bad file was reported again: reloads{error} = %v, want 1", v)
	}

	// A new CA: the client, re-reading its bundle too, trusts a server
	// signed by it; nothing restarted.
	q := &pki{t: t, ca: mustCA(t), dir: p.dir}
	q.files("controller", ControllerURI(td))
	q.files("checkout", WorkloadURI(td, "checkout"))
	if got := serialSeen(); got == second {
		t.Fatal("after a CA rotation the server still presents the old certificate")
	}
}

func mustCA(t *testing.T) *devpki.CA {
	ca, err := devpki.NewCA("second ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestStartupErrors(t *testing.T) {
	p := newPKI(t)
	f := p.files("checkout", WorkloadURI(td, "checkout"))
	other := newPKI(t)
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"missing file", Config{CertFile: f.Cert, KeyFile: filepath.Join(p.dir, "nope"), CAFile: f.CA, TrustDomain: td}, "nope"},
		{"other trust domain", Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: "other.org"}, "wrong trust domain"},
		{"not signed by the bundle", Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: other.files("x", ControllerURI(td)).CA, TrustDomain: td}, "does not verify"},
	} {
		if _, err := NewSource(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: NewSource = %v, want an error containing %q", tc.name, err, tc.wantErr)
		}
	}
	src, err := Flags{Cert: f.Cert, Key: f.Key, CA: f.CA, TrustDomain: td}.Setup(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Require(Workload, "checkout"); err != nil {
		t.Errorf("Require(workload checkout) = %v", err)
	}
	if err := src.Require(Workload, "web"); err == nil {
		t.Error("a checkout certificate passed for web")
	}
	if err := src.Require(Controller, ""); err == nil {
		t.Error("a workload certificate passed for a controller")
	}
}

// TestGRPCPeer runs gRPC over the Source's credentials and reads the
// client's identity on the server, as the aggregator and controller do.
func TestGRPCPeer(t *testing.T) {
	p := newPKI(t)
	server := p.source("aggregator", AggregatorURI(td, "zone-a"), nil)
	client := p.source("checkout", "spiffe://example.org/ns/shop/sa/checkout", nil)

	seen := make(chan ID, 1)
	g := grpc.NewServer(server.ServerOption(), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			id, err := Peer(ctx)
			if err != nil {
				return nil, err
			}
			seen <- id
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(g, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)

	// Dialled by IP: no DNS name is checked, the identity is.
	cc, err := grpc.NewClient(ln.Addr().String(), client.DialOption(Kinds(Aggregator)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	id := <-seen
	if id.Kind != Workload || id.Service != "checkout" || id.Namespace != "shop" {
		t.Errorf("server saw %+v, want workload checkout in shop", id)
	}

	// A dialer that expects a controller refuses the aggregator.
	cc2, err := grpc.NewClient(ln.Addr().String(), client.DialOption(Kinds(Controller)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	if _, err := healthpb.NewHealthClient(cc2).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil || !strings.Contains(err.Error(), "want [controller]") {
		t.Errorf("Check against the wrong kind of server = %v, want refused", err)
	}
}
