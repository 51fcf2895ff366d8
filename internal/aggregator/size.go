package aggregator

import (
	"cmp"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

// reportHeaderSlack is what MaxReportSize allows for a report's fields
// besides its peers: three names, a timestamp, two durations and flags
// take under 1 KiB; the rest is room for fields a newer sidecar may add.
const reportHeaderSlack = 4 << 10

// MaxReportSize is the largest load report message (a
// StreamLoadReportsRequest, as gRPC counts it) that can pass b: one with
// MaxPeersPerReport peers of the longest names and procedures and the
// largest counts. The aggregator's gRPC server refuses larger messages
// before decoding them (counted as ReasonTooLarge), so that a stream
// buffers no more than this.
func (b Bounds) MaxReportSize() int {
	worst := &sluicev1.PeerCounts{
		Peer:      strings.Repeat("p", names.MaxLen),
		Procedure: strings.Repeat("p", names.MaxProcedureLen),
		Offered:   math.MaxUint64, Dropped: math.MaxUint64, ShadowDropped: math.MaxUint64,
	}
	perPeer := protowire.SizeTag(peersField) + protowire.SizeBytes(proto.Size(worst))
	return reportHeaderSlack + b.withDefaults().MaxPeersPerReport*perPeer
}

// Fields of the encodings that MaxReportSize and FitZoneLoad count.
var (
	peersField    = (&sluicev1.LoadReport{}).ProtoReflect().Descriptor().Fields().ByName("peers").Number()
	loadField     = (&sluicev1.StreamZoneLoadsRequest{}).ProtoReflect().Descriptor().Fields().ByName("load").Number()
	servicesField = (&sluicev1.ZoneLoad{}).ProtoReflect().Descriptor().Fields().ByName("services").Number()
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
