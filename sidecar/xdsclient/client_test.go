package xdsclient_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/xdsserver"
	"github.com/sluicehq/sluice/sidecar/xdsclient"
)

const waitFor = 5 * time.Second

var protocols = []xdsclient.Protocol{xdsclient.Delta, xdsclient.SotW}

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func policy(name string, ratio float64) *sluicev1.DropPolicy {
	svc := name[strings.IndexByte(name, '/')+1:]
	return &sluicev1.DropPolicy{
		Name:    name,
		Service: svc,
		Peers:   []*sluicev1.PeerPolicy{{Peer: "web", DropRatio: ratio}},
	}
}

// recorder is a Handler that remembers every call and rejects policies
// whose first ratio is in reject.
type recorder struct {
	mu      sync.Mutex
	updates map[string][]float64 // every accepted Update's ratio, per name
	calls   int                  // every Update call, rejected ones too
	removes []string
	reject  map[float64]bool
}

func newRecorder(reject ...float64) *recorder {
	r := &recorder{updates: map[string][]float64{}, reject: map[float64]bool{}}
	for _, x := range reject {
		r.reject[x] = true
	}
	return r
}

func (r *recorder) Update(name string, p *sluicev1.DropPolicy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	ratio := p.GetPeers()[0].GetDropRatio()
	if r.reject[ratio] {
		return fmt.Errorf("ratio %v refused by test", ratio)
	}
	r.updates[name] = append(r.updates[name], ratio)
	return nil
}

func (r *recorder) Remove(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removes = append(r.removes, name)
}

// last returns the latest accepted ratio of name and how many were accepted.
func (r *recorder) last(name string) (float64, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.updates[name]
	if len(u) == 0 {
		return -1, 0
	}
	return u[len(u)-1], len(u)
}

func (r *recorder) removed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.removes...)
}

func (r *recorder) waitFor(t *testing.T, name string, ratio float64) {
	t.Helper()
	eventually(t, fmt.Sprintf("Update(%s, %v)", name, ratio), func() bool {
		got, _ := r.last(name)
		return got == ratio
	})
}

// testServer is a real xdsserver on loopback, with a gRPC interceptor that
// records every request the client sends.
type testServer struct {
	xds  *xdsserver.Server
	reg  *prometheus.Registry
	addr string
	g    *grpc.Server
	done chan struct{}
	stop context.CancelFunc

	mu    sync.Mutex
	delta []*discovery.DeltaDiscoveryRequest
	sotw  []*discovery.DiscoveryRequest
}

// startServer serves content on addr ("127.0.0.1:0" for any port).
func startServer(t *testing.T, addr string, content ...*sluicev1.DropPolicy) *testServer {
	t.Helper()
	return startServerWith(t, addr, xdsserver.Options{}, content...)
}

// startServerWith is startServer with the server's options.
func startServerWith(t *testing.T, addr string, opts xdsserver.Options, content ...*sluicev1.DropPolicy) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &testServer{reg: prometheus.NewRegistry(), addr: lis.Addr().String(), done: make(chan struct{}), stop: cancel}
	opts.Registerer = s.reg
	s.xds = xdsserver.New(ctx, opts)
	s.publish(t, content...)
	s.g = grpc.NewServer(grpc.StreamInterceptor(s.intercept))
	s.xds.Register(s.g)
	go func() {
		defer close(s.done)
		_ = s.g.Serve(lis)
	}()
	t.Cleanup(s.close)
	return s
}

// close stops the server and waits for it; it may be called twice.
func (s *testServer) close() {
	s.g.Stop()
	s.stop()
	<-s.done
}

func (s *testServer) publish(t *testing.T, ps ...*sluicev1.DropPolicy) {
	t.Helper()
	changed := make(map[string]*sluicev1.DropPolicy, len(ps))
	for _, p := range ps {
		changed[p.GetName()] = p
	}
	if err := s.xds.Update(changed, nil); err != nil {
		t.Fatal(err)
	}
}

func (s *testServer) metric(name string) float64 { return metric(s.reg, name) }

func (s *testServer) deltaRequests() []*discovery.DeltaDiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DeltaDiscoveryRequest(nil), s.delta...)
}

