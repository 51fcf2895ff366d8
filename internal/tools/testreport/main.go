// Command testreport turns `go test -json` into what a person watching
// `make test` needs: a line per package as it ends, a line per test that
// took a while (so that a long package such as e2e shows progress), the
// whole output of every failed test and package, the skipped tests by
// name, and at the end one line of counts. It exits 1 if anything failed.
//
//	go test -json ./... 2>&1 | go run ./internal/tools/testreport [-slow 5s] [-counts FILE]
//
// Lines that are not JSON (the go command's own errors) are printed as they
// come.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
}

type key struct{ pkg, test string }

type report struct {
	w    io.Writer
	slow time.Duration

	out     map[key][]string // output of tests and packages still running
	passed  int
	failed  []string // "pkg TestName"
	skipped []string
	pkgFail []string
}

func main() {
	slow := flag.Duration("slow", 5*time.Second, "print a line for every test that takes at least this long")
	counts := flag.String("counts", "", "append \"passed failed skipped\" to this file at the end")
	flag.Parse()
	r := &report{w: os.Stdout, slow: *slow, out: map[key][]string{}}
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(2)
	}
	r.summary()
	if *counts != "" {
		f, err := os.OpenFile(*counts, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, "%d %d %d\n", r.passed, len(r.failed), len(r.skipped))
			err = f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(2)
		}
	}
	if len(r.failed) > 0 || len(r.pkgFail) > 0 {
		os.Exit(1)
	}
}

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(r.w, string(line))
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func (r *report) handle(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.w, e.Output)
	case "output":
		r.out[k] = append(r.out[k], e.Output)
	case "pass":
		if e.Test == "" {
			fmt.Fprintf(r.w, "ok    %-55s %6.1fs\n", e.Package, e.Elapsed)
		} else {
			r.passed++
			if !strings.Contains(e.Test, "/") && e.Elapsed >= r.slow.Seconds() {
				fmt.Fprintf(r.w, "      %-55s %6.1fs\n", e.Package+" "+e.Test, e.Elapsed)
			}
		}
		delete(r.out, k)
	case "skip":
		if e.Test == "" {
			if len(r.out[k]) > 0 && strings.Contains(strings.Join(r.out[k], ""), "no test files") {
				delete(r.out, k)
				return
			}
			fmt.Fprintf(r.w, "skip  %s\n", e.Package)
		} else {
			r.skipped = append(r.skipped, e.Package+" "+e.Test+": "+skipReason(r.out[k]))
		}
		delete(r.out, k)
	case "fail":
		if e.Test == "" {
			r.pkgFail = append(r.pkgFail, e.Package)
			// What the package printed outside its tests (a panic, a
			// TestMain error, a build failure), and the output of tests
			// that never ended.
			for _, t := range r.unfinished(e.Package) {
				fmt.Fprintf(r.w, "--- unfinished: %s %s\n", e.Package, t)
				fmt.Fprint(r.w, strings.Join(r.out[key{e.Package, t}], ""))
				delete(r.out, key{e.Package, t})
			}
			fmt.Fprint(r.w, strings.Join(r.out[k], ""))
			fmt.Fprintf(r.w, "FAIL  %-55s %6.1fs\n", e.Package, e.Elapsed)
		} else {
			r.failed = append(r.failed, e.Package+" "+e.Test)
			if !strings.Contains(e.Test, "/") {
				// A test's output holds its subtests': printed once, here.
				fmt.Fprint(r.w, strings.Join(r.out[k], ""))
				for t := range r.out {
					if t.pkg == e.Package && strings.HasPrefix(t.test, e.Test+"/") {
						fmt.Fprint(r.w, strings.Join(r.out[t], ""))
						delete(r.out, t)
					}
				}
			}
		}
		if e.Test == "" || !strings.Contains(e.Test, "/") {
			delete(r.out, k)
		}
	}
}

// unfinished lists the tests of pkg whose output is held: they neither
// passed nor failed before the package ended (a panic, a timeout).
func (r *report) unfinished(pkg string) []string {
	var ts []string
	for k := range r.out {
		if k.pkg == pkg && k.test != "" {
			ts = append(ts, k.test)
		}
	}
	sort.Strings(ts)
	return ts
}

// skipReason is the last line a skipped test logged: its t.Skip message.
func skipReason(out []string) string {
	for i := len(out) - 1; i >= 0; i-- {
		s := strings.TrimSpace(out[i])
		if s != "" && !strings.HasPrefix(s, "--- SKIP") && !strings.HasPrefix(s, "=== ") {
			return s
		}
	}
	return "no reason given"
}

func (r *report) summary() {
	if len(r.skipped) > 0 {
		fmt.Fprintf(r.w, "\nskipped tests:\n")
		for _, s := range r.skipped {
			fmt.Fprintf(r.w, "  %s\n", s)
		}
	}
	if len(r.failed) > 0 || len(r.pkgFail) > 0 {
		fmt.Fprintf(r.w, "\nFAILED:\n")
		for _, f := range r.failed {
			fmt.Fprintf(r.w, "  %s\n", f)
		}
		for _, p := range r.pkgFail {
			fmt.Fprintf(r.w, "  package %s\n", p)
		}
	}
	fmt.Fprintf(r.w, "tests: %d passed, %d failed, %d skipped\n", r.passed, len(r.failed), len(r.skipped))
}
