package scale

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/zonewire"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

// zoneLoads is what the mesh's aggregators flush in one second, built
// directly from the rates: each bucket's rate split over the aggregators in
// proportion to the service's sidecars behind each. surge applies the surge
// (1% of buckets at 15× by default), so the law has ratios to compute.
func zoneLoads(cfg Config, m *mesh, surge bool) []*sluicev1.ZoneLoad {
	out := make([]*sluicev1.ZoneLoad, len(m.aggs))
	for a, ag := range m.aggs {
		zl := &sluicev1.ZoneLoad{AggregatorId: ag.id, Zone: ag.zone, Interval: durationpb.New(time.Second)}
		for i := range m.services {
			s := &m.services[i]
			if s.perAgg[a] == 0 {
				continue
			}
			share := float64(s.perAgg[a]) / float64(len(s.sidecars))
			sl := &sluicev1.ServiceLoad{Service: s.name, Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: uint32(s.perAgg[a])}
			for l := range s.base {
				rate := s.base[l]
				if surge && s.surge[l] {
					rate *= cfg.SurgeFactor
				}
				sl.Peers = append(sl.Peers, &sluicev1.PeerRate{Peer: s.caller(l), Procedure: s.proc(l), OfferedRps: rate * share})
			}
			zl.Services = append(zl.Services, sl)
		}
		out[a] = zl
	}
	return out
}

// controllerAtScale is a controller state for issue 4's mesh (Default) and
// apply, which applies the mesh's 12 zone loads (surge: with 1 % of the
// buckets at 15×) at the time now points to.
func controllerAtScale(b *testing.B, surge bool) (cfg Config, m *mesh, st *controller.State, now *time.Time, apply func()) {
	cfg, m, st, now, applyAt := controllerFor(b, Default())
	return cfg, m, st, now, func() { applyAt(surge) }
}

// controllerFor is controllerAtScale for the mesh cfg describes, its
// apply told whether the second surges.
func controllerFor(b *testing.B, cfg Config) (_ Config, m *mesh, st *controller.State, now *time.Time, apply func(surge bool)) {
	b.Helper()
	m = newMesh(cfg, newRNG(cfg))
	loads := [2][]*sluicev1.ZoneLoad{zoneLoads(cfg, m, false), zoneLoads(cfg, m, true)}
	st, err := controller.NewState(cfg.Controller, epoch)
	if err != nil {
		b.Fatal(err)
	}
	t := epoch
	apply = func(surge bool) {
		i := 0
		if surge {
			i = 1
		}
		for _, zl := range loads[i] {
			if err := st.Apply(zl, t); err != nil {
				b.Fatal(err)
			}
		}
	}
	return cfg, m, st, &t, apply
}

// BenchmarkControllerTick110k is one controller tick at issue 4's scale:
// 12 zone loads (3 zones × 4 aggregators) over 1,100 services × 100 callers
// = 110,000 buckets, 1% of them surging 15× over their limits. The loads are
// applied again before each tick (not timed) so that none goes stale. It
// measures the controller state alone, on a heap that holds only it; the
// scale command measures the same call inside the whole simulation.
func BenchmarkControllerTick110k(b *testing.B) { benchmarkTick(b, Default(), surging) }

// BenchmarkControllerTick110kCalm is the same tick in a second without a
// surge: every callee quiet, as most are in most seconds, so the law is
// not stepped and no policy is built (internal/controller/quiet.go).
func BenchmarkControllerTick110kCalm(b *testing.B) { benchmarkTick(b, Default(), calm) }

// BenchmarkControllerTickShard is a tenth of issue 20's mesh with 10
// procedures, what one of ten controller shards ticks: 110 callees × 100
// callers × 10 procedures, 1 % of the leaves surging, which leaves no
// callee quiet; Calm, the same in seconds without the surge; and Flip,
// seconds that start and end the surge in turn, every tick one in which
// every callee's policy changes: a shard's worst second, in a heap of
// its own as a shard's process has.
func BenchmarkControllerTickShard(b *testing.B)     { benchmarkTick(b, shardMesh(), surging) }
func BenchmarkControllerTickShardCalm(b *testing.B) { benchmarkTick(b, shardMesh(), calm) }
func BenchmarkControllerTickShardFlip(b *testing.B) { benchmarkTick(b, shardMesh(), flipping) }

func shardMesh() Config {
	cfg := Default()
	cfg.Services, cfg.Procedures = 110, 10
	return cfg
}

// BenchmarkControllerTickShardFirst is the same shard's first warm tick,
// in a surge: the tick after a start that builds and publishes every
// policy, the slowest a shard ticks.
func BenchmarkControllerTickShardFirst(b *testing.B) {
	cfg := shardMesh()
	for b.Loop() {
		b.StopTimer()
		_, m, st, now, apply := controllerFor(b, cfg)
		var res controller.TickResult
		for !res.Warm {
			*now = now.Add(time.Second)
			apply(true)
			b.StartTimer()
			res = st.Tick(*now, m.set)
			b.StopTimer()
		}
		if len(res.Changed) != cfg.Services {
			b.Fatalf("the first warm tick published %d policies, want %d", len(res.Changed), cfg.Services)
		}
		b.StartTimer()
	}
}

