package live

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/child"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/sim"
)

// DefaultMaxRPS bounds a live run's peak rate, retries included at their
// most: what one 2-vCPU machine carries through ten processes on loopback
// while it also runs the load generator.
const DefaultMaxRPS = 5000

// Options tune a live run.
type Options struct {
	// Bin is a directory holding the controller, aggregator and sidecar
	// binaries; empty builds them (see Build) into a temporary directory.
	Bin string
	// Progress, when set, receives a line per stage and per second.
	Progress io.Writer
	// MaxRPS refuses scenarios whose scaled peak rate, with every retry,
	// is higher; 0 means DefaultMaxRPS.
	MaxRPS float64
	// Seed draws the instants at which the aggregators and sidecars start,
	// which set the phases of their flushes, reports and surge checks, as
	// the seed of the deterministic mode draws them. Unlike there, the
	// rest of a live run is up to the machine: a seed does not replay it.
	Seed uint64
}

// Result is a live run. Its sim.Result holds the per-second series of every
// bucket, with Nominal, Limit and Allowed filled by sim.Expect from the
// scaled scenario, and the scenario's events as they happened (Timeline);
// Seed is 0 (a live run has none) and ControlPlane, FastPath, Pipelines and
// Decisions are empty: the processes do not count those. Its Scenario is
// the scaled scenario renamed <name>-live, so that its CSV and PNG files do
// not overwrite the deterministic mode's.
type Result struct {
	sim.Result
	// Scaled is the scenario as run, under its own name: what Compare
	// runs in deterministic mode.
	Scaled  *sim.Scenario
	Scaling Scaling
	// Processes started at first; a restarted controller is not counted
	// again.
	Controllers, Aggregators, Sidecars int
	// Load is what the load generators and the retrying client saw go
	// wrong: requests that got no answer, or were not sent.
	Load LoadStats
	// From the sidecars' metrics at the end of the run.
	Reports, SurgeReports, Failovers float64
	// Wall is how long the run took, start-up and shut-down included.
	Wall time.Duration
	// Sent holds, per bucket and second, the requests the load generators
	// sent (retries not included); nil for a Result not from Run.
	Sent [][]float64
}

// sentOf is bucket bi's Sent series, nil without one.
func (r *Result) sentOf(bi int) []float64 {
	if bi < len(r.Sent) {
		return r.Sent[bi]
	}
	return nil
}

// LoadStats counts the load generators' requests over the run.
type LoadStats struct {
	Sent    int64 // requests sent by the load generators (retries not included)
	Errors  int64 // transport errors and statuses other than 2xx and 429, retries included
	Skipped int64 // not sent: too many requests in flight, the machine fell behind
	// Late counts the seconds in which some caller's requests (retries not
	// included) were off the scenario's rate by more than 10 % and 5
	// requests: the load generator was not scheduled in time and caught up
	// later. A busy machine shows here first.
	Late int
	// Stalls counts the instants at which the machine ran nothing on time
	// for StallThreshold or more (see probe), over Seconds of load;
	// MaxStall is the longest.
	Stalls         int
	StallThreshold time.Duration
	MaxStall       time.Duration
	Seconds        int
}

// Healthy reports whether the load went out on schedule and came back:
// no late second, under 0.1 % of the requests lost, and at most one stall
// of the scheduler every two seconds. The measures of a run that is not
// healthy describe the machine as much as the loop.
func (s LoadStats) Healthy() bool {
	return s.Late == 0 && s.Lost() <= 0.001 && !s.Stalled()
}

// Stalled reports whether the scheduler stalled more than maxStallRate
// times per second of load.
func (s LoadStats) Stalled() bool { return float64(s.Stalls) > maxStallRate*float64(max(s.Seconds, 1)) }

