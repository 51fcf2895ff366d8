package testkit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// CheckPure fails t unless the Go package in the current directory is a
// pure law, as pkg/dropratio and pkg/adaptive are: standard library only
// (its own import path allowed, and in tests those of testSupport, test
// packages themselves held to the standard library), and in the non-test
// code nothing that reaches for a clock, a goroutine, I/O, a logger or
// randomness. Of package time only the Duration type and its constants
// may be named: time arrives as an argument.
func CheckPure(t *testing.T, self string, testSupport ...string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("glob: %v, %d files", err, len(files))
	}
	forbidden := map[string]bool{
		"os": true, "io": true, "io/fs": true, "bufio": true, "log": true, "log/slog": true,
		"net": true, "net/http": true, "sync": true, "sync/atomic": true, "unsafe": true,
		"math/rand": true, "math/rand/v2": true, "crypto/rand": true, "runtime": true,
		"reflect": true, "syscall": true, "os/exec": true,
	}
	timeNames := map[string]bool{"Duration": true, "Nanosecond": true, "Microsecond": true, "Millisecond": true, "Second": true, "Minute": true, "Hour": true}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		test := strings.HasSuffix(name, "_test.go")
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			support := test && (path == self || slices.Contains(testSupport, path))
			if strings.Contains(first, ".") && path != self && !support {
				t.Errorf("%s imports %s: only the standard library is allowed", name, path)
			}
			if !test && forbidden[path] {
				t.Errorf("%s imports %s: a pure law does no I/O, logging, concurrency or randomness", name, path)
			}
		}
		if test {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement at %v", name, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && !timeNames[n.Sel.Name] {
					t.Errorf("%s: time.%s at %v: time arrives as an argument", name, n.Sel.Name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}
