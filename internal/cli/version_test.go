package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/cobra"
)

func TestVersionFlag(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "v1.2.3", "0123456789abcdef0123"
	root := Versioned(&cobra.Command{Use: "controller", RunE: func(*cobra.Command, []string) error {
		t.Error("--version ran the command")
		return nil
	}})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "controller v1.2.3 (0123456789ab) go1.") {
		t.Errorf("--version printed %q", got)
	}
}

func TestBuildInfoDefaults(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "", ""
	// A test binary has no module version: the build is "devel".
	if b := BuildInfo(); b.Version != "devel" || !strings.HasPrefix(b.GoVersion, "go") {
		t.Errorf("BuildInfo() = %+v, want version devel", b)
	}
}

// TestStartRegistersBuildInfo: every binary's registry comes from Start, so
// every binary exports sluice_build_info.
func TestStartRegistersBuildInfo(t *testing.T) {
	defer func(v, r string) { version, revision = v, r }(version, revision)
	version, revision = "v9.9.9", "abc"
	var l Logging
	cmd := &cobra.Command{Use: "x"}
	l.AddFlags(cmd.Flags())
	_, reg, err := Start(cmd, "x", &l, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	want := `# HELP sluice_build_info Always 1; the labels say what this binary was built from.
# TYPE sluice_build_info gauge
sluice_build_info{goversion="` + BuildInfo().GoVersion + `",revision="abc",version="v9.9.9"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_build_info"); err != nil {
		t.Error(err)
	}
}
