package aggregator

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
)

// fakeController is a ZoneLoadService on loopback that hands over every
// ZoneLoad it reads.
type fakeController struct {
	sluicev1.UnimplementedZoneLoadServiceServer
	addr  string
	loads chan *sluicev1.ZoneLoad
	srv   *grpc.Server
	done  chan struct{}
}

func newFakeController(t *testing.T) *fakeController {
	t.Helper()
	c := &fakeController{loads: make(chan *sluicev1.ZoneLoad, 10000), srv: grpc.NewServer(), done: make(chan struct{})}
	sluicev1.RegisterZoneLoadServiceServer(c.srv, c)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = lis.Addr().String()
	go func() {
		defer close(c.done)
		_ = c.srv.Serve(lis)
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *fakeController) stop() {
	c.srv.Stop()
	<-c.done
}

func (c *fakeController) StreamZoneLoads(g grpc.BidiStreamingServer[sluicev1.StreamZoneLoadsRequest, sluicev1.StreamZoneLoadsResponse]) error {
	for {
		req, err := g.Recv()
		if err != nil {
			return nil
		}
		select {
		case c.loads <- req.GetLoad():
		default: // the test stopped looking
		}
		if err := g.Send(&sluicev1.StreamZoneLoadsResponse{Accepted: true}); err != nil {
			return nil
		}
	}
}

// await reads ZoneLoads until one has the wanted services, failing the test
// after a generous deadline. Earlier ZoneLoads may predate the reports the
// test sent, so they are skipped.
func (c *fakeController) await(t *testing.T, want ...*sluicev1.ServiceLoad) *sluicev1.ZoneLoad {
	t.Helper()
	wantZL := &sluicev1.ZoneLoad{Services: want}
	deadline := time.After(20 * time.Second)
	var last *sluicev1.ZoneLoad
	for {
		select {
		case zl := <-c.loads:
			last = zl
			got := &sluicev1.ZoneLoad{Services: zl.GetServices()}
			if proto.Equal(got, wantZL) {
				return zl
			}
		case <-deadline:
			t.Fatalf("controller got no ZoneLoad with services %v in 20s; last: %v", want, last)
			return nil
		}
	}
}

type harness struct {
	svc  *Service
	reg  *prometheus.Registry
	addr string // the aggregator's LoadReportService
}

// startService runs an aggregator with a fast flush on loopback until the
// test ends.
func startService(t *testing.T, cfg Config) *harness {
	t.Helper()
	if cfg.Zone == "" {
		cfg.Zone = "zone-a"
	}
	if cfg.ID == "" {
		cfg.ID = "agg-1"
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = 20 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	svc, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = g.Serve(lis)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(ctx) }()
	t.Cleanup(func() {
		g.Stop()
		<-served
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
	return &harness{svc: svc, reg: reg, addr: lis.Addr().String()}
}

// sidecarStream is a raw load report stream, as a sidecar would hold.
type sidecarStream struct {
	grpc.BidiStreamingClient[sluicev1.StreamLoadReportsRequest, sluicev1.StreamLoadReportsResponse]
	cancel context.CancelFunc
}

func dialSidecar(t *testing.T, addr string) *sidecarStream {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := sluicev1.NewLoadReportServiceClient(cc).StreamLoadReports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &sidecarStream{BidiStreamingClient: st, cancel: cancel}
}

// report sends r and returns the aggregator's answer.
func (s *sidecarStream) report(t *testing.T, r *sluicev1.LoadReport) *sluicev1.StreamLoadReportsResponse {
	t.Helper()
	if err := s.Send(&sluicev1.StreamLoadReportsRequest{Report: r}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return resp
}

func (s *sidecarStream) mustAccept(t *testing.T, r *sluicev1.LoadReport) {
	t.Helper()
	if resp := s.report(t, r); !resp.GetAccepted() {
		t.Fatalf("report of %s rejected: %s", r.GetSidecarId(), resp.GetRejectReason())
	}
}

// metric returns the value of the metric name with the given labels, or -1
// if there is none.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func TestServiceSumsSidecars(t *testing.T) {
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}})

	s1, s2 := dialSidecar(t, h.addr), dialSidecar(t, h.addr)
	resp := s1.report(t, report("s1", "svc", in, time.Second, pc("a", 100, 10, 0), pc("b", 20, 0, 2)))
	if !resp.Accepted || resp.Zone != "zone-a" || resp.AggregatorId != "agg-1" || resp.RejectReason != "" {
		t.Fatalf("response = %v, want accepted by agg-1 in zone-a", resp)
	}
	s2.mustAccept(t, report("s2", "svc", in, 2*time.Second, pc("a", 100, 0, 50)))

	zl := ctrl.await(t, serviceLoad("svc", in, 2, rate("a", 150, 10, 25), rate("b", 20, 0, 2)))
	if zl.Zone != "zone-a" || zl.AggregatorId != "agg-1" || zl.Interval.AsDuration() != 20*time.Millisecond {
		t.Errorf("ZoneLoad header = %q %q %v", zl.Zone, zl.AggregatorId, zl.Interval.AsDuration())
	}
	testkit.WaitFor(t, 20*time.Second, "Ready", h.svc.Ready)
	if v := metric(t, h.reg, "sluice_aggregator_controller_connected"); v != 1 {
		t.Errorf("controller_connected = %v, want 1", v)
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_total"); v != 2 {
		t.Errorf("reports_total = %v, want 2", v)
	}
	if v := metric(t, h.reg, "sluice_aggregator_sidecars"); v != 2 {
		t.Errorf("sidecars = %v, want 2", v)
	}

	// A newer report of s1 replaces its rates.
	s1.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 1, 0, 0)))
	ctrl.await(t, serviceLoad("svc", in, 2, rate("a", 51, 0, 25)))

	// The end of s1's stream removes it.
	if err := s1.CloseSend(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 20*time.Second, "s1 removed", func() bool { return h.svc.Sidecars() == 1 })
	ctrl.await(t, serviceLoad("svc", in, 1, rate("a", 50, 0, 25)))
	if v := metric(t, h.reg, "sluice_aggregator_streams"); v != 1 {
		// The gauge drops when the handler returns, which is after
		// Sidecars changed; wait rather than race it.
		testkit.WaitFor(t, 20*time.Second, "streams gauge 1", func() bool { return metric(t, h.reg, "sluice_aggregator_streams") == 1 })
	}

	// A cancelled stream (a sidecar that died) removes its sidecar too.
	s2.cancel()
	testkit.WaitFor(t, 20*time.Second, "s2 removed", func() bool { return h.svc.Sidecars() == 0 })
	ctrl.await(t)
}

