package sidecar

import (
	"cmp"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/names"
)

// outboundPolicy is caller's "caller/<caller>" policy: rules name callees.
func outboundPolicy(caller string, rules ...Rule) *Policy {
	slices.SortFunc(rules, func(a, b Rule) int { return strings.Compare(a.Peer, b.Peer) })
	return &Policy{Name: names.Caller(caller), Service: caller, Direction: Outbound, Peers: rules}
}

func TestCalleeFromTarget(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"xds:///checkout", "checkout"},
		{"dns:///checkout.shop.svc:8080", "checkout"},
		{"dns://8.8.8.8/checkout.shop:443", "checkout"},
		{"passthrough:///checkout.shop.svc.cluster.local:50051", "checkout"},
		{"checkout.shop.svc.cluster.local:8080", "checkout"},
		{"checkout:8080", "checkout"},
		{"checkout", "checkout"},
		{"Checkout-v2.prod", "Checkout-v2"},
		{"127.0.0.1:8080", ""},
		{"dns:///10.0.0.1:53", ""},
		{"[::1]:8080", ""},
		{"dns:///[::1]:8080", ""},
		{"unix:///var/run/app.sock", ""},
		{"unix:app.sock", ""},
		{"xds://", ""},
		{"fe80::1", ""},
		{"dns:///[fe80::1]:443", ""},
		{"checkout?x=1", "checkout"},
		{"", ""},
	} {
		if got := CalleeFromTarget(tc.target); got != tc.want {
			t.Errorf("CalleeFromTarget(%q) = %q, want %q", tc.target, got, tc.want)
		}
	}
}

// calleeServer serves the gRPC health service on loopback as service
// checkout, behind checkout's inbound interceptors, and returns a dialer
// that reaches it whatever the target names: the client's target then names
// the callee as it would in a cluster.
func calleeServer(t *testing.T, in *ServiceLimiter, opts GRPCOptions) func(context.Context, string) (net.Conn, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(in.UnaryServerInterceptor(opts)),
		grpc.StreamInterceptor(in.StreamServerInterceptor(opts)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	addr := lis.Addr().String()
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

func dialOutbound(t *testing.T, target string, out *ServiceLimiter, dial func(context.Context, string) (net.Conn, error), extra ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dial),
		grpc.WithUnaryInterceptor(out.UnaryClientInterceptor(ClientOptions{})),
		grpc.WithStreamInterceptor(out.StreamClientInterceptor(ClientOptions{})),
	}, extra...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// callBoth makes one unary call and opens one server stream on conn, and
// returns their errors.
func callBoth(t *testing.T, ctx context.Context, conn *grpc.ClientConn) (unary, stream error) {
	t.Helper()
	c := healthpb.NewHealthClient(conn)
	_, unary = c.Check(ctx, &healthpb.HealthCheckRequest{})
	s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return unary, err // the client interceptor's drop surfaces here
	}
	_, stream = s.Recv()
	return unary, stream
}

