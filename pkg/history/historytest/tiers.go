package historytest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/history"
)

// A callee's unit, cost block and tiers (issue #16) are kept, replaced and
// audited with its settings; one that has none reads and renders as before.
func testServiceTiersCost(t *testing.T, s history.Store) {
	ctx := t.Context()
	llm := history.ServiceLimits{
		Callee: "llm", Capacity: f64(20000),
		Cost:        &history.CostSettings{Default: f64(2), Max: f64(5000), RequestHeader: "x-req-cost", ResponseHeader: "x-sluice-cost"},
		Criticality: &history.CriticalitySettings{Header: "x-tier", Default: criticality.SheddablePlus, Max: criticality.CriticalPlus},
	}
	must(t, s.SetService(ctx, llm, alice))
	got := limits(t, s).Services[0]
	eq(t, "cost", got.Cost, llm.Cost)
	eq(t, "criticality", got.Criticality, llm.Criticality)

	// Defaults are nil and "", kept as such.
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "llm", Cost: &history.CostSettings{}, Criticality: &history.CriticalitySettings{}}, alice))
	got = limits(t, s).Services[0]
	eq(t, "default cost", got.Cost, &history.CostSettings{})
	eq(t, "default criticality", got.Criticality, &history.CriticalitySettings{})

	// Replaced: nil removes them.
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "llm", Capacity: f64(10)}, bob))
	got = limits(t, s).Services[0]
	if got.Cost != nil || got.Criticality != nil {
		t.Errorf("after a SetService without them: cost %+v, criticality %+v; want none", got.Cost, got.Criticality)
	}
	es := entries(audit(t, s, history.Filter{Callee: "llm"}))
	eq(t, "audit", es, []entry{
		{"bob", "set_service", "llm", "", "default none, capacity none, mode enforce, fail open, unit cost (default 1, max 1e+06), tiers (header x-sluice-criticality, default CRITICAL, max CRITICAL)", "default none, capacity 10 rps, mode enforce, fail open", "second reason"},
		{"alice", "set_service", "llm", "", "default none, capacity 20000 rps, mode enforce, fail open, unit cost (default 2, max 5000, request header x-req-cost, response header x-sluice-cost), tiers (header x-tier, default SHEDDABLE_PLUS, max CRITICAL_PLUS)", "default none, capacity none, mode enforce, fail open, unit cost (default 1, max 1e+06), tiers (header x-sluice-criticality, default CRITICAL, max CRITICAL)", "first reason"},
		{"alice", "set_service", "llm", "", "", "default none, capacity 20000 rps, mode enforce, fail open, unit cost (default 2, max 5000, request header x-req-cost, response header x-sluice-cost), tiers (header x-tier, default SHEDDABLE_PLUS, max CRITICAL_PLUS)", "first reason"},
	})

	for _, c := range []struct {
		name  string
		svc   history.ServiceLimits
		field string
	}{
		{"negative default", history.ServiceLimits{Callee: "x", Cost: &history.CostSettings{Default: f64(-1)}}, "service.cost.default"},
		{"zero max", history.ServiceLimits{Callee: "x", Cost: &history.CostSettings{Max: f64(0)}}, "service.cost.max"},
		{"default above max", history.ServiceLimits{Callee: "x", Cost: &history.CostSettings{Default: f64(10), Max: f64(5)}}, "service.cost.default"},
		{"upper-case header", history.ServiceLimits{Callee: "x", Cost: &history.CostSettings{ResponseHeader: "X-Cost"}}, "service.cost.response_header"},
		{"bad header", history.ServiceLimits{Callee: "x", Criticality: &history.CriticalitySettings{Header: "x tier"}}, "service.criticality.header"},
		{"bad tier", history.ServiceLimits{Callee: "x", Criticality: &history.CriticalitySettings{Max: 9}}, "service.criticality.max"},
	} {
		wantErr(t, c.name, s.SetService(ctx, c.svc, alice), history.ErrInvalid, c.field)
	}
}

