package limits

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/history"
)

// Unit is what a service's limits, capacities and rates count (issue #16).
type Unit uint8

const (
	// UnitRequests: every request weighs 1. The zero value.
	UnitRequests Unit = iota
	// UnitCost: a request weighs what it costs (Service.Cost prices it),
	// and every limit and capacity of the service is in cost units per
	// second. Descriptor limits stay in requests per second.
	UnitCost
)

func (u Unit) String() string {
	if u == UnitCost {
		return "cost"
	}
	return "requests"
}

// parseUnit reads a unit's file form: "requests" or "cost".
func parseUnit(s string) (Unit, error) {
	switch s {
	case "requests":
		return UnitRequests, nil
	case "cost":
		return UnitCost, nil
	}
	return 0, fmt.Errorf("%q is not requests or cost", s)
}

// Defaults of a service's cost block: the store's, so that a file and
// Postgres read alike.
const (
	DefaultCost    = history.DefaultCost
	DefaultMaxCost = history.DefaultMaxCost
)

// Cost says how the sidecars of a service counting cost price a request,
// most specific first: RequestHeader, if set and the request carries a
// valid cost in it; else the procedure's static cost (Procedures); else
// Default. ResponseHeader, if set, names where the app reports what an
// admitted request really cost. Every cost is finite, ≥ 0 and at most Max.
type Cost struct {
	Default        float64
	RequestHeader  string // lower case; "" when no request header is trusted
	ResponseHeader string // lower case; "" when the price at admission stands
	Max            float64
	// Procedures holds the procedures with a static cost of their own;
	// names.Other may be one.
	Procedures map[string]float64
}

// procedure returns procedure's static cost, and whether it has one; c
// may be nil.
func (c *Cost) procedure(procedure string) (float64, bool) {
	if c == nil {
		return 0, false
	}
	v, ok := c.Procedures[procedure]
	return v, ok
}

// Counted reports whether svc's limits count cost units rather than
// requests.
func (svc *Service) Counted() bool { return svc != nil && svc.Unit == UnitCost }

// MaxConcurrency returns the cap on requests in flight of the (caller,
// procedure) leaf, global, 0 for none: the leaf's own, else its caller's,
// the tighter when both are set; procedure is "" for a service without
// procedures. A caller's cap spans its procedures, but a sidecar counts
// in flight per leaf, so each of the caller's leaves gets the whole cap:
// it bounds every leaf, not their sum.
func (svc *Service) MaxConcurrency(caller, procedure string) uint32 {
	if svc == nil {
		return 0
	}
	c := svc.Bucket(caller).MaxConcurrency
	if p := svc.Procedures[procedure]; p != nil {
		if l := p.MaxConcurrency[caller]; l > 0 && (c == 0 || l < c) {
			c = l
		}
	}
	return c
}

// errUpstreamCost is why a service counting cost can not be enforced
// upstream: an upstream data plane neither prices a request nor learns
// what it cost.
var errUpstreamCost = errors.New("upstream: the service counts cost (unit: cost), which only its own sidecars can price; use sidecar")

// errUpstreamConcurrency is why a bucket with max_concurrency can not be
// enforced upstream: an upstream data plane keeps no count of the
// requests in flight at the callee.
var errUpstreamConcurrency = errors.New("upstream: max_concurrency is held by the callee's own sidecars, which count requests in flight; upstream data planes do not; use sidecar")

// fileCost is the file form of a service's cost block: see fileDoc's
// services.llm.cost.
type fileCost struct {
	Default  *float64 `yaml:"default,omitempty"`
	From     string   `yaml:"from,omitempty"`
	Response string   `yaml:"response,omitempty"`
	Max      *float64 `yaml:"max,omitempty"`
}

