package configurator

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/history"
)

// set's flags for tiers, cost and caps (issue #16) on a real Postgres:
// stored, loadable by the controller, audited with who and why; bad
// values refused naming the flag, before anything is written.
func TestSetTiersCostPostgres(t *testing.T) {
	url := pgtest.URL(t)
	mustPG(t, url, "migrate")
	for _, args := range [][]string{
		{"set", "llm", "--unit", "cost", "--capacity", "20000", "--cost-default", "2", "--cost-max", "5000",
			"--cost-request-header", "X-Req-Cost", "--cost-response-header", "x-sluice-cost", "--reason", "count tokens"},
		{"set", "llm/chat", "--limit", "5000", "--max-concurrency", "40", "--reason", "GPU slots"},
		{"set", "llm/ops", "--max-concurrency", "3", "--reason", "ops is small"},
		{"set", "llm/*//llm.Chat/Complete", "--cost", "10", "--reason", "a completion"},
		{"set", "llm/chat//llm.Chat/Complete", "--max-concurrency", "5", "--reason", "per method"},
		{"set", "ledger", "--criticality", "SHEDDABLE_PLUS", "--criticality-header", "x-tier", "--reason", "tiers"},
		{"set", "ledger/web", "--limit", "6000", "--criticality", "CRITICAL", "--max-criticality", "CRITICAL_PLUS", "--reason", "web"},
		{"set", "ledger/*//ledger.Ledger/Post", "--criticality", "CRITICAL_PLUS", "--reason", "posting"},
	} {
		mustPG(t, url, args...)
	}
	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, err := st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	set, err := limits.FromHistory(lim)
	if err != nil {
		t.Fatal(err)
	}
	llm, ledger := set.Service("llm"), set.Service("ledger")
	if !llm.Counted() || llm.Cost.Default != 2 || llm.Cost.Max != 5000 || llm.Cost.RequestHeader != "x-req-cost" ||
		llm.Cost.ResponseHeader != "x-sluice-cost" || llm.Cost.Procedures["/llm.Chat/Complete"] != 10 {
		t.Errorf("llm cost %+v, unit %v", llm.Cost, llm.Unit)
	}
	if llm.MaxConcurrency("chat", "/llm.Chat/Complete") != 5 || llm.MaxConcurrency("chat", "") != 40 || llm.MaxConcurrency("ops", "") != 3 || llm.Bucket("chat").Limit != 5000 {
		t.Errorf("llm caps: chat leaf %d, chat %d, ops %d", llm.MaxConcurrency("chat", "/llm.Chat/Complete"), llm.MaxConcurrency("chat", ""), llm.MaxConcurrency("ops", ""))
	}
	if !ledger.Tiered() || ledger.Criticality.Header != "x-tier" || ledger.DefaultTier("batch", "") != criticality.SheddablePlus ||
		ledger.DefaultTier("web", "") != criticality.Critical || ledger.DefaultTier("web", "/ledger.Ledger/Post") != criticality.CriticalPlus ||
		ledger.Criticality.Callers["web"].Max != criticality.CriticalPlus {
		t.Errorf("ledger tiers %+v", ledger.Criticality)
	}

	es, err := st.Audit(t.Context(), history.Filter{Callee: "llm", Caller: "chat"}, lim.Services[0].UpdatedAt.AddDate(0, 0, -1), 0)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range es {
		if e.Action == "set_settings" && e.Procedure == "" && e.New == "max concurrency 40" && e.Actor == "carol" && e.Reason == "GPU slots" {
			found = true
		}
	}
	if !found {
		t.Errorf("no audit entry of llm/chat's cap by carol: %+v", es)
	}

	// Removing: none; --unit requests and --criticality none undo a callee's.
	mustPG(t, url, "set", "llm/ops", "--max-concurrency", "none", "--reason", "uncapped")
	out := mustPG(t, url, "set", "ledger", "--max-criticality", "SHEDDABLE", "--reason", "lower")
	if !strings.Contains(out, "tiers (header x-tier, default SHEDDABLE_PLUS, max SHEDDABLE)") {
		t.Errorf("set ledger prints %q", out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "llm/chat", "--max-concurrency", "0"}, `--max-concurrency "0" is not an integer`},
		{[]string{"set", "llm/chat", "--max-concurrency", "1.5"}, `--max-concurrency "1.5"`},
		{[]string{"set", "llm/chat", "--criticality", "URGENT"}, `--criticality criticality "URGENT" is not one of`},
		{[]string{"set", "llm/chat", "--criticality", "CRITICAL"}, `--criticality: llm declares no tiers`},
		{[]string{"set", "llm/chat", "--cost", "3"}, `--cost: a static cost is a procedure's`},
		{[]string{"set", "llm/chat//llm.Chat/Complete", "--criticality", "CRITICAL"}, `--criticality: llm/chat//llm.Chat/Complete is a leaf`},
		{[]string{"set", "llm/*//llm.Chat/Complete", "--max-concurrency", "2"}, `--max-concurrency: llm/*//llm.Chat/Complete is a procedure`},
		{[]string{"set", "llm/*//llm.Chat/Complete", "--cost", "-1"}, `--cost -1 is negative`},
		{[]string{"set", "llm/*//llm.Chat/Complete", "--cost", "9000"}, `--cost: 9,000 is above llm's cost max 5,000`},
		{[]string{"set", "ledger/*//ledger.Ledger/Post", "--cost", "1"}, `--cost: ledger counts requests`},
		{[]string{"set", "llm", "--unit", "tokens"}, `--unit "tokens" is not requests or cost`},
		{[]string{"set", "ledger", "--cost-default", "3"}, `--cost-default: ledger counts requests: give --unit cost too`},
		{[]string{"set", "llm", "--unit", "requests", "--cost-max", "3"}, `--cost-max prices requests in cost units`},
		{[]string{"set", "llm", "--cost-default", "6000"}, `--cost-default: 6,000 is above the cost's max 5,000`},
		{[]string{"set", "llm", "--cost-max", "0"}, `--cost-max 0`},
		{[]string{"set", "llm", "--cost-response-header", "bad header"}, `--cost-response-header:`},
		{[]string{"set", "ledger", "--criticality", "none", "--max-criticality", "CRITICAL"}, `--max-criticality: --criticality none removes`},
		{[]string{"set", "llm", "--max-concurrency", "4"}, `--max-concurrency is a caller's or a leaf's`},
		{[]string{"set", "llm/chat", "--max-concurrency", "4", "--mode", "shadow"}, `--mode is a limit's: give --limit too`},
	} {
		_, err := runPG(t, url, append(c.args, "--reason", "r")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("configurator %s: error %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}

	mustPG(t, url, "set", "ledger/web", "--criticality", "none", "--max-criticality", "none", "--reason", "untier web")
	mustPG(t, url, "set", "ledger/*//ledger.Ledger/Post", "--criticality", "none", "--reason", "untier post")
	mustPG(t, url, "set", "ledger", "--criticality", "none", "--reason", "no tiers")
	mustPG(t, url, "set", "llm/*//llm.Chat/Complete", "--cost", "none", "--reason", "unprice")
	mustPG(t, url, "set", "llm", "--unit", "requests", "--reason", "count requests")
	lim, err = st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range lim.Services {
		if s.Cost != nil || s.Criticality != nil {
			t.Errorf("%s still has cost %+v, tiers %+v", s.Callee, s.Cost, s.Criticality)
		}
	}
}
