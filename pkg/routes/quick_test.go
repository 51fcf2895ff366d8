package routes

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/names"
)

// refMatch is Match written the obvious way, independently of the bitset matcher and
// of parse: route by route in order, the path and each template split with
// strings.Split.
func refMatch(routes []Route, method, path string) string {
	if !strings.HasPrefix(path, "/") {
		return names.Other
	}
	segs := strings.Split(path[1:], "/")
	for _, r := range routes {
		m, tmpl, found := strings.Cut(r.Pattern, " ")
		if !found {
			m, tmpl = "", r.Pattern
		}
		if m != "" && m != method {
			continue
		}
		if refSegments(strings.Split(tmpl[1:], "/"), segs) {
			return r.Procedure
		}
	}
	return names.Other
}

func refSegments(tmpl, segs []string) bool {
	switch {
	case len(tmpl) == 0:
		return len(segs) == 0
	case tmpl[0] == "*":
		return true
	case len(segs) == 0:
		return false
	case strings.HasPrefix(tmpl[0], "{"):
		return segs[0] != "" && refSegments(tmpl[1:], segs[1:])
	default:
		return tmpl[0] == segs[0] && refSegments(tmpl[1:], segs[1:])
	}
}

// randomPattern draws a template from a small alphabet, so that routes
// overlap, nest and shadow each other often.
func randomPattern(rng *rand.Rand) string {
	var b strings.Builder
	b.WriteString([]string{"", "GET ", "POST "}[rng.IntN(3)])
	n := rng.IntN(5)
	if n == 0 {
		b.WriteString("/")
	}
	for range n {
		s := []string{"a", "b", "{x}", "*"}[rng.IntN(4)]
		b.WriteString("/" + s)
		if s == "*" {
			break
		}
	}
	return b.String()
}

func randomRequest(rng *rand.Rand) (method, path string) {
	method = []string{"GET", "POST", "PUT"}[rng.IntN(3)]
	segs := make([]string, rng.IntN(6))
	for i := range segs {
		segs[i] = []string{"a", "b", "c", "", "ab", "ba"}[rng.IntN(6)]
	}
	path = "/" + strings.Join(segs, "/")
	if rng.IntN(20) == 0 {
		path = path[1:]
	}
	return method, path
}

// witness is the request covers' doc comment builds for a pattern: the
// request every earlier route that matches it shadows the pattern by the
// segment rule.
func witness(pattern string) (method, path string) {
	m, tmpl, found := strings.Cut(pattern, " ")
	if !found {
		m, tmpl = "WITNESS", pattern
	}
	var segs []string
	for _, s := range strings.Split(tmpl[1:], "/") {
		switch {
		case s == "*":
			segs = append(segs, make([]string, MaxSegments+1)...)
		case strings.HasPrefix(s, "{"):
			segs = append(segs, "zz")
		default:
			segs = append(segs, s)
		}
	}
	return m, "/" + strings.Join(segs, "/")
}

// checkIndex fails t unless MatchIndex names, in Procedures, the procedure
// Match returns: -1 for names.Other, else the index of that procedure.
func checkIndex(t testing.TB, r *Routes, method, path string) {
	t.Helper()
	want, i, procs := r.Match(method, path), r.MatchIndex(method, path), r.Procedures()
	switch {
	case want == names.Other && i != -1,
		want != names.Other && (i < 0 || i >= len(procs) || procs[i] != want):
		t.Fatalf("MatchIndex(%q, %q) = %d (Procedures %q), Match = %q", method, path, i, procs, want)
	}
}

// Match agrees with refMatch on random route lists and requests, and
// CompileRoutes refuses a route exactly when its witness request goes to
// an earlier route: shadowing as decided is shadowing as it happens.
func TestMatchAgreesWithReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 1))
	var refused, kept int
	for range 3000 {
		var routes []Route
		for i := range 12 {
			cand := Route{Pattern: randomPattern(rng), Procedure: fmt.Sprintf("p%d", i)}
			next := append(routes[:len(routes):len(routes)], cand)
			_, err := CompileRoutes(next)
			m, p := witness(cand.Pattern)
			first := refMatch(next, m, p)
			if err != nil {
				refused++
				if first == cand.Procedure || !strings.Contains(err.Error(), fmt.Sprintf("route %d ", len(routes))) {
					t.Fatalf("routes %v: %v; but the witness %s %s of the last goes to %s", next, err, m, p, first)
				}
				continue
			}
			if first != cand.Procedure {
				t.Fatalf("routes %v compiled, but the last is shadowed: its witness %s %s goes to %s", next, m, p, first)
			}
			kept++
			routes = next
		}
		r := mustCompile(t, routes...)
		for range 100 {
			m, p := randomRequest(rng)
			if got, want := r.Match(m, p), refMatch(routes, m, p); got != want {
				t.Fatalf("routes %v: Match(%q, %q) = %q, reference %q", routes, m, p, got, want)
			}
			checkIndex(t, r, m, p)
		}
	}
	t.Logf("%d routes kept, %d refused as shadowed", kept, refused)
}

// wide is a list of patterns, one a line, whose root has more literal
// children than match compares one by one.
func wide() string {
	var lines []string
	for i := range 2 * maxScan {
		lines = append(lines, fmt.Sprintf("/r%d/x", i), fmt.Sprintf("GET /r%d/{id}", i))
	}
	return strings.Join(append(lines, "/", "/{any}/x", "/r1x/*"), "\n")
}

