package live

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/sim"
)

// Scaling says how a scenario is shrunk to fit one machine.
type Scaling struct {
	// Factor multiplies every rate of the scenario: its flows, and its
	// limits, capacities and default limits, so that every caller stays as
	// far over or under its limit as in the full scenario. In (0, 1].
	Factor float64
	// Sidecars caps each service's sidecars per zone; a zone where the
	// scenario has fewer keeps its own count, one with none keeps none.
	Sidecars int
}

// DefaultScaling is 1 % of the scenario's rates and two sidecars per zone:
// uber-surge's 367K rps peak becomes 3,670 rps on ten processes.
func DefaultScaling() Scaling { return Scaling{Factor: 0.01, Sidecars: 2} }

// Validate names every bad field.
func (s Scaling) Validate() error {
	var errs []error
	if !(s.Factor > 0 && s.Factor <= 1) {
		errs = append(errs, fmt.Errorf("scale (--scale): %v is outside (0, 1]", s.Factor))
	}
	if s.Sidecars < 1 || s.Sidecars > 20 {
		errs = append(errs, fmt.Errorf("sidecars (--sidecars): %d is outside [1, 20] per zone and service", s.Sidecars))
	}
	return errors.Join(errs...)
}

// ErrUnsupported marks a scenario that live mode can not run as written.
var ErrUnsupported = errors.New("not supported in live mode")

// maxRetryTime bounds a retried request's backoffs in all: the load
// generator gives up on a request after 5 s, and a request waits in the
// retrying client for all its retries.
const maxRetryTime = 4 * time.Second

