// Package testbed runs a whole sluice loop on loopback inside one process:
// a controller, an aggregator per zone, sidecars in front of an upstream app,
// each a real server on its own 127.0.0.1 port speaking real gRPC and HTTP.
// The demo and the end-to-end tests are built on it.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/agent/proxy"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/process"
	"github.com/sluicehq/sluice/pkg/liveness"
	"github.com/sluicehq/sluice/sidecar"
)

// Options shapes a cluster.
type Options struct {
	// Service is the callee every sidecar fronts.
	Service string
	// Zones get one aggregator each; SidecarsPerZone sidecars report to it.
	Zones           []string
	SidecarsPerZone int
	// NoSidecars starts no sidecars at all, for tests that bring their own
	// callee (StartGRPCCallee).
	NoSidecars bool
	// Limits are the controller's limits.
	Limits *limits.Set
	// Controller configures the controller; zero means its defaults.
	Controller *controller.Config
	// ReportInterval and FlushInterval default to 1s.
	ReportInterval, FlushInterval time.Duration
	// PeerIdle is the sidecars' --peer-idle; zero means its default.
	PeerIdle time.Duration
	// XDSProtocol is "delta" (default) or "sotw".
	XDSProtocol string
	Logger      *slog.Logger
}

// Cluster is a running loop. Methods are safe for concurrent use.
type Cluster struct {
	opts Options
	log  *slog.Logger

	ControllerAddr string
	Aggregators    []*Node
	Sidecars       []*Node
	UpstreamURL    string

	mu         sync.Mutex // protects controller, svc and callers
	controller *Node
	svc        *controller.Service
	callers    []*Caller // see StartCaller

	grpcCallees []*GRPCCallee // see StartGRPCCallee; guarded by mu

	upstream     *http.Server
	upstreamGRPC *grpc.Server // behind upstream, for gRPC calls
}

// Node is one running component.
type Node struct {
	Name      string
	Addr      string // its main listener: gRPC for the tiers, HTTP for sidecars
	AdminAddr string
	Agent     *agent.Agent // sidecars only
	cancel    context.CancelFunc
	done      chan error
}

// Stop shuts the node down in its normal order and waits.
func (n *Node) Stop() error {
	n.cancel()
	return <-n.done
}

// URL is the sidecar's base URL.
func (n *Node) URL() string { return "http://" + n.Addr }

// Start brings up the upstream, the controller, the aggregators and the
// sidecars, in that order, and returns once every listener is bound.
func Start(opts Options) (*Cluster, error) {
	if opts.Service == "" {
		opts.Service = "checkout"
	}
	if len(opts.Zones) == 0 {
		opts.Zones = []string{"zone-a", "zone-b", "zone-c"}
	}
	if opts.SidecarsPerZone == 0 {
		opts.SidecarsPerZone = 2
	}
	if opts.ReportInterval == 0 {
		opts.ReportInterval = time.Second
	}
	if opts.FlushInterval == 0 {
		opts.FlushInterval = time.Second
	}
	if opts.XDSProtocol == "" {
		opts.XDSProtocol = "delta"
	}
	if opts.Limits == nil {
		opts.Limits = limits.Empty
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{opts: opts, log: log}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()

	// The app behind every sidecar answers at once: "ok" to HTTP, and
	// the gRPC health service (SERVING) to gRPC calls, which the sidecars
	// pass on over h2c.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.upstreamGRPC = grpc.NewServer()
	healthpb.RegisterHealthServer(c.upstreamGRPC, health.NewServer())
	c.upstream = proxy.NewServer("", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			c.upstreamGRPC.ServeHTTP(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok\n")
	}))
	go c.upstream.Serve(ln)
	c.UpstreamURL = "http://" + ln.Addr().String()

	if err := c.StartController("127.0.0.1:0"); err != nil {
		return nil, err
	}
	for _, zone := range opts.Zones {
		n, err := c.startAggregator(zone)
		if err != nil {
			return nil, err
		}
		c.Aggregators = append(c.Aggregators, n)
	}
	for zi, zone := range opts.Zones {
		if opts.NoSidecars {
			break
		}
		// Own zone first, the next zone as failover.
		aggs := []string{c.Aggregators[zi].Addr, c.Aggregators[(zi+1)%len(c.Aggregators)].Addr}
		for i := range opts.SidecarsPerZone {
			n, err := c.startSidecar(fmt.Sprintf("%s-%s-%d", opts.Service, zone, i), zone, aggs)
			if err != nil {
				return nil, err
			}
			c.Sidecars = append(c.Sidecars, n)
		}
	}
	ok = true
	return c, nil
}

// run starts p in the background and waits for its listeners.
func run(name string, p *process.Process, wantListeners int) (*Node, error) {
	n := &Node{Name: name, done: make(chan error, 1)}
	addrs := make(chan [2]string, 3)
	p.OnListening = func(l string, a net.Addr) { addrs <- [2]string{l, a.String()} }
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { n.done <- p.Run(ctx) }()
	for range wantListeners {
		select {
		case a := <-addrs:
			if a[0] == "admin" {
				n.AdminAddr = a[1]
			} else {
				n.Addr = a[1]
			}
		case err := <-n.done:
			cancel()
			return nil, fmt.Errorf("start %s: %w", name, err)
		case <-time.After(10 * time.Second):
			cancel()
			return nil, fmt.Errorf("start %s: listeners not bound in time", name)
		}
	}
	return n, nil
}

