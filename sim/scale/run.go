package scale

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/zonewire"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

// Result is what a run measured.
type Result struct {
	Config  Config
	Counted Counted    // deterministic for a Config
	Timing  Timing     // wall time, varies run to run
	Memory  Memory     // live heap at the end of the run
	XDS     *XDSResult // nil unless Config.XDSStreams > 0
}

// Counted holds everything a run counts, as opposed to times: the same
// Config gives the same Counted, bit for bit.
type Counted struct {
	Buckets, Aggregators int
	// SidecarsPerService: the fewest and the most sidecars of a service.
	MinSidecars, MaxSidecars int
	// Surging is how many buckets surge.
	Surging int
	// Rejected counts reports and zone loads the states refused; a sound
	// run has none.
	Rejected int
	// Seconds holds one entry per virtual second, in order.
	Seconds []Second
	// Probe follows the largest surging bucket.
	Probe Probe
}

// Second is one virtual second: the sidecars' reports for the window that
// ended at T, the aggregators' flushes and the controller's tick at T.
type Second struct {
	T int
	// Generated is the offered rate the sidecars counted in the window,
	// summed over every bucket; Seen and SeenDropped are the controller's
	// global sums at the tick (0 before it is warm).
	Generated, Seen, SeenDropped float64
	Warm                         bool
	Buckets                      int // buckets the tick ran the law on

	// Sidecars → aggregators: reports and their acknowledgements.
	Reports                     int
	ReportBytes, ReportAckBytes int64
	// Aggregators → controller.
	ZoneLoads     int
	ZoneLoadBytes int64

	// Controller → sidecars, each subscribed by name to its own service's
	// policy: a published policy goes to every sidecar of the service.
	Policies  int // policies the tick published
	Refreshes int // of those, the same as the last push but for issued_at: re-sent by age
	Pushes    int64
	PushBytes int64 // delta xDS responses, one per push
	AckBytes  int64 // the sidecars' delta ACKs
	// The alternative: aggregators relay xDS to their zone. The controller
	// sends each policy once per aggregator with sidecars of the service;
	// each aggregator sends it on to its own sidecars (the same total as
	// PushBytes, spread over the aggregators).
	RelayPushes      int64
	RelayBytes       int64
	RelayMaxAggBytes int64 // the busiest aggregator's relay egress to its sidecars
}

// Probe is one bucket's course through the run.
type Probe struct {
	Callee, Caller, Procedure string
	Limit                     float64
	Offered                   []float64 // generated rps, per second
	Seen                      []float64 // the controller's global offered rps at the tick
	Ratio                     []float64 // the ratio the sidecars hold after the tick
}

// Timing holds wall time measured around each call on the one goroutine that
// runs the loop. Garbage collection triggered by the whole simulation lands
// in whatever call is running, as it would in a real process.
type Timing struct {
	Tick            Samples // controller.State.Tick, warm ticks only
	TickAlloc       []uint64
	ControllerApply Samples // controller.State.Apply, per zone load (validation included)
	ZoneLoadDecode  Samples // zonewire.Unmarshal of a zone load, at the controller
	ZoneLoadEncode  Samples // proto.Marshal of a zone load, at the aggregator
	Flush           Samples // aggregator.State.Flush, per aggregator per second
	Apply           Hist    // aggregator.State.Apply, per report
	ReportDecode    Hist    // proto.Unmarshal of a report, at the aggregator
	Report          Hist    // reporter.Window.Tick, per report (sidecar side)
	// Shards holds each controller shard's own calls, with
	// Config.ControllerShards above 1; the rows above then add the
	// shards up (Tick: their ticks of one second, summed).
	Shards []ShardTiming
	Wall   time.Duration
	// LoadAvg is the machine's load average (1, 5, 15 minutes) at the
	// start and the end of the run, where the system tells it: other work
	// on the machine shows in every time above.
	LoadAvg [2]string
}

// ShardTiming is one controller shard's share of the work.
type ShardTiming struct {
	Buckets   int     // leaves its last tick ran the law on
	Tick      Samples // its warm ticks
	TickAlloc []uint64
	Apply     Samples // Apply of its part of each zone load
	Decode    Samples // decoding its part of each zone load
	// ZoneLoadBytes is what the aggregators sent it over the run.
	ZoneLoadBytes int64
}

// CPUPerSecond is what the shard spent per virtual second: its mean warm
// tick, and the decoding and applying of its zone loads over the run.
func (s ShardTiming) CPUPerSecond(seconds int) time.Duration {
	return s.Tick.Mean() + time.Duration(float64(sum(s.Apply)+sum(s.Decode))/float64(seconds))
}

