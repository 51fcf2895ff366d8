package routes

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/names"
)

func mustCompile(t testing.TB, rs ...Route) *Routes {
	t.Helper()
	r, err := CompileRoutes(rs)
	if err != nil {
		t.Fatalf("CompileRoutes: %v", err)
	}
	return r
}

// rs builds routes from pattern, procedure pairs.
func rs(pairs ...string) []Route {
	var out []Route
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Route{Pattern: pairs[i], Procedure: pairs[i+1]})
	}
	return out
}

func TestMatch(t *testing.T) {
	r := mustCompile(t, rs(
		"GET /v1/items/{id}", "get-item",
		"POST /v1/charges", "create-charge",
		"GET /v1/users/{id}/orders", "list-orders",
		"/static/*", "static",
		"GET /", "root",
		"DELETE /v1/items/{id}", "delete-item",
		"/v1/items/{id}", "item-other",
		"GET /v1/{kind}/{id}/*", "generic",
	)...)
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/v1/items/42", "get-item"},
		{"DELETE", "/v1/items/42", "delete-item"},
		{"PUT", "/v1/items/42", "item-other"},
		{"HEAD", "/v1/items/42", "item-other"}, // GET does not match HEAD
		{"POST", "/v1/charges", "create-charge"},
		{"GET", "/v1/charges", names.Other},
		{"GET", "/v1/users/7/orders", "list-orders"},
		{"GET", "/v1/users/7/orders/3", "generic"},
		{"GET", "/v1/users//orders", names.Other}, // {id} is one non-empty segment
		{"GET", "/v1/items/", names.Other},
		{"GET", "/v1/items", names.Other},
		{"GET", "/v1/items/42/x", "generic"},
		{"GET", "/v1/items/42/", "generic"}, // * takes an empty segment
		{"GET", "/v1/a/b", "generic"},       // * takes zero segments
		{"OPTIONS", "/static", "static"},
		{"GET", "/static/", "static"},
		{"GET", "/static/css/a.css", "static"},
		{"GET", "/staticx", names.Other},
		{"GET", "/", "root"},
		{"POST", "/", names.Other},
		{"GET", "//", names.Other},
		{"GET", "", names.Other},
		{"GET", "*", names.Other},
		{"GET", "v1/items/42", names.Other},
		{"get", "/v1/items/42", "item-other"}, // methods are case-sensitive
	} {
		if got := r.Match(tc.method, tc.path); got != tc.want {
			t.Errorf("Match(%q, %q) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
	var none *Routes
	if got := none.Match("GET", "/"); got != names.Other {
		t.Errorf("nil Routes: Match = %q, want %q", got, names.Other)
	}
	if got, want := r.Procedures(), []string{"get-item", "create-charge", "list-orders", "static", "root", "delete-item", "item-other", "generic"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Procedures = %v, want %v", got, want)
	}
}

// The first route in declaration order wins, not the most specific one: a
// matcher that preferred literals, or returned the first match it found,
// would answer these differently.
func TestMatchFirstWins(t *testing.T) {
	for _, tc := range []struct {
		routes       []Route
		method, path string
		want         string
	}{
		{rs("GET /a/{x}/c", "param", "GET /a/b/*", "literal-rest"), "GET", "/a/b/c", "param"},
		{rs("GET /a/{x}/c", "param", "GET /a/b/*", "literal-rest"), "GET", "/a/b/d", "literal-rest"},
		{rs("/{x}/b", "any-method", "GET /a/{y}", "get"), "GET", "/a/b", "any-method"},
		{rs("/{x}/b", "any-method", "GET /a/{y}", "get"), "GET", "/a/c", "get"},
		{rs("GET /{x}/{y}/c", "deep-param", "GET /a/*", "rest"), "GET", "/a/b/c", "deep-param"},
		{rs("GET /{x}/{y}/c", "deep-param", "GET /a/*", "rest"), "GET", "/a/b/d", "rest"},
		{rs("GET /a/b/*", "b", "GET /a/{x}/c", "param"), "GET", "/a/b/c", "b"},
		{rs("POST /p/{x}", "post", "/p/*", "any"), "POST", "/p/1", "post"},
		{rs("POST /p/{x}", "post", "/p/*", "any"), "GET", "/p/1", "any"},
	} {
		r, err := CompileRoutes(tc.routes)
		if err != nil {
			t.Fatalf("CompileRoutes(%v): %v", tc.routes, err)
		}
		if got := r.Match(tc.method, tc.path); got != tc.want {
			t.Errorf("routes %v: Match(%q, %q) = %q, want %q", tc.routes, tc.method, tc.path, got, tc.want)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	long := "/" + strings.Repeat("a", MaxPatternLen)
	deep := strings.Repeat("/a", MaxSegments+1)
	for _, tc := range []struct {
		routes []Route
		want   []string // each in the error
	}{
		{rs("get /a", "p"), []string{`route 0 "get /a"`, "method", "[A-Z-]"}},
		{rs(" /a", "p"), []string{"route 0", "method", "1 to 16"}},
		{rs("GET ", "p"), []string{`route 0 "GET "`, "empty path"}},
		{rs("", "p"), []string{"route 0", "empty path"}},
		{rs("GET a/b", "p"), []string{"route 0", "relative path"}},
		{rs("GET  /a", "p"), []string{"route 0", "relative path"}},
		{rs("/a/*/b", "p"), []string{`route 0 "/a/*/b"`, "segment 1", "not the last"}},
		{rs("/a*", "p"), []string{"route 0", "whole segment"}},
		{rs("/a/{id", "p"), []string{`route 0 "/a/{id"`, "unbalanced braces"}},
		{rs("/a/id}", "p"), []string{"route 0", "unbalanced braces"}},
		{rs("/a/x{id}", "p"), []string{"route 0", "unbalanced braces"}},
		{rs("/a/{{id}}", "p"), []string{"route 0", "unbalanced braces"}},
		{rs("/a/{}", "p"), []string{"route 0", "no name"}},
		{rs("/a/{i-d}", "p"), []string{"route 0", "[A-Za-z0-9_]"}},
		{rs("/a//b", "p"), []string{`route 0 "/a//b"`, "segment 1", "empty segment"}},
		{rs("/a/", "p"), []string{"route 0", "empty segment"}},
		{rs("/a b", "p"), []string{"route 0", "character"}},
		{rs("/a?x=1", "p"), []string{"route 0", "character '?'"}},
		{rs("/a", ""), []string{"route 0", "empty procedure"}},
		{rs("/a", "_other"), []string{"route 0", "reserved"}},
		{rs("/a", "has space"), []string{"route 0", "procedure"}},
		{rs("/a", "p", "/b", "q", "GET /a", "r"), []string{`route 2 "GET /a"`, `shadowed by route 0 "/a"`}},
		{rs("GET /a/{id}", "p", "GET /a/{x}", "q"), []string{`route 1 "GET /a/{x}"`, `duplicate of route 0 "GET /a/{id}"`}},
		{rs("GET /a", "p", "GET /a", "p"), []string{"route 1", "duplicate of route 0"}},
		{rs(long, "p"), []string{"route 0", "longer than 256 (MaxPatternLen)", "…"}},
		{rs(deep, "p"), []string{"route 0", "at most 32 (MaxSegments)"}},
		// Every problem at once.
		{rs("/a//", "p", "/b", "", "/c", "ok"), []string{"route 0", "route 1"}},
	} {
		_, err := CompileRoutes(tc.routes)
		if err == nil {
			t.Errorf("CompileRoutes(%v) succeeded, want an error with %q", tc.routes, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("CompileRoutes(%v) = %q, want it to contain %q", tc.routes, err, w)
			}
		}
	}
}

func TestCompileBounds(t *testing.T) {
	var many []Route
	for i := range MaxRoutes + 1 {
		many = append(many, Route{Pattern: fmt.Sprintf("/r%d", i), Procedure: "p"})
	}
	if _, err := CompileRoutes(many[:MaxRoutes]); err != nil {
		t.Errorf("%d routes: %v", MaxRoutes, err)
	}
	if _, err := CompileRoutes(many); err == nil || !strings.Contains(err.Error(), "at most 256 (MaxRoutes)") {
		t.Errorf("%d routes: %v, want the bound named", len(many), err)
	}
	var methods []Route
	for i := range MaxMethods + 1 {
		methods = append(methods, Route{Pattern: fmt.Sprintf("M%c /a", 'A'+i), Procedure: "p"})
	}
	if _, err := CompileRoutes(methods[:MaxMethods]); err != nil {
		t.Errorf("%d methods: %v", MaxMethods, err)
	}
	if _, err := CompileRoutes(methods); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("route %d", MaxMethods)) ||
		!strings.Contains(err.Error(), "(MaxMethods)") {
		t.Errorf("%d methods: %v, want route %d and the bound named", len(methods), err, MaxMethods)
	}
}

// A route is refused when an earlier one matches every request it would,
// and kept when an earlier one only overlaps it.
func TestCompileShadowed(t *testing.T) {
	for _, tc := range []struct {
		routes   []Route
		shadowed bool
	}{
		{rs("/static/*", "s", "/static/css/{f}", "css"), true},
		{rs("/static/*", "s", "GET /static", "bare"), true}, // * takes zero segments
		{rs("/static/*", "s", "/static/*", "again"), true},
		{rs("/static/css/{f}", "css", "/static/*", "s"), false},
		{rs("GET /a/{x}", "x", "GET /a/b", "b"), true},
		{rs("GET /a/b", "b", "GET /a/{x}", "x"), false},
		{rs("GET /a/{x}", "x", "POST /a/b", "b"), false},
		{rs("/a/{x}", "x", "POST /a/b", "b"), true},
		{rs("GET /a/{x}", "x", "/a/b", "b"), false}, // the later one also takes POST
		{rs("/a/{x}", "x", "/a/{y}/c", "c"), false},
		{rs("/a/{x}", "x", "/a/*", "rest"), false},
		{rs("/a/{x}/*", "x", "/a/*", "rest"), false}, // "/a" and "/a/" are left
		{rs("/a/{x}/*", "x", "/a/b/{y}", "y"), true},
		{rs("/*", "all", "/", "root"), true},
		{rs("/{x}", "x", "/", "root"), false},
		{rs("/", "root", "/{x}", "x"), false},
		// Overlaps that together cover every case but one: never shadowed.
		{rs("/a", "a", "/a/{x}/*", "x", "/a/*", "rest"), false},
		{rs("GET /a/{x}", "get", "POST /a/{x}", "post", "/a/{x}", "any"), false},
	} {
		_, err := CompileRoutes(tc.routes)
		if got := err != nil && (strings.Contains(err.Error(), "shadowed") || strings.Contains(err.Error(), "duplicate")); got != tc.shadowed || !tc.shadowed && err != nil {
			t.Errorf("CompileRoutes(%v) = %v, want shadowed=%v", tc.routes, err, tc.shadowed)
		}
	}
}

func TestGRPCProcedure(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/shop.Checkout/Pay", "/shop.Checkout/Pay"},
		{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Check"},
		{"/a/b", "/a/b"},
		{"", names.Other},
		{"/", names.Other},
		{"//", names.Other},
		{"/svc/", names.Other},
		{"//m", names.Other},
		{"shop.Checkout/Pay", names.Other},
		{"/shop.Checkout/Pay/x", names.Other},
		{"/shop Checkout/Pay", names.Other},
		{"/shop.Checkout/" + strings.Repeat("m", names.MaxProcedureLen), names.Other},
		{names.Other, names.Other},
	} {
		if got := GRPCProcedure(tc.in); got != tc.want {
			t.Errorf("GRPCProcedure(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestMatchAllocatesNothing(t *testing.T) {
	r := mustCompile(t, apiRoutes()...)
	for _, tc := range []struct{ method, path string }{
		{"GET", "/v1/accounts/acct_1/payouts/po_9"}, {"PATCH", "/v1/nothing/here"}, {"GET", "/"},
	} {
		if got := testing.AllocsPerRun(1000, func() { r.Match(tc.method, tc.path) }); got != 0 {
			t.Errorf("Match(%q, %q): %v allocations", tc.method, tc.path, got)
		}
		if got := testing.AllocsPerRun(1000, func() { r.MatchIndex(tc.method, tc.path) }); got != 0 {
			t.Errorf("MatchIndex(%q, %q): %v allocations", tc.method, tc.path, got)
		}
	}
	if got := testing.AllocsPerRun(1000, func() { GRPCProcedure("/shop.Checkout/Pay") }); got != 0 {
		t.Errorf("GRPCProcedure: %v allocations", got)
	}
}

// IsGRPCMethod is the one test of "may a callee declare this without a
// route": a full method is, names.Other (which GRPCProcedure keeps as it
// is) and a route's procedure name are not.
func TestIsGRPCMethod(t *testing.T) {
	for s, want := range map[string]bool{
		"/shop.Checkout/Pay": true,
		names.Other:          false,
		"create-charge":      false,
		"/shop.Checkout":     false,
		"/a/b/c":             false,
		"":                   false,
	} {
		if got := IsGRPCMethod(s); got != want {
			t.Errorf("IsGRPCMethod(%q) = %v, want %v", s, got, want)
		}
	}
}
