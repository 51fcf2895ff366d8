package xdsserver

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/names"
)

const waitFor = 5 * time.Second

func policy(name string, ratio float64) *sluicev1.DropPolicy {
	return &sluicev1.DropPolicy{
		Name:    name,
		Service: name[len("callee/"):],
		Peers:   []*sluicev1.PeerPolicy{{Peer: "web", DropRatio: ratio}},
	}
}

// serve starts s on a loopback port and returns its address.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainStreamInterceptor(s.StreamInterceptor()), grpc.MaxRecvMsgSize(1<<20))
	s.Register(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return lis.Addr().String()
}

func newServer(t *testing.T, reg prometheus.Registerer) *Server {
	t.Helper()
	return newServerOpts(t, Options{Registerer: reg})
}

func newServerOpts(t *testing.T, opts Options) *Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return New(ctx, opts)
}

// logBuffer collects log output written from server goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func dialADS(t *testing.T, addr string) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(cc)
}

// responses forwards everything the stream receives; the channel closes
// when the stream ends. The test's context ends the stream.
func responses[T any](recv func() (T, error)) <-chan T {
	ch := make(chan T, 16)
	go func() {
		defer close(ch)
		for {
			r, err := recv()
			if err != nil {
				return
			}
			ch <- r
		}
	}()
	return ch
}

func next[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatal("stream ended")
		}
		return r
	case <-timer.C:
		t.Fatal("no response in time")
	}
	var zero T
	return zero
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func decode(t *testing.T, b []byte) *sluicev1.DropPolicy {
	t.Helper()
	p := new(sluicev1.DropPolicy)
	if err := proto.Unmarshal(b, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func streamCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

var node = &core.Node{Id: "pod-1", Cluster: "checkout"}

func TestUpdateRejectsBadBatchWhole(t *testing.T) {
	s := newServer(t, nil)
	cases := map[string]struct {
		changed map[string]*sluicev1.DropPolicy
		deleted []string
	}{
		"nil policy":     {changed: map[string]*sluicev1.DropPolicy{"callee/a": nil}},
		"name mismatch":  {changed: map[string]*sluicev1.DropPolicy{"callee/a": policy("callee/b", 0)}},
		"empty name":     {changed: map[string]*sluicev1.DropPolicy{"": policy("callee/x", 0)}},
		"change+delete":  {changed: map[string]*sluicev1.DropPolicy{"callee/a": policy("callee/a", 0)}, deleted: []string{"callee/a"}},
		"one bad of two": {changed: map[string]*sluicev1.DropPolicy{"callee/a": policy("callee/a", 0), "callee/b": policy("callee/c", 0)}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if err := s.Update(tc.changed, tc.deleted); err == nil {
				t.Fatal("Update accepted a bad batch")
			}
			if n := s.Resources(); n != 0 {
				t.Fatalf("Resources() = %d after a rejected batch, want 0", n)
			}
		})
	}
}

// TestDeltaNamed: only subscribed resources are sent, only changed ones are
// resent, deletions arrive as removed_resources, NACKs are counted.
func TestDeltaNamed(t *testing.T) {
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	s := newServerOpts(t, Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err := s.Update(map[string]*sluicev1.DropPolicy{
		"callee/a": policy("callee/a", 0.1),
		"callee/b": policy("callee/b", 0.2),
	}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := dialADS(t, serve(t, s)).DeltaAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ch := responses(st.Recv)
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: names.DropPolicyType,
		ResourceNamesSubscribe: []string{"callee/a", "callee/c"}}); err != nil {
		t.Fatal(err)
	}
	r := next(t, ch)
	if len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != "callee/a" {
		t.Fatalf("first response %v, want callee/a only", r.GetResources())
	}
	if got := decode(t, r.GetResources()[0].GetResource().GetValue()); got.GetPeers()[0].GetDropRatio() != 0.1 {
		t.Fatalf("got %v", got)
	}
	if s.Streams() != 1 {
		t.Fatalf("Streams() = %d, want 1", s.Streams())
	}

	// NACK it; the server counts it and does not resend.
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: names.DropPolicyType, ResponseNonce: r.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "bad"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return metric(t, reg, "sluice_controller_xds_nacks_total") == 1 })
	// The NACK carries no node (only the first request does); the log
	// still names it. The counter goes up before the line is written
	// (callbacks.nack), so wait for the line too.
	testkit.WaitFor(t, waitFor, "the NACK's log line names node_id=pod-1 and error_detail=bad", func() bool {
		l := logs.String()
		return strings.Contains(l, "node_id=pod-1") && strings.Contains(l, "error_detail=bad")
	})

	// A batch touching b (not subscribed) and c (subscribed, new): only c.
	if err := s.Update(map[string]*sluicev1.DropPolicy{
		"callee/b": policy("callee/b", 0.3),
		"callee/c": policy("callee/c", 0.4),
	}, nil); err != nil {
		t.Fatal(err)
	}
	r = next(t, ch)
	if len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != "callee/c" {
		t.Fatalf("response %v, want callee/c only", r.GetResources())
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: names.DropPolicyType, ResponseNonce: r.GetNonce()}); err != nil {
		t.Fatal(err)
	}

	if err := s.Update(nil, []string{"callee/a"}); err != nil {
		t.Fatal(err)
	}
	r = next(t, ch)
	if !slices.Equal(r.GetRemovedResources(), []string{"callee/a"}) || len(r.GetResources()) != 0 {
		t.Fatalf("response %v, want callee/a removed", r)
	}
	if got := metric(t, reg, "sluice_controller_xds_resources"); got != 2 {
		t.Fatalf("resources gauge = %v, want 2", got)
	}
	if got := metric(t, reg, "sluice_controller_xds_updates_total"); got != 3 {
		t.Fatalf("updates_total = %v, want 3", got)
	}
}

