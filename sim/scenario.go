package sim

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/duration"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/testkit/knee"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

// Arrivals says how requests arrive within a traffic step.
type Arrivals uint8

const (
	// Poisson draws each sidecar's arrivals per step from a Poisson
	// distribution with the flow's mean: real traffic's noise.
	Poisson Arrivals = iota
	// Deterministic sends exactly the mean, carrying fractions over to the
	// next step: no noise at all.
	Deterministic
)

func (a Arrivals) String() string {
	if a == Deterministic {
		return "deterministic"
	}
	return "poisson"
}

// Scenario is one simulation's input, parsed and checked. Treat it as read
// only: Run and the measures share it.
type Scenario struct {
	Name        string
	Description string
	Seed        uint64        // the default seed; Run takes the one to use
	Duration    time.Duration // a whole number of seconds
	Step        time.Duration // traffic step: arrivals are drawn and decided per sidecar per step; divides 1s
	Arrivals    Arrivals
	Loop        Loop
	Zones       []string  // in order; aggregators fail over to the next live zone in this order
	Services    []Service // the callees, sorted by name
	Limits      *limits.Set
	Flows       []Flow
	// Tenants, when set, is a population of tenants sending to one callee
	// with a descriptor limit (see Tenants).
	Tenants *Tenants
	Events  []Event // sorted by At, in file order at equal times
	Targets Targets
}

// Loop holds the settings of the production loop. Defaults are DESIGN.md's.
type Loop struct {
	ReportInterval time.Duration // sidecar → aggregator; default 1s
	// SurgeCheck is how often a sidecar checks its counters for a surge
	// between reports and reports one at once (the sidecar's
	// --surge-check); 0 or absent: a tenth of ReportInterval; negative:
	// never.
	SurgeCheck    time.Duration
	FlushInterval time.Duration // aggregator → controller; default 1s
	ReportDelay   time.Duration // network time of a report; default 0
	FlushDelay    time.Duration // network time of a zone load; default 0
	PushDelay     time.Duration // controller tick → policy applied at the sidecars; default 50ms
	FailoverDelay time.Duration // a sidecar's time to reach another aggregator after its own died; default 1s
	// AggregatorStaleAfter is the aggregators' --stale-after: report windows
	// a sidecar may miss before it leaves the sums. Default 3.
	AggregatorStaleAfter int
	// Controller is the controller's configuration: Tick and StateConfig
	// (stale-after, warm-up, policy TTL, republish threshold, and the law:
	// p_max, min rate, release rate). Default controller.DefaultConfig().
	Controller controller.Config
}

// Service is a callee and how many sidecars front it in each zone.
type Service struct {
	Name     string
	Sidecars []int // per zone, in Scenario.Zones order
	// Knee, when set, models the app behind each of the callee's sidecars
	// (issue #18): one instance per sidecar, with Workers workers that
	// serve a request each for Service and at most Queue more waiting, run
	// as a knee.Sim on the requests the sidecar admits. Its sidecars then
	// report what the model answered as the callee's health. Nil: the
	// callee answers nothing and its sidecars report no health.
	Knee *knee.Config
}

// Flow is the traffic of one caller to one callee. Several flows may share
// a bucket (callee, caller, procedure), e.g. to move traffic between zones
// or to send two paths of one route: their traffic adds up.
type Flow struct {
	Callee, Caller string
	// Call is what the flow's requests call, when the flow names it; the
	// zero Call names nothing, and the sidecar decides the request by its
	// caller alone (ServiceLimiter.Decide).
	Call Call
	// Leaf is the procedure of the flow's bucket, as the callee's limits
	// resolve Call: "" for a callee that declares no procedures (the whole
	// (callee, caller) pair), else a declared procedure or names.Other.
	Leaf string
	// Weights is the share of the flow's traffic each zone gets, in
	// Scenario.Zones order, summing to 1. Within a zone the traffic is
	// split evenly over the callee's sidecars.
	Weights []float64
	Rate    Rate
	Retry   *Retry // nil: dropped requests are not retried
	// Criticality is the tier header value the flow's requests carry
	// (issue #16), "CRITICAL_PLUS" to "SHEDDABLE"; "" sends none, and the
	// sidecar decides the flow with Decide, DecideHTTP or DecideGRPC as
	// before tiers. A flow with one is decided with the Tier variants.
	Criticality string
	// Cost is what the flow's requests cost at a callee whose limits count
	// cost (issue #16): a price in a request header, and what each one
	// really costs, reported by its response. Nil: the callee's limits
	// price them (a procedure's static cost, else the default).
	Cost *FlowCost
}

