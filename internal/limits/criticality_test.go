package limits

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
)

func TestParseCriticalityExample(t *testing.T) {
	f, err := LoadFile(context.Background(), "testdata/criticality.yaml", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	set := f.Limits()
	if w := set.Warnings(); len(w) != 0 {
		t.Errorf("the example warns: %q", w)
	}
	svc := set.Service("payments")
	c := svc.Criticality
	if c == nil || !svc.Tiered() {
		t.Fatal("payments declares no tiers")
	}
	if c.Header != criticality.DefaultHeader || c.Default != criticality.Critical || c.Max != criticality.Critical {
		t.Errorf("criticality = %+v", c)
	}
	if want := map[string]criticality.Tier{"get-charge": criticality.SheddablePlus}; !maps.Equal(c.Procedures, want) {
		t.Errorf("procedures %v, want %v", c.Procedures, want)
	}
	if want := map[string]CallerTier{
		"web":   {Default: criticality.Critical, Max: criticality.CriticalPlus},
		"batch": {Default: criticality.Sheddable},
	}; !maps.Equal(c.Callers, want) {
		t.Errorf("callers %v, want %v", c.Callers, want)
	}
	for _, tc := range []struct {
		caller, procedure string
		want              criticality.Tier
	}{
		{"web", "create-charge", criticality.Critical},
		{"batch", "create-charge", criticality.Sheddable},
		{"batch", "get-charge", criticality.SheddablePlus}, // the procedure's, the most specific
		{"mobile", "create-charge", criticality.Critical},  // the service's
		{"mobile", "_other", criticality.Critical},
	} {
		if got := svc.DefaultTier(tc.caller, tc.procedure); got != tc.want {
			t.Errorf("DefaultTier(%s, %s) = %v, want %v", tc.caller, tc.procedure, got, tc.want)
		}
	}
	if got := set.Service("orders").DefaultTier("web", ""); got != criticality.None {
		t.Errorf("an unconfigured callee's tier is %v", got)
	}
}

func TestParseCriticality(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  s:
    criticality: {from: header X-Prio, default: sheddable, max: SHEDDABLE_PLUS}
    callers: {web: {limit: 1, max_criticality: CRITICAL_PLUS}}
    procedures:
      /a.B/C: {criticality: CRITICAL}
      _other: {criticality: SHEDDABLE, capacity: 5}
  bare:
    criticality: {}
`))
	if err != nil {
		t.Fatal(err)
	}
	c := set.Service("s").Criticality
	if c.Header != "x-prio" || c.Default != criticality.Sheddable || c.Max != criticality.SheddablePlus {
		t.Errorf("criticality = %+v", c)
	}
	if want := map[string]criticality.Tier{"/a.B/C": criticality.Critical, "_other": criticality.Sheddable}; !maps.Equal(c.Procedures, want) {
		t.Errorf("procedures %v, want %v", c.Procedures, want)
	}
	if got := c.Callers["web"]; got != (CallerTier{Max: criticality.CriticalPlus}) {
		t.Errorf("web = %+v", got)
	}
	if got := set.Service("s").DefaultTier("web", "/a.B/D"); got != criticality.Sheddable {
		t.Errorf("an undeclared procedure's tier %v, want the service's", got)
	}
	bare := set.Service("bare").Criticality
	if bare == nil || bare.Header != criticality.DefaultHeader || bare.Default != criticality.Critical || bare.Max != criticality.Critical ||
		bare.Procedures != nil || bare.Callers != nil {
		t.Errorf("criticality: {} = %+v, want the defaults", bare)
	}
}

func TestParseCriticalityWarnings(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  s:
    criticality: {default: CRITICAL_PLUS}
    callers: {web: {limit: 1, criticality: CRITICAL_PLUS, max_criticality: SHEDDABLE}}
`))
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Join(set.Warnings(), "\n")
	for _, want := range []string{
		"services.s.criticality.default: CRITICAL_PLUS is above max CRITICAL",
		"services.s.callers.web.criticality: CRITICAL_PLUS is above the caller's max SHEDDABLE",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("warnings do not contain %q:\n%s", want, w)
		}
	}
}

func TestParseCriticalityErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"bad tiers", `{services: {s: {criticality: {default: URGENT, max: none}, callers: {web: {limit: 1, criticality: high, max_criticality: "0"}}, procedures: {/a.B/C: {criticality: Critical}}}}}`,
			[]string{`services.s.criticality.default: criticality "URGENT" is not one of CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS, SHEDDABLE`,
				`services.s.criticality.max: criticality "none"`, `services.s.callers.web.criticality: criticality "high"`,
				`services.s.callers.web.max_criticality: criticality "0"`, `services.s.procedures./a.B/C.criticality: criticality "Critical"`}},
		{"bad source", `{services: {s: {criticality: {from: client-ip}}, t: {criticality: {from: "header a:b"}}, u: {criticality: {from: cookie x}}}}`,
			[]string{`services.s.criticality.from: source "client-ip": want "header <name>"`, "services.t.criticality.from: header name",
				`services.u.criticality.from: source "cookie x"`}},
		{"unknown field", `{services: {s: {criticality: {default: CRITICAL, header: x}}}}`,
			[]string{"services.s.criticality: line 1: field header not found"}},
		{"not a mapping", `{services: {s: {criticality: CRITICAL}}}`,
			[]string{"services.s.criticality: line 1: want a mapping, got a scalar"}},
		{"no tiers", `{services: {s: {callers: {web: {limit: 1, criticality: CRITICAL, max_criticality: CRITICAL}}, procedures: {/a.B/C: {criticality: SHEDDABLE}}}}}`,
			[]string{"services.s.callers.web.criticality: needs services.s.criticality", "services.s.callers.web.max_criticality: needs services.s.criticality",
				"services.s.procedures./a.B/C.criticality: needs services.s.criticality"}},
		{"upstream service", `{services: {s: {enforcement: upstream, criticality: {}}}}`,
			[]string{"services.s.enforcement: upstream: the service has criticality tiers"}},
		{"upstream caller", `{services: {s: {callers: {app: {limit: 1, enforcement: upstream}}, criticality: {}}}}`,
			[]string{"services.s.callers.app.enforcement: upstream: the service has criticality tiers"}},
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
}
