package limits

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// withProcedures is the common brief's example, and a service without
// procedures beside it.
const withProcedures = `
services:
  checkout:
    capacity: 1000
    callers:
      web:    {limit: 100}
      mobile: {limit: 300}
    routes:
      - {route: "POST /v1/charges", procedure: create-charge}
      - {route: "GET /v1/items/{id}", procedure: get-item}
    procedures:
      create-charge:
        capacity: 200
        callers:
          web: {limit: 50}
      /shop.Checkout/Pay: {capacity: 500}
      _other: {capacity: 100}
  orders:
    callers:
      web: {limit: 7}
`

func TestParseProcedures(t *testing.T) {
	set, err := Parse(strings.NewReader(withProcedures))
	if err != nil {
		t.Fatal(err)
	}
	if w := set.Warnings(); len(w) != 0 {
		t.Errorf("warnings %q", w)
	}
	co := set.Service("checkout")
	if !co.HasProcedures() {
		t.Fatal("checkout declares no procedures")
	}
	wantRoutes := []routes.Route{{Pattern: "POST /v1/charges", Procedure: "create-charge"}, {Pattern: "GET /v1/items/{id}", Procedure: "get-item"}}
	if !slices.Equal(co.Routes, wantRoutes) {
		t.Errorf("routes %v, want %v", co.Routes, wantRoutes)
	}
	if want := []string{"create-charge", "get-item", "/shop.Checkout/Pay"}; !slices.Equal(co.Declared, want) {
		t.Errorf("declared %q, want %q", co.Declared, want)
	}
	if got := slices.Sorted(func(yield func(string) bool) {
		for p := range co.Procedures {
			if !yield(p) {
				return
			}
		}
	}); !slices.Equal(got, []string{"/shop.Checkout/Pay", "_other", "create-charge", "get-item"}) {
		t.Errorf("procedures %q: every declared one and _other, which is listed", got)
	}
	inf := math.Inf(1)
	for _, tc := range []struct {
		caller, proc string
		leaf, cap    float64
	}{
		{"web", "create-charge", 50, 200},
		{"mobile", "create-charge", inf, 200},
		{"web", "get-item", inf, inf}, // only a route names it
		{"web", "/shop.Checkout/Pay", inf, 500},
		{"web", names.Other, inf, 100},
		{"web", "undeclared", inf, inf},
	} {
		if got := co.LeafLimit(tc.caller, tc.proc); got != tc.leaf {
			t.Errorf("LeafLimit(%s, %s) = %v, want %v", tc.caller, tc.proc, got, tc.leaf)
		}
		if got := co.ProcedureCapacity(tc.proc); got != tc.cap {
			t.Errorf("ProcedureCapacity(%s) = %v, want %v", tc.proc, got, tc.cap)
		}
	}
	if b := co.Bucket("web"); b.Limit != 100 || b.Enforcement != dataplane.EnforceSidecar {
		t.Errorf("web's caller limit %+v, want 100 across procedures", b)
	}
	// A service that declares none is as before procedures.
	o := set.Service("orders")
	if o.HasProcedures() || o.Routes != nil || o.Procedures != nil || o.Declared != nil || o.Bucket("web").Limit != 7 {
		t.Errorf("orders = %+v", o)
	}
	// An empty routes list and procedures mapping declare nothing either.
	set, err = Parse(strings.NewReader("services: {orders: {routes: [], procedures: {}, callers: {web: {limit: 7}}}}\n"))
	if err != nil || set.Service("orders").HasProcedures() || set.Service("orders").Procedures != nil {
		t.Errorf("empty routes and procedures: %v, %+v", err, set.Service("orders"))
	}
}

