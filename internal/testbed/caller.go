package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/agent/proxy"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
	"github.com/sluicehq/sluice/sidecar/xdsclient"
)

// Caller is one instance of a calling service that enforces outbound in
// process, the way an app embeds the sidecar library: an outbound Limiter
// bound to its own service, fed by an xDS client subscribed to
// "caller/<service>", counted by a reporter that reports OUTBOUND loads to
// its zone's aggregator, and an http.Client whose RoundTripper decides every
// call before it leaves.
//
// Its HTTP listener (Node.Addr) stands for the app's own front door: every
// request it receives makes one call to the cluster's service, to one of the
// service's sidecars in turn, and answers with that call's outcome, so a
// load generator aimed at it drives outbound enforcement over the network.
// On path /grpc the call is a gRPC health check through the outbound client
// interceptors, on a ClientConn whose target names the service
// ("passthrough:///checkout", dialled to the sidecar); 200 for OK, 429 for
// RESOURCE_EXHAUSTED, 502 otherwise. On any other path it is an HTTP GET
// through Client, by the service's name (the Host header), answered with
// the call's status.
type Caller struct {
	*Node
	Service string
	Limiter *sidecar.Limiter
	// Client calls through the outbound RoundTripper.
	Client *http.Client

	transport *http.Transport
	conns     []*grpc.ClientConn // one per sidecar of the cluster
	stopOnce  sync.Once
	stopErr   error
}

// StartCaller starts an instance id of caller service in zone (one of the
// cluster's zones: it reports to that zone's aggregator, the next as
// failover). Close stops it with the rest of the cluster.
func (c *Cluster) StartCaller(service, id, zone string) (*Caller, error) {
	e, err := c.embed(id, zone, service, sidecar.Outbound)
	if err != nil {
		return nil, fmt.Errorf("start caller %s: %w", id, err)
	}
	log, reg, lim := e.log, e.reg, e.lim
	out := lim.Service(service)

	transport := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	client := &http.Client{Transport: out.RoundTripper(transport, sidecar.ClientOptions{}), Timeout: 5 * time.Second}
	targets := c.SidecarURLs()
	var conns []*grpc.ClientConn
	closeConns := func() {
		for _, cc := range conns {
			cc.Close()
		}
	}
	for _, sc := range c.Sidecars {
		addr := sc.Addr
		cc, err := grpc.NewClient("passthrough:///"+c.opts.Service,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			}),
			grpc.WithUnaryInterceptor(out.UnaryClientInterceptor(sidecar.ClientOptions{})),
			grpc.WithStreamInterceptor(out.StreamClientInterceptor(sidecar.ClientOptions{})))
		if err != nil {
			closeConns()
			return nil, err
		}
		conns = append(conns, cc)
	}
	var next atomic.Uint64
	front := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/grpc" {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			_, err := healthpb.NewHealthClient(conns[next.Add(1)%uint64(len(conns))]).Check(ctx, &healthpb.HealthCheckRequest{})
			switch status.Code(err) {
			case codes.OK:
				w.WriteHeader(http.StatusOK)
			case codes.ResourceExhausted:
				w.WriteHeader(http.StatusTooManyRequests)
			default:
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, targets[next.Add(1)%uint64(len(targets))]+"/", nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Host = c.opts.Service // as resolved by name in a cluster
		res, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		w.WriteHeader(res.StatusCode)
	})

	n, err := run(id, &process.Process{
		Logger: log,
		Admin:  admin.New(reg, nil), AdminAddr: "127.0.0.1:0",
		HTTP: proxy.NewServer("", front), HTTPAddr: "127.0.0.1:0",
		Workers:         e.workers,
		ShutdownTimeout: 2 * time.Second,
	}, 2)
	if err != nil {
		transport.CloseIdleConnections()
		closeConns()
		return nil, err
	}
	cl := &Caller{Node: n, Service: service, Limiter: lim, Client: client, transport: transport, conns: conns}
	c.mu.Lock()
	c.callers = append(c.callers, cl)
	c.mu.Unlock()
	return cl, nil
}

// Stop shuts the caller down and waits. Later calls return the first's
// result; Cluster.Close stops every caller.
func (cl *Caller) Stop() error {
	cl.stopOnce.Do(func() {
		cl.stopErr = cl.Node.Stop()
		cl.transport.CloseIdleConnections()
		for _, cc := range cl.conns {
			cl.stopErr = errors.Join(cl.stopErr, cc.Close())
		}
	})
	return cl.stopErr
}

// embedded is the sidecar library as an app embeds it for one direction
// of one service: a Limiter fed by an xDS client subscribed to the
// service's policy, counted by a reporter to the zone's aggregator (the
// next zone's as failover), and the policy's TTL clock, as the sidecar
// agent keeps it. Its workers run it.
type embedded struct {
	log     *slog.Logger
	reg     *prometheus.Registry
	lim     *sidecar.Limiter
	workers []func(context.Context) error
}

// embed wires instance id of service in zone (one of the cluster's zones)
// for direction dir.
func (c *Cluster) embed(id, zone, service string, dir sidecar.Direction) (*embedded, error) {
	zi := slices.Index(c.opts.Zones, zone)
	if zi < 0 {
		return nil, fmt.Errorf("zone %q is not one of %v", zone, c.opts.Zones)
	}
	e := &embedded{log: c.log.With("node", id), reg: prometheus.NewRegistry(), lim: sidecar.NewLimiter(sidecar.LimiterOptions{})}
	e.reg.MustRegister(e.lim.Collector())
	resource, sidecarID := names.Callee(service), id
	if dir == sidecar.Outbound {
		// One process may run an inbound sidecar too; the aggregator keys
		// reports by sidecar id, so each direction needs its own.
		resource, sidecarID = names.Caller(service), id+".outbound"
	}
	xds, err := xdsclient.New(xdsclient.Config{
		Servers:    []string{c.ControllerAddr},
		NodeID:     id,
		Cluster:    service,
		Zone:       zone,
		Resources:  []string{resource},
		Protocol:   xdsclient.Delta,
		Logger:     e.log,
		Registerer: e.reg,
	}, sidecar.Installer{Limiter: e.lim, Service: service, Direction: dir})
	if err != nil {
		return nil, err
	}
	rep, err := reporter.New(reporter.Config{
		SidecarID:   sidecarID,
		Service:     service,
		Zone:        zone,
		Direction:   dir,
		Interval:    c.opts.ReportInterval,
		Aggregators: []string{c.Aggregators[zi].Addr, c.Aggregators[(zi+1)%len(c.Aggregators)].Addr},
		Logger:      e.log,
		Registerer:  e.reg,
	}, e.lim)
	if err != nil {
		return nil, err
	}
	expire := func(ctx context.Context) error {
		tick := time.NewTicker(sidecar.ExpiryPeriod)
		defer tick.Stop()
		x := sidecar.Expiry{Limiter: e.lim, Service: service}
		for {
			select {
			case <-ctx.Done():
				return nil
			case now := <-tick.C:
				x.Step(now)
			}
		}
	}
	e.workers = []func(context.Context) error{xds.Run, rep.Run, expire}
	return e, nil
}
