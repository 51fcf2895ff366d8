package configurator

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/dataplane"
)

// --enforcement sets a bucket's or a callee's; the output and the store
// show it; bad values and missing values are errors naming the flag.
func TestSetEnforcement(t *testing.T) {
	h := newMemory(t)
	out := h.must("set", "checkout", "--enforcement", "upstream", "--reason", "behind Envoy")
	if out != "checkout: default limit none, capacity none, enforce, fail mode open, enforced upstream\n" {
		t.Errorf("set callee: %q", out)
	}
	// A new bucket takes the callee's; the reserved unknown does not.
	if out := h.must("set", "checkout/web", "--limit", "100", "--reason", "r"); out != "checkout/web: limit 100 rps, enforce, manual, enforced upstream (new)\n" {
		t.Errorf("set bucket under an upstream callee: %q", out)
	}
	if out := h.must("set", "checkout/unknown", "--limit", "5", "--reason", "r"); out != "checkout/unknown: limit 5 rps, enforce, manual (new)\n" {
		t.Errorf("set unknown under an upstream callee: %q", out)
	}
	out = h.must("set", "checkout/web", "--limit", "100", "--enforcement", "sidecar", "--reason", "r")
	if out != "checkout/web: limit 100 rps, enforce, manual\n  was limit 100 rps, enforce, manual, enforced upstream\n" {
		t.Errorf("set bucket back to sidecar: %q", out)
	}
	h.must("set", "checkout/web", "--limit", "200", "--reason", "kept")
	if l := limitsOf(t, h.store)[web]; *l.Enforcement != dataplane.EnforceSidecar || l.Limit != 200 {
		t.Errorf("checkout/web after a set without --enforcement: %+v, want sidecar kept", l)
	}
	h.must("set", "checkout", "--capacity", "1000", "--reason", "kept")
	if lim, _ := h.store.Limits(t.Context()); *lim.Services[0].Enforcement != dataplane.EnforceUpstream {
		t.Errorf("callee after a set without --enforcement: %+v, want upstream kept", lim.Services[0])
	}
	if out := h.must("audit", "--since", "1h"); !strings.Contains(out, "enforced upstream") {
		t.Errorf("audit does not show the enforcement:\n%s", out)
	}
	for _, args := range [][]string{
		{"set", "checkout/web", "--limit", "1", "--enforcement", "envoy", "--reason", "r"},
		{"set", "checkout", "--enforcement", "proxyless", "--reason", "r"},
	} {
		if _, err := h.run(args...); err == nil || !strings.Contains(err.Error(), "--enforcement") || !strings.Contains(err.Error(), "is not sidecar or upstream") {
			t.Errorf("configurator %s: %v, want an error naming --enforcement", strings.Join(args, " "), err)
		}
	}
}
