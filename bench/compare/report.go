package compare

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
)

// Env is what the report says about the machine and the run.
type Env struct {
	Date                    time.Time
	GoVersion, RedisVersion string
	CPUs                    int
	CPUModel, Kernel        string
	LoadBefore, LoadAfter   string
	Quick                   bool
	Elapsed                 time.Duration
}

// Results is everything one run measured.
type Results struct {
	Env                Env
	Floor              *LatencyResult
	Decisions, Proxies []*LatencyResult
	Surge              SurgeSetup
	SurgeRuns          []*LoopRun // Redis, then sluice
	Outage             OutageSetup
	OutageRuns         []*LoopRun
}

// SurgeSetup and OutageSetup describe the loop runs' load for the report.
type SurgeSetup struct {
	Limit, Calm, Peak float64
	Start, End, Total int
	Burst             float64
}

type OutageSetup struct {
	Limit, Offered, Mobile float64
	Down, Up, Total        int
}

// Assumed network round trips for the arithmetic of what leaving loopback
// costs the Redis designs: not measured here.
var assumedRTTs = []time.Duration{250 * time.Microsecond, time.Millisecond}

// WriteMarkdown writes the tables.
func (r *Results) WriteMarkdown(w io.Writer) {
	e := r.Env
	fmt.Fprintf(w, "## Results of `make bench-compare`%s\n\n", map[bool]string{true: " (-quick: too short to quote)", false: ""}[e.Quick])
	fmt.Fprintf(w, "%s; %d CPUs (%s), %s; %s, redis-server %s. Load average (1, 5, 15 min) before: %s, after: %s. The run took %s.\n\n",
		e.Date.UTC().Format("2006-01-02 15:04 MST"), e.CPUs, e.CPUModel, e.Kernel, e.GoVersion, e.RedisVersion,
		e.LoadBefore, e.LoadAfter, e.Elapsed.Round(time.Second))

	if r.Floor != nil {
		fmt.Fprintf(w, "Timing one operation costs %s at p50 (an empty operation, timed the same way): the floor of every latency below.\n\n", dur(r.Floor.Hist.Quantile(0.5)))
	}
	if len(r.Decisions) > 0 {
		fmt.Fprintf(w, "### One decision\n\n")
		latencyTable(w, r.Decisions, "decisions/s")
		fmt.Fprintf(w, "\nsluice vs Redis, same keys and concurrency (× = how many times faster sluice is; throughput: sluice ÷ Redis):\n\n")
		fmt.Fprintf(w, "| keys | concurrency | vs Lua p50 | vs Lua p99 | vs Lua p99.9 | vs Lua throughput | vs fixed window p50 | vs fixed window p99 | vs fixed window throughput |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Decisions {
			if s.Design != DesignSluice {
				continue
			}
			lua, fw := find(r.Decisions, DesignLua, s.Keys, s.Concurrency), find(r.Decisions, DesignWindow, s.Keys, s.Concurrency)
			if lua == nil || fw == nil {
				continue
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", count(s.Keys), s.Concurrency,
				times(lua, s, 0.5), times(lua, s, 0.99), times(lua, s, 0.999), ratio(s.Throughput(), lua.Throughput()),
				times(fw, s, 0.5), times(fw, s, 0.99), ratio(s.Throughput(), fw.Throughput()))
		}
		if lua := find(r.Decisions, DesignLua, 1, 1); lua != nil {
			p50 := lua.Hist.Quantile(0.5)
			fmt.Fprintf(w, "\nLoopback is Redis's best case. Arithmetic, not a measurement: with a network round trip of RTT between the app and Redis, a Lua decision at concurrency 1 takes about p50 + RTT and one connection makes at most 1 ÷ (p50 + RTT) decisions a second:\n\n")
			fmt.Fprintf(w, "| assumed RTT | Lua decision, p50 | decisions/s per connection |\n|---|---|---|\n")
			fmt.Fprintf(w, "| 0 (loopback, measured) | %s | %s |\n", dur(p50), count(int(float64(time.Second)/float64(p50))))
			for _, rtt := range assumedRTTs {
				fmt.Fprintf(w, "| %s | %s | %s |\n", dur(rtt), dur(p50+rtt), count(int(float64(time.Second)/float64(p50+rtt))))
			}
		}
	}
	if len(r.Proxies) > 0 {
		fmt.Fprintf(w, "\n### One request through a proxy (HTTP/1.1, keep-alive, loopback)\n\n")
		latencyTable(w, r.Proxies, "requests/s")
		fmt.Fprintf(w, "\nWhat each proxy adds to a direct request (p50 and p99 of the proxied path minus those of the direct path) and the sidecar vs the Redis-calling proxy:\n\n")
		fmt.Fprintf(w, "| keys | concurrency | sidecar adds p50 | Redis proxy adds p50 | sidecar adds p99 | Redis proxy adds p99 | Redis proxy ÷ sidecar p50 | p99 | sidecar ÷ Redis proxy throughput |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Proxies {
			if s.Design != DesignSidecarProx {
				continue
			}
			d, g := find(r.Proxies, DesignDirect, s.Keys, s.Concurrency), find(r.Proxies, DesignGateProxy, s.Keys, s.Concurrency)
			if d == nil || g == nil {
				continue
			}
			add := func(x *LatencyResult, q float64) string { return dur(x.Hist.Quantile(q) - d.Hist.Quantile(q)) }
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", count(s.Keys), s.Concurrency,
				add(s, 0.5), add(g, 0.5), add(s, 0.99), add(g, 0.99), times(g, s, 0.5), times(g, s, 0.99), ratio(s.Throughput(), g.Throughput()))
		}
	}
	if len(r.SurgeRuns) > 0 {
		r.writeSurge(w)
	}
	if len(r.OutageRuns) > 0 {
		r.writeOutage(w)
	}
}

