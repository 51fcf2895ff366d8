package sim

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestCostDebt checks the cost-debt scenario (issue #16): chat's admitted
// tokens per 10 s window, from a payback window after the controller's
// warm-up on, within ±5 % of its limit, the two windows after its
// requests' cost doubles at 30 s included (the sidecars learn the new
// cost from the responses, after admitting at the old price: the
// overshoot is debt, paid back within the window); the debt its
// overshoot at the step ran up paid back before the end; search, under
// its limit, never dropped.
func TestCostDebt(t *testing.T) {
	sc := loadBuiltin(t, "cost-debt")
	r := run(t, sc, sc.Seed)
	ms := MeasureCost(r)
	if len(ms) != 2 || ms[0].Bucket.Caller != "chat" || ms[1].Bucket.Caller != "search" {
		t.Fatalf("cost measures %+v; want chat's and search's", ms)
	}
	step := 30 * time.Second
	chat := ms[0]
	judged := 0
	for _, w := range chat.Windows {
		if !w.Judged {
			continue
		}
		judged++
		if w.Allowed != chat.Limit {
			t.Errorf("chat %v–%v: allowed %.0f units/s; want its limit %.0f", w.From, w.To, w.Allowed, chat.Limit)
		}
		if tol := 0.05; math.Abs(w.Error) > tol {
			t.Errorf("chat %v–%v: admitted %.0f units/s, %+.2f%% off its limit %.0f; want within ±%.0f%%", w.From, w.To, w.Admitted, 100*w.Error, chat.Limit, 100*tol)
		}
	}
	if judged != 4 {
		t.Errorf("%d judged windows; want 4 (20 s to 60 s)", judged)
	}
	paid := false
	for _, d := range chat.Debts {
		if d.From >= step-Bin && d.PeakAt > step && d.PaidBack {
			paid = true
		}
	}
	if !paid {
		t.Errorf("chat's debts %+v; want one run up after the cost's step at %v and paid back before the end", chat.Debts, step)
	}
	search := ms[1]
	for _, w := range search.Windows {
		if w.Admitted < w.Offered {
			t.Errorf("search %v–%v: admitted %.0f of %.0f units/s offered under its limit", w.From, w.To, w.Admitted, w.Offered)
		}
	}
	if len(search.Debts) != 0 {
		t.Errorf("search owed %+v under its limit", search.Debts)
	}
}

func TestFlowCostInvalid(t *testing.T) {
	for _, c := range []struct{ limits, cost, want string }{
		{`{callers: {web: {limit: 10}}}`, `{response: {mean: 1}}`, "flows[0].cost: the callee counts requests"},
		{`{unit: cost, cost: {response: x-sluice-cost}}`, ``, "flows[0].cost.response: missing"},
		{`{unit: cost}`, `{response: {mean: 1}}`, "flows[0].cost.response: the callee's app reports no cost"},
		{`{unit: cost}`, `{header: 2}`, "flows[0].cost.header: the callee trusts no request header"},
		{`{unit: cost, cost: {response: x-sluice-cost}}`, `{response: {mean: 2, spread: 3}}`, "flows[0].cost.response.spread"},
		{`{unit: cost, cost: {response: x-sluice-cost}}`, `{response: {steps: [{at: 1s, mean: 2}]}}`, "the first point is at 0s"},
	} {
		doc := "duration: 1s\nzones: [a]\nservices: {api: {sidecars: {a: 1}}}\nlimits: {services: {api: " + c.limits + "}}\nflows:\n  - {callee: api, caller: web, rate: {constant: 1}"
		if c.cost != "" {
			doc += ", cost: " + c.cost
		}
		doc += "}\n"
		_, err := Parse(strings.NewReader(doc), "x")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("limits %s, cost %s: err = %v; want one containing %q", c.limits, c.cost, err, c.want)
		}
	}
}