// StartController starts a controller on addr ("127.0.0.1:0" for any port).
// After StopController, StartController(c.ControllerAddr) brings a fresh one
// up where the old one was, as a restarted pod would.
func (c *Cluster) StartController(addr string) error {
	cfg := controller.DefaultConfig()
	if c.opts.Controller != nil {
		cfg = *c.opts.Controller
	}
	cfg.ID = "controller"
	reg := prometheus.NewRegistry()
	svc, err := controller.New(cfg, limits.Static{Set: c.opts.Limits}, c.log.With("node", "controller"), reg)
	if err != nil {
		return err
	}
	g := grpc.NewServer(append(controller.ServerOptions(), grpc.ChainStreamInterceptor(svc.StreamInterceptor()))...)
	svc.Register(g)
	n, err := run("controller", &process.Process{
		Logger: c.log.With("node", "controller"),
		Admin:  admin.New(reg, svc.Ready), AdminAddr: "127.0.0.1:0",
		GRPC: g, GRPCAddr: addr,
		Workers:         []func(context.Context) error{svc.Run},
		Drain:           []func(){svc.Drain},
		ShutdownTimeout: 2 * time.Second,
	}, 2)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.controller, c.svc = n, svc
	c.ControllerAddr = n.Addr
	c.mu.Unlock()
	return nil
}

// StopController stops the running controller.
func (c *Cluster) StopController() error {
	c.mu.Lock()
	n := c.controller
	c.controller, c.svc = nil, nil
	c.mu.Unlock()
	if n == nil {
		return errors.New("no controller running")
	}
	return n.Stop()
}

// ControllerAdminAddr is the running controller's admin address, "" while
// stopped.
func (c *Cluster) ControllerAdminAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.controller == nil {
		return ""
	}
	return c.controller.AdminAddr
}

// Controller is the running controller service, nil while stopped.
func (c *Cluster) Controller() *controller.Service {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.svc
}

func (c *Cluster) startAggregator(zone string) (*Node, error) {
	cfg := aggregator.DefaultConfig()
	cfg.ID = "agg-" + zone
	cfg.Zone = zone
	cfg.FlushInterval = c.opts.FlushInterval
	cfg.Controllers = []string{c.ControllerAddr}
	reg := prometheus.NewRegistry()
	log := c.log.With("node", cfg.ID)
	svc, err := aggregator.New(cfg, log, reg)
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(liveness.ServerOptions()...)
	svc.Register(g)
	return run(cfg.ID, &process.Process{
		Logger: log,
		Admin:  admin.New(reg, nil), AdminAddr: "127.0.0.1:0",
		GRPC: g, GRPCAddr: "127.0.0.1:0",
		Workers:         []func(context.Context) error{svc.Run},
		Drain:           []func(){svc.Drain},
		ShutdownTimeout: 2 * time.Second,
	}, 2)
}

func (c *Cluster) startSidecar(id, zone string, aggregators []string) (*Node, error) {
	cfg := agent.DefaultConfig()
	cfg.Service = c.opts.Service
	cfg.ID = id
	cfg.Zone = zone
	cfg.Upstream = c.UpstreamURL
	cfg.Aggregators = aggregators
	cfg.Controllers = []string{c.ControllerAddr}
	cfg.XDSProtocol = c.opts.XDSProtocol
	cfg.ReportInterval = c.opts.ReportInterval
	cfg.PeerIdle = c.opts.PeerIdle
	// The cluster's callers (StartCaller) enforce outbound and mark what
	// they decided: the sidecars trust them to.
	cfg.TrustDecided = true
	reg := prometheus.NewRegistry()
	log := c.log.With("node", id)
	a, err := agent.New(cfg, log, reg)
	if err != nil {
		return nil, err
	}
	n, err := run(id, &process.Process{
		Logger: log,
		Admin:  admin.New(reg, a.Ready), AdminAddr: "127.0.0.1:0",
		HTTP: proxy.NewServer("", a.Handler()), HTTPAddr: "127.0.0.1:0", H2C: a.H2C(),
		Workers:         a.Workers(),
		ShutdownTimeout: 2 * time.Second,
	}, 2)
	if err != nil {
		a.Close()
		return nil, err
	}
	n.Agent = a
	return n, nil
}

// SidecarURLs are the sidecars' base URLs, for a load generator.
func (c *Cluster) SidecarURLs() []string {
	urls := make([]string, len(c.Sidecars))
	for i, s := range c.Sidecars {
		urls[i] = s.URL()
	}
	return urls
}

// Policy is the policy the first sidecar holds now, nil if none.
func (c *Cluster) Policy() *sidecar.Policy {
	if len(c.Sidecars) == 0 {
		return nil
	}
	return c.Sidecars[0].Agent.Limiter().Policy(c.opts.Service)
}

// Ratio is the drop ratio the first sidecar applies to caller now.
func (c *Cluster) Ratio(caller string) float64 {
	p := c.Policy()
	if p == nil {
		return 0
	}
	if r := p.Rule(caller); r != nil {
		return r.DropRatio
	}
	return 0
}

// Close stops everything, callers and sidecars first, and waits.
func (c *Cluster) Close() error {
	var errs []error
	c.mu.Lock()
	callers := c.callers
	c.callers = nil
	c.mu.Unlock()
	for _, cl := range callers {
		errs = append(errs, cl.Stop())
	}
	c.mu.Lock()
	callees := c.grpcCallees
	c.grpcCallees = nil
	c.mu.Unlock()
	for _, gc := range callees {
		errs = append(errs, gc.Stop())
	}
	for _, n := range c.Sidecars {
		errs = append(errs, n.Stop())
		n.Agent.Close()
	}
	for _, n := range c.Aggregators {
		errs = append(errs, n.Stop())
	}
	c.mu.Lock()
	ctl := c.controller
	c.controller = nil
	c.mu.Unlock()
	if ctl != nil {
		errs = append(errs, ctl.Stop())
	}
	if c.upstream != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.upstream.Shutdown(ctx)
		cancel()
		c.upstreamGRPC.Stop()
	}
	return errors.Join(errs...)
}
