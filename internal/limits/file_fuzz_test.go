package limits

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"

	"github.com/sluicehq/sluice/internal/testkit"
)

// billionLaughs is the classic alias bomb: levels anchors, each a list of
// nine aliases of the one before, under the given key path; fully expanded
// it holds 9^levels strings.
func billionLaughs(levels int) string {
	var b strings.Builder
	b.WriteString("lol0: &lol0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i < levels; i++ {
		fmt.Fprintf(&b, "lol%d: &lol%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*lol%d, ", i-1), 9), ", "))
	}
	return b.String()
}

// indent shifts every line of doc right by n spaces.
func indent(doc string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimSuffix(doc, "\n"), "\n", "\n"+pad) + "\n"
}

// bombs are documents built to make a YAML decoder do far more work than
// their size: alias expansion at the top, where the schema expects
// services, and where it expects callers; merge keys; and deep nesting.
func bombs() map[string]string {
	laughs := billionLaughs(9)
	var merges strings.Builder
	merges.WriteString("services:\n  base: &b {callers: {web: {limit: 1}}}\n")
	for i := range 64 {
		fmt.Fprintf(&merges, "  s%d: &s%d {<<: [*%s, *%s]}\n", i, i, prev(i), prev(i))
	}
	return map[string]string{
		"bomb-top-level":     laughs,
		"bomb-in-services":   "services:\n" + indent(laughs, 2),
		"bomb-in-callers":    "services:\n  checkout:\n    callers:\n" + indent(laughs, 6),
		"bomb-as-limit":      "x: &x " + strings.Repeat("[*x, ", 1) + "]\nservices: {checkout: {callers: {web: {limit: *x}}}}\n",
		"bomb-merge-keys":    merges.String(),
		"deep-flow-nesting":  "services: " + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + "\n",
		"deep-block-nesting": "services:\n" + deepBlocks(2000),
	}
}

func prev(i int) string {
	if i == 0 {
		return "b"
	}
	return fmt.Sprintf("s%d", i-1)
}

func deepBlocks(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s  k%d:\n", strings.Repeat(" ", i), i)
	}
	return b.String()
}

