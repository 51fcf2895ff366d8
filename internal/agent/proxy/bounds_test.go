package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/testkit"
)

// newBoundedProxy runs a Proxy to upstream (host:port) with opts behind NewServer, and returns
// its address and the proxy, whose counters the test reads.
func newBoundedProxy(t *testing.T, upstream string, opts Options) (string, *Proxy) {
	t.Helper()
	opts.Registerer = prometheus.NewRegistry()
	p, err := New(&url.URL{Scheme: "http", Host: upstream}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return serve(t, NewServer("", p)), p
}

// blockingApp answers every request once release is closed, after telling entered.
func blockingApp(t *testing.T) (addr string, entered chan struct{}, release chan struct{}) {
	entered, release = make(chan struct{}, 16), make(chan struct{})
	addr = serve(t, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})})
	t.Cleanup(func() { close(release) })
	return addr, entered, release
}

// TestMaxRequestsRefusesAtOnce: with MaxRequests in flight to the app, one more request is
// answered 503 by the proxy at once (it does not wait for a slot), and counted.
func TestMaxRequestsRefusesAtOnce(t *testing.T) {
	app, entered, _ := blockingApp(t)
	addr, p := newBoundedProxy(t, app, Options{MaxRequests: 2})
	client := newHTTPClient(t)
	for range 2 {
		go func() {
			if res, err := client.Get("http://" + addr + "/"); err == nil {
				res.Body.Close()
			}
		}()
		wait(t, entered, "a request to reach the app")
	}
	res, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("X-Envoy-Overloaded") != "true" {
		t.Errorf("third request: %d %q, x-envoy-overloaded %q; want 503 with x-envoy-overloaded: true",
			res.StatusCode, body, res.Header.Get("X-Envoy-Overloaded"))
	}
	if n := testutil.ToFloat64(p.bounds.refusedMaxRequests); n != 1 {
		t.Errorf("refused max_requests = %v, want 1", n)
	}
	if n := p.bounds.inFlight.Load(); n != 2 {
		t.Errorf("in flight = %d, want 2 (the refused request gave its slot back)", n)
	}
}

// TestMaxRequestsGRPC: a gRPC call over the bound gets UNAVAILABLE, which its client may retry
// elsewhere, and the slot of a call that ended is free again.
func TestMaxRequestsGRPC(t *testing.T) {
	app := startGRPCApp(t)
	addr, p := newBoundedProxy(t, app.addr, Options{MaxRequests: 1})
	cc := dialGRPC(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	startHang(ctx, t, cc)
	client := healthpb.NewHealthClient(cc)
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	wantStatus(t, err, codes.Unavailable, msgMaxRequests)
	cancel()
	testkit.WaitFor(t, testTimeout, "the Hang call to leave", func() bool { return p.bounds.inFlight.Load() == 0 })
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("Check after the slot was freed: %v", err)
	}
}

// TestMaxConnsRefusesAtOnce: with MaxConns connections open to the app, a request that would
// need another one is answered 503 at once rather than queued.
func TestMaxConnsRefusesAtOnce(t *testing.T) {
	app, entered, _ := blockingApp(t)
	addr, p := newBoundedProxy(t, app, Options{MaxConns: 1})
	client := newHTTPClient(t)
	go func() {
		if res, err := client.Get("http://" + addr + "/"); err == nil {
			res.Body.Close()
		}
	}()
	wait(t, entered, "a request to reach the app")
	res, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("second request: %d, want 503: its HTTP/1.1 request needs a second connection", res.StatusCode)
	}
	if n := testutil.ToFloat64(p.bounds.refusedMaxConns); n != 1 {
		t.Errorf("refused max_connections = %v, want 1", n)
	}
	if n := p.bounds.conns.Load(); n != 1 {
		t.Errorf("upstream connections = %d, want 1", n)
	}
}

// bodyReader is an app that reads each request's body and reports how the read ended.
func bodyReader(t *testing.T) (addr string, readErr chan error) {
	readErr = make(chan error, 4)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true) // the proxy forwards HTTP/2 requests over h2c
	addr = serve(t, &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		readErr <- err
	})})
	return addr, readErr
}

// TestBodyTimeoutCutsTrickledBody: a body that stops coming is cut at BodyTimeout: the caller
// gets 408 and Connection: close, the app's read of the body fails (its connection is
// closed, not held for the rest of the declared gigabyte), and the cut is counted.
func TestBodyTimeoutCutsTrickledBody(t *testing.T) {
	app, readErr := bodyReader(t)
	addr, p := newBoundedProxy(t, app, Options{BodyTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A gigabyte declared, one byte sent, then nothing.
	if _, err := io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: app\r\nContent-Length: 1000000000\r\n\r\nx"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(testTimeout))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response to the stalled upload: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestTimeout || !res.Close {
		t.Errorf("stalled upload: %d, close %v; want 408 and Connection: close", res.StatusCode, res.Close)
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("the app read the whole body, want its read cut")
		}
	case <-time.After(testTimeout):
		t.Fatal("the app is still reading the stalled body")
	}
	if n := testutil.ToFloat64(p.bounds.bodyTimeouts); n != 1 {
		t.Errorf("refused body_timeout = %v, want 1", n)
	}
	testkit.WaitFor(t, testTimeout, "the connection to the app to close", func() bool { return p.bounds.conns.Load() == 0 })
}

