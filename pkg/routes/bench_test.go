package routes

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/names"
)

// apiRoutes is a realistic REST API of 50 routes: a payments service's
// resources under /v1, a few methods, ids in the path, a catch-all for
// static files at the end.
func apiRoutes() []Route {
	var out []Route
	add := func(pattern, proc string) { out = append(out, Route{Pattern: pattern, Procedure: proc}) }
	for _, res := range []string{"charges", "customers", "invoices", "refunds", "products", "prices", "subscriptions", "disputes"} {
		add("GET /v1/"+res, "list-"+res)
		add("POST /v1/"+res, "create-"+res)
		add("GET /v1/"+res+"/{id}", "get-"+res)
		add("POST /v1/"+res+"/{id}", "update-"+res)
		add("DELETE /v1/"+res+"/{id}", "delete-"+res)
	}
	add("POST /v1/charges/{id}/capture", "capture-charge")
	add("POST /v1/invoices/{id}/pay", "pay-invoice")
	add("GET /v1/customers/{id}/sources", "list-sources")
	add("POST /v1/customers/{id}/sources", "create-source")
	add("GET /v1/accounts/{id}", "get-account")
	add("GET /v1/accounts/{id}/payouts", "list-payouts")
	add("GET /v1/accounts/{id}/payouts/{payout}", "get-payout")
	add("GET /healthz", "health")
	add("GET /metrics", "metrics")
	add("/static/*", "static")
	return out
}

func TestAPIRoutes(t *testing.T) {
	r := mustCompile(t, apiRoutes()...)
	if n := len(apiRoutes()); n != 50 {
		t.Fatalf("apiRoutes has %d routes, the benchmark says 50", n)
	}
	if got := r.Match("GET", "/v1/accounts/acct_1/payouts/po_9"); got != "get-payout" {
		t.Errorf("late hit = %q", got)
	}
	if got := r.Match("PATCH", "/v1/nothing/here"); got != names.Other {
		t.Errorf("miss = %q", got)
	}
}

// BenchmarkMatchRoutes matches against apiRoutes' 50 routes: a hit on the
// 47th route, a miss that shares the /v1 prefix, a miss on an unnamed
// method, and a long static path that the catch-all, the last route, takes.
func BenchmarkMatchRoutes(b *testing.B) {
	r := mustCompile(b, apiRoutes()...)
	for _, bc := range []struct{ name, method, path, want string }{
		{"hit-late", "GET", "/v1/accounts/acct_1/payouts/po_9", "get-payout"},
		{"hit-early", "GET", "/v1/charges/ch_3MmlLrLkdIwHu7ix0snN0B15", "get-charges"},
		{"miss", "GET", "/v1/balance/history/txn_1", names.Other},
		{"miss-method", "PATCH", "/v1/charges/ch_1", names.Other},
		{"static", "GET", "/static/" + strings.Repeat("css/", 8) + "a.css", "static"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if got := r.Match(bc.method, bc.path); got != bc.want {
				b.Fatalf("Match = %q, want %q", got, bc.want)
			}
			b.ReportAllocs()
			for b.Loop() {
				r.Match(bc.method, bc.path)
			}
		})
	}
}

// BenchmarkGRPCProcedure is the gRPC side's whole cost: checking the name.
func BenchmarkGRPCProcedure(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		GRPCProcedure("/shop.Checkout/Pay")
	}
}