func latencyTable(w io.Writer, rs []*LatencyResult, unit string) {
	fmt.Fprintf(w, "| design | keys | concurrency | p50 | p99 | p99.9 | %s | dropped | errors |\n|---|---|---|---|---|---|---|---|---|\n", unit)
	for _, x := range rs {
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %d | %d |\n", x.Design, count(x.Keys), x.Concurrency,
			dur(x.Hist.Quantile(0.5)), dur(x.Hist.Quantile(0.99)), dur(x.Hist.Quantile(0.999)),
			count(int(x.Throughput())), x.Dropped, x.Errors)
	}
}

func (r *Results) writeSurge(w io.Writer) {
	s := r.Surge
	fmt.Fprintf(w, "\n### Accuracy under a surge\n\n")
	fmt.Fprintf(w, "Limit %g rps for each caller. web offers %g rps, then %g rps (%.0f×) from t=%ds to t=%ds; mobile offers %g rps throughout. Six proxies share the load round-robin: six sluice sidecars in a whole loop (controller, three aggregators, 1 s intervals), or six reverse proxies sharing one Redis token bucket per caller (rate %g/s, burst %g).\n\n",
		s.Limit, s.Calm, s.Peak, s.Peak/s.Limit, s.Start, s.End, s.Calm, s.Limit, s.Burst)
	fmt.Fprintf(w, "| design | web admitted, first surge second | time to enforce (±5 %%) | web admitted, steady (t=%d..%ds) | worst steady second | admitted above the limit during the surge | web lost after the surge, under its limit | mobile dropped | decisions failed open | errors + skipped |\n|---|---|---|---|---|---|---|---|---|---|\n", s.Start+steadyFrom, s.End)
	for _, run := range r.SurgeRuns {
		x := SummarizeSurge(run.Web, s.Limit, s.Start, s.End)
		m := SummarizeSurge(run.Mobile, s.Limit, s.Start, s.End)
		tte := "never"
		if x.TimeToEnforce >= 0 {
			tte = fmt.Sprintf("%d s", x.TimeToEnforce)
		}
		failed := "none: every decision is local"
		if run.InForce == nil {
			failed = fmt.Sprint(x.FailedOpen)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %.1f rps (%+.1f %%) | ±%.1f %% | %d | %d | %d of %d | %s | %d |\n", run.Design, x.FirstSecond, tte,
			x.Steady, 100*x.SteadyErr, 100*x.WorstErr, x.OverLimit, x.AfterLost, m.Dropped, m.Sent, failed, x.Problems+m.Problems)
	}
	fmt.Fprintf(w, "\nSecond by second (web; the plot is docs/img/bench-compare-accuracy.png):\n\n")
	fmt.Fprintf(w, "| t | offered | Redis admitted | Redis decisions failed open (all callers) | sluice admitted | sluice ratio in force |\n|---|---|---|---|---|---|\n")
	redis, sl := r.SurgeRuns[0], r.SurgeRuns[len(r.SurgeRuns)-1]
	for t := range redis.Web {
		if t >= len(sl.Web) {
			break
		}
		fmt.Fprintf(w, "| %d | %d | %d | %d | %d | %.3f |\n", t, redis.Web[t].Offered, redis.Web[t].Admitted, redis.Web[t].FailedOpen, sl.Web[t].Admitted, sl.InForce[t])
	}
}

