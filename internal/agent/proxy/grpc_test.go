package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// maxMsg is the message size limit of the test's gRPC clients and server, above gRPC's
// default 4 MiB so that large messages can be sent.
const maxMsg = 32 << 20

// grpcApp is a real gRPC server: the standard health service, plus a hand-written Echo
// service (no generated code needed) with a unary Echo and a streaming Hang that echoes one
// message and then waits for its context to end.
type grpcApp struct {
	addr   string
	health *health.Server
	conns  *connTracker
	// hangEnded receives once each time a Hang call sees its context done.
	hangEnded chan struct{}
}

func startGRPCApp(t testing.TB) *grpcApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &grpcApp{
		addr:      ln.Addr().String(),
		health:    health.NewServer(),
		conns:     &connTracker{Listener: ln},
		hangEnded: make(chan struct{}, 16),
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg))
	healthpb.RegisterHealthServer(srv, app.health)
	srv.RegisterService(&echoService, app)
	serveGRPCTest(t, srv, app.conns)
	return app
}

// serveGRPCTest serves srv on l until the test ends, and fails it if Serve does.
func serveGRPCTest(t testing.TB, srv *grpc.Server, l net.Listener) {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("grpc serve: %v", err)
		}
	})
}

var echoService = grpc.ServiceDesc{
	ServiceName: "sluice.proxytest.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return in, nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName: "Hang",
		// Bidirectional, so that a client may keep its half open: gRPC reads a
		// server-streaming call's request to its end before the handler gets it.
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			in := new(wrapperspb.BytesValue)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			if err := stream.SendMsg(in); err != nil {
				return err
			}
			<-stream.Context().Done()
			srv.(*grpcApp).hangEnded <- struct{}{}
			return stream.Context().Err()
		},
	}},
}

// connTracker is a listener that can cut every connection it accepted, as a crashing app would.
type connTracker struct {
	net.Listener
	mu    sync.Mutex // guards conns
	conns []net.Conn
}

func (l *connTracker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *connTracker) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

func dialGRPC(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// startHang opens a Hang stream on cc and waits for its first message, so that the call is
// established end to end when it returns.
func startHang(ctx context.Context, t *testing.T, cc *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	cs, err := cc.NewStream(ctx, &echoService.Streams[0], "/sluice.proxytest.Echo/Hang")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.Bytes([]byte("hello"))); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(wrapperspb.BytesValue)); err != nil {
		t.Fatalf("first Hang message: %v", err)
	}
	return cs
}

func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || (msg != "" && st.Message() != msg) {
		t.Errorf("error %v, want %v %q", err, code, msg)
	}
}

func TestGRPCHealth(t *testing.T) {
	app := startGRPCApp(t)
	client := healthpb.NewHealthClient(dialGRPC(t, startProxy(t, app.addr, Options{})))
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	app.health.SetServingStatus("orders", healthpb.HealthCheckResponse_SERVING)
	resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "orders"})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check: %v, want SERVING", resp.GetStatus())
	}

	// The app's error status travels in the trailers; it must arrive as the app sent it.
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"})
	wantStatus(t, err, codes.NotFound, "unknown service")

	// Each status change is received while the stream stays open: it is not buffered until
	// the end of the call.
	watch, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: "orders"})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for _, want := range []healthpb.HealthCheckResponse_ServingStatus{
		healthpb.HealthCheckResponse_SERVING,
		healthpb.HealthCheckResponse_NOT_SERVING,
		healthpb.HealthCheckResponse_SERVING,
	} {
		app.health.SetServingStatus("orders", want)
		got, err := watch.Recv()
		if err != nil {
			t.Fatalf("Watch.Recv: %v", err)
		}
		if got.GetStatus() != want {
			t.Fatalf("Watch: %v, want %v", got.GetStatus(), want)
		}
	}
}

