// Package testkit is what sluice's tests share: a fuzz target's seed
// corpus kept in step with its declaration (CheckCorpus), and waiting for a
// condition with a deadline (WaitFor). It imports only the standard
// library, so that pkg/dropratio's tests may use it too.
package testkit

// A fuzz target's committed seed corpus, testdata/fuzz/<target>/<seed>, is
// kept in step with the seeds its test declares in Go: `go test` runs every
// file there as a seed of the target, and the declaration says in Go what
// the files say in the fuzzer's encoding.

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update-corpus", false, "rewrite the seed corpora under testdata/fuzz from the seeds in the fuzz tests")

// Seed is one named input of a fuzz target: the arguments of its fuzz
// function, each a []byte, string, uint64, int64, uint8 or float64.
type Seed struct {
	Name string
	Args []any
}

// CheckCorpus checks that testdata/fuzz/<target> holds each seed as the
// fuzzer would have written it: with -update-corpus it writes them, else a
// missing or stale file fails the test. Files the fuzzer added (crashers)
// are left alone. Floats are written as their bits, so NaN, infinities and
// -0 survive.
func CheckCorpus(t testing.TB, target string, seeds []Seed) {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	for _, s := range seeds {
		content, err := Encode(s.Args...)
		if err != nil {
			t.Fatalf("seed %s: %v", s.Name, err)
		}
		path := filepath.Join(dir, s.Name)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != content {
			t.Errorf("%s is missing or stale; in this package's directory run: go test . -run '^%s$' -update-corpus", path, t.Name())
		}
	}
}

// Encode renders args in the fuzzer's corpus encoding ("go test fuzz v1").
func Encode(args ...any) (string, error) {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case uint64:
			fmt.Fprintf(&b, "uint64(%d)\n", v)
		case int64:
			fmt.Fprintf(&b, "int64(%d)\n", v)
		case uint8:
			fmt.Fprintf(&b, "byte(%d)\n", v)
		case float64:
			fmt.Fprintf(&b, "math.Float64frombits(0x%x)\n", math.Float64bits(v))
		default:
			return "", fmt.Errorf("an argument of type %T", a)
		}
	}
	return b.String(), nil
}

// FromMap turns seeds kept as a map of name to value into Seeds, args
// giving each value's fuzz arguments.
func FromMap[V any](m map[string]V, args func(V) []any) []Seed {
	seeds := make([]Seed, 0, len(m))
	for name, v := range m {
		seeds = append(seeds, Seed{Name: name, Args: args(v)})
	}
	return seeds
}
