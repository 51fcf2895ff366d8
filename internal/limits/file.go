package limits

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// fileDoc is the YAML form of a limits file:
//
//	services:
//	  checkout:
//	    capacity: 1000       # rps shared by all callers (optional)
//	    default_limit: 200   # rps per caller without a limit of its own (optional)
//	    mode: enforce        # enforce | shadow (default enforce)
//	    fail_mode: open      # open | hold | local (default open)
//	    enforcement: sidecar # sidecar | upstream: the callers' default (default sidecar)
//	    callers:
//	      web:   {limit: 100}
//	      batch: {limit: 50, mode: shadow}
//	      app:   {limit: 80, enforcement: upstream} # a proxyless gRPC client
//	      bulk:  {limit: 1000, burst: 2000, payback: 10s} # see below
//	  payments:
//	    capacity: 500
//	    callers:
//	      web: {limit: 100}  # across all of payments' procedures
//	    routes:              # HTTP, first match wins; no match: _other
//	      - {route: "POST /v1/charges", procedure: create-charge}
//	      - {route: "GET /v1/charges/{id}", procedure: get-charge}
//	    procedures:
//	      create-charge:
//	        capacity: 200          # shared by all callers of the procedure
//	        callers:
//	          web: {limit: 50}     # the (web, create-charge) leaf
//	      /pay.Payments/Refund: {capacity: 50} # gRPC: declared by its full method
//	      _other: {capacity: 20}
//	  api:
//	    descriptors:           # limits per value (issue #15), at most 4
//	      tenant:
//	        from: header x-tenant-id # or "client-ip", or "xff 1"
//	        limit: 50          # rps per value, globally; required; 0 blocks
//	        missing: 10        # rps of requests without it; default: limit
//	        quantile: 0.95     # the local allowance's (pkg/allowance)
//	        overrides: {acme: 500}
//	  ledger:
//	    capacity: 10000
//	    criticality:           # tiers: shed the least critical first
//	      from: header x-sluice-criticality # the default
//	      default: CRITICAL    # of a request without a valid header (default CRITICAL)
//	      max: CRITICAL        # the highest tier a caller may claim (default CRITICAL)
//	    callers:
//	      web:   {limit: 6000, criticality: CRITICAL, max_criticality: CRITICAL_PLUS}
//	      batch: {limit: 8000, criticality: SHEDDABLE}
//	  llm:
//	    unit: cost             # limits, capacities, rates in cost units per second (default requests)
//	    capacity: 20000
//	    cost:
//	      default: 1           # a request nothing else prices (default 1)
//	      from: header x-sluice-request-cost # optional: a request header the callee trusts
//	      response: x-sluice-cost # optional: the app reports the real cost in this header or trailer
//	      max: 1000000         # a larger cost is clamped to it (default 1e6)
//	    callers:
//	      chat: {limit: 5000, max_concurrency: 40} # requests in flight, global; any unit
//	    procedures:
//	      /llm.Chat/Complete: {cost: 10} # a static cost per procedure
//	  search:
//	    slo:                   # capacity estimated from the callee's health (issue #18)
//	      latency_p99: 200ms   # over the fleet's answers (optional)
//	      errors: 1%           # failed or timed out (optional; one of the two at least)
//	    routes:
//	      - {route: "GET /v1/search", procedure: query}
//	    procedures:
//	      query:
//	        slo: {latency_p99: 100ms} # the procedure's own: its estimate caps its callers' share
//
// A service declares procedures by its routes and by the keys of its
// procedures; its requests then fall in (caller, procedure) leaves (see
// Service.Declared). A service that declares none is as before procedures
// existed: one bucket per caller.
//
// enforcement: upstream says that the bucket's ratio is carried out before
// its requests reach the callee's sidecar, by the caller's proxyless gRPC
// client or the callee's Envoy; the service-level value is the default of
// its callers but unknown and _overflow, which must name it themselves.
// A service with descriptors, tiers or unit: cost can not be enforced
// upstream, nor a bucket with max_concurrency: only the callee's own
// sidecars decide a request's descriptors and tier, price it and count it
// in flight. max_concurrency (a positive integer) caps a caller's or a
// leaf's requests in flight at the callee, globally, in any unit.
//
// burst: N (requests, or cost units for a callee counting cost) lets a
// caller admit up to N above its limit after a quiet period: the
// controller keeps a token bucket per caller that fills at its limit
// less what it admitted, up to N, and raises the limit it gives the law
// by the tokens it holds (dropratio.LevelStep). The default, 0, is the
// tightest edge: a limit that says nothing about bursts must not let an
// unannounced burst through to a fragile callee. payback: D (a duration
// up to 1h) pays back what the caller admitted above its limit over D,
// by lowering its limit meanwhile, so that the admitted total over a
// window meets the limit; off (0) by default for a callee counting
// requests, while a callee counting cost pays back over the
// controller's --cost-payback unless the caller names its own. Both need
// the caller's own limit, and are not yet given to a caller of a callee
// with procedures.
type fileDoc struct {
	Services map[string]fileService `yaml:"services"`
}

