// Package compare measures sluice against the design most teams start
// from: a Redis token bucket run as a Lua script on every request, or a
// fixed window counted with INCR and EXPIRE in MULTI/EXEC, failing open on
// errors. In one run, on one machine, with a throwaway redis-server on
// loopback, it measures one decision and one proxied request of each
// design at several concurrencies and key counts, the global admitted rate
// of each under the same surge, and what each does while its shared part
// (Redis, or sluice's controller) is stopped. `make bench-compare` runs it;
// docs/benchmarks.md reads the results.
package compare

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options shape a run.
type Options struct {
	// Quick shortens every part so that the harness can be checked in
	// under a minute; its numbers are not worth quoting.
	Quick bool
	// Parts to run: any of decisions, proxies, surge, outage; nil for all.
	Parts []string
	// Log receives progress lines.
	Log io.Writer
}

func (o Options) want(part string) bool {
	if len(o.Parts) == 0 {
		return true
	}
	for _, p := range o.Parts {
		if p == part {
			return true
		}
	}
	return false
}

// Run starts redis-server, runs the parts and stops redis-server again,
// also when ctx ends early.
func Run(ctx context.Context, o Options) (*Results, error) {
	began := time.Now()
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
		}
	}
	// go-redis logs every failed dial; while Redis is stopped on purpose
	// that is thousands of lines. The gates count every failure instead.
	redis.SetLogger(discardLogger{})
	r := &Results{Env: environment(o.Quick)}
	r.Env.LoadBefore = loadAverage()
	srv, err := StartRedis(ctx)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	logf("redis-server %s on %s (no persistence, temp dir)", r.Env.RedisVersion, srv.Addr)

	matrix := MatrixOptions{Concurrency: []int{1, 8, 64}, KeyCounts: []int{1, 10_000}, Warm: 500 * time.Millisecond, Measure: 3 * time.Second}
	surge := SurgeSetup{Limit: 100, Calm: 60, Peak: 1000, Start: 5, End: 25, Total: 35, Burst: 10}
	outage := OutageSetup{Limit: 100, Offered: 500, Mobile: 60, Down: 10, Up: 40, Total: 50}
	if o.Quick {
		matrix.Warm, matrix.Measure = 100*time.Millisecond, 300*time.Millisecond
		surge.Start, surge.End, surge.Total = 3, 9, 13
		outage.Down, outage.Up, outage.Total = 4, 16, 20
	}
	progress := func(x *LatencyResult) {
		logf("%-40s keys=%-6d conc=%-3d p50=%-9s p99=%-9s p99.9=%-9s %10.0f/s errors=%d dropped=%d", x.Design, x.Keys, x.Concurrency,
			dur(x.Hist.Quantile(0.5)), dur(x.Hist.Quantile(0.99)), dur(x.Hist.Quantile(0.999)), x.Throughput(), x.Errors, x.Dropped)
	}

	if o.want("decisions") {
		r.Floor = ClockFloor(ctx, matrix.Measure)
		progress(r.Floor)
		if r.Decisions, err = RunDecisions(ctx, srv.Addr, matrix, progress); err != nil {
			return r, fmt.Errorf("decisions: %w", err)
		}
	}
	if o.want("proxies") {
		if r.Proxies, err = RunProxies(ctx, srv.Addr, matrix, progress); err != nil {
			return r, fmt.Errorf("proxies: %w", err)
		}
	}
	if o.want("surge") {
		r.Surge = surge
		plan := Plan{
			Total: time.Duration(surge.Total) * time.Second, Limit: surge.Limit, Mobile: surge.Calm,
			Web: func(t time.Duration) float64 {
				if t >= time.Duration(surge.Start)*time.Second && t < time.Duration(surge.End)*time.Second {
					return surge.Peak
				}
				return surge.Calm
			},
		}
		logf("surge, Redis + Lua token bucket: %d s", surge.Total)
		rr, err := RunRedisLoop(ctx, srv, plan, surge.Burst)
		if err != nil {
			return r, fmt.Errorf("surge through Redis: %w", err)
		}
		logf("surge, sluice: %d s after the loop starts", surge.Total)
		sr, err := RunSluiceLoop(ctx, plan)
		if err != nil {
			return r, fmt.Errorf("surge through sluice: %w", err)
		}
		r.SurgeRuns = []*LoopRun{rr, sr}
	}
	if o.want("outage") {
		r.Outage = outage
		plan := Plan{
			Total: time.Duration(outage.Total) * time.Second, Limit: outage.Limit, Mobile: outage.Mobile,
			Web:  func(time.Duration) float64 { return outage.Offered },
			Down: outage.Down, Up: outage.Up,
		}
		logf("outage, Redis stopped at %ds, started at %ds: %d s", outage.Down, outage.Up, outage.Total)
		rr, err := RunRedisLoop(ctx, srv, plan, surge.Burst)
		if err != nil {
			return r, fmt.Errorf("outage of Redis: %w", err)
		}
		logf("outage, sluice's controller stopped at %ds, started at %ds: %d s", outage.Down, outage.Up, outage.Total)
		sr, err := RunSluiceLoop(ctx, plan)
		if err != nil {
			return r, fmt.Errorf("outage of sluice's controller: %w", err)
		}
		r.OutageRuns = []*LoopRun{rr, sr}
	}
	r.Env.LoadAfter = loadAverage()
	r.Env.Elapsed = time.Since(began)
	return r, nil
}

func environment(quick bool) Env {
	e := Env{Date: time.Now(), GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), Quick: quick, CPUModel: "model not exposed", RedisVersion: "?"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				e.RedisVersion = v
			}
		}
	}
	return e
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}