func (s *testServer) sotwRequests() []*discovery.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), s.sotw...)
}

func (s *testServer) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &recordingStream{ServerStream: ss, s: s})
}

type recordingStream struct {
	grpc.ServerStream
	s *testServer
}

func (r *recordingStream) RecvMsg(m any) error {
	err := r.ServerStream.RecvMsg(m)
	if err != nil {
		return err
	}
	// Cloned before go-control-plane sees it: it writes the node into
	// later requests.
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	switch req := m.(type) {
	case *discovery.DeltaDiscoveryRequest:
		r.s.delta = append(r.s.delta, proto.Clone(req).(*discovery.DeltaDiscoveryRequest))
	case *discovery.DiscoveryRequest:
		r.s.sotw = append(r.s.sotw, proto.Clone(req).(*discovery.DiscoveryRequest))
	}
	return nil
}

// runClient starts a client and stops it when the test ends, failing the
// test if Run does not return in time or returns an error.
func runClient(t *testing.T, cfg xdsclient.Config, h xdsclient.Handler) *xdsclient.Client {
	t.Helper()
	c, stop := startClient(t, cfg, h)
	t.Cleanup(stop)
	return c
}

func startClient(t *testing.T, cfg xdsclient.Config, h xdsclient.Handler) (*xdsclient.Client, func()) {
	t.Helper()
	if cfg.NodeID == "" {
		cfg.NodeID = "pod-1"
	}
	cfg.Cluster, cfg.Zone = "checkout", "z1"
	cfg.BackoffMin, cfg.BackoffMax = 10*time.Millisecond, 100*time.Millisecond
	c, err := xdsclient.New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	return c, func() {
		once.Do(func() {
			cancel()
			timer := time.NewTimer(waitFor)
			defer timer.Stop()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-timer.C:
				t.Error("Run did not return after cancel")
			}
		})
	}
}

func TestSubscribeByName(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			srv := startServer(t, "127.0.0.1:0", policy("callee/a", 0.1), policy("callee/b", 0.2))
			rec := newRecorder()
			c := runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/a"}, Protocol: p}, rec)

			rec.waitFor(t, "callee/a", 0.1)
			eventually(t, "Connected", c.Connected)

			// b alone, then a: a's update arriving proves b's batch went
			// by, and b must not have been delivered.
			srv.publish(t, policy("callee/b", 0.3))
			srv.publish(t, policy("callee/a", 0.4))
			rec.waitFor(t, "callee/a", 0.4)
			if _, n := rec.last("callee/b"); n != 0 {
				t.Fatalf("callee/b delivered %d times; it was not subscribed", n)
			}
			if got, ok := c.Policy("callee/a"); !ok || got.GetPeers()[0].GetDropRatio() != 0.4 {
				t.Fatalf("Policy(callee/a) = %v, %v", got, ok)
			}
			if _, ok := c.Policy("callee/b"); ok {
				t.Fatal("Policy(callee/b) held")
			}
			if n := srv.metric("sluice_controller_xds_nacks_total"); n != 0 {
				t.Fatalf("server saw %v NACKs, want 0", n)
			}
		})
	}
}

func TestHandlerErrorNACKs(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			srv := startServer(t, "127.0.0.1:0", policy("callee/a", 0.1))
			rec := newRecorder(0.66)
			reg := prometheus.NewRegistry()
			c := runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/a"},
				Protocol: p, Registerer: reg}, rec)
			rec.waitFor(t, "callee/a", 0.1)

			srv.publish(t, policy("callee/a", 0.66))
			eventually(t, "server NACK count", func() bool { return srv.metric("sluice_controller_xds_nacks_total") == 1 })
			if got, _ := c.Policy("callee/a"); got.GetPeers()[0].GetDropRatio() != 0.1 {
				t.Fatalf("after NACK Policy = %v, want the last good 0.1", got)
			}
			if _, n := rec.last("callee/a"); n != 1 {
				t.Fatalf("%d accepted updates, want 1", n)
			}

			srv.publish(t, policy("callee/a", 0.2))
			rec.waitFor(t, "callee/a", 0.2)
			if got, _ := c.Policy("callee/a"); got.GetPeers()[0].GetDropRatio() != 0.2 {
				t.Fatalf("Policy = %v, want 0.2", got)
			}
			if n := metric(reg, "sluice_sidecar_xds_nacks_total"); n != 1 {
				t.Fatalf("client nacks_total = %v, want 1", n)
			}
			// The good version is ACKed: the last request carries no error.
			eventually(t, "ACK of the good version", func() bool { return lastIsACK(srv, p) })
			if n := srv.metric("sluice_controller_xds_nacks_total"); n != 1 {
				t.Fatalf("server NACK count = %v, want still 1", n)
			}
			if p == xdsclient.SotW {
				checkSotWNACK(t, srv.sotwRequests())
			}
		})
	}
}

