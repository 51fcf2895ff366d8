package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pkg is the part of `go list -json` the rules need.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string // direct imports, resolved (vendor and ImportMap applied)
	Module     *struct {
		Path string
		Main bool
	}
	Error *struct{ Err string }
}

// graph is the import graph of every package of the main module and its
// dependencies, for the host's build configuration, test files excluded.
type graph struct {
	root   string          // module root directory
	module string          // module path
	pkgs   map[string]*pkg // by import path
	own    []string        // the main module's packages, sorted
}

// load runs `go list -deps` once for the whole module.
func load(t *testing.T) *graph {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", stderr(err))
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		t.Fatalf("go env GOMOD = %q: not inside a module", gomod)
	}
	g := &graph{root: filepath.Dir(gomod), pkgs: map[string]*pkg{}}

	// -e: a package that does not build (another test's problem) is listed
	// with an Error instead of failing the whole listing; its imports are
	// still known as long as its import blocks parse.
	cmd := exec.CommandContext(t.Context(), "go", "list", "-e", "-deps",
		"-json=ImportPath,Standard,Imports,Module,Error", "./...")
	cmd.Dir = g.root
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v", g.root, stderr(err))
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(pkg)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		g.pkgs[p.ImportPath] = p
		if p.Module != nil && p.Module.Main {
			if g.module != "" && g.module != p.Module.Path {
				t.Fatalf("two main modules, %s and %s: run in one module, not a workspace", g.module, p.Module.Path)
			}
			g.module = p.Module.Path
			g.own = append(g.own, p.ImportPath)
		}
		if p.Error != nil {
			t.Logf("go list: %s: %s (its imports are checked as far as they are known)", p.ImportPath, p.Error.Err)
		}
	}
	if g.module == "" || len(g.own) < 5 {
		t.Fatalf("go list found %d packages of the main module %q; expected the whole module", len(g.own), g.module)
	}
	slices.Sort(g.own)
	return g
}

func stderr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return errors.Join(err, errors.New(strings.TrimSpace(string(ee.Stderr))))
	}
	return err
}

// rel returns path relative to the module ("sidecar/proxy"), and whether it
// is in the module at all.
func (g *graph) rel(path string) (string, bool) {
	if path == g.module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, g.module+"/")
	return r, ok
}

// standard reports whether path is in the standard library. A path go list
// could not resolve has no entry; it is standard only if its first element
// has no dot, the standard library's naming rule.
func (g *graph) standard(path string) bool {
	if p := g.pkgs[path]; p != nil {
		return p.Standard
	}
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// under reports whether path is prefix or below it, on path boundaries.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// rule is one constraint on imports: no package it applies to may reach a
// forbidden package, directly or through others, except through an allowed
// package, whose own dependencies are not the rule's business.
type rule struct {
	name      string
	applies   func(rel string) bool // module-relative path of a subject package
	forbidden func(path string) bool
	allowed   func(path string) bool // may be nil
	// optional: the rule is skipped, with a log line, when this directory
	// (module-relative) does not exist yet.
	optional string
}

// violations returns, for subject, one import chain to each forbidden
// package it reaches: the shortest, found breadth first over Imports. The
// search stops at forbidden packages (what they import is beside the
// point), allowed ones and the standard library (which imports nothing
// outside itself).
func (g *graph) violations(r rule, subject string) [][]string {
	parent := map[string]string{subject: ""}
	queue := []string{subject}
	var found [][]string
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		p := g.pkgs[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := parent[imp]; seen || imp == "C" {
				continue
			}
			parent[imp] = cur
			switch {
			case r.forbidden(imp):
				var chain []string
				for at := imp; at != ""; at = parent[at] {
					chain = append(chain, at)
				}
				slices.Reverse(chain)
				found = append(found, chain)
			case g.standard(imp), r.allowed != nil && r.allowed(imp):
			default:
				queue = append(queue, imp)
			}
		}
	}
	return found
}

