package limits

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestParseBurstPayback(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  orders:
    callers:
      bulk:  {limit: 1000, burst: 2000, payback: 10s}
      web:   {limit: 100}
      batch: {limit: 50, payback: 1h}
  llm:
    unit: cost
    callers:
      chat: {limit: 3000, burst: 500}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		svc, caller string
		burst       float64
		payback     time.Duration
	}{
		{"orders", "bulk", 2000, 10 * time.Second},
		{"orders", "web", 0, 0}, // the defaults: the tightest edge, nothing paid back
		{"orders", "batch", 0, time.Hour},
		{"orders", "mobile", 0, 0}, // no limit of its own
		{"llm", "chat", 500, 0},    // a cost callee's payback is the controller's
	} {
		b := set.Service(tc.svc).Bucket(tc.caller)
		if b.Burst != tc.burst || b.Payback != tc.payback {
			t.Errorf("%s/%s: burst %v, payback %v; want %v, %v", tc.svc, tc.caller, b.Burst, b.Payback, tc.burst, tc.payback)
		}
	}
	// Written back and read again, the set is the same.
	out, err := yaml.Marshal(render(set))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(bytes.NewReader(out))
	if err != nil || !equalSets(set, again) {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
}

func TestParseBurstPaybackErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{services: {s: {callers: {c: {limit: 10, burst: -1}}}}}`, "services.s.callers.c.burst: -1 is not a finite number >= 0"},
		{`{services: {s: {callers: {c: {limit: 10, burst: .inf}}}}}`, "services.s.callers.c.burst: +Inf is not a finite number >= 0"},
		{`{services: {s: {callers: {c: {limit: 10, burst: lots}}}}}`, "services.s.callers.c.burst"},
		{`{services: {s: {callers: {c: {limit: 10, payback: -5s}}}}}`, "services.s.callers.c.payback: -5s is outside [0, 1h0m0s]"},
		{`{services: {s: {callers: {c: {limit: 10, payback: 2h}}}}}`, "services.s.callers.c.payback: 2h0m0s is outside [0, 1h0m0s]"},
		{`{services: {s: {callers: {c: {limit: 10, payback: 10}}}}}`, "services.s.callers.c.payback: time: missing unit"},
		{`{services: {s: {callers: {c: {max_concurrency: 4, burst: 10}}}}}`, "services.s.callers.c.burst: needs the caller's own limit"},
		{`{services: {s: {callers: {c: {max_concurrency: 4, payback: 1s}}}}}`, "services.s.callers.c.payback: needs the caller's own limit"},
		{`{services: {s: {procedures: {/a.B/C: {}}, callers: {c: {limit: 10, burst: 10}}}}}`, "services.s.callers.c.burst: not yet supported"},
	} {
		_, err := Parse(strings.NewReader(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
	// Every problem at once.
	_, err := Parse(strings.NewReader(`{services: {s: {callers: {a: {limit: 1, burst: -1}, b: {limit: 1, payback: 3h}}}}}`))
	if err == nil || !strings.Contains(err.Error(), "callers.a.burst") || !strings.Contains(err.Error(), "callers.b.payback") {
		t.Errorf("want both errors, got %v", err)
	}
}
