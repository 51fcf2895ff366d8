package adaptive

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The estimator must stay pure, as pkg/dropratio's law does: standard
// library only, and in the non-test code nothing that reaches for a clock,
// a goroutine, I/O or a logger.
func TestPurity(t *testing.T) {
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
	timeConsts := map[string]bool{"Duration": true, "Nanosecond": true, "Microsecond": true, "Millisecond": true, "Second": true, "Minute": true, "Hour": true}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		test := strings.HasSuffix(name, "_test.go")
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(path, "/")
			// Tests may also run against the modelled knee, itself
			// standard library only.
			testSupport := test && path == "github.com/sluicehq/sluice/internal/testkit/knee"
			if strings.Contains(first, ".") && !testSupport {
				t.Errorf("%s imports %s: only the standard library is allowed", name, path)
			}
			if !test && forbidden[path] {
				t.Errorf("%s imports %s: the estimator does no I/O, logging, concurrency or randomness", name, path)
			}
		}
		if test {
			continue
		}
		f, err = parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement at %v", name, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && !timeConsts[n.Sel.Name] {
					t.Errorf("%s: time.%s at %v: time arrives as an argument", name, n.Sel.Name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}