func (r *Results) writeOutage(w io.Writer) {
	o := r.Outage
	fmt.Fprintf(w, "\n### When the shared part stops\n\n")
	fmt.Fprintf(w, "web offers %g rps against its limit of %g throughout, mobile %g rps. At t=%ds Redis (or sluice's controller) is stopped; at t=%ds it is started again (Redis empty, as without persistence). The Redis proxies fail open; sluice's sidecars hold their policy for its TTL (%v, the controller's default), then follow its fail mode (open, decaying over %v).\n\n",
		o.Offered, o.Limit, o.Mobile, o.Down, o.Up, controller.DefaultConfig().PolicyTTL, controller.DefaultConfig().FailOpenDecay)
	fmt.Fprintf(w, "| design | web admitted, %d s before | during | after | share of web's excess admitted while down | share of decisions failed open while down | held the limit for | errors + skipped |\n|---|---|---|---|---|---|---|---|\n", outageLead)
	for _, run := range r.OutageRuns {
		x := SummarizeOutage(run.Web, o.Limit, o.Down, o.Up, run.InForce == nil)
		m := SummarizeOutage(run.Mobile, o.Limit, o.Down, o.Up, false)
		share := "none: every decision is local"
		if !math.IsNaN(x.FailOpenShare) {
			share = fmt.Sprintf("%.1f %%", 100*x.FailOpenShare)
		}
		fmt.Fprintf(w, "| %s | %.0f rps | %.0f rps | %.0f rps | %.1f %% | %s | %d of %d s | %d |\n", run.Design, x.Before, x.During, x.After,
			100*x.ExcessAdmitted, share, x.HeldFor, o.Up-o.Down, x.Problems+m.Problems)
	}
	fmt.Fprintf(w, "\nSecond by second (web; the plot is docs/img/bench-compare-outage.png):\n\n")
	fmt.Fprintf(w, "| t | offered | Redis admitted | Redis decisions failed open | sluice admitted | sluice ratio in force | sluice policy expired |\n|---|---|---|---|---|---|---|\n")
	redis, sl := r.OutageRuns[0], r.OutageRuns[len(r.OutageRuns)-1]
	for t := range redis.Web {
		if t >= len(sl.Web) {
			break
		}
		mark := ""
		if t >= o.Down && t < o.Up {
			mark = " (down)"
		}
		fmt.Fprintf(w, "| %d%s | %d | %d | %d of %d | %d | %.3f | %v |\n", t, mark, redis.Web[t].Offered, redis.Web[t].Admitted,
			redis.Web[t].FailedOpen, redis.Web[t].Decisions, sl.Web[t].Admitted, sl.InForce[t], sl.Expired[t])
	}
}

func find(rs []*LatencyResult, design string, keys, conc int) *LatencyResult {
	for _, r := range rs {
		if r.Design == design && r.Keys == keys && r.Concurrency == conc {
			return r
		}
	}
	return nil
}

// times is how many times slower a is than b at quantile q.
func times(a, b *LatencyResult, q float64) string {
	return ratio(float64(a.Hist.Quantile(q)), float64(b.Hist.Quantile(q)))
}

func ratio(a, b float64) string {
	if b <= 0 || a <= 0 {
		return "-"
	}
	x := a / b
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

// dur prints a latency with three significant figures in its natural unit.
func dur(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d < time.Microsecond:
		s = fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		s = sig3(float64(d)/1e3) + " µs"
	default:
		s = sig3(float64(d)/1e6) + " ms"
	}
	if neg {
		return "−" + s
	}
	return s
}

func sig3(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// count prints n with thousands separators.
func count(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
