package reporter

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/sidecar"
)

// The Limiter is the Source in production.
var _ Source = (*sidecar.Limiter)(nil)

func pcs(cs ...sidecar.PeerCounts) []sidecar.PeerCounts { return cs }

func c(peer string, offered, dropped, shadow uint64) sidecar.PeerCounts {
	return sidecar.PeerCounts{Peer: peer, Offered: offered, Dropped: dropped, ShadowDropped: shadow}
}

func wire(peer string, offered, dropped, shadow uint64) *sluicev1.PeerCounts {
	return &sluicev1.PeerCounts{Peer: peer, Offered: offered, Dropped: dropped, ShadowDropped: shadow}
}

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, cur []sidecar.PeerCounts
		want      []*sluicev1.PeerCounts
	}{
		{"nothing", nil, nil, nil},
		{"first snapshot: all of cur counts", nil,
			pcs(c("a", 10, 2, 1)),
			[]*sluicev1.PeerCounts{wire("a", 10, 2, 1)}},
		{"difference, sorted",
			pcs(c("b", 100, 10, 0), c("a", 5, 0, 0)),
			pcs(c("b", 150, 20, 3), c("a", 6, 1, 0)),
			[]*sluicev1.PeerCounts{wire("a", 1, 1, 0), wire("b", 50, 10, 3)}},
		{"new peer",
			pcs(c("a", 5, 0, 0)),
			pcs(c("a", 6, 0, 0), c("n", 4, 0, 0)),
			[]*sluicev1.PeerCounts{wire("a", 1, 0, 0), wire("n", 4, 0, 0)}},
		{"idle peer omitted",
			pcs(c("a", 5, 1, 1), c("b", 7, 0, 0)),
			pcs(c("a", 5, 1, 1), c("b", 8, 0, 0)),
			[]*sluicev1.PeerCounts{wire("b", 1, 0, 0)}},
		{"vanished peer omitted",
			pcs(c("a", 5, 0, 0), c("b", 7, 0, 0)),
			pcs(c("b", 9, 0, 0)),
			[]*sluicev1.PeerCounts{wire("b", 2, 0, 0)}},
		{"offered reset: report cur",
			pcs(c("a", 1000, 100, 10)),
			pcs(c("a", 30, 3, 1)),
			[]*sluicev1.PeerCounts{wire("a", 30, 3, 1)}},
		{"dropped reset alone is a reset too",
			pcs(c("a", 1000, 100, 10)),
			pcs(c("a", 1001, 3, 11)),
			[]*sluicev1.PeerCounts{wire("a", 1001, 3, 11)}},
		{"reset to nothing omitted",
			pcs(c("a", 1000, 100, 10)),
			pcs(c("a", 0, 0, 0)),
			nil},
		{"torn snapshot: dropped clamped to offered",
			pcs(c("a", 10, 0, 0)),
			pcs(c("a", 12, 5, 0)),
			[]*sluicev1.PeerCounts{wire("a", 2, 2, 0)}},
		{"torn snapshot: shadow clamped to offered minus dropped",
			pcs(c("a", 10, 0, 0)),
			pcs(c("a", 14, 3, 4)),
			[]*sluicev1.PeerCounts{wire("a", 4, 3, 1)}},
		{"bad names count as unknown",
			pcs(c("unknown", 1, 0, 0), c("bad name", 1, 0, 0)),
			pcs(c("unknown", 3, 1, 0), c("bad name", 5, 0, 1), c("-x", 1, 0, 0)),
			[]*sluicev1.PeerCounts{wire("unknown", 7, 1, 1)}},
		{"duplicates in a snapshot are summed",
			pcs(c("a", 1, 0, 0), c("a", 1, 0, 0)),
			pcs(c("a", 3, 0, 0), c("a", 4, 1, 0)),
			[]*sluicev1.PeerCounts{wire("a", 5, 1, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Header{SidecarID: "pod-1", Service: "svc", Zone: "z", Direction: sidecar.Outbound}
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			got := Build(h, tc.prev, tc.cur, start, 1500*time.Millisecond)
			want := &sluicev1.LoadReport{
				SidecarId:   "pod-1",
				Service:     "svc",
				Zone:        "z",
				Direction:   sluicev1.Direction_DIRECTION_OUTBOUND,
				WindowStart: timestamppb.New(start),
				Window:      durationpb.New(1500 * time.Millisecond),
				Peers:       tc.want,
			}
			if !proto.Equal(got, want) {
				t.Errorf("Build =\n%v\nwant\n%v", got, want)
			}
		})
	}
}

