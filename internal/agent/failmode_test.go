package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// syncBuffer is a bytes.Buffer safe for a logger on another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// gauge returns the value of the series of name whose labels include
// every pair of want ("k=v"); ok is false when there is none.
func gauge(t *testing.T, g prometheus.Gatherer, name string, want ...string) (v float64, ok bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for _, kv := range want {
				k, v, _ := strings.Cut(kv, "=")
				if labels[k] != v {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// dropPolicy is the controller's policy for checkout: web dropped at ratio,
// with a 2s TTL and fail-open decay.
func dropPolicy(ratio float64, issued time.Time) *sluicev1.DropPolicy {
	limit := 100.0
	return &sluicev1.DropPolicy{
		Name: "callee/checkout", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Ttl: durationpb.New(2 * time.Second), FailOpenDecay: durationpb.New(2 * time.Second),
		FailMode: sluicev1.FailMode_FAIL_MODE_OPEN, LiveInstances: 3, IssuedAt: timestamppb.New(issued),
		Peers: []*sluicev1.PeerPolicy{{Peer: "web", DropRatio: ratio, LimitRps: &limit, AllowedRps: &limit}},
	}
}

// TestFailModeWorker: the agent's fail-mode worker, under a fake clock,
// takes a policy from fresh to stale to expired at half and whole TTL after
// the xDS handler accepted it, decays its ratio to 0 over the decay window,
// logs each change once, and a new policy from the handler ends it.
func TestFailModeWorker(t *testing.T) {
	var logs syncBuffer
	a, err := New(validConfig(), slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- a.runFailModes(ctx) }()
		h := sidecar.Installer{Limiter: a.limiter, Service: a.cfg.Service, Direction: sidecar.Inbound}
		start := time.Now()
		if err := h.Update("callee/checkout", dropPolicy(0.8, start.Add(-time.Hour))); err != nil {
			t.Fatal(err)
		}
		// Ticks fall on multiples of 100ms from start; look in between.
		at := func(d time.Duration) sidecar.PolicyStatus {
			time.Sleep(start.Add(d).Sub(time.Now()))
			synctest.Wait()
			return a.svc.Status()
		}
		ratio := func() float64 {
			r, ok := a.svc.Ratio("web")
			if !ok {
				t.Fatal("web has no ratio")
			}
			return r
		}
		for _, c := range []struct {
			at    time.Duration
			state sidecar.PolicyState
			ratio float64
		}{
			{950 * time.Millisecond, sidecar.Fresh, 0.8},
			{1050 * time.Millisecond, sidecar.Stale, 0.8},
			{1950 * time.Millisecond, sidecar.Stale, 0.8},
			{2050 * time.Millisecond, sidecar.Expired, 0.8},        // the tick at 2s: decay 0
			{3050 * time.Millisecond, sidecar.Expired, 0.8 * 0.5},  // the tick at 3s
			{3550 * time.Millisecond, sidecar.Expired, 0.8 * 0.25}, // 3.5s
			{4050 * time.Millisecond, sidecar.Expired, 0},          // the end of the decay window
			{time.Hour, sidecar.Expired, 0},
		} {
			st := at(c.at)
			if st.State != c.state || st.FailMode != dataplane.FailOpen {
				t.Fatalf("at %v: %+v, want %v", c.at, st, c.state)
			}
			if r := ratio(); math.Abs(r-c.ratio) > 1e-6 {
				t.Fatalf("at %v: ratio %v, want %v", c.at, r, c.ratio)
			}
		}
		// The controller again: fresh at once, whatever its clock says.
		if err := h.Update("callee/checkout", dropPolicy(0.8, start.Add(-24*time.Hour))); err != nil {
			t.Fatal(err)
		}
		if st := a.svc.Status(); st.State != sidecar.Fresh || ratio() != 0.8 {
			t.Fatalf("after a new policy: %+v, ratio %v", st, ratio())
		}
		at(time.Hour + 150*time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("runFailModes: %v", err)
		}
	})
	out := logs.String()
	for _, want := range []string{"policy stale", "policy expired", "policy refreshed"} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", want, n, out)
		}
	}
}

