package spiffe

import (
	"net/url"
	"testing"
)

func TestService(t *testing.T) {
	const td = "example.org"
	for _, tc := range []struct {
		id   string
		want string // "" for not a workload of td
	}{
		{"spiffe://example.org/ns/shop/sa/checkout", "checkout"},
		{"spiffe://example.org/sluice/service/web", "web"},
		{"spiffe://example.org/sluice/service/web/x", ""},
		{"spiffe://example.org/ns/shop/sa/checkout/x", ""},
		{"spiffe://example.org/ns/shop/x/sa/checkout", ""},
		{"spiffe://example.org/sluice/controller", ""},
		{"spiffe://example.org/sluice/aggregator/zone-a", ""},
		{"spiffe://other.org/ns/shop/sa/checkout", ""},
		{"spiffe://example.org:443/ns/shop/sa/checkout", ""},
		{"spiffe://user@example.org/ns/shop/sa/checkout", ""},
		{"spiffe://example.org/ns/shop/sa/check%20out", ""},
		{"spiffe://example.org/ns/shop/sa/checkout?x", ""},
		{"spiffe://example.org/ns//sa/checkout", ""},
		{"spiffe://example.org/sluice/service/_overflow", ""},
		{"spiffe://example.org/sluice/service/-web", ""},
		{"spiffe://Example.org/sluice/service/web", ""},
		{"https://example.org/sluice/service/web", ""},
		{"spiffe://example.org", ""},
		{"spiffe:///sluice/service/web", ""},
		{"", ""},
	} {
		got, ok := Service(tc.id, td)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Service(%q) = %q, %v; want %q", tc.id, got, ok, tc.want)
		}
		// A certificate's URI SAN says the same; a URL that does not
		// parse names nobody.
		u, err := url.Parse(tc.id)
		if err != nil {
			continue
		}
		if got, ok := ServiceOfURL(u, td); got != tc.want || ok != (tc.want != "") {
			t.Errorf("ServiceOfURL(%q) = %q, %v; want %q", tc.id, got, ok, tc.want)
		}
	}
}

func TestServiceAllocatesNothing(t *testing.T) {
	ids := []string{"spiffe://example.org/ns/shop/sa/checkout", "spiffe://example.org/sluice/service/-bad", "garbage"}
	if n := testing.AllocsPerRun(100, func() {
		for _, id := range ids {
			Service(id, "example.org")
		}
	}); n != 0 {
		t.Errorf("Service allocates %v times per run, want 0", n)
	}
}
