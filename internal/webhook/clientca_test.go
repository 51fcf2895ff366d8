package webhook

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/identity/devpki"
)

// TestClientCertificateRequired: with --tls-client-ca-file the webhook
// serves only callers whose certificate chains to the bundle, over TLS 1.3.
func TestClientCertificateRequired(t *testing.T) {
	ca := newCA(t)
	certPEM, keyPEM := ca.issue(t, 1)
	vol := newSecretVolume(t, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})
	clientCA, err := devpki.NewCA("api server client ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, clientCA.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Inject: testInject, CertFile: vol.path("tls.crt"), KeyFile: vol.path("tls.key"),
		ClientCAFile: caFile, ShutdownTimeout: 5 * time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Error("Serve did not return after its context ended")
		}
	})

	leaf, err := clientCA.Issue("spiffe://cluster.local/ns/kube-system/sa/kube-apiserver", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	// get sends one HTTP/1.1 request and reads the status line: in TLS 1.3
	// a refused client certificate shows only when the client reads.
	get := func(cfg *tls.Config) error {
		d := &net.Dialer{Timeout: waitTimeout}
		c, err := tls.DialWithDialer(d, "tcp", ln.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(waitTimeout))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			return err
		}
		buf := make([]byte, 12)
		_, err = io.ReadFull(c, buf)
		return err
	}
	if err := get(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{clientCert}}); err != nil {
		t.Errorf("a caller with a certificate of the bundle: %v", err)
	}
	if err := get(&tls.Config{RootCAs: ca.pool}); err == nil {
		t.Error("a caller without a certificate was served")
	}
	other, err := devpki.NewCA("stranger", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	strangerLeaf, _ := other.Issue("spiffe://cluster.local/ns/x/sa/y", time.Hour)
	strangerCert, _ := tls.X509KeyPair(strangerLeaf.CertPEM, strangerLeaf.KeyPEM)
	if err := get(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{strangerCert}}); err == nil {
		t.Error("a caller with a certificate of another CA was served")
	}
	if err := get(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{clientCert}, MaxVersion: tls.VersionTLS12}); err == nil {
		t.Error("a TLS 1.2 caller was served")
	}
}