// fakeSource is a Source whose counters grow by fixed steps on every
// snapshot, so every window holds exactly one step whatever its length.
type fakeSource struct {
	mu    sync.Mutex // protects total
	step  map[string]sidecar.PeerCounts
	total map[string]sidecar.PeerCounts
	calls int
}

func newFakeSource(steps ...sidecar.PeerCounts) *fakeSource {
	f := &fakeSource{step: map[string]sidecar.PeerCounts{}, total: map[string]sidecar.PeerCounts{}}
	for _, s := range steps {
		f.step[s.Peer] = s
	}
	return f
}

func (f *fakeSource) AppendCounts(service string, dst []sidecar.PeerCounts) []sidecar.PeerCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	for p, s := range f.step {
		t := f.total[p]
		t.Peer = p
		t.Offered += s.Offered
		t.Dropped += s.Dropped
		t.ShadowDropped += s.ShadowDropped
		f.total[p] = t
		dst = append(dst, t)
	}
	return dst
}

// startAggregator runs a real aggregator Service on loopback. It is not
// Run: the test flushes it by hand and it needs no controller.
func startAggregator(t *testing.T, bounds aggregator.Bounds) (*aggregator.Service, string) {
	t.Helper()
	svc, err := aggregator.New(aggregator.Config{
		ID: "agg-1", Zone: "zone-b", Controllers: []string{"127.0.0.1:1"}, Bounds: bounds,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return svc, lis.Addr().String()
}

func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

func startReporter(t *testing.T, cfg Config, src Source) *Reporter {
	t.Helper()
	r, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return within 20s of cancel")
		}
	})
	return r
}

func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func TestReportsReachAggregator(t *testing.T) {
	agg, addr := startAggregator(t, aggregator.Bounds{})
	src := newFakeSource(c("a", 100, 10, 5), c("b", 50, 0, 0), c("idle", 0, 0, 0))
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	r := startReporter(t, Config{
		SidecarID:   "pod-1",
		Service:     "svc",
		Zone:        "my-zone",
		Logger:      slog.New(slog.NewTextHandler(&logs, nil)),
		Interval:    20 * time.Millisecond,
		Aggregators: []string{deadAddr(t), addr},
		Registerer:  reg,
	}, src)

	var svc *sluicev1.ServiceLoad
	testkit.WaitFor(t, 20*time.Second, "the sidecar's rates in a flush", func() bool {
		zl := agg.FlushNow()
		if len(zl.GetServices()) != 1 {
			return false
		}
		svc = zl.GetServices()[0]
		return true
	})
	if svc.Service != "svc" || svc.Direction != sluicev1.Direction_DIRECTION_INBOUND || svc.LiveSidecars != 1 {
		t.Fatalf("service load = %v, want svc inbound with 1 live sidecar", svc)
	}
	// The window's length depends on the machine; the ratios within one
	// window do not.
	if len(svc.Peers) != 2 || svc.Peers[0].Peer != "a" || svc.Peers[1].Peer != "b" {
		t.Fatalf("peers = %v, want a and b (idle omitted)", svc.Peers)
	}
	a, b := svc.Peers[0], svc.Peers[1]
	for _, chk := range []struct {
		what      string
		got, want float64
	}{
		{"a dropped/offered", a.DroppedRps / a.OfferedRps, 0.1},
		{"a shadow/offered", a.ShadowDroppedRps / a.OfferedRps, 0.05},
		{"b offered / a offered", b.OfferedRps / a.OfferedRps, 0.5},
		{"b dropped", b.DroppedRps, 0},
	} {
		if math.Abs(chk.got-chk.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", chk.what, chk.got, chk.want)
		}
	}
	if a.OfferedRps <= 0 || math.IsInf(a.OfferedRps, 0) {
		t.Errorf("a offered rate = %v", a.OfferedRps)
	}

	testkit.WaitFor(t, 20*time.Second, "the aggregator's zone", func() bool { return r.Zone() == "zone-b" })
	testkit.WaitFor(t, 20*time.Second, "connected", r.Connected)
	if v := metric(t, reg, "sluice_sidecar_report_connected"); v != 1 {
		t.Errorf("connected = %v, want 1", v)
	}
	if v := metric(t, reg, "sluice_sidecar_report_sent_total"); v < 1 {
		t.Errorf("sent_total = %v, want >= 1", v)
	}
	if v := metric(t, reg, "sluice_sidecar_report_rejected_total"); v != 0 {
		t.Errorf("rejected_total = %v, want 0; log:\n%s", v, logs.String())
	}
	if v := metric(t, reg, "sluice_sidecar_report_superseded_total"); v < 0 {
		t.Errorf("superseded_total missing")
	}
	if v := metric(t, reg, "sluice_sidecar_report_failovers_total"); v < 1 {
		t.Errorf("failovers_total = %v, want >= 1 (the first address is dead)", v)
	}
}

