package limits

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
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
	if got := strings.Join(set.Services(), ","); got != "checkout" {
		t.Fatalf("services %s, want checkout", got)
	}
	co := set.Service("checkout")
	if co.Capacity != 1000 || co.DefaultLimit != 200 || co.Mode != dropratio.Enforce || co.FailMode != dataplane.FailOpen {
		t.Errorf("checkout = %+v", co)
	}
	for caller, want := range map[string]Bucket{
		"web":    {100, dropratio.Enforce, dataplane.EnforceSidecar},
		"batch":  {50, dropratio.Shadow, dataplane.EnforceSidecar},
		"abuser": {0, dropratio.Enforce, dataplane.EnforceSidecar},
		"app":    {80, dropratio.Enforce, dataplane.EnforceUpstream},
		"other":  {200, dropratio.Enforce, dataplane.EnforceSidecar}, // the default limit
		// Shipped defaults limit the reserved callers: no one sends
		// unlimited load by naming nobody, or a flood of names.
		"unknown":   {20, dropratio.Enforce, dataplane.EnforceSidecar},
		"_overflow": {20, dropratio.Enforce, dataplane.EnforceSidecar},
	} {
		if got := co.Bucket(caller); got != want {
			t.Errorf("checkout/%s = %+v, want %+v", caller, got, want)
		}
	}
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
