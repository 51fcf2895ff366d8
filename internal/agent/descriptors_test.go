package agent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// The sidecar's request path decides descriptors before its proxy touches
// the request: an "xff 1" source reads X-Forwarded-For as the one trusted
// proxy in front of the sidecar wrote it, not after the sidecar appended
// its caller's address for the app, so hops count the proxies in front of
// the sidecar, and what a client wrote left of them is never read.
func TestDescriptorsThroughTheProxy(t *testing.T) {
	seen := make(chan string, 1)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Forwarded-For")
	}))
	defer app.Close()
	cfg := validConfig()
	cfg.Upstream = app.URL
	a, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Every client address is blocked but 192.0.2.1's.
	a.Limiter().SetPolicy(&sidecar.Policy{
		Name: names.Callee("checkout"), Service: "checkout", Direction: sidecar.Inbound, LiveInstances: 1,
		Descriptors: []sidecar.DescriptorPolicy{{
			Name: "ip", Source: descriptor.Source{Kind: descriptor.ForwardedFor, Hops: 1}, Quantile: allowance.DefaultQuantile,
			Overrides: []sidecar.ValueLimit{{Value: "192.0.2.1", LimitRPS: 1e9}},
		}},
	})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()

	for _, tc := range []struct {
		xff      string // "" sends none
		status   int
		appSeesX string // the app's X-Forwarded-For: the sidecar appends its caller, loopback here
	}{
		{"spoofed, 192.0.2.1", http.StatusOK, "spoofed, 192.0.2.1, 127.0.0.1"},
		{"192.0.2.1, 198.51.100.1", http.StatusTooManyRequests, ""},
		{"", http.StatusTooManyRequests, ""},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.xff != "" {
			req.Header.Set("X-Forwarded-For", tc.xff)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		cancel()
		if res.StatusCode != tc.status {
			t.Errorf("X-Forwarded-For %q: %d %q, want %d", tc.xff, res.StatusCode, body, tc.status)
		}
		if tc.status == http.StatusOK {
			if got := <-seen; got != tc.appSeesX {
				t.Errorf("X-Forwarded-For %q: the app saw %q, want %q", tc.xff, got, tc.appSeesX)
			}
		}
	}
}
