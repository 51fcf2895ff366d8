package limits

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/routes"
)

func leafLimit(callee, caller, proc string, limit float64) history.BucketLimit {
	return history.BucketLimit{Bucket: history.Bucket{Callee: callee, Caller: caller, Procedure: proc}, Limit: limit}
}

// The store's routes and procedure limits make the Set the limits file
// would: Declared is the routes' procedures in first-mention order, then
// the other procedures sorted; _other is never declared.
func TestFromHistoryProcedures(t *testing.T) {
	rs := []routes.Route{
		{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
		{Pattern: "POST /v1/charges", Procedure: "create-charge"},
		{Pattern: "/v1/charges/*", Procedure: "get-item"},
	}
	set, err := FromHistory(history.Limits{
		Buckets: []history.BucketLimit{
			leafLimit("checkout", history.AnyCaller, "/shop.Checkout/Pay", 500),
			leafLimit("checkout", history.AnyCaller, "_other", 100),
			leafLimit("checkout", history.AnyCaller, "create-charge", 200),
			{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 100},
			leafLimit("checkout", "web", "/shop.Checkout/Auth", 10),
			leafLimit("checkout", "web", "create-charge", 50),
			{Bucket: history.Bucket{Callee: "orders", Caller: "web"}, Limit: 7},
		},
		Routes: []history.ServiceRoutes{{Callee: "checkout", Routes: rs}},
	})
	if err != nil {
		t.Fatal(err)
	}
	co := set.Service("checkout")
	if want := []string{"get-item", "create-charge", "/shop.Checkout/Auth", "/shop.Checkout/Pay"}; !reflect.DeepEqual(co.Declared, want) {
		t.Errorf("Declared %q, want %q", co.Declared, want)
	}
	if !reflect.DeepEqual(co.Routes, rs) {
		t.Errorf("Routes %v, want %v", co.Routes, rs)
	}
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"web's create-charge", co.LeafLimit("web", "create-charge"), 50},
		{"web's gRPC Auth", co.LeafLimit("web", "/shop.Checkout/Auth"), 10},
		{"mobile's create-charge", co.LeafLimit("mobile", "create-charge"), math.Inf(1)},
		{"create-charge's capacity", co.ProcedureCapacity("create-charge"), 200},
		{"Pay's capacity", co.ProcedureCapacity("/shop.Checkout/Pay"), 500},
		{"_other's capacity", co.ProcedureCapacity("_other"), 100},
		{"get-item's capacity", co.ProcedureCapacity("get-item"), math.Inf(1)},
		{"web's caller limit", co.Bucket("web").Limit, 100},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	for _, p := range co.Declared {
		if co.Procedures[p] == nil {
			t.Errorf("declared %s has no Procedures entry", p)
		}
	}
	if or := set.Service("orders"); or.HasProcedures() || or.Procedures != nil || or.Routes != nil {
		t.Errorf("orders = %+v, want no procedures: as before #14", or)
	}
}

// Stored rows that no limits file could say are errors naming the row.
func TestFromHistoryRefusesBadProcedures(t *testing.T) {
	set, err := FromHistory(history.Limits{
		Services: []history.ServiceLimits{{Callee: "up", Enforcement: new(dataplane.EnforceUpstream)}, {Callee: "upgrpc", Enforcement: new(dataplane.EnforceUpstream)}},
		Buckets: []history.BucketLimit{
			leafLimit("names", "web", "a//b", 5),
			leafLimit("names", "bad caller", "/s.S/M", 5),
			leafLimit("up", "web", "/s.S/M", 5),
			{Bucket: history.Bucket{Callee: "upcaller", Caller: "app"}, Limit: 1, Enforcement: new(dataplane.EnforceUpstream)},
			leafLimit("upcaller", history.AnyCaller, "/s.S/M", 5),
			leafLimit("upgrpc", "web", "/s.S/M", 5), // gRPC methods only: legal
		},
		Routes: []history.ServiceRoutes{
			{Callee: "shadow", Routes: []routes.Route{{Pattern: "/v1/*", Procedure: "all"}, {Pattern: "GET /v1/x", Procedure: "x"}}},
			{Callee: "up", Routes: []routes.Route{{Pattern: "/v1/*", Procedure: "all"}}},
			{Callee: "upcaller", Routes: []routes.Route{{Pattern: "/v1/*", Procedure: "all"}}},
		},
	})
	if set != nil || err == nil {
		t.Fatalf("FromHistory = %v, %v; want an error", set, err)
	}
	for _, want := range []string{
		`limit names/web/a//b: procedure: procedure "a//b" has an empty part`,
		"limit names/bad caller//s.S/M: caller:",
		"service up: enforcement: upstream: the service routes HTTP requests to procedures",
		"limit upcaller/app: enforcement: upstream",
		`routes of shadow: route 1 "GET /v1/x": shadowed by route 0`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %s:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "upgrpc") {
		t.Errorf("upstream refused on a callee that declares gRPC methods only:\n%v", err)
	}
}

// Rows that history can leave behind once routes change (an approved
// proposal for a procedure a route no longer names; _other of a callee
// that declares nothing now) cost their own rows, with a warning, never
// every service's limits.
func TestFromHistoryLeavesOutOrphanedLeaves(t *testing.T) {
	set, err := FromHistory(history.Limits{
		Buckets: []history.BucketLimit{
			{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 100},
			leafLimit("checkout", "web", "create-charge", 50),
			leafLimit("checkout", "web", "charges", 40),
			leafLimit("lonely", history.AnyCaller, "_other", 5),
		},
		Routes: []history.ServiceRoutes{
			{Callee: "checkout", Routes: []routes.Route{{Pattern: "POST /v1/charges", Procedure: "charges"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	co := set.Service("checkout")
	if !slices.Equal(co.Declared, []string{"charges"}) || co.LeafLimit("web", "charges") != 40 || co.Procedures["create-charge"] != nil {
		t.Errorf("checkout declares %q with %+v; want charges alone, its leaf at 40, create-charge left out", co.Declared, co.Procedures)
	}
	if co.Bucket("web").Limit != 100 {
		t.Errorf("web's caller limit %v, want 100", co.Bucket("web").Limit)
	}
	if lo := set.Service("lonely"); lo.HasProcedures() || lo.Procedures != nil {
		t.Errorf("lonely = %+v, want no procedures", lo)
	}
	w := strings.Join(set.Warnings(), "\n")
	for _, want := range []string{
		"limit checkout/web/create-charge: left out: no route of checkout names create-charge",
		"limits of lonely on _other: left out: lonely declares no procedure",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings do not say %q:\n%s", want, w)
		}
	}
}
