package reporter

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// TestWindowReportsHealth runs a real Limiter's middleware under a Window:
// a regular report carries what the callee answered since the last
// regular one, with that window; a surge report carries none and leaves
// the window running; an outbound Window carries none.
func TestWindowReportsHealth(t *testing.T) {
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	l.SetPolicy(&sidecar.Policy{Name: names.Callee("api"), Service: "api", LiveInstances: 1})
	fail := false
	h := l.Service("api").Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if fail {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}), sidecar.HTTPOptions{})
	serve := func(n int) {
		for range n {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set(sidecar.DefaultCallerHeader, "web")
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	serve(5) // before the window: its baseline
	start := time.Unix(0, 0)
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api"}, Interval: time.Second, SurgeChecks: true}, start, l)
	out := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api", Direction: sidecar.Outbound}, Interval: time.Second}, start, l)

	serve(3)
	fail = true
	serve(1)
	rep := w.Tick(start.Add(time.Second), l)
	if len(rep.GetHealth()) != 1 {
		t.Fatalf("health %v, want one entry", rep.GetHealth())
	}
	hl := rep.GetHealth()[0]
	if hl.GetProcedure() != "" || hl.GetOk() != 3 || hl.GetFailed() != 1 || len(hl.GetLatency()) != health.Buckets ||
		rep.GetHealthWindow().AsDuration() != time.Second {
		t.Errorf("health %v over %v, want 3 ok and 1 failed over 1s", hl, rep.GetHealthWindow().AsDuration())
	}
	if o := out.Tick(start.Add(time.Second), l); len(o.GetHealth()) != 0 {
		t.Errorf("an outbound report carries health %v", o.GetHealth())
	}

	serve(2)
	for range 2000 {
		l.Service("api").Decide("web") // a surge
	}
	urgent := w.Check(start.Add(1100*time.Millisecond), l)
	if urgent == nil || !urgent.GetUrgent() || len(urgent.GetHealth()) != 0 {
		t.Fatalf("surge check: %v, want an urgent report without health", urgent)
	}
	rep = w.Tick(start.Add(2*time.Second), l)
	if hs := rep.GetHealth(); len(hs) != 1 || hs[0].GetFailed() != 2 || rep.GetHealthWindow().AsDuration() != time.Second {
		t.Errorf("after the surge: %v over %v, want 2 failed over 1s", hs, rep.GetHealthWindow().AsDuration())
	}
	if rep = w.Tick(start.Add(3*time.Second), l); len(rep.GetHealth()) != 0 || rep.GetHealthWindow() != nil {
		t.Errorf("a quiet window: %v", rep.GetHealth())
	}
}