// lateSeconds counts the seconds in which some bucket's sent requests, sent[b][s],
// were off its nominal rate by more than 10 % and 5 requests.
func lateSeconds(buckets []sim.BucketSeries, sent [][]float64) int {
	late := 0
	for s := range sent[0] {
		for bi := range buckets {
			if loadgen.OffRate(sent[bi][s], buckets[bi].Nominal[s]) {
				late++
				break
			}
		}
	}
	return late
}

// Lost is the share of the sent requests that errored or were skipped.
func (s LoadStats) Lost() float64 {
	if s.Sent+s.Skipped == 0 {
		return 0
	}
	return float64(s.Errors+s.Skipped) / float64(s.Sent+s.Skipped)
}

// Run scales sc by s and runs it against the real binaries on loopback:
// see the package documentation. It returns an error wrapping
// ErrUnsupported, before starting anything, for a scenario that live mode
// can not run. Every process it starts is stopped before it returns,
// whatever happens; ctx ends the run early.
func Run(ctx context.Context, sc *sim.Scenario, s Scaling, opts Options) (_ *Result, err error) {
	began := time.Now()
	scaled, err := Fit(sc, s, opts.MaxRPS)
	if err != nil {
		return nil, err
	}
	peak := PeakRate(scaled)
	progress := func(format string, args ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, format+"\n", args...)
		}
	}

	dir, err := os.MkdirTemp("", "sluice-live-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := opts.Bin
	if bin == "" {
		bin = filepath.Join(dir, "bin")
		progress("%s: building the controller, aggregator and sidecar (without -race) ...", sc.Name)
		if err := Build(ctx, bin); err != nil {
			return nil, err
		}
	} else if err := child.Check(bin, child.Binaries...); err != nil {
		return nil, fmt.Errorf("--bin %s: %w", bin, err)
	}

	r := &Result{Scaled: scaled, Scaling: s, Controllers: 1, Aggregators: len(scaled.Zones), Sidecars: scaled.Sidecars()}
	progress("%s: scale %g (peak %.0f rps), %d zones: starting a controller, %d aggregators and %d sidecars on 127.0.0.1 ...",
		sc.Name, s.Factor, peak, len(scaled.Zones), r.Aggregators, r.Sidecars)
	c, err := startCluster(ctx, scaled, bin, dir, opts.Seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sc.Name, err)
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("%s: stop the processes: %w", sc.Name, cerr)
		}
		r.Wall = time.Since(began)
	}()
	if err := drive(ctx, c, r, progress); err != nil {
		return nil, fmt.Errorf("%s: %w", sc.Name, err)
	}
	return r, nil
}

// Fit checks that live mode can run sc scaled by s on this machine, and
// returns the scaled scenario: sc must pass Check, s must be valid, and the
// scaled peak rate, every retry included, must be at most maxRPS (0 means
// DefaultMaxRPS). The error names the scenario and what to change. Nothing
// is started.
func Fit(sc *sim.Scenario, s Scaling, maxRPS float64) (*sim.Scenario, error) {
	if err := Check(sc); err != nil {
		return nil, err
	}
	scaled, err := Scale(sc, s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sc.Name, err)
	}
	if maxRPS <= 0 {
		maxRPS = DefaultMaxRPS
	}
	if top := PeakRate(scaled) * retryFactor(scaled); top > maxRPS {
		// Rates scale linearly, so the largest scale that fits is exact.
		most := s.Factor * maxRPS / top
		return nil, fmt.Errorf("%s: --scale %g: the scaled scenario peaks at %.0f rps (retries included at their most), more than the %.0f rps (--max-rps) one machine can send through its processes and still measure them; use --scale %g or less",
			sc.Name, s.Factor, top, maxRPS, floorFigures(most, 2))
	}
	return scaled, nil
}

// floorFigures rounds x > 0 down to n significant figures.
func floorFigures(x float64, n int) float64 {
	k := math.Pow(10, float64(n-1)-math.Floor(math.Log10(x)))
	return math.Floor(x*k) / k
}

// generator is the load of one bucket into one zone.
type generator struct {
	bucket int
	gen    *loadgen.Generator
}

