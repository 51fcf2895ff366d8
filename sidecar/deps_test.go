package sidecar

import (
	"os/exec"
	"strings"
	"testing"
)

func TestNoPgx(t *testing.T) {
	// sidecar/ runs in every pod; it must never pull in the database driver
	// (DESIGN.md, STYLE.md).
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %q; expected the package's dependencies", out)
	}
	for _, dep := range deps {
		if strings.Contains(dep, "jackc/pgx") {
			t.Errorf("sidecar depends on %s", dep)
		}
	}
}
