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
	"slices"
	"strings"

	"github.com/sluicehq/sluice/pkg/names"
)

// Bounds on what one callee's policy may declare. Together they bound a
// compiled Routes: per segment index (at most MaxSegments), a table of at
// most 2×MaxRoutes slots of about 64 bytes, some 2 MB for the most hostile
// policy; a real API's few dozen routes take a few KB.
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

// Match returns the procedure of the first route, in declaration order,
// that matches the request, or names.Other. path is the request's path as
// the callee's router sees it (http.Request.URL.Path), without its query;
// a path that does not start with '/' ("*", an absolute URL) matches
// nothing. Match neither cleans the path nor decodes it: "/v1//charges" is
// not "/v1/charges", so what a client can send past a route lands in
// names.Other, whose limit the callee must set as any other's.
//
// Match allocates nothing. Its time grows with the path's segments, up to
// the most a template has, not with the number of routes or how they
// overlap: it looks each segment up once in a table of the literals at its
// index (see match.go). A lookup reads at most as many slots as there are
// distinct literals at that index (at most MaxRoutes; compile picks the
// hash so that it is usually one or two), so no path costs more than
// reading it once plus MaxSegments such lookups.
func (r *Routes) Match(method, path string) string {
	if i := r.MatchIndex(method, path); i >= 0 {
		return r.distinct[i]
	}
	return names.Other
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

// IsGRPCMethod reports whether s is a gRPC full method, the only procedure
// a callee declares without a route: what GRPCProcedure keeps as it is.
// names.Other, which GRPCProcedure also returns as it is, is not one.
func IsGRPCMethod(s string) bool { return s != names.Other && GRPCProcedure(s) == s }

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
	r := &Routes{procIndex: make([]int32, len(routes))}
	for i, rt := range routes {
		j := slices.Index(r.distinct, rt.Procedure)
		if j < 0 {
			j = len(r.distinct)
			r.distinct = append(r.distinct, rt.Procedure)
		}
		r.procIndex[i] = int32(j)
	}
	r.compile(tmpls, methods)
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

// short keeps error messages short when the pattern itself is the problem.
func short(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "?") + "…"
}