// parseSeeds are FuzzParse's committed seeds.
func parseSeeds() map[string]string {
	s := map[string]string{
		"good":               good,
		"good-empty":         "",
		"good-no-services":   "services: {}\n",
		"good-null-services": "services: ~\n",
		"good-extremes": "services:\n  checkout:\n    capacity: 1.7976931348623157e308\n    default_limit: 0\n" +
			"    callers: {web: {limit: 5e-324}, _overflow: {limit: 10}, unknown: {limit: 1}}\n",
		"good-253-byte-names": fmt.Sprintf("services:\n  %s:\n    callers: {%s: {limit: 1}}\n",
			strings.Repeat("s", names.MaxLen), strings.Repeat("c", names.MaxLen)),
		"good-yaml-number-forms": "services:\n  checkout:\n    capacity: 0x10\n    default_limit: 1_000\n    callers: {web: {limit: +.5}, a: {limit: 0o17}}\n",
		"good-anchor":            "services:\n  a: &svc {default_limit: 5, callers: {web: {limit: 1}}}\n  b: *svc\n",
		"good-merge-key":         "services:\n  a: &svc {default_limit: 5}\n  b: {<<: *svc, capacity: 9}\n",
		"good-second-document":   good + "---\nnot: [a, limits, file]\n",
		"bad-nan":                "services: {checkout: {callers: {web: {limit: .nan}}}}\n",
		"bad-inf":                "services: {checkout: {capacity: .inf}}\n",
		"bad-negative-inf":       "services: {checkout: {default_limit: -.Inf}}\n",
		"bad-negative":           "services: {checkout: {callers: {web: {limit: -1}}}}\n",
		"bad-overflow-service":   "services: {_overflow: {callers: {web: {limit: 1}}}}\n",
		"bad-empty-names":        "services: {\"\": {callers: {\"\": {limit: 1}}}}\n",
		"bad-null-key":           "services: {~: {callers: {~: {limit: 1}}}}\n",
		"bad-null-caller-name":   "services:\n  checkout:\n    callers:\n      null: {limit: 0}\n",
		"bad-empty-key":          "services:\n  checkout:\n    callers:\n      ? \n      : {limit: 0}\n",
		"good-quoted-null-name":  "services:\n  checkout:\n    callers:\n      \"null\": {limit: 0}\n",
		"bad-254-byte-name":      fmt.Sprintf("services: {%s: {}}\n", strings.Repeat("s", names.MaxLen+1)),
		"bad-non-utf8-name":      "services: {\"check\\xffout\": {}}\n",
		"bad-unknown-field":      "services: {checkout: {limits: {web: 1}}}\n",
		"bad-duplicate-key":      "services:\n  checkout: {}\n  checkout: {}\n",
		"bad-limit-missing":      "services: {checkout: {callers: {web: {mode: shadow}}}}\n",
		"bad-limit-string":       "services: {checkout: {callers: {web: {limit: lots}}}}\n",
		"bad-modes":              "services: {checkout: {mode: strict, fail_mode: closed, callers: {web: {limit: 1, mode: Shadow}}}}\n",
		"bad-tabs":               "services:\n\tcheckout: {}\n",
		"bad-binary":             "\x00\xff\xfe services",

		"good-procedures":             withProcedures,
		"good-grpc-procedures":        "services: {s: {capacity: 9, procedures: {/p.S/A: {capacity: 1, callers: {web: {limit: 2}}}, /p.S/B: ~}}}\n",
		"good-routes-only":            "services: {s: {callers: {web: {limit: 1}}, routes: [{route: /, procedure: root}, {route: \"GET /a/{id}/*\", procedure: a}]}}\n",
		"good-route-anchor":           "services:\n  s:\n    routes:\n      - &r {route: /a, procedure: a}\n      - {<<: *r, route: /b}\n",
		"bad-route-shadowed":          "services: {s: {routes: [{route: /a/*, procedure: a}, {route: /a/b, procedure: b}]}}\n",
		"bad-route-template":          "services: {s: {routes: [{route: \"get /a//{x\", procedure: \"-x\"}]}}\n",
		"bad-route-missing-procedure": "services: {s: {routes: [{route: /a}]}}\n",
		"bad-route-other":             "services: {s: {routes: [{route: /a, procedure: _other}]}}\n",
		"bad-routes-mapping":          "services: {s: {routes: {route: /a, procedure: a}}}\n",
		"bad-procedure-no-parent":     "services: {s: {routes: [{route: /a, procedure: a}], procedures: {b: {capacity: 1}}}}\n",
		"bad-procedure-only-other":    "services: {s: {procedures: {_other: {capacity: 1}}}}\n",
		"bad-procedure-leaf-fields":   "services: {s: {procedures: {/p.S/M: {callers: {web: {mode: shadow}}}}}}\n",
		"bad-procedure-upstream":      "services: {s: {routes: [{route: /a, procedure: a}], callers: {app: {limit: 1, enforcement: upstream}}}}\n",
		"good-procedure-upstream":     "services: {s: {procedures: {/p.S/M: {}}, callers: {app: {limit: 1, enforcement: upstream}}}}\n",

		"good-descriptors":         withDescriptors,
		"good-descriptor-extremes": "services: {s: {descriptors: {t: {from: xff 16, limit: 5e-324, missing: 1.7976931348623157e308, quantile: 1e-300, overrides: {\"\\u00e9t\\u00e9\": 0, \"a b\": 1}}}}}\n",
		"bad-descriptor-upstream":  "services: {s: {enforcement: upstream, descriptors: {t: {from: client-ip, limit: 1}}}}\n",
		"bad-descriptor-missing":   "services: {s: {descriptors: {t: {from: client-ip, limit: 1, overrides: {_missing: 2}}}}}\n",
		"bad-descriptor-source":    "services: {s: {descriptors: {t: {from: header, limit: 1}}}}\n",
		"bad-descriptor-quantile":  "services: {s: {descriptors: {t: {from: client-ip, limit: 1, quantile: 0}}}}\n",
		"bad-descriptor-too-many":  "services: {s: {descriptors: {a: &d {from: client-ip, limit: 1}, b: *d, c: *d, d: *d, e: *d}}}\n",
	}
	for name, doc := range bombs() {
		if len(doc) <= 64<<10 { // larger seeds slow every mutation down
			s[name] = doc
		}
	}
	return s
}

