package limits

import (
	"context"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// TestExampleLimitsFile loads examples/limits.yaml as the controller does
// (--limits) and checks what it says, and that it is README's example, so
// that neither drifts from the loader or from the other.
func TestExampleLimitsFile(t *testing.T) {
	const path = "../../examples/limits.yaml"
	f, err := LoadFile(context.Background(), path, time.Second, nil)
	if err != nil {
		t.Fatalf("the controller would not start with --limits %s: %v", path, err)
	}
	set := f.Limits()
	if got := strings.Join(set.Services(), ","); got != "api,checkout,llm,payments" {
		t.Fatalf("services %s, want api,checkout,llm,payments", got)
	}
	if w := set.Warnings(); len(w) != 0 {
		t.Errorf("the example warns: %q", w)
	}
	co := set.Service("checkout")
	if co.Capacity != 1000 || co.DefaultLimit != 200 || co.Mode != dropratio.Enforce || co.FailMode != dataplane.FailOpen {
		t.Errorf("checkout = %+v", co)
	}
	for caller, want := range map[string]Bucket{
		"web":    {Limit: 100, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar},
		"batch":  {Limit: 50, Mode: dropratio.Shadow, Enforcement: dataplane.EnforceSidecar},
		"abuser": {Limit: 0, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar},
		"app":    {Limit: 80, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceUpstream},
		"other":  {Limit: 200, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar}, // the default limit
		// Shipped defaults limit the reserved callers: no one sends
		// unlimited load by naming nobody, or a flood of names.
		"unknown":   {Limit: 20, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar},
		"_overflow": {Limit: 20, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar},
	} {
		if got := co.Bucket(caller); got != want {
			t.Errorf("checkout/%s = %+v, want %+v", caller, got, want)
		}
	}
	if co.HasProcedures() {
		t.Errorf("checkout declares procedures %q", co.Declared)
	}
	checkExamplePayments(t, set.Service("payments"))
	checkExampleAPI(t, set.Service("api"))
	if got := set.Service("orders").Bucket("web"); !math.IsInf(got.Limit, 1) {
		t.Errorf("a callee the file does not name is limited: %+v", got)
	}

	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Limits\n")
	if !ok {
		t.Fatal(`README has no "### Limits" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("README's Limits section has no ```yaml block")
	}
	block, _, _ = strings.Cut(block, "```\n")
	if !strings.HasSuffix(string(file), "\n"+block) {
		t.Errorf("examples/limits.yaml does not end with README's example:\n%s", block)
	}
	if !strings.Contains(string(readme), "bin/controller --limits examples/limits.yaml") {
		t.Error("README's Running the binaries does not start the controller with examples/limits.yaml")
	}
}

// checkExamplePayments checks the example's callee with procedures.
func checkExamplePayments(t *testing.T, pay *Service) {
	t.Helper()
	if want := []string{"create-charge", "get-charge", "static", "/pay.Payments/Refund"}; !slices.Equal(pay.Declared, want) {
		t.Errorf("payments declares %q, want %q", pay.Declared, want)
	}
	r, err := routes.CompileRoutes(pay.Routes)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/v1/charges", "create-charge"},
		{"GET", "/v1/charges/ch_1", "get-charge"},
		{"DELETE", "/static/css/a.css", "static"},
		{"GET", "/v1/charges", names.Other},
	} {
		if got := r.Match(tc.method, tc.path); got != tc.want {
			t.Errorf("%s %s is %s, want %s", tc.method, tc.path, got, tc.want)
		}
	}
	inf := math.Inf(1)
	for _, tc := range []struct {
		caller, proc    string
		limit, leaf, pc float64
	}{
		{"web", "create-charge", 100, 50, 200},
		{"mobile", "create-charge", 300, inf, 200},
		{"unknown", "get-charge", 20, inf, inf},
		{"web", "/pay.Payments/Refund", 100, inf, 50},
		{"mobile", names.Other, 300, inf, 20},
	} {
		if got := [3]float64{pay.Bucket(tc.caller).Limit, pay.LeafLimit(tc.caller, tc.proc), pay.ProcedureCapacity(tc.proc)}; got != [3]float64{tc.limit, tc.leaf, tc.pc} {
			t.Errorf("payments (%s, %s): caller limit, leaf limit, procedure capacity %v, want %v", tc.caller, tc.proc, got, [3]float64{tc.limit, tc.leaf, tc.pc})
		}
	}
	if pay.Capacity != 500 || pay.Bucket("_overflow") != (Bucket{Limit: 20, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar}) {
		t.Errorf("payments = %+v", pay)
	}
}

// checkExampleAPI checks the example's callee with descriptors.
func checkExampleAPI(t *testing.T, api *Service) {
	t.Helper()
	want := []Descriptor{
		{Name: "client_ip", Source: descriptor.Source{Kind: descriptor.ForwardedFor, Hops: 1}, Limit: 100, Missing: 100, Quantile: 0.95},
		{Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"}, Limit: 50, Missing: 10,
			Overrides: map[string]float64{"acme": 500}, Quantile: allowance.DefaultQuantile},
	}
	if !reflect.DeepEqual(api.Descriptors, want) {
		t.Errorf("api's descriptors = %+v, want %+v", api.Descriptors, want)
	}
	if b := api.Bucket("web"); !math.IsInf(b.Limit, 1) {
		t.Errorf("api limits its callers: %+v", b)
	}
}
