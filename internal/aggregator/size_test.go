package aggregator

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/names"
)

// TestMaxReportSizeHoldsTheLargestValidReport: the gRPC receive limit
// derived from the bounds lets through the largest report they accept.
func TestMaxReportSizeHoldsTheLargestValidReport(t *testing.T) {
	for _, b := range []Bounds{{}, {MaxPeersPerReport: 1, MaxReportValues: 1}, {MaxPeersPerReport: 20000, MaxReportValues: 5000}} {
		long := strings.Repeat("n", names.MaxLen)
		r := &sluicev1.LoadReport{
			SidecarId: long, Service: long, Zone: long, Direction: out, Urgent: true,
			WindowStart: &timestamppb.Timestamp{Seconds: math.MaxInt64, Nanos: 999999999},
			Window:      &durationpb.Duration{Seconds: math.MaxInt64, Nanos: 999999999},
			Interval:    &durationpb.Duration{Seconds: math.MaxInt64, Nanos: 999999999},
		}
		for i := range b.withDefaults().MaxPeersPerReport {
			r.Peers = append(r.Peers, &sluicev1.PeerCounts{Peer: fmt.Sprintf("%0253d", i), Procedure: fmt.Sprintf("/%0252d", i),
				Offered: math.MaxUint64, Dropped: math.MaxUint64, ShadowDropped: math.MaxUint64})
		}
		for i := range descriptor.MaxPerService {
			d := &sluicev1.DescriptorCounts{Descriptor_: fmt.Sprintf("d%062d", i), Offered: math.MaxUint64, Dropped: math.MaxUint64}
			for j := range b.withDefaults().MaxReportValues {
				d.Values = append(d.Values, &sluicev1.ValueCounts{Value: fmt.Sprintf("%0256d", j), Offered: math.MaxUint64})
			}
			r.Descriptors = append(r.Descriptors, d)
		}
		for i := range maxReportHealth {
			r.Health = append(r.Health, &sluicev1.UpstreamHealth{Procedure: fmt.Sprintf("/%0252d", i),
				Latency: slices.Repeat([]uint64{math.MaxUint64}, health.Buckets),
				Ok:      math.MaxUint64, Failed: math.MaxUint64, TimedOut: math.MaxUint64, InFlight: math.MaxUint32})
		}
		size := proto.Size(&sluicev1.StreamLoadReportsRequest{Report: r})
		if limit := b.MaxReportSize(); size > limit || limit > size+reportHeaderSlack {
			t.Errorf("%d peers, %d values: the largest report is %d bytes, MaxReportSize %d", len(r.Peers), len(r.Descriptors[0].Values), size, limit)
		}
	}
	// Procedures of the longest names doubled it from under 3 MiB;
	// descriptors' values took it from 5.3 to 9.5 MiB, health to 9.9.
	if got := DefaultBounds().MaxReportSize(); got > 10<<20 {
		t.Errorf("default MaxReportSize = %d, want under 10 MiB", got)
	}
}

// TestMaxDescriptorRatesSize: the bound size.go documents holds the
// largest DescriptorRates a flush builds, and is what it says.
func TestMaxDescriptorRatesSize(t *testing.T) {
	b := Bounds{MaxDescriptorValues: 3}
	d := &sluicev1.DescriptorRates{Descriptor_: strings.Repeat("d", descriptor.MaxNameLen),
		OfferedRps: 1e10, DroppedRps: 1e10, ValuesCut: math.MaxUint32}
	for i := range 3 {
		d.Values = append(d.Values, &sluicev1.ValueRate{Value: fmt.Sprintf("%0256d", i), OfferedRps: 1e10})
	}
	size := proto.Size(&sluicev1.ServiceLoad{Descriptors: []*sluicev1.DescriptorRates{d}})
	if got := b.maxDescriptorRatesSize(); got != size {
		t.Errorf("maxDescriptorRatesSize = %d, the largest is %d", got, size)
	}
	if got := DefaultBounds().maxDescriptorRatesSize() * maxZoneDescriptors; got > 2200<<10 {
		t.Errorf("a service's descriptors take up to %d bytes, documented as about 2.1 MiB", got)
	}
}

func peersOf(prefix string, n int) []*sluicev1.PeerRate {
	var ps []*sluicev1.PeerRate
	for i := range n {
		ps = append(ps, &sluicev1.PeerRate{Peer: fmt.Sprintf("%s-%0200d", prefix, i), OfferedRps: 1})
	}
	return ps
}

// TestFitZoneLoad: a zone load over the limit loses its services with the
// most peers, and no more, until it fits; one that fits is left alone.
func TestFitZoneLoad(t *testing.T) {
	zl := &sluicev1.ZoneLoad{AggregatorId: "agg", Zone: "zone-a", Interval: durationpb.New(time.Second)}
	for _, s := range []struct {
		name  string
		peers int
	}{{"a-small", 2}, {"b-huge", 300}, {"c-big", 200}, {"d-web", 5}, {"e-big", 200}} {
		zl.Services = append(zl.Services, &sluicev1.ServiceLoad{Service: s.name, Direction: in, LiveSidecars: 1, Peers: peersOf(s.name, s.peers)})
	}
	size := func() int { return proto.Size(&sluicev1.StreamZoneLoadsRequest{Load: zl}) }
	whole := size()
	if shed := FitZoneLoad(zl, whole); shed != nil || size() != whole {
		t.Fatalf("a zone load that fits lost %d services", len(shed))
	}
	// Room for all but about 400 peers: b-huge goes; then one of the
	// 200-peer ones, c-big before e-big by name.
	limit := whole - 400*215
	shed := FitZoneLoad(zl, limit)
	var got []string
	for _, sl := range shed {
		got = append(got, sl.GetService())
	}
	var kept []string
	for _, sl := range zl.GetServices() {
		kept = append(kept, sl.GetService())
	}
	if strings.Join(got, ",") != "b-huge,c-big" || strings.Join(kept, ",") != "a-small,d-web,e-big" || size() > limit {
		t.Errorf("shed %v, kept %v (%d bytes, limit %d); want b-huge and c-big shed, the rest in order", got, kept, size(), limit)
	}
}

// TestServiceShedsLargestToFit: the zone load the controller gets fits its
// receive limit; the rest of the zone still reaches it, and the shed
// service is counted.
func TestServiceShedsLargestToFit(t *testing.T) {
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}, MaxZoneLoadSize: minZoneLoadSize})
	big, web := dialSidecar(t, h.addr), dialSidecar(t, h.addr)
	r := report("big-1", "big", in, time.Second)
	for i := range 400 { // 400 × ~250 bytes: over 64 KiB
		r.Peers = append(r.Peers, pc(fmt.Sprintf("%0240d", i), 1, 0, 0))
	}
	big.mustAccept(t, r)
	web.mustAccept(t, report("web-1", "checkout", in, time.Second, pc("web", 10, 0, 0)))
	zl := ctrl.await(t, serviceLoad("checkout", in, 1, rate("web", 10, 0, 0)))
	if n := proto.Size(&sluicev1.StreamZoneLoadsRequest{Load: zl}); n > minZoneLoadSize {
		t.Errorf("zone load of %d bytes, limit %d", n, minZoneLoadSize)
	}
	if v := metric(t, h.reg, "sluice_aggregator_zone_load_shed_services_total"); v < 1 {
		t.Errorf("zone_load_shed_services_total = %v, want at least 1", v)
	}
}