// A bucket's settings other than its limit: set, replaced, removed and
// audited by their key, with or without a limit; each shape of bucket
// sets only what it may.
func testBucketSettings(t *testing.T, s history.Store) {
	ctx := t.Context()
	sets := []history.BucketSettings{
		{Bucket: cWeb, Criticality: criticality.Sheddable, MaxCriticality: criticality.Critical, MaxConcurrency: 40},
		{Bucket: cWebPay, MaxConcurrency: 4294967295},
		{Bucket: cAnyPay, Criticality: criticality.CriticalPlus, Cost: f64(10)},
	}
	for _, x := range sets {
		must(t, s.SetSettings(ctx, x, alice))
	}
	got := limits(t, s).Settings
	var keys []history.Bucket
	for i, g := range got {
		keys = append(keys, g.Bucket)
		if g.UpdatedBy != "alice" || g.Reason != "first reason" || g.UpdatedAt.IsZero() {
			t.Errorf("settings %s: stamped %q %q %v, want alice's", g.Path(), g.UpdatedBy, g.Reason, g.UpdatedAt)
		}
		got[i].UpdatedBy, got[i].Reason, got[i].UpdatedAt = "", "", time.Time{}
	}
	eq(t, "keys in order", keys, []history.Bucket{cAnyPay, cWeb, cWebPay})
	eq(t, "settings", got, []history.BucketSettings{sets[2], sets[0], sets[1]})
	if len(limits(t, s).Buckets) != 0 {
		t.Error("settings made a limit")
	}

	must(t, s.SetSettings(ctx, history.BucketSettings{Bucket: cWeb, MaxConcurrency: 8}, bob))
	must(t, s.SetSettings(ctx, history.BucketSettings{Bucket: cWebPay}, bob))
	must(t, s.SetSettings(ctx, history.BucketSettings{Bucket: cMobPay}, bob)) // removes nothing: no entry
	if n := len(limits(t, s).Settings); n != 2 {
		t.Errorf("%d settings after removing one, want 2", n)
	}
	es := entries(audit(t, s, history.Filter{Callee: "checkout", Caller: "web"}))
	eq(t, "audit", es, []entry{
		{"bob", "set_settings", "checkout", "web", "max concurrency 4294967295", "", "second reason"},
		{"bob", "set_settings", "checkout", "web", "criticality SHEDDABLE, max criticality CRITICAL, max concurrency 40", "max concurrency 8", "second reason"},
		{"alice", "set_settings", "checkout", "web", "", "max concurrency 4294967295", "first reason"},
		{"alice", "set_settings", "checkout", "web", "", "criticality SHEDDABLE, max criticality CRITICAL, max concurrency 40", "first reason"},
	})

	for _, c := range []struct {
		name  string
		set   history.BucketSettings
		field string
	}{
		{"cost on a caller", history.BucketSettings{Bucket: cWeb, Cost: f64(1)}, "settings.cost"},
		{"cost on a leaf", history.BucketSettings{Bucket: cWebPay, Cost: f64(1)}, "settings.cost"},
		{"tier on a leaf", history.BucketSettings{Bucket: cWebPay, Criticality: criticality.Critical}, "settings.criticality"},
		{"cap on a procedure", history.BucketSettings{Bucket: cAnyPay, MaxConcurrency: 3}, "settings.max_concurrency"},
		{"max tier on a procedure", history.BucketSettings{Bucket: cAnyPay, MaxCriticality: criticality.Critical}, "settings.max_criticality"},
		{"negative cost", history.BucketSettings{Bucket: cAnyPay, Cost: f64(-2)}, "settings.cost"},
		{"bad tier", history.BucketSettings{Bucket: cWeb, Criticality: 7}, "settings.criticality"},
		{"any caller without procedure", history.BucketSettings{Bucket: history.Bucket{Callee: "checkout", Caller: history.AnyCaller}, MaxConcurrency: 1}, "settings.caller"},
	} {
		wantErr(t, c.name, s.SetSettings(ctx, c.set, alice), history.ErrInvalid, c.field)
	}
}

// A bucket of a callee counting cost carries its cost load beside its
// request rates: read back, rolled up by day over the minutes that carry
// it, never double counted by a rewrite; a row without one reads back
// without one.
func testCostMinutes(t *testing.T, s history.Store) {
	ctx := t.Context()
	llm := history.Bucket{Callee: "llm", Caller: "chat"}
	withCost := func(r history.MinuteRow, po, mo, pa, ma float64) history.MinuteRow {
		r.Cost = &history.CostLoad{PeakOffered: po, MeanOffered: mo, PeakAdmitted: pa, MeanAdmitted: ma}
		return r
	}
	rows := []history.MinuteRow{
		row(llm, minute(0, 0), 10, 8, 0), // before the callee counted cost
		withCost(row(llm, minute(0, 1), 12, 9, 1), 600, 500, 550, 450),
		withCost(row(llm, minute(0, 2), 11, 10, 0), 900, 700, 800, 600),
	}
	must(t, s.WriteMinutes(ctx, rows))
	// A rewrite, with a new minute: the careful path.
	must(t, s.WriteMinutes(ctx, []history.MinuteRow{rows[1], withCost(row(llm, minute(0, 3), 5, 5, 0), 100, 100, 100, 100)}))
	got := minutes(t, s, llm, day(0), day(1))
	eq(t, "minutes", got, append(rows, withCost(row(llm, minute(0, 3), 5, 5, 0), 100, 100, 100, 100)))
	peaks := dailyPeaks(t, s, history.Filter{Callee: "llm"}, day(0), day(1))
	eq(t, "daily", peaks, []history.DailyPeak{{
		Bucket: llm, Day: day(0), PeakOffered: 12, MeanOffered: 8, MeanDropped: 0.25, Minutes: 4,
		Cost: &history.CostLoad{PeakOffered: 900, MeanOffered: 1300.0 / 3, PeakAdmitted: 800, MeanAdmitted: 1150.0 / 3}, CostMinutes: 3,
	}})
	plain := dailyPeaks(t, s, history.Filter{Callee: "nobody"}, day(0), day(1))
	eq(t, "none", len(plain), 0)

	bad := withCost(row(llm, minute(1, 0), 1, 1, 0), 5, 6, 5, 5)
	wantErr(t, "cost peak below mean", s.WriteMinutes(ctx, []history.MinuteRow{bad}), history.ErrInvalid, "rows[0].peak_offered_cost")
	bad = withCost(row(llm, minute(1, 0), 1, 1, 0), 5, 5, 5, -1)
	wantErr(t, "negative admitted", s.WriteMinutes(ctx, []history.MinuteRow{bad}), history.ErrInvalid, "rows[0].mean_admitted_cost")
}
