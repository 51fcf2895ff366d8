package scale

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/xdsserver"
	"github.com/sluicehq/sluice/pkg/liveness"
	"github.com/sluicehq/sluice/sidecar/xdsclient"
)

// XDSResult is what publishing into a real xDS server measured: every tick's
// changed policies go through xdsserver.Server.Update to real sidecar xDS
// clients (delta, one named subscription each) over in-memory gRPC
// connections. Server and clients share this process and its cores, so the
// delivery time includes the clients' decoding and ACKs.
type XDSResult struct {
	Streams  int // client streams
	Services int // services with at least one subscribed stream
	// Updates is the time xdsserver.Server.Update took, per tick that
	// published; Delivery, from the start of Update until every subscribed
	// client had every resource of the tick.
	Updates, Delivery Samples
	// Deliveries counts resources delivered to clients.
	Deliveries int64
}

// pipeSize is the buffer of each direction of each in-memory connection.
// bufconn allocates it for each direction of each connection, and the 1 MiB
// of its examples, 2 MiB a client, filled this machine's 24 GiB at 10,000
// clients. Writers block when it is full, as
// on a socket, so a small one only costs a few more hand-offs.
const pipeSize = 32 << 10

// deliveryTimeout bounds the wait for one tick's deliveries.
const deliveryTimeout = time.Minute

type xdsProbe struct {
	res      XDSResult
	srv      *xdsserver.Server
	g        *grpc.Server
	lis      *bufconn.Listener
	cancel   context.CancelFunc
	clients  sync.WaitGroup // the clients' Run loops
	serving  sync.WaitGroup // the gRPC server's Serve
	watchers map[string]int // resource name → streams subscribed to it
	got      chan struct{}  // one per resource a client received
	closed   bool
}

// startXDS starts a real xdsserver.Server on an in-memory listener and n
// real xdsclient.Clients, each subscribed by name to the policy of the
// service whose sidecar it stands for. The clients wait for the server's
// first Update (the server holds streams until it has a table).
func startXDS(ctx context.Context, m *mesh, n int) (*xdsProbe, error) {
	ctx, cancel := context.WithCancel(ctx)
	x := &xdsProbe{
		res:      XDSResult{Streams: n},
		srv:      xdsserver.New(ctx, xdsserver.Options{}),
		g:        grpc.NewServer(liveness.ServerOptions()...),
		lis:      bufconn.Listen(pipeSize),
		cancel:   cancel,
		watchers: map[string]int{},
		got:      make(chan struct{}, n),
	}
	x.srv.Register(x.g)
	x.serving.Add(1)
	go func() {
		defer x.serving.Done()
		_ = x.g.Serve(x.lis) // returns once close stops the server
	}()
	dial := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return x.lis.DialContext(ctx) })
	for k := range n {
		// Client k stands for sidecar k·len(sidecars)/n: the clients are a
		// sample of the fleet, so big services get more of them, and with
		// one client per sidecar they are the fleet.
		s := &m.services[m.sidecarService(k*len(m.sidecars)/n)]
		c, err := xdsclient.New(xdsclient.Config{
			// An IP literal needs no resolving; the dialer above ignores it
			// and connects to the in-memory listener.
			Servers:     []string{"127.0.0.1:1"},
			NodeID:      fmt.Sprintf("xds-probe-%06d", k),
			Cluster:     s.name,
			Resources:   []string{s.policy},
			DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), dial},
		}, counter{ctx: ctx, got: x.got})
		if err != nil {
			x.close()
			return nil, fmt.Errorf("xds client %d: %w", k, err)
		}
		if x.watchers[s.policy] == 0 {
			x.res.Services++
		}
		x.watchers[s.policy]++
		x.clients.Add(1)
		go func() {
			defer x.clients.Done()
			_ = c.Run(ctx) // returns nil once ctx is done
		}()
	}
	return x, nil
}

// publish sends one tick's changes and waits until every subscribed client
// has them.
func (x *xdsProbe) publish(changed map[string]*sluicev1.DropPolicy, deleted []string) error {
	want := 0
	for name := range changed {
		want += x.watchers[name]
	}
	for _, name := range deleted {
		want += x.watchers[name]
	}
	t0 := time.Now()
	if err := x.srv.Update(changed, deleted); err != nil {
		return fmt.Errorf("xds update: %w", err)
	}
	x.res.Updates = append(x.res.Updates, time.Since(t0))
	timer := time.NewTimer(deliveryTimeout)
	defer timer.Stop()
	for got := range want {
		select {
		case <-x.got:
		case <-timer.C:
			return fmt.Errorf("xds: %d of %d deliveries within %v", got, want, deliveryTimeout)
		}
	}
	x.res.Delivery = append(x.res.Delivery, time.Since(t0))
	x.res.Deliveries += int64(want)
	return nil
}

// close stops the clients, then the server, and waits for the clients.
// Idempotent.
func (x *xdsProbe) close() {
	if x.closed {
		return
	}
	x.closed = true
	x.cancel()
	x.clients.Wait()
	x.g.Stop()
	_ = x.lis.Close()
	x.serving.Wait()
}

func xdsResult(x *xdsProbe) *XDSResult {
	if x == nil {
		return nil
	}
	r := x.res
	return &r
}

// counter is the clients' handler: it only signals each resource received.
type counter struct {
	ctx context.Context
	got chan<- struct{}
}

func (c counter) Update(string, *sluicev1.DropPolicy) error {
	c.signal()
	return nil
}

func (c counter) Remove(string) { c.signal() }

func (c counter) signal() {
	select {
	case c.got <- struct{}{}:
	case <-c.ctx.Done():
	}
}