func TestServiceRejects(t *testing.T) {
	h := startService(t, Config{Controllers: []string{"127.0.0.1:1"}})
	s := dialSidecar(t, h.addr)

	bad := report("s1", "svc", in, time.Hour, pc("a", 1, 0, 0))
	resp := s.report(t, bad)
	if resp.Accepted || !strings.HasPrefix(resp.RejectReason, ReasonBadWindow+": ") || resp.Zone != "zone-a" {
		t.Fatalf("response = %v, want rejected for %s", resp, ReasonBadWindow)
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonBadWindow); v != 1 {
		t.Errorf("reports_rejected_total{reason=bad_window} = %v, want 1", v)
	}
	// Every reason exists from the start, at zero.
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonAbsurdRate); v != 0 {
		t.Errorf("reports_rejected_total{reason=absurd_rate} = %v, want 0", v)
	}

	// The stream goes on after a rejection; it belongs to the first
	// sidecar accepted on it.
	s.mustAccept(t, report("s1", "svc", in, time.Second))
	resp = s.report(t, report("s2", "svc", in, time.Second))
	if resp.Accepted || !strings.HasPrefix(resp.RejectReason, ReasonSidecarIDChanged) {
		t.Fatalf("response = %v, want rejected for %s", resp, ReasonSidecarIDChanged)
	}
	if h.svc.Sidecars() != 1 {
		t.Errorf("Sidecars = %d, want 1", h.svc.Sidecars())
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonSidecarIDChanged); v != 1 {
		t.Errorf("reports_rejected_total{reason=sidecar_id_changed} = %v, want 1", v)
	}
}

// TestServiceCountsFolds: a report beyond its identity's quota is accepted
// and its folded peers counted by the bound they were beyond.
func TestServiceCountsFolds(t *testing.T) {
	h := startService(t, Config{Controllers: []string{"127.0.0.1:1"}, Bounds: Bounds{MaxPeersPerReport: 3, MaxPeersPerIdentity: 2}})
	s := dialSidecar(t, h.addr)
	s.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 1, 0, 0), pc("b", 2, 0, 0), pc("c", 3, 0, 0), pc("d", 4, 0, 0)))
	for bound, want := range map[string]float64{FoldReport: 1, FoldPeers: 1, FoldEntries: 0} {
		if v := metric(t, h.reg, "sluice_aggregator_peers_folded_total", "bound", bound); v != want {
			t.Errorf("peers_folded_total{bound=%s} = %v, want %v", bound, v, want)
		}
	}
}