// drive sends the scenario's load through c's sidecars, plays its events,
// samples the drop ratios every second and fills r.
func drive(ctx context.Context, c *cluster, r *Result, progress func(string, ...any)) error {
	sc := c.sc
	n := int(sc.Duration / sim.Bin)
	buckets := sc.Buckets()

	// The retrying client, for the buckets that retry.
	policy := map[sim.Bucket]*sim.Retry{}
	for _, f := range sc.Flows {
		if f.Retry != nil {
			policy[sim.Bucket{Callee: f.Callee, Caller: f.Caller}] = f.Retry
		}
	}
	var fr *front
	if len(policy) > 0 {
		targets := make([]frontTarget, len(c.sidecars))
		for i, s := range c.sidecars {
			targets[i] = frontTarget{url: "http://" + s.addr, callee: s.callee}
		}
		var err error
		if fr, err = startFront(targets, policy, n); err != nil {
			return fmt.Errorf("start the retrying client: %w", err)
		}
		defer fr.close()
	}

	// One generator per bucket and zone, sending that zone's share of the
	// bucket's flows round-robin to the callee's sidecars there.
	ended := make(chan int, n+1)
	var gens []generator
	for bi, b := range buckets {
		for z := range sc.Zones {
			var flows []sim.Flow
			for _, f := range sc.Flows {
				if f.Callee == b.Callee && f.Caller == b.Caller && f.Weights[z] > 0 {
					flows = append(flows, f)
				}
			}
			if len(flows) == 0 {
				continue
			}
			var targets []string
			for i, s := range c.sidecars {
				if s.callee != b.Callee || s.zone != z {
					continue
				}
				if policy[b] != nil {
					targets = append(targets, fr.target(i))
				} else {
					targets = append(targets, "http://"+s.addr)
				}
			}
			opts := loadgen.Options{
				Targets: targets,
				Callers: []loadgen.Caller{{Name: b.Caller, Rate: func(t time.Duration) float64 {
					sum := 0.0
					for _, f := range flows {
						sum += f.Weights[z] * f.Rate.At(t)
					}
					return sum
				}}},
				Duration: sc.Duration,
			}
			if len(gens) == 0 {
				// The first generator marks the seconds for the ratio sampler.
				opts.SecondEnded = func(s int) {
					select {
					case ended <- s:
					default:
					}
				}
			}
			g, err := loadgen.New(opts)
			if err != nil {
				return err
			}
			gens = append(gens, generator{bucket: bi, gen: g})
		}
	}

	ratios := make([][]float64, len(buckets))
	for i := range ratios {
		ratios[i] = make([]float64, n)
	}
	var tl timeline
	progress("%s: ready; sending %v of load", sc.Name, sc.Duration)

	loadCtx, cancelLoad := context.WithCancel(ctx)
	defer cancelLoad()
	pr := probe{threshold: stallThreshold(sc.Loop)}
	start := time.Now()
	if fr != nil {
		fr.begin(start)
	}

	// The ratio sampler: at the end of every second, the mean drop ratio
	// each callee's sidecars hold for each caller, from their /metrics.
	// It scrapes on ctx, not loadCtx: the last seconds are sampled as the
	// load ends.
	ew := newExpiryWatch(c)
	var bg sync.WaitGroup
	bg.Go(func() {
		for s := range ended {
			expired := sampleRatios(ctx, c, buckets, ratios, s)
			ew.observe(expired, time.Since(start), tl.noteAt)
			if s > 0 {
				progress("%s", secondLine(buckets, gens, fr, ratios, s-1))
			}
		}
	})
	bg.Go(func() { pr.run(loadCtx) })
	// The events, at their times.
	var eventErr error
	bg.Go(func() {
		if err := playEvents(loadCtx, c, start, &tl); err != nil {
			eventErr = err
			cancelLoad()
		}
	})
	if fr != nil {
		// No retry is made after the run: the simulator makes none either.
		bg.Go(func() {
			sleep(loadCtx, sc.Duration)
			fr.end()
		})
	}

	var g errgroup.Group
	for _, gn := range gens {
		g.Go(func() error { return gn.gen.Run(loadCtx, nil) })
	}
	loadErr := g.Wait()
	cancelLoad()
	close(ended)
	bg.Wait()
	if eventErr != nil {
		return eventErr
	}
	if loadErr != nil {
		return fmt.Errorf("send load: %w", loadErr)
	}
	if n > 0 {
		progress("%s", secondLine(buckets, gens, fr, ratios, n-1))
	}
	if err := c.checkAlive(); err != nil {
		return err
	}

	// Counters of the sidecars, which all outlive the run.
	for _, s := range c.sidecars {
		m, err := scrape(ctx, s.admin)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		v, _ := m.Sum("sluice_sidecar_report_sent_total")
		r.Reports += v
		v, _ = m.Sum("sluice_sidecar_report_surges_total")
		r.SurgeReports += v
		v, _ = m.Sum("sluice_sidecar_report_failovers_total")
		r.Failovers += v
	}

	// The series.
	live := *sc
	live.Name = sc.Name + "-live"
	// The events and the sampler note as they go: in time order, but for
	// two notes a goroutine apart.
	slices.SortStableFunc(tl.list, func(a, b sim.Happening) int { return cmp.Compare(a.At, b.At) })
	r.Result = sim.Result{Scenario: &live, Timeline: tl.list, Expiries: ew.result(sc.Duration)}
	for bi, b := range buckets {
		bs := sim.BucketSeries{
			Callee: b.Callee, Caller: b.Caller,
			Offered: make([]float64, n), Retries: make([]float64, n),
			Admitted: make([]float64, n), Dropped: make([]float64, n),
			Ratio: ratios[bi],
		}
		for s := range n {
			off, adm, drop, retries := seconds(b, bi, gens, fr, s)
			bs.Offered[s], bs.Admitted[s], bs.Dropped[s], bs.Retries[s] = off, adm, drop, retries
		}
		r.Buckets = append(r.Buckets, bs)
	}
	for _, gn := range gens {
		t := gn.gen.Sum(buckets[gn.bucket].Caller, 0, n+1)
		r.Load.Sent += t.Sent
		r.Load.Skipped += t.Skipped
		if fr == nil || fr.policy[buckets[gn.bucket]] == nil {
			r.Load.Errors += t.Errors
		}
	}
	if fr != nil {
		for _, counts := range fr.counts {
			for i := range counts {
				r.Load.Errors += counts[i].errors.Load()
			}
		}
	}
	sim.Expect(sc, r.Buckets)
	sent := make([][]float64, len(buckets))
	for bi, b := range buckets {
		sent[bi] = make([]float64, n)
		for _, gn := range gens {
			if gn.bucket == bi {
				for s := range n {
					sent[bi][s] += float64(gn.gen.Second(b.Caller, s).Sent)
				}
			}
		}
	}
	if n > 0 {
		r.Load.Late = lateSeconds(r.Buckets, sent)
	}
	r.Sent = sent
	r.Load.Stalls, r.Load.StallThreshold, r.Load.MaxStall, r.Load.Seconds = pr.stalls, pr.threshold, pr.maxStall, n
	return nil
}