// Memory is the live heap retained by each state at the end of the run:
// the drop in runtime.MemStats.HeapAlloc, after a full GC, when the state
// is released. InUse is the same for HeapInuse (whole spans, so coarser).
type Memory struct {
	Controller, ControllerInUse uint64
	// Shards is each controller shard's state, with more than one; the
	// Controller figures are then their sum.
	Shards                        []uint64
	Aggregators, AggregatorsInUse []uint64
	// Heap is HeapAlloc after a full GC with everything live (the
	// simulation's own mesh and buffers included); Sys is what the process
	// had from the OS.
	Heap, Sys uint64
}

// epoch is virtual time zero; fixed so that issued_at, and so policy sizes,
// are the same in every run.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs cfg and returns what it measured. progress, if not nil, gets one
// line per virtual second. ctx stops the run between seconds.
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	started := time.Now()
	load0 := loadAvg()
	rng := newRNG(cfg)
	m := newMesh(cfg, rng)
	nShards := max(cfg.ControllerShards, 1)
	ctls := make([]*controller.State, nShards)
	var err error
	for i := range ctls {
		sc := cfg.Controller
		if nShards > 1 {
			sc.Shard = shard.Map{Index: i, Count: nShards}
		}
		if ctls[i], err = controller.NewState(sc, epoch); err != nil {
			return nil, fmt.Errorf("controller state: %w", err)
		}
	}
	shardCounts := []int{nShards}
	aggs := make([]*aggregator.State, len(m.aggs))
	for i, a := range m.aggs {
		aggs[i] = aggregator.NewState(a.zone, a.id, cfg.Controller.StaleAfter, aggregator.Bounds{})
	}

	var xds *xdsProbe
	if cfg.XDSStreams > 0 {
		xds, err = startXDS(ctx, m, cfg.XDSStreams)
		if err != nil {
			return nil, err
		}
		defer xds.close()
	}

	res := &Result{Config: cfg}
	if nShards > 1 {
		res.Timing.Shards = make([]ShardTiming, nShards)
	}
	c := &res.Counted
	c.Buckets, c.Aggregators, c.Surging = cfg.Buckets(), len(m.aggs), m.surging
	c.MinSidecars, c.MaxSidecars = math.MaxInt, 0
	for _, s := range m.services {
		c.MinSidecars = min(c.MinSidecars, len(s.sidecars))
		c.MaxSidecars = max(c.MaxSidecars, len(s.sidecars))
	}
	probe := &m.services[m.probe.svc]
	c.Probe = Probe{Callee: probe.name, Caller: probe.caller(m.probe.leaf), Procedure: probe.proc(m.probe.leaf), Limit: probe.limit[m.probe.leaf]}

	ackSizes := make([]int64, len(m.aggs))
	for i, a := range m.aggs {
		ackSizes[i] = int64(proto.Size(&sluicev1.StreamLoadReportsResponse{Accepted: true, Zone: a.zone, AggregatorId: a.id}))
	}
	xdsAckSize := int64(proto.Size(&discovery.DeltaDiscoveryRequest{TypeUrl: names.DropPolicyType, ResponseNonce: sampleNonce}))

	var (
		counts   = make([]uint64, cfg.Buckets()/cfg.Services) // one service's leaf counts for the second
		cur      []sidecar.PeerCounts
		buf      []byte
		lastPush = make(map[string]*sluicev1.DropPolicy, cfg.Services)
		aggBytes = make([]int64, len(m.aggs))
	)
	for t := 1; t <= cfg.Seconds; t++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		secStart := time.Now()
		now := epoch.Add(time.Duration(t) * time.Second)
		sec := Second{T: t}
		surging := t-1 >= cfg.SurgeAt && t-1 < cfg.SurgeAt+cfg.SurgeFor

		// Sidecars: count the window [t−1, t) and report it.
		for i := range m.services {
			s := &m.services[i]
			var svcTotal uint64
			for l := range s.base {
				rate := s.base[l]
				if surging && s.surge[l] {
					rate *= cfg.SurgeFactor
				}
				if cfg.Noise > 0 {
					rate *= 1 + cfg.Noise*(2*rng.Float64()-1)
				}
				counts[l] = uint64(math.Round(rate))
				svcTotal += counts[l]
			}
			sec.Generated += float64(svcTotal)
			if i == m.probe.svc {
				c.Probe.Offered = append(c.Probe.Offered, float64(counts[m.probe.leaf]))
			}
			n := uint64(len(s.sidecars))
			for k, scIdx := range s.sidecars {
				sc := &m.sidecars[scIdx]
				cur = cur[:0]
				for j, total := range counts {
					// total split over the n sidecars: each gets total/n, and
					// total%n of them one more, rotating so that no sidecar
					// always gets the extra.
					cnt := total / n
					off := uint64(t+j) % n
					if (uint64(k)+n-off)%n < total%n {
						cnt++
					}
					if cnt == 0 {
						continue
					}
					pc := sidecar.PeerCounts{Peer: s.caller(j), Procedure: s.proc(j), Offered: cnt}
					// What the sidecar drops with the ratio it holds: error
					// diffusion drops n·p of n requests, give or take one.
					if p := s.ratio[j]; p > 0 {
						d := min(uint64(math.Round(float64(cnt)*p)), cnt)
						if s.shadow[j] {
							pc.ShadowDropped = d
						} else {
							pc.Dropped = d
						}
					}
					cur = append(cur, pc)
				}
				// The report is the reporter's own step, Window.Tick,
				// over the second since the sidecar's last report. The
				// Window is made afresh each second, from counters that
				// start again at zero: its report is the one cumulative
				// counters give (Tick reports their difference, and a
				// peer new to the baseline counts whole), and 100,000
				// report windows are not held at once. Held, their two
				// snapshots of ~100 callers each took the default run
				// from 2.0 to 4.5 GiB.
				win := reporter.NewWindow(reporter.WindowConfig{Header: sc.hdr, Interval: time.Second}, now.Add(-time.Second), snapshot(nil))
				t0 := time.Now()
				rep := win.Tick(now, snapshot(cur))
				t1 := time.Now()
				if rep == nil {
					// A window of a whole interval never folds.
					return nil, fmt.Errorf("t=%d: sidecar %s made no report", t, sc.hdr.SidecarID)
				}
				buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], &sluicev1.StreamLoadReportsRequest{Report: rep})
				if err != nil {
					return nil, fmt.Errorf("encode report: %w", err)
				}
				t2 := time.Now()
				var req sluicev1.StreamLoadReportsRequest
				if err := proto.Unmarshal(buf, &req); err != nil {
					return nil, fmt.Errorf("decode report: %w", err)
				}
				t3 := time.Now()
				aerr := aggs[sc.agg].Apply(req.GetReport(), now)
				t4 := time.Now()
				res.Timing.Report.Add(t1.Sub(t0))
				res.Timing.ReportDecode.Add(t3.Sub(t2))
				res.Timing.Apply.Add(t4.Sub(t3))
				if aerr != nil {
					c.Rejected++
				}
				sec.Reports++
				sec.ReportBytes += int64(len(buf))
				sec.ReportAckBytes += ackSizes[sc.agg]
			}
		}

		// Aggregators flush to the controller, each shard its part.
		for a, st := range aggs {
			t0 := time.Now()
			zl := st.Flush(now, time.Second)
			t1 := time.Now()
			parts := []*sluicev1.ZoneLoad{zl}
			if nShards > 1 {
				parts = aggregator.SplitZoneLoad(zl, nShards, shardCounts)
			}
			res.Timing.Flush = append(res.Timing.Flush, t1.Sub(t0))
			for i, part := range parts {
				t1 := time.Now()
				buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], &sluicev1.StreamZoneLoadsRequest{Load: part})
				if err != nil {
					return nil, fmt.Errorf("encode zone load of %s: %w", m.aggs[a].id, err)
				}
				t2 := time.Now()
				var req sluicev1.StreamZoneLoadsRequest
				if err := zonewire.Unmarshal(buf, &req); err != nil {
					return nil, fmt.Errorf("decode zone load of %s: %w", m.aggs[a].id, err)
				}
				t3 := time.Now()
				cerr := ctls[i].Apply(req.GetLoad(), now)
				t4 := time.Now()
				res.Timing.ZoneLoadEncode = append(res.Timing.ZoneLoadEncode, t2.Sub(t1))
				res.Timing.ZoneLoadDecode = append(res.Timing.ZoneLoadDecode, t3.Sub(t2))
				res.Timing.ControllerApply = append(res.Timing.ControllerApply, t4.Sub(t3))
				if nShards > 1 {
					sh := &res.Timing.Shards[i]
					sh.Decode = append(sh.Decode, t3.Sub(t2))
					sh.Apply = append(sh.Apply, t4.Sub(t3))
					sh.ZoneLoadBytes += int64(len(buf))
				}
				if cerr != nil {
					c.Rejected++
				}
				sec.ZoneLoads++
				sec.ZoneLoadBytes += int64(len(buf))
			}
		}

		// The controller ticks: each shard, one after the other. Sharded,
		// after a collection: the simulation's heap holds every shard and
		// the aggregators, gigabytes that a shard's own process, with a
		// heap of tens of MiB, never marks, and whose collection would
		// otherwise land in whichever shard's tick is running.
		if nShards > 1 {
			runtime.GC()
		}
		var (
			d         time.Duration
			tickAlloc uint64
			tick      = controller.TickResult{Warm: true, Changed: map[string]*sluicev1.DropPolicy{}, Services: map[string]controller.Totals{}}
		)
		for i, ctl := range ctls {
			alloc0 := allocatedBytes()
			t0 := time.Now()
			tr := ctl.Tick(now, m.set)
			di := time.Since(t0)
			ai := allocatedBytes() - alloc0
			d += di
			tickAlloc += ai
			if nShards > 1 {
				sh := &res.Timing.Shards[i]
				sh.Buckets = tr.Buckets
				if tr.Warm {
					sh.Tick = append(sh.Tick, di)
					sh.TickAlloc = append(sh.TickAlloc, ai)
				}
			}
			tick.Warm = tick.Warm && tr.Warm
			tick.Buckets += tr.Buckets
			maps.Copy(tick.Changed, tr.Changed)
			maps.Copy(tick.Services, tr.Services)
			tick.Loads = append(tick.Loads, tr.Loads...)
			tick.Deleted = append(tick.Deleted, tr.Deleted...)
		}
		if tick.Warm {
			res.Timing.Tick = append(res.Timing.Tick, d)
			res.Timing.TickAlloc = append(res.Timing.TickAlloc, tickAlloc)
		}
		sec.Warm, sec.Buckets = tick.Warm, tick.Buckets
		for _, name := range slices.Sorted(maps.Keys(tick.Services)) { // sorted: float sums depend on order
			sec.Seen += tick.Services[name].Offered
			sec.SeenDropped += tick.Services[name].Dropped + tick.Services[name].ShadowDropped
		}
		if tick.Warm {
			for _, l := range tick.Loads {
				if l.Callee == c.Probe.Callee && l.Caller == c.Probe.Caller && l.Procedure == c.Probe.Procedure {
					c.Probe.Seen = append(c.Probe.Seen, l.Offered)
				}
			}
		}
		if len(c.Probe.Seen) < t {
			c.Probe.Seen = append(c.Probe.Seen, 0)
		}

		// Publish: count the bytes per tier, and give the sidecars their
		// new ratios for the next window.
		clear(aggBytes)
		for _, name := range slices.Sorted(maps.Keys(tick.Changed)) {
			p := tick.Changed[name]
			i, ok := m.byPolicy[name]
			if !ok {
				return nil, fmt.Errorf("tick published %q, a service the mesh does not have", name)
			}
			s := &m.services[i]
			size := int64(deltaResponseSize(p))
			sec.Policies++
			if last, ok := lastPush[name]; ok && sameButIssued(last, p) {
				sec.Refreshes++
			}
			lastPush[name] = p
			n := int64(len(s.sidecars))
			sec.Pushes += n
			sec.PushBytes += n * size
			sec.AckBytes += n * xdsAckSize
			sec.RelayPushes += int64(s.relayFanout)
			sec.RelayBytes += int64(s.relayFanout) * size
			for a, k := range s.perAgg {
				aggBytes[a] += int64(k) * size
			}
			clear(s.ratio)
			clear(s.shadow)
			for _, pp := range p.GetPeers() {
				j, ok := s.callerIdx[pp.GetPeer()]
				k, pok := s.procIdx[pp.GetProcedure()]
				if ok && pok {
					l := s.leaf(j, k)
					s.ratio[l] = pp.GetDropRatio()
					s.shadow[l] = pp.GetMode() == sluicev1.Mode_MODE_SHADOW
				}
			}
		}
		sec.RelayMaxAggBytes = slices.Max(aggBytes)
		c.Probe.Ratio = append(c.Probe.Ratio, probe.ratio[m.probe.leaf])
		if xds != nil && (len(tick.Changed) > 0 || len(tick.Deleted) > 0) {
			if err := xds.publish(tick.Changed, tick.Deleted); err != nil {
				return nil, err
			}
		}
		c.Seconds = append(c.Seconds, sec)
		if progress != nil {
			fmt.Fprintf(progress, "t=%2ds generated=%.4g rps seen=%.4g rps policies=%d tick=%v real=%v\n",
				t, sec.Generated, sec.Seen, sec.Policies, d.Round(time.Microsecond), time.Since(secStart).Round(time.Millisecond))
		}
	}
	res.Timing.Wall = time.Since(started)
	res.Timing.LoadAvg = [2]string{load0, loadAvg()}

	// Memory: release one state at a time and see the live heap drop. The
	// mesh (and the xDS probe, if any) stays live throughout, so what drops
	// is the state's own. This runs before the xDS probe stops: gRPC frees
	// its connections' memory for seconds after they close, and that must
	// not land in a state's figure.
	var ms runtime.MemStats
	settle(&ms)
	res.Memory.Heap, res.Memory.Sys = ms.HeapAlloc, ms.Sys
	prevAlloc, prevInuse := ms.HeapAlloc, ms.HeapInuse
	freed := func() (alloc, inuse uint64) {
		settle(&ms)
		alloc, inuse = sub(prevAlloc, ms.HeapAlloc), sub(prevInuse, ms.HeapInuse)
		prevAlloc, prevInuse = ms.HeapAlloc, ms.HeapInuse
		return alloc, inuse
	}
	// The controller shards go first, one at a time: the slice stays live
	// until the last is released, so each drop is that shard's state.
	for i := range ctls {
		ctls[i] = nil
		a, u := freed()
		res.Memory.Controller += a
		res.Memory.ControllerInUse += u
		if nShards > 1 {
			res.Memory.Shards = append(res.Memory.Shards, a)
		}
	}
	for i := range aggs {
		aggs[i] = nil
		a, u := freed()
		res.Memory.Aggregators = append(res.Memory.Aggregators, a)
		res.Memory.AggregatorsInUse = append(res.Memory.AggregatorsInUse, u)
	}
	if xds != nil {
		xds.close()
		res.XDS = xdsResult(xds)
	}
	runtime.KeepAlive(m)
	return res, nil
}

