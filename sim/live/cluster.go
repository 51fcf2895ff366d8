package live

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/child"
	"github.com/sluicehq/sluice/sim"
)

// node is a running binary and its listeners.
type node struct {
	*child.Proc
	admin string // admin address: /metrics, /readyz
	addr  string // gRPC for the controller and an aggregator, the proxy for a sidecar
}

// sidecarNode is one sidecar of a callee in a zone.
type sidecarNode struct {
	*node
	callee string
	zone   int
}

// cluster is the processes of a live run and the upstream app behind the
// sidecars.
type cluster struct {
	sc     *sim.Scenario
	bin    string
	limits string // the controller's limits file

	app     *http.Server
	appURL  string
	appDone chan struct{} // closed when the app's Serve has returned

	mu       sync.Mutex // protects ctl and procs: events replace the controller
	ctl      *node
	procs    []*child.Proc // every process started, for Close
	aggs     []*node       // per zone, in scenario order
	sidecars []*sidecarNode
	// ctlGRPC and ctlAdmin are the controller's first addresses; a
	// restarted controller takes them again so that its clients find it.
	ctlGRPC, ctlAdmin string
	// dead are processes a scenario event stopped on purpose.
	dead map[*child.Proc]bool
}

// startCluster writes the limits file into dir, starts the upstream app, the
// controller, an aggregator per zone and the sidecars, and waits until the
// controller is warm, every aggregator holds every one of its sidecars and
// every sidecar of a callee with limits holds a policy. seed draws the
// instants the aggregators and sidecars start at. On error everything
// started is stopped again.
func startCluster(ctx context.Context, sc *sim.Scenario, bin, dir string, seed uint64) (c *cluster, err error) {
	c = &cluster{sc: sc, bin: bin, dead: map[*child.Proc]bool{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
			c = nil
		}
	}()
	doc, err := LimitsFile(sc.Limits)
	if err != nil {
		return nil, err
	}
	c.limits = filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(c.limits, doc, 0o600); err != nil {
		return nil, err
	}
	if err := c.startApp(); err != nil {
		return nil, err
	}
	if err := c.startController(ctx, "127.0.0.1:0", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	c.ctlGRPC, c.ctlAdmin = c.ctl.addr, c.ctl.admin

	// Processes that start together tick together; in a fleet they do
	// not, and neither do the simulator's, whose phases are random. So the
	// aggregators start at random instants over a flush interval, and the
	// sidecars over a report interval (which spreads their surge checks
	// too).
	rng := rand.New(rand.NewPCG(seed, 0x6c697665)) // "live"
	aggProcs := make([]*child.Proc, len(sc.Zones))
	err = staggered(ctx, rng, sc.Loop.FlushInterval, len(sc.Zones), func(z int) error {
		zone := sc.Zones[z]
		p, err := c.start("aggregator-"+zone, "aggregator", "--id=aggregator-"+zone, "--zone="+zone,
			"--controllers="+c.ctlGRPC, "--grpc-addr=127.0.0.1:0", "--admin-addr=127.0.0.1:0",
			"--flush-interval="+sc.Loop.FlushInterval.String(),
			"--stale-after="+strconv.Itoa(sc.Loop.AggregatorStaleAfter))
		aggProcs[z] = p
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, p := range aggProcs {
		n, err := listen(ctx, p, "grpc")
		if err != nil {
			return nil, err
		}
		c.aggs = append(c.aggs, n)
	}
	type sidecarSpec struct {
		callee string
		zone   int
		args   []string
	}
	var specs []sidecarSpec
	for _, svc := range sc.Services {
		for z, count := range svc.Sidecars {
			// Its own zone's aggregator first, then the following zones'
			// in scenario order, as the simulator fails over.
			var aggs []string
			for i := range c.aggs {
				aggs = append(aggs, c.aggs[(z+i)%len(c.aggs)].addr)
			}
			for i := range count {
				id := fmt.Sprintf("%s-%s-%d", svc.Name, sc.Zones[z], i)
				specs = append(specs, sidecarSpec{callee: svc.Name, zone: z, args: []string{
					"--id=" + id, "--service=" + svc.Name, "--zone=" + sc.Zones[z],
					"--upstream=" + c.appURL, "--aggregators=" + strings.Join(aggs, ","), "--controllers=" + c.ctlGRPC,
					"--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0",
					"--report-interval=" + sc.Loop.ReportInterval.String(),
					"--surge-check=" + sc.Loop.SurgeCheck.String(),
				}})
			}
		}
	}
	sidecarProcs := make([]*child.Proc, len(specs))
	err = staggered(ctx, rng, sc.Loop.ReportInterval, len(specs), func(i int) error {
		p, err := c.start(strings.TrimPrefix(specs[i].args[0], "--id="), "sidecar", specs[i].args...)
		sidecarProcs[i] = p
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, p := range sidecarProcs {
		n, err := listen(ctx, p, "http")
		if err != nil {
			return nil, err
		}
		c.sidecars = append(c.sidecars, &sidecarNode{node: n, callee: specs[i].callee, zone: specs[i].zone})
	}
	return c, c.waitReady(ctx)
}

// staggered calls start(i) for i in [0, n), each at a random instant
// within window from now, in the order of those instants.
func staggered(ctx context.Context, rng *rand.Rand, window time.Duration, n int, start func(i int) error) error {
	type at struct {
		i int
		d time.Duration
	}
	order := make([]at, n)
	for i := range order {
		order[i] = at{i, time.Duration(rng.Int64N(int64(window)))}
	}
	slices.SortFunc(order, func(a, b at) int { return cmp.Compare(a.d, b.d) })
	begin := time.Now()
	for _, o := range order {
		if err := sleep(ctx, time.Until(begin.Add(o.d))); err != nil {
			return err
		}
		if err := start(o.i); err != nil {
			return err
		}
	}
	return nil
}

// startApp serves the upstream app in-process: every request gets 200.
func (c *cluster) startApp() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen for the upstream app: %w", err)
	}
	c.app = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Write([]byte("ok\n"))
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	c.appURL = "http://" + ln.Addr().String()
	c.appDone = make(chan struct{})
	go func() {
		defer close(c.appDone)
		c.app.Serve(ln) // ends with Close; its error is http.ErrServerClosed
	}()
	return nil
}

func (c *cluster) start(name, binary string, args ...string) (*child.Proc, error) {
	p, err := child.Start(name, filepath.Join(c.bin, binary), args...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// listen waits for p's admin address and its other listener's.
func listen(ctx context.Context, p *child.Proc, listener string) (*node, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	admin, err := p.Addr(ctx, "admin")
	if err != nil {
		return nil, err
	}
	addr, err := p.Addr(ctx, listener)
	if err != nil {
		return nil, err
	}
	return &node{Proc: p, admin: admin, addr: addr}, nil
}

// startController starts a controller on the given addresses. A restarted
// controller binds its predecessor's ports, which the kernel may not have
// released yet: it tries again for a few seconds.
func (c *cluster) startController(ctx context.Context, grpcAddr, adminAddr string) error {
	cfg := c.sc.Loop.Controller
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	args := []string{"--id=controller", "--grpc-addr=" + grpcAddr, "--admin-addr=" + adminAddr,
		"--limits=" + c.limits, "--limits-reload=0",
		"--tick=" + cfg.Tick.String(),
		"--stale-after=" + strconv.Itoa(cfg.StaleAfter),
		"--warmup=" + cfg.Warmup.String(),
		"--policy-ttl=" + cfg.PolicyTTL.String(),
		"--republish-threshold=" + f(cfg.RepublishThreshold),
		"--p-max=" + f(cfg.Law.PMax),
		"--min-rate=" + f(cfg.Law.MinRate),
		"--release-rate=" + f(cfg.Law.ReleaseRate),
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := c.start("controller", "controller", args...)
		if err != nil {
			return err
		}
		n, err := listen(ctx, p, "grpc")
		if err == nil {
			c.mu.Lock()
			c.ctl = n
			c.mu.Unlock()
			return nil
		}
		p.Kill(stopTimeout) // if it still runs, it is stuck
		c.mu.Lock()
		c.dead[p] = true // a failed attempt, not a crash
		c.mu.Unlock()
		if !strings.Contains(p.Output(), "address already in use") || time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// sleep waits for d or the end of ctx.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (c *cluster) controller() *node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ctl
}

// waitReady waits until the controller is warm, every aggregator has a
// controller and holds all its sidecars, and every sidecar of a callee with
// limits holds a policy for it.
func (c *cluster) waitReady(ctx context.Context) error {
	bound := startTimeout + 3*c.sc.Loop.Controller.Warmup
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	want := make([]int, len(c.aggs))
	for _, s := range c.sidecars {
		want[s.zone]++
	}
	var why string
	for {
		if err := c.checkAlive(); err != nil {
			return err
		}
		why = c.notReady(ctx, want)
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the processes were not ready within %v: %s", bound, why)
		case <-poll.C:
		}
	}
}

// notReady says what is not ready yet; "" when everything is.
func (c *cluster) notReady(ctx context.Context, want []int) string {
	ctl := c.controller()
	m, err := scrape(ctx, ctl.admin)
	if err != nil {
		return "controller: " + err.Error()
	}
	if warm, _ := m.Sum("sluice_controller_warm"); warm != 1 {
		return "the controller is warming up"
	}
	for z, a := range c.aggs {
		m, err := scrape(ctx, a.admin)
		if err != nil {
			return a.Name() + ": " + err.Error()
		}
		if n, _ := m.Sum("sluice_aggregator_sidecars"); int(n) != want[z] {
			return fmt.Sprintf("%s holds %v sidecars of %d", a.Name(), n, want[z])
		}
		if up, _ := m.Sum("sluice_aggregator_controller_connected"); up != 1 {
			return a.Name() + " has no controller"
		}
	}
	for _, s := range c.sidecars {
		if c.sc.Limits.Service(s.callee) == nil {
			continue // nothing to publish: the controller only observes
		}
		m, err := scrape(ctx, s.admin)
		if err != nil {
			return s.Name() + ": " + err.Error()
		}
		if _, ok := m.Sum("sluice_sidecar_policy_peers", `service="`+s.callee+`"`); !ok {
			return s.Name() + " holds no policy for " + s.callee
		}
	}
	return ""
}

// checkAlive reports a process that exited without an event stopping it.
func (c *cluster) checkAlive() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.Exited() && !c.dead[p] {
			return p.Failure("exited")
		}
	}
	return nil
}

// killAggregator sends SIGKILL to zone z's aggregator: its streams end at
// once, and its sidecars fail over to the next zone's.
func (c *cluster) killAggregator(z int) error {
	a := c.aggs[z]
	c.mu.Lock()
	c.dead[a.Proc] = true
	c.mu.Unlock()
	return a.Kill(stopTimeout)
}

// stopController sends the controller SIGTERM and waits for it to exit.
func (c *cluster) stopController() error {
	ctl := c.controller()
	c.mu.Lock()
	c.dead[ctl.Proc] = true
	c.mu.Unlock()
	return ctl.Term(stopTimeout)
}

// restartController starts a new controller on the first one's ports.
func (c *cluster) restartController(ctx context.Context) error {
	return c.startController(ctx, c.ctlGRPC, c.ctlAdmin)
}

// Close stops every process, sidecars first, then aggregators, then the
// controller (SIGTERM, SIGKILL after stopTimeout), and the app. It is
// idempotent.
func (c *cluster) Close() error {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var errs []error
	for _, prefix := range []string{"sidecar", "aggregator", "controller"} {
		var g errgroup.Group
		var mu sync.Mutex
		for _, p := range procs {
			if p.Binary() != prefix {
				continue
			}
			g.Go(func() error {
				if err := p.Term(stopTimeout); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
				return nil
			})
		}
		g.Wait()
	}
	if c.app != nil {
		errs = append(errs, ignoreClosed(c.app.Close()))
		<-c.appDone
		c.app = nil
	}
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