// seconds returns what bucket b offered, got admitted and dropped, and
// retried, in second s: from the retrying client for a bucket that
// retries, else from the load generators.
func seconds(b sim.Bucket, bi int, gens []generator, fr *front, s int) (offered, admitted, dropped, retries float64) {
	if fr != nil {
		if counts := fr.counts[b]; counts != nil {
			c := &counts[s]
			return float64(c.offered.Load()), float64(c.admitted.Load()), float64(c.dropped.Load()), float64(c.retries.Load())
		}
	}
	for _, gn := range gens {
		if gn.bucket == bi {
			x := gn.gen.Second(b.Caller, s)
			offered += float64(x.Sent)
			admitted += float64(x.Admitted)
			dropped += float64(x.Dropped)
		}
	}
	return offered, admitted, dropped, 0
}

// sampleRatios stores, for second s, the mean drop ratio each bucket's
// callee's sidecars hold for its caller (0 at a sidecar without one), as
// the simulator's Ratio is. A sidecar that does not answer keeps the
// previous second's value. It returns, per sidecar, whether its policy was
// expired (sluice_sidecar_policy_state), or nil where it did not answer.
func sampleRatios(ctx context.Context, c *cluster, buckets []sim.Bucket, ratios [][]float64, s int) []*bool {
	if s < 0 || s >= len(ratios[0]) {
		return nil
	}
	held := make([]map[string]float64, len(c.sidecars)) // per sidecar: peer → ratio
	expired := make([]*bool, len(c.sidecars))
	var wg sync.WaitGroup
	for i, sd := range c.sidecars {
		wg.Go(func() {
			m, err := scrape(ctx, sd.admin)
			if err != nil {
				return
			}
			h := map[string]float64{}
			m.Each("sluice_sidecar_drop_ratio", func(labels string, v float64) {
				if strings.Contains(labels, `service="`+sd.callee+`"`) {
					h[child.LabelValue(labels, "peer")] = v
				}
			})
			held[i] = h
			v, _ := m.Sum("sluice_sidecar_policy_state", `service="`+sd.callee+`"`, `state="expired"`)
			x := v == 1
			expired[i] = &x
		})
	}
	wg.Wait()
	for bi, b := range buckets {
		sum, count := 0.0, 0
		missing := false
		for i, sd := range c.sidecars {
			if sd.callee != b.Callee {
				continue
			}
			count++
			if held[i] == nil {
				missing = true
				continue
			}
			sum += held[i][b.Caller]
		}
		switch {
		case missing && s > 0:
			ratios[bi][s] = ratios[bi][s-1]
		case count > 0:
			ratios[bi][s] = sum / float64(count)
		}
	}
	return expired
}