// web calls checkout over real gRPC: its outbound interceptors decide with
// web's caller/web policy, keyed by the callee its target names; checkout's
// inbound interceptors, whose own policy would drop web, see the admitted
// calls marked as decided and neither decide nor count them again.
func TestGRPCClientInterceptors(t *testing.T) {
	outL := NewLimiter(LimiterOptions{})
	outL.SetPolicy(outboundPolicy("web",
		Rule{Peer: "checkout", DropRatio: 0}, // listed, admits
		Rule{Peer: "orders", DropRatio: math.Nextafter(1, 0), LimitRPS: 50, AllowedRPS: 50},
	))
	out := outL.Service("web")

	inL := NewLimiter(LimiterOptions{})
	inL.SetPolicy(policy("checkout",
		Rule{Peer: "web", DropRatio: math.Nextafter(1, 0)},
		Rule{Peer: "mobile", DropRatio: math.Nextafter(1, 0)},
	))
	in := inL.Service("checkout")
	dial := calleeServer(t, in, GRPCOptions{TrustDecided: true})
	strictIn := NewLimiter(LimiterOptions{})
	strictIn.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: math.Nextafter(1, 0)}))
	strictDial := calleeServer(t, strictIn.Service("checkout"), GRPCOptions{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	t.Run("admitted and not decided again", func(t *testing.T) {
		conn := dialOutbound(t, "passthrough:///checkout.shop.svc.cluster.local:8080", out, dial)
		u, s := callBoth(t, ctx, conn)
		if u != nil || s != nil {
			t.Fatalf("unary %v, stream %v; want both admitted (outbound ratio 0, inbound skips decided calls)", u, s)
		}
		if c := counts(outL, "web", "checkout"); c.Offered != 2 || c.Dropped != 0 {
			t.Errorf("outbound web→checkout counted %+v, want 2 offered, 0 dropped", c)
		}
		if c := counts(inL, "checkout", "web"); c.Offered != 0 {
			t.Errorf("inbound counted web %+v again, want nothing: the caller decided", c)
		}
		if got := in.DecidedUpstream(); got != 2 {
			t.Errorf("DecidedUpstream = %d, want 2", got)
		}
	})

	t.Run("dropped before sending", func(t *testing.T) {
		before := in.DecidedUpstream()
		conn := dialOutbound(t, "passthrough:///orders.shop:8080", out, dial)
		u, s := callBoth(t, ctx, conn)
		for kind, err := range map[string]error{"unary": u, "stream": s} {
			st, _ := status.FromError(err)
			if st.Code() != codes.ResourceExhausted {
				t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED", kind, err)
			}
			// The callee is named as the service, as its own sidecar would.
			if want := "call from caller web to service orders was rate limited by sluice"; st.Message() != want {
				t.Errorf("%s: message %q, want %q", kind, st.Message(), want)
			}
		}
		var info *errdetails.RetryInfo
		for _, d := range status.Convert(u).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				info = ri
			}
		}
		if info.GetRetryDelay().AsDuration() != 53*time.Second {
			t.Errorf("unary: details %v, want RetryInfo of 53s (ratio 1−2⁻⁵³)", status.Convert(u).Details())
		}
		if c := counts(outL, "web", "orders"); c.Offered != 2 || c.Dropped != 2 {
			t.Errorf("outbound web→orders counted %+v, want 2 offered, 2 dropped", c)
		}
		if got := in.DecidedUpstream(); got != before {
			t.Errorf("the callee saw %d dropped calls, want 0: a drop is never sent", got-before)
		}
	})

	t.Run("a mark for another caller is not honoured", func(t *testing.T) {
		conn, err := grpc.NewClient("passthrough:///checkout", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		mctx := metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, "mobile", DecidedHeader, "web")
		_, err = healthpb.NewHealthClient(conn).Check(mctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("mobile with web's mark: %v, want dropped by the inbound policy", err)
		}
		if c := counts(inL, "checkout", "mobile"); c.Offered != 1 || c.Dropped != 1 {
			t.Errorf("inbound mobile %+v, want 1 offered and dropped", c)
		}
	})

	t.Run("without TrustDecided decides again", func(t *testing.T) {
		conn := dialOutbound(t, "passthrough:///checkout", out, strictDial)
		u, _ := callBoth(t, ctx, conn)
		if status.Code(u) != codes.ResourceExhausted {
			t.Errorf("unary: %v, want dropped by the inbound side that ignores marks", u)
		}
		if c := counts(strictIn, "checkout", "web"); c.Offered != 2 {
			t.Errorf("inbound without TrustDecided counted %+v, want 2 offered", c)
		}
	})
}

// closeRecorder is a request body that records whether it was closed.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

