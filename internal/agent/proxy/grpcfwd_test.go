package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The methods of inspect (any service name works; the forwarder knows none):
//
//	Meta: reads one message, answers header metadata saying what it saw (seen-*), the message
//	  back, and a trailer;
//	Fail: answers nothing but a status with a RetryInfo detail and a trailer (trailers-only);
//	Count: reads messages to the end and answers their number and total size;
//	Repeat: reads one message and answers it back N times, N its length;
//	Wait: says so on entered, blocks until the call's context ends, then says so on waited.
func inspect(entered chan<- struct{}, waited chan<- error) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		ctx := ss.Context()
		md, _ := metadata.FromIncomingContext(ctx)
		switch method[strings.LastIndex(method, "/")+1:] {
		case "Meta":
			in := new(wrapperspb.BytesValue)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			seen := metadata.MD{}
			for _, k := range []string{":authority", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-custom", "user-agent", "content-type"} {
				seen["seen-"+strings.TrimPrefix(k, ":")] = md[k]
			}
			if d, ok := ctx.Deadline(); ok {
				seen.Set("seen-deadline", time.Until(d).String())
			}
			if err := ss.SetHeader(seen); err != nil {
				return err
			}
			ss.SetTrailer(metadata.Pairs("t-trailer", "after"))
			return ss.SendMsg(in)
		case "Fail":
			ss.SetTrailer(metadata.Pairs("t-trailer", "failed"))
			st, _ := status.New(codes.FailedPrecondition, "the app says no").
				WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(3 * time.Second)})
			return st.Err()
		case "Count":
			var n, size int
			for {
				in := new(wrapperspb.BytesValue)
				err := ss.RecvMsg(in)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				n++
				size += len(in.Value)
			}
			return ss.SendMsg(wrapperspb.String(strconv.Itoa(n) + " " + strconv.Itoa(size)))
		case "Repeat":
			in := new(wrapperspb.BytesValue)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			for range len(in.Value) {
				if err := ss.SendMsg(in); err != nil {
					return err
				}
			}
			return nil
		case "Wait":
			entered <- struct{}{}
			<-ctx.Done()
			waited <- ctx.Err()
			return ctx.Err()
		}
		return status.Error(codes.Unimplemented, method)
	}
}

// startInspectApp runs the inspect app and returns its address and the channels its Wait
// calls report on.
func startInspectApp(t testing.TB) (addr string, entered chan struct{}, waited chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered, waited = make(chan struct{}, 4), make(chan error, 4)
	app := &grpcApp{addr: ln.Addr().String(), conns: &connTracker{Listener: ln}}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxMsg), grpc.MaxSendMsgSize(maxMsg), grpc.UnknownServiceHandler(inspect(entered, waited)))
	serveGRPCTest(t, srv, app.conns)
	return app.addr, entered, waited
}

