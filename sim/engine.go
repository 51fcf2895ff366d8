package sim

import (
	"container/heap"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/ticker"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

// Epoch is the virtual wall-clock time at which every run starts: the
// production code sees timestamps from here on.
var Epoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// Bin is the width of one entry of a BucketSeries.
const Bin = time.Second

// zoomBin is the width of a Zoom's entries, unless the traffic step is
// longer.
const zoomBin = 100 * time.Millisecond

// Options tune a run without changing what it computes.
type Options struct {
	// Progress, when set, is called after every simulated second with the
	// simulated time done and the run's duration.
	Progress func(done, total time.Duration)
}

// Result is what one run produced. Everything in it is a function of the
// scenario and the seed.
type Result struct {
	Scenario *Scenario
	Seed     uint64
	// Buckets holds the per-second series of every bucket (callee, caller,
	// procedure) that has a flow, sorted by callee, caller and procedure.
	Buckets []BucketSeries
	// Pipelines follows, for every bucket whose nominal rate goes over its
	// allowed rate, its first over-limit episode through the loop.
	Pipelines    []Pipeline
	ControlPlane ControlPlane
	FastPath     FastPath
	// Timeline lists what happened to the loop: failures, failovers,
	// warm-ups, policies expiring. Times are since the start.
	Timeline []Happening
	// Expiries lists every stretch in which a callee's sidecars held an
	// expired policy, in order: its fail mode was in force.
	Expiries []Expiry
	// Flows holds the per-second series of every flow that carries a
	// criticality, in scenario order; nil when none does.
	Flows []FlowSeries
	// Decisions is the number of Decide calls the run made for the flows.
	Decisions int64
	// Tenants is the run's tenant traffic and its oracle's counts; nil
	// when the scenario has none.
	Tenants *TenantResult
	// Capacities holds, per modelled callee (Service.Knee), in scenario
	// order, its knee and what the controller estimated of it; nil when
	// none is modelled.
	Capacities []CapacitySeries
}

// Expiry is a stretch of time in which a callee's sidecars held an expired
// policy: the controller had been silent for its TTL, and its fail mode was
// in force.
type Expiry struct {
	Callee   string
	FailMode string        // open, hold or local
	TTL      time.Duration // the expired policy's
	// LiveInstances is the expired policy's: local's token buckets divide
	// a caller's limit by it.
	LiveInstances int
	// From is when the first sidecar's policy expired; To when every one
	// held a fresh policy again, or the run's duration if they did not.
	From, To time.Duration
}

// Happening is one line of a Result's timeline.
type Happening struct {
	At   time.Duration
	What string
	// Callee is the callee it concerns, whose panel of the plot labels it;
	// empty for the whole loop.
	Callee string
}

// BucketSeries is one bucket's time series, one entry per Bin. Rates are in
// requests per second. Live mode fills the same type from its load
// generator, so that Measure treats both modes alike.
type BucketSeries struct {
	Callee, Caller string
	// Procedure is the leaf's procedure at a callee that declares
	// procedures (a declared one or names.Other), "" for the whole
	// (callee, caller) pair.
	Procedure string
	Shadow    bool // the caller's limit is in shadow mode: never dropped
	// Limit is the configured limit: the caller's for a pair; for a leaf
	// the lower of its own limit and its caller's across procedures, the
	// most it may send whatever the others do. +Inf: none.
	Limit float64
	// Nominal is the scenario's offered rate for the bin (its rate
	// functions averaged over the bin): demand without noise or retries.
	// Measure uses it to tell a change of demand from noise; nil means
	// Offered stands in for it.
	Nominal  []float64
	Offered  []float64
	Retries  []float64 // the part of Offered that were retries of dropped requests
	Admitted []float64
	Dropped  []float64
	// Allowed is the oracle's allowed rate (see Allowed) given the nominal
	// rates of all the callee's callers in the same second: what the
	// scenario entitles the caller to, whatever the noise; +Inf: unbounded.
	Allowed []float64
	// Ratio is the drop ratio the callee's sidecars held at the end of the
	// second, averaged over them.
	Ratio []float64
	// Cost is the bucket's traffic in cost units at a callee whose limits
	// count cost (Limit is then in units per second, and Allowed is the
	// oracle's allowed cost rate over the nominal cost of a request); nil
	// elsewhere, and in live mode.
	Cost *CostSeries
}

// Bucket returns the series' bucket.
func (b *BucketSeries) Bucket() Bucket { return Bucket{b.Callee, b.Caller, b.Procedure} }

// Pipeline follows one bucket's first surge through the loop, to show where
// the time to enforce goes. Onset is the first traffic step at which the
// bucket's nominal offered rate (the scenario's rate functions, without
// noise or retries) exceeds its nominal allowed rate; it is a surge when
// the nominal rate one second later is at least SurgeFactor times the
// allowed rate (a rate that creeps over its limit, as in a diurnal curve,
// leaves the loop nothing to catch up with), and its dropped requests are not
// retried (retries make the offered rate more than the nominal one, the
// yardstick of each stage). Each later instant is the first
// after the previous stage's at which the next stage had caught up; a stage
// that did not before the episode ended is -1.
type Pipeline struct {
	Bucket Bucket
	Onset  time.Duration
	End    time.Duration // when the nominal episode ends (the run's duration if it does not)
	// Offered and Allowed are the nominal rates one second after Onset.
	Offered, Allowed float64
	// FirstPublished: the first tick publishes a ratio above 0 for the
	// caller, accurate or not (fast attack acts on partial reports).
	FirstPublished time.Duration
	// Reported: the reports the aggregators hold add up to 95 % of the
	// nominal offered rate.
	Reported time.Duration
	// Flushed: the zone loads the controller holds add up to 95 %.
	Flushed time.Duration
	// Published: a tick publishes a ratio that admits within ±5 % of the
	// allowed rate at the nominal offered rate.
	Published time.Duration
	// Applied: that policy reaches the sidecars (Published + push delay).
	Applied time.Duration
	// Zoom holds the bucket's traffic around Onset in finer bins.
	Zoom Zoom
}

// SurgeFactor is how far over its allowed rate a bucket's nominal rate must
// be one second after the onset for its episode to be followed as a surge.
const SurgeFactor = 1.25

// Zoom is a stretch of one bucket's traffic in bins of 100 ms (or of the
// traffic step, if that is longer).
type Zoom struct {
	Start, Bin                 time.Duration
	Offered, Admitted, Allowed []float64 // rps; Allowed is nominal
}

// FastPath counts the surge fast path's work — reports a sidecar sent early
// because a caller's rate jumped, and flushes and ticks that such a jump
// brought forward — and live sidecars that aggregators dropped as silent.
type FastPath struct {
	SurgeReports, UrgentFlushes, UrgentTicks int64
	// StaleSidecars counts sidecars an aggregator dropped from its sums
	// for silence (aggregator.State.TakeStale) although they were alive.
	StaleSidecars int64
}

// ControlPlane counts the messages and bytes (proto.Size) each tier sent.
// Policies count once per sidecar that receives them.
type ControlPlane struct {
	Reports, ZoneLoads, Policies Tier
}

// Tier is one tier's traffic.
type Tier struct {
	Messages, Bytes int64
}

// PerSecond returns bytes per second over d.
func (t Tier) PerSecond(d time.Duration) float64 { return float64(t.Bytes) / d.Seconds() }

// Run simulates sc with seed. It returns an error, naming the seed and the
// simulated time, if a production component rejects what another produced:
// in a correct loop that never happens.
func Run(sc *Scenario, seed uint64, opts Options) (*Result, error) {
	e, err := newEngine(sc, seed, opts)
	if err != nil {
		return nil, fmt.Errorf("%s seed %d: %w", sc.Name, seed, err)
	}
	e.run()
	r := e.result()
	if e.err != nil {
		return nil, fmt.Errorf("%s seed %d: at %v: %w", sc.Name, seed, e.now, e.err)
	}
	return r, nil
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	old[len(old)-1] = event{}
	*q = old[:len(old)-1]
	return x
}

type engine struct {
	sc   *Scenario
	seed uint64
	opts Options
	rng  *rand.Rand
	now  time.Duration
	q    eventQueue
	seq  uint64
	err  error

	stepSec float64
	zoomBin time.Duration
	nbins   int
	steps   int64 // traffic steps taken

	buckets   []*bucketState
	bucketIdx map[Bucket]int
	callees   []*calleeState
	flowRate  []float64 // per flow, at the current step
	// flowSeries are the flows with a criticality (nil when none does),
	// flowIdx maps a flow to its index there, -1 for none.
	flowSeries []FlowSeries
	flowIdx    []int
	sidecars   []*simSidecar
	aggs       []*simAggregator // one per zone
	ctl        simController

	cp        ControlPlane
	fast      FastPath
	timeline  []Happening
	expiries  []Expiry
	decisions int64
	tenants   *tenantRun    // nil: no tenants
	models    []*modelState // the modelled callees (Service.Knee)
}

type calleeState struct {
	svc      *Service
	limits   *limits.Service
	buckets  []int    // indexes into engine.buckets, sorted by caller and procedure
	leaves   []Bucket // the buckets' keys, in the same order
	sidecars []*simSidecar
	// expired counts its sidecars whose policy is expired; expiry is the
	// index in engine.expiries of the stretch under way while it is above 0.
	expired, expiry int
}

type bucketState struct {
	b      Bucket
	callee int
	flows  []int // scenario flows of this bucket

	offered, retries, admitted, dropped, ratio []float64
	// cost is its traffic in cost units, at a callee counting cost; nil
	// elsewhere.
	cost *CostSeries

	// Pipeline tracking.
	pipe     *Pipeline
	aggHeld  float64 // Σ over sidecars of the rate their aggregator holds
	ctlHeld  float64 // Σ over aggregators of the rate the controller holds
	zoomFrom time.Duration
	zoomTo   time.Duration
}

type simSidecar struct {
	id     string
	callee int
	zone   int
	lim    *sidecar.Limiter
	svc    *sidecar.ServiceLimiter
	// win is the reporter's step (its ticks and surge checks), expiry the
	// step of the agent's policy clock: the sidecar's production timing
	// logic, driven on the virtual clock.
	win     *reporter.Window
	expiry  sidecar.Expiry
	expired bool // its policy has expired, and no other came since
	agg     int  // the aggregator it reports to; -1 while failing over
	// pending is the newest report made while failing over, sent on
	// reconnecting: the uplink between reporter and aggregator
	// (internal/uplink) keeps at most one.
	pending *sluicev1.LoadReport
	flows   []sidecarFlow
	held    []float64 // per bucket of the callee (calleeState.buckets order): rate its aggregator holds
	desc    int       // the tenants' descriptor's index in its policy, -1: none
	// src is what its report Window reads: lim, or for a modelled callee
	// lim with up's health (modelSource).
	src reporter.Source
	up  *upstream // the callee's instance behind it; nil: not modelled
}

type sidecarFlow struct {
	flow   int
	bucket int // engine bucket index
	caller string
	call   Call
	tier   string // the flow's criticality header value; "" for none
	cost   *FlowCost
	hdr    string  // the flow's cost header value; "" for none
	share  float64 // of the flow's rate
	carry  float64 // Deterministic arrivals: the fraction owed
	retry  *retryRing
}

// retryRing holds retries due per future step and attempt.
type retryRing struct {
	delays []int64 // steps until attempt k+1 after a drop at attempt k (k = 0: the first try)
	due    [][]int // [step % len][attempt-1]
	max    int
}

type simAggregator struct {
	zone  int
	id    string
	state *aggregator.State
	dead  bool
	// orphans counts its sidecars still failing over after it died.
	orphans int
	ctl     []float64 // per engine bucket: the rate the controller holds from this aggregator
	flushes ticker.Schedule
}

type simController struct {
	state *controller.State
	down  bool
	warm  bool // has published since it last started
	// ticks is the ticker's rule for urgent ticks; a restarted controller
	// has a new one, and a poked tick of the old one finds its own.
	ticks *ticker.Schedule
	gen   int // the ticker's generation: a restarted controller has a new one
	// phase is where the regular ticks fall: at phase + k·tick. The
	// production ticker is aligned to the wall clock (ticker.Aligned), so
	// a restarted controller ticks on the same grid as before, not a tick
	// after it started.
	phase time.Duration
}

func newEngine(sc *Scenario, seed uint64, opts Options) (*engine, error) {
	e := &engine{
		sc:        sc,
		seed:      seed,
		opts:      opts,
		rng:       rand.New(rand.NewPCG(seed, 0x736c75696365)), // "sluice"
		stepSec:   sc.Step.Seconds(),
		zoomBin:   max(zoomBin, sc.Step),
		nbins:     int(sc.Duration / Bin),
		bucketIdx: map[Bucket]int{},
		flowRate:  make([]float64, len(sc.Flows)),
	}
	e.initFlowSeries()

	// Callees and buckets.
	calleeIdx := map[string]int{}
	for i := range sc.Services {
		svc := &sc.Services[i]
		calleeIdx[svc.Name] = len(e.callees)
		e.callees = append(e.callees, &calleeState{svc: svc, limits: sc.Limits.Service(svc.Name)})
	}
	for _, b := range sc.Buckets() {
		ci := calleeIdx[b.Callee]
		c := e.callees[ci]
		bs := &bucketState{
			b: b, callee: ci,
			offered: make([]float64, e.nbins), retries: make([]float64, e.nbins),
			admitted: make([]float64, e.nbins), dropped: make([]float64, e.nbins),
			ratio: make([]float64, e.nbins),
		}
		if c.limits.Counted() {
			bs.cost = &CostSeries{Offered: make([]float64, e.nbins), Admitted: make([]float64, e.nbins), Debt: make([]float64, e.nbins)}
		}
		e.bucketIdx[b] = len(e.buckets)
		c.buckets = append(c.buckets, len(e.buckets))
		c.leaves = append(c.leaves, b)
		e.buckets = append(e.buckets, bs)
	}
	for fi, f := range sc.Flows {
		bs := e.buckets[e.bucketIdx[f.Bucket()]]
		bs.flows = append(bs.flows, fi)
	}
	e.findOnsets()
	e.initModels()

	// Sidecars, each with its own Limiter, and their report phases.
	for ci, c := range e.callees {
		for z, n := range c.svc.Sidecars {
			for i := range n {
				s := &simSidecar{
					id:     fmt.Sprintf("%s-%s-%d", c.svc.Name, sc.Zones[z], i),
					callee: ci,
					zone:   z,
					// The allowances are sized for the report interval: the
					// reporter rotates the descriptors' sketches at each report.
					lim:  sidecar.NewLimiter(sidecar.LimiterOptions{OneStripe: true, DescriptorWindow: sc.Loop.ReportInterval}),
					agg:  z,
					held: make([]float64, len(c.buckets)),
					desc: -1,
				}
				s.svc = s.lim.Service(c.svc.Name)
				s.src = s.lim
				if c.svc.Knee != nil {
					up, err := newUpstream(*c.svc.Knee)
					if err != nil {
						return nil, fmt.Errorf("service %s: %w", c.svc.Name, err)
					}
					s.up = up
					s.src = &modelSource{Limiter: s.lim, service: c.svc.Name, up: up}
				}
				s.expiry = sidecar.Expiry{Limiter: s.lim, Service: c.svc.Name}
				for fi, f := range sc.Flows {
					if f.Callee != c.svc.Name || f.Weights[z] == 0 {
						continue
					}
					sf := sidecarFlow{
						flow:   fi,
						bucket: e.bucketIdx[f.Bucket()],
						caller: f.Caller,
						call:   f.Call,
						tier:   f.Criticality,
						cost:   f.Cost,
						hdr:    f.Cost.headerValue(),
						share:  f.Weights[z] / float64(n),
					}
					if f.Retry != nil {
						sf.retry = newRetryRing(f.Retry, sc.Step)
					}
					s.flows = append(s.flows, sf)
				}
				c.sidecars = append(c.sidecars, s)
				e.sidecars = append(e.sidecars, s)
			}
		}
	}
	for i, s := range e.sidecars {
		phase := time.Duration(e.rng.Int64N(int64(sc.Loop.ReportInterval)))
		start := phase - sc.Loop.ReportInterval // the sidecar started one interval before its first report
		name := e.callees[s.callee].svc.Name
		hdr := reporter.Header{SidecarID: s.id, Service: name, Zone: sc.Zones[s.zone], Direction: sidecar.Inbound, Interval: sc.Loop.ReportInterval}
		s.win = reporter.NewWindow(reporter.WindowConfig{Header: hdr, Interval: sc.Loop.ReportInterval, SurgeChecks: sc.Loop.SurgeCheck > 0, Project: true, Check: sc.Loop.SurgeCheck, HealthGate: true}, Epoch.Add(start), s.src)
		// The reporter's tickers and the agent's policy clock started
		// with the sidecar. At an instant where a report and a surge
		// check fall together, the report goes first and the check sees
		// too short a window.
		e.at(phase, func() { e.report(s) })
		if c := sc.Loop.SurgeCheck; c > 0 {
			e.at(firstAfter(start, c), func() { e.check(s) })
			// The step ticker's phase is its own, as in the Reporter;
			// Window.Project skips a step too close to a check.
			// A phase from the sidecar's index, not the random source:
			// the arrivals stay what they were without steps.
			step := c / reporter.DefaultProjectSteps
			phase := time.Duration(uint64(i) * 0x9e3779b97f4a7c15 % uint64(step))
			e.at(firstAfter(start, step)+phase, func() { e.project(s) })
		}
		e.at(firstAfter(start, sidecar.ExpiryPeriod), func() { e.expire(s) })
	}

	// Aggregators, one per zone, each flushing at its own phase.
	for z, zone := range sc.Zones {
		a := &simAggregator{
			zone:    z,
			id:      "aggregator-" + zone,
			state:   aggregator.NewState(zone, "aggregator-"+zone, sc.Loop.AggregatorStaleAfter, aggregator.Bounds{}),
			ctl:     make([]float64, len(e.buckets)),
			flushes: ticker.NewSchedule(ticker.MinGap(sc.Loop.FlushInterval)),
		}
		e.aggs = append(e.aggs, a)
		phase := time.Duration(e.rng.Int64N(int64(sc.Loop.FlushInterval)))
		e.at(phase, func() { e.flush(a) })
	}

	// The controller ticks at its own phase too: its ticker is aligned to
	// the wall clock, and nothing aligns that with the seconds the
	// measures are binned in.
	st, err := controller.NewState(sc.Loop.Controller.StateConfig, Epoch)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	phase := time.Duration(e.rng.Int64N(int64(sc.Loop.Controller.Tick)))
	e.ctl = simController{state: st, ticks: newTickSchedule(sc.Loop.Controller.Tick), phase: phase}
	gen := e.ctl.gen
	e.at(phase, func() { e.tick(gen) })

	for _, ev := range sc.Events {
		switch ev.Kind {
		case KillAggregator:
			z := slices.Index(sc.Zones, ev.Zone)
			e.at(ev.At, func() { e.killAggregator(z) })
		case RestartController:
			e.at(ev.At, func() { e.restartController(ev.Down) })
		case Brownout:
			e.at(ev.At, func() { e.brownout(ev.Callee, ev.Knee, true) })
			if end := ev.End(sc.Duration); end < sc.Duration {
				e.at(end, func() { e.brownout(ev.Callee, *sc.Service(ev.Callee).Knee, false) })
			}
		}
	}
	e.newTenantRun()
	e.at(0, e.step)
	return e, nil
}

// newTickSchedule is the controller's rule for urgent ticks, as its
// Service's ticker has it.
func newTickSchedule(tick time.Duration) *ticker.Schedule {
	s := ticker.NewSchedule(ticker.MinGap(tick))
	return &s
}

// firstAfter is the first instant at or after 0 of a ticker started at
// start with the given period: the simulation begins at 0, and what a
// sidecar that started earlier did before then is not simulated.
func firstAfter(start, period time.Duration) time.Duration {
	first := start + period
	for first < 0 {
		first += period
	}
	return first
}

func newRetryRing(r *Retry, step time.Duration) *retryRing {
	rr := &retryRing{max: r.MaxRetries}
	longest := int64(0)
	backoff := float64(r.Backoff)
	for range r.MaxRetries {
		d := max(int64(math.Ceil(backoff/float64(step))), 1)
		rr.delays = append(rr.delays, d)
		longest = max(longest, d)
		backoff = float64(backoff * r.Multiplier)
	}
	rr.due = make([][]int, longest+1)
	for i := range rr.due {
		rr.due[i] = make([]int, r.MaxRetries)
	}
	return rr
}

// at schedules fn at time t (not before now).
func (e *engine) at(t time.Duration, fn func()) {
	e.seq++
	heap.Push(&e.q, event{at: max(t, e.now), seq: e.seq, fn: fn})
}

func (e *engine) after(d time.Duration, fn func()) { e.at(e.now+d, fn) }

func (e *engine) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *engine) note(format string, args ...any) { e.noteCallee("", format, args...) }

