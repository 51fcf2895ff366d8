package rlscompare

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	gubernator "github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/sidecar/rls"
)

const (
	service  = "checkout"
	limit    = 100 // each caller's limit, requests per second
	replicas = 3
)

// trio is three replicas of one rate limit service, asked in turn.
type trio interface {
	// decide asks replica i%replicas whether one request of caller may
	// go: true admits.
	decide(ctx context.Context, i uint64, caller string) (bool, error)
	close()
}

// sluiceTrio is three sidecars in a loop (an aggregator and a
// controller, in process), each answering ShouldRateLimit from its own
// limiter, as sidecar/rls does next to an Envoy.
type sluiceTrio struct {
	cluster *testbed.Cluster
	servers []*grpc.Server
	conns   []*grpc.ClientConn
	clients []rlsv3.RateLimitServiceClient
	reqs    map[string]*rlsv3.RateLimitRequest
}

func startSluice(tb testing.TB) *sluiceTrio {
	tb.Helper()
	cfg := controller.DefaultConfig()
	cfg.Warmup = time.Second
	c, err := testbed.Start(testbed.Options{
		Service: service, Zones: []string{"zone-a"}, SidecarsPerZone: replicas, Controller: &cfg,
		Limits: limits.NewSet(map[string]*limits.Service{service: {
			Name: service, Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
			Callers: map[string]limits.Bucket{
				"web":   {Limit: limit, Mode: dropratio.Enforce},
				"batch": {Limit: limit, Mode: dropratio.Enforce},
			},
		}}),
	})
	if err != nil {
		tb.Fatal(err)
	}
	s := &sluiceTrio{cluster: c, reqs: map[string]*rlsv3.RateLimitRequest{}}
	for _, caller := range []string{"web", "batch"} {
		s.reqs[caller] = &rlsv3.RateLimitRequest{Domain: service, HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "source_cluster", Value: caller}},
		}}}
	}
	for _, sc := range c.Sidecars {
		svc, err := rls.New(sc.Agent.Limiter().Service(service), rls.DefaultMapping(service), nil)
		if err != nil {
			tb.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		g := grpc.NewServer(rls.ServerOptions()...)
		svc.Register(g)
		go g.Serve(lis)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			tb.Fatal(err)
		}
		s.servers, s.conns = append(s.servers, g), append(s.conns, conn)
		s.clients = append(s.clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	deadline := time.Now().Add(15 * time.Second)
	for c.Policy() == nil {
		if time.Now().After(deadline) {
			s.close()
			tb.Fatal("no policy in 15 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

func (s *sluiceTrio) decide(ctx context.Context, i uint64, caller string) (bool, error) {
	resp, err := s.clients[i%replicas].ShouldRateLimit(ctx, s.reqs[caller])
	if err != nil {
		return false, err
	}
	return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK, nil
}

func (s *sluiceTrio) close() {
	for _, c := range s.conns {
		c.Close()
	}
	for _, g := range s.servers {
		g.Stop()
	}
	s.cluster.Close()
}

// gubernatorTrio is a gubernator cluster of three daemons. Each request is
// one leaky bucket of limit per second, owned by one daemon: the others
// forward to it, in batches (BATCHING, gubernator's default) or one by one
// (NO_BATCHING), or answer from their own copy and sync it every
// GlobalSyncWait (GLOBAL).
type gubernatorTrio struct {
	daemons  []*gubernator.Daemon
	conns    []*grpc.ClientConn
	clients  []gubernator.V1Client
	behavior gubernator.Behavior
}

func startGubernator(tb testing.TB, behavior gubernator.Behavior) *gubernatorTrio {
	tb.Helper()
	logrus.SetLevel(logrus.WarnLevel)
	g := &gubernatorTrio{behavior: behavior}
	var peers []gubernator.PeerInfo
	for i := range replicas {
		// A daemon knows itself among its peers by its advertised
		// address, so it needs its port before it listens (as
		// gubernator's own cluster package does it): without, every
		// daemon took itself for a remote peer.
		addr := freeAddr(tb)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := gubernator.SpawnDaemon(ctx, gubernator.DaemonConfig{
			Logger:            logrus.WithField("instance", i),
			InstanceID:        fmt.Sprint("gubernator-", i),
			GRPCListenAddress: addr,
			AdvertiseAddress:  addr,
			HTTPListenAddress: "127.0.0.1:0",
			// The defaults but for the global sync, as gubernator's own
			// test cluster sets it: 50ms (its default is 100ms). A
			// forwarded BATCHING call waits up to BatchWait (500µs by
			// default) for others to share its batch.
			Behaviors: gubernator.BehaviorConfig{GlobalSyncWait: 50 * time.Millisecond, GlobalTimeout: 5 * time.Second, BatchTimeout: 5 * time.Second},
		})
		cancel()
		if err != nil {
			g.close()
			tb.Fatal(err)
		}
		p := gubernator.PeerInfo{GRPCAddress: d.GRPCListeners[0].Addr().String(), HTTPAddress: d.HTTPListener.Addr().String()}
		d.PeerInfo = p
		peers = append(peers, p)
		g.daemons = append(g.daemons, d)
	}
	for _, d := range g.daemons {
		d.SetPeers(peers)
	}
	for _, p := range peers {
		conn, err := grpc.NewClient(p.GRPCAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			g.close()
			tb.Fatal(err)
		}
		g.conns = append(g.conns, conn)
		g.clients = append(g.clients, gubernator.NewV1Client(conn))
	}
	return g
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (g *gubernatorTrio) decide(ctx context.Context, i uint64, caller string) (bool, error) {
	resp, err := g.clients[i%replicas].GetRateLimits(ctx, &gubernator.GetRateLimitsReq{Requests: []*gubernator.RateLimitReq{{
		Name: service, UniqueKey: caller, Hits: 1, Limit: limit, Duration: 1000,
		Algorithm: gubernator.Algorithm_LEAKY_BUCKET, Behavior: g.behavior,
	}}})
	if err != nil {
		return false, err
	}
	r := resp.GetResponses()[0]
	if r.GetError() != "" {
		return false, fmt.Errorf("gubernator: %s", r.GetError())
	}
	return r.GetStatus() == gubernator.Status_UNDER_LIMIT, nil
}

// close stops the daemons, all at once, after the test's clients: with
// the clients open and one daemon at a time, the GLOBAL trio's teardown
// hung past the test's timeout. A daemon still stopping after
// closeTimeout is left to the process's exit.
func (g *gubernatorTrio) close() {
	for _, c := range g.conns {
		c.Close()
	}
	var wg sync.WaitGroup
	for _, d := range g.daemons {
		wg.Go(d.Close)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeTimeout):
	}
}

const closeTimeout = 10 * time.Second

// systems are the trios compared, by name. holds says whether TestAccuracy
// asserts that the trio holds the limit: gubernator's GLOBAL behaviour
// answers from each peer's copy of a bucket the owner updates
// asynchronously, and its leaky bucket's copies do not know what leaked
// since (mailgun/gubernator#218); it is measured, not judged.
var systems = []struct {
	name  string
	start func(testing.TB) trio
	holds bool
}{
	{"sluice", func(tb testing.TB) trio { return startSluice(tb) }, true},
	{"gubernator", func(tb testing.TB) trio { return startGubernator(tb, gubernator.Behavior_BATCHING) }, true},
	{"gubernator-nobatch", func(tb testing.TB) trio { return startGubernator(tb, gubernator.Behavior_NO_BATCHING) }, true},
	{"gubernator-global", func(tb testing.TB) trio { return startGubernator(tb, gubernator.Behavior_GLOBAL) }, false},
}
