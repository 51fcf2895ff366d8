package reporter

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/sidecar"
)

func report(window time.Duration, peers ...*sluicev1.PeerCounts) *sluicev1.LoadReport {
	return &sluicev1.LoadReport{Window: durationpb.New(window), Peers: peers}
}

func TestSurgeFollowsARamp(t *testing.T) {
	var d SurgeDetector
	before := pcs(c("web", 0, 0, 0))
	// A regular report at 10,000 rps: 12,000 over a 250ms check (1.2×) is
	// no surge.
	d.Reported(report(time.Second, wire("web", 10000, 0, 0)))
	if d.Surging(before, pcs(c("web", 3000, 0, 0)), 250*time.Millisecond) {
		t.Error("1.2× after a regular report is a surge")
	}
	// After a surge report, the same 1.2× rise is reported: the surge is
	// climbing and the ratio should follow it now.
	r := report(time.Second, wire("web", 10000, 0, 0))
	r.Urgent = true
	d.Reported(r)
	if !d.Surging(before, pcs(c("web", 3000, 0, 0)), 250*time.Millisecond) {
		t.Error("1.2× during a surge is not reported")
	}
	// A regular report ends the surge.
	d.Reported(report(time.Second, wire("web", 10000, 0, 0)))
	if d.Surging(before, pcs(c("web", 3000, 0, 0)), 250*time.Millisecond) {
		t.Error("1.2× after the surge ended is reported")
	}
}

func TestSurgeDetector(t *testing.T) {
	var d SurgeDetector
	before := pcs(c("web", 1000, 0, 0), c("batch", 500, 0, 0))
	if d.Surging(before, pcs(c("web", 5000, 0, 0)), time.Second) {
		t.Error("surging before any report: nothing to compare with")
	}
	// web reported at 100 rps, batch at 10 rps; new peers at 0.
	d.Reported(report(time.Second, wire("web", 100, 0, 0), wire("batch", 10, 0, 0)))
	for _, tc := range []struct {
		name    string
		cur     []sidecar.PeerCounts
		elapsed time.Duration
		want    bool
	}{
		// Over 100ms web is expected at 10 requests, batch at 1: both are
		// too few to judge a fall, so only web's rises matter.
		{"web at 300 rps over 100ms", pcs(c("web", 1030, 0, 0), c("batch", 501, 0, 0)), 100 * time.Millisecond, true},
		{"web at 140 rps: under 1.5×", pcs(c("web", 1014, 0, 0), c("batch", 501, 0, 0)), 100 * time.Millisecond, false},
		{"web at 1000 rps but 10 requests: noise", pcs(c("web", 1010, 0, 0), c("batch", 500, 0, 0)), 10 * time.Millisecond, false},
		{"a reset counter is not a rate", pcs(c("web", 40, 0, 0), c("batch", 501, 0, 0)), 100 * time.Millisecond, false},
		{"steady", pcs(c("web", 1010, 0, 0), c("batch", 501, 0, 0)), 100 * time.Millisecond, false},
		// Over a second web is expected at 100 and batch at 10.
		{"batch at 20 rps, 20 requests: within noise of 10", pcs(c("web", 1100, 0, 0), c("batch", 520, 0, 0)), time.Second, false},
		{"batch at 30 rps: 4σ above 10", pcs(c("web", 1100, 0, 0), c("batch", 530, 0, 0)), time.Second, true},
		{"a new peer with enough requests", pcs(c("web", 1100, 0, 0), c("batch", 510, 0, 0), c("new", 25, 0, 0)), time.Second, true},
		{"web falls to 50 rps: 1/2, 5σ", pcs(c("web", 1050, 0, 0), c("batch", 510, 0, 0)), time.Second, true},
		{"web falls to 70 rps: under 1.5×", pcs(c("web", 1070, 0, 0), c("batch", 510, 0, 0)), time.Second, false},
		{"web gone from the snapshot", pcs(c("batch", 510, 0, 0)), time.Second, true},
		{"batch falls to 0 from 10: too few to tell", pcs(c("web", 1100, 0, 0), c("batch", 500, 0, 0)), time.Second, false},
	} {
		if got := d.Surging(before, tc.cur, tc.elapsed); got != tc.want {
			t.Errorf("%s: Surging = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Poisson noise at a moderate rate: 52 rps reported, a 250ms check
	// expects 13; 20 is 1.5× but under 2σ: not a surge.
	d.Reported(report(time.Second, wire("web", 52, 0, 0)))
	if d.Surging(pcs(c("web", 0, 0, 0)), pcs(c("web", 20, 0, 0)), 250*time.Millisecond) {
		t.Error("20 requests where 13 were expected is noise, not a surge")
	}
	// A later report moves the baseline: web at 300 rps is now normal.
	d.Reported(report(time.Second, wire("web", 300, 0, 0)))
	if d.Surging(before, pcs(c("web", 1030, 0, 0)), 100*time.Millisecond) {
		t.Error("300 rps surges against a reported 300 rps")
	}
	// Traffic that leaves: 300 rps reported, nothing over a second.
	if !d.Surging(before, pcs(c("web", 1000, 0, 0)), time.Second) {
		t.Error("a peer falling from 300 rps to 0 is not reported at once")
	}
}

// manualSource is a Source whose counters the test sets.
type manualSource struct {
	mu    sync.Mutex
	total map[string]sidecar.PeerCounts
}

func (m *manualSource) add(peer string, n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.total[peer]
	t.Peer = peer
	t.Offered += n
	m.total[peer] = t
}

func (m *manualSource) AppendCounts(_ string, dst []sidecar.PeerCounts) []sidecar.PeerCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.total {
		dst = append(dst, t)
	}
	return dst
}

// capture is a LoadReportService that keeps every report.
type capture struct {
	sluicev1.UnimplementedLoadReportServiceServer
	mu      sync.Mutex
	reports []*sluicev1.LoadReport
}

func (c *capture) StreamLoadReports(s grpc.BidiStreamingServer[sluicev1.StreamLoadReportsRequest, sluicev1.StreamLoadReportsResponse]) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		c.mu.Lock()
		c.reports = append(c.reports, req.GetReport())
		c.mu.Unlock()
		if err := s.Send(&sluicev1.StreamLoadReportsResponse{Accepted: true}); err != nil {
			return nil
		}
	}
}

