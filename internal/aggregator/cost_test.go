package aggregator

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/names"
)

// pcc is pcp with costs and requests in flight.
func pcc(peer, procedure string, offered, dropped uint64, offeredCost, admittedCost float64, inFlight uint32) *sluicev1.PeerCounts {
	c := pcp(peer, procedure, offered, dropped, 0)
	c.OfferedCost, c.AdmittedCost, c.InFlight = offeredCost, admittedCost, inFlight
	return c
}

// ratec is ratep with cost rates and requests in flight.
func ratec(peer, procedure string, offered, dropped, offeredCost, admittedCost float64, inFlight uint32) *sluicev1.PeerRate {
	r := ratep(peer, procedure, offered, dropped, 0)
	r.OfferedCostRps, r.AdmittedCostRps, r.InFlight = offeredCost, admittedCost, inFlight
	return r
}

// TestSumsCost: cost counts become rates over each report's window, as
// offered does; in flight, a gauge, is summed as reported. An admitted
// cost above the offered one is no error: the app reported the requests
// cost more than their price.
func TestSumsCost(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		report("c1", "llm", in, 2*time.Second, pcc("chat", "/llm.Chat/Complete", 100, 20, 1000, 1500, 7)),
		report("c2", "llm", in, time.Second, pcc("chat", "/llm.Chat/Complete", 10, 0, 100, 80, 3), pcc("batch", "", 4, 0, 0, 0, 0)))
	want := zoneLoad(serviceLoad("llm", in, 2,
		ratec("batch", "", 4, 0, 0, 0, 0),
		ratec("chat", "/llm.Chat/Complete", 60, 10, 600, 830, 10)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if got := s.TakeRejectedEntries(); got.Total() != 0 {
		t.Errorf("rejected %+v", got)
	}
}

// TestHostileCostLeavesOutItsEntry: a cost that is NaN, infinite,
// negative or above MaxCostPerRequest per request, and requests in flight
// above MaxInFlight, leave out their entry, counted; the rest of the
// report applies.
func TestHostileCostLeavesOutItsEntry(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxCostPerRequest: 100})
	apply(t, s, t0, report("c1", "llm", in, time.Second,
		pcc("a", "", 10, 0, math.NaN(), 0, 0),
		pcc("b", "", 10, 0, 0, math.Inf(1), 0),
		pcc("c", "", 10, 0, -1, 0, 0),
		pcc("d", "", 10, 0, 1001, 0, 0),  // above 100 × 10 offered
		pcc("e", "", 10, 0, 10, 1101, 0), // above 100 × (10 + 0 + 1)
		pcc("f", "", 0, 0, 0, 1, MaxInFlight+1),
		pcc("g", "", 10, 0, 1000, 1100, 0), // at the bounds: kept
		pcc("h", "", 0, 0, 0, 500, 4),      // completions of requests in flight: kept
		pcp("web", "", 5, 0, 0)))
	if got := s.TakeRejectedEntries(); got != (RejectedEntries{BadCost: 5, BadInFlight: 1}) {
		t.Errorf("rejected entries %+v, want 5 bad costs and 1 bad in flight", got)
	}
	want := zoneLoad(serviceLoad("llm", in, 1,
		ratec("g", "", 10, 0, 1000, 1100, 0),
		ratec("h", "", 0, 0, 0, 500, 4),
		ratep("web", "", 5, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestAdmittedCostOfRequestsInFlightBefore: requests in flight when a
// window began may all complete in it, with nothing new offered and
// nothing left in flight: their cost is bounded by the sidecar's last
// report's in_flight, and kept.
func TestAdmittedCostOfRequestsInFlightBefore(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxCostPerRequest: 100})
	apply(t, s, t0, report("c1", "llm", in, time.Second, pcc("long", "", 10, 0, 1000, 0, 10)))
	apply(t, s, t0.Add(time.Second), report("c1", "llm", in, time.Second,
		pcc("long", "", 0, 0, 0, 1100, 0), // the 10 completed: 100 × (0 + 10 + 1)
		pcc("other", "", 0, 0, 0, 200, 0), // nothing was in flight: above 100 × 1
	))
	if got := s.TakeRejectedEntries(); got != (RejectedEntries{BadCost: 1}) {
		t.Errorf("rejected entries %+v, want the one bad cost", got)
	}
	want := zoneLoad(serviceLoad("llm", in, 1, ratec("long", "", 0, 0, 0, 1100, 0)))
	if got := s.Flush(t0.Add(time.Second), time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestFoldKeepsCost: a leaf folded into names.Overflow takes its cost and
// its requests in flight along.
func TestFoldKeepsCost(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxPeersPerReport: 1})
	apply(t, s, t0, report("c1", "llm", in, time.Second,
		pcc("big", "", 100, 0, 1000, 900, 5), pcc("small", "", 10, 0, 50, 60, 2), pcc("tiny", "", 1, 0, 7, 8, 1)))
	want := zoneLoad(serviceLoad("llm", in, 1,
		ratec(names.Overflow, "", 11, 0, 57, 68, 3),
		ratec("big", "", 100, 0, 1000, 900, 5)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestCapCostRate: a cost sum above zoneload.MaxCostRate is scaled down to
// it, admitted keeping its ratio to offered.
func TestCapCostRate(t *testing.T) {
	pr := &sluicev1.PeerRate{OfferedRps: 10, OfferedCostRps: 4 * zoneload.MaxCostRate, AdmittedCostRps: 2 * zoneload.MaxCostRate}
	if !capRate(pr) || pr.OfferedCostRps != zoneload.MaxCostRate || pr.AdmittedCostRps != zoneload.MaxCostRate/2 || pr.OfferedRps != 10 {
		t.Errorf("capped to %v", pr)
	}
}
