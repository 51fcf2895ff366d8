package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A request its caller marked as decided upstream passes uncounted, unless
// --ignore-decided says callers are not trusted to mark: then it is decided
// and counted like any other.
func TestIgnoreDecided(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer app.Close()
	for _, ignore := range []bool{false, true} {
		cfg := validConfig()
		cfg.Upstream = app.URL
		cfg.IgnoreDecided = ignore
		a, err := New(cfg, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set(cfg.CallerHeader, "web")
		req.Header.Set("x-sluice-decided", "web")
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, req)
		a.Close()
		if rec.Code != http.StatusOK {
			t.Fatalf("ignore-decided %v: status %d, want 200", ignore, rec.Code)
		}
		var offered uint64
		for _, pc := range a.Limiter().AppendCounts(cfg.Service, nil) {
			if pc.Peer == "web" {
				offered += pc.Offered
			}
		}
		if want := map[bool]uint64{false: 0, true: 1}[ignore]; offered != want {
			t.Errorf("ignore-decided %v: web offered %d, want %d", ignore, offered, want)
		}
	}
}