func (c *capture) all() []*sluicev1.LoadReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*sluicev1.LoadReport(nil), c.reports...)
}

// A surge is reported at the next check, not at the end of the interval, and
// covers the check window alone. Periodic reports never have windows under
// half the interval (shorter ones are folded), so a report with a window of
// a few checks can only be a surge report.
func TestSurgeIsReportedBeforeTheInterval(t *testing.T) {
	capt := &capture{}
	g := grpc.NewServer()
	sluicev1.RegisterLoadReportServiceServer(g, capt)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	defer g.Stop()

	src := &manualSource{total: map[string]sidecar.PeerCounts{}}
	reg := prometheus.NewRegistry()
	const interval = time.Second
	startReporter(t, Config{
		SidecarID: "s1", Service: "checkout", Interval: interval, SurgeCheck: 10 * time.Millisecond,
		Aggregators: []string{lis.Addr().String()}, Registerer: reg,
	}, src)

	// The first periodic report is the baseline (nothing offered yet).
	testkit.WaitFor(t, 20*time.Second, "the first periodic report", func() bool { return len(capt.all()) >= 1 })
	if w := capt.all()[0].GetWindow().AsDuration(); w < interval/2 {
		t.Fatalf("first report's window is %v, want a periodic one", w)
	}
	// Right after it, the next periodic report is an interval away: the
	// burst is seen by a check long before.
	src.add("web", 1000)
	testkit.WaitFor(t, 20*time.Second, "a surge report", func() bool { return len(capt.all()) >= 2 })
	rep := capt.all()[1]
	if w := rep.GetWindow().AsDuration(); w >= interval/2 {
		t.Errorf("second report's window is %v: a periodic report, not a surge report", w)
	}
	if len(rep.GetPeers()) != 1 || rep.GetPeers()[0].GetPeer() != "web" || rep.GetPeers()[0].GetOffered() != 1000 {
		t.Errorf("surge report peers = %v, want web's 1000 requests", rep.GetPeers())
	}
	// At least 1: the check after the burst may already have reported its
	// end, a fall from the burst's rate to nothing, as a surge too.
	if got := metric(t, reg, "sluice_sidecar_report_surges_total"); got < 1 {
		t.Errorf("surges_total = %v, want at least 1", got)
	}
}

func TestSurgeChecksOff(t *testing.T) {
	if _, err := New(Config{SidecarID: "s", Service: "x", Aggregators: []string{"a:1"}, SurgeCheck: time.Nanosecond}, &manualSource{}); err == nil {
		t.Error("a 1ns surge check was accepted")
	}
	if _, err := New(Config{SidecarID: "s", Service: "x", Aggregators: []string{"a:1"}, SurgeCheck: -1}, &manualSource{}); err != nil {
		t.Errorf("negative SurgeCheck (off) refused: %v", err)
	}
}