func (e *engine) noteCallee(callee, format string, args ...any) {
	e.timeline = append(e.timeline, Happening{At: e.now, What: fmt.Sprintf(format, args...), Callee: callee})
}

func (e *engine) run() {
	for e.q.Len() > 0 && e.err == nil {
		ev := heap.Pop(&e.q).(event)
		if ev.at >= e.sc.Duration {
			break
		}
		e.now = ev.at
		ev.fn()
	}
	e.now = e.sc.Duration
	e.sampleRatios(e.nbins - 1)
	e.endTenantSecond(e.nbins - 1)
	if e.opts.Progress != nil && e.err == nil {
		e.opts.Progress(e.now, e.sc.Duration)
	}
}

// step offers one traffic step's arrivals to every sidecar and decides each
// with the sidecar's Limiter.
func (e *engine) step() {
	t := e.now
	if t%Bin == 0 && t > 0 {
		e.sampleRatios(int(t/Bin) - 1)
		e.endTenantSecond(int(t/Bin) - 1)
		if e.opts.Progress != nil {
			e.opts.Progress(t, e.sc.Duration)
		}
	}
	bin := int(t / Bin)
	for fi, f := range e.sc.Flows {
		e.flowRate[fi] = f.Rate.At(t)
	}
	for _, s := range e.sidecars {
		admitted := 0
		for i := range s.flows {
			admitted += e.offer(s, &s.flows[i], bin)
		}
		if s.up != nil {
			s.up.serve(e.sc.Step, float64(admitted)/e.stepSec)
		}
	}
	e.offerTenants()
	e.steps++
	if next := t + e.sc.Step; next < e.sc.Duration {
		e.at(next, e.step)
	}
}

