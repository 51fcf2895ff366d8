package uplink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
)

// The tests use the load report protocol as a stand-in for any
// request/response stream.
type (
	req  = sluicev1.StreamLoadReportsRequest
	resp = sluicev1.StreamLoadReportsResponse
)

func openLoad(ctx context.Context, cc grpc.ClientConnInterface) (grpc.BidiStreamingClient[req, resp], error) {
	return sluicev1.NewLoadReportServiceClient(cc).StreamLoadReports(ctx)
}

func msg(id string) *req {
	return &req{Report: &sluicev1.LoadReport{SidecarId: id}}
}

// mode says how a fakeServer's handler behaves.
type mode int

const (
	answer mode = iota // read every message and answer it
	fail               // fail the stream at once
	stall              // never read, never answer
	silent             // read every message, never answer
)

// fakeServer is a LoadReportService on loopback that records the sidecar ids
// of the messages it reads.
type fakeServer struct {
	sluicev1.UnimplementedLoadReportServiceServer
	mode mode
	addr string
	got  chan string
	srv  *grpc.Server
}

func newFakeServer(t *testing.T, m mode) *fakeServer {
	t.Helper()
	f := &fakeServer{mode: m, got: make(chan string, 1000), srv: grpc.NewServer()}
	sluicev1.RegisterLoadReportServiceServer(f.srv, f)
	f.addr = serve(t, f.srv)
	return f
}

// serve runs srv on a fresh loopback port until the test ends.
func serve(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

func (f *fakeServer) StreamLoadReports(stream grpc.BidiStreamingServer[req, resp]) error {
	switch f.mode {
	case fail:
		return status.Error(codes.Unavailable, "not today")
	case stall:
		<-stream.Context().Done()
		return nil
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil
		}
		f.got <- m.GetReport().GetSidecarId()
		if f.mode == silent {
			continue
		}
		if err := stream.Send(&resp{Accepted: true}); err != nil {
			return nil
		}
	}
}

// next returns the next message id the server read, failing the test after
// a generous deadline.
func (f *fakeServer) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-f.got:
		return id
	case <-time.After(20 * time.Second):
		t.Fatal("server received nothing in 20s")
		return ""
	}
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// blackhole accepts TCP connections and never says a word.
func blackhole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis.Addr().String()
}

// start runs u until the test ends and checks that Run returns nil.
func start(t *testing.T, u *Uplink[req, resp]) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return within 20s of cancel")
		}
	})
}

func newUplink(t *testing.T, cfg Config[req, resp]) *Uplink[req, resp] {
	t.Helper()
	if cfg.Open == nil {
		cfg.Open = openLoad
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = 10 * time.Millisecond
		cfg.BackoffMax = 50 * time.Millisecond
	}
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(t *testing.T) string
		cfg  Config[req, resp]
	}{
		{name: "nothing listens", bad: deadAddr},
		{name: "server without the service", bad: func(t *testing.T) string {
			return serve(t, grpc.NewServer())
		}},
		{name: "handler fails the stream", bad: func(t *testing.T) string {
			return newFakeServer(t, fail).addr
		}},
		{name: "tcp accepted, no http2", bad: blackhole, cfg: Config[req, resp]{OpenTimeout: 200 * time.Millisecond}},
		{name: "server never answers", bad: func(t *testing.T) string {
			return newFakeServer(t, silent).addr
		}, cfg: Config[req, resp]{ResponseTimeout: 200 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := newFakeServer(t, answer)
			cfg := tc.cfg
			cfg.Addrs = []string{tc.bad(t), live.addr}
			u := newUplink(t, cfg)
			u.Offer(msg("m1"))
			start(t, u)

			// The message offered before the bad server failed must
			// still reach the live one.
			if got := live.next(t); got != "m1" {
				t.Fatalf("live server got %q, want m1", got)
			}
			testkit.WaitFor(t, 20*time.Second, "Connected", u.Connected)
			if s := u.Stats(); s.Failovers < 1 {
				t.Errorf("Failovers = %d, want >= 1", s.Failovers)
			}
			u.Offer(msg("m2"))
			if got := live.next(t); got != "m2" {
				t.Fatalf("live server got %q, want m2", got)
			}
		})
	}
}

