package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	sluicehealth "github.com/sluicehq/sluice/pkg/health"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// startHealthServer serves the gRPC health service on loopback behind s's
// interceptors and returns a client for it.
func startHealthServer(t *testing.T, s *ServiceLimiter, opts GRPCOptions) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(s.UnaryServerInterceptor(opts)),
		grpc.StreamInterceptor(s.StreamServerInterceptor(opts)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer()) // reports SERVING for ""
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestGRPCInterceptors(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "greedy", DropRatio: 0.99, LimitRPS: 50, AllowedRPS: 50},
		Rule{Peer: "shadowed", DropRatio: 0.99, Mode: dropratio.Shadow, LimitRPS: 50, AllowedRPS: 50},
	))
	s := l.Service("checkout")
	defaultClient := startHealthServer(t, s, GRPCOptions{})
	customClient := startHealthServer(t, s, GRPCOptions{CallerHeader: "X-My-Caller"})

	for _, tc := range []struct {
		name    string
		client  healthpb.HealthClient
		key     string
		caller  string // "" sends no metadata
		peer    string // whom the call counts as
		dropped bool
	}{
		{"dropped", defaultClient, "x-sluice-caller", "greedy", "greedy", true},
		{"unlisted admitted", defaultClient, "x-sluice-caller", "polite", "polite", false},
		{"shadow admitted", defaultClient, "x-sluice-caller", "shadowed", "shadowed", false},
		{"no metadata is unknown", defaultClient, "", "", "unknown", false},
		{"custom key dropped", customClient, "x-my-caller", "greedy", "greedy", true},
		{"custom key ignores default", customClient, "x-sluice-caller", "greedy", "unknown", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.caller != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, tc.key, tc.caller)
			}
			before := counts(l, "checkout", tc.peer)

			resp, err := tc.client.Check(ctx, &healthpb.HealthCheckRequest{})
			checkRPC(t, "unary", tc.caller, err, tc.dropped)
			if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("unary: status %v", resp.GetStatus())
			}

			stream, err := tc.client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			// A server stream's status arrives with the first Recv.
			resp, err = stream.Recv()
			checkRPC(t, "stream", tc.caller, err, tc.dropped)
			if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("stream: status %v", resp.GetStatus())
			}

			after := counts(l, "checkout", tc.peer)
			if after.Offered-before.Offered != 2 {
				t.Errorf("peer %q: %d calls counted, want 2", tc.peer, after.Offered-before.Offered)
			}
		})
	}
}

// checkRPC checks a call's outcome: success, or a drop of caller's with
// the message and a RetryInfo of 7s, what a ratio of 0.99 gets (retryAfter).
func checkRPC(t *testing.T, kind, caller string, err error, dropped bool) {
	t.Helper()
	if !dropped {
		if err != nil {
			t.Errorf("%s: %v, want success", kind, err)
		}
		return
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED", kind, err)
	}
	if want := "call from caller " + caller + " to service checkout was rate limited by sluice"; st.Message() != want {
		t.Errorf("%s: message %q, want %q", kind, st.Message(), want)
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	if info == nil || info.GetRetryDelay().AsDuration() != 7*time.Second {
		t.Errorf("%s: details %v, want RetryInfo of 7s", kind, st.Details())
	}
}

// The unary interceptor counts what the app did with each call it let
// through, as the proxy does for a proxied request (issue #18): its
// latency on health's scale and its outcome from the returned status,
// per procedure; a dropped call is not the app's and is not counted.
func TestGRPCInterceptorHealth(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: 1, LimitRPS: 0, AllowedRPS: 0}))
	intercept := l.Service("checkout").UnaryServerInterceptor(GRPCOptions{})
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Checkout/Pay"}
	call := func(caller string, err error, took time.Duration) error {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultCallerHeader, caller))
		_, got := intercept(ctx, nil, info, func(context.Context, any) (any, error) {
			time.Sleep(took)
			return nil, err
		})
		return got
	}
	for range 3 {
		if err := call("web", nil, 30*time.Millisecond); err != nil {
			t.Fatalf("an admitted call: %v", err)
		}
	}
	if err := call("web", status.Error(codes.Unavailable, "down"), 0); status.Code(err) != codes.Unavailable {
		t.Fatalf("the handler's error %v, want it passed on", err)
	}
	if err := call("web", status.Error(codes.DeadlineExceeded, "slow"), 0); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the handler's error %v, want it passed on", err)
	}
	if err := call("web", status.Error(codes.NotFound, "no such order"), 0); status.Code(err) != codes.NotFound {
		t.Fatalf("the handler's error %v, want it passed on", err)
	}
	// A bare context error is the caller's: grpc-go answers CANCELLED
	// (not counted) or DEADLINE_EXCEEDED (late), not UNKNOWN (failed).
	if err := call("web", context.Canceled, 0); err != context.Canceled {
		t.Fatalf("the handler's error %v, want it passed on", err)
	}
	if err := call("web", fmt.Errorf("query: %w", context.DeadlineExceeded), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the handler's error %v, want it passed on", err)
	}
	if err := call("greedy", nil, 0); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("greedy's call: %v, want it dropped", err)
	}
	hs := l.TakeHealth("checkout", nil)
	if len(hs) != 1 {
		t.Fatalf("health %+v, want one procedure's", hs)
	}
	h := hs[0]
	// No procedures declared: every call is the callee's ("").
	if h.Procedure != "" || h.OK != 4 || h.Failed != 1 || h.Late != 2 || h.InFlight != 0 {
		t.Errorf("health %+v: want 4 ok (NOT_FOUND is the caller's), 1 failed, 2 late, none in flight (a cancelled call is not counted)", h)
	}
	var slow uint64
	for b := sluicehealth.Bucket(25 * time.Millisecond); b < sluicehealth.Buckets; b++ {
		slow += h.Latency[b]
	}
	if slow < 3 {
		t.Errorf("%d answers at 25ms or slower, want the 3 calls that took 30ms: %v", slow, h.Latency)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultCallerHeader, "web"))
	ok := func(context.Context, any) (any, error) { return nil, nil }
	// The one allocation is grpc-go's copy of the caller's metadata value
	// (metadata.ValueFromIncomingContext), there before health was: the
	// counting adds none.
	if got := testing.AllocsPerRun(1000, func() { _, _ = intercept(ctx, nil, info, ok) }); got > 1 {
		t.Errorf("an admitted call allocates %v times in the interceptor, want 1 (grpc-go's copy of the caller)", got)
	}
}