// web calls checkout over real HTTP through its RoundTripper. A dropped
// request gets, byte for byte, the response checkout's own sidecar gives for
// the same bucket; an admitted one reaches checkout marked, and checkout's
// middleware lets it through without deciding or counting it again.
func TestRoundTripper(t *testing.T) {
	rule := Rule{Peer: "web", DropRatio: math.Nextafter(1, 0), LimitRPS: 50, AllowedRPS: 50, Reason: ReasonLimit}
	inL := NewLimiter(LimiterOptions{})
	inL.SetPolicy(policy("checkout", rule))
	in := inL.Service("checkout")
	var reached atomic.Int64
	var lastHeader atomic.Pointer[http.Header]
	srv := httptest.NewServer(in.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		h := r.Header.Clone()
		lastHeader.Store(&h)
		io.WriteString(w, "ok\n")
	}), HTTPOptions{TrustDecided: true}))
	defer srv.Close()

	outL := NewLimiter(LimiterOptions{})
	outL.SetPolicy(outboundPolicy("web",
		Rule{Peer: "checkout", DropRatio: math.Nextafter(1, 0), LimitRPS: 50, AllowedRPS: 50, Reason: ReasonLimit},
		Rule{Peer: "orders"},
	))
	out := outL.Service("web")
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: out.RoundTripper(transport, ClientOptions{CalleeHeader: "x-callee"}), Timeout: 10 * time.Second}
	plain := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	get := func(c *http.Client, host string, hdr map[string]string, body io.ReadCloser) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/x", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return res, b
	}

	// The inbound answer for web→checkout, as the reference.
	inRes, inBody := get(plain, "checkout", map[string]string{DefaultCallerHeader: "web"}, nil)
	if inRes.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("inbound reference: %d, want 429", inRes.StatusCode)
	}

	t.Run("dropped like the inbound side, never sent", func(t *testing.T) {
		before := reached.Load()
		body := &closeRecorder{Reader: strings.NewReader("payload")}
		res, b := get(client, "checkout.shop.svc.cluster.local:8080", nil, body)
		if res.StatusCode != http.StatusTooManyRequests || string(b) != string(inBody) {
			t.Errorf("outbound drop: %d %q, want %d %q", res.StatusCode, b, inRes.StatusCode, inBody)
		}
		for _, k := range []string{"Content-Type", "X-Content-Type-Options", "Content-Length", "Retry-After", "Ratelimit", "Ratelimit-Policy", "X-Envoy-Ratelimited"} {
			if got, want := res.Header.Values(k), inRes.Header.Values(k); !slices.Equal(got, want) {
				t.Errorf("%s: %q, want the inbound side's %q", k, got, want)
			}
		}
		if got := res.Header.Get("Ratelimit-Policy"); got != `"sluice";q=50;w=1` {
			t.Errorf("RateLimit-Policy %q", got)
		}
		if !body.closed.Load() {
			t.Error("the dropped request's body was not closed")
		}
		if reached.Load() != before {
			t.Error("a dropped request reached the callee")
		}
		// The response can be modified by its owner without touching
		// what later drops get.
		res.Header.Add("Retry-After", "7")
		res2, _ := get(client, "checkout", nil, nil)
		if got := res2.Header.Values("Retry-After"); !slices.Equal(got, []string{"53"}) {
			t.Errorf("Retry-After after a caller edited an earlier response: %q", got)
		}
	})

	t.Run("gRPC content type gets a trailers-only status", func(t *testing.T) {
		res, b := get(client, "checkout", map[string]string{"Content-Type": "application/grpc+proto"}, nil)
		if res.StatusCode != http.StatusOK || len(b) != 0 || res.Header.Get("Grpc-Status") != "8" ||
			res.Header.Get("Grpc-Status-Details-Bin") == "" || res.Header.Get("Retry-After") != "53" ||
			res.Header.Get("X-Envoy-Ratelimited") != "true" {
			t.Errorf("gRPC drop: %d %q %v", res.StatusCode, b, res.Header)
		}
	})

	t.Run("admitted, marked, not decided again", func(t *testing.T) {
		before, upBefore := reached.Load(), in.DecidedUpstream()
		inBefore := counts(inL, "checkout", "web")
		hdr := map[string]string{"x-callee": "orders", DefaultCallerHeader: "someone-else"}
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || reached.Load() != before+1 {
			t.Fatalf("status %d, reached %d; want 200 at the callee", res.StatusCode, reached.Load()-before)
		}
		got := *lastHeader.Load()
		if got.Get(DefaultCallerHeader) != "web" || got.Get(DecidedHeader) != "web" {
			t.Errorf("callee saw caller %q, mark %q; want web, web", got.Get(DefaultCallerHeader), got.Get(DecidedHeader))
		}
		if req.Header.Get(DefaultCallerHeader) != "someone-else" || req.Header.Get(DecidedHeader) != "" {
			t.Errorf("the caller's request was modified: %v", req.Header)
		}
		if in.DecidedUpstream() != upBefore+1 || counts(inL, "checkout", "web") != inBefore {
			t.Errorf("inbound decided the marked request again")
		}
		if c := counts(outL, "web", "orders"); c.Offered != 1 || c.Dropped != 0 {
			t.Errorf("outbound web→orders %+v, want 1 offered (CalleeHeader wins over the host)", c)
		}
	})

	if c := counts(outL, "web", "checkout"); c.Offered != 3 || c.Dropped != 3 {
		t.Errorf("outbound web→checkout %+v, want 3 offered, 3 dropped", c)
	}
	if c := counts(inL, "checkout", "web"); c.Offered != 1 {
		t.Errorf("inbound web %+v, want only the unmarked reference request", c)
	}
}

