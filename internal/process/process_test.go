package process

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/admin"
)

// TestShutdownOrder checks the order of STYLE.md: not ready before the
// listeners close, listeners closed before workers are cancelled, workers
// stopped before flush.
func TestShutdownOrder(t *testing.T) {
	var mu sync.Mutex
	var events []string
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}

	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	addrs := make(chan net.Addr, 3)
	adminH := admin.New(prometheus.NewRegistry(), nil)
	var adminAddr string
	ctx, cancel := context.WithCancel(context.Background())
	workerStarted := make(chan struct{})
	p := &Process{
		Admin: adminH, AdminAddr: "127.0.0.1:0",
		GRPC: g, GRPCAddr: "127.0.0.1:0",
		Workers: []func(context.Context) error{func(ctx context.Context) error {
			close(workerStarted)
			<-ctx.Done()
			// The gRPC server must be closed by the time workers stop.
			if _, err := net.DialTimeout("tcp", grpcAddrOf(addrs), time.Second); err == nil {
				record("worker saw grpc still open")
			}
			record("worker stopped")
			return nil
		}},
		Drain: []func(){func() {
			// Readiness already fails when streams are drained.
			resp, err := http.Get("http://" + adminAddr + "/readyz")
			if err == nil {
				if resp.StatusCode == http.StatusServiceUnavailable {
					record("not ready")
				}
				resp.Body.Close()
			}
			record("drain")
		}},
		Flush: []func(context.Context) error{func(ctx context.Context) error {
			if ctx.Err() != nil {
				record("flush ctx already done")
			}
			record("flush")
			return nil
		}},
		OnListening: func(name string, a net.Addr) {
			if name == "admin" {
				adminAddr = a.String()
			}
			if name == "grpc" {
				addrs <- a
			}
		},
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-workerStarted:
	case <-time.After(5 * time.Second):
		t.Fatal("worker never started")
	}
	// The gRPC server answers while running.
	addr := <-addrs
	addrs <- addr
	cc, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check while running: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after a clean shutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	want := "not ready,drain,worker stopped,flush"
	if got := strings.Join(events, ","); got != want {
		t.Errorf("events = %s, want %s", got, want)
	}
}

func grpcAddrOf(c chan net.Addr) string {
	a := <-c
	c <- a
	return a.String()
}

func TestWorkerFailureStopsProcess(t *testing.T) {
	boom := errors.New("boom")
	p := &Process{
		Admin: admin.New(prometheus.NewRegistry(), nil), AdminAddr: "127.0.0.1:0",
		DrainDelay: time.Hour, // a failure skips the drain delay
		Workers: []func(context.Context) error{
			func(context.Context) error { return boom },
			func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		},
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Fatalf("Run = %v, want %v", err, boom)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after a worker failed")
	}
}

func TestPortInUseIsAStartError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := &Process{Admin: admin.New(prometheus.NewRegistry(), nil), AdminAddr: ln.Addr().String()}
	err = p.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "listen admin") {
		t.Fatalf("Run = %v, want a listen error naming the admin listener", err)
	}
}

func TestHTTPServerServesAndStops(t *testing.T) {
	addrs := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{
		HTTP: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello")
		})},
		HTTPAddr:    "127.0.0.1:0",
		OnListening: func(name string, a net.Addr) { addrs <- a.String() },
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	addr := <-addrs
	resp, err := http.Get("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello" {
		t.Errorf("body = %q", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("HTTP listener still open after Run returned")
	}
}
