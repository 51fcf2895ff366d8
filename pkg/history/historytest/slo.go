package historytest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/history"
)

// A callee's objective (issue #18) is kept with its settings: it reads
// back as set, SetService without one removes it (as it does the cost
// block and tiers), it is audited, and an invalid one is refused naming
// its field.
func testObjective(t *testing.T, s history.Store) {
	ctx := t.Context()
	obj := &history.ObjectiveSettings{LatencyP99: 250 * time.Millisecond, Errors: 0.01}
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "search", Capacity: f64(900), SLO: obj}, alice))
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "feed"}, alice))
	read := func() map[string]*history.ObjectiveSettings {
		out := map[string]*history.ObjectiveSettings{}
		for _, sl := range limits(t, s).Services {
			out[sl.Callee] = sl.SLO
		}
		return out
	}
	got := read()
	if o := got["search"]; o == nil || *o != *obj {
		t.Errorf("search's objective %+v, want %+v", o, obj)
	}
	if o := got["feed"]; o != nil {
		t.Errorf("feed's objective %+v, want none", o)
	}
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "search", Capacity: f64(900), SLO: &history.ObjectiveSettings{Errors: 0.005}}, bob))
	if o := read()["search"]; o == nil || o.LatencyP99 != 0 || o.Errors != 0.005 {
		t.Errorf("search's objective after a set of errors alone: %+v, want errors 0.005 and no latency", o)
	}
	// Kept as milliseconds in a double: read back exactly, and a ratio
	// rendered as it was given.
	odd := &history.ObjectiveSettings{LatencyP99: 1001 * time.Microsecond, Errors: 0.07}
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "search", Capacity: f64(900), SLO: odd}, bob))
	if o := read()["search"]; o == nil || *o != *odd {
		t.Errorf("search's objective %+v, want %+v exactly", o, odd)
	}
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "search", Capacity: f64(900)}, bob))
	if o := read()["search"]; o != nil {
		t.Errorf("search's objective after a set without one: %+v, want none", o)
	}
	es := entries(audit(t, s, history.Filter{Callee: "search"}))
	var rendered, seven bool
	for _, e := range es {
		rendered = rendered || strings.HasSuffix(e.New, ", slo (latency_p99 250ms, errors 1%)")
		seven = seven || strings.HasSuffix(e.New, ", slo (latency_p99 1.001ms, errors 7%)")
	}
	if !rendered || !seven {
		t.Errorf("audit %+v: want set_service to render its objectives (250ms, 1%%; 1.001ms, 7%%)", es)
	}
	for _, tc := range []struct {
		field string
		s     history.ServiceLimits
	}{
		{"service.slo", history.ServiceLimits{Callee: "search", SLO: &history.ObjectiveSettings{}}},
		{"service.slo.latency_p99", history.ServiceLimits{Callee: "search", SLO: &history.ObjectiveSettings{LatencyP99: -time.Second}}},
		{"service.slo.latency_p99", history.ServiceLimits{Callee: "search", SLO: &history.ObjectiveSettings{LatencyP99: 25 * time.Hour}}},
		{"service.slo.errors", history.ServiceLimits{Callee: "search", SLO: &history.ObjectiveSettings{Errors: 1}}},
		{"service.slo", history.ServiceLimits{Callee: "search", Cost: &history.CostSettings{}, SLO: &history.ObjectiveSettings{Errors: 0.01}}},
	} {
		err := s.SetService(ctx, tc.s, alice)
		if !errors.Is(err, history.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("SetService(slo %+v, cost %v) = %v, want ErrInvalid naming %s", tc.s.SLO, tc.s.Cost != nil, err, tc.field)
		}
	}
}