// offer draws a traffic step's arrivals of one flow at one sidecar, and
// its retries due, decides them, and returns how many it admitted.
func (e *engine) offer(s *simSidecar, sf *sidecarFlow, bin int) int {
	var n int
	lambda := e.flowRate[sf.flow] * sf.share * e.stepSec
	if e.sc.Arrivals == Deterministic {
		sf.carry += lambda
		n = int(sf.carry)
		sf.carry -= float64(n)
	} else {
		n = poisson(e.rng, lambda)
	}
	bs := e.buckets[sf.bucket]
	admitted, dropped := e.decide(s, sf, n, bin)
	bs.offered[bin] += float64(n)
	bs.admitted[bin] += float64(admitted)
	bs.dropped[bin] += float64(dropped)
	e.flowAdd(sf.flow, bin, n, admitted)
	e.zoomAdd(bs, n, admitted)
	rr := sf.retry
	if rr == nil {
		return admitted
	}
	slot := int(e.steps % int64(len(rr.due)))
	rr.schedule(e.steps, 0, dropped)
	for k := range rr.max {
		m := rr.due[slot][k]
		if m == 0 {
			continue
		}
		rr.due[slot][k] = 0
		a, d := e.decide(s, sf, m, bin)
		bs.offered[bin] += float64(m)
		bs.retries[bin] += float64(m)
		bs.admitted[bin] += float64(a)
		bs.dropped[bin] += float64(d)
		e.flowAdd(sf.flow, bin, m, a)
		e.zoomAdd(bs, m, a)
		admitted += a
		if k+1 < rr.max {
			rr.schedule(e.steps, k+1, d)
		}
	}
	return admitted
}

