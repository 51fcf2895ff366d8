// Package routes turns a request into its procedure, what the request does
// at its callee: the third part of a bucket key (issue #14).
//
// For HTTP a callee declares routes in order, "[METHOD ]PATH-TEMPLATE" →
// procedure. CompileRoutes checks them once per policy and builds a
// matcher; Match, on the request path, returns the procedure of the first
// route in declaration order that matches, or names.Other when none does.
// For gRPC the procedure is the full method (GRPCProcedure). Both end in
// names.ValidProcedure, the one rule for what a procedure name is.
//
// The package imports only the standard library and pkg/names, so the
// controller can check a limits file's routes with the code the sidecar
// matches with.
package routes

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/pkg/names"
)

// Bounds on what one callee's policy may declare. Together they bound a
// compiled Routes: at most (MaxMethods+1) tries of at most
// MaxRoutes×MaxSegments nodes, about 140,000 nodes, a few MB, for the most
// hostile policy; a real API's few dozen routes share prefixes and take a
// few KB.
const (
	// MaxRoutes bounds the routes of one callee.
	MaxRoutes = 256
	// MaxPatternLen bounds a route's pattern, method included, in bytes.
	MaxPatternLen = 256
	// MaxSegments bounds the segments of a path template.
	MaxSegments = 32
	// MaxMethodLen bounds a route's method; MaxMethods the distinct
	// methods one callee's routes name (HTTP defines nine).
	MaxMethodLen = 16
	MaxMethods   = 16
)

// A Route gives the requests that match Pattern the name Procedure.
//
// Pattern is "[METHOD ]PATH-TEMPLATE": an optional method (upper-case
// letters and '-': "GET", "POST"; without one the route matches every
// method; "GET" does not match HEAD), one space, then a path template of
// '/'-separated segments, each
//   - a literal, matched byte for byte ("v1", "items"),
//   - "{name}", exactly one non-empty segment (name from [A-Za-z0-9_], for
//     the reader only: Match captures nothing),
//   - "*", last only: the rest of the path, zero or more segments, empty
//     ones included ("/static/*" matches "/static", "/static/" and
//     "/static/css/a.css").
//
// "/" alone is the root; no other template has an empty segment, so
// "/v1/items/" (a trailing slash) is no template, and the request path
// "/v1/items/" does not match "/v1/items/{id}".
type Route struct {
	Pattern   string
	Procedure string
}

// Routes is a compiled, immutable list of routes: safe for concurrent
// Match calls. A nil *Routes matches nothing.
type Routes struct {
	byMethod  []methodRoot // one per method a route names, sorted by first mention
	any       *node        // the routes with no method, for every other method; nil if none
	procs     []string     // procedure by route index
	distinct  []string     // Procedures: the distinct procs, in order of first mention
	procIndex []int32      // index in distinct, by route index
}

type methodRoot struct {
	method string
	root   *node // the routes of this method and those of none
}

// noRoute stands for "no route" in a node's end, rest and min, so that "is
// route i earlier than best" is one comparison whether or not either exists.
const noRoute = math.MaxInt32

// A node is a position in a segment trie: the segments that led to it are
// the same for every route below it.
type node struct {
	lits  []edge // literal next segments, sorted
	param *node  // a "{name}" next segment
	end   int32  // the first route whose template ends here, or noRoute
	rest  int32  // the first route whose template is these segments then "*", or noRoute
	min   int32  // the first route at or below this node: a search below it can not beat min
}

type edge struct {
	first byte // seg[0], or 0 for the root's ""; kept here to skip most edges without reading seg
	seg   string
	n     *node
}

// Match returns the procedure of the first route, in declaration order,
// that matches the request, or names.Other. path is the request's path as
// the callee's router sees it (http.Request.URL.Path), without its query;
// a path that does not start with '/' ("*", an absolute URL) matches
// nothing. Match neither cleans the path nor decodes it: "/v1//charges" is
// not "/v1/charges", so what a client can send past a route lands in
// names.Other, whose limit the callee must set as any other's.
//
// Match allocates nothing. Its time grows with the path's matched segments
// and with how many routes overlap, hardly with the number of routes; it
// visits a trie node at most once (a node's depth fixes the segment it
// sees), so no path costs more than the trie's size, which the bounds on
// CompileRoutes' input bound.
func (r *Routes) Match(method, path string) string {
	if i := r.MatchIndex(method, path); i >= 0 {
		return r.distinct[i]
	}
	return names.Other
}

