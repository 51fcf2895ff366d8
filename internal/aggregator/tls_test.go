package aggregator

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
)

const trustDomain = "example.org"

// testPKI issues certificates from an in-test CA into files and loads them
// as identity Sources, as the binaries do from their --tls-* flags.
type testPKI struct {
	t   *testing.T
	ca  *devpki.CA
	dir string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := devpki.NewCA("aggregator test ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{t: t, ca: ca, dir: t.TempDir()}
}

func (p *testPKI) source(name, uri string) *identity.Source {
	p.t.Helper()
	leaf, err := p.ca.Issue(uri, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	f, err := p.ca.WriteLeaf(p.dir, name, leaf)
	if err != nil {
		p.t.Fatal(err)
	}
	src, err := identity.NewSource(identity.Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: trustDomain})
	if err != nil {
		p.t.Fatal(err)
	}
	return src
}

// startTLSService runs an aggregator behind mutual TLS on loopback, as its
// command does with --tls-* flags. Its controller is unreachable: only the
// sidecar side is under test.
func startTLSService(t *testing.T, src *identity.Source) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc, err := New(Config{Zone: "zone-a", ID: "agg-1", Controllers: []string{"127.0.0.1:1"}, RequirePeerIdentity: true}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(src.ServerOption())
	svc.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-served
	})
	return &harness{svc: svc, reg: reg, addr: lis.Addr().String()}
}

func dialTLS(t *testing.T, addr string, src *identity.Source) *sidecarStream {
	t.Helper()
	cc, err := grpc.NewClient(addr, src.DialOption(identity.Kinds(identity.Aggregator)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := sluicev1.NewLoadReportServiceClient(cc).StreamLoadReports(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &sidecarStream{BidiStreamingClient: st, cancel: cancel}
}

// TestReportForAnotherServiceRejected is issue 6's "a report signed by
// service A claiming to be service B is rejected".
func TestReportForAnotherServiceRejected(t *testing.T) {
	p := newTestPKI(t)
	h := startTLSService(t, p.source("aggregator", identity.AggregatorURI(trustDomain, "zone-a")))
	checkout := p.source("checkout", "spiffe://example.org/ns/shop/sa/checkout")
	payments := p.source("payments", identity.WorkloadURI(trustDomain, "payments"))

	a := dialTLS(t, h.addr, checkout)
	a.mustAccept(t, report("checkout-1", "checkout", in, time.Second, pc("web", 100, 0, 0)))

	// Signed by checkout, claiming to be payments.
	resp := a.report(t, report("checkout-1", "payments", in, time.Second, pc("web", 1e6, 0, 0)))
	if resp.GetAccepted() || !strings.HasPrefix(resp.GetRejectReason(), ReasonIdentityMismatch+": ") ||
		!strings.Contains(resp.GetRejectReason(), `is service "checkout", the report is for "payments"`) {
		t.Fatalf("response = %v, want rejected for %s", resp, ReasonIdentityMismatch)
	}
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonIdentityMismatch); v != 1 {
		t.Errorf("reports_rejected_total{reason=identity_mismatch} = %v, want 1", v)
	}
	// Nothing of the forged report reached the sums.
	for _, sl := range h.svc.FlushNow().GetServices() {
		if sl.GetService() == "payments" {
			t.Errorf("the forged report reached the zone load: %v", sl)
		}
	}

	// Sidecar ids are per identity: payments reporting under checkout's
	// sidecar id holds its own sidecar, and checkout's load stays.
	b := dialTLS(t, h.addr, payments)
	b.mustAccept(t, report("checkout-1", "payments", in, time.Second, pc("web", 1, 0, 0)))
	if v := metric(t, h.reg, "sluice_aggregator_reports_rejected_total", "reason", ReasonIdentityMismatch); v != 1 {
		t.Errorf("reports_rejected_total{reason=identity_mismatch} = %v, want 1", v)
	}
	if n := h.svc.Sidecars(); n != 2 {
		t.Errorf("Sidecars = %d, want 2", n)
	}
	want := []*sluicev1.ServiceLoad{
		serviceLoad("checkout", in, 1, rate("web", 100, 0, 0)),
		serviceLoad("payments", in, 1, rate("web", 1, 0, 0)),
	}
	if got := h.svc.FlushNow(); !proto.Equal(&sluicev1.ZoneLoad{Services: got.Services}, &sluicev1.ZoneLoad{Services: want}) {
		t.Errorf("FlushNow = %v, want services %v", got, want)
	}

	// Another sluice component is no sidecar.
	c := dialTLS(t, h.addr, p.source("controller", identity.ControllerURI(trustDomain)))
	resp = c.report(t, report("ctl", "checkout", in, time.Second, pc("web", 1, 0, 0)))
	if resp.GetAccepted() || !strings.Contains(resp.GetRejectReason(), "not a workload") {
		t.Fatalf("response = %v, want a controller's report refused", resp)
	}
}
