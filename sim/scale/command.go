package scale

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/internal/duration"
)

// Command is the `scale` subcommand of the simulator: it runs Run and prints
// the table.
func Command() *cobra.Command {
	cfg := Default()
	var small, quiet bool
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "scale mode: the real aggregator and controller at mesh scale, with counted traffic",
		Long: `Scale mode runs the production aggregator and controller state machines for a mesh
of --services × --callers buckets and --sidecars sidecars over --zones ×
--aggregators-per-zone aggregators, with counted (not generated) traffic of --rps in
total and a surge on a fraction of the buckets. It reports the controller's tick time,
the aggregators' cost per report and per flush, the live heap of each state, and the
control-plane bytes per second of every tier, with xDS pushed directly to sidecars and,
computed, through aggregators acting as zone relays.

Time is virtual; CPU cost is real, measured on one goroutine. The defaults are the
planning target of issue 4 and need about 3 GiB and a few minutes; --small is a mesh
for a quick look.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if small {
				applySmall(cmd.Flags(), &cfg)
			}
			var progress io.Writer
			if !quiet {
				progress = cmd.ErrOrStderr()
			}
			res, err := Run(cmd.Context(), cfg, progress)
			if err != nil {
				return err
			}
			Print(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Services, "services", cfg.Services, "callee services")
	f.IntVar(&cfg.Callers, "callers", cfg.Callers, "callers per service (buckets = services × callers)")
	f.IntVar(&cfg.Procedures, "procedures", cfg.Procedures, "gRPC procedures per service, each (caller, procedure) leaf with a limit of its own under the caller's (leaves = services × callers × procedures); 0: none")
	f.IntVar(&cfg.ControllerShards, "controller-shards", cfg.ControllerShards, "controller shards the callees are split over (pkg/shard), each aggregator's flush split per shard; the table then gives every shard's tick, CPU, memory and zone-load bytes; 0 or 1: one controller")
	f.IntVar(&cfg.Sidecars, "sidecars", cfg.Sidecars, "sidecars in the mesh, split over services by traffic")
	f.Float64Var(&cfg.RPS, "rps", cfg.RPS, "total offered rate before the surge")
	f.IntVar(&cfg.Zones, "zones", cfg.Zones, "zones")
	f.IntVar(&cfg.AggregatorsPerZone, "aggregators-per-zone", cfg.AggregatorsPerZone, "aggregators per zone")
	f.IntVar(&cfg.Seconds, "seconds", cfg.Seconds, "virtual seconds to run")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the mesh's shape, the surge and the noise")
	f.Float64Var(&cfg.Spread, "spread", cfg.Spread, "σ of the log-normal weights of services and callers (0: all equal)")
	f.Float64Var(&cfg.Noise, "noise", cfg.Noise, "per-bucket per-second relative jitter of the rate")
	f.Float64Var(&cfg.Headroom, "headroom", cfg.Headroom, "limit = base rate × (1 + headroom)")
	f.Float64Var(&cfg.SurgeFraction, "surge-fraction", cfg.SurgeFraction, "share of the buckets that surge")
	f.Float64Var(&cfg.SurgeFactor, "surge-factor", cfg.SurgeFactor, "a surging bucket's rate multiplier")
	f.IntVar(&cfg.SurgeAt, "surge-at", cfg.SurgeAt, "second the surge starts")
	f.IntVar(&cfg.SurgeFor, "surge-for", cfg.SurgeFor, "seconds the surge lasts")
	f.IntVar(&cfg.XDSStreams, "xds-streams", cfg.XDSStreams, "also push every tick into a real xDS server with this many real delta clients (in-memory gRPC, ~200 KB each, at most 20000); 0: off")
	duration.Var(f, &cfg.Controller.Warmup, "warmup", cfg.Controller.Warmup, "controller warm-up before it publishes")
	duration.Var(f, &cfg.Controller.PolicyTTL, "policy-ttl", cfg.Controller.PolicyTTL, "policy TTL; unchanged policies are re-pushed every half TTL")
	f.Float64Var(&cfg.Controller.RepublishThreshold, "republish-threshold", cfg.Controller.RepublishThreshold, "change of a bucket's admitted share that makes a policy worth pushing")
	f.BoolVar(&small, "small", false, "a small mesh (20 services × 10 callers, 300 sidecars, 200k rps, 3 zones × 2 aggregators); flags given explicitly still win")
	f.BoolVar(&quiet, "quiet", false, "no per-second progress on stderr")
	return cmd
}

// applySmall puts Small's values into every field whose flag was not given.
func applySmall(fs *pflag.FlagSet, cfg *Config) {
	s := Small()
	set := func(flag string, dst, v any) {
		if fs.Changed(flag) {
			return
		}
		switch d := dst.(type) {
		case *int:
			*d = v.(int)
		case *float64:
			*d = v.(float64)
		}
	}
	set("services", &cfg.Services, s.Services)
	set("callers", &cfg.Callers, s.Callers)
	set("sidecars", &cfg.Sidecars, s.Sidecars)
	set("rps", &cfg.RPS, s.RPS)
	set("aggregators-per-zone", &cfg.AggregatorsPerZone, s.AggregatorsPerZone)
	set("surge-fraction", &cfg.SurgeFraction, s.SurgeFraction)
}

// CommandLine is the scale command that reproduces cfg.
func CommandLine(cfg Config) string {
	c := cfg.Controller
	return fmt.Sprintf("scale --services %d --callers %d --procedures %d --controller-shards %d --sidecars %d --rps %g --zones %d --aggregators-per-zone %d "+
		"--seconds %d --seed %d --spread %g --noise %g --headroom %g --surge-fraction %g --surge-factor %g "+
		"--surge-at %d --surge-for %d --warmup %v --policy-ttl %v --republish-threshold %g --xds-streams %d",
		cfg.Services, cfg.Callers, cfg.Procedures, cfg.ControllerShards, cfg.Sidecars, cfg.RPS, cfg.Zones, cfg.AggregatorsPerZone,
		cfg.Seconds, cfg.Seed, cfg.Spread, cfg.Noise, cfg.Headroom, cfg.SurgeFraction, cfg.SurgeFactor,
		cfg.SurgeAt, cfg.SurgeFor, c.Warmup, c.PolicyTTL, c.RepublishThreshold, cfg.XDSStreams)
}

// Print writes the report of a run as plain-text tables.
func Print(w io.Writer, r *Result) {
	cfg, c, tm := r.Config, r.Counted, r.Timing
	secs := c.Seconds
	var warm []Second
	for _, s := range secs {
		if s.Warm {
			warm = append(warm, s)
		}
	}
	last := secs[len(secs)-1]

	fmt.Fprintf(w, "sluice scale mode\ncommand: %s\n\n", CommandLine(cfg))
	procs := ""
	if cfg.Procedures > 0 {
		procs = fmt.Sprintf(" × %d procedures", cfg.Procedures)
	}
	fmt.Fprintf(w, "mesh: %d services × %d callers%s = %d buckets; %d sidecars (%d–%d per service); %d zones × %d aggregators (~%d sidecars each)\n",
		cfg.Services, cfg.Callers, procs, c.Buckets, cfg.Sidecars, c.MinSidecars, c.MaxSidecars,
		cfg.Zones, cfg.AggregatorsPerZone, cfg.Sidecars/c.Aggregators)
	fmt.Fprintf(w, "traffic: %s rps base, ±%g%% noise; %d buckets surge ×%g in seconds %d–%d; limits = base × %g\n",
		si(cfg.RPS), 100*cfg.Noise, c.Surging, cfg.SurgeFactor, cfg.SurgeAt+1, cfg.SurgeAt+cfg.SurgeFor, 1+cfg.Headroom)
	fmt.Fprintf(w, "run: %d virtual seconds in %v of wall time; %d warm ticks; %d reports or zone loads rejected\n",
		cfg.Seconds, tm.Wall.Round(10*time.Millisecond), len(warm), c.Rejected)
	if tm.LoadAvg[0] != "" {
		fmt.Fprintf(w, "machine: %d CPUs, GOMAXPROCS %d, load average %s at the start, %s at the end\n",
			runtime.NumCPU(), runtime.GOMAXPROCS(0), tm.LoadAvg[0], tm.LoadAvg[1])
	}
	fmt.Fprintf(w, "sums: generated %s rps in the last second, the controller saw %s rps (relative difference %.1e)\n\n",
		si(last.Generated), si(last.Seen), relDiff(last.Generated, last.Seen))

	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CPU, wall time per call on one goroutine\tcalls\tmean\tp50\tp99\tmax\t")
	row := func(name string, n int64, mean, p50, p99, mx time.Duration) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", name, n, dur(mean), dur(p50), dur(p99), dur(mx))
	}
	samples := func(name string, s Samples) {
		row(name, int64(len(s)), s.Mean(), s.Quantile(.5), s.Quantile(.99), s.Max())
	}
	hist := func(name string, h *Hist) { row(name, h.Count, h.Mean(), h.Quantile(.5), h.Quantile(.99), h.MaxDur) }
	samples(fmt.Sprintf("controller Tick (%d buckets, warm ticks)", last.Buckets), tm.Tick)
	samples("controller Apply (validates a zone load)", tm.ControllerApply)
	samples("controller: decode a zone load", tm.ZoneLoadDecode)
	samples(fmt.Sprintf("aggregator Flush (~%d sidecars)", cfg.Sidecars/c.Aggregators), tm.Flush)
	samples("aggregator: encode a zone load", tm.ZoneLoadEncode)
	hist("aggregator Apply, per report", &tm.Apply)
	hist("aggregator: decode a report", &tm.ReportDecode)
	hist("sidecar: reporter.Window.Tick, per report", &tm.Report)
	tw.Flush()
	n := float64(cfg.Seconds)
	perAgg := float64(c.Aggregators)
	ctlPerSec := tm.Tick.Mean() + time.Duration(float64(sum(tm.ControllerApply)+sum(tm.ZoneLoadDecode))/n)
	aggPerSec := time.Duration(float64(tm.Apply.Sum+tm.ReportDecode.Sum+sum(tm.Flush)+sum(tm.ZoneLoadEncode)) / n / perAgg)
	fmt.Fprintf(w, "per virtual second: controller %v (tick + decode and apply %d zone loads); each aggregator %v (decode and apply ~%d reports, flush, encode)\n",
		dur(ctlPerSec), c.Aggregators, dur(aggPerSec), cfg.Sidecars/c.Aggregators)
	if len(tm.TickAlloc) > 0 {
		fmt.Fprintf(w, "allocated per warm tick: %s (mean)\n", bytesIEC(meanU(tm.TickAlloc)))
	}
	fmt.Fprintln(w)
	if len(tm.Shards) > 0 {
		printShards(w, r)
	}

	mem := r.Memory
	fmt.Fprintln(w, "memory: live heap retained by each state at the end (HeapAlloc drop after a full GC when it is released; HeapInuse in brackets)")
	shared := ""
	if r.XDS != nil {
		// The xDS server's cache holds the same policy objects.
		shared = ", not counting the published policies the xDS cache also holds"
	}
	fmt.Fprintf(w, "  controller state (%d zone loads, law, %d published policies%s): %s (%s)\n",
		c.Aggregators, cfg.Services, shared, bytesIEC(mem.Controller), bytesIEC(mem.ControllerInUse))
	if len(mem.Aggregators) > 0 {
		fmt.Fprintf(w, "  aggregator state, each (~%d sidecars): min %s, max %s, mean %s; all %d: %s (%s)\n",
			cfg.Sidecars/c.Aggregators, bytesIEC(slices.Min(mem.Aggregators)), bytesIEC(slices.Max(mem.Aggregators)),
			bytesIEC(meanU(mem.Aggregators)), len(mem.Aggregators), bytesIEC(sumU(mem.Aggregators)), bytesIEC(sumU(mem.AggregatorsInUse)))
	}
	fmt.Fprintf(w, "  whole simulation: heap %s, from the OS %s\n\n", bytesIEC(mem.Heap), bytesIEC(mem.Sys))

	fmt.Fprintln(w, "control-plane traffic: protobuf message bytes (gRPC adds 5 B a message, HTTP/2 9 B a frame, TLS more);")
	fmt.Fprintln(w, "reports and zone loads: mean over all seconds; policies: mean over warm seconds; peak: the busiest second")
	tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tier\tmessages/s\tbytes/s\tpeak bytes/s\tbytes/message\t")
	tier := func(name string, ss []Second, msgs func(Second) int64, bytes func(Second) int64) {
		var m, b, peak int64
		for _, s := range ss {
			m += msgs(s)
			b += bytes(s)
			peak = max(peak, bytes(s))
		}
		k := float64(max(len(ss), 1))
		per := float64(b) / float64(max(m, 1))
		count, size := "—", "—"
		if m > 0 {
			count, size = si(float64(m)/k), bytesIEC(uint64(per))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", name, count, bytesIEC(uint64(float64(b)/k)), bytesIEC(uint64(peak)), size)
	}
	reports := func(s Second) int64 { return int64(s.Reports) }
	tier("sidecars → aggregators: load reports", secs, reports, func(s Second) int64 { return s.ReportBytes })
	tier("aggregators → sidecars: report acks", secs, reports, func(s Second) int64 { return s.ReportAckBytes })
	tier("aggregators → controller: zone loads", secs, func(s Second) int64 { return int64(s.ZoneLoads) }, func(s Second) int64 { return s.ZoneLoadBytes })
	pushes := func(s Second) int64 { return s.Pushes }
	tier("controller → sidecars: DropPolicy, delta xDS", warm, pushes, func(s Second) int64 { return s.PushBytes })
	tier("sidecars → controller: xDS ACKs", warm, pushes, func(s Second) int64 { return s.AckBytes })
	tier("relay: controller → aggregators", warm, func(s Second) int64 { return s.RelayPushes }, func(s Second) int64 { return s.RelayBytes })
	tier("relay: aggregators → their sidecars, all", warm, pushes, func(s Second) int64 { return s.PushBytes })
	tier("relay: the busiest aggregator → its sidecars", warm, func(Second) int64 { return 0 }, func(s Second) int64 { return s.RelayMaxAggBytes })
	tw.Flush()
	var pol, ref, peakPol int
	for _, s := range warm {
		pol += s.Policies
		ref += s.Refreshes
		peakPol = max(peakPol, s.Policies)
	}
	if len(warm) > 0 {
		fmt.Fprintf(w, "policies published per warm tick: mean %.1f (%d in all, %d of them refreshes due at TTL/2), peak %d of %d\n",
			float64(pol)/float64(len(warm)), pol, ref, peakPol, cfg.Services)
	}
	fmt.Fprintln(w)

	p := c.Probe
	fmt.Fprintf(w, "probe: bucket %s ← %s, limit %.1f rps\n", p.Callee, p.Caller, p.Limit)
	tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t\toffered rps\tcontroller saw\tratio held\t≈ admitted rps\t1 − limit/seen\t")
	for i := range p.Offered {
		want := ""
		if p.Seen[i] > 0 {
			want = fmt.Sprintf("%.4f", max(0, 1-p.Limit/p.Seen[i]))
		}
		// The ratio held after tick t applies to the next second's traffic.
		admitted := p.Offered[i]
		if i > 0 {
			admitted *= 1 - p.Ratio[i-1]
		}
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.4f\t%.1f\t%s\t\n", i+1, p.Offered[i], p.Seen[i], p.Ratio[i], admitted, want)
	}
	tw.Flush()

	if x := r.XDS; x != nil {
		fmt.Fprintf(w, "\nxDS, measured: every tick's changed policies pushed into a real internal/xdsserver (LinearCache)\n")
		fmt.Fprintf(w, "with %d real sidecar xdsclient streams (delta, one named subscription each, %d services covered),\n", x.Streams, x.Services)
		fmt.Fprintf(w, "over in-memory gRPC connections in this process: %d resources delivered in %d updates\n", x.Deliveries, len(x.Updates))
		tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "xDS\tupdates\tmean\tp50\tp99\tmax\t")
		for _, s := range []struct {
			name string
			s    Samples
		}{{"Server.Update (cache update and notify)", x.Updates}, {"until every subscriber has it", x.Delivery}} {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", s.name, len(s.s), dur(s.s.Mean()), dur(s.s.Quantile(.5)), dur(s.s.Quantile(.99)), dur(s.s.Max()))
		}
		tw.Flush()
	}
}

// printShards writes the table of the controller shards: what each one
// process of a sharded controller would spend.
func printShards(w io.Writer, r *Result) {
	n := r.Config.Seconds
	fmt.Fprintf(w, "controller shards: %d, callees split by pkg/shard; each shard's own calls, as one process would run them\n", len(r.Timing.Shards))
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shard\tleaves\ttick p50\ttick p99\ttick max\tCPU per virtual s\tallocated per tick\tlive heap\tzone loads in, bytes/s\t")
	var worstP99, worstCPU time.Duration
	for i, s := range r.Timing.Shards {
		heap := "—"
		if i < len(r.Memory.Shards) {
			heap = bytesIEC(r.Memory.Shards[i])
		}
		cpu := s.CPUPerSecond(n)
		worstP99, worstCPU = max(worstP99, s.Tick.Quantile(.99)), max(worstCPU, cpu)
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", i, s.Buckets, dur(s.Tick.Quantile(.5)), dur(s.Tick.Quantile(.99)),
			dur(s.Tick.Max()), dur(cpu), bytesIEC(meanU(s.TickAlloc)), heap, bytesIEC(uint64(s.ZoneLoadBytes/int64(max(n, 1)))))
	}
	tw.Flush()
	fmt.Fprintf(w, "worst shard: tick p99 %s, CPU %s per virtual second\n\n", dur(worstP99), dur(worstCPU))
}

func sum(s Samples) time.Duration {
	var t time.Duration
	for _, d := range s {
		t += d
	}
	return t
}

func sumU(s []uint64) uint64 {
	var t uint64
	for _, v := range s {
		t += v
	}
	return t
}

func meanU(s []uint64) uint64 {
	if len(s) == 0 {
		return 0
	}
	return sumU(s) / uint64(len(s))
}

func relDiff(a, b float64) float64 {
	if a == 0 && b == 0 {
		return 0
	}
	return math.Abs(a-b) / math.Max(math.Abs(a), math.Abs(b))
}

// dur prints a duration with three significant digits.
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.3gµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.3gs", d.Seconds())
}

// si prints a count with an SI prefix: 80M, 1.2k.
func si(v float64) string {
	for _, u := range []struct {
		f float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if math.Abs(v) >= u.f {
			return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", v/u.f), "0"), ".") + u.s
		}
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", v), "0"), ".")
}

// bytesIEC prints a byte count in KiB, MiB, GiB.
func bytesIEC(b uint64) string {
	v := float64(b)
	for _, u := range []struct {
		f float64
		s string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if v >= u.f {
			return fmt.Sprintf("%.3g %s", v/u.f, u.s)
		}
	}
	return fmt.Sprintf("%d B", b)
}
