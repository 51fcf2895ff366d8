package configurator

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// runPG executes the configurator in-process as an operator would, against
// the real Postgres store at url, with the real clock.
func runPG(t testing.TB, url string, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand(Options{LookupEnv: env{"USER": "carol"}.lookup, CurrentUser: noUser})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"--database-url", url}, args...))
	err := cmd.ExecuteContext(t.Context())
	if errOut.Len() > 0 {
		t.Logf("configurator %s: stderr:\n%s", strings.Join(args, " "), errOut.String())
	}
	return out.String(), err
}

func mustPG(t *testing.T, url string, args ...string) string {
	t.Helper()
	out, err := runPG(t, url, args...)
	if err != nil {
		t.Fatalf("configurator %s: %v\noutput:\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestRoundTripPostgres is the operator's round trip through the CLI on a
// real Postgres: migrate, derive, review, approve, audit, backtest.
func TestRoundTripPostgres(t *testing.T) {
	url := pgtest.URL(t)

	out := mustPG(t, url, "migrate")
	if !strings.HasPrefix(out, "applied ") {
		t.Fatalf("migrate on an empty database: %q", out)
	}
	if out := mustPG(t, url, "migrate"); out != "up to date\n" {
		t.Fatalf("migrate again: %q", out)
	}

	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	today := time.Now()
	seed(t, st, today, web, 8, 1000)    // 1250 → 1300
	seed(t, st, today, mobile, 8, 87.2) // 109 → 110
	seed(t, st, today, batch, 3, 10)    // too little history

	out = mustPG(t, url, "derive")
	if !strings.Contains(out, "wrote 2 proposals") || !strings.Contains(out, "3 days of history, need 7") {
		t.Errorf("derive:\n%s", out)
	}

	var rows []proposalRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "review", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	want := map[history.Bucket]float64{web: 1300, mobile: 110}
	if len(rows) != 2 {
		t.Fatalf("review -o json: %d rows: %+v", len(rows), rows)
	}
	for _, r := range rows {
		b := history.Bucket{Callee: r.Callee, Caller: r.Caller}
		if r.Proposed != want[b] || r.Current != nil || r.CreatedBy != "carol" || r.ID == 0 {
			t.Errorf("review row %+v; want proposed %v", r, want[b])
		}
	}

	out = mustPG(t, url, "approve", "--all", "--reason", "first limits")
	if !strings.Contains(out, "approved 2 proposals") {
		t.Errorf("approve --all:\n%s", out)
	}
	lim, err := st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(lim.Buckets) != 2 {
		t.Fatalf("limits after approve: %+v", lim.Buckets)
	}
	for _, l := range lim.Buckets {
		if l.Limit != want[l.Bucket] || l.Source != history.Derived || l.UpdatedBy != "carol" || l.Reason != "first limits" {
			t.Errorf("limit %+v; want %v, derived, by carol", l, want[l.Bucket])
		}
	}

	var audit []auditRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "audit", "-o", "json")), &audit); err != nil {
		t.Fatal(err)
	}
	approved := map[string]bool{}
	for _, e := range audit {
		if e.Action == "approve" && e.Actor == "carol" && e.Reason == "first limits" {
			approved[e.Callee+"/"+e.Caller] = true
		}
	}
	if !approved["checkout/web"] || !approved["checkout/mobile"] || len(approved) != 2 {
		t.Errorf("approve entries in the audit log: %v (all: %+v)", approved, audit)
	}

	// The limits just derived drop nothing of the history they came from.
	var res []backtestRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "backtest", "checkout", "--current", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("backtest: %+v", res)
	}
	for _, r := range res {
		if r.Dropped != 0 || r.Minutes == 0 {
			t.Errorf("backtest %s/%s: %+v", r.Callee, r.Caller, r)
		}
	}

	// Errors against the real store name what is wrong, too.
	if _, err := runPG(t, url, "shadow", "nosuch/web", "--reason", "r"); err == nil || !strings.Contains(err.Error(), "unknown bucket nosuch/web") {
		t.Errorf("shadow of an unknown bucket: %v", err)
	}
	if _, err := runPG(t, url, "approve", "--id", "1", "--reason", "again"); err == nil || !strings.Contains(err.Error(), "--id 1") {
		t.Errorf("approving a decided proposal: %v", err)
	}
}