// TestBodyTimeoutCutsTrickledBodyH2C: the same over cleartext HTTP/2 (a non-gRPC request): the
// deadline is the stream's.
func TestBodyTimeoutCutsTrickledBodyH2C(t *testing.T) {
	app, readErr := bodyReader(t)
	addr, _ := newBoundedProxy(t, app, Options{BodyTimeout: 200 * time.Millisecond})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	t.Cleanup(tr.CloseIdleConnections)
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte("x")) }() // then nothing until the test ends
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&http.Client{Transport: tr, Timeout: testTimeout}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.ProtoMajor != 2 || res.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled h2c upload: %s %d, want HTTP/2 408", res.Proto, res.StatusCode)
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("the app read the whole body, want its read cut")
		}
	case <-time.After(testTimeout):
		t.Fatal("the app is still reading the stalled body")
	}
}

// TestBodyTimeoutEndsWithTheBody: the deadline covers the body only. A response that
// streams on past the body's deadline, once the body was read whole, arrives intact, and
// the connection serves the next request.
//
// The app holds the first response until the test releases it, and the test releases it
// only once the deadline has surely passed: the proxy set it before it forwarded the
// request, so before the client received the first part, and timeout after that part is
// later than the deadline however late anything ran. A deadline left in place would have
// the proxy's server cut the request there (its background read fails, cancelling the
// request): the grace after it gives that cut time to reach the client, which then sees
// the response end short. The timing only bounds how long the test looks for a cut; a
// slow machine can not make it fail. (Go's server clears the deadline itself at the body's
// end too; TestBodyTimeoutLiftedAtTheEnd checks the proxy's own lift.)
func TestBodyTimeoutEndsWithTheBody(t *testing.T) {
	const (
		timeout = 2 * time.Second
		grace   = time.Second
	)
	release := make(chan struct{}, 2)
	app := serve(t, &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
		w.(http.Flusher).Flush()
		select {
		case <-release:
			io.WriteString(w, "-done")
		case <-r.Context().Done(): // the proxy cut the request
		}
	})})
	addr, p := newBoundedProxy(t, app, Options{BodyTimeout: timeout})
	client := newHTTPClient(t)
	for i := range 2 {
		var reused bool
		trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodPost, "http://"+addr+"/", strings.NewReader("body"))
		if err != nil {
			t.Fatal(err)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		first := make([]byte, len("body"))
		if _, err := io.ReadFull(res.Body, first); err != nil {
			t.Fatalf("request %d: first part: %v", i, err)
		}
		if i == 0 {
			// Past the deadline (see above), and the grace for a cut to show.
			time.Sleep(timeout + grace)
		}
		release <- struct{}{}
		rest, err := io.ReadAll(res.Body)
		res.Body.Close()
		if got := string(first) + string(rest); err != nil || res.StatusCode != http.StatusOK || got != "body-done" {
			t.Errorf("request %d: %d %q, %v; want 200 \"body-done\"", i, res.StatusCode, got, err)
		}
		if i == 1 && !reused {
			t.Error("the second request did not reuse the first one's connection")
		}
	}
	if n := testutil.ToFloat64(p.bounds.bodyTimeouts); n != 0 {
		t.Errorf("refused body_timeout = %v, want 0", n)
	}
}

// deadlineWriter is a ResponseWriter that records the read deadlines set through its
// ResponseController.
type deadlineWriter struct {
	http.ResponseWriter
	deadlines []time.Time
}

func (w *deadlineWriter) SetReadDeadline(d time.Time) error {
	w.deadlines = append(w.deadlines, d)
	return nil
}

// TestBodyTimeoutLiftedAtTheEnd: limitBody sets the body's deadline, and the body's end lifts
// it, so that nothing after the body reads under it. The servers of Go 1.26 also clear the
// deadline themselves when they start their background read at the body's end, so
// TestBodyTimeoutEndsWithTheBody passes without the lift; this test does not.
func TestBodyTimeoutLiftedAtTheEnd(t *testing.T) {
	b := newBounds(Options{BodyTimeout: time.Hour})
	w := &deadlineWriter{}
	r := b.limitBody(w, httptest.NewRequest(http.MethodPost, "/", strings.NewReader("body")))
	if len(w.deadlines) != 1 || w.deadlines[0].IsZero() {
		t.Fatalf("deadlines %v after limitBody, want one set", w.deadlines)
	}
	if got, err := io.ReadAll(r.Body); err != nil || string(got) != "body" {
		t.Fatalf("body %q, %v", got, err)
	}
	if len(w.deadlines) != 2 || !w.deadlines[1].IsZero() {
		t.Errorf("deadlines %v after the body's end, want it lifted (zero)", w.deadlines)
	}
}

// TestBodyTimeoutSparesGRPCStreams: a gRPC call whose client half stays open and silent for
// longer than BodyTimeout is not cut: a stream's request body is not an upload.
func TestBodyTimeoutSparesGRPCStreams(t *testing.T) {
	const timeout = 100 * time.Millisecond
	app := startGRPCApp(t)
	addr, p := newBoundedProxy(t, app.addr, Options{BodyTimeout: timeout})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, err := dialGRPC(t, addr).NewStream(ctx, &echoService.Streams[0], "/sluice.proxytest.Echo/Hang")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(wrapperspb.Bytes([]byte("hello"))); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(wrapperspb.BytesValue)); err != nil {
		t.Fatalf("first Hang message: %v", err)
	}
	time.Sleep(4 * timeout) // the client sends nothing more and keeps its half open
	select {
	case <-app.hangEnded:
		t.Fatal("the app's end of the stream ended while the client kept it open")
	default:
	}
	if err := cs.Context().Err(); err != nil {
		t.Fatalf("client stream ended: %v", err)
	}
	if n := testutil.ToFloat64(p.bounds.bodyTimeouts); n != 0 {
		t.Errorf("refused body_timeout = %v, want 0", n)
	}
}