// Settings are read as strings and parsed by their types' own parsers
// (see setting), not by the YAML decoder, so that every bad value is reported,
// with its path, at once.
type fileService struct {
	Capacity     *float64              `yaml:"capacity"`
	DefaultLimit *float64              `yaml:"default_limit"`
	Mode         string                `yaml:"mode"`
	FailMode     string                `yaml:"fail_mode"`
	Enforcement  string                `yaml:"enforcement"`
	Callers      map[string]fileBucket `yaml:"callers"`

	// omitempty: a service without procedures is written as it was
	// before them.
	Routes     []fileRoute              `yaml:"routes,omitempty"`
	Procedures map[string]fileProcedure `yaml:"procedures,omitempty"`
	// Descriptors are the service's descriptor limits (fileDescriptor).
	Descriptors map[string]fileDescriptor `yaml:"descriptors,omitempty"`
	// Criticality declares the service's tiers (fileCriticality).
	Criticality *fileCriticality `yaml:"criticality,omitempty"`
	// Unit is "requests" or "cost"; Cost prices requests (fileCost).
	Unit string    `yaml:"unit,omitempty"`
	Cost *fileCost `yaml:"cost,omitempty"`
	// SLO is the service's objective, from which the controller
	// estimates its capacity (fileSLO).
	SLO *fileSLO `yaml:"slo,omitempty"`
}

type fileRoute struct {
	Route     string `yaml:"route"`
	Procedure string `yaml:"procedure"`
	line      int    // of the entry, for CompileRoutes' errors
}

type fileProcedure struct {
	Capacity *float64            `yaml:"capacity"`
	Callers  map[string]fileLeaf `yaml:"callers"`
	// Criticality is the procedure's default tier, over the caller's and
	// the service's.
	Criticality string `yaml:"criticality,omitempty"`
	// Cost is the procedure's static cost, in a service counting cost.
	Cost *float64 `yaml:"cost,omitempty"`
	// SLO is the procedure's own objective (fileSLO).
	SLO *fileSLO `yaml:"slo,omitempty"`
}

// fileLeaf is the limit and cap of a (caller, procedure) leaf.
type fileLeaf struct {
	Limit          *float64 `yaml:"limit"`
	MaxConcurrency *float64 `yaml:"max_concurrency,omitempty"`
}

type fileBucket struct {
	Limit       *float64 `yaml:"limit"`
	Mode        string   `yaml:"mode"`
	Enforcement string   `yaml:"enforcement"`
	// Criticality is the caller's default tier, MaxCriticality the
	// highest it may claim; both only in a service with tiers.
	Criticality    string `yaml:"criticality,omitempty"`
	MaxCriticality string `yaml:"max_criticality,omitempty"`
	// MaxConcurrency caps the caller's requests in flight, globally.
	MaxConcurrency *float64 `yaml:"max_concurrency,omitempty"`
	// Burst is how far above its limit the caller may go after a quiet
	// period, in requests or cost units; Payback the window over which
	// it pays back what it admitted above it (a duration).
	Burst   *float64 `yaml:"burst,omitempty"`
	Payback string   `yaml:"payback,omitempty"`
}

// Parse reads a limits document. Unknown fields are errors, and every problem
// is reported at once, each with its path (services.checkout.callers.web.limit).
func Parse(r io.Reader) (*Set, error) { return ParseContext(context.Background(), r) }

// ParseContext is Parse, stopped with ctx's error when ctx is done: a
// large file must not hold up a process told to stop. Its work is linear
// in the document's size.
func ParseContext(ctx context.Context, r io.Reader) (*Set, error) {
	var root yaml.Node
	if err := yaml.NewDecoder(ctxReader{ctx, r}).Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read limits: %w", ctx.Err())
		}
		return nil, fmt.Errorf("decode limits: %w", err)
	}
	b := &builder{ctx: ctx}
	nodes := nullKeys(&root, "", &b.errs)
	d := newDecoder(ctx, nodes)
	doc := d.document(&root)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("read limits: %w", ctx.Err())
	}
	if len(d.errs) > 0 {
		return nil, fmt.Errorf("decode limits: %w", errors.Join(d.errs...))
	}
	services := make(map[string]*Service, len(doc.Services))
	for _, name := range slices.Sorted(maps.Keys(doc.Services)) {
		services[name] = b.service(name, doc.Services[name])
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read limits: %w", ctx.Err())
		}
	}
	if len(b.errs) > 0 {
		return nil, fmt.Errorf("invalid limits: %w", errors.Join(b.errs...))
	}
	set := NewSet(services)
	set.warnings = b.warnings()
	return set, nil
}

