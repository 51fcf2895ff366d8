package aggregator

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/health"
)

// uh is an UpstreamHealth of procedure with ok answers in bucket 10 and
// failed ones in bucket 30.
func uh(procedure string, ok, failed uint64) *sluicev1.UpstreamHealth {
	h := &sluicev1.UpstreamHealth{Procedure: procedure, Latency: make([]uint64, health.Buckets), Ok: ok, Failed: failed}
	h.Latency[10], h.Latency[30] = ok, failed
	return h
}

func withHealth(r *sluicev1.LoadReport, w time.Duration, hs ...*sluicev1.UpstreamHealth) *sluicev1.LoadReport {
	r.Health, r.HealthWindow = hs, durationpb.New(w)
	return r
}

// healthOf flushes s at now and returns the health of its one service.
func healthOf(t *testing.T, s *State, now time.Time) []*sluicev1.HealthRates {
	t.Helper()
	zl := s.Flush(now, time.Second)
	if len(zl.GetServices()) != 1 {
		t.Fatalf("want one service, got %v", zl)
	}
	return zl.GetServices()[0].GetHealth()
}

// TestHealthSummed: two sidecars' health adds up per procedure as rates
// over each one's health window; an urgent report keeps a sidecar's last
// health; a stale sidecar's leaves the sums.
func TestHealthSummed(t *testing.T) {
	s := NewState("zone-a", "agg-1", 3, Bounds{})
	apply(t, s, t0,
		withHealth(report("a", "api", in, time.Second, pc("web", 400, 0, 0)), 2*time.Second, uh("/pay", 600, 20), uh("_other", 100, 0)),
		withHealth(report("b", "api", in, time.Second, pc("web", 400, 0, 0)), time.Second, uh("/pay", 300, 30)))
	got := healthOf(t, s, t0)
	if len(got) != 2 || got[0].GetProcedure() != "/pay" || got[1].GetProcedure() != "_other" {
		t.Fatalf("health %v, want /pay and _other", got)
	}
	pay := got[0]
	if pay.GetOkRps() != 600 || pay.GetFailedRps() != 40 || pay.GetLatencyRps()[10] != 600 || pay.GetLatencyRps()[30] != 40 || len(pay.GetLatencyRps()) != health.Buckets {
		t.Errorf("/pay: %v, want 300+300 ok and 10+30 failed a second", pay)
	}
	urgent := report("b", "api", in, 100*time.Millisecond, pc("web", 400, 0, 0))
	urgent.Urgent, urgent.Interval = true, durationpb.New(time.Second)
	apply(t, s, t0.Add(time.Second), urgent)
	if got := healthOf(t, s, t0.Add(time.Second)); got[0].GetOkRps() != 600 {
		t.Errorf("after b's urgent report: /pay %v, want b's health kept", got[0])
	}
	apply(t, s, t0.Add(2*time.Second), report("b", "api", in, time.Second, pc("web", 400, 0, 0)))
	if got := healthOf(t, s, t0.Add(2*time.Second)); got[0].GetOkRps() != 300 {
		t.Errorf("after b's regular report without health: /pay %v, want a's alone", got[0])
	}
	if zl := s.Flush(t0.Add(10*time.Second), time.Second); len(zl.GetServices()) != 0 {
		t.Errorf("every sidecar stale: %v", zl.GetServices())
	}
}

// TestHealthBadEntries: a bad health entry costs itself, never the report
// or its peers; health answering more than reached the sidecar costs the
// report's health.
func TestHealthBadEntries(t *testing.T) {
	short := uh("/pay", 1, 0)
	short.Latency = short.Latency[:10]
	wrongSum := uh("/pay", 10, 0)
	wrongSum.Latency[3] = 1
	overflow := uh("/pay", 0, 0)
	overflow.Latency[0], overflow.Latency[1], overflow.Ok = 1<<63, 1<<63, 0
	for _, tc := range []struct {
		name  string
		r     *sluicev1.LoadReport
		field func(RejectedEntries) int
		kept  int
	}{
		{"short latency", withHealth(report("a", "api", in, time.Second, pc("web", 100, 0, 0)), time.Second, short, uh("/b", 1, 0)),
			func(e RejectedEntries) int { return e.BadHealth }, 1},
		{"counts that do not add up", withHealth(report("a", "api", in, time.Second, pc("web", 100, 0, 0)), time.Second, wrongSum),
			func(e RejectedEntries) int { return e.BadHealth }, 0},
		{"counts that overflow", withHealth(report("a", "api", in, time.Second, pc("web", 100, 0, 0)), time.Second, overflow),
			func(e RejectedEntries) int { return e.BadHealth }, 0},
		{"a bad procedure", withHealth(report("a", "api", in, time.Second, pc("web", 100, 0, 0)), time.Second, uh("no spaces", 1, 0)),
			func(e RejectedEntries) int { return e.BadHealth }, 0},
		{"a bad window", withHealth(report("a", "api", in, time.Second, pc("web", 100, 0, 0)), time.Hour, uh("/a", 1, 0)),
			func(e RejectedEntries) int { return e.BadHealth }, 0},
		{"a duplicate", withHealth(report("a", "api", in, time.Second, pc("web", 100, 0, 0)), time.Second, uh("/a", 1, 0), uh("/a", 2, 0)),
			func(e RejectedEntries) int { return e.DuplicateHealth }, 1},
		{"outbound", withHealth(report("a", "api", out, time.Second, pc("web", 100, 0, 0)), time.Second, uh("/a", 1, 0)),
			func(e RejectedEntries) int { return e.OutboundHealth }, 0},
		{"an overclaim", withHealth(report("a", "api", in, time.Second, pc("web", 100, 90, 0)), time.Second, uh("/a", 500, 0), uh("/b", 1, 0)),
			func(e RejectedEntries) int { return e.HealthOverclaim }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState("zone-a", "agg-1", 3, Bounds{})
			apply(t, s, t0, tc.r)
			bad := s.TakeRejectedEntries()
			if n := tc.field(bad); n == 0 || bad.Total() != n {
				t.Errorf("rejected %+v, want only this reason", bad)
			}
			zl := s.Flush(t0, time.Second)
			sl := zl.GetServices()[0]
			if len(sl.GetPeers()) != 1 || len(sl.GetHealth()) != tc.kept {
				t.Errorf("kept %d peers and %d health entries, want 1 and %d", len(sl.GetPeers()), len(sl.GetHealth()), tc.kept)
			}
		})
	}
}
