package sim

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/names"
)

// withProcedures is a scenario whose callee declares HTTP routes and a gRPC
// method; flows is appended to its flows list.
const withProcedures = `
duration: 10s
zones: [zone-a]
services:
  checkout:
    sidecars: {zone-a: 2}
  plain:
    sidecars: {zone-a: 1}
limits:
  services:
    checkout:
      routes:
        - {route: "POST /v1/charges", procedure: create-charge}
        - {route: "GET /v1/items/{id}", procedure: get-item}
      procedures:
        create-charge: {capacity: 100}
        /shop.Checkout/Pay: {capacity: 50}
flows:
`

func TestParseCalls(t *testing.T) {
	flows := `  - {callee: checkout, caller: web, request: "POST /v1/charges", rate: {constant: 1}}
  - {callee: checkout, caller: web, request: "GET /v1/items/42", rate: {constant: 1}}
  - {callee: checkout, caller: web, request: "GET /v1/items/43", rate: {constant: 1}}
  - {callee: checkout, caller: web, request: "DELETE /v1/charges", rate: {constant: 1}}
  - {callee: checkout, caller: app, procedure: /shop.Checkout/Pay, rate: {constant: 1}}
  - {callee: checkout, caller: app, procedure: /shop.Checkout/Refund, rate: {constant: 1}}
  - {callee: checkout, caller: app, request: "POST /shop.Checkout/Pay", rate: {constant: 1}}
  - {callee: checkout, caller: app, rate: {constant: 1}}
  - {callee: plain, caller: app, rate: {constant: 1}}
`
	sc, err := Parse(strings.NewReader(withProcedures+flows), "calls")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		call Call
		leaf string
	}{
		{Call{Method: "POST", Path: "/v1/charges"}, "create-charge"},
		{Call{Method: "GET", Path: "/v1/items/42"}, "get-item"},
		{Call{Method: "GET", Path: "/v1/items/43"}, "get-item"},
		{Call{Method: "DELETE", Path: "/v1/charges"}, names.Other}, // no route for the method
		{Call{Procedure: "/shop.Checkout/Pay"}, "/shop.Checkout/Pay"},
		{Call{Procedure: "/shop.Checkout/Refund"}, names.Other},                  // not declared
		{Call{Method: "POST", Path: "/shop.Checkout/Pay"}, "/shop.Checkout/Pay"}, // gRPC through an HTTP proxy
		{Call{}, names.Other}, // Decide: a callee with procedures counts it in _other
		{Call{}, ""},          // a callee without procedures: the whole pair
	}
	for i, w := range want {
		if f := sc.Flows[i]; f.Call != w.call || f.Leaf != w.leaf {
			t.Errorf("flows[%d]: call %+v leaf %q, want %+v %q", i, f.Call, f.Leaf, w.call, w.leaf)
		}
	}
	// The two paths of one route share a bucket.
	got := sc.Buckets()
	var keys []string
	for _, b := range got {
		keys = append(keys, b.String())
	}
	if want := "checkout/app//shop.Checkout/Pay checkout/app/_other checkout/web/_other checkout/web/create-charge checkout/web/get-item plain/app"; strings.Join(keys, " ") != want {
		t.Errorf("buckets %s, want %s", strings.Join(keys, " "), want)
	}
	if !sc.HasProcedures() {
		t.Error("HasProcedures is false")
	}
}

func TestParseCallErrors(t *testing.T) {
	for _, tc := range []struct {
		name, flow, want string
	}{
		{"both", `procedure: /shop.Checkout/Pay, request: "GET /x"`, "flows[0]: names both a procedure and a request"},
		{"procedure not a gRPC method", `procedure: create-charge`, `flows[0].procedure: "create-charge" is not a gRPC full method`},
		{"procedure with three parts", `procedure: /a/b/c`, `flows[0].procedure: "/a/b/c" is not a gRPC full method`},
		{"procedure _other", `procedure: _other`, `flows[0].procedure: "_other" is not a gRPC full method`},
		{"request without a path", `request: "POST"`, `flows[0].request: "POST" is not METHOD /path`},
		{"request lower-case method", `request: "post /v1/charges"`, `flows[0].request: method "post": 1 to 16 upper-case letters`},
		{"request relative path", `request: "GET v1/items"`, `flows[0].request: path "v1/items" does not start with '/'`},
		{"request template", `request: "GET /v1/items/{id}"`, `flows[0].request: path "/v1/items/{id}" is a route template`},
		{"request query", `request: "GET /v1/items/4?x=1"`, `flows[0].request: path "/v1/items/4?x=1" has a query`},
		{"request two spaces", `request: "GET  /v1"`, `flows[0].request: path " /v1" does not start with '/'`},
		{"callee without procedures", `callee: plain, request: "GET /v1"`, "flows[0].request: service plain declares no procedures in limits"},
		{"callee without procedures, gRPC", `callee: plain, procedure: /a.B/C`, "flows[0].procedure: service plain declares no procedures in limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flow := "  - {callee: checkout, caller: web, rate: {constant: 1}, " + tc.flow + "}\n"
			if strings.Contains(tc.flow, "callee:") {
				flow = "  - {caller: web, rate: {constant: 1}, " + tc.flow + "}\n"
			}
			_, err := Parse(strings.NewReader(withProcedures+flow), "bad")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one saying %q", err, tc.want)
			}
		})
	}
}
