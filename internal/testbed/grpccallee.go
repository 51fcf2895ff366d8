package testbed

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/sidecar"
)

// GRPCCallee is one instance of the cluster's service as a gRPC server that
// runs sluice in process, the way an app embeds the sidecar library: the
// inbound server interceptors of a Limiter fed by an xDS client subscribed
// to "callee/<service>", counted by a reporter that reports INBOUND loads to
// its zone's aggregator, in front of the standard health service and of
// every other method, which answers an empty message with one. It is
// what a proxyless gRPC client of the service calls, so that the callee
// side of its buckets is counted (docs/dataplanes.md).
type GRPCCallee struct {
	*Node
	Limiter *sidecar.Limiter

	mu       sync.Mutex // guards received and methods
	received map[string]int
	methods  map[[2]string]int // (caller, full method) → calls
}

// Received is how many calls from caller (the interceptors' caller header;
// "" for none) reached the app, health service or other method: those
// sluice admitted.
func (g *GRPCCallee) Received(caller string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.received[caller]
}

// ReceivedMethod is how many calls of fullMethod from caller reached the
// app.
func (g *GRPCCallee) ReceivedMethod(caller, fullMethod string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.methods[[2]string{caller, fullMethod}]
}

func (g *GRPCCallee) receive(ctx context.Context, key, method string) {
	var caller string
	if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
		caller = v[0]
	}
	g.mu.Lock()
	g.received[caller]++
	g.methods[[2]string{caller, method}]++
	g.mu.Unlock()
}

// StartGRPCCallee serves instance id of the cluster's service on ln, in
// zone (one of the cluster's zones), with opts for the interceptors. ln is
// the caller's, bound beforehand, so that its address can be in the
// controller's proxyless endpoints (Options.Controller.Proxyless) before
// the cluster starts; the callee closes it when it stops. Close stops the
// callee with the rest of the cluster.
func (c *Cluster) StartGRPCCallee(ln net.Listener, id, zone string, opts sidecar.GRPCOptions) (*GRPCCallee, error) {
	service := c.opts.Service
	e, err := c.embed(id, zone, service, sidecar.Inbound)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("start gRPC callee %s: %w", id, err)
	}
	log, reg, lim := e.log, e.reg, e.lim
	in := lim.Service(service)

	gc := &GRPCCallee{Limiter: lim, received: map[string]int{}, methods: map[[2]string]int{}}
	key := strings.ToLower(cmp.Or(opts.CallerHeader, sidecar.DefaultCallerHeader)) // as the interceptors read it
	count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		gc.receive(ctx, key, info.FullMethod)
		return h(ctx, req)
	}
	// Any other method: one empty message in, one out, as a unary call of
	// a method with empty messages would be.
	anyMethod := func(_ any, st grpc.ServerStream) error {
		m, _ := grpc.MethodFromServerStream(st)
		gc.receive(st.Context(), key, m)
		if err := st.RecvMsg(new(emptypb.Empty)); err != nil {
			return err
		}
		return st.SendMsg(new(emptypb.Empty))
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor(opts), count),
		grpc.StreamInterceptor(in.StreamServerInterceptor(opts)), grpc.UnknownServiceHandler(anyMethod))
	healthpb.RegisterHealthServer(g, health.NewServer())
	serve := func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- g.Serve(ln) }() // owned: waited for below
		select {
		case <-ctx.Done():
			g.Stop()
			<-errc
			return nil
		case err := <-errc:
			return fmt.Errorf("serve gRPC: %w", err)
		}
	}

	n, err := run(id, &process.Process{
		Logger: log,
		Admin:  admin.New(reg, nil), AdminAddr: "127.0.0.1:0",
		Workers:         append([]func(context.Context) error{serve}, e.workers...),
		ShutdownTimeout: 2 * time.Second,
	}, 1)
	if err != nil {
		ln.Close()
		return nil, err
	}
	n.Addr = ln.Addr().String()
	gc.Node = n
	c.mu.Lock()
	c.grpcCallees = append(c.grpcCallees, gc)
	c.mu.Unlock()
	return gc, nil
}