// schedule queues n requests dropped at attempt k (0: the first try) for
// attempt k+1.
func (rr *retryRing) schedule(step int64, k, n int) {
	if n == 0 || k >= rr.max {
		return
	}
	slot := int((step + rr.delays[k]) % int64(len(rr.due)))
	rr.due[slot][k] += n
}

// decide runs n requests of the flow through the sidecar's Limiter, as
// its HTTP middleware or gRPC interceptor would when the flow names what
// it calls, and completes each admitted one at once, as the edge does
// when its response is written: Decision.Done, with the cost the response
// reports when the flow's requests report one. At a callee counting cost
// it adds what they cost to the bucket's cost series of bin.
func (e *engine) decide(s *simSidecar, sf *sidecarFlow, n, bin int) (admitted, dropped int) {
	c := &sf.call
	var cs *CostSeries
	price := 0.0
	if bs := e.buckets[sf.bucket]; bs.cost != nil && bin < e.nbins {
		cs = bs.cost
		f := &e.sc.Flows[sf.flow]
		price = CostAt(e.callees[s.callee].limits, f, e.now)
	}
	var resp *ResponseCost
	if sf.cost != nil {
		resp = sf.cost.Response
	}
	for range n {
		var d sidecar.Decision
		switch {
		case sf.hdr != "" && c.Procedure != "":
			d = s.svc.DecideGRPCCost(sf.caller, c.Procedure, sf.tier, sf.hdr)
		case sf.hdr != "":
			d = s.svc.DecideHTTPCost(sf.caller, c.Method, c.Path, sf.tier, sf.hdr)
		case sf.tier != "" && c.Procedure != "":
			d = s.svc.DecideGRPCTier(sf.caller, c.Procedure, sf.tier)
		case sf.tier != "" && c.Path != "":
			d = s.svc.DecideHTTPTier(sf.caller, c.Method, c.Path, sf.tier)
		case sf.tier != "":
			d = s.svc.DecideTier(sf.caller, sf.tier)
		case c.Procedure != "":
			d = s.svc.DecideGRPC(sf.caller, c.Procedure)
		case c.Path != "":
			d = s.svc.DecideHTTP(sf.caller, c.Method, c.Path)
		default:
			d = s.svc.Decide(sf.caller)
		}
		cost := price
		if resp != nil {
			cost = resp.draw(e.rng, e.now)
		}
		if cs != nil {
			cs.Offered[bin] += cost
		}
		if d.Drop {
			dropped++
			continue
		}
		if cs != nil {
			cs.Admitted[bin] += cost
		}
		d.Done(cost, resp != nil)
	}
	e.decisions += int64(n)
	return n - dropped, dropped
}