// snapshot is a reporter.Source that gives the same counters every time.
type snapshot []sidecar.PeerCounts

func (s snapshot) AppendCounts(_ string, dst []sidecar.PeerCounts) []sidecar.PeerCounts {
	return append(dst, s...)
}

// settle collects garbage until the live heap stops shrinking (by less
// than 1 MiB, at most 10 rounds), so that garbage freed late (a collection
// may leave finalizers and timers' garbage for the next) does not count as
// a state's.
func settle(ms *runtime.MemStats) {
	runtime.GC()
	runtime.ReadMemStats(ms)
	for range 10 {
		prev := ms.HeapAlloc
		runtime.GC()
		runtime.ReadMemStats(ms)
		if prev-min(prev, ms.HeapAlloc) < 1<<20 {
			return
		}
	}
}

// newRNG is the run's only source of randomness: the mesh, the surge and
// the noise all come from it, in a fixed order.
func newRNG(cfg Config) *rand.Rand { return rand.New(rand.NewPCG(cfg.Seed, 0x5ca1e)) }

// loadAvg is the first three fields of /proc/loadavg, or "" off Linux.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// allocatedBytes is the cumulative heap allocation, without stopping the
// world as runtime.ReadMemStats would.
func allocatedBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// A delta response as go-control-plane's LinearCache sends it to a sidecar
// subscribed to one resource: the resource as an Any, its version (a
// SHA-256 content hash, 64 hex digits), the cache's system version and a
// nonce. The nonce and system version here have typical lengths.
const sampleNonce = "123456"

var (
	sampleVersion       = strings.Repeat("0", 64)
	sampleSystemVersion = "0a1b2c3d-123456"
)

// deltaResponseSize is the size of the delta xDS response that carries p to
// one subscriber.
func deltaResponseSize(p *sluicev1.DropPolicy) int {
	value, err := anypb.New(p)
	if err != nil {
		// A policy that does not marshal would fail the real server too;
		// count it as the bare message so the run goes on.
		return proto.Size(p)
	}
	r := &discovery.DeltaDiscoveryResponse{
		SystemVersionInfo: sampleSystemVersion,
		TypeUrl:           names.DropPolicyType,
		Nonce:             sampleNonce,
		Resources:         []*discovery.Resource{{Name: p.GetName(), Version: sampleVersion, Resource: value}},
	}
	return proto.Size(r)
}

// sameButIssued reports whether two publications of a policy differ only in
// when they were issued: a refresh, not a change.
func sameButIssued(a, b *sluicev1.DropPolicy) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.IssuedAt, b.IssuedAt = nil, nil
	return proto.Equal(a, b)
}