func TestWrapsAroundAfterLastAddress(t *testing.T) {
	// The live server is first, goes away, and the uplink must come back
	// to it through the dead second address.
	liveSrv := grpc.NewServer()
	live := &fakeServer{mode: answer, got: make(chan string, 100), srv: liveSrv}
	sluicev1.RegisterLoadReportServiceServer(liveSrv, live)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go liveSrv.Serve(lis)
	t.Cleanup(liveSrv.Stop)

	u := newUplink(t, Config[req, resp]{Addrs: []string{lis.Addr().String(), deadAddr(t)}})
	start(t, u)
	u.Offer(msg("m1"))
	if got := live.next(t); got != "m1" {
		t.Fatalf("got %q, want m1", got)
	}
	testkit.WaitFor(t, 20*time.Second, "Connected", u.Connected)

	// Restart the server on the same port: close the old one, then listen
	// again. Stop returns after the listener closed, so the port is free.
	liveSrv.Stop()
	testkit.WaitFor(t, 20*time.Second, "disconnect", func() bool { return !u.Connected() })
	liveSrv2 := grpc.NewServer()
	sluicev1.RegisterLoadReportServiceServer(liveSrv2, live)
	lis2, err := net.Listen("tcp", lis.Addr().String())
	if err != nil {
		t.Skipf("could not listen on the same port again: %v", err)
	}
	go liveSrv2.Serve(lis2)
	t.Cleanup(liveSrv2.Stop)

	u.Offer(msg("m2"))
	if got := live.next(t); got != "m2" {
		t.Fatalf("got %q, want m2", got)
	}
	if s := u.Stats(); s.Failovers < 2 {
		t.Errorf("Failovers = %d, want >= 2 (the broken stream and the dead address)", s.Failovers)
	}
}

func TestLatestWins(t *testing.T) {
	srv := newFakeServer(t, answer)
	u := newUplink(t, Config[req, resp]{Addrs: []string{deadAddr(t), srv.addr}})

	// Offered before Run: nothing can be sent, each one replaces the last.
	const n = 100
	for i := range n {
		u.Offer(msg(fmt.Sprint(i)))
	}
	if s := u.Stats(); s.Superseded != n-1 {
		t.Fatalf("Superseded = %d, want %d", s.Superseded, n-1)
	}
	start(t, u)
	if got, want := srv.next(t), fmt.Sprint(n-1); got != want {
		t.Fatalf("first message sent = %q, want the last offered %q", got, want)
	}
	// Nothing else of the first batch follows: the next message the server
	// reads is one offered afterwards.
	u.Offer(msg("after"))
	if got := srv.next(t); got != "after" {
		t.Fatalf("second message sent = %q, want %q", got, "after")
	}
	// A message counts as sent once its Send has returned, which may be
	// just after the server read it.
	testkit.WaitFor(t, 20*time.Second, "the second message counted as sent", func() bool { return u.Stats().Sent >= 2 })
	if s := u.Stats(); s.Sent != 2 || s.Superseded != n-1 {
		t.Errorf("Stats = %+v, want Sent 2, Superseded %d", s, n-1)
	}
}