// testController runs a controller on addr (127.0.0.1:0 for any port) with
// a 2s policy TTL and fail-open decay, a 100ms tick and no warm-up, and
// limits web → checkout to 100 rps. stop stops it and waits.
func testController(t *testing.T, addr string) (string, func()) {
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.Tick = 100 * time.Millisecond
	cfg.PolicyTTL = 2 * time.Second
	cfg.FailOpenDecay = 2 * time.Second
	cfg.Warmup = 0
	set := limits.NewSet(map[string]*limits.Service{"checkout": {
		Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
		Callers: map[string]limits.Bucket{"web": {Limit: 100, Mode: dropratio.Enforce}},
	}})
	svc, err := controller.New(cfg, limits.Static{Set: set}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// A restarted controller takes its predecessor's port, which the
	// kernel may hold for a moment.
	var ln net.Listener
	for deadline := time.Now().Add(10 * time.Second); ; {
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	var eg errgroup.Group
	eg.Go(func() error { return g.Serve(ln) })
	eg.Go(func() error { return svc.Run(ctx) })

	// An aggregator's zone load: web offers 1000 rps against its 100, so
	// the controller drops it at 0.9. Its interval is long so that it
	// stays in the sums for the test.
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := sluicev1.NewZoneLoadServiceClient(conn).StreamZoneLoads(ctx)
	if err == nil {
		err = stream.Send(&sluicev1.StreamZoneLoadsRequest{Load: &sluicev1.ZoneLoad{
			AggregatorId: "agg-a", Zone: "zone-a", Interval: durationpb.New(time.Minute),
			Services: []*sluicev1.ServiceLoad{{
				Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 1,
				Peers: []*sluicev1.PeerRate{{Peer: "web", OfferedRps: 1000}},
			}},
		}})
	}
	if err == nil {
		var resp *sluicev1.StreamZoneLoadsResponse
		if resp, err = stream.Recv(); err == nil && !resp.GetAccepted() {
			err = errors.New(resp.GetRejectReason())
		}
	}
	if err != nil {
		t.Fatalf("send a zone load: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			svc.Drain()
			g.Stop()
			cancel()
			conn.Close()
			if err := eg.Wait(); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("controller: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// TestFailOpenOverGRPC: a sidecar holding a policy from a real controller
// over xDS on loopback stays fresh while the controller runs (it re-issues
// the policy every half TTL), expires a TTL after the controller stops,
// decays the ratio to 0 over the decay window while counting the requests
// it admits that the policy would have dropped, and is fresh again as soon
// as a controller is back.
func TestFailOpenOverGRPC(t *testing.T) {
	const (
		ttl   = 2 * time.Second
		decay = 2 * time.Second
		p0    = 0.9 // 1 - 100/1000
	)
	addr, stopController := testController(t, "127.0.0.1:0")

	cfg := validConfig()
	cfg.Controllers = []string{addr}
	cfg.Aggregators = []string{"127.0.0.1:1"} // nobody: reports are not part of this test
	reg := prometheus.NewRegistry()
	a, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var workers errgroup.Group
	for _, w := range a.Workers() {
		workers.Go(func() error { return w(ctx) })
	}
	defer func() {
		cancel()
		if err := workers.Wait(); err != nil {
			t.Errorf("workers: %v", err)
		}
	}()
	s := a.svc

	// waitFor polls cond every 10ms until it holds, or fails after limit.
	waitFor := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				r, ok := s.Ratio("web")
				t.Fatalf("%s: not within %v; status %+v, ratio %v (%v)", what, limit, s.Status(), r, ok)
			}
		}
	}
	ratio := func() float64 { r, _ := s.Ratio("web"); return r }
	waitFor("the controller's ratio at the sidecar", 10*time.Second, func() bool {
		return math.Abs(ratio()-p0) < 1e-9 && s.Status().State == sidecar.Fresh
	})

	// For longer than a TTL, the re-issued policy keeps the sidecar from
	// expiring, though nothing in it but issued_at changes.
	first := s.Status().Received
	var maxAge time.Duration
	for end := time.Now().Add(ttl + ttl/4); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		st := s.Status()
		if st.State == sidecar.Expired {
			t.Fatalf("the policy expired while the controller ran: %+v", st)
		}
		maxAge = max(maxAge, st.Age)
	}
	t.Logf("while the controller ran, the policy's age reached %v (TTL %v)", maxAge, ttl)
	if last := s.Status().Received; !last.After(first.Add(ttl / 2)) {
		t.Fatalf("no refresh in %v: received at %v, then %v", ttl+ttl/4, first, last)
	}

	stopController()
	stopped := time.Now()
	waitFor("expiry", ttl+2*time.Second, func() bool { return s.Status().State == sidecar.Expired })
	if st := s.Status(); st.Age < ttl || st.Received.After(stopped) {
		t.Fatalf("expired at %+v: before its TTL, or received after the controller stopped", st)
	}
	if v, _ := gauge(t, reg, "sluice_sidecar_policy_state", "state=expired"); v != 1 {
		t.Errorf("policy_state{expired} = %v, want 1", v)
	}

	// The decay: the ratio only falls, passes through the middle, and
	// reaches 0 by the end of the window; meanwhile requests from web are
	// dropped less and less, and the ones admitted that the policy would
	// have dropped are counted.
	prev, middle, offered, dropped := p0, false, 0, 0
	waitFor("the end of the decay", decay+2*time.Second, func() bool {
		r := ratio()
		if r > prev+1e-12 {
			t.Fatalf("the ratio rose from %v to %v during the decay", prev, r)
		}
		prev, middle = r, middle || (r > 0.2 && r < 0.7)
		for range 100 {
			offered++
			if s.Decide("web").Drop {
				dropped++
			}
		}
		return r == 0 && s.Status().Decay == 1
	})
	if !middle {
		t.Error("never saw a ratio in the middle of the decay")
	}
	if dropped == 0 || float64(dropped) > 0.8*float64(offered) {
		t.Errorf("during the decay %d of %d dropped", dropped, offered)
	}
	decayOpen, _ := gauge(t, reg, "sluice_sidecar_fail_open_total", "service=checkout")
	for range 1000 {
		if s.Decide("web").Drop {
			t.Fatal("a drop after the decay window")
		}
	}
	// p0 of the 1000 were the policy's drops: each is a fail-open decision.
	if v, _ := gauge(t, reg, "sluice_sidecar_fail_open_total", "service=checkout"); math.Abs(v-decayOpen-p0*1000) > 1 || decayOpen == 0 {
		t.Errorf("fail_open_total went from %v to %v over 1000 requests, want +%v", decayOpen, v, p0*1000)
	}
	if r, _ := gauge(t, reg, "sluice_sidecar_drop_ratio", "peer=web"); r != 0 {
		t.Errorf("drop_ratio{web} = %v after the decay, want 0", r)
	}

	// A controller back at the same address: its first policy ends the
	// fail mode. (The xDS client backs off up to 5s between attempts.)
	testController(t, addr)
	waitFor("a fresh policy from the restarted controller", 15*time.Second, func() bool {
		return s.Status().State == sidecar.Fresh && math.Abs(ratio()-p0) < 1e-9
	})
	if v, _ := gauge(t, reg, "sluice_sidecar_policy_state", "state=fresh"); v != 1 {
		t.Errorf("policy_state{fresh} = %v after the restart, want 1", v)
	}
}