func lastIsACK(srv *testServer, p xdsclient.Protocol) bool {
	if p == xdsclient.Delta {
		reqs := srv.deltaRequests()
		return len(reqs) >= 3 && reqs[len(reqs)-1].GetErrorDetail() == nil && reqs[len(reqs)-1].GetResponseNonce() != ""
	}
	reqs := srv.sotwRequests()
	return len(reqs) >= 3 && reqs[len(reqs)-1].GetErrorDetail() == nil && reqs[len(reqs)-1].GetResponseNonce() != ""
}

// checkSotWNACK checks the SotW sequence subscribe, ACK v1, NACK, ACK v3:
// the NACK repeats v1 with the bad response's nonce, and ACKs carry the
// full list of names.
func checkSotWNACK(t *testing.T, reqs []*discovery.DiscoveryRequest) {
	t.Helper()
	if len(reqs) != 4 {
		t.Fatalf("%d SotW requests, want 4: %v", len(reqs), reqs)
	}
	ack1, nack, ack3 := reqs[1], reqs[2], reqs[3]
	if nack.GetErrorDetail() == nil || !strings.Contains(nack.GetErrorDetail().GetMessage(), "refused by test") {
		t.Fatalf("third request %v, want a NACK with the handler's message", nack)
	}
	if nack.GetVersionInfo() != ack1.GetVersionInfo() {
		t.Fatalf("NACK version %q, want the previous accepted %q", nack.GetVersionInfo(), ack1.GetVersionInfo())
	}
	if nack.GetResponseNonce() == ack1.GetResponseNonce() || nack.GetResponseNonce() == "" {
		t.Fatalf("NACK nonce %q, want the bad response's", nack.GetResponseNonce())
	}
	if ack3.GetVersionInfo() == ack1.GetVersionInfo() || ack3.GetErrorDetail() != nil {
		t.Fatalf("last request %v, want an ACK of a newer version", ack3)
	}
	for _, r := range reqs {
		if len(r.GetResourceNames()) != 1 || r.GetResourceNames()[0] != "callee/a" {
			t.Fatalf("request names %v, want [callee/a]", r.GetResourceNames())
		}
	}
}

