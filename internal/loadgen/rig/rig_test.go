package rig

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/knee"
	"github.com/sluicehq/sluice/pkg/health"
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

// TestAppLatency: with an App, the rig times the app's own answers, per
// second of the run: at least the app's service time, and no more than
// what the load generator saw on the way through.
func TestAppLatency(t *testing.T) {
	const service = 20 * time.Millisecond
	app, err := knee.New(knee.Config{Workers: 50, Service: service})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(&Server{App: app})
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, srv.URL, Plan{Targets: []string{srv.URL}, Seconds: 2, Callers: []Caller{{Name: "a", Rate: 50}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.AppLatency) != 2 {
		t.Fatalf("%d seconds of app latency, want 2", len(res.AppLatency))
	}
	var answered int64
	for _, sec := range res.AppLatency {
		for _, n := range sec {
			answered += n
		}
	}
	// A request the run sent in its last moments may be answered after it.
	if sent := res.Sum("a", 0, 2).Admitted; answered == 0 || answered > sent {
		t.Errorf("the app timed %d answers, want 1 to %d (the admitted requests)", answered, sent)
	}
	appP99, ok := res.AppP99(0, 2)
	if !ok || health.Bucket(appP99) < health.Bucket(service) {
		t.Errorf("the app's p99 %v (ok %v), want at least its service time %v", appP99, ok, service)
	}
	// The app's answers are some of the client's (those it gave within
	// the run's seconds), and each took the app no longer than it took
	// the client. So below any latency the client cannot have more
	// answers than the app had plus those the app did not count: the
	// app's times exclude the way to it and back. (Comparing the two
	// p99s instead compares different sets of requests at the run's
	// edges, and flaked when one straggler moved a quantile a bucket.)
	client := res.Latency["a"]
	var appBelow, clientBelow, clientAll int64
	for _, sec := range client {
		for _, n := range sec {
			clientAll += n
		}
	}
	for b := range health.Buckets {
		for i := range 2 {
			appBelow += res.AppLatency[i][b]
			clientBelow += client[i][b]
		}
		if clientBelow > appBelow+(clientAll-answered) {
			t.Fatalf("up to bucket %d the client had %d answers and the app %d of its %d (client %d): the app timed more than the client saw",
				b, clientBelow, appBelow, answered, clientAll)
		}
	}
}
