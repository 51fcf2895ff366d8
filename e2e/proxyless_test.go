package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	runtime "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/internal/xdsserver"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar"
)

// What the proxyless test asks of the abort share. Calls are aborted at
// random (gRPC-Go's fault filter draws per call), so the share over n calls
// has a standard deviation of sqrt(p(1-p)/n): 0.0023 at p = 0.3 and
// n = 40,000, 0.0019 at p = 0.1 and n = 25,000. The ±0.01 band is over four
// of them wide either way, so the test does not flake by chance.
const (
	proxylessTolerance = 0.01
	callsAtFirstRatio  = 40000
	callsAtSecondRatio = 25000
	callsTimeout       = 3 * time.Minute // bounds each phase on a loaded machine
	callerHeader       = "x-test-caller"
	webWorkers         = 3 // goroutines calling per web client
)

// mutableLimits is a limits.Source the test changes between ticks.
type mutableLimits struct{ p atomic.Pointer[limits.Set] }

func (m *mutableLimits) Limits() *limits.Set { return m.p.Load() }

func (m *mutableLimits) set(webLimit float64) {
	m.p.Store(limits.NewSet(map[string]*limits.Service{
		"checkout": {
			Name: "checkout", Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{
				"web":    {Limit: webLimit, Mode: dropratio.Enforce},
				"mobile": {Limit: 1000, Mode: dropratio.Enforce},
			},
		},
	}))
}

// call is one RPC a client made: when it started, whether it was aborted.
type call struct {
	start   time.Time
	aborted bool
}

// proxylessClient is an unmodified gRPC-Go client that resolves
// xds:///checkout through the controller, as caller node cluster.
type proxylessClient struct {
	caller string
	cc     *grpc.ClientConn

	mu    sync.Mutex // protects calls
	calls []call
}

