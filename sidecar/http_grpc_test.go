package sidecar

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/agent/proxy"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// proxiedHealth is the sidecar binary's data path on loopback: a gRPC client
// → proxy.NewServer (h2c) → s.Middleware → proxy.Proxy → a grpc.Server with
// the health service and no interceptors, so only the middleware can drop.
type proxiedHealth struct {
	client  healthpb.HealthClient
	addr    string       // the proxy's listen address
	reached atomic.Int64 // calls that reached the app
}

func startProxiedHealth(t *testing.T, s *ServiceLimiter) *proxiedHealth {
	t.Helper()
	return startProxiedHealthOpts(t, s, HTTPOptions{})
}

// startProxiedHealthOpts is startProxiedHealth with the middleware's options.
func startProxiedHealthOpts(t *testing.T, s *ServiceLimiter, opts HTTPOptions) *proxiedHealth {
	t.Helper()
	ph := &proxiedHealth{}

	appLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			ph.reached.Add(1)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			ph.reached.Add(1)
			return h(srv, ss)
		}),
	)
	healthpb.RegisterHealthServer(app, health.NewServer()) // reports SERVING for ""
	appServed := make(chan error, 1)
	go func() { appServed <- app.Serve(appLis) }()
	t.Cleanup(func() {
		app.Stop()
		if err := <-appServed; err != nil {
			t.Errorf("app Serve: %v", err)
		}
	})

	p, err := proxy.New(&url.URL{Scheme: "http", Host: appLis.Addr().String()}, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ph.addr = lis.Addr().String()
	srv := proxy.NewServer(ph.addr, s.Middleware(p, opts))
	srv.ErrorLog = log.New(io.Discard, "", 0)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("proxy Serve: %v", err)
		}
	})

	conn, err := grpc.NewClient(ph.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ph.client = healthpb.NewHealthClient(conn)
	return ph
}

// TestMiddlewareGRPCEndToEnd runs real gRPC calls through the middleware
// in front of the reverse proxy: a dropped call must fail the way the
// interceptors fail it, RESOURCE_EXHAUSTED with a RetryInfo, not as an
// HTTP 429 that a gRPC client can only report as UNAVAILABLE.
func TestMiddlewareGRPCEndToEnd(t *testing.T) {
	// Diffuse (the default) at 0.99 drops the first 50 requests of each of
	// a peer's counter stripes: every call of "greedy" here is dropped.
	l := NewLimiter(LimiterOptions{Strategy: Diffuse})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "greedy", DropRatio: 0.99, LimitRPS: 50, AllowedRPS: 42.9},
		Rule{Peer: "shadowed", DropRatio: 0.99, Mode: dropratio.Shadow, LimitRPS: 5, AllowedRPS: 5},
	))
	s := l.Service("checkout")
	ph := startProxiedHealth(t, s)
	// What the interceptors return for greedy, to compare the wire form
	// with: at 0.99, a RetryInfo of 7s (retryAfter).
	wantStatus := status.Convert(renderGRPC("checkout", s.Policy().Rule("greedy"), 7)).Proto()

	for _, tc := range []struct {
		name    string
		caller  string // "" sends no metadata
		peer    string // whom the call counts as
		dropped bool
	}{
		{"dropped", "greedy", "greedy", true},
		{"unlisted admitted", "polite", "polite", false},
		{"shadow admitted", "shadowed", "shadowed", false},
		{"no metadata is unknown and unlisted", "", "unknown", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.caller != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, tc.caller)
			}
			before, reachedBefore := counts(l, "checkout", tc.peer), ph.reached.Load()

			var trailer metadata.MD
			resp, err := ph.client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			checkRPC(t, "unary", tc.caller, err, tc.dropped)
			if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("unary: status %v", resp.GetStatus())
			}
			if tc.dropped {
				checkDroppedCall(t, "unary", err, trailer, wantStatus)
			}

			streamCtx, cancelStream := context.WithCancel(ctx)
			defer cancelStream()
			stream, err := ph.client.Watch(streamCtx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			// A server stream's status arrives with the first Recv.
			resp, err = stream.Recv()
			checkRPC(t, "stream", tc.caller, err, tc.dropped)
			if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("stream: status %v", resp.GetStatus())
			}
			if tc.dropped {
				checkDroppedCall(t, "stream", err, stream.Trailer(), wantStatus)
			}
			cancelStream() // end an admitted Watch

			after := counts(l, "checkout", tc.peer)
			if got := after.Offered - before.Offered; got != 2 {
				t.Errorf("peer %q: %d calls counted, want 2", tc.peer, got)
			}
			wantDropped, wantReached := uint64(0), int64(2)
			if tc.dropped {
				wantDropped, wantReached = 2, 0
			}
			if got := after.Dropped - before.Dropped; got != wantDropped {
				t.Errorf("peer %q: %d calls counted as dropped, want %d", tc.peer, got, wantDropped)
			}
			if got := ph.reached.Load() - reachedBefore; got != wantReached {
				t.Errorf("%d calls reached the app, want %d", got, wantReached)
			}
		})
	}

	// The same port still answers plain HTTP with a 429.
	t.Run("HTTP/1.1 on the same port", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ph.addr+"/orders", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(DefaultCallerHeader, "greedy")
		client := &http.Client{Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Grpc-Status") != "" {
			t.Errorf("got %d %v %q, want a plain 429", resp.StatusCode, resp.Header, body)
		}
	})
}

// checkDroppedCall checks what checkRPC does not: that the client decoded
// exactly the interceptors' status (code, message, details), and that the
// rate-limit headers arrived with it, as trailers of a trailers-only
// response.
func checkDroppedCall(t *testing.T, kind string, err error, trailer metadata.MD, want proto.Message) {
	t.Helper()
	if got := status.Convert(err).Proto(); !proto.Equal(got, want) {
		t.Errorf("%s: status %v, want %v", kind, got, want)
	}
	for _, h := range []struct{ key, want string }{
		{"retry-after", "7"}, // 0.99
		{"ratelimit", `"sluice";r=0;t=7`},
		{"ratelimit-policy", `"sluice";q=42;w=1`},
		{"x-envoy-ratelimited", "true"},
	} {
		if got := trailer.Get(h.key); len(got) != 1 || got[0] != h.want {
			t.Errorf("%s: trailer %s = %q, want %q (all: %v)", kind, h.key, got, h.want, trailer)
		}
	}
}

// TestMiddlewareGRPCMessageEncoding checks grpc-message against a real
// client's decoder. A client reads the status from grpc-status-details-bin
// when it is there, so this needs a status without it: a service name that
// is not valid UTF-8 makes the google.rpc.Status unmarshallable, and the
// details are left out, as grpc-go's server leaves them out. The name also
// has non-ASCII letters and a '%', which must come back as they were; the
// invalid byte comes back as U+FFFD.
func TestMiddlewareGRPCMessageEncoding(t *testing.T) {
	const service = "zürich-100%-\xff"
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy(service, Rule{Peer: "greedy", DropRatio: 0.99}))
	ph := startProxiedHealth(t, l.Service(service))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, "greedy")
	_, err := ph.client.Check(ctx, &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	want := "call from caller greedy to service zürich-100%-\uFFFD was rate limited by sluice"
	if st.Code() != codes.ResourceExhausted || st.Message() != want || len(st.Details()) != 0 {
		t.Errorf("got %v %q %v, want %v %q without details", st.Code(), st.Message(), st.Details(), codes.ResourceExhausted, want)
	}
}