// Check reports what live mode can not run in sc, wrapping ErrUnsupported.
// Live mode needs one retry policy per (callee, caller), retries whose
// backoffs add up to less than 4 s, and flows that name no procedure.
func Check(sc *sim.Scenario) error {
	var errs []error
	seen := map[sim.Bucket]*sim.Retry{}
	for i, f := range sc.Flows {
		b := sim.Bucket{Callee: f.Callee, Caller: f.Caller}
		if f.Call.Named() {
			// The load generator sends one path to every callee and
			// names only the caller.
			errs = append(errs, fmt.Errorf("flows[%d]: %s calls %s; live mode's load generator does not name procedures", i, b, f.Call))
		}
		if f.Criticality != "" {
			errs = append(errs, fmt.Errorf("flows[%d]: %s sends criticality %s; live mode's load generator sends no criticality header", i, b, f.Criticality))
		}
		r, ok := seen[b]
		if !ok {
			seen[b] = f.Retry
		} else if !sameRetry(r, f.Retry) {
			errs = append(errs, fmt.Errorf("flows[%d]: %s: its flows retry differently; the retrying client keeps one retry policy per caller", i, b))
		}
		if f.Retry != nil {
			if total := retryTime(f.Retry); total > maxRetryTime {
				errs = append(errs, fmt.Errorf("flows[%d].retry: the backoffs add up to %v, more than the %v a request may wait for its retries before the load generator gives up on it", i, total, maxRetryTime))
			}
		}
	}
	if sc.Tenants != nil {
		// e2e's TestTenantLimitsAsProcesses runs tenants against the
		// binaries instead.
		errs = append(errs, errors.New("tenants: live mode's load generator does not send descriptor values"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w: %w", sc.Name, ErrUnsupported, err)
	}
	return nil
}

func sameRetry(a, b *sim.Retry) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// retryTime is the sum of a retry policy's backoffs.
func retryTime(r *sim.Retry) time.Duration {
	total, backoff := time.Duration(0), float64(r.Backoff)
	for range r.MaxRetries {
		total += time.Duration(backoff)
		backoff *= r.Multiplier
	}
	return total
}

// Scale returns sc shrunk by s: every rate (flows, limits, capacities,
// default limits) times s.Factor, at most s.Sidecars sidecars per service
// and zone, and deterministic arrivals, since the load generator paces its
// requests evenly rather than at random. Zone weights stay the scenario's,
// so that a flow lands in the same zones in the same proportions. The loop
// settings, events and targets are unchanged. sc is not modified.
func Scale(sc *sim.Scenario, s Scaling) (*sim.Scenario, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	out := *sc
	out.Arrivals = sim.Deterministic
	out.Services = make([]sim.Service, len(sc.Services))
	for i, svc := range sc.Services {
		out.Services[i] = sim.Service{Name: svc.Name, Sidecars: make([]int, len(svc.Sidecars))}
		for z, n := range svc.Sidecars {
			out.Services[i].Sidecars[z] = min(n, s.Sidecars)
		}
	}
	out.Flows = make([]sim.Flow, len(sc.Flows))
	for i, f := range sc.Flows {
		f.Weights = slices.Clone(f.Weights)
		f.Rate = scaleRate(f.Rate, s.Factor)
		out.Flows[i] = f
	}
	out.Limits = scaleLimits(sc.Limits, s.Factor)
	out.Events = slices.Clone(sc.Events)
	return &out, nil
}

func scaleRate(r sim.Rate, k float64) sim.Rate {
	r.Points = slices.Clone(r.Points)
	for i := range r.Points {
		r.Points[i].RPS *= k
	}
	r.Min *= k
	r.Max *= k
	return r
}

func scaleLimits(set *limits.Set, k float64) *limits.Set {
	services := map[string]*limits.Service{}
	for _, name := range set.Services() {
		svc := *set.Service(name)
		svc.Capacity *= k // +Inf stays +Inf
		svc.DefaultLimit *= k
		svc.Callers = make(map[string]limits.Bucket, len(svc.Callers))
		for caller, b := range set.Service(name).Callers {
			b.Limit *= k
			svc.Callers[caller] = b
		}
		services[name] = &svc
	}
	return limits.NewSet(services)
}

// LimitsFile renders set in the controller's limits-file format (see the
// README), which limits.Parse reads back to the same Set.
func LimitsFile(set *limits.Set) ([]byte, error) {
	type bucket struct {
		Limit float64 `yaml:"limit"`
		Mode  string  `yaml:"mode"`
	}
	type service struct {
		Capacity     *float64          `yaml:"capacity,omitempty"`
		DefaultLimit *float64          `yaml:"default_limit,omitempty"`
		Mode         string            `yaml:"mode"`
		FailMode     string            `yaml:"fail_mode,omitempty"`
		Callers      map[string]bucket `yaml:"callers,omitempty"`
	}
	finite := func(v float64) *float64 {
		if math.IsInf(v, 1) {
			return nil
		}
		return &v
	}
	doc := struct {
		Services map[string]service `yaml:"services"`
	}{Services: map[string]service{}}
	for _, name := range set.Services() {
		svc := set.Service(name)
		fs := service{
			Capacity:     finite(svc.Capacity),
			DefaultLimit: finite(svc.DefaultLimit),
			Mode:         svc.Mode.String(),
			FailMode:     svc.FailMode.String(),
			Callers:      map[string]bucket{},
		}
		for caller, b := range svc.Callers {
			if math.IsInf(b.Limit, 1) {
				return nil, fmt.Errorf("services.%s.callers.%s: an unbounded caller limit has no form in a limits file", name, caller)
			}
			fs.Callers[caller] = bucket{Limit: b.Limit, Mode: b.Mode.String()}
		}
		doc.Services[name] = fs
	}
	return yaml.Marshal(&doc)
}

// PeakRate is the highest total rate sc's flows offer in any traffic step,
// retries not included.
func PeakRate(sc *sim.Scenario) float64 {
	peak := 0.0
	for t := time.Duration(0); t < sc.Duration; t += sc.Step {
		sum := 0.0
		for _, f := range sc.Flows {
			sum += f.Rate.At(t)
		}
		peak = max(peak, sum)
	}
	return peak
}

// retryFactor is how many times its fresh rate a flow may offer at most,
// every retry included.
func retryFactor(sc *sim.Scenario) float64 {
	k := 1.0
	for _, f := range sc.Flows {
		if f.Retry != nil {
			k = max(k, float64(1+f.Retry.MaxRetries))
		}
	}
	return k
}