func TestFuzzParseCorpus(t *testing.T) {
	seeds := parseSeeds()
	testkit.CheckCorpus(t, "FuzzParse", testkit.FromMap(seeds, func(doc string) []any { return []any{[]byte(doc)} }))
	for name, doc := range seeds {
		_, err := Parse(strings.NewReader(doc))
		if good := strings.HasPrefix(name, "good"); good != (err == nil) {
			t.Errorf("seed %s: %v", name, err)
		}
	}
}

// TestParseRefusesBombs: a limits file that expands its aliases a billion
// times over, or nests ten thousand deep, is refused after bounded work,
// not after the controller ran out of memory. The bound is on bytes
// allocated, not on time, so that a busy machine can not make it flake.
func TestParseRefusesBombs(t *testing.T) {
	const maxAlloc = 64 << 20
	for name, doc := range bombs() {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Parse(strings.NewReader(doc))
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Errorf("a %d-byte bomb was accepted", len(doc))
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > maxAlloc {
				t.Errorf("parsing a %d-byte document allocated %d MB", len(doc), n>>20)
			}
			t.Logf("%d bytes: %.120v", len(doc), err)
		})
	}
}

// FuzzParse feeds any bytes to Parse. It must never panic; a document it
// accepts must hold only valid names and rates that are finite and >= 0,
// or +Inf for none; and the set must survive being written back as YAML
// and parsed again.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, doc []byte) {
		set, err := Parse(bytes.NewReader(doc))
		if err != nil {
			if set != nil {
				t.Fatalf("Parse returned a set and an error: %v", err)
			}
			return
		}
		checkSet(t, set)
		out, err := yaml.Marshal(render(set))
		if err != nil {
			t.Fatalf("render the set: %v", err)
		}
		again, err := Parse(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("the set written back does not parse: %v\n%s", err, out)
		}
		if !equalSets(set, again) {
			t.Fatalf("the set changed on its way back:\n%s", out)
		}
	})
}

func checkSet(t *testing.T, set *Set) {
	t.Helper()
	if !slices.IsSorted(set.Services()) || set.Len() != len(set.Services()) {
		t.Fatalf("Services() %q, Len() %d", set.Services(), set.Len())
	}
	rateOK := func(v float64) bool { return v >= 0 && !math.IsInf(v, -1) } // NaN fails too
	for _, name := range set.Services() {
		svc := set.Service(name)
		if svc == nil || svc.Name != name {
			t.Fatalf("Service(%q) = %+v", name, svc)
		}
		if err := names.Check(name); err != nil || name == names.Overflow {
			t.Errorf("accepted service %q: %v", name, err)
		}
		if !rateOK(svc.Capacity) || !rateOK(svc.DefaultLimit) {
			t.Errorf("%s: capacity %v, default limit %v", name, svc.Capacity, svc.DefaultLimit)
		}
		if svc.Mode != dropratio.Enforce && svc.Mode != dropratio.Shadow ||
			svc.FailMode != dataplane.FailOpen && svc.FailMode != dataplane.FailHold && svc.FailMode != dataplane.FailLocal {
			t.Errorf("%s: mode %v, fail mode %v", name, svc.Mode, svc.FailMode)
		}
		checkProcedures(t, svc)
		checkDescriptors(t, svc)
		for caller, b := range svc.Callers {
			if err := names.Check(caller); err != nil {
				t.Errorf("%s: accepted caller %q: %v", name, caller, err)
			}
			if !rateOK(b.Limit) || math.IsInf(b.Limit, 1) {
				t.Errorf("%s/%s: limit %v: a listed caller has a finite limit", name, caller, b.Limit)
			}
			if b.Mode != dropratio.Enforce && b.Mode != dropratio.Shadow {
				t.Errorf("%s/%s: mode %v", name, caller, b.Mode)
			}
		}
	}
}

