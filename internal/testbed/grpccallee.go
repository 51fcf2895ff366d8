package testbed

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/names"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
	"github.com/sluicehq/sluice/sidecar/xdsclient"
)

// GRPCCallee is one instance of the cluster's service as a gRPC server that
// runs sluice in process, the way an app embeds the sidecar library: the
// inbound server interceptors of a Limiter fed by an xDS client subscribed
// to "callee/<service>", counted by a reporter that reports INBOUND loads to
// its zone's aggregator, in front of the standard health service. It is
// what a proxyless gRPC client of the service calls, so that the callee
// side of its buckets is counted (docs/dataplanes.md).
type GRPCCallee struct {
	*Node
	Limiter *sidecar.Limiter

	mu       sync.Mutex // guards received
	received map[string]int
}

// Received is how many calls from caller (the interceptors' caller header;
// "" for none) reached the health service: those sluice admitted.
func (g *GRPCCallee) Received(caller string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.received[caller]
}

// StartGRPCCallee serves instance id of the cluster's service on ln, in
// zone (one of the cluster's zones), with opts for the interceptors. ln is
// the caller's, bound beforehand, so that its address can be in the
// controller's proxyless endpoints (Options.Controller.Proxyless) before
// the cluster starts; the callee closes it when it stops. Close stops the
// callee with the rest of the cluster.
func (c *Cluster) StartGRPCCallee(ln net.Listener, id, zone string, opts sidecar.GRPCOptions) (*GRPCCallee, error) {
	zi := -1
	for i, z := range c.opts.Zones {
		if z == zone {
			zi = i
		}
	}
	if zi < 0 {
		ln.Close()
		return nil, fmt.Errorf("start gRPC callee %s: zone %q is not one of %v", id, zone, c.opts.Zones)
	}
	service := c.opts.Service
	log := c.log.With("node", id)
	reg := prometheus.NewRegistry()
	lim := sidecar.NewLimiter(sidecar.LimiterOptions{})
	in := lim.Service(service)
	reg.MustRegister(lim.Collector())

	xds, err := xdsclient.New(xdsclient.Config{
		Servers:    []string{c.ControllerAddr},
		NodeID:     id,
		Cluster:    service,
		Zone:       zone,
		Resources:  []string{names.Callee(service)},
		Protocol:   xdsclient.Delta,
		Logger:     log,
		Registerer: reg,
	}, sidecar.Installer{Limiter: lim, Service: service, Direction: sidecar.Inbound})
	if err != nil {
		ln.Close()
		return nil, err
	}
	rep, err := reporter.New(reporter.Config{
		SidecarID:   id,
		Service:     service,
		Zone:        zone,
		Direction:   sluicev1.Direction_DIRECTION_INBOUND,
		Interval:    c.opts.ReportInterval,
		Aggregators: []string{c.Aggregators[zi].Addr, c.Aggregators[(zi+1)%len(c.Aggregators)].Addr},
		Logger:      log,
		Registerer:  reg,
	}, lim)
	if err != nil {
		ln.Close()
		return nil, err
	}

	gc := &GRPCCallee{Limiter: lim, received: map[string]int{}}
	key := strings.ToLower(cmp.Or(opts.CallerHeader, sidecar.DefaultCallerHeader)) // as the interceptors read it
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		var caller string
		if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
			caller = v[0]
		}
		gc.mu.Lock()
		gc.received[caller]++
		gc.mu.Unlock()
		return h(ctx, req)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(in.UnaryServerInterceptor(opts), count),
		grpc.StreamInterceptor(in.StreamServerInterceptor(opts)))
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
		Workers: []func(context.Context) error{serve, xds.Run, rep.Run, func(ctx context.Context) error {
			// The policy's TTL clock, as the sidecar agent keeps it.
			tick := time.NewTicker(sidecar.ExpiryPeriod)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case now := <-tick.C:
					lim.Expire(now)
				}
			}
		}},
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
