package limits

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
)

const withDescriptors = `services:
  api:
    callers: {web: {limit: 100}}
    descriptors:
      tenant:
        from: header X-Tenant-ID
        limit: 50
        missing: 10
        quantile: 0.99
        overrides: {acme: 500, blocked: 0}
      ip: {from: xff 2, limit: 0}
      conn: {from: client-ip, limit: 7.5}
`

func TestParseDescriptors(t *testing.T) {
	set, err := Parse(strings.NewReader(withDescriptors))
	if err != nil {
		t.Fatal(err)
	}
	ds := set.Service("api").Descriptors
	want := []Descriptor{
		{Name: "conn", Source: descriptor.Source{Kind: descriptor.ClientIP}, Limit: 7.5, Missing: 7.5, Quantile: allowance.DefaultQuantile},
		{Name: "ip", Source: descriptor.Source{Kind: descriptor.ForwardedFor, Hops: 2}, Limit: 0, Missing: 0, Quantile: allowance.DefaultQuantile},
		{Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"}, Limit: 50, Missing: 10, Quantile: 0.99,
			Overrides: map[string]float64{"acme": 500, "blocked": 0}},
	}
	if len(ds) != len(want) {
		t.Fatalf("descriptors %+v, want %+v", ds, want)
	}
	for i, d := range ds {
		w := want[i]
		if d.Name != w.Name || d.Source != w.Source || d.Limit != w.Limit || d.Missing != w.Missing || d.Quantile != w.Quantile ||
			!maps.Equal(d.Overrides, w.Overrides) {
			t.Errorf("descriptor %d = %+v, want %+v", i, d, w)
		}
	}
	if w := set.Warnings(); len(w) != 0 {
		t.Errorf("warnings %q", w)
	}
}

func TestParseDescriptorErrors(t *testing.T) {
	five := "services:\n  s:\n    descriptors:\n"
	for i := range descriptor.MaxPerService + 1 {
		five += fmt.Sprintf("      d%d: {from: client-ip, limit: 1}\n", i)
	}
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"too many", five, []string{"services.s.descriptors: 5 descriptors, at most 4"}},
		{"bad name", `{services: {s: {descriptors: {Tenant: {from: client-ip, limit: 1}, "a-b": {from: client-ip, limit: 1}}}}}`,
			[]string{"services.s.descriptors.Tenant: invalid descriptor name", "services.s.descriptors.a-b: invalid descriptor name"}},
		{"missing fields", `{services: {s: {descriptors: {t: {}}}}}`,
			[]string{"services.s.descriptors.t.from: missing", "services.s.descriptors.t.limit: missing"}},
		{"bad source", `{services: {s: {descriptors: {t: {from: cookie x, limit: 1}, u: {from: xff 0, limit: 1}, v: {from: "header a:b", limit: 1}}}}}`,
			[]string{"services.s.descriptors.t.from: source \"cookie x\"", "services.s.descriptors.u.from: xff hops", "services.s.descriptors.v.from: header name"}},
		{"bad rates", `{services: {s: {descriptors: {t: {from: client-ip, limit: .inf, missing: -1}, u: {from: client-ip, limit: .nan}}}}}`,
			[]string{"services.s.descriptors.t.limit: +Inf is not a finite rate", "services.s.descriptors.t.missing: -1 is not a finite rate",
				"services.s.descriptors.u.limit: NaN is not a finite rate"}},
		{"bad quantile", `{services: {s: {descriptors: {t: {from: client-ip, limit: 1, quantile: 1}, u: {from: client-ip, limit: 1, quantile: .nan}}}}}`,
			[]string{"services.s.descriptors.t.quantile: quantile 1 is outside (0, 1)", "services.s.descriptors.u.quantile: quantile NaN"}},
		{"quantile not a number", `{services: {s: {descriptors: {v: {from: client-ip, limit: 1, quantile: x}}}}}`,
			[]string{`services.s.descriptors.v.quantile: line 1: "x" is not a number`}},
		{"bad overrides", `{services: {s: {descriptors: {t: {from: client-ip, limit: 1, overrides: {_missing: 3, _invalid: 1, "": 1, ok: -2, none: ~}}}}}}`,
			[]string{"services.s.descriptors.t.overrides._missing: the limit of requests without the attribute is the descriptor's missing",
				`services.s.descriptors.t.overrides._invalid: value "_invalid" is reserved`, "services.s.descriptors.t.overrides.: empty value",
				"services.s.descriptors.t.overrides.ok: -2 is not a finite rate", "services.s.descriptors.t.overrides.none: missing limit"}},
		{"long override", fmt.Sprintf(`{services: {s: {descriptors: {t: {from: client-ip, limit: 1, overrides: {%s: 1}}}}}}`, strings.Repeat("v", descriptor.MaxValueLen+1)),
			[]string{"is longer than 256"}},
		{"unknown field", `{services: {s: {descriptors: {t: {from: client-ip, limit: 1, limits: 2}}}}}`,
			[]string{"services.s.descriptors.t: line 1: field limits not found"}},
		{"not a mapping", `{services: {s: {descriptors: [t]}}}`, []string{"services.s.descriptors: line 1: want a mapping, got a sequence"}},
		{"upstream service", `{services: {s: {enforcement: upstream, descriptors: {t: {from: client-ip, limit: 1}}}}}`,
			[]string{"services.s.enforcement: upstream: the service has descriptors"}},
		{"upstream caller", `{services: {s: {callers: {app: {limit: 1, enforcement: upstream}}, descriptors: {t: {from: client-ip, limit: 1}}}}}`,
			[]string{"services.s.callers.app.enforcement: upstream: the service has descriptors"}},
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

// The reserved callers name their own enforcement, sidecar, so a service
// with descriptors and a default of sidecar parses with them listed.
func TestParseDescriptorsReservedCallers(t *testing.T) {
	set, err := Parse(strings.NewReader(`{services: {s: {callers: {unknown: {limit: 1}, web: {limit: 2, enforcement: sidecar}}, descriptors: {t: {from: client-ip, limit: 1}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if e := set.Service("s").Bucket("unknown").Enforcement; e != dataplane.EnforceSidecar {
		t.Errorf("unknown's enforcement %v", e)
	}
}
