package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// startDualApp runs an app that speaks HTTP/1.1 and gRPC (over h2c) on one port, as many Go
// services do (grpc.Server.ServeHTTP behind a net/http server), and returns its address.
func startDualApp(t *testing.T) string {
	t.Helper()
	g := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("orders", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		io.WriteString(w, "from the app\n")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); g.Stop() })
	return ln.Addr().String()
}

// TestSidecarPortForwardsGRPC: with the gRPC forwarder (the default), the sidecar's one
// port serves HTTP/1.1 through the middleware and gRPC through the forwarder, both decided
// by the same policy and counted in the same buckets; a gRPC drop is RESOURCE_EXHAUSTED with
// Envoy's x-envoy-ratelimited, the app's answers are recorded for capacity from health, and
// an HTTP/2 client that is not gRPC's is told so, not left hanging.
func TestSidecarPortForwardsGRPC(t *testing.T) {
	app := startDualApp(t)
	cfg := validConfig()
	cfg.Upstream = "http://" + app
	cfg.Controllers = []string{"127.0.0.1:1"} // nobody: the test sets the policy itself
	cfg.Aggregators = []string{"127.0.0.1:1"}
	a, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.H2C() == nil {
		t.Fatal("no gRPC forwarder by default")
	}
	a.Limiter().SetPolicy(&sidecar.Policy{
		Name: names.Callee("checkout"), Service: "checkout", Direction: sidecar.Inbound,
		Peers: []sidecar.Rule{{Peer: "web", DropRatio: 0.5, Mode: dropratio.Enforce, LimitRPS: 100, AllowedRPS: 50, OfferedRPS: 100}},
	})

	addrs := make(chan net.Addr, 3)
	ctx, cancel := context.WithCancel(t.Context())
	p := &process.Process{
		HTTP: a.Server("127.0.0.1:0"), HTTPAddr: "127.0.0.1:0", H2C: a.H2C(),
		ShutdownTimeout: 2 * time.Second,
		OnListening: func(name string, addr net.Addr) {
			if name == "http" {
				addrs <- addr
			}
		},
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidecar process: %v", err)
		}
	}()
	addr := (<-addrs).String()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	const n = 100
	dropped := 0
	for range n {
		var trailer metadata.MD
		cctx := metadata.AppendToOutgoingContext(ctx, "x-sluice-caller", "web")
		res, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: "orders"}, grpc.Trailer(&trailer))
		switch status.Code(err) {
		case codes.OK:
			if res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("admitted call answered %v", res)
			}
		case codes.ResourceExhausted:
			dropped++
			if got := trailer.Get("x-envoy-ratelimited"); len(got) != 1 || got[0] != "true" {
				t.Fatalf("drop's trailer %v, want x-envoy-ratelimited: true", trailer)
			}
		default:
			t.Fatalf("call: %v", err)
		}
	}
	// Error diffusion drops n·p calls give or take 4, half its 8 counter
	// stripes (sidecar.Diffuse): which stripe a call lands on depends on
	// the goroutine that decides it.
	const slack = 4
	if dropped < n/2-slack || dropped > n/2+slack {
		t.Errorf("%d of %d calls dropped at ratio 0.5", dropped, n)
	}

	// HTTP/1.1 on the same port, same bucket.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	req.Header.Set("x-sluice-caller", "web")
	httpDropped := 0
	for range n {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		switch res.StatusCode {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			httpDropped++
		default:
			t.Fatalf("HTTP/1.1 request: %s", res.Status)
		}
	}
	if httpDropped < n/2-slack || httpDropped > n/2+slack {
		t.Errorf("%d of %d HTTP/1.1 requests dropped at ratio 0.5", httpDropped, n)
	}
	var web sidecar.PeerCounts
	for _, c := range a.svc.AppendCounts(nil) {
		if c.Peer == "web" {
			web = c
		}
	}
	if web.Offered != 2*n || web.Dropped != uint64(dropped+httpDropped) {
		t.Errorf("web's bucket counted %d offered, %d dropped; want %d and %d", web.Offered, web.Dropped, 2*n, dropped+httpDropped)
	}
	// Every admitted call and request was the app's to answer, and counted as answered.
	var answered uint64
	for _, h := range a.Limiter().TakeHealth("checkout", nil) {
		answered += h.Counts.OK
	}
	if want := uint64(2*n - dropped - httpDropped); answered != want {
		t.Errorf("health counted %d answers, want the %d admitted", answered, want)
	}

	// An HTTP/2 client that is not gRPC: a clear refusal (415), not a hang or a reset.
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	res, err := h2.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("an HTTP/2 request that is not gRPC: %s, want 415", res.Status)
	}
}
