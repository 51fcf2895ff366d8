package rig

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunAgainstItself: a rig sends its plan to its own app, and the app
// served exactly what the run says was admitted; each request of a varied
// caller carries its own value.
func TestRunAgainstItself(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	rs := &Server{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get("X-Tenant-Id"); v != "" {
			mu.Lock()
			seen[v] = true
			mu.Unlock()
		}
		rs.ServeHTTP(w, r)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, srv.URL, Plan{Targets: []string{srv.URL}, Seconds: 2, Callers: []Caller{
		{Name: "plain", Rate: 20, Header: map[string][]string{"X-Extra": {"1"}}},
		{Name: "varied", Rate: 50, Vary: &Vary{Header: "x-tenant-id", Format: "tenant-%03d", Modulo: 1000}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Seconds["plain"]) != 2 || len(res.Seconds["varied"]) != 2 {
		t.Fatalf("seconds: %d and %d, want 2 each", len(res.Seconds["plain"]), len(res.Seconds["varied"]))
	}
	p, v := res.Sum("plain", 0, 2), res.Sum("varied", 0, 2)
	if p.Sent == 0 || v.Sent == 0 {
		t.Fatalf("sent %d plain and %d varied requests, want some of each", p.Sent, v.Sent)
	}
	if got, want := res.Served, p.Admitted+v.Admitted; got != want {
		t.Errorf("served %d, want %d (every admitted request)", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if int64(len(seen)) != v.Sent || !seen["tenant-000"] {
		t.Errorf("%d distinct tenants seen (tenant-000: %v), want %d, one a request", len(seen), seen["tenant-000"], v.Sent)
	}
}

// TestBadPlans: a plan that can not run is refused, naming its field.
func TestBadPlans(t *testing.T) {
	srv := httptest.NewServer(&Server{})
	defer srv.Close()
	for _, tc := range []struct {
		plan Plan
		want string
	}{
		{Plan{Seconds: 1, Callers: []Caller{{Name: "a", Rate: 1}}}, "Targets"},
		{Plan{Targets: []string{srv.URL}, Seconds: 0, Callers: []Caller{{Name: "a", Rate: 1}}}, "Seconds"},
		{Plan{Targets: []string{srv.URL}, Seconds: 1}, "Callers"},
		{Plan{Targets: []string{srv.URL}, Seconds: 1, Callers: []Caller{{Name: "a"}}}, "Callers[0]"},
		{Plan{Targets: []string{srv.URL}, Seconds: 1, Callers: []Caller{{Name: "a", Rate: 1, Vary: &Vary{Header: "h", Format: "x", Modulo: 2}}}}, "Vary.Format"},
	} {
		_, err := Run(t.Context(), srv.URL, tc.plan)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "400") {
			t.Errorf("%+v: %v, want a 400 naming %s", tc.plan, err, tc.want)
		}
	}
}