func newProxylessClient(t *testing.T, xdsAddr, caller, id string) *proxylessClient {
	t.Helper()
	// gRPC-Go v1.85.0 takes a per-client bootstrap through this resolver
	// builder (marked experimental and for testing); a process that runs
	// one caller would set GRPC_XDS_BOOTSTRAP_CONFIG or GRPC_XDS_BOOTSTRAP
	// instead. Two callers in one process need one each.
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": %q, "cluster": %q, "locality": {"zone": "zone-a"}}
	}`, xdsAddr, id, caller)
	rb, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///checkout", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return &proxylessClient{caller: caller, cc: cc}
}

// run calls Check with `workers` goroutines until ctx ends, recording
// every call. An error other than the abort fails the test.
func (c *proxylessClient) run(ctx context.Context, t *testing.T, workers int, wg *sync.WaitGroup) {
	hc := healthpb.NewHealthClient(c.cc)
	for range workers {
		wg.Go(func() {
			var local []call
			defer func() {
				c.mu.Lock()
				c.calls = append(c.calls, local...)
				c.mu.Unlock()
			}()
			md := metadata.Pairs(callerHeader, c.caller)
			for ctx.Err() == nil {
				start := time.Now()
				cctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), 10*time.Second)
				_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
				cancel()
				if err != nil && ctx.Err() != nil {
					return // cut short by the end of the run
				}
				switch status.Code(err) {
				case codes.OK:
					local = append(local, call{start: start})
				case codes.ResourceExhausted:
					local = append(local, call{start: start, aborted: true})
				default:
					t.Errorf("%s: call failed with something other than the abort: %v", c.caller, err)
					return
				}
				if len(local) >= 256 {
					c.mu.Lock()
					c.calls = append(c.calls, local...)
					c.mu.Unlock()
					local = local[:0]
				}
			}
		})
	}
}

func (c *proxylessClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// take returns the recorded calls, sorted by start, and forgets them.
func (c *proxylessClient) take() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	slices.SortFunc(out, func(a, b call) int { return a.start.Compare(b.start) })
	return out
}

func abortShare(calls []call) float64 {
	n := 0
	for _, c := range calls {
		if c.aborted {
			n++
		}
	}
	return float64(n) / float64(len(calls))
}

// countingServer is the callee: a real gRPC server (the standard health
// service) that counts the calls reaching it per caller, to show that
// aborted calls are never sent.
type countingServer struct {
	mu       sync.Mutex
	received map[string]int
}

func (s *countingServer) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	caller := "none"
	if v := md.Get(callerHeader); len(v) > 0 {
		caller = v[0]
	}
	s.mu.Lock()
	s.received[caller]++
	s.mu.Unlock()
	return h(ctx, req)
}

func (s *countingServer) get(caller string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received[caller]
}

func serveGRPC(t *testing.T, g *grpc.Server) string {
	t.Helper()
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
	return lis.Addr().String()
}

// fakeAggregator streams one zone's load to the controller every 200ms,
// as an aggregator would, until ctx ends: web offers 1,000 rps to
// checkout, mobile 500.
func fakeAggregator(ctx context.Context, t *testing.T, addr string, wg *sync.WaitGroup) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	st, err := sluicev1.NewZoneLoadServiceClient(cc).StreamZoneLoads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	load := &sluicev1.ZoneLoad{
		AggregatorId: "agg-a", Zone: "zone-a", Interval: durationpb.New(time.Second),
		Services: []*sluicev1.ServiceLoad{{
			Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: 1,
			Peers: []*sluicev1.PeerRate{{Peer: "mobile", OfferedRps: 500}, {Peer: "web", OfferedRps: 1000}},
		}},
	}
	wg.Go(func() {
		defer cc.Close()
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		for {
			if err := st.Send(&sluicev1.StreamZoneLoadsRequest{Load: load}); err != nil {
				return
			}
			if r, err := st.Recv(); err != nil {
				return
			} else if !r.GetAccepted() {
				t.Errorf("zone load refused: %s", r.GetRejectReason())
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	})
}

// publishedRatio is the ratio the controller last published for
// (checkout, caller), or -1.
func publishedRatio(svc *controller.Service, caller string) float64 {
	for _, p := range svc.Policies() {
		if p.GetName() == "callee/checkout" {
			return peerRatio(p, caller)
		}
	}
	return -1
}

// TestProxylessGRPCFollowsTheController runs real gRPC-Go xDS clients
// (google.golang.org/grpc/xds, dialling xds:///checkout) against a real gRPC
// server, with the controller as their only xDS server.
//
// The ratios are driven through the real controller: its limits (web 700
// rps, then 900; mobile 1,000) and zone loads sent over the real
// ZoneLoadService stream as an aggregator would (web offers 1,000 rps,
// mobile 500), so the control law produces exactly 0.3 (1 − 700/1000), then
// 0.1, and mobile 0. The load is synthetic: that the callee side counts a
// proxyless caller's traffic is not what this test checks.
//
// An RTDS subscriber (a plain SotW ADS stream, as an Envoy in front of
// checkout would open) watches the runtime layer of the same ratios.
func TestProxylessGRPCFollowsTheController(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: tens of thousands of calls")
	}
	// The callee.
	callee := &countingServer{received: map[string]int{}}
	cg := grpc.NewServer(grpc.UnaryInterceptor(callee.intercept))
	healthpb.RegisterHealthServer(cg, health.NewServer())
	calleeAddr := serveGRPC(t, cg)

	// The controller, at the default tick of 1s.
	lim := &mutableLimits{}
	lim.set(700)
	cfg := controller.DefaultConfig()
	cfg.Warmup = 0
	cfg.Proxyless = xdsserver.Endpoints{"checkout": {calleeAddr}}
	logs := &testLog{w: t.Output()}
	t.Cleanup(logs.close)
	svc, err := controller.New(cfg, lim, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})), nil)
	if err != nil {
		t.Fatal(err)
	}
	xg := grpc.NewServer()
	svc.Register(xg)
	ctrlAddr := serveGRPC(t, xg)
	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		bg.Wait()
	})
	bg.Go(func() { _ = svc.Run(ctx) })
	fakeAggregator(ctx, t, ctrlAddr, &bg)
	testkit.WaitFor(t, 15*time.Second, "the controller publishes web at 0.3", func() bool {
		return xdsserver.PPM(publishedRatio(svc, "web")) == 300000
	})
	rtds := subscribeRuntime(ctx, t, ctrlAddr)

	// Two web clients (two nodes of caller web) and one mobile client.
	web := []*proxylessClient{
		newProxylessClient(t, ctrlAddr, "web", "web-1"),
		newProxylessClient(t, ctrlAddr, "web", "web-2"),
	}
	mobile := newProxylessClient(t, ctrlAddr, "mobile", "mobile-1")
	runCtx, stop := context.WithCancel(ctx)
	var calls sync.WaitGroup
	for _, c := range web {
		c.run(runCtx, t, webWorkers, &calls)
	}
	mobile.run(runCtx, t, 2, &calls)
	t.Cleanup(func() { // before the controller stops, on any way out
		stop()
		calls.Wait()
	})
	webCalls := func() int { return web[0].count() + web[1].count() }
	testkit.WaitFor(t, callsTimeout, fmt.Sprintf("%d web calls at 0.3", callsAtFirstRatio), func() bool {
		return webCalls() >= callsAtFirstRatio || t.Failed()
	})

	// The ratio changes: web's limit goes to 900, the law to 0.1.
	changed := time.Now()
	lim.set(900)
	var published time.Time
	testkit.WaitFor(t, 5*time.Second, "the controller publishes web at 0.1", func() bool {
		published = time.Now() // polled every 20ms: at most that late
		return xdsserver.PPM(publishedRatio(svc, "web")) == 100000
	})
	settled := published.Add(cfg.Tick)
	time.Sleep(time.Until(settled))
	// Workers hand their calls over 256 at a time, so the count lags by
	// up to that much per worker.
	target := webCalls() + callsAtSecondRatio + 2*webWorkers*256
	testkit.WaitFor(t, callsTimeout, fmt.Sprintf("%d web calls at 0.1", callsAtSecondRatio), func() bool {
		return webCalls() >= target || t.Failed()
	})
	stop()
	calls.Wait()
	if t.Failed() {
		return
	}

	all := slices.Concat(web[0].take(), web[1].take())
	slices.SortFunc(all, func(a, b call) int { return a.start.Compare(b.start) })
	before, after := split(all, changed), split(all, settled)
	first, second := all[:before], all[after:]
	p1, p2 := abortShare(first), abortShare(second)
	t.Logf("web at 0.3: %d calls, abort share %.4f", len(first), p1)
	t.Logf("web at 0.1: %d calls from one tick after publication, abort share %.4f", len(second), p2)
	if len(first) < 20000 || math.Abs(p1-0.3) > proxylessTolerance {
		t.Errorf("web at 0.3: abort share %.4f over %d calls, want 0.3 ± %v over ≥ 20,000", p1, len(first), proxylessTolerance)
	}
	if len(second) < 20000 || math.Abs(p2-0.1) > proxylessTolerance {
		t.Errorf("web at 0.1: abort share %.4f over %d calls, want 0.1 ± %v over ≥ 20,000", p2, len(second), proxylessTolerance)
	}

	// How fast the clients followed: the first window of 250 calls from
	// which on every window is nearer 0.1 than 0.3. At 0.3 a window of 250
	// has a standard deviation of 0.029, so it falls below the midpoint
	// 0.2 by chance once in 3,000 windows, and every later one would have
	// to as well.
	const window = 250
	follow := -1
	for i := len(all) - window; i >= before; i -= window {
		if abortShare(all[i:i+window]) >= 0.2 {
			break
		}
		follow = i
	}
	if follow < 0 {
		t.Fatal("the clients never settled at 0.1")
	}
	// The switch happened within the first such window: its end bounds
	// the time to follow from above.
	followFrom, followAt := all[follow].start, all[follow+window-1].start
	t.Logf("ratio change: the limit changed %v before the next tick published 0.1; the clients were at 0.1 between %v and %v after publication (%v after the limit changed; windows of %d calls)",
		published.Sub(changed).Round(time.Millisecond), followFrom.Sub(published).Round(time.Millisecond),
		followAt.Sub(published).Round(time.Millisecond), followAt.Sub(changed).Round(time.Millisecond), window)
	if d := followAt.Sub(published); d > cfg.Tick {
		t.Errorf("clients followed %v after the controller published, want within one tick (%v)", d, cfg.Tick)
	}
	if d := followAt.Sub(changed); d > 2*cfg.Tick {
		t.Errorf("clients followed %v after the limit changed, want within two ticks (the one that sees it, then the push): %v", d, 2*cfg.Tick)
	}

	// Mobile, ratio 0, is never aborted.
	mc := mobile.take()
	t.Logf("mobile at 0: %d calls, abort share %.4f", len(mc), abortShare(mc))
	if len(mc) < 1000 || abortShare(mc) != 0 {
		t.Errorf("mobile: abort share %.4f over %d calls, want 0 over ≥ 1,000", abortShare(mc), len(mc))
	}

	// Aborted calls never reach the callee: it received the calls that
	// succeeded, plus at most one per worker cut short by the end of the
	// run (received, then cancelled).
	ok := 0
	for _, c := range all {
		if !c.aborted {
			ok++
		}
	}
	if got := callee.get("web"); got < ok || got > ok+2*webWorkers {
		t.Errorf("callee received %d web calls, clients saw %d succeed and %d aborted", got, ok, len(all)-ok)
	}

	// The RTDS layer followed the same ratios.
	for _, want := range []float64{300000, 100000} {
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("RTDS layer with web at %v ppm", want), func() bool {
			return rtds.has(want)
		})
	}
	if got := rtds.last(xdsserver.AbortPercentKey("mobile")); got != 0 {
		t.Errorf("RTDS: mobile abort_percent numerator %v, want 0", got)
	}
	if got := rtds.lastStatus("web"); got != xdsserver.AbortHTTPStatus {
		t.Errorf("RTDS: web http_status %v, want %d", got, xdsserver.AbortHTTPStatus)
	}
}

// split is the index of the first call that started after t.
func split(calls []call, t time.Time) int {
	i, _ := slices.BinarySearchFunc(calls, t, func(c call, t time.Time) int {
		if c.start.After(t) {
			return 1
		}
		return -1
	})
	return i
}

// runtimeWatch records every version of the checkout runtime layer an RTDS
// subscriber received.
type runtimeWatch struct {
	mu     sync.Mutex
	layers []*runtime.Runtime
}

// subscribeRuntime opens a SotW ADS stream as the Envoy in front of
// checkout would (node cluster "checkout", RTDS resource "sluice/checkout"),
// and ACKs every response, until ctx ends.
func subscribeRuntime(ctx context.Context, t *testing.T, addr string) *runtimeWatch {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	sctx, cancel := context.WithCancel(ctx)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{xdsserver.RuntimeLayerName("checkout")}
	req := &discovery.DiscoveryRequest{
		Node:    &core.Node{Id: "checkout-envoy-1", Cluster: "checkout"},
		TypeUrl: xdsserver.RuntimeTypeURL, ResourceNames: names,
	}
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	w := &runtimeWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			for _, a := range r.GetResources() {
				l := new(runtime.Runtime)
				if err := a.UnmarshalTo(l); err != nil {
					t.Errorf("RTDS resource: %v", err)
					return
				}
				w.mu.Lock()
				w.layers = append(w.layers, l)
				w.mu.Unlock()
			}
			ack := &discovery.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResourceNames: names,
				VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}
			if err := st.Send(ack); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

func (w *runtimeWatch) numerator(l *runtime.Runtime, key string) float64 {
	v, ok := l.GetLayer().AsMap()[key].(map[string]any)
	if !ok || v["denominator"] != "MILLION" {
		return -1
	}
	n, _ := v["numerator"].(float64)
	return n
}

// has reports whether some layer received had web's abort at ppm.
func (w *runtimeWatch) has(ppm float64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.layers {
		if w.numerator(l, xdsserver.AbortPercentKey("web")) == ppm {
			return true
		}
	}
	return false
}

func (w *runtimeWatch) last(key string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.layers) == 0 {
		return -1
	}
	return w.numerator(w.layers[len(w.layers)-1], key)
}

func (w *runtimeWatch) lastStatus(caller string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.layers) == 0 {
		return -1
	}
	v, _ := w.layers[len(w.layers)-1].GetLayer().AsMap()[xdsserver.AbortHTTPStatusKey(caller)].(float64)
	return v
}

// upstreamCall is one call of a paced proxyless client.
type upstreamCall struct {
	start   time.Time
	aborted bool // by the client's fault filter
	// dropped by the callee's sluice interceptor: a second drop, which
	// must not happen to a caller enforced upstream.
	calleeDropped bool
}

// pacedClient calls Check at a fixed rate through a proxyless client,
// whatever the outcomes: an open loop, so that the offered rate is the
// test's and not the callee's (an aborted call returns at once, so a client
// that calls again on return would offer more the more it is aborted).
type pacedClient struct {
	*proxylessClient
	mu    sync.Mutex // guards calls and missed
	calls []upstreamCall
	// missed holds the turns the pacer let pass: each is when the call
	// was due.
	missed []time.Time
}

// pacerSlack is how late the pacer may send a call and still send it. A
// turn missed by more is let pass, not made up: on a busy machine the
// pacer's timer fires late, and a pacer that sent what it owes at once
// would turn a 90 ms stall into a burst of 27 calls, a surge the loop
// answers, rightly, by dropping more. Passing turns instead bounds a
// burst to rate·pacerSlack calls and shows the stall as what it is, a
// second that offered less, which the one off-schedule rule judges
// (loadgen.OffRate).
const pacerSlack = 10 * time.Millisecond

// run starts the pacer; every call it makes is owned by wg too. At most
// 256 calls are in flight: past that the pacer waits, and lets the turns
// it missed meanwhile pass.
func (c *pacedClient) run(ctx context.Context, t *testing.T, rate float64, wg *sync.WaitGroup) {
	hc := healthpb.NewHealthClient(c.cc)
	md := metadata.Pairs(callerHeader, c.caller)
	inFlight := make(chan struct{}, 256)
	wg.Go(func() {
		start := time.Now()
		due := func(i int) time.Time { return start.Add(time.Duration(float64(i) / rate * float64(time.Second))) }
		timer := time.NewTimer(0)
		defer timer.Stop()
		for i := 0; ; i++ {
			timer.Reset(time.Until(due(i)))
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			select {
			case <-ctx.Done():
				return
			case inFlight <- struct{}{}:
			}
			if now := time.Now(); now.Sub(due(i)) > pacerSlack {
				<-inFlight
				c.mu.Lock()
				for ; now.Sub(due(i)) > pacerSlack; i++ {
					c.missed = append(c.missed, due(i))
				}
				c.mu.Unlock()
				i-- // the loop's i++ comes to the first turn still on time
				continue
			}
			wg.Go(func() {
				defer func() { <-inFlight }()
				s := time.Now()
				cctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, md), 10*time.Second)
				_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
				cancel()
				if err != nil && ctx.Err() != nil {
					return // cut short by the end of the run
				}
				call := upstreamCall{start: s}
				switch status.Code(err) {
				case codes.OK:
				case codes.ResourceExhausted:
					// sluice's own rejection says so (sidecar.renderGRPC);
					// the fault filter's does not.
					if strings.Contains(status.Convert(err).Message(), "rate limited by sluice") {
						call.calleeDropped = true
					} else {
						call.aborted = true
					}
				default:
					t.Errorf("%s: call failed with something other than a drop: %v", c.caller, err)
					return
				}
				c.mu.Lock()
				c.calls = append(c.calls, call)
				c.mu.Unlock()
			})
		}
	})
}

// between returns the calls that started in [from, to): how many, aborted
// by the client, dropped by the callee.
func (c *pacedClient) between(from, to time.Time) (n, aborted, calleeDropped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, call := range c.calls {
		if call.start.Before(from) || !call.start.Before(to) {
			continue
		}
		n++
		if call.aborted {
			aborted++
		}
		if call.calleeDropped {
			calleeDropped++
		}
	}
	return n, aborted, calleeDropped
}

// offSchedule returns the whole seconds of [from, to) in which the pacer
// sent a rate off the one it was asked for, by loadgen.OffRate: the
// seconds in which it let turns pass, measured by when those turns were
// due.
func (c *pacedClient) offSchedule(from, to time.Time, rate float64) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var late []int
	for sec := 0; from.Add(time.Duration(sec+1)*time.Second).Compare(to) <= 0; sec++ {
		a, b := from.Add(time.Duration(sec)*time.Second), from.Add(time.Duration(sec+1)*time.Second)
		missed := 0
		for _, m := range c.missed {
			if !m.Before(a) && m.Before(b) {
				missed++
			}
		}
		if loadgen.OffRate(rate-float64(missed), rate) {
			late = append(late, sec)
		}
	}
	return late
}

// ratioSamples polls the controller's published ratio of (checkout, web)
// every 100ms until ctx ends.
type ratioSamples struct {
	mu sync.Mutex // guards at and ratio
	at []time.Time
	r  []float64
}

func (s *ratioSamples) run(ctx context.Context, c *testbed.Cluster, wg *sync.WaitGroup) {
	wg.Go(func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			if svc := c.Controller(); svc != nil {
				if r := publishedRatio(svc, "web"); r >= 0 && !math.IsNaN(r) {
					s.mu.Lock()
					s.at, s.r = append(s.at, time.Now()), append(s.r, r)
					s.mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	})
}

// last is the latest sample, -1 before the first.
func (s *ratioSamples) last() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.r) == 0 {
		return -1
	}
	return s.r[len(s.r)-1]
}

// since returns the samples taken from t on.
func (s *ratioSamples) since(t time.Time) []float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []float64
	for i, at := range s.at {
		if !at.Before(t) {
			out = append(out, s.r[i])
		}
	}
	return out
}

// leafMetric is the value of a sidecar counter of checkout's (peer,
// procedure) leaf, by outcome ("" for none); NaN when absent.
func leafMetric(t *testing.T, g prometheus.Gatherer, name, peer, procedure, outcome string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"service": "checkout", "peer": peer, "procedure": procedure, "outcome": outcome}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return math.NaN()
}

// limiterMetric is the value of a sidecar metric of the checkout service
// and peer, by its outcome label ("" for none): its whole bucket.
func limiterMetric(t *testing.T, g prometheus.Gatherer, name, peer, outcome string) float64 {
	t.Helper()
	return leafMetric(t, g, name, peer, "", outcome)
}

// TestProxylessCallerCountedAtTheCallee runs the whole loop for a proxyless
// caller, with no synthetic load: a real gRPC-Go xDS client (caller web)
// calls xds:///checkout at a fixed 300 rps; the callee is a real gRPC
// server behind sluice's inbound interceptors (internal/testbed's
// GRPCCallee), whose reporter reports to a real aggregator, which flushes to
// the real controller, which serves the client its route. The limits
// declare the bucket enforced upstream, limit 210 rps.
//
// The client aborts a share p of its calls before they are sent, so the
// callee sees 300·(1−p). It must report 300 (each arrival weighs 1/(1−p)),
// so that the law settles at p = 1 − 210/300 = 0.3 instead of swinging
// 0.3, 0, 0.3, … as it does on post-drop counts; and it must not drop the
// survivors again. Checked over a 15 s window once the ratio is up:
//   - the rate the callee's app receives is 210 rps ± 5 %;
//   - the offered rate the callee reports is the clients' ± 5 %;
//   - no published ratio falls below 0.1 (the post-drop failure is 0 every
//     other tick), and their mean is 1 − 210/offered ± 0.05 (0.3 at 300);
//   - the callee dropped nothing: no call failed with sluice's own
//     rejection, its drop counter is 0, and every arrival it counted as
//     enforced upstream reached the app.
//
// The tolerances are wide for a loaded 2-core machine: the aborts are
// random, so the reported rate over 15 s has a standard deviation of about
// 1 %, and one second's of about 4 %, which moves one tick's ratio by
// about 0.03.
func TestProxylessCallerCountedAtTheCallee(t *testing.T) {
	retryBusy(testProxylessCallerCountedAtTheCallee)(t)
}

func testProxylessCallerCountedAtTheCallee(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: a whole loop for half a minute")
	}
	const (
		offeredRPS = 300.0
		limitRPS   = 210.0
		rateTol    = 0.05
		window     = 15 * time.Second
	)
	c, callee, reg := startProxylessCallee(t, `
