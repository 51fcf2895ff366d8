package limits

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// errUpstream is why a service with HTTP routes can not be enforced
// upstream: Envoy's runtime keys carry one ratio per downstream cluster
// (caller), never one per (caller, route), so nothing upstream could hold
// such a leaf to its ratio. A proxyless gRPC client can: its routes match
// the full method (docs/dataplanes.md).
var errUpstream = errors.New("upstream: the service routes HTTP requests to procedures, and upstream data planes can not enforce per (caller, route); use sidecar, or declare gRPC methods only")

// upstreamRefused reports whether s's callers can not be enforced
// upstream: s declares procedures and has HTTP routes, or declares a
// procedure that is not a gRPC full method (which, without routes, only a
// loader's bug could let through). A callee that declares gRPC methods
// only is served per method by the proxyless routes. Both loaders ask
// this, so that a file and the store agree.
func upstreamRefused(s *Service) bool {
	if len(s.Routes) > 0 {
		return s.HasProcedures()
	}
	for _, p := range s.Declared {
		if !routes.IsGRPCMethod(p) {
			return true
		}
	}
	return false
}

// procedures fills svc's Routes, Declared and Procedures from fs: the
// procedures its routes name, in order of first mention, then the keys of
// its procedures that no route names, sorted. Such a key must be a gRPC
// full method: any other name could never be a request's procedure.
func (b *builder) procedures(svc *Service, fs fileService, path string) {
	if len(fs.Routes) == 0 && len(fs.Procedures) == 0 {
		return
	}
	svc.Routes = b.routes(fs.Routes, path)
	named := make(map[string]bool, len(svc.Routes))
	for _, r := range svc.Routes {
		if !named[r.Procedure] && r.Procedure != names.Other && r.Procedure != "" { // CompileRoutes reports those
			named[r.Procedure] = true
			svc.Declared = append(svc.Declared, r.Procedure)
		}
	}
	for _, proc := range slices.Sorted(maps.Keys(fs.Procedures)) {
		if named[proc] || proc == names.Other {
			continue
		}
		ppath := path + ".procedures." + proc
		if err := names.CheckProcedure(proc); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: invalid procedure name: %v", ppath, err))
			continue
		}
		if !routes.IsGRPCMethod(proc) {
			b.errs = append(b.errs, fmt.Errorf("%s: no route names it and it is not a gRPC full method (/pkg.Service/Method): no request could be it", ppath))
			continue
		}
		svc.Declared = append(svc.Declared, proc)
	}
	switch _, other := fs.Procedures[names.Other]; {
	case len(svc.Declared) == 0 && other:
		b.errs = append(b.errs, fmt.Errorf("%s.procedures.%s: the service declares no procedure, so every request is its caller's whole bucket; put the capacity on the service", path, names.Other))
	case len(svc.Declared) > routes.MaxRoutes:
		b.errs = append(b.errs, fmt.Errorf("%s.procedures: %d procedures declared, at most %d (routes.MaxRoutes)", path, len(svc.Declared), routes.MaxRoutes))
	}
	if len(svc.Declared) == 0 {
		svc.Routes, svc.Declared = nil, nil
		return
	}
	svc.Procedures = make(map[string]*Procedure, len(svc.Declared)+1)
	for _, proc := range svc.Declared {
		svc.Procedures[proc] = b.procedure(fs.Procedures[proc], path+".procedures."+proc)
	}
	if fp, ok := fs.Procedures[names.Other]; ok {
		svc.Procedures[names.Other] = b.procedure(fp, path+".procedures."+names.Other)
	}
}

// routes checks a service's routes with the sidecar's own CompileRoutes,
// each error at its route's path.
func (b *builder) routes(frs []fileRoute, path string) []routes.Route {
	if len(frs) > routes.MaxRoutes {
		b.errs = append(b.errs, fmt.Errorf("%s.routes: %d routes, at most %d (routes.MaxRoutes) per service", path, len(frs), routes.MaxRoutes))
	}
	rts := make([]routes.Route, len(frs))
	if len(frs) > routes.MaxRoutes { // the procedures they name, for Declared, but no more errors
		for i, fr := range frs {
			rts[i] = routes.Route{Pattern: fr.Route, Procedure: fr.Procedure}
		}
		return rts
	}
	complete := true
	for i, fr := range frs {
		rpath := fmt.Sprintf("%s.routes[%d]", path, i)
		if fr.Route == "" {
			b.errs = append(b.errs, fmt.Errorf("%s.route: line %d: missing", rpath, fr.line))
			complete = false
		}
		if fr.Procedure == "" {
			b.errs = append(b.errs, fmt.Errorf("%s.procedure: line %d: missing", rpath, fr.line))
			complete = false
		}
		rts[i] = routes.Route{Pattern: fr.Route, Procedure: fr.Procedure}
	}
	if !complete {
		return rts
	}
	if _, err := routes.CompileRoutes(rts); err != nil {
		b.errs = append(b.errs, routeErrors(path, frs, err)...)
	}
	return rts
}