// lockedBuffer collects log lines from the reporter's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRejectedReportsAreCounted(t *testing.T) {
	// Every report is absurd for an aggregator that allows 1 rps.
	_, addr := startAggregator(t, aggregator.Bounds{MaxRate: 1})
	reg := prometheus.NewRegistry()
	r := startReporter(t, Config{
		SidecarID:   "pod-1",
		Service:     "svc",
		Direction:   sidecar.Outbound,
		Interval:    20 * time.Millisecond,
		Aggregators: []string{addr},
		Registerer:  reg,
	}, newFakeSource(c("a", 1000, 0, 0)))
	testkit.WaitFor(t, 20*time.Second, "a rejection", func() bool { return metric(t, reg, "sluice_sidecar_report_rejected_total") >= 1 })
	if r.Zone() != "zone-b" {
		t.Errorf("Zone = %q, want zone-b from the rejecting aggregator's answer", r.Zone())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "direction" || l[0].GetValue() != "outbound" {
				t.Errorf("%s labels = %v, want direction=outbound", mf.GetName(), l)
			}
		}
	}
}

func TestZoneDefaultsToConfig(t *testing.T) {
	r, err := New(Config{SidecarID: "p", Service: "s", Zone: "mine", Aggregators: []string{"x:1"}}, newFakeSource())
	if err != nil {
		t.Fatal(err)
	}
	if r.Zone() != "mine" {
		t.Errorf("Zone = %q before any answer, want mine", r.Zone())
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{SidecarID: "pod-1", Service: "svc", Aggregators: []string{"a:1"}}
	if _, err := New(good, newFakeSource()); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	bad := Config{
		Service:     "bad/name",
		Zone:        "-z",
		Direction:   9,
		Interval:    time.Millisecond,
		Aggregators: []string{"a:1", ""},
	}
	_, err := New(bad, nil)
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, field := range []string{"SidecarID:", "Service:", "Zone:", "Direction:", "Interval:", "Aggregators[1]:", "source:"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s\n%v", field, err)
		}
	}
	if err := (Config{SidecarID: "p", Service: "s"}).Validate(); err == nil || !strings.Contains(err.Error(), "Aggregators:") {
		t.Errorf("no aggregators: %v", err)
	}
}

func TestSeveralReportersOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, d := range []sidecar.Direction{sidecar.Inbound, sidecar.Outbound} {
		if _, err := New(Config{SidecarID: "p", Service: "s", Direction: d, Aggregators: []string{"x:1"}, Registerer: reg}, newFakeSource()); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		want := 2
		if strings.HasPrefix(mf.GetName(), "sluice_sidecar_health_fast_path_") {
			want = 1 // the inbound reporter's alone: it judges the sidecar's own app
		}
		if len(mf.GetMetric()) != want {
			t.Errorf("%s has %d series, want %d", mf.GetName(), len(mf.GetMetric()), want)
		}
	}
}

