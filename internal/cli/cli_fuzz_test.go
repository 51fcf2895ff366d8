package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/internal/testkit"
)

// laughs is the billion laughs alias bomb as a config file: 9^levels
// strings once expanded, under a key that names a list flag.
func laughs(levels int) string {
	var b strings.Builder
	b.WriteString("x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i < levels; i++ {
		fmt.Fprintf(&b, "x%d: &x%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*x%d, ", i-1), 9), ", "))
	}
	fmt.Fprintf(&b, "addrs: *x%d\n", levels-1)
	return b.String()
}

// configSeeds are FuzzConfigFile's committed seeds.
func configSeeds() map[string]string {
	return map[string]string{
		"good":               "tick: 3s\naddrs: [x:1, y:2]\nname: fromfile\nport: 81\nratio: 0.5\nverbose: true\n",
		"good-empty":         "",
		"good-comma-list":    "addrs: x:1,y:2\n",
		"good-numbers":       "port: 0x50\nratio: .inf\ntick: 1h1m1s\n",
		"good-empty-list":    "addrs: []\nname: \"\"\n",
		"bad-null-value":     "name: ~\n",
		"bad-empty-value":    "addrs:\ntick: 1s\n",
		"bad-mapping-value":  "name: {a: 1}\n",
		"bad-unknown":        "tick: 1s\nnope: 1\n",
		"bad-config-itself":  "config: other.yaml\n",
		"bad-types":          "port: [1, 2]\ntick: forever\nratio: {a: 1}\nverbose: maybe\n",
		"bad-nested-list":    "addrs: [[a, b], {c: d}]\n",
		"bad-not-a-map":      "- tick\n- 1s\n",
		"bad-scalar":         "just a string\n",
		"bad-binary":         "\x00\x01\xfftick: 1s",
		"bad-duplicate":      "tick: 1s\ntick: 2s\n",
		"bad-laughs":         laughs(9),
		"bad-deep":           "addrs: " + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + "\n",
		"bad-anchor-cycle":   "addrs: &a [*a]\n",
		"bad-merge-of-lists": "a: &a [1]\nb:\n  <<: *a\n",
	}
}

func TestFuzzConfigFileCorpus(t *testing.T) {
	seeds := configSeeds()
	testkit.CheckCorpus(t, "FuzzConfigFile", testkit.FromMap(seeds, func(doc string) []any { return []any{[]byte(doc)} }))
	dir := t.TempDir()
	for name, doc := range seeds {
		err := applyFile(t, dir, []byte(doc))
		if good := strings.HasPrefix(name, "good"); good != (err == nil) {
			t.Errorf("seed %s: %v", name, err)
		}
	}
}

// fuzzFlags declares one flag of each kind the binaries use.
func fuzzFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("fuzz", pflag.ContinueOnError)
	fs.Duration("tick", time.Second, "")
	fs.StringSlice("addrs", []string{"a:1"}, "")
	fs.String("name", "default", "")
	fs.Int("port", 80, "")
	fs.Float64("ratio", 0.1, "")
	fs.Bool("verbose", false, "")
	fs.String(ConfigFlag, "", "")
	return fs
}

// applyFile writes data as the config file in dir and applies it to
// fuzzFlags.
func applyFile(t *testing.T, dir string, data []byte) error {
	t.Helper()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	fs := fuzzFlags()
	if err := fs.Parse([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	return Apply(fs, "fuzz", func(string) (string, bool) { return "", false })
}

// FuzzConfigFile applies any bytes as a --config file. Apply must never
// panic, and a file naming a setting the binary does not have must be an
// error naming it: a typo in a config file must not be ignored.
func FuzzConfigFile(f *testing.F) {
	dir := f.TempDir() // one file, rewritten by each input: no directory per input
	f.Fuzz(func(t *testing.T, data []byte) {
		err := applyFile(t, dir, data)
		values, perr := parseFile(data)
		if perr != nil {
			if err == nil {
				t.Fatalf("parseFile fails (%v), Apply does not", perr)
			}
			return
		}
		fs := fuzzFlags()
		for key := range values {
			if fs.Lookup(key) == nil || key == ConfigFlag {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", key)) {
					t.Fatalf("unknown setting %q: Apply says %v", key, err)
				}
			}
		}
	})
}

// TestConfigFileRefusesBombs: alias bombs and deep nesting in a config file
// fail after bounded work. The bound is on bytes allocated, not time.
func TestConfigFileRefusesBombs(t *testing.T) {
	const maxAlloc = 64 << 20
	for name, doc := range map[string]string{
		"laughs": laughs(9),
		"deep":   "addrs: " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "\n",
		"deep-2": "addrs: " + strings.Repeat("{a: ", 100000) + "x" + strings.Repeat("}", 100000) + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := parseFile([]byte(doc))
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Errorf("a %d-byte bomb parsed", len(doc))
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > maxAlloc {
				t.Errorf("parsing a %d-byte file allocated %d MB", len(doc), n>>20)
			}
			t.Logf("%d bytes: %.100v", len(doc), err)
		})
	}
}