// MatchIndex is Match for a table indexed by procedure: it returns the
// index in Procedures of the procedure Match would return, or -1 for
// names.Other. It allocates nothing.
func (r *Routes) MatchIndex(method, path string) int {
	if r == nil || path == "" || path[0] != '/' {
		return -1
	}
	root := r.any
	for i := range r.byMethod {
		if r.byMethod[i].method == method {
			root = r.byMethod[i].root
			break
		}
	}
	if root == nil {
		return -1
	}
	if best := root.match(path[1:], false, noRoute); best != noRoute {
		return int(r.procIndex[best])
	}
	return -1
}

// match returns the earlier of best and the first route below n that
// matches path, the request's segments still to match. done says no
// segment is left; path "" with done false is one empty segment. Every
// branch that could match is searched unless its first route is no earlier
// than best, so the answer is the first route in declaration order, not the
// most specific one. It loops down the trie and recurses only where both a
// literal and a parameter could match.
func (n *node) match(path string, done bool, best int32) int32 {
	for {
		if n.rest < best {
			best = n.rest
		}
		if done {
			return min(best, n.end)
		}
		c, cnext, clast := n.child(path)
		if c != nil && c.min >= best {
			c = nil
		}
		p := n.param
		if p != nil && (path == "" || path[0] == '/' || p.min >= best) {
			p = nil // a parameter is never an empty segment
		}
		if c != nil {
			if p == nil {
				n, path, done = c, cnext, clast
				continue
			}
			if best = c.match(cnext, clast, best); p.min >= best {
				return best
			}
		}
		if p == nil {
			return best
		}
		// A parameter takes the segment, whatever it is, up to its end.
		if i := strings.IndexByte(path, '/'); i >= 0 {
			path = path[i+1:]
		} else {
			path, done = "", true
		}
		n = p
	}
}

// maxScan is the most literal children child compares one by one; a wider
// node pays for finding the segment's end and a binary search.
const maxScan = 16

// child returns the literal child that path's first segment leads to, the
// path after that segment and whether none is left; c is nil if there is
// no such child. It compares each literal with the path in place, first
// byte and end of segment before the bytes, so a literal segment is
// neither split off nor scanned twice.
func (n *node) child(path string) (c *node, next string, last bool) {
	lits := n.lits
	switch {
	case len(lits) == 0:
		return nil, "", false
	case path == "" || path[0] == '/': // an empty segment: only the root template "/" has one
		if lits[0].seg != "" { // sorted: "" first
			return nil, "", false
		}
		if path == "" {
			return lits[0].n, "", true
		}
		return lits[0].n, path[1:], false
	case len(lits) > maxScan:
		return n.search(path)
	}
	first := path[0]
	for i := range lits {
		e := &lits[i]
		l := len(e.seg)
		if e.first != first || l > len(path) || l < len(path) && path[l] != '/' || path[:l] != e.seg {
			continue
		}
		if l == len(path) {
			return e.n, "", true
		}
		return e.n, path[l+1:], false
	}
	return nil, "", false
}