// TestBuildPerLeaf: a callee with procedures reports one entry per leaf
// (peer, procedure), sorted by peer then procedure, each leaf's window
// from its own incarnation; a procedure that is no name is _other's.
func TestBuildPerLeaf(t *testing.T) {
	prev := []sidecar.PeerCounts{
		{Peer: "web", Procedure: "create-charge", Offered: 10, Incarnation: 1},
		{Peer: "web", Procedure: "get-item", Offered: 7, Incarnation: 2},
	}
	cur := []sidecar.PeerCounts{
		{Peer: "web", Procedure: "get-item", Offered: 9, Dropped: 1, Incarnation: 2},
		{Peer: "web", Procedure: "create-charge", Offered: 4, Dropped: 3, Incarnation: 5}, // evicted, seen again
		{Peer: "web", Procedure: "_other", Offered: 1, Incarnation: 6},
		{Peer: "mobile", Procedure: "bad procedure", Offered: 2, Incarnation: 7},
		{Peer: "mobile", Procedure: "/shop.Checkout/Pay", Offered: 3, Incarnation: 8},
	}
	rep := Build(Header{SidecarID: "s-1", Service: "checkout"}, prev, cur, time.Unix(0, 0), time.Second)
	var got []string
	for _, p := range rep.GetPeers() {
		got = append(got, fmt.Sprintf("%s/%s=%d/%d", p.GetPeer(), p.GetProcedure(), p.GetOffered(), p.GetDropped()))
	}
	want := []string{"mobile//shop.Checkout/Pay=3/0", "mobile/_other=2/0", "web/_other=1/0", "web/create-charge=4/3", "web/get-item=2/1"}
	if !slices.Equal(got, want) {
		t.Errorf("report %v, want %v", got, want)
	}
}

// TestBuildPerTier: a callee with criticality reports one entry per leaf
// (peer, procedure, tier), from a real Limiter, sorted by tier last; an
// untiered entry leaves criticality unset, and a tier outside the four
// (from no Limiter) is the lowest.
func TestBuildPerTier(t *testing.T) {
	l := sidecar.NewLimiter(sidecar.LimiterOptions{OneStripe: true})
	l.SetPolicy(&sidecar.Policy{
		Name: "callee/payments", Service: "payments", Direction: sidecar.Inbound,
		Peers: []sidecar.Rule{
			{Peer: "web", Tier: criticality.Critical, LimitRPS: math.Inf(1), AllowedRPS: math.Inf(1)},
			{Peer: "web", Tier: criticality.Sheddable, DropRatio: 0.5, LimitRPS: 10, AllowedRPS: 10},
		},
		Criticality: &sidecar.CriticalityPolicy{Header: criticality.DefaultHeader, Default: criticality.Critical},
	})
	s := l.Service("payments")
	prev := l.AppendCounts("payments", nil)
	for range 4 {
		s.DecideTier("web", "SHEDDABLE")
		s.DecideTier("web", "")
	}
	s.DecideTier("web", "CRITICAL_PLUS")
	cur := append(l.AppendCounts("payments", nil), sidecar.PeerCounts{Peer: "odd", Tier: 9, Offered: 1})
	rep := Build(Header{SidecarID: "s-1", Service: "payments"}, prev, cur, time.Unix(0, 0), time.Second)
	var got []string
	for _, p := range rep.GetPeers() {
		got = append(got, fmt.Sprintf("%s/%v=%d/%d", p.GetPeer(), p.GetCriticality(), p.GetOffered(), p.GetDropped()))
	}
	want := []string{"odd/CRITICALITY_SHEDDABLE=1/0", "web/CRITICALITY_CRITICAL_PLUS=1/0", "web/CRITICALITY_CRITICAL=4/0", "web/CRITICALITY_SHEDDABLE=4/2"}
	if !slices.Equal(got, want) {
		t.Errorf("report %v, want %v", got, want)
	}

	untiered := Build(Header{SidecarID: "s-1", Service: "checkout"}, nil,
		[]sidecar.PeerCounts{{Peer: "web", Offered: 3}}, time.Unix(0, 0), time.Second)
	if p := untiered.GetPeers(); len(p) != 1 || p[0].GetCriticality() != sluicev1.Criticality_CRITICALITY_UNSPECIFIED {
		t.Errorf("untiered report %v", p)
	}
}
