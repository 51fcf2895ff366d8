package admin

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var notReady error = errors.New("no controller yet")
	h := New(reg, func() error { return notReady })
	srv := httptest.NewServer(h)
	defer srv.Close()

	if code, _ := get(t, srv, "/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get(t, srv, "/readyz"); code != 503 || !strings.Contains(body, "no controller yet") {
		t.Errorf("/readyz before ready = %d %q", code, body)
	}
	notReady = nil
	if code, _ := get(t, srv, "/readyz"); code != 200 {
		t.Errorf("/readyz when ready = %d", code)
	}
	if code, body := get(t, srv, "/metrics"); code != 200 || !strings.Contains(body, "sluice_test_total 3") {
		t.Errorf("/metrics = %d %q", code, body)
	}
	h.SetDraining()
	if code, body := get(t, srv, "/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz while draining = %d %q", code, body)
	}
	if code, _ := get(t, srv, "/healthz"); code != 200 {
		t.Errorf("/healthz while draining = %d", code)
	}
}
