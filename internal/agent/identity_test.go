package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
)

// offered is how many requests from caller the agent counted.
func offered(a *Agent, service, caller string) uint64 {
	var n uint64
	for _, pc := range a.Limiter().AppendCounts(service, nil) {
		if pc.Peer == caller {
			n += pc.Offered
		}
	}
	return n
}

// A request its caller marked as decided upstream passes uncounted only
// with --trust-decided: by default it is decided and counted like any other.
func TestTrustDecided(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer app.Close()
	for _, trust := range []bool{false, true} {
		cfg := validConfig()
		cfg.Upstream = app.URL
		cfg.TrustDecided = trust
		a, err := New(cfg, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set(cfg.CallerHeader, "web")
		req.Header.Set("x-sluice-decided", "web")
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, req)
		a.Close()
		if rec.Code != http.StatusOK {
			t.Fatalf("trust-decided %v: status %d, want 200", trust, rec.Code)
		}
		if want := map[bool]uint64{false: 1, true: 0}[trust]; offered(a, cfg.Service, "web") != want {
			t.Errorf("trust-decided %v: web offered %d, want %d", trust, offered(a, cfg.Service, "web"), want)
		}
	}
}

// mtls without a TLS configuration that requires client certificates is
// a start-up error naming the flags.
func TestMTLSNeedsTLS(t *testing.T) {
	cfg := validConfig()
	cfg.CallerIdentity = MTLSIdentity
	if _, err := New(cfg, nil, nil); err == nil || !strings.Contains(err.Error(), "mtls needs --tls-cert") {
		t.Errorf("mtls without TLS: %v, want an error naming the TLS flags", err)
	}
}

// tlsSource issues a certificate for uri and loads it as a Source.
func tlsSource(t *testing.T, ca *devpki.CA, dir, name, uri string) *identity.Source {
	t.Helper()
	leaf, err := ca.Issue(uri, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.WriteLeaf(dir, name, leaf)
	if err != nil {
		t.Fatal(err)
	}
	src, err := identity.NewSource(identity.Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: "example.org"})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// In mtls mode the proxy port serves TLS with client certificates: an
// HTTP/1.1 request is counted as its certificate's service, whatever its
// caller header says, a gRPC call goes through over h2 (ALPN) to an h2c
// app, and a client without a certificate is refused at the handshake.
func TestMTLSProxyPort(t *testing.T) {
	ca, err := devpki.NewCA("test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	server := tlsSource(t, ca, dir, "checkout", "spiffe://example.org/ns/shop/sa/checkout")
	client := tlsSource(t, ca, dir, "web", "spiffe://example.org/ns/shop/sa/web")

	// The app: a gRPC health server, which also answers plain HTTP/2
	// prior-knowledge requests; HTTP/1.1 goes to a plain handler.
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	appSrv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 {
			g.ServeHTTP(w, r)
			return
		}
		w.Write([]byte("ok"))
	})}
	go appSrv.Serve(appLn)
	defer appSrv.Close()

	cfg := validConfig()
	cfg.Upstream = "http://" + appLn.Addr().String()
	cfg.CallerIdentity = MTLSIdentity
	cfg.TrustDomain = "example.org"
	cfg.ServerTLS = server.ServerTLS(identity.Kinds(identity.Workload))
	a, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server("")
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	addr := ln.Addr().String()

	clientTLS := client.ClientTLS(identity.Kinds(identity.Workload))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 5 * time.Second}
	req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/", nil)
	req.Header.Set("x-sluice-caller", "abuser")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || offered(a, "checkout", "web") != 1 || offered(a, "checkout", "abuser") != 0 {
		t.Errorf("HTTP/1.1 with web's certificate claiming abuser: %d, web %d, abuser %d; want 200 counted as web",
			res.StatusCode, offered(a, "checkout", "web"), offered(a, "checkout", "abuser"))
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("gRPC over TLS through the sidecar: %v", err)
	}
	if offered(a, "checkout", "web") != 2 {
		t.Errorf("web offered %d after the gRPC call, want 2", offered(a, "checkout", "web"))
	}

	// No certificate: no handshake. The CA is trusted, so that only the
	// missing client certificate fails it.
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	bare := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}}, Timeout: 5 * time.Second}
	if res, err := bare.Get("https://" + addr + "/"); err == nil {
		res.Body.Close()
		t.Errorf("a client without a certificate got %d, want the handshake refused", res.StatusCode)
	} else if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a client without a certificate: %v", err)
	}
}
