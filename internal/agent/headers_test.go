package agent

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// The sidecar's request path, proxy included, with --ratelimit-headers
// x-ratelimit: an admitted request reaches the app and comes back with the
// caller's quota in Envoy's form; a dropped one never reaches it and gets
// 429 with x-envoy-ratelimited, a Retry-After from its rule and, as Envoy's
// do, the same X-RateLimit-* headers with nothing remaining. The default
// leaves admitted responses alone.
func TestRateLimitHeadersThroughTheProxy(t *testing.T) {
	var reached atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		io.WriteString(w, "from the app")
	}))
	defer app.Close()

	for _, tc := range []struct {
		flag        string
		caller      string
		wantStatus  int
		wantReached bool
		wantHeaders map[string]string // "" means absent
	}{
		{"x-ratelimit", "steady", http.StatusOK, true, map[string]string{
			"X-Ratelimit-Limit": "100, 100;w=1", "X-Ratelimit-Remaining": "60", "X-Ratelimit-Reset": "1",
			"X-Envoy-Ratelimited": "", "Retry-After": "", "Ratelimit": ""}},
		{"x-ratelimit", "blocked", http.StatusTooManyRequests, false, map[string]string{
			"X-Ratelimit-Limit": "0, 0;w=1", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "60",
			"X-Envoy-Ratelimited": "true", "Retry-After": "60", "Ratelimit": `"sluice";r=0;t=60`}},
		{"none", "steady", http.StatusOK, true, map[string]string{
			"X-Ratelimit-Limit": "", "Ratelimit": "", "Ratelimit-Policy": "", "X-Envoy-Ratelimited": ""}},
		{"draft", "steady", http.StatusOK, true, map[string]string{
			"Ratelimit-Policy": `"sluice";q=100;w=1`, "Ratelimit": `"sluice";r=60;t=1`, "X-Ratelimit-Limit": ""}},
		{"draft", "blocked", http.StatusTooManyRequests, false, map[string]string{
			"Ratelimit-Policy": `"sluice";q=0;w=1`, "Ratelimit": `"sluice";r=0;t=60`, "X-Ratelimit-Limit": "",
			"X-Envoy-Ratelimited": "true", "Retry-After": "60"}},
	} {
		t.Run(tc.flag+"/"+tc.caller, func(t *testing.T) {
			cfg := validConfig()
			cfg.Upstream = app.URL
			cfg.RateLimitHeaders = tc.flag
			a, err := New(cfg, nil, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			a.Limiter().SetPolicy(&sidecar.Policy{
				Name: names.Callee("checkout"), Service: "checkout", Direction: sidecar.Inbound,
				Peers: []sidecar.Rule{ // sorted
					{Peer: "blocked", DropRatio: math.Nextafter(1, 0), LimitRPS: 0, AllowedRPS: 0},
					{Peer: "steady", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 40},
				},
			})
			srv := httptest.NewServer(a.Handler())
			defer srv.Close()

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(sidecar.DefaultCallerHeader, tc.caller)
			before := reached.Load()
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if got := reached.Load() > before; res.StatusCode != tc.wantStatus || got != tc.wantReached {
				t.Errorf("status %d, app reached %v; want %d, %v", res.StatusCode, got, tc.wantStatus, tc.wantReached)
			}
			for k, want := range tc.wantHeaders {
				got := res.Header.Values(k)
				if want == "" && len(got) != 0 || want != "" && (len(got) != 1 || got[0] != want) {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}
