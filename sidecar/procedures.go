package sidecar

import (
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Procedures (issue #14): a service whose policy declares procedures counts
// and decides every request in one leaf (peer, procedure) instead of one
// bucket per peer. A leaf is keyed in the table by its peer and its
// procedure's index (see leafKey), so that the request path never compares
// procedure names:
//
//   - index 0 is names.Other, the procedure of a request that fits no
//     declared one; for a service without procedures it is "", the whole
//     (service, peer) bucket, and the only index;
//   - index i in 1..P is the policy's i-th declared procedure.
//
// The index of a request is found against the table it is decided in (one
// snapshot): DecideHTTP by the policy's routes, DecideGRPC by its full
// method's name. Decide, which knows no procedure, decides index 0: the
// whole bucket, or (peer, names.Other) for a service with procedures.

// leaf is the key of a bucket in a service's table: a peer, a procedure
// ("" for a service that declares none) and a tier (None for a service
// without criticality; see criticality.go).
type leaf struct {
	peer, proc string
	tier       criticality.Tier
}

// procedures is a policy's procedures compiled for the request path.
// Immutable; built once per policy (compileProcedures).
type procedures struct {
	names  []string  // by index: names[0] is names.Other, or "" for none
	byName nameTable // declared name → index (1..P); empty for none
	routes *routes.Routes
	// byRoute maps routes.MatchIndex + 1 to a procedure index:
	// byRoute[0] = 0, names.Other.
	byRoute []uint32
}

// noProcedures is the procedures of a service that declares none, and of a
// service without a policy.
var noProcedures = &procedures{names: []string{""}}

// compileProcedures compiles p's procedures and routes; noProcedures when it
// declares none. The routes PolicyFromProto compiled are reused; a
// hand-built policy's are compiled here, and ones that do not compile (the
// policy was never validated) match nothing: their requests are
// names.Other's.
func compileProcedures(p *Policy) *procedures {
	if p == nil || len(p.Procedures) == 0 {
		return noProcedures
	}
	pr := &procedures{names: make([]string, 0, len(p.Procedures)+1)}
	pr.names = append(pr.names, names.Other)
	seen := make(map[string]bool, len(p.Procedures))
	for _, q := range p.Procedures {
		if seen[q] || q == names.Other || !names.ValidProcedure(q) || len(pr.names) > routes.MaxRoutes {
			continue // only in hand-built policies: PolicyFromProto rejects them
		}
		seen[q] = true
		pr.names = append(pr.names, q)
	}
	pr.byName = newNameTable(pr.names[1:], func(i int) uint32 { return uint32(i + 1) })
	pr.routes = p.compiled
	if pr.routes == nil && len(p.Routes) > 0 {
		pr.routes, _ = routes.CompileRoutes(p.Routes)
	}
	rp := pr.routes.Procedures()
	pr.byRoute = make([]uint32, len(rp)+1)
	for i, q := range rp {
		pr.byRoute[i+1], _ = pr.byName.get(q) // undeclared (hand-built only): names.Other
	}
	return pr
}

// index returns the index of procedure q, and whether pr has it: "" alone
// for a service without procedures; names.Other and the declared ones
// otherwise.
func (pr *procedures) index(q string) (uint32, bool) {
	if pr.names[0] == "" {
		return 0, q == ""
	}
	if q == names.Other {
		return 0, true
	}
	return pr.byName.get(q)
}

// grpc returns the index of a gRPC call's procedure, its full method
// "/pkg.Service/Method" if declared, else names.Other's (0). It allocates
// nothing; a method longer than any procedure name is not hashed.
func (pr *procedures) grpc(fullMethod string) uint32 {
	if len(fullMethod) > names.MaxProcedureLen {
		return 0
	}
	idx, _ := pr.byName.get(fullMethod)
	return idx
}

// http returns the index of an HTTP request's procedure: that of the first
// route that matches, else, when path is a declared procedure (a gRPC call
// through an HTTP proxy: its path is its full method), that one, else
// names.Other's (0). It allocates nothing.
func (pr *procedures) http(method, path string) uint32 {
	if len(pr.names) == 1 {
		return 0
	}
	if i := pr.routes.MatchIndex(method, path); i >= 0 {
		return pr.byRoute[i+1]
	}
	return pr.grpc(path)
}
