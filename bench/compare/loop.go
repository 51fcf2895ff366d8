package compare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// The two callers of every loop run: web is the one that surges or is over
// its limit; mobile stays under its own and must lose nothing.
const (
	service = "checkout"
	web     = "web"
	mobile  = "mobile"
)

// Plan is the offered load of a loop run, the same for both designs.
type Plan struct {
	Total  time.Duration
	Limit  float64                       // rps, each caller's
	Web    func(t time.Duration) float64 // web's offered rps
	Mobile float64                       // mobile's offered rps
	// Down and Up, when Up > Down, are the seconds the limiter's shared
	// part is stopped and started again: Redis, or sluice's controller.
	Down, Up int
}

// LoopRun is one design's run of a plan.
type LoopRun struct {
	Design      string
	Web, Mobile []Sample
	// InForce is web's drop ratio in force at one sidecar at the end of
	// each second, fail-open decay applied (sluice only).
	InForce []float64
	// Expired is whether that sidecar's policy had expired (sluice only).
	Expired []bool
}

// fleetSize is how many sidecars, or Redis-calling proxies, share the
// load: three zones of two, as in the end-to-end tests and the demo.
const fleetSize = 6

// RunRedisLoop drives plan through fleetSize gates that share one token
// bucket per caller in srv, each with its own pooled client, all in front
// of one app. With plan.Up > plan.Down, srv is stopped at Down and started
// again, empty, at Up.
func RunRedisLoop(ctx context.Context, srv *RedisServer, plan Plan, burst float64) (*LoopRun, error) {
	app, err := Serve(App())
	if err != nil {
		return nil, err
	}
	defer app.Close()
	var gates []*Gate
	var targets []string
	for i := range fleetSize {
		client := NewRedisClient(srv.Addr, 32)
		defer client.Close()
		if i == 0 {
			// Buckets left by an earlier run would start this one part
			// empty.
			if err := client.FlushAll(ctx).Err(); err != nil {
				return nil, fmt.Errorf("flush redis: %w", err)
			}
		}
		tb, err := NewTokenBucket(ctx, client, plan.Limit, burst)
		if err != nil {
			return nil, err
		}
		g, p, err := NewGateProxy(app.URL, tb, service)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		s, err := Serve(g)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		gates, targets = append(gates, g), append(targets, s.URL)
	}
	seconds := int(plan.Total / time.Second)
	cum := make([]GateCounts, seconds)
	events := map[int]func() error{}
	if plan.Up > plan.Down {
		events[plan.Down] = func() error { srv.Stop(); return nil }
		events[plan.Up] = func() error { return srv.Start(ctx) }
	}
	g, err := runPlan(ctx, targets, plan, events, func(s int) {
		for _, gt := range gates {
			c := gt.Counts()
			cum[s].Decisions += c.Decisions
			cum[s].Dropped += c.Dropped
			cum[s].FailedOpen += c.FailedOpen
		}
	})
	if err != nil {
		return nil, err
	}
	run := &LoopRun{Design: "Redis + Lua token bucket"}
	run.Web, run.Mobile = samples(g, web, seconds), samples(g, mobile, seconds)
	for s, d := range Deltas(cum) {
		run.Web[s].FailedOpen, run.Web[s].Decisions = d.FailedOpen, d.Decisions
	}
	return run, nil
}

// RunSluiceLoop drives plan through a whole sluice loop on loopback
// (internal/testbed: a controller, three zone aggregators, six sidecars, at
// the binaries' default intervals and policy TTL). With plan.Up > plan.Down,
// the controller is stopped at Down and a fresh one started at Up.
func RunSluiceLoop(ctx context.Context, plan Plan) (*LoopRun, error) {
	set := limits.NewSet(map[string]*limits.Service{
		service: {
			Name: service, Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{
				web:    {Limit: plan.Limit, Mode: dropratio.Enforce},
				mobile: {Limit: plan.Limit, Mode: dropratio.Enforce},
			},
		},
	})
	cfg := controller.DefaultConfig()
	// The demo's warm-up: a controller restarted mid-run waits this long
	// for zone loads before it publishes.
	cfg.Warmup = 2 * time.Second
	c, err := testbed.Start(testbed.Options{Service: service, Limits: set, Controller: &cfg,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("start the sluice loop: %w", err)
	}
	defer c.Close()
	if err := waitPolicies(ctx, c); err != nil {
		return nil, err
	}
	seconds := int(plan.Total / time.Second)
	run := &LoopRun{Design: "sluice", InForce: make([]float64, seconds), Expired: make([]bool, seconds)}
	events := map[int]func() error{}
	if plan.Up > plan.Down {
		// The restarted controller takes the old one's address, which
		// the aggregators and sidecars keep redialling.
		addr := c.ControllerAddr
		events[plan.Down] = c.StopController
		events[plan.Up] = func() error { return c.StartController(addr) }
	}
	lim := c.Sidecars[0].Agent.Limiter()
	g, err := runPlan(ctx, c.SidecarURLs(), plan, events, func(s int) {
		st := lim.Status(service)
		run.Expired[s] = st.State == sidecar.Expired
		r := c.Ratio(web)
		if st.State == sidecar.Expired && st.FailMode == dataplane.FailOpen {
			r *= 1 - st.Decay
		}
		run.InForce[s] = r
	})
	if err != nil {
		return nil, err
	}
	run.Web, run.Mobile = samples(g, web, seconds), samples(g, mobile, seconds)
	return run, nil
}

func waitPolicies(ctx context.Context, c *testbed.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ready := true
		for _, s := range c.Sidecars {
			ready = ready && s.Agent.Limiter().Policy(service) != nil
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no policy reached the sidecars: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// runPlan sends plan's load to targets. sample runs at the end of every
// second; events[s] run at t = s seconds, each in its own goroutine so that
// stopping or starting a server never stalls the pacing, and are waited for
// before runPlan returns.
func runPlan(ctx context.Context, targets []string, plan Plan, events map[int]func() error, sample func(s int)) (*loadgen.Generator, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex // protects errs
	var errs []error
	seconds := int(plan.Total / time.Second)
	g, err := loadgen.New(loadgen.Options{
		Targets: targets,
		Callers: []loadgen.Caller{
			{Name: web, Rate: plan.Web},
			{Name: mobile, Rate: func(time.Duration) float64 { return plan.Mobile }},
		},
		Duration: plan.Total,
		SecondEnded: func(s int) {
			if s < seconds {
				sample(s)
			}
			if ev := events[s+1]; ev != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := ev(); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("event at %ds: %w", s+1, err))
						mu.Unlock()
					}
				}()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	err = g.Run(ctx, nil)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return g, errors.Join(errs...)
}

func samples(g *loadgen.Generator, caller string, seconds int) []Sample {
	out := make([]Sample, seconds)
	for s := range out {
		x := g.Second(caller, s)
		out[s] = Sample{Offered: x.Sent, Admitted: x.Admitted, Dropped: x.Dropped, Errors: x.Errors, Skipped: x.Skipped}
	}
	return out
}
