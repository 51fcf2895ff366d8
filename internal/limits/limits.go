// Package limits holds the configured limits the controller enforces and the
// sources they come from.
//
// A Set is immutable once built: a source builds a new Set and swaps it in, so
// the controller's tick reads limits without locks and never sees a half
// applied change.
package limits

import (
	"context"
	"math"
	"sort"
	"time"

	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Source yields the limits in force. Limits must be cheap: the controller
// calls it on every tick. A source that reloads in the background does so in
// its Run method, owned by the caller.
type Source interface {
	Limits() *Set
}

// Runner is a Source that keeps itself current until ctx is cancelled.
type Runner interface {
	Source
	Run(ctx context.Context) error
}

// Set is one consistent version of every limit. Read only.
type Set struct {
	services map[string]*Service
	names    []string // sorted keys of services
	warnings []string
}

// Service holds the limits of one callee.
type Service struct {
	Name string
	// Capacity is the rate all callers share; +Inf when there is none.
	Capacity float64
	// SLO is the objective the controller estimates a capacity from
	// (pkg/adaptive); zero for none. The smaller of the two holds.
	SLO adaptive.Objective
	// DefaultLimit applies to callers without a limit of their own; +Inf
	// when there is none.
	DefaultLimit float64
	// Mode applies to callers without a mode of their own.
	Mode dropratio.Mode
	// FailMode is what the service's sidecars do when their policy expires.
	FailMode dataplane.FailMode
	// Enforcement applies to callers without an enforcement of their own,
	// except the reserved callers names.Unknown and names.Overflow, which
	// always name theirs: no Envoy header names them, so the default of a
	// callee fronted by Envoy would leave them unenforced.
	Enforcement dataplane.Enforcement
	// Callers holds the per-caller limits, keyed by caller. When the
	// service declares procedures, a caller's Limit holds across all of
	// them (the hierarchical law's caller level); otherwise it is the
	// limit of the (callee, caller) bucket, as before procedures existed.
	Callers map[string]Bucket

	// Routes are the service's HTTP routes in declaration order: the
	// first that matches a request names its procedure. Checked
	// (routes.CompileRoutes) when the Set was built.
	Routes []routes.Route
	// Procedures are the procedures the service declares, in the order
	// of its limits (see Declared), with their limits. A procedure is
	// declared by a route that names it or by a key of the limits'
	// procedures (a gRPC full method must be declared so). names.Other
	// may be listed to give unmatched requests a capacity or limits; it
	// is never in Declared.
	Procedures map[string]*Procedure
	// Declared lists the procedures in declaration order, names.Other
	// excluded: what the service's policy carries. Empty when the service
	// declares none, and then Procedures is empty too.
	Declared []string

	// Descriptors are the service's descriptor limits (issue #15), sorted
	// by name, at most descriptor.MaxPerService.
	Descriptors []Descriptor

	// Criticality declares the service's tiers (issue #16); nil when it
	// declares none, and then its buckets are untiered.
	Criticality *Criticality

	// Unit is what the service's limits, capacities and rates count
	// (issue #16): requests, or cost units. Descriptor limits are always
	// in requests per second.
	Unit Unit
	// Cost prices the service's requests; nil unless Unit is UnitCost.
	Cost *Cost
}

// Descriptor is a limit per value of one request attribute with many
// values: "every tenant may send 50 rps, acme 500".
type Descriptor struct {
	Name   string            // descriptor.CheckName; the key in the file
	Source descriptor.Source // "header x-tenant-id", "client-ip", "xff 1"
	// Limit is every value's global limit in rps; 0 blocks.
	Limit float64
	// Missing is the limit of requests without the attribute
	// (descriptor.Missing); the file's default is Limit.
	Missing float64
	// Overrides are the values with a limit of their own.
	Overrides map[string]float64
	// Quantile sizes a sidecar's local allowance for unlisted values
	// (pkg/allowance); the file's default is DefaultQuantile.
	Quantile float64
}

// Procedure holds the limits of one procedure of one callee.
type Procedure struct {
	// Capacity is the rate all callers of the procedure share; +Inf when
	// there is none.
	Capacity float64
	// Callers holds the per-(caller, procedure) limits in rps, keyed by
	// caller; a caller not listed has none at this level (its caller
	// limit and the capacities still apply). Mode and enforcement are the
	// caller's (Service.Bucket).
	Callers map[string]float64
	// MaxConcurrency holds the (caller, procedure) leaves with a cap on
	// requests in flight of their own, global, keyed by caller; a leaf
	// may have one without a limit. See Service.MaxConcurrency.
	MaxConcurrency map[string]uint32
	// SLO is the procedure's own objective (issue #18): the controller
	// estimates the procedure's capacity from its health as it does a
	// service's, and the smaller of that and Capacity holds. Zero when
	// there is none.
	SLO adaptive.Objective
}

// HasProcedures reports whether svc declares procedures: its buckets are
// then (caller, procedure) leaves.
func (svc *Service) HasProcedures() bool { return svc != nil && len(svc.Declared) > 0 }

// LeafLimit returns the limit of the (caller, procedure) leaf itself, +Inf
// when there is none; procedure may be names.Other. The caller's own
// limit (Bucket) and the capacities apply on top of it.
func (svc *Service) LeafLimit(caller, procedure string) float64 {
	if svc == nil {
		return math.Inf(1)
	}
	if p := svc.Procedures[procedure]; p != nil {
		if l, ok := p.Callers[caller]; ok {
			return l
		}
	}
	return math.Inf(1)
}

// ProcedureCapacity returns the capacity of procedure, +Inf when it has
// none.
func (svc *Service) ProcedureCapacity(procedure string) float64 {
	if svc == nil {
		return math.Inf(1)
	}
	if p := svc.Procedures[procedure]; p != nil {
		return p.Capacity
	}
	return math.Inf(1)
}

// Bucket is the limit of one (callee, caller) pair.
type Bucket struct {
	Limit       float64 // per second, in the service's Unit; +Inf means none
	Mode        dropratio.Mode
	Enforcement dataplane.Enforcement
	// MaxConcurrency caps the bucket's requests in flight at the callee,
	// globally, whatever the service's Unit; 0 for none.
	MaxConcurrency uint32
	// Burst is the most the bucket may admit above its Limit after a
	// quiet period, in the service's Unit (token-bucket semantics at the
	// global level: see dropratio.LevelStep). 0, the default, is the
	// tightest edge: a limit that says nothing about bursts must not let
	// an unannounced burst through to a fragile callee.
	Burst float64
	// Payback is the window over which the bucket pays back what it
	// admitted above its Limit, its limit lowered meanwhile; 0, the
	// default, pays nothing back, but for a callee counting cost, whose
	// buckets pay back over the controller's --cost-payback.
	Payback time.Duration
}

// NewSet builds a Set from services; the map must not be changed afterwards.
func NewSet(services map[string]*Service) *Set {
	s := &Set{services: services}
	for name := range services {
		s.names = append(s.names, name)
	}
	sort.Strings(s.names)
	return s
}

// Empty is the Set with no limits at all.
var Empty = NewSet(nil)

// Services returns the names of every configured service, sorted.
func (s *Set) Services() []string { return s.names }

// Service returns the limits of a callee, or nil when it has none.
func (s *Set) Service(name string) *Service { return s.services[name] }

// Warnings lists what is legal in the limits but surely not what was
// meant, each with its path: a limit that can never bind, a procedure that
// limits nothing. Their source logs them when it loads the set; they never
// stop it from loading.
func (s *Set) Warnings() []string { return s.warnings }

// Len is the number of configured services.
func (s *Set) Len() int { return len(s.services) }

// Bucket returns the limit that applies to caller when it calls svc: its own,
// else the service default, else none.
func (svc *Service) Bucket(caller string) Bucket {
	if svc == nil {
		return Bucket{Limit: math.Inf(1), Mode: dropratio.Enforce}
	}
	if b, ok := svc.Callers[caller]; ok {
		return b
	}
	return Bucket{Limit: svc.DefaultLimit, Mode: svc.Mode, Enforcement: svc.callerEnforcement(caller)}
}

// callerEnforcement is the enforcement a caller without one of its own
// gets: the service's, but for the reserved callers.
func (svc *Service) callerEnforcement(caller string) dataplane.Enforcement {
	if caller == names.Unknown || caller == names.Overflow {
		return dataplane.EnforceSidecar
	}
	return svc.Enforcement
}

// Static is a Source whose limits never change: the demo's and tests'.
type Static struct{ Set *Set }

// Limits returns the fixed set.
func (s Static) Limits() *Set {
	if s.Set == nil {
		return Empty
	}
	return s.Set
}
