package limits

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/names"
)

func TestParseSLO(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  search:
    capacity: 900
    slo: {latency_p99: 200ms, errors: 1%}
  feed:
    slo: {errors: "0.005"}
  payments:
    routes:
      - {route: "POST /v1/charges", procedure: create-charge}
    procedures:
      create-charge:
        capacity: 300
        slo: {latency_p99: 150ms}
      /pay.Payments/Refund: {slo: {errors: 2%}}
      _other: {slo: {latency_p99: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if s := set.Service("search"); s.SLO.LatencyP99 != 200*time.Millisecond || s.SLO.Errors != 0.01 || s.Capacity != 900 {
		t.Errorf("search: %+v", s)
	}
	if s := set.Service("feed"); s.SLO.LatencyP99 != 0 || s.SLO.Errors != 0.005 {
		t.Errorf("feed: %+v", s.SLO)
	}
	pay := set.Service("payments")
	if pay.SLO != (adaptive.Objective{}) {
		t.Errorf("payments has an objective of its own: %+v", pay.SLO)
	}
	for proc, want := range map[string]adaptive.Objective{
		"create-charge":        {LatencyP99: 150 * time.Millisecond},
		"/pay.Payments/Refund": {Errors: 0.02},
		names.Other:            {LatencyP99: time.Second},
	} {
		if p := pay.Procedures[proc]; p == nil || p.SLO != want {
			t.Errorf("payments' %s: %+v, want the objective %+v", proc, p, want)
		}
	}
	if c := pay.Procedures["create-charge"].Capacity; c != 300 {
		t.Errorf("create-charge's capacity %v beside its objective, want 300", c)
	}
}

// TestParseSLOErrors: every bad objective fails naming its field.
func TestParseSLOErrors(t *testing.T) {
	_, err := Parse(strings.NewReader(`
services:
  a:
    slo: {latency_p99: fast}
  b:
    slo: {errors: 100%}
  c:
    slo: {}
  d:
    slo: {latency_p99: -1s}
  e:
    unit: cost
    slo: {errors: 1%}
  f:
    slo: {errors: "0"}
  g:
    routes: [{route: "GET /", procedure: home}]
    procedures:
      home: {slo: {latency_p99: 0s}}
  h:
    unit: cost
    routes: [{route: "GET /", procedure: home}]
    procedures:
      home: {slo: {errors: 1%}}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"services.a.slo.latency_p99", "services.b.slo.errors", "services.c.slo: latency_p99, errors: neither is set",
		"services.d.slo.latency_p99", "services.e.slo: not yet supported with unit: cost", "services.f.slo.errors",
		"services.g.procedures.home.slo.latency_p99", "services.h.procedures.home.slo: not yet supported with unit: cost",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %q:\n%v", want, err)
		}
	}
}