// A surge too thin to show in one check window — fewer requests than
// MinCount per check, as at a sidecar that sees 10 rps become 170 — is
// still reported before the interval ends: the window since the last report
// adds up to MinCount a few checks in.
func TestThinSurgeIsReportedBeforeTheInterval(t *testing.T) {
	capt := &capture{}
	g := grpc.NewServer()
	sluicev1.RegisterLoadReportServiceServer(g, capt)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	defer g.Stop()

	src := &manualSource{total: map[string]sidecar.PeerCounts{}}
	const interval, check = 2 * time.Second, 50 * time.Millisecond
	startReporter(t, Config{
		SidecarID: "s1", Service: "checkout", Interval: interval, SurgeCheck: check,
		Aggregators: []string{lis.Addr().String()}, Registerer: prometheus.NewRegistry(),
	}, src)
	testkit.WaitFor(t, 20*time.Second, "the first periodic report", func() bool { return len(capt.all()) >= 1 })

	// 6 requests every 60ms: at most 18 in a check window unless this
	// goroutine stalls for three checks, below DefaultSurgeMinCount (20).
	start := time.Now()
	for len(capt.all()) < 2 && time.Since(start) < interval/2 {
		src.add("web", 6)
		time.Sleep(60 * time.Millisecond)
	}
	reports := capt.all()
	if len(reports) < 2 {
		t.Fatalf("no report within %v of a thin surge starting (interval %v)", interval/2, interval)
	}
	if rep := reports[1]; !rep.GetUrgent() || rep.GetWindow().AsDuration() >= interval/2 {
		t.Errorf("second report: urgent %v, window %v; want a surge report, sent before half the interval",
			rep.GetUrgent(), rep.GetWindow().AsDuration())
	}
}

// Since picks the newest check from which at least MinCount requests were
// counted, so that a surge found over the window since the report is
// reported over its recent part.
func TestTrailSince(t *testing.T) {
	snap := func(n uint64) []sidecar.PeerCounts {
		return []sidecar.PeerCounts{{Peer: "web", Offered: n}, {Peer: "mobile", Offered: 1}}
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	check := func(i int) time.Time { return start.Add(time.Duration(i) * 100 * time.Millisecond) }
	var tr Trail
	tr.Reset(snap(100), check(0))
	for i, n := range []uint64{101, 102, 103, 110, 127} {
		tr.Add(snap(n), check(i+1))
	}
	cases := []struct {
		cur  uint64
		want int
	}{
		{147, 5}, // 20 since the last check
		{140, 4}, // 13 since the last, 30 since the one before
		{115, 0}, // never 20 since a check: the report's start
	}
	for _, c := range cases {
		if _, at := tr.Since(snap(c.cur), 20); !at.Equal(check(c.want)) {
			t.Errorf("Since(%d) from %v, want check %d", c.cur, at.Sub(start), c.want)
		}
	}
	tr.Reset(snap(200), check(9))
	if s, at := tr.Since(snap(300), 20); !at.Equal(check(9)) || s[0].Offered != 200 {
		t.Errorf("after Reset: Since = %v at %v, want the new start", s, at.Sub(start))
	}
}

// TestSurgeConfirmsItsReport: the check after a surge report reports again
// when the rate it sees differs by FollowFactor, whatever the noise, since
// the surge report's window held some of the calm before the onset; the
// confirmation's own report arms no other.
func TestSurgeConfirmsItsReport(t *testing.T) {
	const check = 200 * time.Millisecond
	urgent := func(rps float64) *sluicev1.LoadReport {
		r := report(check, wire("web", uint64(rps*check.Seconds()), 0, 0))
		r.Urgent = true
		return r
	}
	before := pcs(c("web", 0, 0, 0))
	var d SurgeDetector
	d.Reported(report(time.Second, wire("web", 12, 0, 0)))
	// The surge report: the onset a fifth into its window, 100 rps of 125.
	d.Reported(urgent(100))
	// 25 requests in 200ms (125 rps) against 20 expected: 1.25×, but
	// under 2σ (8.9): only the confirmation reports it.
	if !d.Surging(before, pcs(c("web", 25, 0, 0)), check) {
		t.Fatal("the check after a diluted surge report does not report the surge's full rate")
	}
	d.Reported(urgent(125))
	// The confirmation's report arms none: 29 against 25 expected (1.16×,
	// 0.8σ) is noise again.
	if d.Surging(before, pcs(c("web", 29, 0, 0)), check) {
		t.Error("the check after a confirmation reports 1.16× within noise")
	}

	// Without a diluted report, the confirmation stays quiet: 26 against 25.
	d.Reported(report(time.Second, wire("web", 125, 0, 0)))
	d.Reported(urgent(125))
	if d.Surging(before, pcs(c("web", 26, 0, 0)), check) {
		t.Error("a confirmation within FollowFactor of the surge report reports")
	}
	// And only the first check after a surge report confirms: the second
	// judges with the noise again.
	if d.Surging(before, pcs(c("web", 31, 0, 0)), check) {
		t.Error("the second check after a surge report reports 1.24× at 1.2σ")
	}
}
