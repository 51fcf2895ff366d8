package sidecar

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/routes"
)

// TestUpstreamHealth: what the callee answers to admitted requests is
// counted per procedure, by outcome and latency, over HTTP and gRPC (the
// status in the trailers, or a trailers-only answer), and TakeHealth takes
// each answer once; dropped requests, which never reach the callee, are not
// counted.
func TestUpstreamHealth(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := policy("checkout", Rule{Peer: "blocked", Procedure: "charge", DropRatio: 1, LimitRPS: 0, AllowedRPS: 0})
	p.Procedures = []string{"charge"}
	p.Routes = []routes.Route{{Pattern: "POST /v1/charges", Procedure: "charge"}}
	l.SetPolicy(p)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("answer") {
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "504":
			time.Sleep(20 * time.Millisecond)
			w.WriteHeader(http.StatusGatewayTimeout)
		case "grpc-unavailable": // trailers-only
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Grpc-Status", "14")
			w.WriteHeader(http.StatusOK)
		case "grpc-ok":
			w.Header().Set("Content-Type", "application/grpc")
			w.Header().Set("Trailer", "Grpc-Status")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "body")
			w.Header().Set("Grpc-Status", "0")
		default:
			io.WriteString(w, "ok")
		}
	})
	srv := httptest.NewServer(l.Service("checkout").Middleware(next, HTTPOptions{}))
	defer srv.Close()
	send := func(caller, method, path, ct string) int {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(""))
		req.Header.Set(DefaultCallerHeader, caller)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 3 {
		send("web", "POST", "/v1/charges", "")
	}
	send("web", "POST", "/v1/charges?answer=503", "")
	send("web", "POST", "/v1/charges?answer=504", "")
	send("web", "GET", "/other?answer=grpc-unavailable", "application/grpc")
	send("web", "GET", "/other?answer=grpc-ok", "application/grpc")
	if code := send("blocked", "POST", "/v1/charges", ""); code != http.StatusTooManyRequests {
		t.Fatalf("blocked caller: %d, want 429", code)
	}

	got := map[string]health.Counts{}
	for _, h := range l.TakeHealth("checkout", nil) {
		got[h.Procedure] = h.Counts
	}
	if c := got["charge"]; c.OK != 3 || c.Failed != 1 || c.Late != 1 || c.InFlight != 0 {
		t.Errorf("charge: %d ok, %d failed, %d late, %d in flight; want 3, 1, 1, 0", c.OK, c.Failed, c.Late, c.InFlight)
	}
	if c := got["_other"]; c.OK != 1 || c.Failed != 1 || c.Late != 0 {
		t.Errorf("_other (gRPC): %d ok, %d failed, %d late; want 1, 1, 0", c.OK, c.Failed, c.Late)
	}
	c := got["charge"]
	w := make([]float64, health.Buckets)
	for i, n := range c.Latency {
		w[i] = float64(n)
	}
	if slow, ok := health.Quantile(w, 0.9); !ok || slow < 15*time.Millisecond {
		t.Errorf("charge's p90 %v (%v), want the 504's 20ms or so", slow, ok)
	}
	if again := l.TakeHealth("checkout", nil); len(again) != 0 {
		t.Errorf("a second take: %+v, want nothing (each answer is taken once)", again)
	}
}

// The admit path allocates nothing either: the writer that learns the
// callee's answer is pooled.
func TestMiddlewareAdmitAllocs(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0, LimitRPS: 50, AllowedRPS: 50}))
	h := l.Service("checkout").Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}), HTTPOptions{RateLimitHeaders: NoRateLimitHeaders})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set(DefaultCallerHeader, "web")
	w := &discardWriter{h: http.Header{}}
	if got := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, req) }); got != 0 {
		t.Errorf("%v allocations per admitted request", got)
	}
	if hs := l.TakeHealth("checkout", nil); len(hs) != 1 || hs[0].OK == 0 {
		t.Errorf("health %+v, want the admitted requests counted OK", hs)
	}
}