// TestSotWNamed: SotW sends subscribed resources only, changed ones only,
// and nothing at all for a deletion.
func TestSotWNamed(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newServer(t, reg)
	if err := s.Update(map[string]*sluicev1.DropPolicy{
		"callee/a": policy("callee/a", 0.1),
		"callee/b": policy("callee/b", 0.2),
	}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := dialADS(t, serve(t, s)).StreamAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ch := responses(st.Recv)
	resources := []string{"callee/a", "callee/c"}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: names.DropPolicyType, ResourceNames: resources}); err != nil {
		t.Fatal(err)
	}
	r := next(t, ch)
	if len(r.GetResources()) != 1 || decode(t, r.GetResources()[0].GetValue()).GetName() != "callee/a" {
		t.Fatalf("first response %v, want callee/a only", r.GetResources())
	}
	if r.GetResources()[0].GetTypeUrl() != names.DropPolicyType {
		t.Fatalf("Any type %q", r.GetResources()[0].GetTypeUrl())
	}
	ack := &discovery.DiscoveryRequest{TypeUrl: names.DropPolicyType, ResourceNames: resources,
		VersionInfo: r.GetVersionInfo(), ResponseNonce: r.GetNonce()}
	if err := st.Send(ack); err != nil {
		t.Fatal(err)
	}

	// Deleting a sends nothing; the next change of c is the next response.
	if err := s.Update(nil, []string{"callee/a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(map[string]*sluicev1.DropPolicy{"callee/c": policy("callee/c", 0.5)}, nil); err != nil {
		t.Fatal(err)
	}
	r = next(t, ch)
	if len(r.GetResources()) != 1 || decode(t, r.GetResources()[0].GetValue()).GetName() != "callee/c" {
		t.Fatalf("response %v, want callee/c only", r.GetResources())
	}
	if got := metric(t, reg, "sluice_controller_xds_responses_total"); got != 2 {
		t.Fatalf("responses_total = %v, want 2", got)
	}
}