func TestGRPCLargeMessages(t *testing.T) {
	app := startGRPCApp(t)
	cc := dialGRPC(t, startProxy(t, app.addr, Options{}))
	// What fails here is a flow-control deadlock, which never finishes, not
	// a slow copy: 40 MB through two HTTP/2 hops takes about a second under
	// the race detector alone, and many times that on two cores shared with
	// other packages' tests. So the bound is a hang guard, not testTimeout.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// Well past every HTTP/2 flow-control window on the way, in both directions.
	msg := make([]byte, 20<<20)
	rand.Read(msg)
	out := new(wrapperspb.BytesValue)
	if err := cc.Invoke(ctx, "/sluice.proxytest.Echo/Echo", wrapperspb.Bytes(msg), out); err != nil {
		t.Fatalf("Echo: %v", err)
	}
	if !bytes.Equal(out.GetValue(), msg) {
		t.Errorf("Echo returned %d bytes, not the %d sent", len(out.GetValue()), len(msg))
	}
}

func TestGRPCCancelPropagates(t *testing.T) {
	app := startGRPCApp(t)
	cc := dialGRPC(t, startProxy(t, app.addr, Options{}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	startHang(ctx, t, cc)
	cancel()
	wait(t, app.hangEnded, "the app's stream context to be cancelled")
}

func TestGRPCUpstreamDown(t *testing.T) {
	client := healthpb.NewHealthClient(dialGRPC(t, startProxy(t, deadAddr(t), Options{})))
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	// The message tells the proxy's own status from gRPC's mapping of a bare HTTP 502, which
	// would be UNAVAILABLE too.
	wantStatus(t, err, codes.Unavailable, grpcUnavailableMessage)
}

// TestGRPCUpstreamDownWire checks the form of the proxy's gRPC error on the wire: HTTP 200,
// trailers-only (the status in the headers), no body.
func TestGRPCUpstreamDownWire(t *testing.T) {
	proxy := startProxy(t, deadAddr(t), Options{})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	// An empty, uncompressed gRPC message: flag 0, length 0.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+proxy+"/grpc.health.v1.Health/Check", bytes.NewReader(make([]byte, 5)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Errorf("got %s %s, want HTTP/2.0 200", resp.Proto, resp.Status)
	}
	for k, want := range map[string]string{
		"Content-Type": "application/grpc",
		"Grpc-Status":  "14",
		"Grpc-Message": grpcUnavailableMessage,
	} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if len(body) != 0 || len(resp.Trailer) != 0 {
		t.Errorf("body %q, trailers %v; want neither (trailers-only form)", body, resp.Trailer)
	}
}

// TestGRPCUpstreamDiesMidStream checks that a stream cut by the app's crash ends with
// UNAVAILABLE, not with the INTERNAL a reset stream would give.
func TestGRPCUpstreamDiesMidStream(t *testing.T) {
	app := startGRPCApp(t)
	cc := dialGRPC(t, startProxy(t, app.addr, Options{}))
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	cs := startHang(ctx, t, cc)
	app.conns.cutAll()
	err := cs.RecvMsg(new(wrapperspb.BytesValue))
	if errors.Is(err, io.EOF) {
		t.Fatal("stream ended cleanly; want an error")
	}
	wantStatus(t, err, codes.Unavailable, grpcUnavailableMessage)
}

// TestGRPCReachesAppOverHTTP2 guards the protocol split: a gRPC call must reach the app as
// HTTP/2 even though the app is a plain net/http server here, and an HTTP/1.1 request as
// HTTP/1.1.
func TestGRPCReachesAppOverHTTP2(t *testing.T) {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	app := serve(t, &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set("X-Proto", r.Proto)
	})})
	proxy := startProxy(t, app, Options{})
	for _, tt := range []struct {
		name      string
		protos    func(*http.Protocols)
		wantProto string
	}{
		{"h2c", func(p *http.Protocols) { p.SetUnencryptedHTTP2(true) }, "HTTP/2.0"},
		{"http1", func(p *http.Protocols) { p.SetHTTP1(true) }, "HTTP/1.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var protos http.Protocols
			tt.protos(&protos)
			tr := &http.Transport{Protocols: &protos}
			defer tr.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy+"/x.Y/Z", strings.NewReader(""))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/grpc")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("X-Proto"); got != tt.wantProto {
				t.Errorf("app saw %q, want %q", got, tt.wantProto)
			}
		})
	}
}