func (e *engine) zoomAdd(bs *bucketState, offered, admitted int) {
	if bs.pipe == nil || e.now < bs.zoomFrom || e.now >= bs.zoomTo {
		return
	}
	i := int((e.now - bs.zoomFrom) / e.zoomBin)
	scale := float64(time.Second) / float64(e.zoomBin)
	bs.pipe.Zoom.Offered[i] += float64(offered) * scale
	bs.pipe.Zoom.Admitted[i] += float64(admitted) * scale
}

func (e *engine) sampleRatios(bin int) {
	if bin < 0 || bin >= e.nbins {
		return
	}
	e.sampleModels(bin)
	for _, bs := range e.buckets {
		bs.ratio[bin] = e.meanRatio(bs)
		if bs.cost != nil {
			bs.cost.Debt[bin] = e.debt(bs)
		}
	}
	for i := range e.flowSeries {
		fs := &e.flowSeries[i]
		f := &e.sc.Flows[fs.Flow]
		c := e.callees[e.buckets[e.bucketIdx[f.Bucket()]].callee]
		sum := 0.0
		for _, s := range c.sidecars {
			if r, ok := s.svc.LeafTierRatio(f.Caller, f.Leaf, fs.Tier); ok {
				sum += r
			}
		}
		fs.Ratio[bin] = sum / float64(len(c.sidecars))
	}
}

// meanRatio is the mean drop ratio the bucket's callee's sidecars hold for
// its caller (its leaf, at a callee with procedures): the ratio in force (a fresh policy's, decayed in fail mode
// open), 0 where a token bucket decides instead (fail mode local), as the
// sidecars' sluice_sidecar_drop_ratio says and live mode samples it.
func (e *engine) meanRatio(bs *bucketState) float64 {
	c := e.callees[bs.callee]
	sum := 0.0
	for _, s := range c.sidecars {
		if r, ok := s.svc.LeafRatio(bs.b.Caller, bs.b.Procedure); ok {
			sum += r
		}
	}
	return sum / float64(len(c.sidecars))
}

// report is one sidecar's report tick: the reporter's Window says what goes
// out.
func (e *engine) report(s *simSidecar) {
	e.after(e.sc.Loop.ReportInterval, func() { e.report(s) })
	if rep := s.win.Tick(Epoch.Add(e.now), s.src); rep != nil {
		e.send(s, rep)
	}
}