func TestDependencyDirection(t *testing.T) {
	g := load(t)
	mod := func(rel string) string { return g.module + "/" + rel }
	isPgx := func(path string) bool { return under(path, "github.com/jackc/pgx") } // v4, v5, any later
	isGRPC := func(path string) bool { return under(path, "google.golang.org/grpc") }
	isProtobuf := func(path string) bool { return under(path, "google.golang.org/protobuf") }

	rules := []rule{{
		name:    "pkg/dropratio imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/dropratio") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/dropratio"))
		},
	}, {
		// The controller's capacity estimator, a pure law like the one
		// it feeds.
		name:    "pkg/adaptive imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/adaptive") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/adaptive"))
		},
	}, {
		// Every tier, the data plane and pkg/history included, uses its
		// types.
		name:    "pkg/dataplane imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/dataplane") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/dataplane"))
		},
	}, {
		// Aggregators, sidecars and controllers compute a callee's owner
		// alike; the sidecar library imports it.
		name:    "pkg/shard imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/shard") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/shard"))
		},
	}, {
		// Sized on the request path's side (the sidecar) and the
		// controller's: the Poisson allowance stays pure arithmetic.
		name:    "pkg/allowance imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/allowance") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/allowance"))
		},
	}, {
		// Limits files, the controller, the sidecar and the simulator
		// share its vocabulary of descriptors.
		name:    "pkg/descriptor imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/descriptor") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/descriptor"))
		},
	}, {
		// The sidecar counts descriptor values with it on the request
		// path; the simulator runs it too.
		name:    "pkg/heavy imports only the standard library and pkg/wyhash",
		applies: func(rel string) bool { return under(rel, "pkg/heavy") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/heavy")) && !under(path, mod("pkg/wyhash"))
		},
	}, {
		// The sidecar's tables and pkg/heavy hash with it on the request
		// path.
		name:    "pkg/wyhash imports only the standard library",
		applies: func(rel string) bool { return under(rel, "pkg/wyhash") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/wyhash"))
		},
	}, {
		// The controller checks a limits file's routes with the code the
		// sidecar matches with: it must stay light enough for both.
		name:    "pkg/routes imports only the standard library and pkg/names",
		applies: func(rel string) bool { return under(rel, "pkg/routes") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("pkg/routes")) && !under(path, mod("pkg/names"))
		},
	}, {
		// Test support: pkg/dropratio's and pkg/adaptive's tests, held
		// to the standard library, may use internal/testkit; e2e's and live mode's child
		// processes are only os/exec and HTTP.
		name:    "internal/testkit and internal/child import only the standard library",
		applies: func(rel string) bool { return under(rel, "internal/testkit") || under(rel, "internal/child") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !under(path, mod("internal/testkit")) && !under(path, mod("internal/child"))
		},
	}, {
		name:    "api imports only the standard library, protobuf and gRPC",
		applies: func(rel string) bool { return under(rel, "api") },
		forbidden: func(path string) bool {
			return !g.standard(path) && !isProtobuf(path) && !isGRPC(path) && !under(path, mod("api"))
		},
		allowed: func(path string) bool { return isProtobuf(path) || isGRPC(path) },
	}, {
		name:    "sidecar never imports pgx or the control-plane services",
		applies: func(rel string) bool { return under(rel, "sidecar") },
		forbidden: func(path string) bool {
			return isPgx(path) || under(path, mod("internal/controller")) ||
				under(path, mod("internal/aggregator")) || under(path, mod("internal/limits"))
		},
	}, {
		name:      "pkg and internal never import cmd",
		applies:   func(rel string) bool { return under(rel, "pkg") || under(rel, "internal") },
		forbidden: func(path string) bool { return under(path, mod("cmd")) },
	}, {
		name:      "nothing imports e2e",
		applies:   func(rel string) bool { return !under(rel, "e2e") },
		forbidden: func(path string) bool { return under(path, mod("e2e")) },
	}, {
		name:      "pkg/history never imports gRPC or api",
		applies:   func(rel string) bool { return under(rel, "pkg/history") },
		forbidden: func(path string) bool { return isGRPC(path) || under(path, mod("api")) },
		optional:  "pkg/history",
	}, {
		// The data plane, the control plane and the tools stay free of the
		// Kubernetes client libraries: only the injector speaks Kubernetes,
		// and only the image tool builds images.
		name: "Kubernetes and image libraries only in the injector and the image tool",
		applies: func(rel string) bool {
			return !under(rel, "internal/webhook") &&
				!under(rel, "cmd/injector") && !under(rel, "internal/tools/ocibuild")
		},
		forbidden: func(path string) bool {
			return under(path, "k8s.io") || under(path, "sigs.k8s.io") ||
				under(path, "github.com/google/go-containerregistry") ||
				under(path, "github.com/prometheus-operator/prometheus-operator") ||
				under(path, "github.com/prometheus/prometheus")
		},
	}, {
		name:      "controller and aggregator never import the sidecar binary's packages",
		applies:   func(rel string) bool { return under(rel, "internal/controller") || under(rel, "internal/aggregator") },
		forbidden: func(path string) bool { return under(path, mod("internal/agent")) },
	}, {
		// What an application may import, the sidecar library and pkg/,
		// stands alone: a doc comment there never names a type its reader
		// cannot import.
		name:      "importable code (pkg/, sidecar/) never imports internal/",
		applies:   func(rel string) bool { return under(rel, "pkg") || under(rel, "sidecar") },
		forbidden: func(path string) bool { return under(path, mod("internal")) },
	}}

	for _, r := range rules {
		if r.optional != "" {
			if _, err := os.Stat(filepath.Join(g.root, filepath.FromSlash(r.optional))); errors.Is(err, os.ErrNotExist) {
				t.Logf("%s: skipped, %s does not exist yet", r.name, r.optional)
				continue
			} else if err != nil {
				t.Fatal(err)
			}
		}
		var subjects int
		for _, path := range g.own {
			rel, _ := g.rel(path)
			if !r.applies(rel) {
				continue
			}
			subjects++
			if chains := g.violations(r, path); len(chains) > 0 {
				var b strings.Builder
				for _, chain := range chains {
					b.WriteString("\n\t" + strings.Join(chain, " -> "))
				}
				t.Errorf("%s: %s reaches %d forbidden package(s):%s", r.name, path, len(chains), b.String())
			}
		}
		switch {
		case subjects > 0:
		case r.optional != "":
			t.Logf("%s: %s exists but holds no Go package yet; nothing to check", r.name, r.optional)
		default:
			// A rule over nothing can not fail: the tree moved under it.
			t.Errorf("%s: applies to no package of %s; update the rule", r.name, g.module)
		}
	}
}

