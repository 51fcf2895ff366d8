package configurator

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

// TestProceduresPostgres is the operator's round trip on a callee with
// procedures, on a real Postgres: routes, then derive, review, approve,
// set, history, backtest and audit on a leaf (checkout/web/create-charge),
// a procedure's capacity (checkout/*/create-charge) and a gRPC leaf
// (checkout/web//shop.Checkout/Pay); and what the controller then loads.
func TestProceduresPostgres(t *testing.T) {
	url := pgtest.URL(t)
	mustPG(t, url, "migrate")
	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	out := mustPG(t, url, "routes", "set", "checkout", "POST /v1/charges=create-charge", "GET /v1/items/{id}=get-item", "--reason", "charges")
	if !strings.Contains(out, "checkout: 2 routes") || !strings.Contains(out, "GET /v1/items/{id}  get-item") {
		t.Errorf("routes set:\n%s", out)
	}
	var listed []routeRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "routes", "list", "checkout", "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 2 || listed[0] != (routeRow{Callee: "checkout", Position: 0, Route: "POST /v1/charges", Procedure: "create-charge"}) {
		t.Errorf("routes list: %+v", listed)
	}

	var (
		leaf  = history.Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}
		level = history.Bucket{Callee: "checkout", Caller: history.AnyCaller, Procedure: "create-charge"}
		grpc  = history.Bucket{Callee: "checkout", Caller: "web", Procedure: "/shop.Checkout/Pay"}
	)
	today := time.Now()
	seed(t, st, today, leaf, 8, 40)   // 50
	seed(t, st, today, level, 8, 100) // 125 → 130
	seed(t, st, today, grpc, 8, 8)    // 10
	seed(t, st, today, web, 8, 200)   // 250: web across procedures

	out = mustPG(t, url, "derive", "checkout/web/create-charge")
	if !strings.Contains(out, "wrote 1 proposal") || !strings.Contains(out, "PROCEDURE") || !strings.Contains(out, "create-charge") {
		t.Errorf("derive of a leaf:\n%s", out)
	}
	out = mustPG(t, url, "derive")
	if !strings.Contains(out, "wrote 4 proposals") {
		t.Errorf("derive:\n%s", out)
	}
	var rows []proposalRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "review", "checkout/*/create-charge", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Caller != "*" || rows[0].Procedure != "create-charge" || rows[0].Proposed != 130 {
		t.Errorf("review checkout/*/create-charge: %+v", rows)
	}

	out = mustPG(t, url, "approve", "checkout/web/create-charge", "checkout/*/create-charge", "checkout/web", "--reason", "first procedure limits")
	if !strings.Contains(out, "approved 3 proposals") || !strings.Contains(out, "PROCEDURE") {
		t.Errorf("approve:\n%s", out)
	}
	out = mustPG(t, url, "set", "checkout/web//shop.Checkout/Pay", "--limit", "12", "--reason", "provider quota")
	if out != "checkout/web//shop.Checkout/Pay: limit 12 rps, manual (new)\n" {
		t.Errorf("set of a gRPC leaf: %q", out)
	}

	lim, err := st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	set, err := limits.FromHistory(lim)
	if err != nil {
		t.Fatalf("the controller could not load what the configurator wrote: %v", err)
	}
	co := set.Service("checkout")
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"web's create-charge", co.LeafLimit("web", "create-charge"), 50},
		{"create-charge's capacity", co.ProcedureCapacity("create-charge"), 130},
		{"web's Pay", co.LeafLimit("web", "/shop.Checkout/Pay"), 12},
		{"web across procedures", co.Bucket("web").Limit, 250},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if got := strings.Join(co.Declared, " "); got != "create-charge get-item /shop.Checkout/Pay" {
		t.Errorf("Declared %q", got)
	}

	out = mustPG(t, url, "history", "checkout/*/create-charge", "--days", "3")
	if !strings.Contains(out, "limit 130 rps") || !strings.Contains(out, "peak 100 rps") {
		t.Errorf("history of a procedure:\n%s", out)
	}
	var res []backtestRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "backtest", "checkout/web/create-charge", "--current", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Procedure != "create-charge" || res[0].Limit == nil || *res[0].Limit != 50 || res[0].Dropped != 0 {
		t.Errorf("backtest of a leaf: %+v", res)
	}
	var audit []auditRow
	if err := json.Unmarshal([]byte(mustPG(t, url, "audit", "checkout/web//shop.Checkout/Pay", "-o", "json")), &audit); err != nil {
		t.Fatal(err)
	}
	if len(audit) == 0 || audit[0].Action != "set_limit" || audit[0].Proc != "/shop.Checkout/Pay" || audit[0].Reason != "provider quota" {
		t.Errorf("audit of a gRPC leaf: %+v", audit)
	}

	// Changes the controller could not load are refused, and write nothing.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "checkout/web/nosuch", "--limit", "1", "--reason", "r"}, "no route of checkout names nosuch"},
		{[]string{"routes", "set", "checkout", "GET /v1/items/{id}=get-item", "--reason", "r"}, "no route of checkout names create-charge"},
		{[]string{"set", "checkout", "--enforcement", "upstream", "--reason", "r"}, "can not enforce per (caller, route)"},
	} {
		if _, err := runPG(t, url, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("configurator %s: %v, want an error saying %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	after, err := st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Buckets) != len(lim.Buckets) || len(after.Routes) != 1 || len(after.Routes[0].Routes) != 2 || len(after.Services) != 0 {
		t.Errorf("refused changes wrote something: %+v", after)
	}
}
