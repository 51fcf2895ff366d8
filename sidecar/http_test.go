package sidecar

import (
	"context"
	"encoding/base64"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

var inf = math.Inf(1)

func TestMiddleware(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "greedy", DropRatio: 0.99, LimitRPS: 50, AllowedRPS: 42.9},
		Rule{Peer: "nolimit", DropRatio: 0.99, LimitRPS: inf, AllowedRPS: inf},                      // no quota to announce
		Rule{Peer: "shadowed", DropRatio: 0.99, Mode: dropratio.Shadow, LimitRPS: 5, AllowedRPS: 5}, // counted, never enforced
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
	// Every rule drops at 0.99, which is released in 7 ticks (retryAfter).
	rejected := func(caller, policy string) want {
		return want{
			status:     http.StatusTooManyRequests,
			policy:     policy,
			rateLimit:  `"sluice";r=0;t=7`,
			retryAfter: "7",
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
			envoy := ""
			if tc.want.status == http.StatusTooManyRequests {
				envoy = "true"
			}
			for _, h := range []struct{ name, want string }{
				{"RateLimit-Policy", tc.want.policy},
				{"RateLimit", tc.want.rateLimit},
				{"Retry-After", tc.want.retryAfter},
				{"X-Envoy-Ratelimited", envoy},
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
		h := renderHTTP("svc", &tc.rule, 1, renderGRPC("svc", &tc.rule, 1))
		got := ""
		if h.quota.policy != nil {
			got = h.quota.policy[0]
		}
		if got != tc.want {
			t.Errorf("%+v: RateLimit-Policy %q, want %q", tc.rule, got, tc.want)
		}
	}
}

func TestIsGRPCContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc":               true,
		"application/grpc+proto":         true,
		"application/grpc+json":          true,
		"application/grpc;charset=utf-8": true,
		"application/grpc+":              true, // grpc-go accepts it: no subtype
		"application/grpc-web":           false,
		"application/grpc-web+proto":     false,
		"application/grpcx":              false,
		"Application/grpc":               false, // grpc-go compares case-sensitively
		"application/json":               false,
		"":                               false,
	} {
		if got := isGRPCContentType(ct); got != want {
			t.Errorf("isGRPCContentType(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestEncodeGRPCMessage(t *testing.T) {
	// Expected values are what grpc-go's server writes (encodeGrpcMessage).
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain ASCII ~!", "plain ASCII ~!"},
		{"100%", "100%25"},
		{"a\nb\tc\x7f", "a%0Ab%09c%7F"},
		{"zürich €", "z%C3%BCrich %E2%82%AC"},
		{"bad \xff byte", "bad %EF%BF%BD byte"}, // invalid UTF-8 becomes U+FFFD
	} {
		if got := encodeGRPCMessage(tc.in); got != tc.want {
			t.Errorf("encodeGRPCMessage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestMiddlewareGRPCResponse checks the trailers-only response header by
// header; TestMiddlewareGRPCEndToEnd checks that a real client reads it.
func TestMiddlewareGRPCResponse(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "greedy", DropRatio: 0.99, LimitRPS: 50, AllowedRPS: 42.9},
		Rule{Peer: "nolimit", DropRatio: 0.99, LimitRPS: inf, AllowedRPS: inf},
	))
	s := l.Service("checkout")
	h := s.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("a dropped request reached next")
	}), HTTPOptions{})

	for _, tc := range []struct {
		caller, contentType string
		grpc                bool
		policy              string
	}{
		{"greedy", "application/grpc", true, `"sluice";q=42;w=1`},
		{"greedy", "application/grpc+proto", true, `"sluice";q=42;w=1`},
		{"nolimit", "application/grpc", true, ""},
		{"greedy", "application/grpc-web", false, `"sluice";q=42;w=1`},
		{"greedy", "", false, `"sluice";q=42;w=1`},
	} {
		req := httptest.NewRequest(http.MethodPost, "/grpc.health.v1.Health/Check", nil)
		req.Header.Set(DefaultCallerHeader, tc.caller)
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		res := rec.Result()
		name := tc.caller + " " + tc.contentType

		for _, hv := range []struct{ name, want string }{
			{"Retry-After", "7"}, // 0.99
			{"RateLimit", `"sluice";r=0;t=7`},
			{"RateLimit-Policy", tc.policy},
			{"X-Envoy-Ratelimited", "true"},
		} {
			if got := res.Header.Values(hv.name); hv.want == "" && len(got) != 0 || hv.want != "" && (len(got) != 1 || got[0] != hv.want) {
				t.Errorf("%s: %s: %q, want %q", name, hv.name, got, hv.want)
			}
		}
		if !tc.grpc {
			if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Grpc-Status") != "" {
				t.Errorf("%s: %d %v, want a plain 429", name, res.StatusCode, res.Header)
			}
			continue
		}

		if res.StatusCode != http.StatusOK || rec.Body.Len() != 0 {
			t.Errorf("%s: %d with %d body bytes, want 200 and no body", name, res.StatusCode, rec.Body.Len())
		}
		msg := "call from caller " + tc.caller + " to service checkout was rate limited by sluice"
		for _, hv := range []struct{ name, want string }{
			{"Content-Type", "application/grpc"},
			{"Grpc-Status", "8"},
			{"Grpc-Message", msg}, // nothing to encode
			{"Content-Length", ""},
		} {
			if got := res.Header.Values(hv.name); hv.want == "" && len(got) != 0 || hv.want != "" && (len(got) != 1 || got[0] != hv.want) {
				t.Errorf("%s: %s: %q, want %q", name, hv.name, got, hv.want)
			}
		}
		bin := res.Header.Values("Grpc-Status-Details-Bin")
		if len(bin) != 1 || strings.HasSuffix(bin[0], "=") {
			t.Fatalf("%s: Grpc-Status-Details-Bin %q, want one unpadded base64 value", name, bin)
		}
		raw, err := base64.RawStdEncoding.DecodeString(bin[0])
		if err != nil {
			t.Fatalf("%s: Grpc-Status-Details-Bin: %v", name, err)
		}
		var got spb.Status
		if err := proto.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%s: Grpc-Status-Details-Bin: %v", name, err)
		}
		// The interceptors' status, to the byte.
		want := status.Convert(renderGRPC("checkout", s.Policy().Rule(tc.caller), 7)).Proto() // 0.99: 7s
		if !proto.Equal(&got, want) {
			t.Errorf("%s: details %v, want %v", name, &got, want)
		}
	}
}

// discardWriter is a ResponseWriter that keeps one header map across
// requests, so that only the middleware's own allocations are counted.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// The drop path renders nothing: both forms of rejection are assembled from
// values rendered when the policy was set.
func TestMiddlewareDropAllocs(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	// The largest ratio: Diffuse admits one request in 2^32.
	l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: math.Nextafter(1, 0), LimitRPS: 50, AllowedRPS: 50}))
	var reached int
	h := l.Service("checkout").Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached++ }), HTTPOptions{})
	for _, ct := range []string{"application/grpc", "text/plain"} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Header.Set(DefaultCallerHeader, "greedy")
		req.Header.Set("Content-Type", ct)
		w := &discardWriter{h: http.Header{}}
		if got := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, req) }); got != 0 {
			t.Errorf("%s: %v allocations per dropped request", ct, got)
		}
	}
	if reached != 0 {
		t.Errorf("%d requests reached next, want 0", reached)
	}
}