// TestServiceLiveStreamKeepsItsID: a second stream can not take over the
// sidecar id of a live one (State lets it once the sidecar went stale);
// once the first stream ends, it can.
func TestServiceLiveStreamKeepsItsID(t *testing.T) {
	h := startService(t, Config{Controllers: []string{"127.0.0.1:1"}})
	old := dialSidecar(t, h.addr)
	old.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 1, 0, 0)))

	// Another stream claims s1 (in plaintext anyone can) with zeros.
	fresh := dialSidecar(t, h.addr)
	resp := fresh.report(t, report("s1", "svc", in, time.Second, pc("a", 0, 0, 0)))
	if resp.Accepted || !strings.HasPrefix(resp.RejectReason, ReasonIDInUse+": ") {
		t.Fatalf("response = %v, want rejected for %s", resp, ReasonIDInUse)
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonIDInUse); v != 1 {
		t.Errorf("reports_rejected_total{reason=id_in_use} = %v, want 1", v)
	}
	want := []*sluicev1.ServiceLoad{serviceLoad("svc", in, 1, rate("a", 1, 0, 0))}
	if got := h.svc.FlushNow(); !proto.Equal(&sluicev1.ZoneLoad{Services: got.Services}, &sluicev1.ZoneLoad{Services: want}) {
		t.Errorf("FlushNow = %v, want services %v", got, want)
	}
	// The rejected stream's end takes nothing with it.
	fresh.cancel()
	testkit.WaitFor(t, 20*time.Second, "fresh stream ended", func() bool { return metric(t, h.reg, "sluice_aggregator_streams") == 1 })
	if n := h.svc.Sidecars(); n != 1 {
		t.Fatalf("Sidecars = %d after the rejected stream ended, want 1", n)
	}

	old.cancel()
	testkit.WaitFor(t, 20*time.Second, "s1 removed", func() bool { return h.svc.Sidecars() == 0 })
	again := dialSidecar(t, h.addr)
	again.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 2, 0, 0)))
}

// Every sidecar needs one stream, so no more stay open than sidecars are
// kept: one more is refused before its first report, and counted; once a
// stream ends, a new one is taken again.
func TestServiceBoundsStreams(t *testing.T) {
	h := startService(t, Config{Controllers: []string{"127.0.0.1:1"}, Bounds: Bounds{MaxSidecars: 2}})
	s1, s2 := dialSidecar(t, h.addr), dialSidecar(t, h.addr)
	s1.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 1, 0, 0)))
	s2.mustAccept(t, report("s2", "svc", in, time.Second, pc("a", 1, 0, 0)))

	idle := dialSidecar(t, h.addr)
	if err := idle.Send(&sluicev1.StreamLoadReportsRequest{Report: report("s3", "svc", in, time.Second, pc("a", 1, 0, 0))}); err != nil && err != io.EOF {
		t.Fatalf("Send: %v", err)
	}
	if _, err := idle.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonTooManyStreams); v != 1 {
		t.Errorf("reports_rejected_total{reason=too_many_streams} = %v, want 1", v)
	}

	s2.cancel()
	testkit.WaitFor(t, 20*time.Second, "s2's stream ended", func() bool { return metric(t, h.reg, "sluice_aggregator_streams") == 1 })
	dialSidecar(t, h.addr).mustAccept(t, report("s3", "svc", in, time.Second, pc("a", 1, 0, 0)))
}

func TestServiceControllerFailover(t *testing.T) {
	c1, c2 := newFakeController(t), newFakeController(t)
	h := startService(t, Config{Controllers: []string{c1.addr, c2.addr}})
	s := dialSidecar(t, h.addr)
	s.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 5, 0, 0)))
	want := serviceLoad("svc", in, 1, rate("a", 5, 0, 0))

	c1.await(t, want)
	testkit.WaitFor(t, 20*time.Second, "Ready", h.svc.Ready)
	c1.stop()
	c2.await(t, want)
	testkit.WaitFor(t, 20*time.Second, "Ready again", h.svc.Ready)
	if v := metric(t, h.reg, "sluice_aggregator_controller_failovers_total"); v < 1 {
		t.Errorf("controller_failovers_total = %v, want >= 1", v)
	}
}