// Declared lists the procedures routes name in order of first mention,
// then the other keys of procedures sorted, never _other.
func TestParseDeclaredOrder(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  s:
    routes:
      - {route: "/b", procedure: b}
      - {route: "/a", procedure: a}
      - {route: "/b2", procedure: b}
      - {route: "/c/*", procedure: c}
    procedures:
      /z.S/M: {capacity: 1}
      _other: {capacity: 1}
      c: {capacity: 1}
      /a.S/M: {capacity: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := set.Service("s").Declared, []string{"b", "a", "c", "/a.S/M", "/z.S/M"}; !slices.Equal(got, want) {
		t.Errorf("declared %q, want %q", got, want)
	}
	// gRPC only: no routes at all.
	set, err = Parse(strings.NewReader("services: {s: {procedures: {/p.S/B: {}, /p.S/A: {capacity: 3}}}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := set.Service("s").Declared, []string{"/p.S/A", "/p.S/B"}; !slices.Equal(got, want) {
		t.Errorf("declared %q, want %q", got, want)
	}
}

func TestParseProcedureErrors(t *testing.T) {
	many := func(n int, route bool) string {
		var b strings.Builder
		b.WriteString("services:\n  s:\n")
		if route {
			b.WriteString("    routes:\n")
			for i := range n {
				fmt.Fprintf(&b, "      - {route: \"/r%d\", procedure: p%d}\n", i, i)
			}
			return b.String()
		}
		b.WriteString("    procedures:\n")
		for i := range n {
			fmt.Fprintf(&b, "      /p.S/M%d: {}\n", i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"bad template", `{services: {s: {routes: [{route: "/a", procedure: a}, {route: "GET a", procedure: b}, {route: "GET /{x", procedure: c}]}}}`,
			[]string{`services.s.routes[1]: line 1: "GET a": relative path`, `services.s.routes[2]: line 1: "GET /{x": segment 0`}},
		{"duplicate and shadowed", "services:\n  s:\n    routes:\n      - {route: \"GET /a/*\", procedure: a}\n      - {route: \"GET /a/*\", procedure: b}\n      - {route: \"GET /a/{id}\", procedure: c}\n",
			[]string{`services.s.routes[1]: line 5: "GET /a/*": duplicate of route 0`, `services.s.routes[2]: line 6: "GET /a/{id}": shadowed by route 0`}},
		{"route procedure", `{services: {s: {routes: [{route: "/a", procedure: "-a"}, {route: "/b", procedure: _other}]}}}`,
			[]string{`services.s.routes[0]: line 1: "/a": procedure:`, `services.s.routes[1]: line 1: "/b": procedure "_other" is reserved`}},
		{"route missing fields", "services:\n  s:\n    routes:\n    - {route: \"/a\"}\n    - {procedure: b}\n",
			[]string{`services.s.routes[0].procedure: line 4: missing`, `services.s.routes[1].route: line 5: missing`}},
		{"route unknown field", `{services: {s: {routes: [{route: "/c", procedure: c, method: GET}]}}}`,
			[]string{`services.s.routes[0]: line 1: field method not found`}},
		{"routes not a list", `{services: {s: {routes: {route: "/a", procedure: a}}}}`, []string{"services.s.routes: line 1: want a sequence, got a mapping"}},
		{"too many routes", many(routes.MaxRoutes+1, true), []string{"services.s.routes: 257 routes, at most 256"}},
		{"too many procedures", many(routes.MaxRoutes+1, false), []string{"services.s.procedures: 257 procedures declared, at most 256"}},
		{"procedure name", `{services: {s: {procedures: {"a b": {}, "/p.S/M/": {}}}}}`,
			[]string{`services.s.procedures.a b: invalid procedure name`, `services.s.procedures./p.S/M/: invalid procedure name`}},
		{"leaf without a parent", `{services: {s: {routes: [{route: "/a", procedure: a}], procedures: {b: {capacity: 1}, /p.S: {}, p.S/M: {}}}}}`,
			[]string{`services.s.procedures.b: no route names it and it is not a gRPC full method`,
				`services.s.procedures./p.S: no route names it`, `services.s.procedures.p.S/M: no route names it`}},
		{"only _other", `{services: {s: {procedures: {_other: {capacity: 1}}}}}`, []string{"services.s.procedures._other: the service declares no procedure"}},
		{"procedure fields", `{services: {s: {procedures: {/p.S/M: {limit: 3, callers: {web: {limit: 1, mode: shadow}, app: {}}}}}}}`,
			[]string{`services.s.procedures./p.S/M: line 1: field limit not found`, `services.s.procedures./p.S/M.callers.web: line 1: field mode not found`}},
		{"leaf values", `{services: {s: {procedures: {/p.S/M: {capacity: -1, callers: {"bad name": {limit: 1}, app: {}, web: {limit: .nan}}}}}}}`,
			[]string{`services.s.procedures./p.S/M.capacity: -1 is not a finite rate`, `services.s.procedures./p.S/M.callers.bad name: invalid caller name`,
				`services.s.procedures./p.S/M.callers.app.limit: missing`, `services.s.procedures./p.S/M.callers.web.limit: NaN is not a finite rate`}},
		{"upstream service with routes", `{services: {s: {enforcement: upstream, routes: [{route: "/a", procedure: a}], procedures: {/p.S/M: {}}, callers: {web: {limit: 1}}}}}`,
			[]string{"services.s.enforcement: upstream: the service routes HTTP requests to procedures"}},
		{"upstream caller with routes", `{services: {s: {routes: [{route: "/a", procedure: a}], callers: {web: {limit: 1}, app: {limit: 1, enforcement: upstream}}}}}`,
			[]string{"services.s.callers.app.enforcement: upstream: the service routes HTTP requests to procedures"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Parse(strings.NewReader(tc.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", set.Service("s"))
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not contain %q:\n%v", want, err)
				}
			}
		})
	}
	// The service's upstream is its error, not each caller's too.
	_, err := Parse(strings.NewReader(`{services: {s: {enforcement: upstream, routes: [{route: "/a", procedure: a}], callers: {web: {limit: 1}}}}}`))
	if err == nil || strings.Contains(err.Error(), "callers.web") {
		t.Errorf("an inherited upstream is reported on the caller: %v", err)
	}
}

// Upstream is legal on a service without procedures, as before #14, and
// on one that declares gRPC methods only: the proxyless routes carry a
// ratio per method.
func TestParseUpstreamGRPCMethods(t *testing.T) {
	up, side := dataplane.EnforceUpstream, dataplane.EnforceSidecar
	for _, tc := range []struct {
		doc     string
		web, pp dataplane.Enforcement // of callers web and app
	}{
		{`{services: {s: {enforcement: upstream, callers: {web: {limit: 1, enforcement: upstream}}}}}`, up, up},
		{`{services: {s: {enforcement: upstream, procedures: {/p.S/M: {}}, callers: {web: {limit: 1}}}}}`, up, up},
		{`{services: {s: {procedures: {/p.S/M: {callers: {app: {limit: 1}}}, _other: {capacity: 5}}, callers: {web: {limit: 1}, app: {limit: 2, enforcement: upstream}}}}}`, side, up},
	} {
		set, err := Parse(strings.NewReader(tc.doc))
		if err != nil {
			t.Errorf("%s: %v", tc.doc, err)
			continue
		}
		s := set.Service("s")
		if w, a := s.Bucket("web").Enforcement, s.Bucket("app").Enforcement; w != tc.web || a != tc.pp {
			t.Errorf("%s: web %v, app %v; want %v, %v", tc.doc, w, a, tc.web, tc.pp)
		}
	}
}

func TestParseProcedureWarnings(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"leaf above its caller", `{services: {s: {default_limit: 10, callers: {web: {limit: 100}},
			procedures: {/p.S/M: {callers: {web: {limit: 150}, app: {limit: 11}, bot: {limit: 10}}}}}}}`,
			[]string{"services.s.procedures./p.S/M.callers.app.limit: 11 is above caller app's limit 10 across the service's procedures, so it never binds",
				"services.s.procedures./p.S/M.callers.web.limit: 150 is above caller web's limit 100 across the service's procedures, so it never binds"}},
		{"procedure above the service", `{services: {s: {capacity: 100, procedures: {/p.S/M: {capacity: 101}, /p.S/N: {capacity: 100}, _other: {capacity: 200}}}}}`,
			[]string{"services.s.procedures./p.S/M.capacity: 101 is above the service's capacity 100, so it never binds",
				"services.s.procedures._other.capacity: 200 is above the service's capacity 100, so it never binds"}},
		{"a procedure that limits nothing", `{services: {s: {routes: [{route: "/a", procedure: a}], procedures: {/p.S/M: {capacity: 5}, _other: {}}}}}`,
			[]string{"services.s.procedures.a: limits nothing, and neither the service nor its callers have a limit: it only adds a leaf"}},
		{"limits at some level", `{services: {s: {capacity: 9, routes: [{route: "/a", procedure: a}]}, t: {callers: {web: {limit: 1}}, routes: [{route: "/a", procedure: a}]}}}`,
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Parse(strings.NewReader(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if got := set.Warnings(); !slices.Equal(got, tc.want) {
				t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// A file of many warnings keeps the first maxWarnings and counts the rest.
func TestParseBoundsWarnings(t *testing.T) {
	var b strings.Builder
	b.WriteString("services:\n  s:\n    capacity: 1\n    procedures:\n")
	for i := range maxWarnings + 5 {
		fmt.Fprintf(&b, "      /p.S/M%d: {capacity: 2}\n", i)
	}
	set, err := Parse(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	w := set.Warnings()
	if len(w) != maxWarnings+1 || w[maxWarnings] != "and 5 more warnings" {
		t.Errorf("%d warnings, the last %q", len(w), w[len(w)-1])
	}
}

// The controller's loader logs the warnings at start-up and on every
// reload that changed the file.
func TestFileLogsWarnings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	doc := "services: {s: {capacity: 1, procedures: {/p.S/M: {capacity: %d}}}}\n"
	if err := os.WriteFile(path, fmt.Appendf(nil, doc, 2), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	f, err := LoadFile(context.Background(), path, 0, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if want := `level=WARN msg="limits file: a limit is surely not what was meant" path=` + path +
		` warning="services.s.procedures./p.S/M.capacity: 2 is above the service's capacity 1, so it never binds"`; !strings.Contains(log.String(), want) {
		t.Errorf("at start-up, log:\n%s\nwant %s", log.String(), want)
	}
	log.Reset()
	writeAtomically(t, path, fmt.Sprintf(doc, 3))
	f.reload(context.Background())
	if !strings.Contains(log.String(), "/p.S/M.capacity: 3 is above") {
		t.Errorf("on reload, log:\n%s", log.String())
	}
	log.Reset()
	f.reload(context.Background()) // unchanged: not judged again
	if strings.Contains(log.String(), "WARN") {
		t.Errorf("an unchanged file warned again:\n%s", log.String())
	}
}