// A node wider than maxScan is searched another way: it agrees with the
// reference too.
func TestMatchWideNode(t *testing.T) {
	var routes []Route
	for i, l := range strings.Split(wide(), "\n") {
		routes = append(routes, Route{Pattern: l, Procedure: fmt.Sprintf("p%d", i)})
	}
	r := mustCompile(t, routes...)
	for i := range 2*maxScan + 2 {
		for _, p := range []string{"/r%d/x", "/r%d/y", "/r%d", "/r%d/", "/r%dx/z", "/", "//", "/r%d/x/"} {
			for _, m := range []string{"GET", "POST"} {
				path := p
				if strings.Contains(p, "%d") {
					path = fmt.Sprintf(p, i)
				}
				if got, want := r.Match(m, path), refMatch(routes, m, path); got != want {
					t.Errorf("Match(%q, %q) = %q, reference %q", m, path, got, want)
				}
				checkIndex(t, r, m, path)
			}
		}
	}
}

// routesSeeds are FuzzRoutes' committed seeds.
func routesSeeds() []testkit.Seed {
	s := func(name, patterns, method, path string) testkit.Seed {
		return testkit.Seed{Name: name, Args: []any{patterns, method, path}}
	}
	api := make([]string, 0, 50)
	for _, r := range apiRoutes() {
		api = append(api, r.Pattern)
	}
	return []testkit.Seed{
		s("api-hit", strings.Join(api, "\n"), "GET", "/v1/accounts/acct_1/payouts/po_9"),
		s("api-miss", strings.Join(api, "\n"), "PATCH", "/v1/nothing/here"),
		s("first-wins", "GET /a/{x}/c\nGET /a/b/*", "GET", "/a/b/c"),
		s("shadowed", "/static/*\n/static/css/{f}", "GET", "/static/css/a.css"),
		s("root", "/\nGET /{x}", "GET", "/"),
		s("rest-empty", "/a/*", "GET", "/a//"),
		s("bad", "GET /a/{id\n/a//b\nget /x\n/a/*/b", "GET", "/a/1"),
		s("no-slash", "/a", "GET", "a"),
		s("wide", wide(), "GET", "/r17/x"),
	}
}

func TestFuzzRoutesCorpus(t *testing.T) { testkit.CheckCorpus(t, "FuzzRoutes", routesSeeds()) }

// FuzzRoutes compiles any list of patterns, one a line, and matches any
// request: CompileRoutes never panics and its error stays printable and
// bounded per route; a compiled list matches as refMatch does, and
// MatchIndex names the procedure Match returns.
func FuzzRoutes(f *testing.F) {
	f.Fuzz(func(t *testing.T, patterns, method, path string) {
		lines := strings.Split(patterns, "\n")
		if len(lines) > MaxRoutes+1 {
			return
		}
		routes := make([]Route, len(lines))
		for i, l := range lines {
			routes[i] = Route{Pattern: l, Procedure: fmt.Sprintf("p%d", i)}
		}
		r, err := CompileRoutes(routes)
		if err != nil {
			if msg := err.Error(); !utf8.ValidString(msg) && utf8.ValidString(patterns) || len(msg) > len(lines)*(2*4*64+256) {
				t.Fatalf("CompileRoutes: error of %d bytes: %q", len(msg), msg)
			}
			return
		}
		if got, want := r.Match(method, path), refMatch(routes, method, path); got != want {
			t.Fatalf("routes %q: Match(%q, %q) = %q, reference %q", patterns, method, path, got, want)
		}
		checkIndex(t, r, method, path)
	})
}

// Match agrees with refMatch on paths of every length, so that both of its
// walks run (MatchIndex's own loop for at most 64 routes and a path of 8 to
// 64 bytes, matchN otherwise), with segments longer than the 8 bytes a word
// holds, and on lists of more than 64 routes.
func TestMatchAgreesOnEveryLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 2))
	segs := []string{"a", "b", "", "ab", "abcdefgh", "abcdefghi", "abcdefgha", strings.Repeat("b", 40), "/"}
	for round := range 400 {
		var routes []Route
		if round%4 == 0 { // wide: more than 64 routes
			for i := range 70 {
				routes = append(routes, Route{Pattern: fmt.Sprintf("GET /r%d/{x}", i), Procedure: fmt.Sprintf("r%d", i)})
			}
		}
		for i := range 12 {
			var b strings.Builder
			b.WriteString([]string{"", "GET "}[rng.IntN(2)])
			for range 1 + rng.IntN(6) {
				s := []string{"a", "abcdefgh", "abcdefghi", "abcdefgha", "{x}", "*"}[rng.IntN(6)]
				b.WriteString("/" + s)
				if s == "*" {
					break
				}
			}
			next := append(routes[:len(routes):len(routes)], Route{Pattern: b.String(), Procedure: fmt.Sprintf("p%d", i)})
			if _, err := CompileRoutes(next); err == nil {
				routes = next
			}
		}
		r := mustCompile(t, routes...)
		for range 100 {
			var b strings.Builder
			for range rng.IntN(12) {
				b.WriteString("/" + segs[rng.IntN(len(segs))])
			}
			m, p := []string{"GET", "POST"}[rng.IntN(2)], b.String()
			if got, want := r.Match(m, p), refMatch(routes, m, p); got != want {
				t.Fatalf("routes %v: Match(%q, %q) = %q, reference %q", routes, m, p, got, want)
			}
			checkIndex(t, r, m, p)
		}
	}
}
