package webhook

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// TestCommandServesAndStops runs the injector binary's command in-process:
// flags in, HTTPS webhook and admin endpoints out, a clean exit when its
// context ends (SIGTERM in the binary).
func TestCommandServesAndStops(t *testing.T) {
	ca := newCA(t)
	certPEM, keyPEM := ca.issue(t, 1)
	vol := newSecretVolume(t, map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM})

	var mu sync.Mutex
	addrs := map[string]string{}
	both := make(chan struct{})
	cmd := command(func(name string, addr net.Addr) {
		mu.Lock()
		defer mu.Unlock()
		addrs[name] = addr.String()
		if len(addrs) == 2 {
			close(both)
		}
	})
	cmd.SetArgs([]string{
		"--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--tls-cert-file", vol.path("tls.crt"), "--tls-key-file", vol.path("tls.key"),
		"--sidecar-image", "ghcr.io/sluicehq/sluice-sidecar:v0.1.0",
		"--aggregators", "sluice-aggregator.sluice-system.svc:18100",
		"--sidecar-proxy-port", "4100", "--sidecar-admin-port", "4101",
		"--log-level", "error",
	})
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	select {
	case <-both:
	case err := <-done:
		t.Fatalf("command exited at start: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("command did not listen")
	}
	mu.Lock()
	webhookAddr, adminAddr := addrs["webhook"], addrs["admin"]
	mu.Unlock()

	client := &http.Client{Timeout: waitTimeout}
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		resp, err := client.Get("http://" + adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("admin %s: %s", path, resp.Status)
		}
		if path == "/metrics" && !strings.Contains(string(body), "sluice_injector_cert_expiry_timestamp_seconds") {
			t.Errorf("/metrics lacks the injector's metrics")
		}
	}

	r := &running{addr: webhookAddr, client: &http.Client{Timeout: waitTimeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}}}}
	// The ports flags reach the sidecar: its container, probes and the
	// binary's own flags.
	got := patched(t, checkoutPod(), r.review(t, PathPod, checkoutPod()))
	if n := len(got.Spec.InitContainers); n != 1 || got.Spec.InitContainers[0].Name != inject.ContainerName {
		t.Fatalf("init containers %+v, want the sidecar", got.Spec.InitContainers)
	}
	for _, c := range got.Spec.InitContainers {
		if len(c.Ports) != 2 || c.Ports[0].ContainerPort != 4100 || c.Ports[1].ContainerPort != 4101 {
			t.Errorf("sidecar ports %+v, want 4100 and 4101 from the flags", c.Ports)
		}
		checkSidecarAcceptsEnv(t, &c, "checkout-1")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("command after shutdown: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("command did not stop")
	}
	if _, err := net.DialTimeout("tcp", webhookAddr, time.Second); err == nil {
		t.Error("webhook still listening after shutdown")
	}
}

func TestCommandBadConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--sidecar-image", "", "--aggregators", "nohost", "--sidecar-memory-request", "1Gi",
			"--sidecar-memory-limit", "512Mi", "--sidecar-image-pull-policy", "Sometimes", "--tls-cert-file", "",
			"--sidecar-proxy-port", "0", "--sidecar-admin-port", "65536"},
			[]string{"sidecar-image:", "aggregators[0]:", "sidecar-memory-request:", "sidecar-image-pull-policy:", "tls-cert-file:",
				"sidecar-proxy-port: 0 is not a port number (1-65535)", "sidecar-admin-port: 65536 is not a port number (1-65535)"}},
		{[]string{"--sidecar-image", "sidecar:test", "--sidecar-proxy-port", "19300"},
			[]string{"sidecar-admin-port: 19300 is also sidecar-proxy-port"}},
		{[]string{"--sidecar-image", "sidecar:test", "--sidecar-caller-identity", "mtls"},
			[]string{"sidecar-caller-identity: mtls needs sidecar certificates, which the injector gives only with --sidecar-trust-domain"}},
		{[]string{"--sidecar-image", "sidecar:test", "--sidecar-caller-identity", "jwt", "--sidecar-trust-domain", "cluster.local"},
			[]string{`sidecar-caller-identity: "jwt" is not header, xfcc or mtls`}},
	} {
		cmd := Command()
		cmd.SetArgs(tc.args)
		cmd.SetErr(io.Discard)
		cmd.SetOut(io.Discard)
		err := cmd.ExecuteContext(context.Background())
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: err = %v; want it to say %s", tc.args, err, want)
			}
		}
	}
}