func TestOfferNeverBlocks(t *testing.T) {
	srv := newFakeServer(t, stall)
	u := newUplink(t, Config[req, resp]{Addrs: []string{srv.addr}})
	start(t, u)
	testkit.WaitFor(t, 20*time.Second, "a stream", func() bool { return u.Stats().Streams >= 1 })

	// Big messages fill the stream's flow-control window quickly, so Send
	// blocks; Offer must go on returning. The test passes by completing.
	peers := make([]*sluicev1.PeerCounts, 200)
	for i := range peers {
		peers[i] = &sluicev1.PeerCounts{Peer: strings.Repeat("p", 40) + fmt.Sprint(i), Offered: 1}
	}
	const n = 10000
	for i := range n {
		u.Offer(&req{Report: &sluicev1.LoadReport{SidecarId: fmt.Sprint(i), Peers: peers}})
	}
	s := u.Stats()
	if s.Superseded == 0 || s.Sent >= n {
		t.Errorf("Stats = %+v: want a stalled stream (Sent < %d) and superseded messages", s, n)
	}
}

func TestRunStopsWithoutLeaks(t *testing.T) {
	srv := newFakeServer(t, answer)
	before := runtime.NumGoroutine()

	u := newUplink(t, Config[req, resp]{
		Addrs:           []string{deadAddr(t), srv.addr},
		ResponseTimeout: time.Minute, // include the watchdog goroutine
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()
	u.Offer(msg("m1"))
	srv.next(t)
	testkit.WaitFor(t, 20*time.Second, "Connected", u.Connected)

	if err := u.Run(ctx); err == nil {
		t.Error("a second concurrent Run returned nil, want an error")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of cancel")
	}
	if u.Connected() {
		t.Error("Connected after Run returned")
	}
	// Run's own goroutines are gone when it returns; gRPC's client and the
	// server's handler for the cancelled stream wind down asynchronously.
	deadline := time.Now().Add(20 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before Run, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestResponsesReachOnResponse(t *testing.T) {
	srv := newFakeServer(t, answer)
	got := make(chan bool, 10)
	u := newUplink(t, Config[req, resp]{
		Addrs:      []string{srv.addr},
		OnResponse: func(r *resp) { got <- r.GetAccepted() },
	})
	start(t, u)
	u.Offer(msg("m1"))
	select {
	case ok := <-got:
		if !ok {
			t.Error("response not accepted")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no response in 20s")
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config[req, resp]{Addrs: []string{"ok", ""}, BackoffMin: -1})
	if err == nil {
		t.Fatal("New accepted a bad config")
	}
	for _, field := range []string{"Addrs[1]", "Open", "BackoffMin"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if _, err := New(Config[req, resp]{}); err == nil || !strings.Contains(err.Error(), "Addrs") {
		t.Errorf("New without Addrs: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	u := newUplink(t, Config[req, resp]{Addrs: []string{"x"}, BackoffMin: 100 * time.Millisecond, BackoffMax: 5 * time.Second})
	for _, tc := range []struct {
		attempt int
		full    time.Duration // the un-jittered wait; the jittered one is in [full/2, full]
	}{
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{5, 3200 * time.Millisecond},
		{6, 5 * time.Second},
		{1000, 5 * time.Second},
	} {
		for range 100 {
			if d := u.backoff(tc.attempt); d < tc.full/2 || d > tc.full {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", tc.attempt, d, tc.full/2, tc.full)
			}
		}
	}
}

func TestSendErrorPutsMessageBack(t *testing.T) {
	// A stream whose Send fails must not lose the message.
	srv := newFakeServer(t, answer)
	var calls int
	var mu sync.Mutex
	u := newUplink(t, Config[req, resp]{
		Addrs: []string{srv.addr},
		Open: func(ctx context.Context, cc grpc.ClientConnInterface) (grpc.BidiStreamingClient[req, resp], error) {
			s, err := openLoad(ctx, cc)
			mu.Lock()
			defer mu.Unlock()
			calls++
			if err == nil && calls == 1 {
				return failingSend{s}, nil
			}
			return s, err
		},
	})
	u.Offer(msg("m1"))
	start(t, u)
	if got := srv.next(t); got != "m1" {
		t.Fatalf("got %q, want m1", got)
	}
}

type failingSend struct {
	grpc.BidiStreamingClient[req, resp]
}

func (failingSend) Send(*req) error { return errors.New("broken pipe") }