// Call is what a flow's requests call at their callee: a gRPC method
// (Procedure, decided by ServiceLimiter.DecideGRPC) or an HTTP request
// (Method and Path, decided by DecideHTTP); at most one of them.
type Call struct {
	Procedure    string // a gRPC full method, "/shop.Checkout/Pay"
	Method, Path string // an HTTP request: "POST", "/v1/charges"
}

// Named reports whether c names what the flow calls.
func (c Call) Named() bool { return c.Procedure != "" || c.Path != "" }

func (c Call) String() string {
	if c.Procedure != "" {
		return c.Procedure
	}
	return c.Method + " " + c.Path
}

// Retry is how clients retry dropped requests: attempt k (k = 1 for the
// first retry) goes Backoff·Multiplier^(k-1) after the drop, to the same
// sidecar, up to MaxRetries attempts.
type Retry struct {
	MaxRetries int
	Backoff    time.Duration
	Multiplier float64
}

// EventKind says what an Event does.
type EventKind uint8

const (
	// KillAggregator: the zone's aggregator dies. Its streams end, so the
	// controller drops its load at once and its sidecars fail over to the
	// next live zone's aggregator after Loop.FailoverDelay.
	KillAggregator EventKind = iota
	// RestartController: the controller dies and comes back Down later with
	// empty state; it warms up before it publishes again, and sidecars keep
	// their policies meanwhile.
	RestartController
	// Brownout: every modelled instance of Callee (Service.Knee) serves
	// with Knee's workers and service time from At for For (to the end of
	// the run if For is 0), then with its own again: a slow database, a
	// bad deploy, half the fleet's threads gone.
	Brownout
)

// Event is a failure injected at a time.
type Event struct {
	At   time.Duration
	Kind EventKind
	Zone string        // KillAggregator
	Down time.Duration // RestartController
	// Brownout: the callee, its instances' workers and service time
	// meanwhile (Queue is the callee's own), and for how long.
	Callee string
	Knee   knee.Config
	For    time.Duration
}

// End is when a brownout ends: At + For, or the run's end for a brownout
// that lasts.
func (e *Event) End(duration time.Duration) time.Duration {
	if e.For <= 0 || e.At+e.For > duration {
		return duration
	}
	return e.At + e.For
}

// Targets are goals a scenario's summary is checked against. They are
// reported as met or not, never enforced: the numbers are what they are.
// Nil fields are not checked.
type Targets struct {
	TimeToEnforce    *time.Duration // the slowest over-limit caller's time to enforce
	SteadyStateError *float64       // the worst over-limit caller's steady-state error, a fraction
	CollateralDrops  *float64       // bystanders' collateral drop rate, a fraction; met when below
}

// Callees returns the service names in order.
func (s *Scenario) Callees() []string {
	out := make([]string, len(s.Services))
	for i, svc := range s.Services {
		out[i] = svc.Name
	}
	return out
}

// Service returns the named callee, nil if the scenario has none.
func (s *Scenario) Service(name string) *Service {
	for i := range s.Services {
		if s.Services[i].Name == name {
			return &s.Services[i]
		}
	}
	return nil
}

// Sidecars returns the number of sidecars of all services in all zones.
func (s *Scenario) Sidecars() int {
	n := 0
	for _, svc := range s.Services {
		for _, c := range svc.Sidecars {
			n += c
		}
	}
	return n
}