func (d *decoder) cost(n *yaml.Node, path string) *fileCost {
	fc := &fileCost{}
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "default":
			fc.Default = d.number(v, p)
		case "from":
			fc.From = d.text(v, p)
		case "response":
			fc.Response = d.text(v, p)
		case "max":
			fc.Max = d.number(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fc
}

// cost builds svc's Unit and Cost from fs: the service's unit and cost
// block, and its procedures' static costs. svc's procedures must be
// built. A cost anywhere without unit: cost is an error naming it: it
// would price nothing.
func (b *builder) cost(svc *Service, fs fileService, path string) {
	svc.Unit = setting(path+".unit", fs.Unit, parseUnit, UnitRequests, &b.errs)
	if !svc.Counted() {
		if fs.Cost != nil {
			b.errs = append(b.errs, fmt.Errorf("%s.cost: needs %s.unit: cost (the service counts requests)", path, path))
		}
		for _, proc := range slices.Sorted(maps.Keys(fs.Procedures)) {
			if fs.Procedures[proc].Cost != nil {
				b.errs = append(b.errs, fmt.Errorf("%s.procedures.%s.cost: needs %s.unit: cost (the service counts requests)", path, proc, path))
			}
		}
		return
	}
	c := &Cost{Default: DefaultCost, Max: DefaultMaxCost}
	if fc := fs.Cost; fc != nil {
		cpath := path + ".cost"
		if fc.Max != nil {
			if v := *fc.Max; !(v > 0) || math.IsInf(v, 1) {
				b.errs = append(b.errs, fmt.Errorf("%s.max: %v is not a finite cost > 0", cpath, v))
			} else {
				c.Max = v
			}
		}
		if fc.Default != nil {
			c.Default = b.costValue(cpath+".default", *fc.Default, c.Max)
		}
		if fc.From != "" {
			c.RequestHeader = b.headerName(cpath+".from", fc.From)
		}
		if fc.Response != "" {
			c.ResponseHeader = b.headerName(cpath+".response", "header "+fc.Response)
		}
	}
	for _, proc := range slices.Sorted(maps.Keys(fs.Procedures)) {
		fp := fs.Procedures[proc]
		if fp.Cost == nil {
			continue
		}
		if _, ok := svc.Procedures[proc]; !ok {
			continue // not a procedure of svc: procedures reported it
		}
		if c.Procedures == nil {
			c.Procedures = map[string]float64{}
		}
		c.Procedures[proc] = b.costValue(path+".procedures."+proc+".cost", *fp.Cost, c.Max)
	}
	svc.Cost = c
}

// costValue checks a configured cost: finite, ≥ 0 and at most maxCost
// (a sidecar would clamp a larger one, and count it, on every request).
func (b *builder) costValue(path string, v, maxCost float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		b.errs = append(b.errs, fmt.Errorf("%s: %v is not a finite cost >= 0", path, v))
		return DefaultCost
	}
	if v > maxCost {
		b.errs = append(b.errs, fmt.Errorf("%s: %v is above the service's cost.max %v", path, v, maxCost))
	}
	return v
}

// headerName reads "header <name>", the one source a cost may come from,
// and returns the name lower-cased, checked as a descriptor's is.
func (b *builder) headerName(path, s string) string {
	src, err := descriptor.ParseSource(s)
	if err == nil && src.Kind != descriptor.Header {
		err = fmt.Errorf("source %q: want \"header <name>\"", s)
	}
	if err != nil {
		b.errs = append(b.errs, fmt.Errorf("%s: %w", path, err))
		return ""
	}
	return src.Header
}

// maxConcurrency reads an optional max_concurrency at path: 0 when absent,
// else a positive integer that fits a uint32, and an error naming path
// for anything else; e is the bucket's enforcement: upstream can not hold
// a cap.
func (b *builder) maxConcurrency(path string, v *float64, e dataplane.Enforcement) uint32 {
	if v == nil {
		return 0
	}
	if x := *v; !(x >= 1 && x <= math.MaxUint32) || x != math.Trunc(x) {
		b.errs = append(b.errs, fmt.Errorf("%s: %v is not an integer from 1 to %d", path, x, uint32(math.MaxUint32)))
		return 0
	}
	if e == dataplane.EnforceUpstream {
		b.errs = append(b.errs, fmt.Errorf("%s: %w", path, errUpstreamConcurrency))
	}
	return uint32(*v)
}
