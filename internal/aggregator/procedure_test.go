package aggregator

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

// pcp is pc for a leaf: the peer's counts for one procedure.
func pcp(peer, procedure string, offered, dropped, shadow uint64) *sluicev1.PeerCounts {
	c := pc(peer, offered, dropped, shadow)
	c.Procedure = procedure
	return c
}

// ratep is rate for a leaf.
func ratep(peer, procedure string, offered, dropped, shadow float64) *sluicev1.PeerRate {
	r := rate(peer, offered, dropped, shadow)
	r.Procedure = procedure
	return r
}

// TestSumsPerLeaf: the zone's sums are per (peer, procedure), sorted by
// peer then procedure, and an entry without a procedure stays its own
// bucket beside the peer's leaves.
func TestSumsPerLeaf(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		report("c1", "checkout", in, time.Second, pcp("web", "create-charge", 100, 40, 0), pcp("web", "/shop.Checkout/Pay", 10, 0, 0), pcp("mobile", names.Other, 5, 0, 1)),
		report("c2", "checkout", in, time.Second, pcp("web", "create-charge", 60, 20, 0), pcp("web", "", 7, 0, 0), pcp("mobile", names.Other, 3, 0, 0)))
	want := zoneLoad(serviceLoad("checkout", in, 2,
		ratep("mobile", names.Other, 8, 0, 1),
		ratep("web", "", 7, 0, 0),
		ratep("web", "/shop.Checkout/Pay", 10, 0, 0),
		ratep("web", "create-charge", 160, 60, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestBadProcedureLeavesOutItsEntry: an entry whose procedure is not a
// valid name is left out and counted, the rest of its report applied; a
// (peer, procedure) listed twice rejects the report, as a peer listed
// twice always did, while one peer with two procedures is two leaves.
func TestBadProcedureLeavesOutItsEntry(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	for _, bad := range []string{"a//b", "trailing/", "_made-up", "sp ace", strings.Repeat("p", names.MaxProcedureLen+1), names.Overflow} {
		s.badEntries = RejectedEntries{}
		r := report("c1", "checkout", in, time.Second, pcp("web", bad, 1000, 0, 0), pcp("web", "get-item", 10, 0, 0))
		if err := s.Apply(r, t0); err != nil {
			t.Fatalf("procedure %q: report rejected whole: %v", bad, err)
		}
		if got := s.TakeRejectedEntries(); got.BadProcedure != 1 {
			t.Errorf("procedure %q: rejected entries %+v, want 1 bad procedure", bad, got)
		}
		want := zoneLoad(serviceLoad("checkout", in, 1, ratep("web", "get-item", 10, 0, 0)))
		if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
			t.Fatalf("procedure %q: got %v\nwant %v", bad, got, want)
		}
	}
	// The entries left out leave no room behind in what the sidecar
	// holds, which the identity's quota could not count.
	r := report("c1", "checkout", in, time.Second, pcp("web", "get-item", 10, 0, 0))
	for range 1000 {
		r.Peers = append(r.Peers, pcp("web", "a//b", 1, 0, 0))
	}
	apply(t, s, t0, r)
	s.TakeRejectedEntries()
	if sc := s.sidecars[sidecarKey{"checkout", "c1"}]; len(sc.peers) != 1 || cap(sc.peers) != 1 {
		t.Errorf("holds %d peers in room for %d", len(sc.peers), cap(sc.peers))
	}
	wantReason(t, s.Apply(report("c1", "checkout", in, time.Second, pcp("web", "get-item", 1, 0, 0), pcp("web", "get-item", 2, 0, 0)), t0), ReasonDuplicatePeer)
	// A rejected report counts none of its bad entries.
	wantReason(t, s.Apply(report("c1", "checkout", in, time.Second, pcp("web", "a//b", 1, 0, 0), pc("-x", 1, 0, 0)), t0), ReasonBadName)
	if got := s.TakeRejectedEntries(); got.BadProcedure != 0 {
		t.Errorf("rejected report counted %+v entries", got)
	}
}

// TestLeavesFoldIntoOverflowOther: the bounds count leaves, and a folded
// leaf keeps its procedure bounded: into (_overflow, "") without one,
// (_overflow, _other) with one. The reserved leaves are the reserved peers
// without a procedure or with _other, never with one of their own: a
// sidecar can not grow the state with procedures of unknown.
func TestLeavesFoldIntoOverflowOther(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxPeersPerReport: 2})
	apply(t, s, t0, report("c1", "checkout", in, time.Second,
		pcp("web", "create-charge", 50, 0, 0), pcp("web", "get-item", 40, 0, 0),
		pcp("web", "invented-1", 3, 1, 0), pcp("unknown", "invented-2", 2, 0, 0),
		pcp("unknown", names.Other, 5, 0, 0), pcp("old", "", 4, 0, 0), pcp("_overflow", names.Other, 1, 0, 0)))
	if f := s.TakeFolds(); f != (Folds{Report: 3}) {
		t.Errorf("folds = %+v, want 3 beyond the report's bound", f)
	}
	want := zoneLoad(serviceLoad("checkout", in, 1,
		ratep("_overflow", "", 4, 0, 0),
		ratep("_overflow", names.Other, 6, 1, 0),
		ratep("unknown", names.Other, 5, 0, 0),
		ratep("web", "create-charge", 50, 0, 0),
		ratep("web", "get-item", 40, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	// The identity's quota counts distinct leaves too.
	s = NewState("zone-a", "agg-1", 3, Bounds{MaxPeersPerIdentity: 2})
	apply(t, s, t0,
		report("c1", "checkout", in, time.Second, pcp("web", "a", 10, 0, 0), pcp("web", "b", 10, 0, 0)),
		report("c2", "checkout", in, time.Second, pcp("web", "a", 10, 0, 0), pcp("web", "c", 1, 0, 0)))
	if f := s.TakeFolds(); f != (Folds{Identity: 1}) {
		t.Errorf("folds = %+v, want (web, c) beyond the identity's 2 leaves", f)
	}
}

// TestServiceSumsLeaves: over gRPC, the zone load carries each leaf's
// procedure, and an entry with a bad procedure is left out and counted
// while its report is accepted.
func TestServiceSumsLeaves(t *testing.T) {
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}})
	s1, s2 := dialSidecar(t, h.addr), dialSidecar(t, h.addr)
	s1.mustAccept(t, report("s1", "checkout", in, time.Second, pcp("web", "create-charge", 100, 50, 0), pcp("web", "bad//name", 1e6, 0, 0)))
	s2.mustAccept(t, report("s2", "checkout", in, time.Second, pcp("web", "create-charge", 20, 0, 0), pcp("web", names.Other, 3, 0, 0)))
	ctrl.await(t, serviceLoad("checkout", in, 2, ratep("web", names.Other, 3, 0, 0), ratep("web", "create-charge", 120, 50, 0)))
	if v := metric(t, h.reg, "sluice_aggregator_entries_rejected_total", "reason", EntryBadProcedure); v != 1 {
		t.Errorf("entries_rejected_total{reason=bad_procedure} = %v, want 1", v)
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonBadName); v != 0 {
		t.Errorf("reports_rejected_total{reason=bad_name} = %v, want 0", v)
	}
}