// The outbound decision allocates nothing, and neither does a gRPC drop; an
// HTTP drop allocates only the response it hands over.
func TestClientDecideAllocs(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(outboundPolicy("web",
		Rule{Peer: "checkout", DropRatio: math.Nextafter(1, 0), LimitRPS: 50, AllowedRPS: 50},
		Rule{Peer: "orders"},
	))
	s := l.Service("web")

	rt := s.RoundTripper(http.DefaultTransport, ClientOptions{}).(*roundTripper)
	drop := httptest.NewRequest(http.MethodGet, "http://checkout.shop.svc:8080/", nil)
	admit := httptest.NewRequest(http.MethodGet, "http://orders.shop.svc:8080/", nil)
	for name, req := range map[string]*http.Request{"drop": drop, "admit": admit} {
		var d Decision
		if got := testing.AllocsPerRun(1000, func() { d = rt.decide(req) }); got != 0 {
			t.Errorf("RoundTripper decide (%s): %v allocations", name, got)
		}
		if d.Drop != (name == "drop") {
			t.Errorf("RoundTripper decide (%s): %+v", name, d)
		}
	}
	// What an HTTP drop allocates: the response, its header map and body.
	if got := testing.AllocsPerRun(1000, func() { rt.RoundTrip(drop) }); got > 5 {
		t.Errorf("RoundTripper drop: %v allocations, want at most the response's 5", got)
	}

	conn, err := grpc.NewClient("xds:///checkout", grpc.WithTransportCredentials(insecure.NewCredentials())) // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	unary := s.UnaryClientInterceptor(ClientOptions{})
	stream := s.StreamClientInterceptor(ClientOptions{})
	invoked := false
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		invoked = true
		return nil
	}
	streamer := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
		invoked = true
		return nil, nil
	}
	ctx := context.Background()
	desc := &grpc.StreamDesc{}
	var err1, err2 error
	if got := testing.AllocsPerRun(1000, func() { err1 = unary(ctx, "/m", nil, nil, conn, invoker) }); got != 0 {
		t.Errorf("unary client drop: %v allocations", got)
	}
	if got := testing.AllocsPerRun(1000, func() { _, err2 = stream(ctx, desc, conn, "/m", streamer) }); got != 0 {
		t.Errorf("stream client drop: %v allocations", got)
	}
	if status.Code(err1) != codes.ResourceExhausted || status.Code(err2) != codes.ResourceExhausted || invoked {
		t.Errorf("drops: %v, %v, invoked %v", err1, err2, invoked)
	}
}

// FuzzCalleeFromTarget: any target maps to a substring of itself without a
// port, dot or slash, never panics, and allocates nothing.
func FuzzCalleeFromTarget(f *testing.F) {
	for _, s := range []string{"xds:///checkout", "dns://1.1.1.1/a.b:1", "[::1]:1", "unix:x", "a:b:c", "://", "x:///", "é.ü:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		got := CalleeFromTarget(target)
		if !strings.Contains(target, got) || strings.ContainsAny(got, ".:/[") {
			t.Fatalf("CalleeFromTarget(%q) = %q", target, got)
		}
		if n := testing.AllocsPerRun(10, func() { got = CalleeFromTarget(target) }); n != 0 {
			t.Fatalf("CalleeFromTarget(%q): %v allocations", target, n)
		}
	})
}

// BenchmarkRoundTripperDecide is the outbound HTTP decision: the callee from
// the host (one pass over its first label), then Decide. No allocation; the
// host costs about what Decide does (BenchmarkDecide).
func BenchmarkRoundTripperDecide(b *testing.B) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(outboundPolicy("web", Rule{Peer: "checkout", DropRatio: 0.5, LimitRPS: 50, AllowedRPS: 50}))
	rt := l.Service("web").RoundTripper(nil, ClientOptions{}).(*roundTripper)
	req := httptest.NewRequest(http.MethodGet, "http://checkout.shop.svc.cluster.local:8080/", nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rt.decide(req)
		}
	})
}

// The inbound middleware honours a mark only with TrustDecided, and only
// when it names the caller.
func TestMiddlewareDecidedMark(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: math.Nextafter(1, 0)}))
	s := l.Service("checkout")
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})
	for _, tc := range []struct {
		name          string
		trust         bool
		caller, mark  string
		want, counted int
	}{
		{"mark names the caller", true, "web", "web", http.StatusOK, 0},
		{"mark names another caller", true, "web", "mobile", http.StatusTooManyRequests, 1},
		{"mark without a caller", true, "", "web", http.StatusOK, 1}, // unknown is unlisted: admitted, counted
		{"marks not trusted", false, "web", "web", http.StatusTooManyRequests, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := cmp.Or(tc.caller, names.Unknown)
			before, up := counts(l, "checkout", peer), s.DecidedUpstream()
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if tc.caller != "" {
				req.Header.Set(DefaultCallerHeader, tc.caller)
			}
			req.Header.Set(DecidedHeader, tc.mark)
			w := httptest.NewRecorder()
			s.Middleware(ok, HTTPOptions{TrustDecided: tc.trust}).ServeHTTP(w, req)
			if w.Code != tc.want {
				t.Errorf("status %d, want %d", w.Code, tc.want)
			}
			counted := int(counts(l, "checkout", peer).Offered - before.Offered)
			if tc.caller == "" {
				// Counted as unknown: a mark with no caller is no mark.
				if counted != 1 {
					t.Errorf("%d counted as %s, want 1", counted, peer)
				}
				return
			}
			if counted != tc.counted || (counted == 0) != (s.DecidedUpstream() == up+1) {
				t.Errorf("counted %d (DecidedUpstream +%d), want %d", counted, s.DecidedUpstream()-up, tc.counted)
			}
		})
	}
}