// routeErrors puts each of CompileRoutes' errors, "route 2 \"GET /x\": ...",
// at its route's path, services.checkout.routes[2], and line.
func routeErrors(path string, frs []fileRoute, err error) []error {
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		msg := e.Error()
		num, rest, _ := strings.Cut(strings.TrimPrefix(msg, "route "), " ")
		if i, err := strconv.Atoi(num); err == nil && strings.HasPrefix(msg, "route ") && i >= 0 && i < len(frs) {
			out = append(out, fmt.Errorf("%s.routes[%d]: line %d: %s", path, i, frs[i].line, rest))
			continue
		}
		out = append(out, fmt.Errorf("%s.routes: %w", path, e))
	}
	return out
}

// procedure builds a procedure's limits from its file form (the zero
// fileProcedure for one only a route names).
func (b *builder) procedure(fp fileProcedure, path string) *Procedure {
	p := &Procedure{Capacity: rate(path+".capacity", fp.Capacity, &b.errs), Callers: make(map[string]float64, len(fp.Callers))}
	for _, caller := range slices.Sorted(maps.Keys(fp.Callers)) {
		if b.stopped() {
			return p
		}
		cpath := path + ".callers." + caller
		if err := names.Check(caller); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: invalid caller name: %v", cpath, err))
		}
		fl := fp.Callers[caller]
		if mc := b.maxConcurrency(cpath+".max_concurrency", fl.MaxConcurrency, dataplane.EnforceSidecar); mc > 0 {
			if p.MaxConcurrency == nil {
				p.MaxConcurrency = map[string]uint32{}
			}
			p.MaxConcurrency[caller] = mc
			if fl.Limit == nil {
				continue // a leaf listed for its cap alone has no limit of its own
			}
		}
		if fl.Limit == nil {
			b.errs = append(b.errs, fmt.Errorf("%s.limit: missing", cpath))
		}
		p.Callers[caller] = rate(cpath+".limit", fl.Limit, &b.errs)
	}
	return p
}

// leafCapsUpstream refuses a leaf's max_concurrency whose caller is
// enforced upstream (errUpstreamConcurrency): known once svc's callers
// are built, after its procedures.
func (b *builder) leafCapsUpstream(svc *Service, path string) {
	for _, proc := range slices.Sorted(maps.Keys(svc.Procedures)) {
		for _, caller := range slices.Sorted(maps.Keys(svc.Procedures[proc].MaxConcurrency)) {
			if svc.Bucket(caller).Enforcement == dataplane.EnforceUpstream {
				b.errs = append(b.errs, fmt.Errorf("%s.procedures.%s.callers.%s.max_concurrency: %w", path, proc, caller, errUpstreamConcurrency))
			}
		}
	}
}

// warnProcedures warns of the procedure limits of svc that are legal but
// surely not what was meant: one that can never bind, or a procedure that
// limits nothing at any level.
func (b *builder) warnProcedures(svc *Service) {
	if !svc.HasProcedures() {
		return
	}
	path := "services." + svc.Name + ".procedures."
	// Without a limit at the service or caller level, a procedure without
	// its own is never shared out nor cut: it only costs a leaf.
	unlimited := math.IsInf(svc.Capacity, 1) && math.IsInf(svc.DefaultLimit, 1) && len(svc.Callers) == 0
	for _, proc := range append(slices.Clip(svc.Declared), names.Other) {
		p := svc.Procedures[proc]
		if p == nil {
			continue
		}
		if !math.IsInf(p.Capacity, 1) && p.Capacity > svc.Capacity {
			b.warnf("%s%s.capacity: %v is above the service's capacity %v, so it never binds", path, proc, p.Capacity, svc.Capacity)
		}
		for _, caller := range slices.Sorted(maps.Keys(p.Callers)) {
			if l, cl := p.Callers[caller], svc.Bucket(caller).Limit; l > cl {
				b.warnf("%s%s.callers.%s.limit: %v is above caller %s's limit %v across the service's procedures, so it never binds", path, proc, caller, l, caller, cl)
			}
		}
		_, priced := svc.Cost.procedure(proc)
		if unlimited && proc != names.Other && math.IsInf(p.Capacity, 1) && len(p.Callers) == 0 && len(p.MaxConcurrency) == 0 && !priced {
			b.warnf("%s%s: limits nothing, and neither the service nor its callers have a limit: it only adds a leaf", path, proc)
		}
	}
}