// checkProcedures checks what a service declares: procedures valid,
// distinct and bounded, _other never among them; routes that compile and
// name them first; every other one a gRPC method; every leaf named and
// limited; and nothing enforced upstream if it has routes.
func checkProcedures(t *testing.T, svc *Service) {
	t.Helper()
	rateOK := func(v float64) bool { return v >= 0 && !math.IsInf(v, -1) }
	if !svc.HasProcedures() {
		if len(svc.Routes) != 0 || len(svc.Procedures) != 0 || svc.Declared != nil {
			t.Errorf("%s declares no procedure, but routes %v, procedures %v", svc.Name, svc.Routes, svc.Procedures)
		}
		return
	}
	if len(svc.Declared) > routes.MaxRoutes || slices.Contains(svc.Declared, names.Other) {
		t.Errorf("%s: declared %q", svc.Name, svc.Declared)
	}
	r, err := routes.CompileRoutes(svc.Routes)
	if err != nil {
		t.Fatalf("%s: accepted routes that do not compile: %v", svc.Name, err)
	}
	fromRoutes := r.Procedures()
	if !slices.Equal(svc.Declared[:len(fromRoutes)], fromRoutes) {
		t.Errorf("%s: declared %q do not start with the routes' %q", svc.Name, svc.Declared, fromRoutes)
	}
	for i, p := range svc.Declared {
		if err := names.CheckProcedure(p); err != nil || slices.Index(svc.Declared, p) != i {
			t.Errorf("%s: declared %q: %q: %v", svc.Name, svc.Declared, p, err)
		}
		if i >= len(fromRoutes) && routes.GRPCProcedure(p) != p {
			t.Errorf("%s: %q is declared, but no route names it and no gRPC call can be it", svc.Name, p)
		}
		if svc.Procedures[p] == nil {
			t.Errorf("%s: declared %q has no limits", svc.Name, p)
		}
	}
	for name, p := range svc.Procedures {
		if name != names.Other && !slices.Contains(svc.Declared, name) {
			t.Errorf("%s: procedure %q is not declared", svc.Name, name)
		}
		if !rateOK(p.Capacity) {
			t.Errorf("%s: procedure %q: capacity %v", svc.Name, name, p.Capacity)
		}
		for caller, l := range p.Callers {
			if err := names.Check(caller); err != nil || !rateOK(l) || math.IsInf(l, 1) {
				t.Errorf("%s: leaf (%q, %q): limit %v, %v", svc.Name, caller, name, l, err)
			}
		}
	}
	if len(svc.Routes) == 0 {
		return // gRPC methods only: upstream is served per method
	}
	if svc.Enforcement == dataplane.EnforceUpstream {
		t.Errorf("%s routes HTTP requests to procedures and is enforced upstream", svc.Name)
	}
	for caller, b := range svc.Callers {
		if b.Enforcement == dataplane.EnforceUpstream {
			t.Errorf("%s routes HTTP requests to procedures, and its caller %s is enforced upstream", svc.Name, caller)
		}
	}
}

// checkDescriptors checks a service's descriptors: bounded, sorted,
// named, sourced, limited and with a quantile, overrides being values a
// request can carry; and nothing enforced upstream.
func checkDescriptors(t *testing.T, svc *Service) {
	t.Helper()
	ds := svc.Descriptors
	if len(ds) > descriptor.MaxPerService || !slices.IsSortedFunc(ds, func(a, b Descriptor) int { return strings.Compare(a.Name, b.Name) }) {
		t.Errorf("%s: descriptors %+v", svc.Name, ds)
	}
	finite := func(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }
	for i, d := range ds {
		if err := descriptor.CheckName(d.Name); err != nil || i > 0 && ds[i-1].Name == d.Name {
			t.Errorf("%s: descriptor %q: %v", svc.Name, d.Name, err)
		}
		if src, err := descriptor.ParseSource(d.Source.String()); err != nil || src != d.Source {
			t.Errorf("%s/%s: source %+v: %v", svc.Name, d.Name, d.Source, err)
		}
		if !finite(d.Limit) || !finite(d.Missing) || allowance.CheckQuantile(d.Quantile) != nil {
			t.Errorf("%s/%s: limit %v, missing %v, quantile %v", svc.Name, d.Name, d.Limit, d.Missing, d.Quantile)
		}
		for v, l := range d.Overrides {
			if err := descriptor.CheckValue(v); err != nil || v == descriptor.Missing || !finite(l) {
				t.Errorf("%s/%s: override %q: %v, %v", svc.Name, d.Name, v, l, err)
			}
		}
	}
	if len(ds) == 0 {
		return
	}
	if svc.Enforcement == dataplane.EnforceUpstream {
		t.Errorf("%s has descriptors and is enforced upstream", svc.Name)
	}
	for caller, b := range svc.Callers {
		if b.Enforcement == dataplane.EnforceUpstream {
			t.Errorf("%s has descriptors, and its caller %s is enforced upstream", svc.Name, caller)
		}
	}
}