// expire is one step of a sidecar's policy clock, as the agent's fail-mode
// worker takes it: Expire puts the policy's fail mode in force once it has
// outlived its TTL. The timeline notes when a callee's first sidecar's
// policy expires.
func (e *engine) expire(s *simSidecar) {
	e.after(sidecar.ExpiryPeriod, func() { e.expire(s) })
	st, _, changed := s.expiry.Step(Epoch.Add(e.now))
	if !changed || st.State != sidecar.Expired || s.expired {
		return
	}
	s.expired = true
	c := e.callees[s.callee]
	if c.expired++; c.expired > 1 {
		return
	}
	p := s.lim.Policy(c.svc.Name)
	ttl := p.TTL
	if ttl <= 0 {
		ttl = sidecar.DefaultPolicyTTL
	}
	c.expiry = len(e.expiries)
	e.expiries = append(e.expiries, Expiry{Callee: c.svc.Name, FailMode: st.FailMode.String(), TTL: ttl, LiveInstances: p.LiveInstances, From: e.now, To: -1})
	e.noteCallee(c.svc.Name, "%s: policy expired (%v TTL), fail mode %s", c.svc.Name, ttl, st.FailMode)
}

// replaced notes that s's policy was just replaced or removed, which ends
// its fail mode at once (the agent's worker sees it at its next step). The
// timeline notes when the last of a callee's expired sidecars is so.
func (e *engine) replaced(s *simSidecar) {
	if !s.expired {
		return
	}
	s.expired = false
	c := e.callees[s.callee]
	if c.expired--; c.expired > 0 {
		return
	}
	e.expiries[c.expiry].To = e.now
	e.noteCallee(c.svc.Name, "%s: fresh policy at every sidecar, fail mode over", c.svc.Name)
}

// check is one sidecar's surge check: a surge report the Window finds goes
// out at once, and so does the report of a folded tick whose descriptors
// are due, once its window has grown to half an interval
// (reporter.Window.Check), which is not a surge report.
func (e *engine) check(s *simSidecar) {
	e.after(e.sc.Loop.SurgeCheck, func() { e.check(s) })
	if rep := s.win.Check(Epoch.Add(e.now), s.src); rep != nil {
		if rep.GetUrgent() {
			e.fast.SurgeReports++
		}
		e.send(s, rep)
	}
}

// project is one sidecar's projection step between its surge checks
// (reporter.Window.Project), on its own ticker as in the Reporter.
func (e *engine) project(s *simSidecar) {
	e.after(e.sc.Loop.SurgeCheck/reporter.DefaultProjectSteps, func() { e.project(s) })
	s.win.Project(Epoch.Add(e.now), s.src)
}

// send hands a report to the sidecar's uplink: to its aggregator, or kept,
// the newest only, while it fails over.
func (e *engine) send(s *simSidecar, rep *sluicev1.LoadReport) {
	if s.agg < 0 {
		s.pending = rep
		return
	}
	e.sendReport(s, rep)
}

func (e *engine) sendReport(s *simSidecar, rep *sluicev1.LoadReport) {
	e.cp.Reports.Messages++
	e.cp.Reports.Bytes += int64(proto.Size(rep))
	a := e.aggs[s.agg]
	e.after(e.sc.Loop.ReportDelay, func() {
		if a.dead {
			return // lost with the connection
		}
		if err := a.state.Apply(rep, Epoch.Add(e.now)); err != nil {
			e.fail(fmt.Errorf("aggregator %s rejected the report of %s: %w", a.id, s.id, err))
			return
		}
		e.heldReport(s, rep)
		if a.state.TakeUrgent() {
			// A surge: the aggregator's flush ticker is poked.
			e.poke(&a.flushes, func() { e.fast.UrgentFlushes++; e.flushNow(a) })
		}
	})
}

// heldReport updates what the aggregators are known to hold for the
// pipeline's "reported" stage.
func (e *engine) heldReport(s *simSidecar, rep *sluicev1.LoadReport) {
	c := e.callees[s.callee]
	secs := rep.GetWindow().AsDuration().Seconds()
	for i, bi := range c.buckets {
		rate := 0.0
		for _, p := range rep.GetPeers() {
			if p.GetPeer() == c.leaves[i].Caller && p.GetProcedure() == c.leaves[i].Procedure {
				rate = float64(p.GetOffered()) / secs
			}
		}
		bs := e.buckets[bi]
		bs.aggHeld += rate - s.held[i]
		s.held[i] = rate
		if p := bs.pipe; p != nil && p.Reported < 0 && e.inEpisode(p) && bs.aggHeld >= 0.95*e.nominalOffered(bs, e.now) {
			p.Reported = e.now
		}
	}
}

func (e *engine) forgetHeld(s *simSidecar) {
	for i, bi := range e.callees[s.callee].buckets {
		e.buckets[bi].aggHeld -= s.held[i]
		s.held[i] = 0
	}
}

// flush is one aggregator's flush tick.
func (e *engine) flush(a *simAggregator) {
	if a.dead {
		return
	}
	e.after(e.sc.Loop.FlushInterval, func() { e.flush(a) })
	a.flushes.Ran(Epoch.Add(e.now))
	e.flushNow(a)
}

// poke is internal/ticker's Poke on the virtual clock: the Schedule says
// when the run it asks for is due, if it asks for one.
func (e *engine) poke(t *ticker.Schedule, run func()) {
	if !t.Poke(Epoch.Add(e.now)) {
		return
	}
	if t.Fire(Epoch.Add(e.now)) {
		run()
		return
	}
	next, _ := t.Next()
	e.at(next.Sub(Epoch), func() {
		if t.Fire(Epoch.Add(e.now)) {
			run()
		}
	})
}

// flushNow is the aggregator's FlushNow: the zone's sums, sent to the
// controller.
func (e *engine) flushNow(a *simAggregator) {
	if a.dead {
		return
	}
	zl := a.state.Flush(Epoch.Add(e.now), e.sc.Loop.FlushInterval)
	// The service logs these. Every sidecar here is alive (a dead
	// aggregator's sidecars went elsewhere and it flushes no more), so
	// each one dropped is load the controller does not see for a while.
	e.fast.StaleSidecars += int64(len(a.state.TakeStale()))
	if e.ctl.down {
		return // the uplink holds it until the controller is back; by then a newer one replaced it
	}
	e.cp.ZoneLoads.Messages++
	e.cp.ZoneLoads.Bytes += int64(proto.Size(zl))
	e.after(e.sc.Loop.FlushDelay, func() {
		if e.ctl.down || a.dead {
			return
		}
		if err := e.ctl.state.Apply(zl, Epoch.Add(e.now)); err != nil {
			e.fail(fmt.Errorf("controller rejected the zone load of %s: %w", a.id, err))
			return
		}
		e.heldZoneLoad(a, zl)
		if e.ctl.state.TakeUrgent() {
			// A surge: the controller's tick ticker is poked.
			gen := e.ctl.gen
			e.poke(e.ctl.ticks, func() { e.fast.UrgentTicks++; e.tickNow(gen) })
		}
	})
}