// TestSubscribeBeforeExists pins what go-control-plane v0.14.0 does when a
// client subscribes by name to a resource that does not exist yet: SotW
// answers at once with an empty response (the request had no version), delta
// stays silent. Both deliver the resource once it is published.
func TestSubscribeBeforeExists(t *testing.T) {
	s := newServer(t, nil)
	if err := s.Update(map[string]*sluicev1.DropPolicy{"callee/other": policy("callee/other", 0)}, nil); err != nil {
		t.Fatal(err)
	}
	ads := dialADS(t, serve(t, s))

	sotw, err := ads.StreamAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	sotwCh := responses(sotw.Recv)
	if err := sotw.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: names.DropPolicyType, ResourceNames: []string{"callee/x"}}); err != nil {
		t.Fatal(err)
	}
	empty := next(t, sotwCh)
	if len(empty.GetResources()) != 0 || empty.GetVersionInfo() == "" {
		t.Fatalf("sotw: first response %v, want empty with a version", empty)
	}
	if err := sotw.Send(&discovery.DiscoveryRequest{TypeUrl: names.DropPolicyType, ResourceNames: []string{"callee/x"},
		VersionInfo: empty.GetVersionInfo(), ResponseNonce: empty.GetNonce()}); err != nil {
		t.Fatal(err)
	}

	delta, err := ads.DeltaAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	deltaCh := responses(delta.Recv)
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: names.DropPolicyType,
		ResourceNamesSubscribe: []string{"callee/x"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return s.Streams() == 2 })

	if err := s.Update(map[string]*sluicev1.DropPolicy{"callee/x": policy("callee/x", 0.7)}, nil); err != nil {
		t.Fatal(err)
	}
	if r := next(t, sotwCh); len(r.GetResources()) != 1 {
		t.Fatalf("sotw: %v, want callee/x", r)
	}
	// The first delta response carries the resource: nothing came before.
	if r := next(t, deltaCh); len(r.GetResources()) != 1 || r.GetResources()[0].GetName() != "callee/x" {
		t.Fatalf("delta: first response %v, want callee/x", r)
	}
}

// TestStreamsWaitForFirstUpdate: before the first Update the table is empty,
// and a resuming delta client would be told its policies were removed.
// Streams wait instead, and then get the resource itself.
func TestStreamsWaitForFirstUpdate(t *testing.T) {
	seed := newServer(t, nil)
	if err := seed.Update(map[string]*sluicev1.DropPolicy{"callee/a": policy("callee/a", 0.1)}, nil); err != nil {
		t.Fatal(err)
	}
	// Learn the content hash the client would hold.
	ads := dialADS(t, serve(t, seed))
	st, err := ads.DeltaAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: names.DropPolicyType, ResourceNamesSubscribe: []string{"callee/a"}}); err != nil {
		t.Fatal(err)
	}
	version := next(t, responses(st.Recv)).GetResources()[0].GetVersion()

	s := newServer(t, nil) // a restarted controller, table still empty
	st, err = dialADS(t, serve(t, s)).DeltaAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	ch := responses(st.Recv)
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: names.DropPolicyType,
		ResourceNamesSubscribe:  []string{"callee/a"},
		InitialResourceVersions: map[string]string{"callee/a": version}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return s.Streams() == 1 })
	if err := s.Update(map[string]*sluicev1.DropPolicy{"callee/a": policy("callee/a", 0.2)}, nil); err != nil {
		t.Fatal(err)
	}
	r := next(t, ch)
	if len(r.GetRemovedResources()) != 0 || len(r.GetResources()) != 1 {
		t.Fatalf("first response after restart %v, want the new callee/a and no removal", r)
	}
}

func TestStreamsCountedAndClosed(t *testing.T) {
	s := newServer(t, nil)
	if err := s.Update(nil, nil); err != nil {
		t.Fatal(err)
	}
	ads := dialADS(t, serve(t, s))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		if _, err := ads.DeltaAggregatedResources(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := ads.StreamAggregatedResources(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, func() bool { return s.Streams() == 6 })
	cancel()
	eventually(t, func() bool { return s.Streams() == 0 })
}

func TestTwoServersOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, b := newServer(t, reg), newServer(t, reg) // must not panic
	if err := a.Update(map[string]*sluicev1.DropPolicy{"callee/a": policy("callee/a", 0)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, reg, "sluice_controller_xds_resources"); got != 1 {
		t.Fatalf("resources = %v, want the first server's 1", got)
	}
}

// metric returns the sum of a metric's series in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestDropPolicyTypeIsTheMessage: the type URL both ends use is the
// message's own (pkg/names may not import api/, so it is spelt out there).
func TestDropPolicyTypeIsTheMessage(t *testing.T) {
	want := "type.googleapis.com/" + string((&sluicev1.DropPolicy{}).ProtoReflect().Descriptor().FullName())
	if names.DropPolicyType != want {
		t.Errorf("names.DropPolicyType = %q, want %q", names.DropPolicyType, want)
	}
}