// startForwarder serves a gRPC forwarder to the app at addr, with opts and intercept, and
// returns a client connection to it.
func startForwarder(t testing.TB, app string, opts Options, intercept grpc.StreamServerInterceptor) *grpc.ClientConn {
	t.Helper()
	p, err := New(&url.URL{Scheme: "http", Host: app}, opts)
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.NewGRPCForwarder(intercept)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Server.Serve(ln) }()
	t.Cleanup(func() {
		f.Server.Stop()
		if err := <-done; err != nil {
			t.Errorf("forwarder serve: %v", err)
		}
		f.Close()
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestGRPCForwarderUnary(t *testing.T) {
	app, _, _ := startInspectApp(t)
	conn := startForwarder(t, app, Options{}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-custom", "kept", "x-forwarded-for", "198.51.100.7")
	var header, trailer metadata.MD
	out := new(wrapperspb.BytesValue)
	err := conn.Invoke(ctx, "/any.Service/Meta", wrapperspb.Bytes([]byte("hello")), out,
		grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Value) != "hello" {
		t.Errorf("answer %q, want the message back", out.Value)
	}
	want := map[string]string{
		"seen-authority":         conn.Target(),
		"seen-x-custom":          "kept",
		"seen-x-forwarded-for":   "198.51.100.7, 127.0.0.1",
		"seen-x-forwarded-proto": "http",
		"seen-x-forwarded-host":  conn.Target(),
	}
	for k, v := range want {
		if got := header.Get(k); len(got) != 1 || got[0] != v {
			t.Errorf("the app saw %s %q, want %q", strings.TrimPrefix(k, "seen-"), got, v)
		}
	}
	// The caller's deadline of 10 s reached the app, less the way there.
	if d, err := time.ParseDuration(strings.Join(header.Get("seen-deadline"), "")); err != nil || d <= 5*time.Second || d > 10*time.Second {
		t.Errorf("the app's deadline %v (%v), want the caller's 10s less the way", header.Get("seen-deadline"), err)
	}
	if ct := header.Get("seen-content-type"); len(ct) != 1 || !strings.HasPrefix(ct[0], "application/grpc") {
		t.Errorf("the app saw content-type %q", ct)
	}
	if got := trailer.Get("t-trailer"); len(got) != 1 || got[0] != "after" {
		t.Errorf("trailer %q, want the app's", got)
	}

	// A typed call through the same forwarder: the standard health service is unknown to
	// it, and its messages pass as bytes.
	res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "nothing"})
	if status.Code(err) != codes.Unimplemented || res != nil {
		t.Errorf("health Check at an app without it: %v, %v; want UNIMPLEMENTED from the app", res, err)
	}
}

func TestGRPCForwarderStatusAndTrailers(t *testing.T) {
	app, _, _ := startInspectApp(t)
	conn := startForwarder(t, app, Options{}, nil)
	var header, trailer metadata.MD
	err := conn.Invoke(t.Context(), "/any.Service/Fail", wrapperspb.Bytes(nil), new(wrapperspb.BytesValue),
		grpc.Header(&header), grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || st.Message() != "the app says no" {
		t.Fatalf("status %v, want the app's", st)
	}
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() != 3*time.Second {
		t.Errorf("details %v, want the app's RetryInfo of 3s", st.Details())
	}
	if got := trailer.Get("t-trailer"); len(got) != 1 || got[0] != "failed" {
		t.Errorf("trailer %q, want the app's", got)
	}
	if len(header) != 0 {
		t.Errorf("headers %v on an answer the app gave trailers-only", header)
	}
}

func TestGRPCForwarderStreams(t *testing.T) {
	app, _, _ := startInspectApp(t)
	conn := startForwarder(t, app, Options{GRPCMaxMessage: maxMsg}, nil)
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}

	// Many messages up, one down; one larger than grpc-go's default limit of 4 MiB, which
	// the forwarder is set above.
	cs, err := conn.NewStream(t.Context(), desc, "/any.Service/Count")
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{0, 1, 5 << 20, 100}
	total := 0
	for _, n := range sizes {
		if err := cs.SendMsg(wrapperspb.Bytes(make([]byte, n))); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(got); err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(len(sizes)) + " " + strconv.Itoa(total); got.Value != want {
		t.Errorf("the app counted %q, want %q", got.Value, want)
	}
	if err := cs.RecvMsg(got); !errors.Is(err, io.EOF) {
		t.Errorf("after the answer: %v, want the end", err)
	}

	// One message up, many down.
	cs, err = conn.NewStream(t.Context(), desc, "/any.Service/Repeat")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.Bytes(make([]byte, 50))); err != nil {
		t.Fatal(err)
	}
	cs.CloseSend()
	n := 0
	for {
		m := new(wrapperspb.BytesValue)
		err := cs.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 50 {
		t.Errorf("%d messages down, want 50", n)
	}
}

func TestGRPCForwarderCancelReachesTheApp(t *testing.T) {
	app, entered, waited := startInspectApp(t)
	conn := startForwarder(t, app, Options{}, nil)
	cancel := startWait(t, conn, entered)
	cancel()
	select {
	case err := <-waited:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the app's call ended with %v, want cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app's call is still open 10s after its caller cancelled")
	}
}

func TestGRPCForwarderAppDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	conn := startForwarder(t, addr, Options{}, nil)
	err = conn.Invoke(t.Context(), "/any.Service/Meta", wrapperspb.Bytes(nil), new(wrapperspb.BytesValue))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != grpcUnavailableMessage {
		t.Errorf("call to an app that is down: %v, want UNAVAILABLE %q", st, grpcUnavailableMessage)
	}
}

func TestGRPCForwarderMaxRequests(t *testing.T) {
	app, entered, waited := startInspectApp(t)
	conn := startForwarder(t, app, Options{MaxRequests: 1}, nil)
	// The first call holds the one slot until cancelled; the second is refused at once.
	cancel := startWait(t, conn, entered)
	defer cancel()
	var trailer metadata.MD
	err := conn.Invoke(t.Context(), "/any.Service/Meta", wrapperspb.Bytes(nil), new(wrapperspb.BytesValue), grpc.Trailer(&trailer))
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != msgMaxRequests {
		t.Fatalf("second call: %v, want UNAVAILABLE %q", st, msgMaxRequests)
	}
	if got := trailer.Get("x-envoy-overloaded"); len(got) != 1 || got[0] != "true" {
		t.Errorf("refusal's trailer %v, want x-envoy-overloaded: true", trailer)
	}
	cancel()
	<-waited
	// The slot is free again once the first call has ended.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := conn.Invoke(t.Context(), "/any.Service/Meta", wrapperspb.Bytes(nil), new(wrapperspb.BytesValue))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a call 10s after the first ended: %v", err)
		}
	}
}

// One message larger than GRPCMaxMessage fails the call with RESOURCE_EXHAUSTED, before the
// forwarder holds it; one of the bound's size passes.
func TestGRPCForwarderMaxMessage(t *testing.T) {
	app, _, _ := startInspectApp(t)
	const bound = 1 << 20
	conn := startForwarder(t, app, Options{GRPCMaxMessage: bound}, nil)
	// A BytesValue of n bytes is n plus its tag and length (4 bytes for n near 1 MiB).
	out := new(wrapperspb.BytesValue)
	if err := conn.Invoke(t.Context(), "/any.Service/Meta", wrapperspb.Bytes(make([]byte, bound-4)), out); err != nil {
		t.Fatalf("a message of the bound's size: %v", err)
	}
	err := conn.Invoke(t.Context(), "/any.Service/Meta", wrapperspb.Bytes(make([]byte, bound)), out)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message over the bound: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// startWait opens a Wait call through conn and returns once the app has it; cancel ends it.
func startWait(t *testing.T, conn *grpc.ClientConn, entered <-chan struct{}) (cancel context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/any.Service/Wait")
	if err == nil {
		err = cs.SendMsg(wrapperspb.Bytes(nil))
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	<-entered
	return cancel
}