// Buckets returns every (callee, caller, procedure) that has a flow,
// sorted.
func (s *Scenario) Buckets() []Bucket {
	seen := map[Bucket]bool{}
	var out []Bucket
	for _, f := range s.Flows {
		b := f.Bucket()
		if !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	slices.SortFunc(out, compareBuckets)
	return out
}

// HasProcedures reports whether a flow names what it calls: the summary,
// CSV and plot then name buckets by their leaf.
func (s *Scenario) HasProcedures() bool {
	for _, f := range s.Flows {
		if f.Call.Named() {
			return true
		}
	}
	return false
}

// Bucket returns the flow's bucket.
func (f *Flow) Bucket() Bucket { return Bucket{f.Callee, f.Caller, f.Leaf} }

// Bucket is one (callee, caller) pair or, for a callee that declares
// procedures, one (callee, caller, procedure) leaf.
type Bucket struct{ Callee, Caller, Procedure string }

// String is the bucket's path as the configurator names it: callee/caller,
// or callee/caller/procedure for a leaf.
func (b Bucket) String() string { return b.Callee + "/" + b.Leaf() }

// Leaf is the bucket without its callee: caller, or caller/procedure.
func (b Bucket) Leaf() string {
	if b.Procedure == "" {
		return b.Caller
	}
	return b.Caller + "/" + b.Procedure
}

func compareBuckets(a, b Bucket) int {
	return cmp.Or(strings.Compare(a.Callee, b.Callee), strings.Compare(a.Caller, b.Caller), strings.Compare(a.Procedure, b.Procedure))
}

// The YAML form. Pointers tell "absent" (take the default) from zero.
type fileScenario struct {
	Name        string                 `yaml:"name"`
	Description string                 `yaml:"description"`
	Seed        *uint64                `yaml:"seed"`
	Duration    *duration.Value        `yaml:"duration"`
	Step        *duration.Value        `yaml:"step"`
	Arrivals    string                 `yaml:"arrivals"`
	Loop        fileLoop               `yaml:"loop"`
	Zones       []string               `yaml:"zones"`
	Services    map[string]fileService `yaml:"services"`
	Limits      yaml.Node              `yaml:"limits"`
	Flows       []fileFlow             `yaml:"flows"`
	Tenants     *fileTenants           `yaml:"tenants"`
	Events      []fileEvent            `yaml:"events"`
	Targets     fileTargets            `yaml:"targets"`
}

type fileLoop struct {
	ReportInterval       *duration.Value `yaml:"report_interval"`
	SurgeCheck           *duration.Value `yaml:"surge_check"`
	FlushInterval        *duration.Value `yaml:"flush_interval"`
	Tick                 *duration.Value `yaml:"tick"`
	ReportDelay          *duration.Value `yaml:"report_delay"`
	FlushDelay           *duration.Value `yaml:"flush_delay"`
	PushDelay            *duration.Value `yaml:"push_delay"`
	FailoverDelay        *duration.Value `yaml:"failover_delay"`
	AggregatorStaleAfter *int            `yaml:"aggregator_stale_after"`
	ControllerStaleAfter *int            `yaml:"controller_stale_after"`
	Warmup               *duration.Value `yaml:"warmup"`
	PolicyTTL            *duration.Value `yaml:"policy_ttl"`
	RepublishThreshold   *float64        `yaml:"republish_threshold"`
	PMax                 *float64        `yaml:"p_max"`
	MinRate              *float64        `yaml:"min_rate"`
	ReleaseRate          *float64        `yaml:"release_rate"`
	MaxDescriptorValues  *int            `yaml:"max_descriptor_values"`
}

type fileService struct {
	Sidecars map[string]int `yaml:"sidecars"`
	Knee     *fileKnee      `yaml:"knee"`
}

type fileKnee struct {
	Workers *int            `yaml:"workers"`
	Service *duration.Value `yaml:"service"`
	Queue   *int            `yaml:"queue"`
}

type fileFlow struct {
	Callee    string             `yaml:"callee"`
	Caller    string             `yaml:"caller"`
	Procedure string             `yaml:"procedure"`
	Request   string             `yaml:"request"`
	Zones     map[string]float64 `yaml:"zones"`
	Rate      *fileRate          `yaml:"rate"`
	Retry     *fileRetry         `yaml:"retry"`
	// Criticality is the header value the flow's requests carry.
	Criticality string `yaml:"criticality"`
	// Cost is what its requests cost (FlowCost).
	Cost *fileFlowCost `yaml:"cost"`
}

type fileRate struct {
	Constant *float64     `yaml:"constant"`
	Steps    []filePoint  `yaml:"steps"`
	Ramp     []filePoint  `yaml:"ramp"`
	Diurnal  *fileDiurnal `yaml:"diurnal"`
}

type filePoint struct {
	At  *duration.Value `yaml:"at"`
	RPS *float64        `yaml:"rps"`
}

type fileDiurnal struct {
	Min    *float64        `yaml:"min"`
	Max    *float64        `yaml:"max"`
	PeakAt *duration.Value `yaml:"peak_at"`
	Period *duration.Value `yaml:"period"`
}

type fileRetry struct {
	MaxRetries *int            `yaml:"max_retries"`
	Backoff    *duration.Value `yaml:"backoff"`
	Multiplier *float64        `yaml:"multiplier"`
}

type fileEvent struct {
	At                *duration.Value `yaml:"at"`
	KillAggregator    string          `yaml:"kill_aggregator"`
	RestartController *fileRestart    `yaml:"restart_controller"`
	Brownout          *fileBrownout   `yaml:"brownout"`
}

type fileBrownout struct {
	Callee  string          `yaml:"callee"`
	Workers *int            `yaml:"workers"`
	Service *duration.Value `yaml:"service"`
	For     *duration.Value `yaml:"for"`
}

type fileRestart struct {
	Down *duration.Value `yaml:"down"`
}

type fileTargets struct {
	TimeToEnforce    *duration.Value `yaml:"time_to_enforce"`
	SteadyStateError *float64        `yaml:"steady_state_error"`
	CollateralDrops  *float64        `yaml:"collateral_drops"`
}

// Defaults that DESIGN.md does not name.
const (
	DefaultStep          = 10 * time.Millisecond
	DefaultPushDelay     = 50 * time.Millisecond
	DefaultFailoverDelay = time.Second
	DefaultSeed          = 1
)

// LoadFile reads and parses a scenario file. A scenario without a name takes
// the file's base name.
func LoadFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	sc, err := Parse(bytes.NewReader(data), strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// Parse reads a scenario. Unknown fields and values of the wrong type are
// errors naming their path and line, and every problem is reported at once.
// name is used when the document names none.
func Parse(r io.Reader, name string) (*Scenario, error) {
	var root yaml.Node
	if err := yaml.NewDecoder(r).Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty scenario")
		}
		return nil, fmt.Errorf("decode scenario: %w", err)
	}
	var errs []error
	checkNode(&root, reflect.TypeFor[fileScenario](), "", &errs)
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid scenario: %w", errors.Join(errs...))
	}
	var doc fileScenario
	if err := root.Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode scenario: %w", err)
	}
	if doc.Name == "" {
		doc.Name = name
	}
	sc, errs := doc.build()
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid scenario %s: %w", doc.Name, errors.Join(errs...))
	}
	return sc, nil
}