// builder turns a decoded fileDoc into Services, collecting every problem
// (errs) and every limit that is legal but surely wrong (warns).
type builder struct {
	ctx    context.Context
	steps  int
	errs   []error
	warns  []string
	warned int // warnings found, kept or not
}

// stopped pays for one step of the build and reports whether ctx is
// done, which it looks at every cancelEvery steps.
func (b *builder) stopped() bool {
	b.steps++
	return b.steps%cancelEvery == 0 && b.ctx.Err() != nil
}

// maxWarnings bounds the warnings a Set keeps: a file of 200,000 callers
// must not log 200,000 lines.
const maxWarnings = 100

func (b *builder) warnf(format string, args ...any) {
	if b.warned++; b.warned <= maxWarnings {
		b.warns = append(b.warns, fmt.Sprintf(format, args...))
	}
}

func (b *builder) warnings() []string {
	if n := b.warned - len(b.warns); n > 0 {
		return append(b.warns, fmt.Sprintf("and %d more warnings", n))
	}
	return b.warns
}

// service builds the limits of the service name from its file form.
func (b *builder) service(name string, fs fileService) *Service {
	path := "services." + name
	if err := names.Check(name); err != nil || name == names.Overflow {
		b.errs = append(b.errs, fmt.Errorf("%s: invalid service name: %v", path, errOr(err, "reserved")))
	}
	svc := &Service{
		Name:         name,
		Capacity:     rate(path+".capacity", fs.Capacity, &b.errs),
		DefaultLimit: rate(path+".default_limit", fs.DefaultLimit, &b.errs),
		Mode:         setting(path+".mode", fs.Mode, dropratio.ParseMode, dropratio.Enforce, &b.errs),
		FailMode:     setting(path+".fail_mode", fs.FailMode, dataplane.ParseFailMode, dataplane.FailOpen, &b.errs),
		Enforcement:  setting(path+".enforcement", fs.Enforcement, dataplane.ParseEnforcement, dataplane.EnforceSidecar, &b.errs),
		Callers:      make(map[string]Bucket, len(fs.Callers)),
	}
	b.procedures(svc, fs, path)
	b.descriptors(svc, fs.Descriptors, path)
	b.criticality(svc, fs, path)
	b.cost(svc, fs, path)
	b.slo(svc, fs, path)
	upErr := upstreamErr(svc)
	if upErr != nil && svc.Enforcement == dataplane.EnforceUpstream {
		b.errs = append(b.errs, fmt.Errorf("%s.enforcement: %w", path, upErr))
	}
	for _, caller := range slices.Sorted(maps.Keys(fs.Callers)) {
		if b.stopped() {
			return svc
		}
		fb := fs.Callers[caller]
		cpath := path + ".callers." + caller
		if err := names.Check(caller); err != nil {
			b.errs = append(b.errs, fmt.Errorf("%s: invalid caller name: %v", cpath, err))
		}
		// A caller listed for its cap alone keeps the default limit.
		limit := svc.DefaultLimit
		if fb.Limit != nil || fb.MaxConcurrency == nil {
			if fb.Limit == nil {
				b.errs = append(b.errs, fmt.Errorf("%s.limit: missing", cpath))
			}
			limit = rate(cpath+".limit", fb.Limit, &b.errs)
		}
		bucket := Bucket{
			Limit:       limit,
			Mode:        setting(cpath+".mode", fb.Mode, dropratio.ParseMode, svc.Mode, &b.errs),
			Enforcement: setting(cpath+".enforcement", fb.Enforcement, dataplane.ParseEnforcement, svc.callerEnforcement(caller), &b.errs),
		}
		bucket.MaxConcurrency = b.maxConcurrency(cpath+".max_concurrency", fb.MaxConcurrency, bucket.Enforcement)
		bucket.Burst, bucket.Payback = b.burst(svc, cpath, fb)
		// Only where the caller names it: one inherited from the service
		// is the service's error.
		if upErr != nil && fb.Enforcement != "" && bucket.Enforcement == dataplane.EnforceUpstream {
			b.errs = append(b.errs, fmt.Errorf("%s.enforcement: %w", cpath, upErr))
		}
		svc.Callers[caller] = bucket
		b.callerCriticality(svc, caller, fb, cpath)
	}
	b.leafCapsUpstream(svc, path)
	b.warnProcedures(svc)
	return svc
}