// expiryWatch follows, from the sidecars' policy states sampled every
// second, the stretches in which a callee's sidecars held an expired policy,
// as the simulator's Result.Expiries holds them. A change happened between
// two samples, a second apart: it is placed halfway, so that the whole
// seconds the summary reads as expired, or as after the fresh policy, are
// those the samples bracket. Used by the sampler's goroutine only, then
// read once it is done.
type expiryWatch struct {
	c       *cluster
	expired []bool         // per sidecar, as last seen
	prev    time.Duration  // the previous sample
	open    map[string]int // callee → index in list of its stretch under way
	list    []sim.Expiry
}

func newExpiryWatch(c *cluster) *expiryWatch {
	return &expiryWatch{c: c, expired: make([]bool, len(c.sidecars)), open: map[string]int{}}
}

// observe takes a sample made at, since the load started; note adds to the
// timeline.
func (w *expiryWatch) observe(sample []*bool, at time.Duration, note func(at time.Duration, callee, format string, args ...any)) {
	if sample == nil {
		return
	}
	prev := w.prev
	w.prev = at
	mid := prev + (at-prev)/2
	for i, x := range sample {
		if x != nil {
			w.expired[i] = *x
		}
	}
	sc := w.c.sc
	for _, svc := range sc.Services {
		n, expired := 0, 0
		for i, sd := range w.c.sidecars {
			if sd.callee == svc.Name {
				n++
				if w.expired[i] {
					expired++
				}
			}
		}
		k, under := w.open[svc.Name]
		switch {
		case expired > 0 && !under:
			mode := dataplane.FailOpen.String()
			if l := sc.Limits.Service(svc.Name); l != nil {
				mode = l.FailMode.String()
			}
			ttl := sc.Loop.Controller.PolicyTTL
			w.open[svc.Name] = len(w.list)
			// The controller counts every sidecar that reports: all of
			// them, here, before the outage.
			w.list = append(w.list, sim.Expiry{Callee: svc.Name, FailMode: mode, TTL: ttl, LiveInstances: n, From: mid, To: -1})
			note(mid, svc.Name, "%s: policy expired (%v TTL), fail mode %s: at %d of %d sidecars by %s", svc.Name, ttl, mode, expired, n, sinceStart(at))
		case expired == 0 && under:
			delete(w.open, svc.Name)
			w.list[k].To = mid
			note(mid, svc.Name, "%s: fresh policy at every sidecar by %s, fail mode over", svc.Name, sinceStart(at))
		}
	}
}

