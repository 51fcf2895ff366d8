package configurator

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

// seedCost writes n whole days of minutes of b, ending before at's day,
// whose request rates peak at reqPeak and cost rates at costPeak: one
// minute a day at the peak.
func seedCost(t *testing.T, st history.Store, at time.Time, b history.Bucket, n int, reqPeak, costPeak float64) {
	t.Helper()
	var rows []history.MinuteRow
	start := startOfDay(at).AddDate(0, 0, -n)
	for m := range n * 1440 {
		r := history.MinuteRow{Bucket: b, Minute: start.Add(time.Duration(m) * time.Minute), PeakOffered: reqPeak / 2, MeanOffered: reqPeak / 4,
			Cost: &history.CostLoad{PeakOffered: costPeak / 2, MeanOffered: costPeak / 4, PeakAdmitted: costPeak / 2, MeanAdmitted: costPeak / 4}}
		if m%1440 == 600 {
			r.PeakOffered, r.MeanOffered = reqPeak, reqPeak/2
			r.Cost = &history.CostLoad{PeakOffered: costPeak, MeanOffered: costPeak / 2, PeakAdmitted: costPeak, MeanAdmitted: costPeak / 2}
		}
		rows = append(rows, r)
	}
	if err := st.WriteMinutes(t.Context(), rows); err != nil {
		t.Fatalf("seed %v: %v", b, err)
	}
}

// derive and backtest of a callee counting cost, on a real Postgres: the
// proposal comes from the cost peak (limit = peak × 1.25, rounded up), the
// backtest replays cost, and both say the unit; a callee counting requests
// beside it is derived from its request peak, as before.
func TestDeriveBacktestCostPostgres(t *testing.T) {
	url := pgtest.URL(t)
	mustPG(t, url, "migrate")
	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	chat := history.Bucket{Callee: "llm", Caller: "chat"}
	web := history.Bucket{Callee: "checkout", Caller: "web"}
	seedCost(t, st, now, chat, 8, 10, 4000)
	seed(t, st, now, web, 8, 1000)

	// Before llm counts cost, its request history is what derive sees.
	out := mustPG(t, url, "derive", "llm", "--dry-run", "-o", "json")
	var d derivationOutput
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Proposals) != 1 || d.Proposals[0].Proposed != 13 {
		t.Fatalf("derive of llm counting requests: %+v, want 13 (10 × 1.25, rounded up)", d.Proposals)
	}

	mustPG(t, url, "set", "llm", "--unit", "cost", "--reason", "tokens")
	out = mustPG(t, url, "derive")
	for _, want := range []string{"5,000 units/s", "4,000 units/s", "1,300"} {
		if !strings.Contains(out, want) {
			t.Errorf("derive's output lacks %q:\n%s", want, out)
		}
	}
	ps, err := st.Proposals(t.Context(), history.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[history.Bucket]float64{}
	for _, p := range ps {
		got[p.Bucket] = p.Proposed
	}
	if got[chat] != 5000 || got[web] != 1300 {
		t.Errorf("proposals %v, want llm/chat 5000 (4000 units/s × 1.25) and checkout/web 1300", got)
	}
	review := mustPG(t, url, "review")
	if !strings.Contains(review, "5,000 units/s") || strings.Contains(review, "1,300 units/s") {
		t.Errorf("review:\n%s", review)
	}

	// The backtest replays llm's cost against its proposal: at 5,000
	// units/s nothing would drop; at 1,000 the peak minutes would.
	out = mustPG(t, url, "backtest", "llm", "--days", "8")
	if !strings.Contains(out, "5,000 units/s") || !strings.Contains(out, "units") || strings.Contains(out, " req") {
		t.Errorf("backtest of llm:\n%s", out)
	}
	mustPG(t, url, "set", "llm/chat", "--limit", "1000", "--reason", "tight")
	out = mustPG(t, url, "backtest", "llm/chat", "--current", "--days", "8", "-o", "json")
	var rows []backtestRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Unit != "cost" || rows[0].Dropped == 0 || rows[0].Offered < float64(rows[0].Minutes)*60*999 {
		t.Errorf("backtest of llm/chat at 1000 units/s: %+v; want cost units offered (at least 1,000/s) and some dropped", rows)
	}
	out = mustPG(t, url, "backtest", "checkout/web", "--current", "--days", "8")
	if strings.Contains(out, "units") {
		t.Errorf("backtest of a callee counting requests speaks of units:\n%s", out)
	}
}

// Derive on cost history: days without cost minutes (before the callee
// counted cost) are days without history, and the refusal says so.
func TestDeriveCostCoverage(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	b := history.Bucket{Callee: "llm", Caller: "chat"}
	var peaks []history.DailyPeak
	for i := 1; i <= 10; i++ {
		p := history.DailyPeak{Bucket: b, Day: startOfDay(now).AddDate(0, 0, -i), PeakOffered: 10, MeanOffered: 5, Minutes: 1440}
		if i <= 3 { // the last 3 days count cost
			p.Cost, p.CostMinutes = &history.CostLoad{PeakOffered: 800, MeanOffered: 400, PeakAdmitted: 800, MeanAdmitted: 400}, 1440
		}
		peaks = append(peaks, p)
	}
	lim := history.Limits{Services: []history.ServiceLimits{{Callee: "llm", Cost: &history.CostSettings{}}}}
	d := Derive(peaks, lim, DefaultDeriveConfig(), now)
	if len(d.Proposals) != 0 || len(d.Refusals) != 1 || d.Refusals[0].Reason != "3 days of cost history, need 7 (7 more below 80% coverage)" {
		t.Errorf("derivation %+v", d)
	}
	cfg := DefaultDeriveConfig()
	cfg.MinDays = 3
	d = Derive(peaks, lim, cfg, now)
	if len(d.Proposals) != 1 || d.Proposals[0].Proposed != 1000 || d.Proposals[0].PeakLookback != 800 {
		t.Errorf("derivation with 3 days %+v, want 1000 from the cost peak 800", d.Proposals)
	}
}