// nullKeys reports every mapping key under n that YAML reads as null (~,
// null, Null, NULL, or no key at all), and returns how many nodes n holds,
// aliases unexpanded. Decoding drops such entries without a word, and
// "null" is a valid service name: its limit would silently not exist.
func nullKeys(n *yaml.Node, path string, errs *[]error) int {
	nodes := 1
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			nodes += nullKeys(c, path, errs)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.ShortTag() == "!!null" {
				nodes++
				*errs = append(*errs, fmt.Errorf("%s: line %d: key %q reads as null in YAML; quote it if it is a name",
					cmp.Or(path, "(top level)"), k.Line, k.Value))
				continue
			}
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			nodes += 1 + nullKeys(n.Content[i+1], p, errs)
		}
	}
	return nodes
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}

// rate turns an optional YAML number into a rate, +Inf when absent.
func rate(path string, v *float64, errs *[]error) float64 {
	if v == nil {
		return math.Inf(1)
	}
	if math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0 {
		*errs = append(*errs, fmt.Errorf("%s: %v is not a finite rate >= 0", path, *v))
		return math.Inf(1)
	}
	return *v
}

// setting reads an optional setting with the parser of its type: def when
// it is absent (the empty string), else its value, and an error naming its
// path for anything the type does not spell, never a silent default.
func setting[T any](path, s string, parse func(string) (T, error), def T, errs *[]error) T {
	if s == "" {
		return def
	}
	v, err := parse(s)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", path, err))
		return def
	}
	return v
}

// File is a Source backed by a YAML file that it re-reads when the file
// changes. A file that turns invalid is logged and counted, and the last good
// limits stay in force.
type File struct {
	path     string
	interval time.Duration
	logger   *slog.Logger
	current  atomic.Pointer[Set]
	last     []byte // contents of the last load attempt; owned by Run

	// OnReload, when set before Run, is told the outcome of every reload
	// attempt (nil error for success), for metrics; after a success, once
	// the new limits are in force.
	OnReload func(error)
}

// LoadFile reads path once and returns a File that Run keeps current, polling
// every interval. An invalid file is an error here, at start-up, and so is
// ctx ending before it is read (the process was told to stop).
func LoadFile(ctx context.Context, path string, interval time.Duration, logger *slog.Logger) (*File, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read limits: %w", err)
	}
	set, err := ParseContext(ctx, bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f := &File{path: path, interval: interval, logger: logger, last: data}
	f.warn(set)
	f.current.Store(set)
	return f, nil
}

// warn logs set's warnings, each once per load of the file.
func (f *File) warn(set *Set) {
	for _, w := range set.Warnings() {
		f.logger.Warn("limits file: a limit is surely not what was meant", "path", f.path, "warning", w)
	}
}

// Limits returns the last good limits.
func (f *File) Limits() *Set { return f.current.Load() }

// Run re-reads the file every interval until ctx is cancelled. Polling the
// contents, not inotify, also sees ConfigMap updates, which swap a symlink.
func (f *File) Run(ctx context.Context) error {
	if f.interval <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			f.reload(ctx)
		}
	}
}

func (f *File) reload(ctx context.Context) {
	data, err := os.ReadFile(f.path)
	if err == nil && bytes.Equal(data, f.last) {
		return
	}
	if err == nil && len(data) == 0 {
		// Most likely caught between a writer's truncate and its write;
		// an empty file would otherwise remove every limit. Removing all
		// limits on purpose is `services: {}`.
		f.logger.Debug("limits file empty; waiting for its contents", "path", f.path)
		return
	}
	var set *Set
	if err == nil {
		set, err = ParseContext(ctx, bytes.NewReader(data))
	}
	if ctx.Err() != nil {
		return // stopping: the contents were not judged, so they are not remembered
	}
	if data != nil {
		// Remember bad contents too, so that one bad edit is reported once,
		// not on every poll until someone fixes it.
		f.last = data
	}
	if err != nil {
		f.logger.Error("limits file invalid; keeping the last good limits", "path", f.path, "err", err)
	} else {
		f.warn(set)
		f.current.Store(set)
		f.logger.Info("limits reloaded", "path", f.path, "services", set.Len())
	}
	// Told last, so that whoever hears of a good reload reads its limits.
	if f.OnReload != nil {
		f.OnReload(err)
	}
}
