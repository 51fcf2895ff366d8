package limits

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/pkg/adaptive"
)

// fileSLO is a service's objective (issue #18), from which the controller
// estimates the rate it can admit (pkg/adaptive):
//
//	slo:
//	  latency_p99: 200ms # the callee's p99 over the fleet (optional)
//	  errors: 1%         # the share of answers that may fail (optional; "1%" or 0.01)
//
// At least one is set. The estimate is a capacity: with a capacity
// written beside it, the smaller holds.
type fileSLO struct {
	LatencyP99 string `yaml:"latency_p99"`
	Errors     string `yaml:"errors"`
}

// slo builds svc's objectives: the service's (fs.SLO) and each of its
// procedures' (a procedure's estimate caps what its callers share, as
// its capacity does).
func (b *builder) slo(svc *Service, fs fileService, path string) {
	if o, ok := b.objective(fs.SLO, svc, path+".slo"); ok {
		svc.SLO = o
	}
	for _, proc := range slices.Sorted(maps.Keys(fs.Procedures)) {
		p := svc.Procedures[proc]
		if p == nil {
			continue // refused by procedures, with its error
		}
		if o, ok := b.objective(fs.Procedures[proc].SLO, svc, path+".procedures."+proc+".slo"); ok {
			p.SLO = o
		}
	}
}

// objective builds the objective f of svc, or of one of its procedures,
// at path; ok is false when there is none or it is invalid (each error
// is added, naming its field).
func (b *builder) objective(f *fileSLO, svc *Service, path string) (o adaptive.Objective, ok bool) {
	if f == nil {
		return o, false
	}
	ok = true
	if f.LatencyP99 != "" {
		d, err := duration.Parse(f.LatencyP99)
		if err != nil || d <= 0 {
			b.errs = append(b.errs, fmt.Errorf("%s.latency_p99: %q is not a positive duration (200ms)", path, f.LatencyP99))
			ok = false
		}
		o.LatencyP99 = d
	}
	if f.Errors != "" {
		e, err := ParseRatio(f.Errors)
		if err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s.errors: %v", path, err))
			ok = false
		}
		o.Errors = e
	}
	if !ok {
		return o, false
	}
	if err := o.Validate(); err != nil {
		b.errs = append(b.errs, fmt.Errorf("%s: %v", path, err))
		return o, false
	}
	if svc.Counted() {
		// Health counts requests; the capacity of a service counting cost
		// is in its units, which an estimate from requests is not.
		b.errs = append(b.errs, fmt.Errorf("%s: not yet supported with unit: cost (the estimate is in requests)", path))
		return o, false
	}
	return o, true
}

// ParseRatio reads "1%", "0.5 %" or "0.01" as a ratio in (0, 1).
func ParseRatio(s string) (float64, error) {
	t := strings.TrimSpace(s)
	scale := 1.0
	if p, ok := strings.CutSuffix(t, "%"); ok {
		t, scale = strings.TrimSpace(p), 100
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v/scale > 0 && v/scale < 1) {
		return 0, fmt.Errorf("%q is not a share in (0, 1) or a percentage in (0%%, 100%%)", s)
	}
	return v / scale, nil
}
