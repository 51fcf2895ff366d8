package controller

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

// A tick's loads say which callees count cost: llm does, search does not.
func TestTickLoadsSayCost(t *testing.T) {
	s := newState(t)
	if err := s.Apply(costLoad(20000, 5000), t0); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(t0.Add(3*time.Second), costLimits(t))
	got := map[string]bool{}
	for _, l := range res.Loads {
		got[l.Callee+"/"+l.Caller] = l.Cost
	}
	if !got["llm/chat"] || got["search/web"] {
		t.Errorf("loads' Cost %v, want llm/chat only", got)
	}
}

// The recorder writes a cost callee's offered and admitted cost rates,
// peak and mean, beside its request rates, for leaves and their levels,
// into the real Postgres store; a callee counting requests gets none.
func TestRecorderCostRowsPostgres(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	if _, err := history.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	db, err := history.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	r := NewRecorder(DefaultRecorderConfig(), db, nil, nil)
	leaf := func(caller, proc string, offCost, admCost float64) BucketLoad {
		return BucketLoad{Callee: "llm", Caller: caller, Procedure: proc, Cost: true,
			Totals: Totals{Offered: 10, OfferedCost: offCost, AdmittedCost: admCost}}
	}
	r.Observe(minute0, []BucketLoad{leaf("chat", "/llm.Chat/Complete", 600, 500), leaf("ops", "/llm.Chat/Complete", 100, 100), load("search", "web", 50, 0)})
	r.Observe(minute0.Add(30*time.Second), []BucketLoad{leaf("chat", "/llm.Chat/Complete", 200, 300), load("search", "web", 50, 0)})
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b    history.Bucket
		want *history.CostLoad
	}{
		{history.Bucket{Callee: "llm", Caller: "chat", Procedure: "/llm.Chat/Complete"}, &history.CostLoad{PeakOffered: 600, MeanOffered: 400, PeakAdmitted: 500, MeanAdmitted: 400}},
		{history.Bucket{Callee: "llm", Caller: "chat"}, &history.CostLoad{PeakOffered: 600, MeanOffered: 400, PeakAdmitted: 500, MeanAdmitted: 400}},
		{history.Bucket{Callee: "llm", Caller: history.AnyCaller, Procedure: "/llm.Chat/Complete"}, &history.CostLoad{PeakOffered: 700, MeanOffered: 450, PeakAdmitted: 600, MeanAdmitted: 450}},
		{history.Bucket{Callee: "llm", Caller: "ops", Procedure: "/llm.Chat/Complete"}, &history.CostLoad{PeakOffered: 100, MeanOffered: 50, PeakAdmitted: 100, MeanAdmitted: 50}},
		{history.Bucket{Callee: "search", Caller: "web"}, nil},
	} {
		rows, err := db.Minutes(ctx, c.b, minute0, minute0.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 {
			t.Fatalf("%s: %d rows, want 1", c.b.Path(), len(rows))
		}
		if got := rows[0].Cost; (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("%s: cost %+v, want %+v", c.b.Path(), got, c.want)
		}
	}
	peaks, err := db.DailyPeaks(ctx, history.Filter{Callee: "llm", Caller: "chat"}, minute0.Truncate(24*time.Hour), minute0.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peaks {
		if p.CostMinutes != 1 || p.Cost == nil || p.Cost.PeakOffered != 600 {
			t.Errorf("%s daily: %+v, cost %+v; want one cost minute, peak 600", p.Path(), p, p.Cost)
		}
	}
}
