package aggregator

import (
	"cmp"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/names"
)

// reportHeaderSlack is what MaxReportSize allows for a report's fields
// besides its peers: three names, a timestamp, two durations and flags
// take under 1 KiB; the rest is room for fields a newer sidecar may add.
const reportHeaderSlack = 4 << 10

// MaxReportSize is the largest load report message (a
// StreamLoadReportsRequest, as gRPC counts it) that can pass b: one with
// MaxPeersPerReport peers of the longest names and procedures and the
// largest counts, and descriptor.MaxPerService descriptors of the longest
// names, each with MaxReportValues values of descriptor.MaxValueLen bytes.
// The aggregator's gRPC server refuses larger messages before decoding
// them (counted as ReasonTooLarge), so that a stream buffers no more than
// this.
//
// With the defaults: 10000 peers of at most 555 bytes (about 5.3 MiB),
// and 4 descriptors of 4096 values of 273 bytes each (tag and length 3,
// the value 259, the count 11: about 4.3 MiB), and 514 health entries
// of at most 0.9 KiB, about 9.9 MiB in all. A
// sidecar sends its heavy set, 256 values by default: 4096 leaves it room.
func (b Bounds) MaxReportSize() int {
	b = b.withDefaults()
	worst := &sluicev1.PeerCounts{
		Peer:      strings.Repeat("p", names.MaxLen),
		Procedure: strings.Repeat("p", names.MaxProcedureLen),
		Offered:   math.MaxUint64, Dropped: math.MaxUint64, ShadowDropped: math.MaxUint64,
	}
	perPeer := protowire.SizeTag(peersField) + protowire.SizeBytes(proto.Size(worst))
	return reportHeaderSlack + b.MaxPeersPerReport*perPeer + descriptor.MaxPerService*maxDescriptorCountsSize(b.MaxReportValues) +
		maxReportHealth*maxUpstreamHealthSize()
}

// maxUpstreamHealthSize is the most one UpstreamHealth takes in a report,
// its tag included: about 0.9 KiB, 0.6 MiB for a report's maxReportHealth.
func maxUpstreamHealthSize() int {
	h := &sluicev1.UpstreamHealth{Procedure: strings.Repeat("p", names.MaxProcedureLen),
		Latency: slices.Repeat([]uint64{math.MaxUint64}, health.Buckets),
		Ok:      math.MaxUint64, Failed: math.MaxUint64, TimedOut: math.MaxUint64, InFlight: math.MaxUint32}
	return protowire.SizeTag(healthField) + protowire.SizeBytes(proto.Size(h))
}

// maxDescriptorCountsSize is the most one DescriptorCounts of n values
// takes in a report, its tag included.
func maxDescriptorCountsSize(n int) int {
	value := &sluicev1.ValueCounts{Value: strings.Repeat("v", descriptor.MaxValueLen), Offered: math.MaxUint64}
	d := &sluicev1.DescriptorCounts{Descriptor_: strings.Repeat("d", descriptor.MaxNameLen), Offered: math.MaxUint64, Dropped: math.MaxUint64}
	perValue := protowire.SizeTag(valuesField) + protowire.SizeBytes(proto.Size(value))
	return protowire.SizeTag(descriptorsField) + protowire.SizeBytes(proto.Size(d)+n*perValue)
}

// maxDescriptorRatesSize is the most one DescriptorRates of a zone load
// takes, its tag included, with MaxDescriptorValues values of
// descriptor.MaxValueLen bytes. A service carries at most
// maxZoneDescriptors of them. With the defaults: 1024 values of 271 bytes
// (tag and length 3, the value 259, the rate 9), about 271 KiB a
// descriptor and 2.1 MiB for a service's 8, so the controller's 64 MiB
// receive limit holds about 30 services at the worst, in which case
// FitZoneLoad leaves the largest out. Real values are short: 1024 tenant
// ids of 16 bytes take about 30 KiB a descriptor.
func (b Bounds) maxDescriptorRatesSize() int {
	value := &sluicev1.ValueRate{Value: strings.Repeat("v", descriptor.MaxValueLen), OfferedRps: math.MaxFloat64}
	d := &sluicev1.DescriptorRates{Descriptor_: strings.Repeat("d", descriptor.MaxNameLen),
		OfferedRps: math.MaxFloat64, DroppedRps: math.MaxFloat64, ValuesCut: math.MaxUint32}
	perValue := protowire.SizeTag(rateValuesField) + protowire.SizeBytes(proto.Size(value))
	return protowire.SizeTag(serviceDescriptorsField) + protowire.SizeBytes(proto.Size(d)+b.withDefaults().MaxDescriptorValues*perValue)
}

// Fields of the encodings that MaxReportSize and FitZoneLoad count.
var (
	peersField    = (&sluicev1.LoadReport{}).ProtoReflect().Descriptor().Fields().ByName("peers").Number()
	loadField     = (&sluicev1.StreamZoneLoadsRequest{}).ProtoReflect().Descriptor().Fields().ByName("load").Number()
	servicesField = (&sluicev1.ZoneLoad{}).ProtoReflect().Descriptor().Fields().ByName("services").Number()

	healthField             = (&sluicev1.LoadReport{}).ProtoReflect().Descriptor().Fields().ByName("health").Number()
	descriptorsField        = (&sluicev1.LoadReport{}).ProtoReflect().Descriptor().Fields().ByName("descriptors").Number()
	valuesField             = (&sluicev1.DescriptorCounts{}).ProtoReflect().Descriptor().Fields().ByName("values").Number()
	serviceDescriptorsField = (&sluicev1.ServiceLoad{}).ProtoReflect().Descriptor().Fields().ByName("descriptors").Number()
	rateValuesField         = (&sluicev1.DescriptorRates{}).ProtoReflect().Descriptor().Fields().ByName("values").Number()
)

// FitZoneLoad makes zl, sent as a StreamZoneLoadsRequest, at most maxBytes
// long, so that the controller's receive limit does not refuse the whole
// zone: it takes out the services with the most peers (the largest, ties
// broken by size, then by name) until the rest fits, and returns those it
// took out. Everything else of zl stays as it was; a zl that fits is left
// alone.
func FitZoneLoad(zl *sluicev1.ZoneLoad, maxBytes int) (shed []*sluicev1.ServiceLoad) {
	services := zl.Services
	zl.Services = nil
	total := proto.Size(zl)
	zl.Services = services
	sizes := make([]int, len(services))
	for i, sl := range services {
		sizes[i] = protowire.SizeTag(servicesField) + protowire.SizeBytes(proto.Size(sl))
		total += sizes[i]
	}
	wire := func(n int) int { return protowire.SizeTag(loadField) + protowire.SizeBytes(n) }
	if wire(total) <= maxBytes {
		return nil
	}
	largest := make([]int, len(services))
	for i := range largest {
		largest[i] = i
	}
	slices.SortFunc(largest, func(a, b int) int {
		x, y := services[a], services[b]
		return cmp.Or(cmp.Compare(len(y.GetPeers()), len(x.GetPeers())), cmp.Compare(sizes[b], sizes[a]),
			strings.Compare(x.GetService(), y.GetService()), cmp.Compare(x.GetDirection(), y.GetDirection()))
	})
	out := make([]bool, len(services))
	for _, i := range largest {
		if wire(total) <= maxBytes {
			break
		}
		out[i] = true
		total -= sizes[i]
		shed = append(shed, services[i])
	}
	kept := make([]*sluicev1.ServiceLoad, 0, len(services)-len(shed))
	for i, sl := range services {
		if !out[i] {
			kept = append(kept, sl)
		}
	}
	zl.Services = kept
	return shed
}