// metric returns the sum of a metric's series in reg.
func metric(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestReconnectSameAddress: the server goes away and a new one comes up on
// the same address with the same content. The client keeps its policy
// meanwhile, reconnects, and (delta) resumes from the versions it holds, so
// nothing is resent.
func TestReconnectSameAddress(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			a := policy("callee/a", 0.1)
			srv := startServer(t, "127.0.0.1:0", a)
			rec := newRecorder()
			reg := prometheus.NewRegistry()
			c := runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/a"},
				Protocol: p, Registerer: reg}, rec)
			rec.waitFor(t, "callee/a", 0.1)
			eventually(t, "Connected", c.Connected)

			srv.close()
			eventually(t, "not Connected", func() bool { return !c.Connected() })
			if got, ok := c.Policy("callee/a"); !ok || !proto.Equal(got, a) {
				t.Fatalf("after stream loss Policy = %v, %v; want the last one kept", got, ok)
			}

			srv2 := startServer(t, srv.addr, policy("callee/a", 0.1))
			if p == xdsclient.Delta {
				want := contentHash(t, a)
				eventually(t, "resume request on the new server", func() bool {
					for _, r := range srv2.deltaRequests() {
						if r.GetInitialResourceVersions()["callee/a"] == want {
							return true
						}
					}
					return false
				})
				// Same content: the new server has nothing to send.
				if n := srv2.metric("sluice_controller_xds_responses_total"); n != 0 {
					t.Fatalf("new server sent %v responses to a client that is up to date, want 0", n)
				}
			} else {
				// SotW can not resume: the server resends, and the client
				// recognises the content it holds.
				eventually(t, "Connected", c.Connected)
			}
			srv2.publish(t, policy("callee/a", 0.5))
			rec.waitFor(t, "callee/a", 0.5)
			eventually(t, "Connected", c.Connected)
			if p == xdsclient.Delta {
				// Responses are ordered: a redundant one would have come
				// before the change.
				if n := srv2.metric("sluice_controller_xds_responses_total"); n != 1 {
					t.Fatalf("new server sent %v responses, want only the change", n)
				}
			}
			if _, n := rec.last("callee/a"); n != 2 {
				t.Fatalf("%d updates, want 2: the resent unchanged policy must not be delivered again", n)
			}
			if got := rec.removed(); len(got) != 0 {
				t.Fatalf("Remove called for %v", got)
			}
			if n := metric(reg, "sluice_sidecar_xds_reconnects_total"); n < 1 {
				t.Fatalf("reconnects_total = %v, want at least 1", n)
			}
		})
	}
}

// TestSubscribeBeforeExists: a client may subscribe before the controller
// publishes the resource. go-control-plane answers a SotW subscription at
// once with an empty response, so the client is Connected; a delta one gets
// nothing until the resource exists. Either way it arrives once published.
func TestSubscribeBeforeExists(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			srv := startServer(t, "127.0.0.1:0", policy("callee/other", 0.1))
			rec := newRecorder()
			c := runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/x"}, Protocol: p}, rec)
			eventually(t, "the subscription", func() bool { return len(srv.deltaRequests())+len(srv.sotwRequests()) > 0 })
			if p == xdsclient.SotW {
				eventually(t, "Connected on the empty response", c.Connected)
			}
			srv.publish(t, policy("callee/x", 0.2))
			rec.waitFor(t, "callee/x", 0.2)
			eventually(t, "Connected", c.Connected)
			want := 1.0 // delta: the resource is the first response
			if p == xdsclient.SotW {
				want = 2 // the empty one, then the resource
			}
			if n := srv.metric("sluice_controller_xds_responses_total"); n != want {
				t.Fatalf("server sent %v responses, want %v", n, want)
			}
		})
	}
}

// contentHash is the delta version go-control-plane gives a resource.
func contentHash(t *testing.T, p *sluicev1.DropPolicy) string {
	t.Helper()
	b, err := cache.MarshalResource(p)
	if err != nil {
		t.Fatal(err)
	}
	return cache.HashResource(b)
}