// search is child for a wide node, by binary search on the segment.
func (n *node) search(path string) (c *node, next string, last bool) {
	seg, next, last := path, "", true
	if i := strings.IndexByte(path, '/'); i >= 0 {
		seg, next, last = path[:i], path[i+1:], false
	}
	lits := n.lits
	lo, hi := 0, len(lits)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if lits[m].seg < seg {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(lits) && lits[lo].seg == seg {
		return lits[lo].n, next, last
	}
	return nil, "", false
}

// Procedures returns the distinct procedures of r's routes in the order
// they are first declared, without names.Other: the procedures a callee's
// bucket table and metrics may be sized for.
func (r *Routes) Procedures() []string {
	if r == nil {
		return nil
	}
	return slices.Clone(r.distinct)
}

// GRPCProcedure returns the procedure of a gRPC call, its full method
// "/pkg.Service/Method" as the server sees it, or names.Other when
// fullMethod is not a valid procedure name of that shape. It allocates
// nothing. The name comes from the caller: whoever keys a table by it
// must still bound the distinct procedures (an overflow leaf).
func GRPCProcedure(fullMethod string) string {
	if len(fullMethod) < 4 || fullMethod[0] != '/' || strings.Count(fullMethod, "/") != 2 ||
		!names.ValidProcedure(fullMethod) {
		return names.Other
	}
	return fullMethod
}

// CompileRoutes checks routes and compiles them for Match. It reports
// every problem at once, each naming the route's index and pattern: a bad
// method, an empty or relative path, a bad segment, a bad procedure, too
// many routes or methods, and a route that can never match because an
// earlier one matches every request it would (a duplicate, or shadowed;
// see covers for the rule).
func CompileRoutes(routes []Route) (*Routes, error) {
	if len(routes) > MaxRoutes {
		return nil, fmt.Errorf("%d routes: at most %d (MaxRoutes) per callee", len(routes), MaxRoutes)
	}
	tmpls := make([]template, len(routes))
	ok := make([]bool, len(routes))
	var errs []error
	var methods []string
	for i, rt := range routes {
		t, err := parse(rt.Pattern)
		if err == nil {
			err = checkProcedure(rt.Procedure)
		}
		if err == nil {
			err = earlier(tmpls[:i], ok[:i], routes, t)
		}
		if err == nil && t.method != "" && !slices.Contains(methods, t.method) {
			if len(methods) == MaxMethods {
				err = fmt.Errorf("method %s is one more than %d (MaxMethods) distinct methods", t.method, MaxMethods)
			} else {
				methods = append(methods, t.method)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("route %d %q: %w", i, short(rt.Pattern), err))
			continue
		}
		tmpls[i], ok[i] = t, true
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r := &Routes{procs: make([]string, len(routes)), procIndex: make([]int32, len(routes))}
	for i, rt := range routes {
		r.procs[i] = rt.Procedure
		j := slices.Index(r.distinct, rt.Procedure)
		if j < 0 {
			j = len(r.distinct)
			r.distinct = append(r.distinct, rt.Procedure)
		}
		r.procIndex[i] = int32(j)
	}
	for _, m := range methods {
		r.byMethod = append(r.byMethod, methodRoot{method: m, root: build(tmpls, m)})
	}
	r.any = build(tmpls, "")
	return r, nil
}

// earlier returns an error if an earlier route (ok) matches every request
// t would.
func earlier(prev []template, ok []bool, routes []Route, t template) error {
	for j, p := range prev {
		if !ok[j] || !covers(p, t) {
			continue
		}
		if covers(t, p) {
			return fmt.Errorf("duplicate of route %d %q", j, short(routes[j].Pattern))
		}
		return fmt.Errorf("shadowed by route %d %q, which matches every request it would and comes first", j, short(routes[j].Pattern))
	}
	return nil
}

func checkProcedure(p string) error {
	if p == names.Other {
		return fmt.Errorf("procedure %q is reserved for requests no route matches", p)
	}
	if err := names.CheckProcedure(p); err != nil {
		return fmt.Errorf("procedure: %w", err)
	}
	return nil
}

// build returns the trie of the routes of method, and of those with no
// method, or nil if there are none. Routes go in in declaration order, so
// the first route to reach a node or an end is the earliest one.
func build(tmpls []template, method string) *node {
	var root *node
	for i, t := range tmpls {
		if t.method != "" && t.method != method {
			continue
		}
		if root == nil {
			root = newNode(int32(i))
		}
		n := root
		for _, s := range t.segs {
			switch s.kind {
			case rest:
				n.rest = min(n.rest, int32(i))
			case param:
				if n.param == nil {
					n.param = newNode(int32(i))
				}
				n = n.param
			case literal:
				k, found := slices.BinarySearchFunc(n.lits, s.lit, func(e edge, lit string) int { return strings.Compare(e.seg, lit) })
				if !found {
					n.lits = slices.Insert(n.lits, k, edge{first: firstByte(s.lit), seg: s.lit, n: newNode(int32(i))})
				}
				n = n.lits[k].n
			}
		}
		if t.segs[len(t.segs)-1].kind != rest {
			n.end = min(n.end, int32(i))
		}
	}
	return root
}

func firstByte(s string) byte {
	if s == "" {
		return 0
	}
	return s[0]
}

func newNode(first int32) *node { return &node{end: noRoute, rest: noRoute, min: first} }

// short keeps error messages short when the pattern itself is the problem.
func short(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "?") + "…"
}