func (d *fileScenario) build() (*Scenario, []error) {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	sc := &Scenario{
		Name:        d.Name,
		Description: strings.TrimSpace(d.Description),
		Seed:        deref(d.Seed, DefaultSeed),
		Duration:    derefDuration(d.Duration, 0),
		Step:        derefDuration(d.Step, DefaultStep),
	}
	if err := names.Check(sc.Name); err != nil {
		bad("name", "%v", err)
	}
	if d.Duration == nil {
		bad("duration", "missing")
	} else if sc.Duration < time.Second || sc.Duration%time.Second != 0 {
		bad("duration", "%v is not a whole number of seconds, at least 1s", sc.Duration)
	}
	if sc.Step < time.Millisecond || time.Second%sc.Step != 0 {
		bad("step", "%v must be at least 1ms and divide 1s", sc.Step)
	}
	switch d.Arrivals {
	case "", "poisson":
		sc.Arrivals = Poisson
	case "deterministic":
		sc.Arrivals = Deterministic
	default:
		bad("arrivals", "%q is not poisson or deterministic", d.Arrivals)
	}

	// The loop.
	l := &d.Loop
	cfg := controller.DefaultConfig()
	cfg.ID = "sim"
	cfg.Tick = derefDuration(l.Tick, cfg.Tick)
	cfg.StaleAfter = deref(l.ControllerStaleAfter, cfg.StaleAfter)
	cfg.Warmup = derefDuration(l.Warmup, cfg.Warmup)
	cfg.PolicyTTL = derefDuration(l.PolicyTTL, cfg.PolicyTTL)
	cfg.RepublishThreshold = deref(l.RepublishThreshold, cfg.RepublishThreshold)
	cfg.Law.PMax = deref(l.PMax, cfg.Law.PMax)
	cfg.Law.MinRate = deref(l.MinRate, cfg.Law.MinRate)
	cfg.Law.ReleaseRate = deref(l.ReleaseRate, cfg.Law.ReleaseRate)
	cfg.MaxDescriptorValues = deref(l.MaxDescriptorValues, cfg.MaxDescriptorValues)
	report := derefDuration(l.ReportInterval, time.Second)
	sc.Loop = Loop{
		ReportInterval:       report,
		SurgeCheck:           derefDuration(l.SurgeCheck, 0),
		FlushInterval:        derefDuration(l.FlushInterval, time.Second),
		ReportDelay:          derefDuration(l.ReportDelay, 0),
		FlushDelay:           derefDuration(l.FlushDelay, 0),
		PushDelay:            derefDuration(l.PushDelay, DefaultPushDelay),
		FailoverDelay:        derefDuration(l.FailoverDelay, DefaultFailoverDelay),
		AggregatorStaleAfter: deref(l.AggregatorStaleAfter, 3),
		Controller:           cfg,
	}
	// The controller's own Validate names its flags (p-max); these name
	// the scenario's fields, with the same bounds.
	nerr := len(errs)
	if cfg.Tick < 10*time.Millisecond || cfg.Tick > time.Minute {
		bad("loop.tick", "%v is outside [10ms, 1m]", cfg.Tick)
	}
	if cfg.StaleAfter < 1 || cfg.StaleAfter > 100 {
		bad("loop.controller_stale_after", "%d is outside [1, 100]", cfg.StaleAfter)
	}
	if cfg.Warmup < 0 || cfg.Warmup > 10*time.Minute {
		bad("loop.warmup", "%v is outside [0, 10m]", cfg.Warmup)
	}
	if cfg.PolicyTTL < 2*cfg.Tick {
		bad("loop.policy_ttl", "%v must be at least two ticks (%v)", cfg.PolicyTTL, 2*cfg.Tick)
	}
	if !(cfg.RepublishThreshold >= 0 && cfg.RepublishThreshold < 1) {
		bad("loop.republish_threshold", "%v is outside [0, 1)", cfg.RepublishThreshold)
	}
	if !(cfg.Law.PMax > 0 && cfg.Law.PMax < 1) {
		bad("loop.p_max", "%v is outside (0, 1)", cfg.Law.PMax)
	}
	if !(cfg.Law.MinRate >= 0) || math.IsInf(cfg.Law.MinRate, 0) {
		bad("loop.min_rate", "%v must be a finite rate >= 0", cfg.Law.MinRate)
	}
	if !(cfg.Law.ReleaseRate > 1) || math.IsInf(cfg.Law.ReleaseRate, 0) {
		bad("loop.release_rate", "%v must be a finite factor > 1", cfg.Law.ReleaseRate)
	}
	if n := cfg.MaxDescriptorValues; n < 1 || n > controller.MaxDescriptorValuesBound {
		bad("loop.max_descriptor_values", "%d is outside [1, %d]", n, controller.MaxDescriptorValuesBound)
	}
	if err := cfg.Validate(); err != nil && len(errs) == nerr {
		bad("loop", "%v", err) // a bound this file does not know yet
	}
	if iv := sc.Loop.ReportInterval; iv < reporter.MinInterval || iv > reporter.MaxInterval {
		bad("loop.report_interval", "%v is outside [%v, %v]", iv, reporter.MinInterval, reporter.MaxInterval)
	}
	if sc.Loop.SurgeCheck == 0 { // as the sidecar's --surge-check: 0 is a tenth of the interval
		sc.Loop.SurgeCheck = reporter.DefaultSurgeCheck(report)
	}
	if c := sc.Loop.SurgeCheck; c > 0 && (c < reporter.MinInterval || c > sc.Loop.ReportInterval) {
		bad("loop.surge_check", "%v is outside [%v, report_interval %v]; negative for none", c, reporter.MinInterval, sc.Loop.ReportInterval)
	}
	if iv := sc.Loop.FlushInterval; iv < 10*time.Millisecond || iv > time.Minute {
		bad("loop.flush_interval", "%v is outside [10ms, 1m]", iv)
	}
	for _, f := range []struct {
		path string
		v    time.Duration
	}{
		{"loop.report_delay", sc.Loop.ReportDelay}, {"loop.flush_delay", sc.Loop.FlushDelay},
		{"loop.push_delay", sc.Loop.PushDelay}, {"loop.failover_delay", sc.Loop.FailoverDelay},
	} {
		if f.v < 0 {
			bad(f.path, "%v is negative", f.v)
		}
	}
	if n := sc.Loop.AggregatorStaleAfter; n < 1 || n > 100 {
		bad("loop.aggregator_stale_after", "%d is outside [1, 100]", n)
	}

	// Zones and services.
	zoneIndex := map[string]int{}
	if len(d.Zones) == 0 {
		bad("zones", "at least one zone is required")
	}
	for i, z := range d.Zones {
		path := fmt.Sprintf("zones[%d]", i)
		if err := names.Check(z); err != nil {
			bad(path, "%v", err)
		} else if _, dup := zoneIndex[z]; dup {
			bad(path, "%q is listed twice", z)
		}
		zoneIndex[z] = i
	}
	sc.Zones = d.Zones
	if len(d.Services) == 0 {
		bad("services", "at least one service is required")
	}
	for _, name := range slices.Sorted(maps.Keys(d.Services)) {
		path := "services." + name
		if err := names.Check(name); err != nil || name == names.Overflow {
			bad(path, "invalid service name: %v", errOr(err, "reserved"))
		}
		svc := Service{Name: name, Sidecars: make([]int, len(d.Zones))}
		total := 0
		for _, z := range slices.Sorted(maps.Keys(d.Services[name].Sidecars)) {
			n := d.Services[name].Sidecars[z]
			i, ok := zoneIndex[z]
			switch {
			case !ok:
				bad(path+".sidecars."+z, "no such zone; zones are %s", strings.Join(d.Zones, ", "))
			case n < 0 || n > 100000:
				bad(path+".sidecars."+z, "%d is outside [0, 100000]", n)
			default:
				svc.Sidecars[i] = n
				total += n
			}
		}
		if total == 0 {
			bad(path+".sidecars", "no sidecars in any zone")
		}
		if fk := d.Services[name].Knee; fk != nil {
			svc.Knee = buildKnee(fk, path+".knee", bad)
		}
		sc.Services = append(sc.Services, svc)
	}

	// Limits: the controller's limits-file format, parsed by its parser.
	sc.Limits = limits.Empty
	if !d.Limits.IsZero() {
		data, err := yaml.Marshal(&d.Limits)
		if err == nil {
			sc.Limits, err = limits.Parse(bytes.NewReader(data))
		}
		if err != nil {
			bad("limits", "%v", err)
			sc.Limits = limits.Empty
		}
		for _, name := range sc.Limits.Services() {
			if sc.Service(name) == nil {
				bad("limits.services."+name, "no such service in services")
			}
		}
	}

	// Flows.
	if len(d.Flows) == 0 && d.Tenants == nil {
		bad("flows", "at least one flow (or tenants) is required")
	}
	for i, ff := range d.Flows {
		path := fmt.Sprintf("flows[%d]", i)
		f := Flow{Callee: ff.Callee, Caller: ff.Caller}
		svc := sc.Service(ff.Callee)
		if ff.Callee == "" {
			bad(path+".callee", "missing")
		} else if svc == nil {
			bad(path+".callee", "%q is not in services", ff.Callee)
		}
		if err := names.Check(ff.Caller); err != nil || ff.Caller == names.Overflow || ff.Caller == names.Unknown {
			bad(path+".caller", "invalid caller name: %v", errOr(err, "reserved"))
		}
		if svc != nil {
			f.Weights = weights(ff.Zones, svc, d.Zones, zoneIndex, path+".zones", bad)
			f.Call, f.Leaf = buildCall(&ff, sc.Limits.Service(ff.Callee), path, bad)
		}
		if ff.Rate == nil {
			bad(path+".rate", "missing")
		} else {
			f.Rate = buildRate(ff.Rate, path+".rate", bad)
		}
		if ff.Retry != nil {
			f.Retry = buildRetry(ff.Retry, sc.Step, path+".retry", bad)
		}
		if ff.Criticality != "" {
			if _, err := criticality.ParseConfig(ff.Criticality); err != nil {
				bad(path+".criticality", "flow %s→%s: %v", ff.Caller, ff.Callee, err)
			} else if svc != nil && !sc.Limits.Service(ff.Callee).Tiered() {
				bad(path+".criticality", "flow %s→%s: callee %s declares no criticality in its limits", ff.Caller, ff.Callee, ff.Callee)
			} else {
				f.Criticality = ff.Criticality
			}
		}
		if ff.Cost != nil || (svc != nil && sc.Limits.Service(ff.Callee).Counted()) {
			f.Cost = buildFlowCost(ff.Cost, sc.Limits.Service(ff.Callee), f.Criticality != "", path+".cost", bad)
		}
		sc.Flows = append(sc.Flows, f)
	}

	if d.Tenants != nil {
		sc.Tenants = d.Tenants.build(sc, bad)
	}

	// Events.
	for i, fe := range d.Events {
		path := fmt.Sprintf("events[%d]", i)
		var e Event
		if fe.At == nil {
			bad(path+".at", "missing")
		} else {
			e.At = time.Duration(*fe.At)
			if e.At < 0 || e.At >= sc.Duration {
				bad(path+".at", "%v is outside the run [0, %v)", e.At, sc.Duration)
			}
		}
		actions := 0
		if fe.KillAggregator != "" {
			actions++
			e.Kind, e.Zone = KillAggregator, fe.KillAggregator
			if _, ok := zoneIndex[fe.KillAggregator]; !ok {
				bad(path+".kill_aggregator", "%q is not a zone", fe.KillAggregator)
			}
		}
		if fe.RestartController != nil {
			actions++
			e.Kind = RestartController
			e.Down = derefDuration(fe.RestartController.Down, 0)
			if e.Down < 0 {
				bad(path+".restart_controller.down", "%v is negative", e.Down)
			}
		}
		if fb := fe.Brownout; fb != nil {
			actions++
			e.Kind = Brownout
			sc.buildBrownout(&e, fb, path+".brownout", bad)
		}
		if actions != 1 {
			bad(path, "needs exactly one of kill_aggregator, restart_controller, brownout")
		}
		sc.Events = append(sc.Events, e)
	}
	slices.SortStableFunc(sc.Events, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	sc.checkModels(bad)

	// Targets.
	t := d.Targets
	sc.Targets = Targets{TimeToEnforce: (*time.Duration)(t.TimeToEnforce), SteadyStateError: t.SteadyStateError, CollateralDrops: t.CollateralDrops}
	if t.TimeToEnforce != nil && *t.TimeToEnforce < 0 {
		bad("targets.time_to_enforce", "%v is negative", *t.TimeToEnforce)
	}
	for _, f := range []struct {
		path string
		v    *float64
	}{{"targets.steady_state_error", t.SteadyStateError}, {"targets.collateral_drops", t.CollateralDrops}} {
		if f.v != nil && !(*f.v >= 0 && *f.v <= 1) {
			bad(f.path, "%v is not a fraction in [0, 1]", *f.v)
		}
	}
	return sc, errs
}

// weights turns a flow's zone weights into shares per zone. Absent weights
// follow the callee's sidecars: every sidecar gets the same traffic.
func weights(m map[string]float64, svc *Service, zones []string, zoneIndex map[string]int, path string, bad func(string, string, ...any)) []float64 {
	w := make([]float64, len(zones))
	if len(m) == 0 {
		for i, n := range svc.Sidecars {
			w[i] = float64(n)
		}
	} else {
		for _, z := range slices.Sorted(maps.Keys(m)) {
			i, ok := zoneIndex[z]
			v := m[z]
			switch {
			case !ok:
				bad(path+"."+z, "no such zone; zones are %s", strings.Join(zones, ", "))
			case !(v >= 0) || math.IsInf(v, 0):
				bad(path+"."+z, "%v is not a finite weight >= 0", v)
			case v > 0 && svc.Sidecars[i] == 0:
				bad(path+"."+z, "service %s has no sidecars in zone %s", svc.Name, z)
			default:
				w[i] = v
			}
		}
	}
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	if !(sum > 0) {
		bad(path, "the weights add up to 0")
		return w
	}
	for i := range w {
		w[i] /= sum
	}
	return w
}

func buildRate(fr *fileRate, path string, bad func(string, string, ...any)) Rate {
	kinds := 0
	var r Rate
	rps := func(p string, v *float64) float64 {
		if v == nil {
			bad(p, "missing")
			return 0
		}
		if !(*v >= 0) || math.IsInf(*v, 0) || *v > 1e9 {
			bad(p, "%v is not a rate in [0, 1e9]", *v)
			return 0
		}
		return *v
	}
	if fr.Constant != nil {
		kinds++
		r = ConstantRate(rps(path+".constant", fr.Constant))
	}
	for _, k := range []struct {
		kind   RateKind
		name   string
		points []filePoint
	}{{Steps, "steps", fr.Steps}, {Ramp, "ramp", fr.Ramp}} {
		if k.points == nil {
			continue
		}
		kinds++
		r = Rate{Kind: k.kind}
		if len(k.points) == 0 {
			bad(path+"."+k.name, "at least one point is required")
		}
		for i, fp := range k.points {
			p := fmt.Sprintf("%s.%s[%d]", path, k.name, i)
			pt := Point{RPS: rps(p+".rps", fp.RPS)}
			if fp.At == nil {
				bad(p+".at", "missing")
			} else {
				pt.At = time.Duration(*fp.At)
				if pt.At < 0 {
					bad(p+".at", "%v is negative", pt.At)
				}
				if i > 0 && fp.At != nil && pt.At <= r.Points[i-1].At {
					bad(p+".at", "%v is not after the previous point's %v", pt.At, r.Points[i-1].At)
				}
			}
			r.Points = append(r.Points, pt)
		}
	}
	if fd := fr.Diurnal; fd != nil {
		kinds++
		r = Rate{
			Kind:   Diurnal,
			Min:    rps(path+".diurnal.min", fd.Min),
			Max:    rps(path+".diurnal.max", fd.Max),
			PeakAt: derefDuration(fd.PeakAt, 0),
			Period: derefDuration(fd.Period, 24*time.Hour),
		}
		if r.Min > r.Max {
			bad(path+".diurnal", "min %v is above max %v", r.Min, r.Max)
		}
		if r.Period <= 0 {
			bad(path+".diurnal.period", "%v is not positive", r.Period)
		}
	}
	if kinds != 1 {
		bad(path, "needs exactly one of constant, steps, ramp, diurnal; has %d", kinds)
	}
	return r
}

func buildRetry(fr *fileRetry, step time.Duration, path string, bad func(string, string, ...any)) *Retry {
	r := &Retry{
		MaxRetries: deref(fr.MaxRetries, 0),
		Backoff:    derefDuration(fr.Backoff, 0),
		Multiplier: deref(fr.Multiplier, 2),
	}
	if fr.MaxRetries == nil {
		bad(path+".max_retries", "missing")
	} else if r.MaxRetries < 1 || r.MaxRetries > 10 {
		bad(path+".max_retries", "%d is outside [1, 10]", r.MaxRetries)
	}
	if fr.Backoff == nil {
		bad(path+".backoff", "missing")
	} else if r.Backoff < step || r.Backoff > time.Minute {
		bad(path+".backoff", "%v is outside [step %v, 1m]", r.Backoff, step)
	}
	if !(r.Multiplier >= 1 && r.Multiplier <= 10) {
		bad(path+".multiplier", "%v is outside [1, 10]", r.Multiplier)
	}
	return r
}

// derefDuration is *p read as a time.Duration, or def when p is nil.
func derefDuration(p *duration.Value, def time.Duration) time.Duration {
	if p == nil {
		return def
	}
	return time.Duration(*p)
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}