func (e *engine) heldZoneLoad(a *simAggregator, zl *sluicev1.ZoneLoad) {
	for bi, bs := range e.buckets {
		rate := 0.0
		for _, svc := range zl.GetServices() {
			if svc.GetService() != bs.b.Callee {
				continue
			}
			for _, p := range svc.GetPeers() {
				if p.GetPeer() == bs.b.Caller && p.GetProcedure() == bs.b.Procedure {
					rate = p.GetOfferedRps()
				}
			}
		}
		bs.ctlHeld += rate - a.ctl[bi]
		a.ctl[bi] = rate
		if p := bs.pipe; p != nil && p.Reported >= 0 && p.Flushed < 0 && e.inEpisode(p) && bs.ctlHeld >= 0.95*e.nominalOffered(bs, e.now) {
			p.Flushed = e.now
		}
	}
}

func (e *engine) forgetZoneLoad(a *simAggregator) {
	for bi, bs := range e.buckets {
		bs.ctlHeld -= a.ctl[bi]
		a.ctl[bi] = 0
	}
}

// tick is the controller's tick: the production State's Tick, then each
// changed policy goes to every sidecar of its service after the push delay.
func (e *engine) tick(gen int) {
	if gen != e.ctl.gen {
		return // the ticker of a controller that has since restarted
	}
	e.after(e.sc.Loop.Controller.Tick, func() { e.tick(gen) })
	if !e.ctl.down {
		e.ctl.ticks.Ran(Epoch.Add(e.now))
	}
	e.tickNow(gen)
}

// tickNow is the controller Service's tick.
func (e *engine) tickNow(gen int) {
	if e.ctl.down || gen != e.ctl.gen {
		return
	}
	res := e.ctl.state.Tick(Epoch.Add(e.now), e.sc.Limits)
	e.readModels(&res)
	if res.Warm && !e.ctl.warm {
		e.ctl.warm = true
		e.note("controller warm: publishing (%d aggregators)", res.Aggregators)
	}
	for _, name := range slices.Sorted(maps.Keys(res.Changed)) {
		m := res.Changed[name]
		p, err := sidecar.PolicyFromProto(m)
		if err != nil {
			e.fail(fmt.Errorf("sidecars would NACK the controller's policy: %w", err))
			return
		}
		ci := e.calleeIndex(p.Service)
		if ci < 0 {
			continue // a service without sidecars: nobody subscribes
		}
		c := e.callees[ci]
		e.cp.Policies.Messages += int64(len(c.sidecars))
		e.cp.Policies.Bytes += int64(proto.Size(m)) * int64(len(c.sidecars))
		e.after(e.sc.Loop.PushDelay, func() {
			// As sidecar.Installer installs a policy the xDS client
			// received: fresh, its TTL running from now.
			for _, s := range c.sidecars {
				s.lim.SetPolicyAt(p, Epoch.Add(e.now))
				e.installed(s, p)
				e.replaced(s)
			}
		})
		e.checkPublished(c, p)
	}
	for _, name := range res.Deleted {
		for _, c := range e.callees {
			if names.Callee(c.svc.Name) == name {
				e.cp.Policies.Messages += int64(len(c.sidecars))
				e.after(e.sc.Loop.PushDelay, func() {
					for _, s := range c.sidecars {
						s.lim.RemovePolicy(c.svc.Name)
						e.installed(s, nil)
						e.replaced(s)
					}
				})
			}
		}
	}
}

// checkPublished records the pipeline's "published" stage: the first
// policy whose ratio admits within ±5 % of the nominal allowed rate.
func (e *engine) checkPublished(c *calleeState, p *sidecar.Policy) {
	for _, bi := range c.buckets {
		bs := e.buckets[bi]
		r := p.Leaf(bs.b.Caller, bs.b.Procedure)
		ratio := 0.0
		if r != nil {
			ratio = r.DropRatio
		}
		pp := bs.pipe
		if pp == nil || pp.Published >= 0 || !e.inEpisode(pp) {
			continue
		}
		if pp.FirstPublished < 0 && ratio > 0 {
			pp.FirstPublished = e.now
		}
		if pp.Flushed < 0 {
			continue
		}
		offered, allowed := e.nominal(bs, e.now)
		if math.Abs(float64((1-ratio)*offered)-allowed) <= 0.05*allowed {
			pp.Published = e.now
			pp.Applied = e.now + e.sc.Loop.PushDelay
		}
	}
}

func (e *engine) calleeIndex(name string) int {
	for i, c := range e.callees {
		if c.svc.Name == name {
			return i
		}
	}
	return -1
}

func (e *engine) killAggregator(z int) {
	a := e.aggs[z]
	if a.dead {
		return
	}
	a.dead = true
	// Its stream to the controller ends, and the controller's Service
	// removes the load of a zone whose stream ended at once
	// (controller.State.Remove), so that sidecars reconnecting elsewhere
	// are not counted twice.
	if !e.ctl.down {
		e.ctl.state.Remove(a.id)
	}
	e.forgetZoneLoad(a)
	for _, s := range e.sidecars {
		if s.agg == z {
			s.agg = -1
			e.forgetHeld(s)
			from := a
			e.after(e.sc.Loop.FailoverDelay, func() { e.failover(s, from) })
			a.orphans++
		}
	}
	e.note("aggregator %s dies; its %d sidecars fail over in %v", e.sc.Zones[z], a.orphans, e.sc.Loop.FailoverDelay)
}

