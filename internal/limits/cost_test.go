package limits

import (
	"context"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/names"
)

func TestParseCostExample(t *testing.T) {
	f, err := LoadFile(context.Background(), "testdata/cost.yaml", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	set := f.Limits()
	if w := set.Warnings(); len(w) != 0 {
		t.Errorf("the example warns: %q", w)
	}
	llm := set.Service("llm")
	if !llm.Counted() || llm.Unit != UnitCost || llm.Capacity != 20000 {
		t.Fatalf("llm = %+v", llm)
	}
	c := llm.Cost
	if c.Default != 1 || c.Max != 1e6 || c.RequestHeader != "x-sluice-request-cost" || c.ResponseHeader != "x-sluice-cost" {
		t.Errorf("cost = %+v", c)
	}
	if want := map[string]float64{"/llm.Chat/Complete": 10, "/llm.Chat/Embed": 0.5}; !maps.Equal(c.Procedures, want) {
		t.Errorf("procedure costs %v, want %v", c.Procedures, want)
	}
	for _, tc := range []struct {
		caller, procedure string
		limit, leaf       float64
		cap               uint32
	}{
		{"chat", "/llm.Chat/Complete", 5000, math.Inf(1), 40},
		{"chat", names.Other, 5000, math.Inf(1), 40},
		{"batch", "/llm.Chat/Complete", 2000, math.Inf(1), 8}, // the leaf's own
		{"batch", "/llm.Chat/Embed", 2000, math.Inf(1), 0},
		{"mobile", "/llm.Chat/Embed", math.Inf(1), math.Inf(1), 0},
	} {
		if got := llm.Bucket(tc.caller).Limit; got != tc.limit {
			t.Errorf("llm/%s limit %v, want %v", tc.caller, got, tc.limit)
		}
		if got := llm.LeafLimit(tc.caller, tc.procedure); got != tc.leaf {
			t.Errorf("llm (%s, %s) leaf limit %v, want %v", tc.caller, tc.procedure, got, tc.leaf)
		}
		if got := llm.MaxConcurrency(tc.caller, tc.procedure); got != tc.cap {
			t.Errorf("llm (%s, %s) max_concurrency %d, want %d", tc.caller, tc.procedure, got, tc.cap)
		}
	}
	search := set.Service("search")
	if search.Counted() || search.Cost != nil || search.MaxConcurrency("web", "") != 20 || search.Bucket("web").Limit != 100 {
		t.Errorf("search = %+v, web %+v", search, search.Bucket("web"))
	}
	if set.Service("orders").Counted() || set.Service("orders").MaxConcurrency("web", "") != 0 {
		t.Error("a callee the file does not name counts cost or caps concurrency")
	}
}

func TestParseCostDefaults(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  s:
    unit: cost
    default_limit: 50
    callers:
      capped: {max_concurrency: 3}   # keeps the default limit
  r:
    unit: requests
`))
	if err != nil {
		t.Fatal(err)
	}
	s := set.Service("s")
	if s.Cost == nil || s.Cost.Default != DefaultCost || s.Cost.Max != DefaultMaxCost || s.Cost.RequestHeader != "" || s.Cost.ResponseHeader != "" {
		t.Errorf("cost = %+v", s.Cost)
	}
	if b := s.Bucket("capped"); b.Limit != 50 || b.MaxConcurrency != 3 {
		t.Errorf("capped = %+v", b)
	}
	if r := set.Service("r"); r.Counted() || r.Cost != nil {
		t.Errorf("r = %+v", r)
	}
}

// TestParseCostErrors checks that every bad cost or cap is refused, each
// at its path, all at once.
func TestParseCostErrors(t *testing.T) {
	_, err := Parse(strings.NewReader(`
services:
  plain:
    cost: {default: 2}
    procedures:
      /a.B/C: {cost: 3}
  bad:
    unit: tokens
  neg:
    unit: cost
    cost: {default: -1, max: 0, from: client-ip, response: "two words"}
    procedures:
      /a.B/C: {cost: .nan}
  over:
    unit: cost
    cost: {max: 10, default: 11}
    procedures:
      /a.B/C: {cost: 12}
  up:
    unit: cost
    enforcement: upstream
    callers:
      unknown: {limit: 1}
      _overflow: {limit: 1}
  caps:
    callers:
      half: {limit: 1, max_concurrency: 1.5}
      zero: {limit: 1, max_concurrency: 0}
      huge: {limit: 1, max_concurrency: 1e12}
      app: {limit: 1, enforcement: upstream, max_concurrency: 4}
    procedures:
      /a.B/C:
        callers:
          app: {max_concurrency: 2}
          neg: {max_concurrency: -2}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"services.plain.cost: needs services.plain.unit: cost",
		"services.plain.procedures./a.B/C.cost: needs services.plain.unit: cost",
		`services.bad.unit: "tokens" is not requests or cost`,
		"services.neg.cost.default: -1 is not a finite cost >= 0",
		"services.neg.cost.max: 0 is not a finite cost > 0",
		"services.neg.cost.from: source \"client-ip\": want \"header <name>\"",
		"services.neg.cost.response: ",
		"services.neg.procedures./a.B/C.cost: NaN is not a finite cost >= 0",
		"services.over.cost.default: 11 is above the service's cost.max 10",
		"services.over.procedures./a.B/C.cost: 12 is above the service's cost.max 10",
		"services.up.enforcement: upstream: the service counts cost",
		"services.caps.callers.half.max_concurrency: 1.5 is not an integer",
		"services.caps.callers.zero.max_concurrency: 0 is not an integer",
		"services.caps.callers.huge.max_concurrency: 1e+12 is not an integer",
		"services.caps.callers.app.max_concurrency: upstream: max_concurrency",
		"services.caps.procedures./a.B/C.callers.app.max_concurrency: upstream: max_concurrency",
		"services.caps.procedures./a.B/C.callers.neg.max_concurrency: -2 is not an integer",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