// TestViolationsNamesTheChain runs the search on a made-up graph, so that
// a rule that can not find a violation, or names it wrongly, is caught
// without breaking the real tree.
func TestViolationsNamesTheChain(t *testing.T) {
	g := &graph{module: "example.com/m", pkgs: map[string]*pkg{}}
	add := func(path string, std bool, imports ...string) {
		g.pkgs[path] = &pkg{ImportPath: path, Standard: std, Imports: imports}
	}
	add("example.com/m/sidecar", false, "fmt", "example.com/m/sidecar/store", "example.com/m/sidecar/proxy")
	add("example.com/m/sidecar/proxy", false, "net/http")
	add("example.com/m/sidecar/store", false, "example.com/m/internal/db", "example.com/lib")
	add("example.com/m/internal/db", false, "github.com/jackc/pgx/v5/pgxpool")
	add("example.com/lib", false, "github.com/jackc/pgx/v5") // hidden behind an allowed package below
	add("github.com/jackc/pgx/v5/pgxpool", false, "github.com/jackc/pgx/v5")
	add("github.com/jackc/pgx/v5", false, "net")
	add("fmt", true)
	add("net/http", true, "net")
	add("net", true)

	pgx := func(path string) bool { return under(path, "github.com/jackc/pgx") }
	got := g.violations(rule{forbidden: pgx}, "example.com/m/sidecar")
	want := [][]string{
		{"example.com/m/sidecar", "example.com/m/sidecar/store", "example.com/lib", "github.com/jackc/pgx/v5"},
		{"example.com/m/sidecar", "example.com/m/sidecar/store", "example.com/m/internal/db", "github.com/jackc/pgx/v5/pgxpool"},
	}
	slices.SortFunc(got, slices.Compare)
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("violations:\n got %q\nwant %q", got, want)
	}

	allowLib := rule{forbidden: pgx, allowed: func(path string) bool { return path == "example.com/lib" }}
	got = g.violations(allowLib, "example.com/m/sidecar")
	if len(got) != 1 || got[0][len(got[0])-1] != "github.com/jackc/pgx/v5/pgxpool" {
		t.Errorf("with example.com/lib allowed: %q, want only the chain to pgxpool", got)
	}

	if got := g.violations(rule{forbidden: pgx}, "example.com/m/sidecar/proxy"); len(got) != 0 {
		t.Errorf("sidecar/proxy: %q, want nothing", got)
	}
}