// failover connects a sidecar to the next live aggregator after its own
// zone's, and sends the report it kept meanwhile.
func (e *engine) failover(s *simSidecar, from *simAggregator) {
	for i := 1; i <= len(e.aggs); i++ {
		a := e.aggs[(s.zone+i)%len(e.aggs)]
		if a.dead {
			continue
		}
		s.agg = a.zone
		if s.pending != nil {
			rep := s.pending
			s.pending = nil
			e.sendReport(s, rep)
		}
		if from.orphans--; from.orphans == 0 {
			e.note("the sidecars of %s report to %s now", from.id, a.id)
		}
		return
	}
	e.after(e.sc.Loop.FailoverDelay, func() { e.failover(s, from) }) // none alive: keep trying
}

func (e *engine) restartController(down time.Duration) {
	if e.ctl.down {
		return
	}
	e.ctl.down = true
	e.ctl.state = nil
	for _, a := range e.aggs {
		e.forgetZoneLoad(a)
	}
	e.note("controller stops; back in %v, then warms up for %v", down, e.sc.Loop.Controller.Warmup)
	e.after(down, func() {
		st, err := controller.NewState(e.sc.Loop.Controller.StateConfig, Epoch.Add(e.now))
		if err != nil {
			e.fail(fmt.Errorf("restart controller: %w", err))
			return
		}
		// A new process: new state, and a ticker whose first regular tick
		// is the next one on the wall-clock grid, as ticker.Aligned's.
		tick := e.sc.Loop.Controller.Tick
		gen, phase := e.ctl.gen+1, e.ctl.phase
		e.ctl = simController{state: st, ticks: newTickSchedule(tick), gen: gen, phase: phase}
		next := phase
		if e.now >= phase {
			next = phase + ((e.now-phase)/tick+1)*tick
		}
		e.at(next, func() { e.tick(gen) })
		e.note("controller starts with empty state")
	})
}

// findOnsets scans the nominal rates, step by step, for each bucket's first
// over-limit episode, and sets up its Pipeline.
func (e *engine) findOnsets() {
	for _, bs := range e.buckets {
		if e.tieredBucket(bs) || bs.cost != nil {
			continue
		}
		var pipe *Pipeline
		for t := time.Duration(0); t < e.sc.Duration; t += e.sc.Step {
			offered, allowed := e.nominal(bs, t)
			over := offered > allowed
			if pipe == nil && over {
				pipe = &Pipeline{Bucket: bs.b, Onset: t, End: e.sc.Duration, FirstPublished: -1, Reported: -1, Flushed: -1, Published: -1, Applied: -1}
				probe := min(t+time.Second, e.sc.Duration-e.sc.Step)
				pipe.Offered, pipe.Allowed = e.nominal(bs, probe)
			} else if pipe != nil && !over {
				pipe.End = t
				break
			}
		}
		if pipe == nil || pipe.Offered < SurgeFactor*pipe.Allowed || e.retries(bs) {
			continue
		}
		bs.pipe = pipe
		bs.zoomFrom = max(pipe.Onset-2*time.Second, 0).Truncate(e.zoomBin)
		bs.zoomTo = min(bs.zoomFrom+8*time.Second, e.sc.Duration)
		n := int((bs.zoomTo - bs.zoomFrom) / e.zoomBin)
		pipe.Zoom = Zoom{
			Start: bs.zoomFrom, Bin: e.zoomBin,
			Offered: make([]float64, n), Admitted: make([]float64, n),
			Allowed: make([]float64, n),
		}
		for i := range n {
			_, pipe.Zoom.Allowed[i] = e.nominal(bs, bs.zoomFrom+time.Duration(i)*e.zoomBin)
		}
	}
}

// retries reports whether a bucket's dropped requests come back: its
// offered load is then more than its nominal rate, and a pipeline measured
// against the nominal rate would mislead.
func (e *engine) retries(bs *bucketState) bool {
	for _, fi := range bs.flows {
		if e.sc.Flows[fi].Retry != nil {
			return true
		}
	}
	return false
}

func (e *engine) inEpisode(p *Pipeline) bool { return e.now >= p.Onset && e.now < p.End }

// nominal returns a bucket's offered rate at t from the scenario's rate
// functions, and its allowed rate from the oracle given every caller's.
func (e *engine) nominal(bs *bucketState, t time.Duration) (offered, allowed float64) {
	c := e.callees[bs.callee]
	rates := make([]float64, len(c.buckets))
	me := 0
	for i, bi := range c.buckets {
		for _, fi := range e.buckets[bi].flows {
			rates[i] += e.sc.Flows[fi].Rate.At(t)
		}
		if e.buckets[bi] == bs {
			me = i
		}
	}
	return rates[me], AllowedLeaves(c.limits, c.leaves, rates)[me]
}

func (e *engine) nominalOffered(bs *bucketState, t time.Duration) float64 {
	o, _ := e.nominal(bs, t)
	return o
}

func (e *engine) result() *Result {
	r := &Result{Scenario: e.sc, Seed: e.seed, ControlPlane: e.cp, FastPath: e.fast, Timeline: e.timeline, Expiries: e.expiries, Decisions: e.decisions, Tenants: e.tenantResult()}
	for i := range r.Expiries {
		if r.Expiries[i].To < 0 {
			r.Expiries[i].To = e.sc.Duration
		}
	}
	for _, bs := range e.buckets {
		r.Buckets = append(r.Buckets, BucketSeries{
			Callee: bs.b.Callee, Caller: bs.b.Caller, Procedure: bs.b.Procedure,
			Offered: bs.offered, Retries: bs.retries, Admitted: bs.admitted, Dropped: bs.dropped,
			Ratio: bs.ratio, Cost: bs.cost,
		})
		if bs.pipe != nil {
			r.Pipelines = append(r.Pipelines, *bs.pipe)
		}
	}
	Expect(e.sc, r.Buckets)
	r.Flows = e.flowSeries
	ExpectFlows(e.sc, r.Flows)
	expectTieredBuckets(e.sc, r.Buckets, r.Flows)
	r.Capacities = e.capacities(r.Buckets)
	return r
}
