package configurator

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// Issue 14: web has a limit on checkout's create-charge leaf but none of
// its own, so it is in checkout's mode. shadow checkout/web rewrote the
// leaf's row, which no one reads, printed "shadow (1 limit)" and left web
// enforced. It now refuses, changing nothing, and says what to do; with a
// limit of its own, web's mode is that limit's, and only it switches.
func TestModeOfCallerWithoutLimit(t *testing.T) {
	h := newMemory(t)
	h.must("routes", "set", "checkout", "POST /v1/charges=create-charge", "--reason", "charges")
	h.must("set", "checkout/web/create-charge", "--limit", "50", "--reason", "r")
	leaf := history.Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}

	out, err := h.run("shadow", "checkout/web", "--reason", "watch")
	want := "checkout/web has no limit of its own; its leaves are enforced as it is: set a limit on checkout/web, or set the callee's mode (shadow checkout)"
	if err == nil || err.Error() != want {
		t.Errorf("shadow checkout/web: %q, %v; want the error %q", out, err, want)
	}
	if l := limitsOf(t, h.store)[leaf]; *l.Mode != dropratio.Enforce {
		t.Errorf("leaf mode %v, want enforce: nothing changes", *l.Mode)
	}

	h.must("set", "checkout/web", "--limit", "100", "--reason", "r")
	if out := h.must("shadow", "checkout/web", "--reason", "watch"); out != "checkout/web: shadow (1 limit)\n" {
		t.Errorf("shadow checkout/web: %q", out)
	}
	lim := limitsOf(t, h.store)
	if web := lim[history.Bucket{Callee: "checkout", Caller: "web"}]; *web.Mode != dropratio.Shadow || *lim[leaf].Mode != dropratio.Enforce {
		t.Errorf("modes: web %v, its leaf %v; want shadow and its row untouched", *web.Mode, *lim[leaf].Mode)
	}
	if out := h.must("audit", "--since", "1h"); strings.Count(out, "set_mode") != 1 {
		t.Errorf("audit: want one set_mode, of checkout/web:\n%s", out)
	}
}