func TestFailover(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			dead := deadAddr(t)
			srv := startServer(t, "127.0.0.1:0", policy("callee/a", 0.3))
			rec := newRecorder()
			c := runClient(t, xdsclient.Config{Servers: []string{dead, srv.addr}, Resources: []string{"callee/a"}, Protocol: p}, rec)
			rec.waitFor(t, "callee/a", 0.3)
			eventually(t, "Connected", c.Connected)
		})
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestDeltaRemove(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0", policy("callee/a", 0.1), policy("caller/a", 0.2))
	rec := newRecorder()
	c := runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/a", "caller/a"}}, rec)
	rec.waitFor(t, "callee/a", 0.1)
	rec.waitFor(t, "caller/a", 0.2)

	if err := srv.xds.Update(nil, []string{"callee/a"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Remove(callee/a)", func() bool { return len(rec.removed()) == 1 })
	if got := rec.removed(); got[0] != "callee/a" {
		t.Fatalf("removed %v", got)
	}
	if _, ok := c.Policy("callee/a"); ok {
		t.Fatal("removed policy still held")
	}
	if _, ok := c.Policy("caller/a"); !ok {
		t.Fatal("caller/a lost")
	}
}

// TestRunStops: Run returns after cancel, whether it is streaming or waiting
// to reconnect, and leaves no goroutine behind.
func TestRunStops(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0", policy("callee/a", 0.1))
	cases := map[string]struct {
		servers []string
		ready   func(*xdsclient.Client, *recorder) bool
	}{
		"streaming": {
			servers: []string{srv.addr},
			ready:   func(c *xdsclient.Client, _ *recorder) bool { return c.Connected() },
		},
		"reconnecting": {
			servers: []string{deadAddr(t)},
			ready:   func(*xdsclient.Client, *recorder) bool { return true },
		},
	}
	for name, tc := range cases {
		for _, p := range protocols {
			t.Run(name+"/"+p.String(), func(t *testing.T) {
				before := runtime.NumGoroutine()
				rec := newRecorder()
				reg := prometheus.NewRegistry()
				c, stop := startClient(t, xdsclient.Config{Servers: tc.servers, Resources: []string{"callee/a"},
					Protocol: p, Registerer: reg}, rec)
				if name == "reconnecting" {
					eventually(t, "a reconnect", func() bool {
						return metric(reg, "sluice_sidecar_xds_reconnects_total") >= 2
					})
				}
				eventually(t, "ready", func() bool { return tc.ready(c, rec) })
				stop()
				if c.Connected() {
					t.Fatal("Connected after Run returned")
				}
				var after int
				eventually(t, "goroutines to end", func() bool {
					after = runtime.NumGoroutine()
					return after <= before
				})
			})
		}
	}
}

func TestRunTwice(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0", policy("callee/a", 0.1))
	c := runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/a"}}, newRecorder())
	eventually(t, "Connected", c.Connected)
	if err := c.Run(context.Background()); err == nil {
		t.Fatal("second concurrent Run returned nil")
	}
}

func TestNewValidates(t *testing.T) {
	good := xdsclient.Config{Servers: []string{"127.0.0.1:1"}, NodeID: "pod", Resources: []string{"callee/a"}}
	cases := map[string]struct {
		mod  func(*xdsclient.Config)
		h    xdsclient.Handler
		want []string // substrings of the error
	}{
		"no servers":       {mod: func(c *xdsclient.Config) { c.Servers = nil }, want: []string{"Servers"}},
		"bad server":       {mod: func(c *xdsclient.Config) { c.Servers = []string{"localhost"} }, want: []string{"Servers[0]"}},
		"no node":          {mod: func(c *xdsclient.Config) { c.NodeID = "" }, want: []string{"NodeID"}},
		"no resources":     {mod: func(c *xdsclient.Config) { c.Resources = nil }, want: []string{"Resources"}},
		"wildcard":         {mod: func(c *xdsclient.Config) { c.Resources = []string{"*"} }, want: []string{"Resources[0]"}},
		"bad prefix":       {mod: func(c *xdsclient.Config) { c.Resources = []string{"checkout"} }, want: []string{"Resources[0]"}},
		"duplicate":        {mod: func(c *xdsclient.Config) { c.Resources = []string{"callee/a", "callee/a"} }, want: []string{"Resources[1]"}},
		"bad protocol":     {mod: func(c *xdsclient.Config) { c.Protocol = 7 }, want: []string{"Protocol"}},
		"negative backoff": {mod: func(c *xdsclient.Config) { c.BackoffMin = -1 }, want: []string{"BackoffMin"}},
		"max below min": {mod: func(c *xdsclient.Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond },
			want: []string{"BackoffMax"}},
		"no credentials": {mod: func(c *xdsclient.Config) { c.DialOptions = []grpc.DialOption{grpc.WithUserAgent("x")} },
			want: []string{"DialOptions"}},
		"all at once": {mod: func(c *xdsclient.Config) { c.Servers, c.NodeID = nil, "" }, want: []string{"Servers", "NodeID"}},
		"nil handler": {h: nil, want: []string{"handler"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := good
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			h := tc.h
			if h == nil && name != "nil handler" {
				h = newRecorder()
			}
			_, err := xdsclient.New(cfg, h)
			if err == nil {
				t.Fatal("New accepted a bad config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	if _, err := xdsclient.New(good, newRecorder()); err != nil {
		t.Fatalf("good config: %v", err)
	}
}