// With fan-out every replica gets every flush, and one replica's loss does
// not stop the others' flushes.
func TestServiceControllerFanout(t *testing.T) {
	c1, c2 := newFakeController(t), newFakeController(t)
	h := startService(t, Config{Controllers: []string{c1.addr, c2.addr}, ControllerFanout: true})
	s := dialSidecar(t, h.addr)
	s.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 5, 0, 0)))
	want := serviceLoad("svc", in, 1, rate("a", 5, 0, 0))
	c1.await(t, want)
	c2.await(t, want)
	testkit.WaitFor(t, 20*time.Second, "both replicas connected", func() bool {
		return metric(t, h.reg, "sluice_aggregator_controller_connected") == 2
	})
	c1.stop()
	s.mustAccept(t, report("s1", "svc", in, time.Second, pc("a", 7, 0, 0)))
	c2.await(t, serviceLoad("svc", in, 1, rate("a", 7, 0, 0)))
	if !h.svc.Ready() {
		t.Error("not ready with one replica of two reachable")
	}
}

func TestServiceSkipsDeadController(t *testing.T) {
	ctrl := newFakeController(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	h := startService(t, Config{Controllers: []string{dead, ctrl.addr}})
	ctrl.await(t) // an empty zone is still reported: the aggregator is alive
	testkit.WaitFor(t, 20*time.Second, "Ready", h.svc.Ready)
}

func TestServiceDrain(t *testing.T) {
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}})
	testkit.WaitFor(t, 20*time.Second, "Ready", h.svc.Ready)
	s := dialSidecar(t, h.addr)
	s.mustAccept(t, report("s1", "svc", in, time.Second))

	h.svc.Drain()
	if h.svc.Ready() {
		t.Error("Ready while draining")
	}
	if err := s.Send(&sluicev1.StreamLoadReportsRequest{Report: report("s1", "svc", in, time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Recv after Drain = %v, want UNAVAILABLE", err)
	}
	testkit.WaitFor(t, 20*time.Second, "s1 removed", func() bool { return h.svc.Sidecars() == 0 })
}

func TestServiceConcurrentSidecars(t *testing.T) {
	// Many streams at once, for the race detector, and a check that every
	// one is summed exactly once.
	ctrl := newFakeController(t)
	h := startService(t, Config{Controllers: []string{ctrl.addr}})
	const n = 20
	var wg sync.WaitGroup
	streams := make([]*sidecarStream, n)
	for i := range streams {
		streams[i] = dialSidecar(t, h.addr)
	}
	for i, s := range streams {
		wg.Go(func() {
			// Not t.Fatal: this is not the test's goroutine.
			for range 5 {
				r := report("s"+string(rune('a'+i)), "svc", in, time.Second, pc("p", 3, 1, 1))
				if err := s.Send(&sluicev1.StreamLoadReportsRequest{Report: r}); err != nil {
					t.Errorf("Send: %v", err)
					return
				}
				if resp, err := s.Recv(); err != nil || !resp.GetAccepted() {
					t.Errorf("Recv = %v, %v; want accepted", resp, err)
					return
				}
			}
		})
	}
	wg.Wait()
	ctrl.await(t, serviceLoad("svc", in, n, rate("p", 3*n, n, n)))
}

func TestConfigValidate(t *testing.T) {
	good := DefaultConfig()
	good.Zone = "zone-a"
	good.Controllers = []string{"c:1"}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if err := (Config{Zone: "z", Controllers: []string{"c:1"}}).Validate(); err != nil {
		t.Errorf("zero fields with defaults: %v", err)
	}
	if DefaultConfig().ID == "" {
		t.Error("DefaultConfig has no ID")
	}

	bad := Config{
		ID:            strings.Repeat("x", 300),
		Zone:          "bad zone",
		FlushInterval: time.Millisecond,
		StaleAfter:    -1,
		Controllers:   []string{""},
		Bounds:        Bounds{MaxRate: -1},
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, field := range []string{"id", "zone", "flush-interval", "stale-after", "controllers[0]", "max-rate"} {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("error does not name %s:\n%v", field, err)
		}
	}
	if err := (Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "zone: required") || !strings.Contains(err.Error(), "controllers:") {
		t.Errorf("empty config: %v", err)
	}
	if _, err := New(bad, nil, nil); err == nil {
		t.Error("New accepted a bad config")
	}
}

func TestSeveralServicesOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := Config{Zone: "z", Controllers: []string{"127.0.0.1:1"}}
	for range 2 {
		if _, err := New(cfg, nil, reg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := New(cfg, nil, nil); err != nil {
		t.Fatal(err)
	}
}
