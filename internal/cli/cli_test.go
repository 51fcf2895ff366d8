package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type testConfig struct {
	Tick  time.Duration
	Addrs []string
	Name  string
	Port  int
}

func newFlags(c *testConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.DurationVar(&c.Tick, "tick", time.Second, "")
	fs.StringSliceVar(&c.Addrs, "addrs", []string{"a:1"}, "")
	fs.StringVar(&c.Name, "name", "default", "")
	fs.IntVar(&c.Port, "port", 80, "")
	fs.String(ConfigFlag, "", "")
	return fs
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	os.WriteFile(file, []byte("tick: 3s\naddrs: [x:1, y:2]\nname: fromfile\nport: 81\n"), 0o644)

	var c testConfig
	fs := newFlags(&c)
	if err := fs.Parse([]string{"--config", file, "--name", "fromflag"}); err != nil {
		t.Fatal(err)
	}
	err := Apply(fs, "test", env(map[string]string{"SLUICE_TEST_PORT": "82", "SLUICE_TEST_NAME": "fromenv"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tick != 3*time.Second {
		t.Errorf("tick = %v, want 3s from the file", c.Tick)
	}
	if strings.Join(c.Addrs, ",") != "x:1,y:2" {
		t.Errorf("addrs = %v, want the file's list replacing the default", c.Addrs)
	}
	if c.Port != 82 {
		t.Errorf("port = %d, want 82 from the environment over the file", c.Port)
	}
	if c.Name != "fromflag" {
		t.Errorf("name = %q, want the flag over environment and file", c.Name)
	}
}

func TestDefaultsStandWithoutSources(t *testing.T) {
	var c testConfig
	fs := newFlags(&c)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "test", env(nil)); err != nil {
		t.Fatal(err)
	}
	if c.Tick != time.Second || c.Port != 80 || c.Name != "default" || len(c.Addrs) != 1 {
		t.Errorf("defaults changed: %+v", c)
	}
}

func TestEnvListReplacesDefault(t *testing.T) {
	var c testConfig
	fs := newFlags(&c)
	fs.Parse(nil)
	if err := Apply(fs, "test", env(map[string]string{"SLUICE_TEST_ADDRS": "p:1,q:2"})); err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Addrs, ",") != "p:1,q:2" {
		t.Errorf("addrs = %v", c.Addrs)
	}
}

func TestErrorsNameTheSource(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	os.WriteFile(file, []byte("tick: soon\nbogus: 1\n"), 0o644)
	var c testConfig
	fs := newFlags(&c)
	fs.Parse([]string{"--config", file})
	err := Apply(fs, "test", env(nil))
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{"tick", `unknown setting "bogus"`, file} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}

	fs = newFlags(&c)
	fs.Parse(nil)
	err = Apply(fs, "test", env(map[string]string{"SLUICE_TEST_PORT": "eighty"}))
	if err == nil || !strings.Contains(err.Error(), "SLUICE_TEST_PORT") {
		t.Errorf("bad env value: err = %v, want it to name SLUICE_TEST_PORT", err)
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	l := Logging{Level: "warn", Format: "json"}
	log, err := l.Logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	if strings.Contains(buf.String(), "hidden") || !strings.Contains(buf.String(), `"msg":"shown"`) {
		t.Errorf("log output = %q", buf.String())
	}
	for _, bad := range []Logging{{Level: "loud", Format: "text"}, {Level: "info", Format: "xml"}} {
		if _, err := bad.Logger(&buf); err == nil {
			t.Errorf("%+v: want an error", bad)
		}
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("controller", "policy-ttl"); got != "SLUICE_CONTROLLER_POLICY_TTL" {
		t.Errorf("EnvName = %q", got)
	}
}