// render writes a set in the file's format.
func render(set *Set) fileDoc {
	doc := fileDoc{Services: map[string]fileService{}}
	rate := func(v float64) *float64 {
		if math.IsInf(v, 1) {
			return nil
		}
		return &v
	}
	for _, name := range set.Services() {
		svc := set.Service(name)
		fs := fileService{Capacity: rate(svc.Capacity), DefaultLimit: rate(svc.DefaultLimit),
			Mode: svc.Mode.String(), FailMode: svc.FailMode.String(), Enforcement: svc.Enforcement.String(), Callers: map[string]fileBucket{}}
		for caller, b := range svc.Callers {
			fb := fileBucket{Limit: rate(b.Limit), Mode: b.Mode.String(), Enforcement: b.Enforcement.String()}
			if b.Burst != 0 {
				fb.Burst = &b.Burst
			}
			if b.Payback != 0 {
				fb.Payback = b.Payback.String()
			}
			fs.Callers[caller] = fb
		}
		for _, r := range svc.Routes {
			fs.Routes = append(fs.Routes, fileRoute{Route: r.Pattern, Procedure: r.Procedure})
		}
		if len(svc.Procedures) > 0 {
			fs.Procedures = map[string]fileProcedure{}
		}
		for proc, p := range svc.Procedures {
			fp := fileProcedure{Capacity: rate(p.Capacity), Callers: map[string]fileLeaf{}}
			for caller, l := range p.Callers {
				fp.Callers[caller] = fileLeaf{Limit: rate(l)}
			}
			fs.Procedures[proc] = fp
		}
		for _, d := range svc.Descriptors {
			if fs.Descriptors == nil {
				fs.Descriptors = map[string]fileDescriptor{}
			}
			fd := fileDescriptor{From: d.Source.String(), Limit: rate(d.Limit), Missing: rate(d.Missing), Quantile: &d.Quantile}
			for v, l := range d.Overrides {
				if fd.Overrides == nil {
					fd.Overrides = map[string]*float64{}
				}
				fd.Overrides[v] = rate(l)
			}
			fs.Descriptors[d.Name] = fd
		}
		doc.Services[name] = fs
	}
	return doc
}

func equalSets(a, b *Set) bool {
	if !slices.Equal(a.Services(), b.Services()) {
		return false
	}
	for _, name := range a.Services() {
		x, y := a.Service(name), b.Service(name)
		// == on rates: -0 is written as 0, which means the same.
		if x.Capacity != y.Capacity || x.DefaultLimit != y.DefaultLimit || x.Mode != y.Mode || x.FailMode != y.FailMode ||
			x.Enforcement != y.Enforcement ||
			len(x.Callers) != len(y.Callers) {
			return false
		}
		for caller, bx := range x.Callers {
			if by, ok := y.Callers[caller]; !ok || bx != by {
				return false
			}
		}
		if !slices.Equal(x.Routes, y.Routes) || !slices.Equal(x.Declared, y.Declared) || len(x.Procedures) != len(y.Procedures) {
			return false
		}
		for proc, px := range x.Procedures {
			py, ok := y.Procedures[proc]
			if !ok || px.Capacity != py.Capacity || !maps.Equal(px.Callers, py.Callers) {
				return false
			}
		}
		if !slices.EqualFunc(x.Descriptors, y.Descriptors, func(a, b Descriptor) bool {
			return a.Name == b.Name && a.Source == b.Source && a.Limit == b.Limit && a.Missing == b.Missing &&
				a.Quantile == b.Quantile && maps.Equal(a.Overrides, b.Overrides)
		}) {
			return false
		}
	}
	return true
}
