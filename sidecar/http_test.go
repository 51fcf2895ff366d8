package sidecar

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/names"
)

var inf = math.Inf(1)

func TestMiddleware(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "greedy", DropRatio: 0.99, LimitRPS: 50, AllowedRPS: 42.9},
		Rule{Peer: "nolimit", DropRatio: 0.99, LimitRPS: inf, AllowedRPS: inf},            // no quota to announce
		Rule{Peer: "shadowed", DropRatio: 0.99, Mode: Shadow, LimitRPS: 5, AllowedRPS: 5}, // counted, never enforced
		Rule{Peer: names.Unknown, DropRatio: 0.99, LimitRPS: 0.5, AllowedRPS: 0.5},
	))
	s := l.Service("checkout")

	var reached atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "from upstream")
	})
	defaultSrv := httptest.NewServer(s.Middleware(next, HTTPOptions{}))
	defer defaultSrv.Close()
	customSrv := httptest.NewServer(s.Middleware(next, HTTPOptions{CallerHeader: "x-my-caller"}))
	defer customSrv.Close()

	type want struct {
		status            int
		policy, rateLimit string // header values; "" means absent
		retryAfter, body  string
		upstreamReached   bool
	}
	rejected := func(caller, policy string) want {
		return want{
			status:     http.StatusTooManyRequests,
			policy:     policy,
			rateLimit:  `"sluice";r=0;t=1`,
			retryAfter: "1",
			body:       "request from caller " + caller + " to service checkout was rate limited by sluice\n",
		}
	}
	admitted := want{status: http.StatusTeapot, body: "from upstream", upstreamReached: true}

	for _, tc := range []struct {
		name   string
		srv    *httptest.Server
		header string
		caller string // "" sends no header
		want   want
	}{
		{"dropped", defaultSrv, "X-Sluice-Caller", "greedy", rejected("greedy", `"sluice";q=42;w=1`)},
		{"header name is case insensitive", defaultSrv, "x-sluice-caller", "greedy", rejected("greedy", `"sluice";q=42;w=1`)},
		{"no quota known", defaultSrv, "X-Sluice-Caller", "nolimit", rejected("nolimit", "")},
		{"unlisted caller admitted", defaultSrv, "X-Sluice-Caller", "polite", admitted},
		{"shadow admitted", defaultSrv, "X-Sluice-Caller", "shadowed", admitted},
		{"no header is unknown", defaultSrv, "", "", rejected("unknown", `"sluice";q=0;w=1`)},
		{"invalid name is unknown", defaultSrv, "X-Sluice-Caller", "bad/name", rejected("unknown", `"sluice";q=0;w=1`)},
		{"custom header", customSrv, "X-My-Caller", "greedy", rejected("greedy", `"sluice";q=42;w=1`)},
		{"default header ignored when custom set", customSrv, "X-Sluice-Caller", "polite", rejected("unknown", `"sluice";q=0;w=1`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, tc.srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.caller != "" {
				req.Header[tc.header] = []string{tc.caller} // as given, not canonicalised
			}
			before := reached.Load()
			resp, err := tc.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}

			if resp.StatusCode != tc.want.status || string(body) != tc.want.body {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, body, tc.want.status, tc.want.body)
			}
			if got := reached.Load() > before; got != tc.want.upstreamReached {
				t.Errorf("upstream reached: %v, want %v", got, tc.want.upstreamReached)
			}
			for _, h := range []struct{ name, want string }{
				{"RateLimit-Policy", tc.want.policy},
				{"RateLimit", tc.want.rateLimit},
				{"Retry-After", tc.want.retryAfter},
			} {
				if got := resp.Header.Values(h.name); h.want == "" && len(got) != 0 || h.want != "" && (len(got) != 1 || got[0] != h.want) {
					t.Errorf("%s: %q, want %q", h.name, got, h.want)
				}
			}
			if tc.want.upstreamReached {
				if resp.Header.Get("X-Upstream") != "yes" {
					t.Error("upstream headers lost")
				}
				return
			}
			if got := resp.Header.Get("Content-Type"); got != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", got)
			}
		})
	}
}

func TestRenderHTTPQuota(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Peer: "a", AllowedRPS: 10.7, LimitRPS: 20}, `"sluice";q=10;w=1`},
		{Rule{Peer: "a", AllowedRPS: inf, LimitRPS: 20.2}, `"sluice";q=20;w=1`},
		{Rule{Peer: "a", AllowedRPS: 0.3, LimitRPS: inf}, `"sluice";q=0;w=1`},
		{Rule{Peer: "a", AllowedRPS: 1e300, LimitRPS: inf}, `"sluice";q=999999999999999;w=1`},
		{Rule{Peer: "a", AllowedRPS: 0, LimitRPS: 0}, `"sluice";q=0;w=1`}, // blocked
		{Rule{Peer: "a", AllowedRPS: inf, LimitRPS: inf}, ""},             // unbounded: nothing to announce
	} {
		h := renderHTTP("svc", &tc.rule)
		got := ""
		if h.policy != nil {
			got = h.policy[0]
		}
		if got != tc.want {
			t.Errorf("%+v: RateLimit-Policy %q, want %q", tc.rule, got, tc.want)
		}
	}
}