// result is the stretches seen, those under way at the end ending at end.
func (w *expiryWatch) result(end time.Duration) []sim.Expiry {
	for i := range w.list {
		if w.list[i].To < 0 {
			w.list[i].To = end
		}
	}
	return w.list
}

// secondLine is the progress line of second s.
func secondLine(buckets []sim.Bucket, gens []generator, fr *front, ratios [][]float64, s int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%4ds", s)
	for bi, bk := range buckets {
		off, adm, _, _ := seconds(bk, bi, gens, fr, s)
		fmt.Fprintf(&b, "  %s %.0f→%.0f (%.3f)", bk.Caller, off, adm, ratios[bi][s])
	}
	return b.String()
}

// timeline collects the events of a run as they happen.
type timeline struct {
	mu   sync.Mutex // protects list
	list []sim.Happening
}

func (t *timeline) note(start time.Time, format string, args ...any) {
	t.noteAt(time.Since(start), "", format, args...)
}

// noteAt notes a happening of one callee's (or of the loop's: ""), at a
// time since start worked out by the caller.
func (t *timeline) noteAt(at time.Duration, callee, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.list = append(t.list, sim.Happening{At: at, What: fmt.Sprintf(format, args...), Callee: callee})
}

// sinceStart formats a time since the start to the hundredth: 50.01s.
func sinceStart(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s" }

// playEvents runs the scenario's events at their times since start.
func playEvents(ctx context.Context, c *cluster, start time.Time, tl *timeline) error {
	sc := c.sc
	var watchers sync.WaitGroup
	defer watchers.Wait() // they end with ctx
	for _, ev := range sc.Events {
		if err := sleep(ctx, time.Until(start.Add(ev.At))); err != nil {
			return nil // the run ended first
		}
		switch ev.Kind {
		case sim.KillAggregator:
			z := indexOf(sc.Zones, ev.Zone)
			if err := c.killAggregator(z); err != nil {
				return err
			}
			what := "its sidecars have no other aggregator"
			if len(sc.Zones) > 1 {
				what = "its sidecars fail over to the next zone's, " + sc.Zones[(z+1)%len(sc.Zones)]
			}
			tl.note(start, "aggregator %s killed (SIGKILL); %s", ev.Zone, what)
		case sim.RestartController:
			stopped := time.Now()
			if err := c.stopController(); err != nil {
				return fmt.Errorf("stop the controller: %w", err)
			}
			tl.note(start, "controller stopped (SIGTERM, exited after %v); back %v after the signal", time.Since(stopped).Round(time.Millisecond), ev.Down)
			if err := sleep(ctx, time.Until(stopped.Add(ev.Down))); err != nil {
				return nil
			}
			if err := c.restartController(ctx); err != nil {
				return fmt.Errorf("restart the controller: %w", err)
			}
			tl.note(start, "controller started again on the same ports, with empty state; warms up for %v", sc.Loop.Controller.Warmup)
			ctl := c.controller()
			watchers.Go(func() { watchWarm(ctx, ctl, start, tl) })
		}
	}
	return nil
}

// watchWarm notes when a restarted controller is warm again.
func watchWarm(ctx context.Context, ctl *node, start time.Time, tl *timeline) {
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		}
		if m, err := scrape(ctx, ctl.admin); err == nil {
			if warm, _ := m.Sum("sluice_controller_warm"); warm == 1 {
				tl.note(start, "controller warm: publishing")
				return
			}
		}
	}
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}