services:
  checkout:
    callers:
      web: {limit: 210, enforcement: upstream} # a proxyless gRPC client
`, sidecar.GRPCOptions{CallerHeader: callerHeader})
	tick := controller.DefaultConfig().Tick // startProxylessCallee's controller's

	// The callee holds its policy before the first call, so that every
	// call of web is counted as enforced upstream.
	testkit.WaitFor(t, 15*time.Second, "the callee holds web as enforced upstream", func() bool {
		p := callee.Limiter.Policy("checkout")
		return p != nil && p.Rule("web") != nil && p.Rule("web").Enforcement == dataplane.EnforceUpstream
	})
	web := &pacedClient{proxylessClient: newProxylessClient(t, c.ControllerAddr, "web", "web-1")}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { // before the cluster closes, on any way out
		stop()
		wg.Wait()
	})
	ratios := &ratioSamples{}
	ratios.run(ctx, c, &wg)
	begin := time.Now()
	web.run(ctx, t, offeredRPS, &wg)

	testkit.WaitFor(t, 30*time.Second, "the controller publishes web at ≥ 0.25", func() bool {
		return ratios.last() >= 0.25 || t.Failed()
	})
	up := time.Now()
	t.Logf("web's ratio reached %.3f %v after the load started", ratios.last(), up.Sub(begin).Round(time.Millisecond))
	// Three ticks to settle, then the window.
	time.Sleep(3 * tick)
	counts := func() (sidecar.PeerCounts, int) {
		for _, pc := range callee.Limiter.AppendCounts("checkout", nil) {
			if pc.Peer == "web" {
				return pc, callee.Received("web")
			}
		}
		return sidecar.PeerCounts{}, callee.Received("web")
	}
	// A window is judged only if the load went out on schedule through it
	// and the settle time before it: a pacer that let turns pass offered
	// less in those seconds, and the loop's answer to a falling rate is
	// not what is measured here. Another window is taken, at most three
	// in all.
	const (
		settle  = 5 * time.Second
		windows = 3
	)
	var (
		from, to     time.Time
		c1, c2       sidecar.PeerCounts
		recv1, recv2 int
	)
	for attempt := 1; ; attempt++ {
		from = time.Now()
		c1, recv1 = counts()
		time.Sleep(window)
		to = time.Now()
		c2, recv2 = counts()
		off := web.offSchedule(from.Add(-settle), to, offeredRPS)
		if len(off) == 0 {
			t.Logf("window %d: the pacer kept its schedule", attempt)
			break
		}
		t.Logf("window %d: the pacer let turns pass in %d of its seconds (settle time included): the machine's doing; measuring again",
			attempt, len(off))
		if attempt == windows {
			tooBusy(t, fmt.Sprintf("in %d windows of %v the load never went out on schedule: the machine is too busy to judge the loop", windows, window))
		}
	}
	secs := to.Sub(from).Seconds()
	n, aborted, _ := web.between(from, to)
	clientOffered := float64(n) / secs
	admitted := float64(recv2-recv1) / secs
	reported := float64(c2.Offered-c1.Offered) / secs
	samples := ratios.since(from)
	mean, lo, hi := 0.0, math.Inf(1), math.Inf(-1)
	for _, r := range samples {
		mean += r / float64(len(samples))
		lo, hi = min(lo, r), max(hi, r)
	}
	t.Logf("window of %.1fs: clients offered %.1f rps, %.4f aborted; callee received %.1f rps (limit %v), reported %.1f rps offered; published ratio mean %.3f, min %.3f, max %.3f over %d samples",
		secs, clientOffered, float64(aborted)/float64(n), admitted, limitRPS, reported, mean, lo, hi, len(samples))
	if clientOffered < 1.2*limitRPS {
		t.Fatalf("the clients offered only %.1f rps, too little over the limit %v to test anything (machine too busy?)", clientOffered, limitRPS)
	}
	if math.Abs(admitted-limitRPS) > rateTol*limitRPS {
		t.Errorf("callee received %.1f rps, want the limit %v ± %.0f %%", admitted, limitRPS, 100*rateTol)
	}
	if math.Abs(reported-clientOffered) > rateTol*clientOffered {
		t.Errorf("callee reported %.1f rps offered, the clients offered %.1f: want within %.0f %%", reported, clientOffered, 100*rateTol)
	}
	// The law's ratio for what the clients offered: 0.3 at 300 rps, a
	// little less when the pacer let some turns pass.
	wantRatio := 1 - limitRPS/clientOffered
	if len(samples) < 10 || lo < 0.1 || math.Abs(mean-wantRatio) > 0.05 {
		t.Errorf("published ratios over the window: mean %.3f, min %.3f over %d samples; want mean %.2f ± 0.05 and none below 0.1 (no swing to 0)",
			mean, lo, len(samples), wantRatio)
	}

	// No second drop anywhere.
	stop()
	wg.Wait()
	if _, _, dropped := web.between(begin, time.Now()); dropped != 0 {
		t.Errorf("the callee's interceptor dropped %d calls of a caller enforced upstream", dropped)
	}
	ownDrops := limiterMetric(t, reg, "sluice_sidecar_requests_total", "web", "dropped")
	arrivals := limiterMetric(t, reg, "sluice_sidecar_upstream_arrivals_total", "web", "")
	inferred := limiterMetric(t, reg, "sluice_sidecar_upstream_dropped_total", "web", "")
	t.Logf("callee's counters: %v arrivals enforced upstream, %v inferred upstream drops, %v own drops; app received %d",
		arrivals, inferred, ownDrops, callee.Received("web"))
	if ownDrops != 0 || arrivals != float64(callee.Received("web")) || !(inferred > 0) {
		t.Errorf("callee counted %v own drops, %v upstream arrivals for %d received, %v inferred drops; want 0, all, > 0",
			ownDrops, arrivals, callee.Received("web"), inferred)
	}
}

// startProxylessCallee runs a controller (no warm-up) with limitsDoc that
// serves checkout's proxyless routes, an aggregator in zone-a, and
// checkout-0: a gRPC server behind sluice's inbound interceptors (opts),
// listening where those routes point. reg gathers the callee's limiter.
func startProxylessCallee(t *testing.T, limitsDoc string, opts sidecar.GRPCOptions) (*testbed.Cluster, *testbed.GRPCCallee, *prometheus.Registry) {
	t.Helper()
	set, err := limits.Parse(strings.NewReader(limitsDoc))
	if err != nil {
		t.Fatal(err)
	}
	// The callee's listener first: the controller's proxyless endpoints
	// name it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := controller.DefaultConfig()
	cfg.Warmup = 0
	cfg.Proxyless = xdsserver.Endpoints{"checkout": {ln.Addr().String()}}
	logs := &testLog{w: t.Output()}
	t.Cleanup(logs.close)
	c, err := testbed.Start(testbed.Options{
		Service: "checkout", Zones: []string{"zone-a"}, NoSidecars: true,
		Limits: set, Controller: &cfg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	callee, err := c.StartGRPCCallee(ln, "checkout-0", "zone-a", opts)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(callee.Limiter.Collector())
	return c, callee, reg
}
