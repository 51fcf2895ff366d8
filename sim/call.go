package sim

import (
	"slices"
	"strings"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// maxPathLen bounds a flow's request path: a scenario is a file someone
// wrote, and a path longer than this is a typo, not a test.
const maxPathLen = 2048

// buildCall checks a flow's procedure and request fields and resolves its
// leaf as the callee's sidecars will: an HTTP request by the callee's
// routes, first match wins, else by its path when that is a declared
// procedure (a gRPC call through an HTTP proxy), else names.Other; a gRPC
// method by whether the callee declares it; a flow that names neither, by
// Decide's rule, names.Other. For a callee without procedures the leaf is
// "", the whole (callee, caller) pair. A flow may name what it calls only
// at a callee that declares procedures: elsewhere the name would change
// nothing, and that is surely not what the scenario meant.
func buildCall(ff *fileFlow, svc *limits.Service, path string, bad func(string, string, ...any)) (Call, string) {
	var c Call
	switch {
	case ff.Procedure != "" && ff.Request != "":
		bad(path, "names both a procedure and a request; a flow calls one")
		return Call{}, ""
	case ff.Procedure != "":
		if !routes.IsGRPCMethod(ff.Procedure) {
			bad(path+".procedure", "%q is not a gRPC full method, /package.Service/Method", short(ff.Procedure))
			return Call{}, ""
		}
		c.Procedure = ff.Procedure
	case ff.Request != "":
		var ok bool
		if c, ok = parseRequest(ff.Request, path+".request", bad); !ok {
			return Call{}, ""
		}
	}
	if !svc.HasProcedures() {
		if c.Named() {
			field := ".procedure"
			if c.Procedure == "" {
				field = ".request"
			}
			bad(path+field, "service %s declares no procedures in limits (routes or procedures), so every request of the flow would count in the bucket %s/%s", ff.Callee, ff.Callee, ff.Caller)
		}
		return c, ""
	}
	return c, resolveLeaf(c, svc)
}

// parseRequest reads "METHOD /path": a method of upper-case letters and
// '-', one space, and a concrete path (not a route template), as a
// client sends it, without a query.
func parseRequest(s, path string, bad func(string, string, ...any)) (Call, bool) {
	method, p, ok := strings.Cut(s, " ")
	switch {
	case !ok:
		bad(path, "%q is not METHOD /path, e.g. \"POST /v1/charges\"", short(s))
	case method == "" || len(method) > routes.MaxMethodLen || strings.Trim(method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ-") != "":
		bad(path, "method %q: 1 to %d upper-case letters or '-'", short(method), routes.MaxMethodLen)
	case !strings.HasPrefix(p, "/"):
		bad(path, "path %q does not start with '/'", short(p))
	case len(p) > maxPathLen:
		bad(path, "path of %d bytes is longer than %d", len(p), maxPathLen)
	case strings.ContainsAny(p, "{}"):
		bad(path, "path %q is a route template; a flow sends a concrete path, e.g. /v1/items/42", short(p))
	case strings.ContainsAny(p, "? \t\r\n"):
		bad(path, "path %q has a query or white space; a flow sends the path alone", short(p))
	default:
		return Call{Method: method, Path: p}, true
	}
	return Call{}, false
}

// resolveLeaf is the procedure of c's requests at a callee that declares
// procedures; see buildCall.
func resolveLeaf(c Call, svc *limits.Service) string {
	switch {
	case c.Procedure != "":
		if slices.Contains(svc.Declared, c.Procedure) {
			return c.Procedure
		}
	case c.Path != "":
		// The limits' parser compiled these routes already: they compile.
		if rs, err := routes.CompileRoutes(svc.Routes); err == nil {
			if p := rs.Match(c.Method, c.Path); p != names.Other {
				return p
			}
		}
		if slices.Contains(svc.Declared, c.Path) {
			return c.Path
		}
	}
	return names.Other
}

// short cuts a value for an error message.
func short(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
