package child

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const page = `# HELP sluice_sidecar_drop_ratio x
# TYPE sluice_sidecar_drop_ratio gauge
sluice_sidecar_drop_ratio{mode="enforce",peer="web",service="api"} 0.8
sluice_sidecar_drop_ratio{mode="enforce",peer="web2",service="api"} 0.5
sluice_sidecar_drop_ratio{caller_peer="web",service="api"} 100

sluice_sidecar_report_sent_total{direction="inbound"} 12
sluice_controller_warm 1
sluice_request_seconds_bucket{le="+Inf"} 7
`

func TestMetrics(t *testing.T) {
	m, err := ParseMetrics(page)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 6 {
		t.Errorf("%d samples, want 6: %v", len(m), m)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		sum    float64
		ok     bool
	}{
		{"sluice_sidecar_drop_ratio", []string{`peer="web"`}, 0.8, true},
		{"sluice_sidecar_drop_ratio", []string{`service="api"`, `mode="enforce"`}, 1.3, true},
		{"sluice_sidecar_drop_ratio", nil, 101.3, true},
		{"sluice_sidecar_drop_ratio", []string{`peer="web"`, `mode="shadow"`}, 0, false},
		{"sluice_controller_warm", nil, 1, true},
		{"sluice_request_seconds_bucket", []string{`le="+Inf"`}, 7, true},
		{"sluice_absent", nil, 0, false},
		{"sluice_sidecar", nil, 0, false}, // a prefix of a name is not the name
	} {
		if sum, ok := m.Sum(tc.name, tc.labels...); sum != tc.sum || ok != tc.ok {
			t.Errorf("Sum(%s, %v) = %v, %v; want %v, %v", tc.name, tc.labels, sum, ok, tc.sum, tc.ok)
		}
	}
	var peers []string
	m.Each("sluice_sidecar_drop_ratio", func(labels string, _ float64) { peers = append(peers, LabelValue(labels, "peer")) })
	if got := strings.Join(peers, ","); got != "web,web2," {
		t.Errorf("peers %q, want web,web2 and none", got)
	}
}

func TestLabelValue(t *testing.T) {
	for _, tc := range []struct{ labels, name, want string }{
		{`peer="web",service="api"`, "peer", "web"},
		{`peer="web",service="api"`, "service", "api"},
		{`caller_peer="x",peer="web"`, "peer", "web"},
		{`caller_peer="x"`, "peer", ""},
		{`peer=""`, "peer", ""},
		{``, "peer", ""},
	} {
		if got := LabelValue(tc.labels, tc.name); got != tc.want {
			t.Errorf("LabelValue(%s, %s) = %q, want %q", tc.labels, tc.name, got, tc.want)
		}
	}
}

func TestParseMetricsBadSample(t *testing.T) {
	for _, text := range []string{"sluice_x{a=\"b\"}\n", "sluice_x one\n", "sluice_x 1 2x\n"} {
		if _, err := ParseMetrics(text); err == nil || !strings.Contains(err.Error(), "bad sample") {
			t.Errorf("ParseMetrics(%q): %v, want a bad sample", text, err)
		}
	}
}

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			io.WriteString(w, page)
		case "/bad/metrics":
			io.WriteString(w, "sluice_x oops\n")
		case "/header":
			w.Header().Set("X-Echo", r.Header.Get("X-Sluice-Caller"))
			io.WriteString(w, "hi")
		default:
			http.Error(w, "not here", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	admin := strings.TrimPrefix(srv.URL, "http://")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	m, err := Scrape(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.Sum("sluice_controller_warm"); !ok || v != 1 {
		t.Errorf("warm %v %v, want 1", v, ok)
	}
	if _, err := Scrape(ctx, admin+"/bad"); err == nil || !strings.Contains(err.Error(), "bad sample") {
		t.Errorf("a bad page: %v, want an error", err)
	}
	if _, err := Scrape(ctx, admin+"/none"); err == nil || !strings.Contains(err.Error(), "404 not here") {
		t.Errorf("a 404: %v, want an error with the status and body", err)
	}

	code, hdr, body, err := Get(ctx, srv.URL+"/header", "x-sluice-caller", "web")
	if err != nil || code != http.StatusOK || hdr.Get("X-Echo") != "web" || body != "hi" {
		t.Errorf("Get: %d %v %q %v; want 200 with the header echoed", code, hdr, body, err)
	}
	srv.Close()
	if code, _, _, err := Get(ctx, srv.URL+"/header"); err == nil || code != 0 {
		t.Errorf("Get from a closed server: %d %v, want an error", code, err)
	}
}
