package aggregator

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

const (
	in  = sluicev1.Direction_DIRECTION_INBOUND
	out = sluicev1.Direction_DIRECTION_OUTBOUND
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// report builds a report over window w; peers are (name, offered, dropped,
// shadow) quadruples.
func report(id, service string, dir sluicev1.Direction, w time.Duration, peers ...*sluicev1.PeerCounts) *sluicev1.LoadReport {
	return &sluicev1.LoadReport{
		SidecarId:   id,
		Service:     service,
		Direction:   dir,
		Zone:        "their-zone",
		WindowStart: timestamppb.New(t0),
		Window:      durationpb.New(w),
		Peers:       peers,
	}
}

func pc(peer string, offered, dropped, shadow uint64) *sluicev1.PeerCounts {
	return &sluicev1.PeerCounts{Peer: peer, Offered: offered, Dropped: dropped, ShadowDropped: shadow}
}

func TestApplyRejects(t *testing.T) {
	bounds := Bounds{MaxPeersPerReport: 3, MaxRate: 1000, MinWindow: 100 * time.Millisecond, MaxWindow: 10 * time.Second, MaxSidecars: 2, MaxInterval: 5 * time.Second}
	ok := func(mod func(r *sluicev1.LoadReport)) *sluicev1.LoadReport {
		r := report("s1", "svc", in, time.Second, pc("a", 10, 1, 1))
		mod(r)
		return r
	}
	for _, tc := range []struct {
		name   string
		r      *sluicev1.LoadReport
		reason string // "" means accepted
	}{
		{"valid", ok(func(*sluicev1.LoadReport) {}), ""},
		{"valid outbound, no peers", ok(func(r *sluicev1.LoadReport) { r.Direction = out; r.Peers = nil }), ""},
		{"valid at every bound", report("s1", "svc", in, 100*time.Millisecond, pc("a", 100, 50, 50), pc("b", 0, 0, 0), pc("_overflow", 1, 0, 0)), ""},
		{"nil report", nil, ReasonEmptyReport},
		{"empty sidecar id", ok(func(r *sluicev1.LoadReport) { r.SidecarId = "" }), ReasonBadSidecarID},
		{"long sidecar id", ok(func(r *sluicev1.LoadReport) { r.SidecarId = strings.Repeat("x", 254) }), ReasonBadSidecarID},
		{"empty service", ok(func(r *sluicev1.LoadReport) { r.Service = "" }), ReasonBadName},
		{"bad service", ok(func(r *sluicev1.LoadReport) { r.Service = "svc/x" }), ReasonBadName},
		{"bad peer", ok(func(r *sluicev1.LoadReport) { r.Peers = append(r.Peers, pc("-x", 1, 0, 0)) }), ReasonBadName},
		{"nil peer", ok(func(r *sluicev1.LoadReport) { r.Peers = append(r.Peers, nil) }), ReasonBadName},
		{"unspecified direction", ok(func(r *sluicev1.LoadReport) { r.Direction = 0 }), ReasonBadDirection},
		{"unknown direction", ok(func(r *sluicev1.LoadReport) { r.Direction = 7 }), ReasonBadDirection},
		{"no window", ok(func(r *sluicev1.LoadReport) { r.Window = nil }), ReasonBadWindow},
		{"invalid window", ok(func(r *sluicev1.LoadReport) { r.Window = &durationpb.Duration{Seconds: 1, Nanos: -1} }), ReasonBadWindow},
		{"window too short", ok(func(r *sluicev1.LoadReport) { r.Window = durationpb.New(99 * time.Millisecond) }), ReasonBadWindow},
		{"window too long", ok(func(r *sluicev1.LoadReport) { r.Window = durationpb.New(11 * time.Second) }), ReasonBadWindow},
		{"negative window", ok(func(r *sluicev1.LoadReport) { r.Window = durationpb.New(-time.Second) }), ReasonBadWindow},
		{"too many peers, folded", ok(func(r *sluicev1.LoadReport) {
			r.Peers = []*sluicev1.PeerCounts{pc("a", 1, 0, 0), pc("b", 1, 0, 0), pc("c", 1, 0, 0), pc("d", 1, 0, 0)}
		}), ""},
		{"absurdly many peers", ok(func(r *sluicev1.LoadReport) {
			r.Peers = nil
			for i := range 31 {
				r.Peers = append(r.Peers, pc(fmt.Sprintf("p%d", i), 1, 0, 0))
			}
		}), ReasonTooManyPeers},
		{"duplicate peer", ok(func(r *sluicev1.LoadReport) { r.Peers = append(r.Peers, pc("b", 1, 0, 0), pc("a", 2, 0, 0)) }), ReasonDuplicatePeer},
		{"dropped above offered", ok(func(r *sluicev1.LoadReport) { r.Peers = []*sluicev1.PeerCounts{pc("a", 10, 11, 0)} }), ReasonBadCounts},
		{"shadow above offered", ok(func(r *sluicev1.LoadReport) { r.Peers = []*sluicev1.PeerCounts{pc("a", 10, 0, 11)} }), ReasonBadCounts},
		{"dropped plus shadow above offered", ok(func(r *sluicev1.LoadReport) { r.Peers = []*sluicev1.PeerCounts{pc("a", 10, 6, 5)} }), ReasonBadCounts},
		{"counts that overflow when added", ok(func(r *sluicev1.LoadReport) {
			r.Peers = []*sluicev1.PeerCounts{pc("a", 10, 1<<63, 1<<63)}
		}), ReasonBadCounts},
		{"absurd rate", ok(func(r *sluicev1.LoadReport) { r.Peers = []*sluicev1.PeerCounts{pc("a", 1001, 0, 0)} }), ReasonAbsurdRate},
		{"absurd rate over a short window", ok(func(r *sluicev1.LoadReport) {
			r.Window = durationpb.New(100 * time.Millisecond)
			r.Peers = []*sluicev1.PeerCounts{pc("a", 101, 0, 0)}
		}), ReasonAbsurdRate},
		{"too many sidecars", ok(func(r *sluicev1.LoadReport) { r.SidecarId = "s3" }), ReasonTooManySidecars},
		{"another identity's s1 is a third sidecar", ok(func(r *sluicev1.LoadReport) { r.Service = "svc2" }), ReasonTooManySidecars},
		{"longest interval", ok(func(r *sluicev1.LoadReport) { r.Interval = durationpb.New(5 * time.Second) }), ""},
		{"interval too long", ok(func(r *sluicev1.LoadReport) { r.Interval = durationpb.New(5*time.Second + 1) }), ReasonBadInterval},
		{"invalid interval", ok(func(r *sluicev1.LoadReport) { r.Interval = &durationpb.Duration{Seconds: -1, Nanos: 1} }), ReasonBadInterval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState("zone-a", "agg-1", 3, bounds)
			// Two sidecars are kept already: one is s1, so s1 may
			// report again, a third may not.
			for _, id := range []string{"s1", "s2"} {
				if err := s.Apply(report(id, "svc", out, time.Second, pc("old-peer", 5, 0, 0)), t0); err != nil {
					t.Fatal(err)
				}
			}
			before := s.Flush(t0, time.Second)

			err := s.Apply(tc.r, t0)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Apply = %v, want accepted", err)
				}
				return
			}
			var rej *RejectError
			if !errors.As(err, &rej) {
				t.Fatalf("Apply = %v, want a *RejectError", err)
			}
			if rej.Reason != tc.reason || rej.Detail == "" {
				t.Fatalf("Apply = %q (reason %q), want reason %q and a detail", err, rej.Reason, tc.reason)
			}
			// A rejected report changes nothing.
			if after := s.Flush(t0, time.Second); !proto.Equal(before, after) {
				t.Errorf("a rejected report changed the state:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func TestReasonsAreListed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Reasons {
		if seen[r] || r == "" || strings.ContainsAny(r, ": ") {
			t.Errorf("bad or repeated reason %q", r)
		}
		seen[r] = true
	}
}

func TestLatestRateReplaces(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	r := report("s1", "svc", in, 2*time.Second, pc("a", 200, 20, 10))
	for range 3 { // a duplicated report
		if err := s.Apply(r, t0); err != nil {
			t.Fatal(err)
		}
	}
	want := zoneLoad(serviceLoad("svc", in, 1, rate("a", 100, 10, 5)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("after a duplicated report:\ngot  %v\nwant %v", got, want)
	}

	// A newer report replaces the old one entirely: peer a is gone, and
	// the sidecar now counts for the other direction.
	if err := s.Apply(report("s1", "svc", out, time.Second, pc("b", 7, 0, 0)), t0); err != nil {
		t.Fatal(err)
	}
	want = zoneLoad(serviceLoad("svc", out, 1, rate("b", 7, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("after a newer report:\ngot  %v\nwant %v", got, want)
	}
}

func TestSumsAcrossSidecars(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		report("s1", "svc", in, time.Second, pc("a", 100, 10, 0), pc("b", 50, 0, 5)),
		report("s2", "svc", in, 500*time.Millisecond, pc("a", 100, 0, 20)),
		report("s3", "svc", in, time.Second), // live, idle
		report("s4", "svc", out, time.Second, pc("a", 1, 0, 0)),
		report("s5", "other", in, time.Second, pc("svc", 3, 0, 0)),
	)
	want := zoneLoad(
		serviceLoad("other", in, 1, rate("svc", 3, 0, 0)),
		serviceLoad("svc", in, 3, rate("a", 300, 10, 40), rate("b", 50, 0, 5)),
		serviceLoad("svc", out, 1, rate("a", 1, 0, 0)),
	)
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if s.Sidecars() != 5 {
		t.Errorf("Sidecars = %d, want 5", s.Sidecars())
	}
}

func TestStaleness(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		report("fast", "svc", in, time.Second, pc("a", 10, 0, 0)),
		report("slow", "svc", in, 10*time.Second, pc("a", 100, 0, 0)),
	)
	both := zoneLoad(serviceLoad("svc", in, 2, rate("a", 20, 0, 0)))
	slowOnly := zoneLoad(serviceLoad("svc", in, 1, rate("a", 10, 0, 0)))
	for _, tc := range []struct {
		at   time.Duration // after the reports
		want *sluicev1.ZoneLoad
	}{
		{0, both},
		{3 * time.Second, both},          // silent for exactly 3 windows: still live
		{3*time.Second + 1, slowOnly},    // more than 3 of its 1s windows
		{30 * time.Second, slowOnly},     // the slow one has 10s windows
		{30*time.Second + 1, zoneLoad()}, // and now it is gone too
		{time.Hour, zoneLoad()},          // and stays gone
	} {
		if got := s.Flush(t0.Add(tc.at), time.Second); !proto.Equal(got, tc.want) {
			t.Fatalf("at +%v:\ngot  %v\nwant %v", tc.at, got, tc.want)
		}
	}
	if s.Sidecars() != 0 {
		t.Errorf("Sidecars = %d after both went stale, want 0", s.Sidecars())
	}
	if stale := s.TakeStale(); strings.Join(stale, ",") != "fast,slow" {
		t.Errorf("TakeStale = %v, want fast then slow", stale)
	}
	if stale := s.TakeStale(); len(stale) != 0 {
		t.Errorf("TakeStale again = %v, want nothing", stale)
	}

	// A report refreshes: measured from its arrival, not its window_start.
	apply(t, s, t0.Add(time.Hour), report("fast", "svc", in, time.Second, pc("a", 10, 0, 0)))
	if got := s.Flush(t0.Add(time.Hour+3*time.Second), time.Second); len(got.Services) != 1 {
		t.Fatalf("a fresh report was dropped: %v", got)
	}
}

func TestRemove(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		report("s1", "svc", in, time.Second, pc("a", 10, 0, 0)),
		report("s2", "svc", in, time.Second, pc("a", 5, 0, 0)),
	)
	s.Remove("svc", "s1", 0)
	s.Remove("svc", "unknown", 0)
	s.Remove("other", "s2", 0) // another identity's s2: none
	s.Remove("svc", "s2", 7)   // not the holder
	want := zoneLoad(serviceLoad("svc", in, 1, rate("a", 5, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	if s.Sidecars() != 1 {
		t.Errorf("Sidecars = %d, want 1", s.Sidecars())
	}
}

func TestFlushIsDeterministic(t *testing.T) {
	// Many sidecars with rates whose float sums depend on the order of
	// addition: the ZoneLoad must be bit-identical whatever the order of
	// arrival, or controller replicas could disagree.
	rng := rand.New(rand.NewPCG(1, 2))
	var reports []*sluicev1.LoadReport
	for i := range 200 {
		var peers []*sluicev1.PeerCounts
		for _, p := range []string{"a", "b", "c", "d"} {
			if rng.IntN(3) > 0 {
				o := rng.Uint64N(100000)
				peers = append(peers, pc(p, o, o/3, o/7))
			}
		}
		rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
		w := time.Duration(100+rng.IntN(2000)) * time.Millisecond
		svc := []string{"x", "y"}[rng.IntN(2)]
		dir := []sluicev1.Direction{in, out}[rng.IntN(2)]
		reports = append(reports, report("s"+string(rune('A'+i%26))+strings.Repeat("x", i/26), svc, dir, w, peers...))
	}
	var first *sluicev1.ZoneLoad
	for trial := range 10 {
		s := NewState("zone-a", "agg-1", 3, Bounds{})
		rng.Shuffle(len(reports), func(i, j int) { reports[i], reports[j] = reports[j], reports[i] })
		apply(t, s, t0, reports...)
		got := s.Flush(t0, time.Second)
		if first == nil {
			first = got
			continue
		}
		if !proto.Equal(first, got) {
			t.Fatalf("trial %d: Flush differs with another arrival order:\nfirst %v\nnow   %v", trial, first, got)
		}
	}
	if len(first.Services) != 4 {
		t.Errorf("want all 4 (service, direction) pairs, got %d", len(first.Services))
	}
}

func TestZoneIsTheAggregators(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0, report("s1", "svc", in, time.Second))
	got := s.Flush(t0, 2*time.Second)
	if got.Zone != "zone-a" || got.AggregatorId != "agg-1" || got.Interval.AsDuration() != 2*time.Second {
		t.Errorf("header = %q %q %v, want zone-a agg-1 2s", got.Zone, got.AggregatorId, got.Interval.AsDuration())
	}
}

func TestBoundsValidate(t *testing.T) {
	if err := (Bounds{}).Validate(); err != nil {
		t.Errorf("zero Bounds: %v", err)
	}
	if err := DefaultBounds().Validate(); err != nil {
		t.Errorf("DefaultBounds: %v", err)
	}
	err := Bounds{MaxPeersPerReport: -1, MaxRate: -1, MinWindow: 2 * time.Minute, MaxSidecars: -1}.Validate()
	for _, field := range []string{"max-peers-per-report", "max-rate", "MinWindow", "max-sidecars"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
}

func apply(t *testing.T, s *State, now time.Time, rs ...*sluicev1.LoadReport) {
	t.Helper()
	for _, r := range rs {
		if err := s.Apply(r, now); err != nil {
			t.Fatalf("Apply(%s): %v", r.GetSidecarId(), err)
		}
	}
}

func zoneLoad(services ...*sluicev1.ServiceLoad) *sluicev1.ZoneLoad {
	return &sluicev1.ZoneLoad{AggregatorId: "agg-1", Zone: "zone-a", Interval: durationpb.New(time.Second), Services: services}
}

func serviceLoad(svc string, dir sluicev1.Direction, live uint32, peers ...*sluicev1.PeerRate) *sluicev1.ServiceLoad {
	return &sluicev1.ServiceLoad{Service: svc, Direction: dir, LiveSidecars: live, Peers: peers}
}

func rate(peer string, offered, dropped, shadow float64) *sluicev1.PeerRate {
	return &sluicev1.PeerRate{Peer: peer, OfferedRps: offered, DroppedRps: dropped, ShadowDroppedRps: shadow}
}

// A surge report covers a fraction of the interval; staleness counts the
// sidecar's intervals, so the sidecar is not dropped while it waits for its
// next regular report.
func TestStalenessCountsIntervalsNotSurgeWindows(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	r := report("s1", "svc", in, 250*time.Millisecond, pc("web", 100, 0, 0))
	r.Interval = durationpb.New(time.Second)
	r.Urgent = true
	apply(t, s, t0, r)
	if got := s.Flush(t0.Add(2*time.Second), time.Second); len(got.GetServices()) != 1 {
		t.Errorf("2s after a 250ms surge report with a 1s interval the sidecar is gone: %v", got)
	}
	if got := s.Flush(t0.Add(3*time.Second+1), time.Second); len(got.GetServices()) != 0 {
		t.Errorf("more than 3 intervals after its report the sidecar is still summed: %v", got)
	}
}

func TestSurgeReportMakesTheNextFlushUrgent(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0, report("s1", "svc", in, time.Second, pc("web", 100, 0, 0)))
	if s.TakeUrgent() || s.Flush(t0, time.Second).GetUrgent() {
		t.Fatal("a calm report made the flush urgent")
	}
	r := report("s2", "svc", in, 250*time.Millisecond, pc("web", 30, 0, 0))
	r.Urgent = true // even a first report, and a small rise: the sidecar says so
	apply(t, s, t0, r)
	if !s.TakeUrgent() {
		t.Error("a surge report is not urgent")
	}
	if !s.Flush(t0, time.Second).GetUrgent() {
		t.Error("the flush after a surge report is not marked urgent")
	}
	if s.Flush(t0, time.Second).GetUrgent() {
		t.Error("the flush after that is still urgent")
	}
}

func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != reason {
		t.Fatalf("ApplyFrom = %v, want reason %q", err, reason)
	}
}

// TestIDHeldByItsLiveHolder: a sidecar id is its identity's, and while the
// sidecar is live only the stream that holds it reports for it; once it
// went stale, another stream takes it over.
func TestIDHeldByItsLiveHolder(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	web1, web2 := Sender{Identity: "web", Holder: 1}, Sender{Identity: "web", Holder: 2}
	r := report("s1", "web", in, time.Second, pc("a", 10, 0, 0))
	r.Interval = durationpb.New(time.Second)
	if err := s.ApplyFrom(web1, r, t0); err != nil {
		t.Fatal(err)
	}
	zero := report("s1", "web", in, time.Second, pc("a", 0, 0, 0))
	wantReason(t, s.ApplyFrom(web2, zero, t0.Add(3*time.Second)), ReasonIDInUse)
	// Another identity's s1 is another sidecar.
	if err := s.ApplyFrom(Sender{Identity: "abuser", Holder: 2}, report("s1", "abuser", in, time.Second), t0); err != nil {
		t.Fatal(err)
	}
	want := zoneLoad(serviceLoad("abuser", in, 1), serviceLoad("web", in, 1, rate("a", 10, 0, 0)))
	if got := s.Flush(t0.Add(3*time.Second), time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	// Stale after 3 intervals: the next holder takes it, and the old
	// holder's end does not remove it.
	if err := s.ApplyFrom(web2, zero, t0.Add(3*time.Second+1)); err != nil {
		t.Fatalf("after s1 went stale: %v", err)
	}
	s.Remove("web", "s1", web1.Holder)
	wantReason(t, s.ApplyFrom(web1, r, t0.Add(3*time.Second+2)), ReasonIDInUse)
	want = zoneLoad(serviceLoad("web", in, 1, rate("a", 0, 0, 0)))
	if got := s.Flush(t0.Add(3*time.Second+2), time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

// TestIntervalBoundsStaleness: one report keeps its sidecar in the sums for
// at most staleAfter × MaxInterval, whatever window and interval it states.
func TestIntervalBoundsStaleness(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxInterval: 2 * time.Second})
	r := report("s1", "web", in, time.Minute, pc("a", 60, 0, 0))
	r.Interval = durationpb.New(2 * time.Second)
	apply(t, s, t0, r)
	if s.Flush(t0.Add(6*time.Second), time.Second); s.Sidecars() != 1 {
		t.Fatal("dropped before 3 × MaxInterval")
	}
	if s.Flush(t0.Add(6*time.Second+1), time.Second); s.Sidecars() != 0 {
		t.Fatal("kept after 3 × MaxInterval, for its 1-minute window")
	}
	r.Interval = durationpb.New(2*time.Second + 1)
	wantReason(t, s.Apply(r, t0), ReasonBadInterval)
}

// TestIdentityQuotas: an identity over a quota has its new sidecar
// rejected, or the peers beyond it folded into _overflow, and another
// identity is unaffected.
func TestIdentityQuotas(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxSidecarsPerIdentity: 2, MaxPeersPerIdentity: 3, MaxEntriesPerIdentity: 5})
	ab := func(id string, peers ...*sluicev1.PeerCounts) *sluicev1.LoadReport {
		return report(id, "abuser", in, time.Second, peers...)
	}
	wantFolds := func(want Folds) {
		t.Helper()
		if got := s.TakeFolds(); got != want {
			t.Errorf("folds = %+v, want %+v", got, want)
		}
	}
	apply(t, s, t0, ab("a1", pc("p1", 1, 0, 0), pc("p2", 1, 0, 0)), ab("a2", pc("p1", 1, 0, 0), pc("p2", 1, 0, 0)))
	wantReason(t, s.Apply(ab("a3"), t0), ReasonQuotaSidecars)
	wantFolds(Folds{})
	// Two peers new to the identity, room for one: the larger rate stays.
	apply(t, s, t0, ab("a2", pc("p3", 2, 0, 0), pc("p4", 5, 1, 1)))
	wantFolds(Folds{Identity: 1})
	want := zoneLoad(serviceLoad("abuser", in, 2, rate("_overflow", 2, 0, 0), rate("p1", 1, 0, 0), rate("p2", 1, 0, 0), rate("p4", 5, 1, 1)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	// a1 dropping p1 frees its place for p3.
	apply(t, s, t0, ab("a1", pc("p2", 1, 0, 0), pc("p3", 1, 0, 0)))
	wantFolds(Folds{})
	// Entries: a1's 3 and a2's 3 (the reserved left out) would be 6; the
	// smallest rate of a2's folds.
	apply(t, s, t0, ab("a1", pc("p2", 1, 0, 0), pc("p3", 1, 0, 0), pc("p4", 1, 0, 0)))
	apply(t, s, t0, ab("a2", pc("p4", 5, 0, 0), pc("p2", 9, 0, 0), pc("p3", 7, 0, 0), pc("unknown", 1, 0, 0), pc("_overflow", 1, 1, 0)))
	wantFolds(Folds{Entries: 1})
	want = zoneLoad(serviceLoad("abuser", in, 2, rate("_overflow", 6, 1, 0), rate("p2", 10, 0, 0), rate("p3", 8, 0, 0),
		rate("p4", 1, 0, 0), rate("unknown", 1, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}

	// Web, another identity, is untouched by abuser's quotas.
	apply(t, s, t0, report("w1", "web", in, time.Second, pc("p1", 1, 0, 0), pc("p2", 1, 0, 0), pc("p3", 1, 0, 0)),
		report("w2", "web", in, time.Second, pc("p1", 1, 0, 0)))
	wantFolds(Folds{})
	// Removing a sidecar gives its quota back.
	s.Remove("abuser", "a2", 0)
	apply(t, s, t0, ab("a3", pc("p2", 1, 0, 0)))
	wantFolds(Folds{})
	if s.Sidecars() != 4 {
		t.Errorf("Sidecars = %d, want 4", s.Sidecars())
	}
}

// TestFloodOfMadeUpCallersFolds is a reviewer's case: in header mode, 12
// sidecars of checkout each see web at 100 rps and 1,022 made-up caller
// names (the sidecar's --max-peers of new names). Their 12,264 distinct
// names exceed checkout's --max-peers-per-identity (10,000). Before, whole
// reports were rejected (3 of 12), web was counted at 900 rps instead of
// 1,200 and got a third more than its limit. Now web, which every report
// names first, keeps its bucket with its whole rate; the made-up names
// beyond the quota go to _overflow, and the zone's total is the sidecars'.
func TestFloodOfMadeUpCallersFolds(t *testing.T) {
	const sidecars, flood = 12, 1022
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	var total float64
	for i := range sidecars {
		r := report(fmt.Sprintf("checkout-%d", i), "checkout", in, time.Second, pc("web", 100, 0, 0))
		for j := range flood {
			r.Peers = append(r.Peers, pc(fmt.Sprintf("made-up-%02d-%04d", i, j), uint64(1+j%7), 0, 0))
		}
		for _, p := range r.Peers {
			total += float64(p.Offered)
		}
		apply(t, s, t0, r)
	}
	folds := s.TakeFolds()
	if want := 1 + sidecars*flood - 10000; folds != (Folds{Identity: want}) {
		t.Errorf("folds = %+v, want %d beyond the identity's quota", folds, want)
	}
	zl := s.Flush(t0, time.Second)
	var sum, overflow float64
	peers := zl.GetServices()[0].GetPeers()
	for _, p := range peers {
		sum += p.GetOfferedRps()
		switch p.GetPeer() {
		case "web":
			if p.GetOfferedRps() != 100*sidecars {
				t.Errorf("web at %v rps, want %d", p.GetOfferedRps(), 100*sidecars)
			}
		case "_overflow":
			overflow = p.GetOfferedRps()
		}
	}
	if sum != total || overflow == 0 {
		t.Errorf("zone sum %v rps (%v in _overflow), the sidecars reported %v", sum, overflow, total)
	}
	if len(peers) != 10000+1 {
		t.Errorf("%d peers in the zone load, want the quota and _overflow", len(peers))
	}
	t.Logf("web %d rps; %d peers folded, %.0f rps in _overflow of %.0f", 100*sidecars, folds.Identity, overflow, total)
}

// TestHeldPeersAreReleased: a flood that came first holds the identity's
// peers only while reports name them; once the sidecars' reports leave
// the made-up names out, a caller new to the identity gets its own bucket.
func TestHeldPeersAreReleased(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxPeersPerIdentity: 4})
	apply(t, s, t0,
		report("c1", "checkout", in, time.Second, pc("f1", 1, 0, 0), pc("f2", 1, 0, 0)),
		report("c2", "checkout", in, time.Second, pc("f3", 1, 0, 0), pc("f4", 1, 0, 0)))
	apply(t, s, t0, report("c1", "checkout", in, time.Second, pc("f1", 1, 0, 0), pc("f2", 1, 0, 0), pc("mobile", 50, 0, 0)))
	if f := s.TakeFolds(); f.Identity != 1 {
		t.Fatalf("folds = %+v, want mobile folded while the flood holds the quota", f)
	}
	// c2's flood ends: its next report names no one.
	apply(t, s, t0, report("c2", "checkout", in, time.Second))
	apply(t, s, t0, report("c1", "checkout", in, time.Second, pc("f1", 1, 0, 0), pc("f2", 1, 0, 0), pc("mobile", 50, 0, 0)))
	if f := s.TakeFolds(); f.Total() != 0 {
		t.Fatalf("folds = %+v after the flood's names were released", f)
	}
	// The flood's remaining names go as c1 stops naming them; a sidecar
	// that goes silent releases its peers when it goes stale.
	apply(t, s, t0, report("c1", "checkout", in, time.Second, pc("mobile", 50, 0, 0)),
		report("c2", "checkout", in, time.Second, pc("a", 1, 0, 0), pc("b", 1, 0, 0), pc("c", 1, 0, 0)))
	s.Flush(t0.Add(10*time.Second), time.Second)
	if s.Sidecars() != 0 || len(s.identities) != 0 {
		t.Fatalf("%d sidecars, %d identities kept after every sidecar went stale", s.Sidecars(), len(s.identities))
	}
}

// TestReportBeyondItsBoundFolds: a report naming more peers than
// MaxPeersPerReport keeps the largest, the reserved ones besides; the rest
// go to _overflow, counted; one naming absurdly many is rejected.
func TestReportBeyondItsBoundFolds(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{MaxPeersPerReport: 2})
	apply(t, s, t0, report("c1", "checkout", in, time.Second,
		pc("a", 1, 1, 0), pc("b", 4, 0, 0), pc("c", 3, 0, 1), pc("d", 2, 0, 0), pc("unknown", 5, 0, 0)))
	if f := s.TakeFolds(); f != (Folds{Report: 2}) {
		t.Errorf("folds = %+v, want 2 beyond the report's bound", f)
	}
	want := zoneLoad(serviceLoad("checkout", in, 1, rate("_overflow", 3, 1, 0), rate("b", 4, 0, 0), rate("c", 3, 0, 1), rate("unknown", 5, 0, 0)))
	if got := s.Flush(t0, time.Second); !proto.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	r := report("c1", "checkout", in, time.Second)
	for i := range 21 {
		r.Peers = append(r.Peers, pc(fmt.Sprintf("p%d", i), 1, 0, 0))
	}
	wantReason(t, s.Apply(r, t0), ReasonTooManyPeers)
}

// TestFlushCapsSums: many sidecars each within MaxRate add up to no more
// than the controller accepts, with dropped and shadow-dropped scaled in
// proportion.
func TestFlushCapsSums(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	for i := range 1001 {
		apply(t, s, t0, report(fmt.Sprintf("s%d", i), "abuser", in, time.Second, pc("x", 1e7, 5e6, 2e6)))
	}
	zl := s.Flush(t0, time.Second)
	p := zl.GetServices()[0].GetPeers()[0]
	if p.GetOfferedRps() != zoneload.MaxRate || math.Abs(p.GetDroppedRps()-zoneload.MaxRate/2) > 1 ||
		math.Abs(p.GetShadowDroppedRps()-zoneload.MaxRate/5) > 1 || s.Capped() != 1 {
		t.Errorf("capped sum = %v (capped %d), want offered %g, dropped half, shadow a fifth", p, s.Capped(), zoneload.MaxRate)
	}
	if zl.GetServices()[0].GetLiveSidecars() != 1001 {
		t.Errorf("live sidecars = %d", zl.GetServices()[0].GetLiveSidecars())
	}
}

// A sidecar's report interval can be set only within what the
// aggregator's default bounds accept: otherwise a configuration the sidecar
// takes at start would have every one of its reports rejected.
func TestDefaultBoundsAcceptEveryReportInterval(t *testing.T) {
	b := DefaultBounds()
	if reporter.MinInterval < b.MinWindow || reporter.MaxInterval > b.MaxInterval || reporter.MaxInterval > b.MaxWindow {
		t.Errorf("sidecar report intervals [%v, %v], aggregator accepts windows [%v, %v] and intervals up to %v",
			reporter.MinInterval, reporter.MaxInterval, b.MinWindow, b.MaxWindow, b.MaxInterval)
	}
}
