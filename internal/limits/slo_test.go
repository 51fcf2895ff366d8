package limits

import (
	"strings"
	"testing"
	"time"
)

func TestParseSLO(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  search:
    capacity: 900
    slo: {latency_p99: 200ms, errors: 1%}
  feed:
    slo: {errors: "0.005"}
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
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"services.a.slo.latency_p99", "services.b.slo.errors", "services.c.slo: latency_p99, errors: neither is set",
		"services.d.slo.latency_p99", "services.e.slo: not yet supported with unit: cost", "services.f.slo.errors",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not name %q:\n%v", want, err)
		}
	}
}