// The seconds a tick benchmark applies.
const (
	calm = iota
	surging
	flipping // surging and calm in turn
)

func benchmarkTick(b *testing.B, cfg Config, seconds int) {
	cfg, m, st, now, apply := controllerFor(b, cfg)
	second := 0
	next := func() {
		*now = now.Add(time.Second)
		second++
		apply(seconds == surging || seconds == flipping && second%2 == 0)
	}
	// Past the warm-up, and past the first tick, which publishes every
	// policy: the loop measures ticks with TTL/2 refreshes.
	for range 6 {
		next()
		st.Tick(*now, m.set)
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		next()
		b.StartTimer()
		res := st.Tick(*now, m.set)
		if cfg.Procedures == 0 && res.Buckets != cfg.Buckets() {
			b.Fatalf("tick ran %d buckets, want %d", res.Buckets, cfg.Buckets())
		}
		b.ReportMetric(float64(res.Buckets), "leaves")
		b.ReportMetric(float64(res.Quiet), "quiet")
		b.ReportMetric(float64(res.Rendered), "built")
	}
}

// BenchmarkControllerApply110k is Apply of the 12 zone loads of one second
// at issue 4's scale (110,000 buckets) into a controller that holds the
// second before: validation, the surge check against each aggregator's
// last load (no bucket jumps, so every bucket is compared) and the swap.
func BenchmarkControllerApply110k(b *testing.B) {
	_, _, st, now, apply := controllerAtScale(b, false)
	apply()
	b.ReportAllocs()
	for b.Loop() {
		*now = now.Add(time.Second)
		apply()
		if st.TakeUrgent() {
			b.Fatal("a calm second's loads marked urgent")
		}
	}
}

// BenchmarkControllerDecode110k decodes one of the 12 zone loads of a
// second at issue 4's scale (110,000 buckets, 2.7 MB), as the controller
// does (zonewire) and as the generic protobuf runtime would.
func BenchmarkControllerDecode110k(b *testing.B) {
	cfg := Default()
	m := newMesh(cfg, newRNG(cfg))
	raw, err := proto.Marshal(&sluicev1.StreamZoneLoadsRequest{Load: zoneLoads(cfg, m, true)[0]})
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range []struct {
		name   string
		decode func([]byte, *sluicev1.StreamZoneLoadsRequest) error
	}{
		{"zonewire", zonewire.Unmarshal},
		{"proto", func(b []byte, m *sluicev1.StreamZoneLoadsRequest) error { return proto.Unmarshal(b, m) }},
	} {
		b.Run(d.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				var req sluicev1.StreamZoneLoadsRequest
				if err := d.decode(raw, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAggregatorApply is Apply of one 100-caller report into an
// aggregator that holds ~8,333 sidecars, issue 4's share of one of 12.
func BenchmarkAggregatorApply(b *testing.B) {
	st, reports := aggregatorAtScale(b)
	now := epoch.Add(time.Second)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := st.Apply(reports[i%len(reports)], now); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkAggregatorFlush is the flush of that aggregator.
func BenchmarkAggregatorFlush(b *testing.B) {
	st, _ := aggregatorAtScale(b)
	now := epoch.Add(time.Second)
	b.ReportAllocs()
	for b.Loop() {
		st.Flush(now, time.Second)
	}
}

// aggregatorAtScale returns aggregator 0 of the default mesh holding one
// report from each of its sidecars, and those reports.
func aggregatorAtScale(b *testing.B) (*aggregator.State, []*sluicev1.LoadReport) {
	b.Helper()
	cfg := Default()
	m := newMesh(cfg, newRNG(cfg))
	st := aggregator.NewState(m.aggs[0].zone, m.aggs[0].id, 3, aggregator.Bounds{})
	var reports []*sluicev1.LoadReport
	var cur []sidecar.PeerCounts
	for i := range m.services {
		s := &m.services[i]
		for _, k := range s.sidecars {
			sc := m.sidecars[k]
			if sc.agg != 0 {
				continue
			}
			cur = cur[:0]
			for j, c := range s.callers {
				if n := uint64(s.base[j] / float64(len(s.sidecars))); n > 0 {
					cur = append(cur, sidecar.PeerCounts{Peer: c, Offered: n})
				}
			}
			r := reporter.Build(sc.hdr, nil, cur, epoch, time.Second)
			if err := st.Apply(r, epoch.Add(time.Second)); err != nil {
				b.Fatal(err)
			}
			reports = append(reports, r)
		}
	}
	return st, reports
}
