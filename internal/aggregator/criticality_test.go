package aggregator

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

const (
	critical  = sluicev1.Criticality_CRITICALITY_CRITICAL
	sheddable = sluicev1.Criticality_CRITICALITY_SHEDDABLE
)

// pct is pcp for a tiered leaf.
func pct(peer, procedure string, tier sluicev1.Criticality, offered, dropped, shadow uint64) *sluicev1.PeerCounts {
	c := pcp(peer, procedure, offered, dropped, shadow)
	c.Criticality = tier
	return c
}

// ratet is ratep for a tiered leaf.
func ratet(peer, procedure string, tier sluicev1.Criticality, offered, dropped, shadow float64) *sluicev1.PeerRate {
	r := ratep(peer, procedure, offered, dropped, shadow)
	r.Criticality = tier
	return r
}

// TestSumsPerTier: the zone's sums are per (peer, procedure, tier),
// sorted so, each tier a bucket of its own.
func TestSumsPerTier(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		report("c1", "payments", in, time.Second, pct("web", "get", sheddable, 100, 40, 0), pct("web", "get", critical, 10, 0, 0), pct("batch", "", sheddable, 5, 0, 1)),
		report("c2", "payments", in, time.Second, pct("web", "get", sheddable, 60, 20, 0), pct("web", "get", critical, 7, 0, 0), pcp("web", "put", 3, 0, 0)))
	want := zoneLoad(serviceLoad("payments", in, 2,
		ratet("batch", "", sheddable, 5, 0, 1),
		ratet("web", "get", critical, 17, 0, 0),
		ratet("web", "get", sheddable, 160, 60, 0),
		ratep("web", "put", 3, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestHostileTiersLeaveOutTheirEntry: a tier outside the enum, and a
// tiered entry of a (peer, procedure) the report also lists untiered, are
// left out and counted, the rest of the report applied; the same leaf in
// one tier twice rejects the report, as any leaf listed twice does.
func TestHostileTiersLeaveOutTheirEntry(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0, report("c1", "payments", in, time.Second,
		pct("web", "get", 5, 1000, 0, 0), pct("web", "get", -1, 1000, 0, 0), pct("web", "get", 1<<30, 1000, 0, 0),
		pcp("web", "put", 10, 0, 0), pct("web", "put", sheddable, 500, 0, 0), pct("web", "put", critical, 600, 0, 0),
		pct("web", "get", critical, 7, 0, 0), pct("mobile", "put", sheddable, 2, 0, 0)))
	if got := s.TakeRejectedEntries(); got != (RejectedEntries{BadCriticality: 3, MixedCriticality: 2}) {
		t.Errorf("rejected entries %+v, want 3 bad and 2 mixed tiers", got)
	}
	want := zoneLoad(serviceLoad("payments", in, 1,
		ratet("mobile", "put", sheddable, 2, 0, 0), // another peer's tier is its own
		ratet("web", "get", critical, 7, 0, 0),
		ratep("web", "put", 10, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if sc := s.sidecars[sidecarKey{"payments", "c1"}]; cap(sc.peers) != 3 {
		t.Errorf("holds room for %d peers, want 3: those left out leave none behind", cap(sc.peers))
	}
	wantReason(t, s.Apply(report("c1", "payments", in, time.Second, pct("web", "get", critical, 1, 0, 0), pct("web", "get", critical, 2, 0, 0)), t0), ReasonDuplicatePeer)
}

// TestTiersCountAsEntries: every tier of a leaf is an entry for the
// bounds, and a folded leaf keeps its tier: into (_overflow, _other) of
// the same tier.
func TestTiersCountAsEntries(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxPeersPerReport: 2})
	apply(t, s, t0, report("c1", "payments", in, time.Second,
		pct("web", "get", critical, 50, 0, 0), pct("web", "get", sheddable, 40, 0, 0),
		pct("batch", "get", critical, 3, 1, 0), pct("batch", "get", sheddable, 2, 0, 0), pct("batch", "put", sheddable, 1, 0, 0),
		pct(names.Overflow, names.Other, sheddable, 4, 0, 0)))
	if f := s.TakeFolds(); f != (Folds{Report: 3}) {
		t.Errorf("folds = %+v, want 3 beyond the report's bound", f)
	}
	want := zoneLoad(serviceLoad("payments", in, 1,
		ratet(names.Overflow, names.Other, critical, 3, 1, 0),
		ratet(names.Overflow, names.Other, sheddable, 7, 0, 0),
		ratet("web", "get", critical, 50, 0, 0),
		ratet("web", "get", sheddable, 40, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestServiceCountsHostileTiers: over gRPC, the hostile tiers are counted
// on the entries' rejection metric by reason, the report accepted.
func TestServiceCountsHostileTiers(t *testing.T) {
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}})
	s1 := dialSidecar(t, h.addr)
	s1.mustAccept(t, report("s1", "payments", in, time.Second,
		pct("web", "get", critical, 100, 50, 0), pct("web", "get", 9, 1e6, 0, 0), pcp("web", "put", 3, 0, 0), pct("web", "put", sheddable, 1e6, 0, 0)))
	ctrl.await(t, serviceLoad("payments", in, 1, ratet("web", "get", critical, 100, 50, 0), ratep("web", "put", 3, 0, 0)))
	for reason, want := range map[string]float64{EntryBadCriticality: 1, EntryMixedCriticality: 1} {
		if v := metric(t, h.reg, "sluice_aggregator_entries_rejected_total", "reason", reason); v != want {
			t.Errorf("entries_rejected_total{reason=%s} = %v, want %v", reason, v, want)
		}
	}
}
