//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/testkit"
)

const e2eTrustDomain = "e2e.test"

// tlsArgs issues a certificate for uri into dir and returns the flags that
// hand it to a binary.
func tlsArgs(t *testing.T, ca *devpki.CA, dir, name, uri string) []string {
	t.Helper()
	leaf, err := ca.Issue(uri, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.WriteLeaf(dir, name, leaf)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--tls-cert=" + f.Cert, "--tls-key=" + f.Key, "--tls-ca=" + f.CA, "--trust-domain=" + e2eTrustDomain}
}

// startMTLSControlPlane starts a controller with limitsFile and zone-a's
// aggregator, each with its own certificate of ca (files in dir), and
// waits until both are ready: the aggregator's link to the controller is
// up, both ends verified.
func startMTLSControlPlane(t *testing.T, ca *devpki.CA, dir, limitsFile string) (ctl, agg *node) {
	t.Helper()
	ctl = startController(t, append(tlsArgs(t, ca, dir, "controller", identity.ControllerURI(e2eTrustDomain)),
		"--limits="+limitsFile, "--warmup=1s")...)
	waitReady(t, ctl.proc, ctl.admin)
	aggP := start(t, "aggregator-zone-a", "aggregator", append(tlsArgs(t, ca, dir, "aggregator", identity.AggregatorURI(e2eTrustDomain, "zone-a")),
		"--id=aggregator-zone-a", "--zone=zone-a", "--controllers="+ctl.addr, "--grpc-addr=127.0.0.1:0", "--admin-addr=127.0.0.1:0")...)
	agg = &node{proc: aggP, admin: aggP.addr(t, "admin"), addr: aggP.addr(t, "grpc")}
	// Ready means the controller answered a zone load.
	waitReady(t, agg.proc, agg.admin)
	return ctl, agg
}

// TestBinariesMutualTLS runs the loop as the three real binaries with
// mutual TLS on every link: the sidecar's policy arrives over xDS from the
// controller, its reports reach the controller through the aggregator, and
// each process says it runs with TLS. Then the start-up checks: a partial
// TLS configuration and a certificate of another service both stop a
// binary before it listens.
func TestBinariesMutualTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 5 s")
	}
	ca, err := devpki.NewCA("e2e ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	limitsFile := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limitsFile, []byte("services:\n  checkout:\n    callers:\n      web: {limit: 20}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "from the app") }))
	t.Cleanup(app.Close)

	ctl, agg := startMTLSControlPlane(t, ca, dir, limitsFile)

	checkoutTLS := tlsArgs(t, ca, dir, "checkout", "spiffe://"+e2eTrustDomain+"/ns/shop/sa/checkout")
	scP := start(t, "sidecar-1", "sidecar", append(checkoutTLS, "--id=sidecar-1", "--service=checkout", "--zone=zone-a",
		"--upstream="+app.URL, "--aggregators="+agg.addr, "--controllers="+ctl.addr,
		"--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0", "--report-interval=200ms")...)
	sc := &node{proc: scP, admin: scP.addr(t, "admin"), addr: scP.addr(t, "http")}
	testkit.WaitFor(t, startTimeout, "the sidecar holds checkout's policy over mutual TLS", func() bool {
		_, ok := metric(t, sc.admin, "sluice_sidecar_policy_peers", `service="checkout"`)
		return ok
	})
	if code, _, body := get("http://"+sc.addr+"/", "x-sluice-caller", "web"); code != http.StatusOK {
		t.Fatalf("a request through the sidecar: %d %q", code, body)
	}
	testkit.WaitFor(t, startTimeout, "the sidecar's reports are accepted by the aggregator", func() bool {
		n, _ := metric(t, agg.admin, "sluice_aggregator_reports_total")
		return n > 0
	})
	if n, _ := metric(t, agg.admin, "sluice_aggregator_reports_rejected_total"); n != 0 {
		t.Errorf("aggregator rejected %v reports, want 0", n)
	}
	// Traffic while waiting, so that the rate the controller sums is not
	// one request's, gone by its next tick.
	testkit.WaitFor(t, startTimeout, "the controller sees checkout's load", func() bool {
		get("http://"+sc.addr+"/", "x-sluice-caller", "web")
		n, _ := metric(t, ctl.admin, "sluice_controller_offered_rps", `service="checkout"`)
		return n > 0
	})
	if n, _ := metric(t, ctl.admin, "sluice_controller_zone_loads_rejected_total"); n != 0 {
		t.Errorf("controller rejected %v zone loads, want 0", n)
	}
	for _, n := range []*node{ctl, agg, sc} {
		if v, ok := metric(t, n.admin, "sluice_tls_enabled"); !ok || v != 1 {
			t.Errorf("%s: sluice_tls_enabled = %v (present %v), want 1", n.Name(), v, ok)
		}
	}

	// A sidecar whose certificate is checkout's may not front payments.
	out, code := runToExit(t, "sidecar", nil, append(checkoutTLS, "--service=payments",
		"--aggregators="+agg.addr, "--controllers="+ctl.addr, "--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0")...)
	if code <= 0 || !strings.Contains(out, `tls-cert: identity spiffe://e2e.test/ns/shop/sa/checkout is service "checkout", this sidecar fronts "payments"`) {
		t.Errorf("sidecar with checkout's certificate fronting payments: exit %d, output:\n%s", code, out)
	}

	for _, p := range []*proc{sc.proc, agg.proc, ctl.proc} {
		p.stop(t)
	}
}

// TestBinariesPartialTLSFails: half a TLS configuration stops every binary
// at start, naming the missing flags, before it listens.
func TestBinariesPartialTLSFails(t *testing.T) {
	for _, tc := range []struct {
		binary string
		args   []string
		want   []string
	}{
		{"controller", []string{"--tls-cert=/x/tls.crt"}, []string{"tls-key: required", "tls-ca: required"}},
		{"aggregator", []string{"--zone=zone-a", "--tls-key=/x/tls.key", "--tls-ca=/x/ca.crt"}, []string{"tls-cert: required"}},
		{"sidecar", []string{"--service=checkout", "--tls-ca=/x/ca.crt", "--trust-domain=Not Valid"}, []string{"tls-cert: required", "tls-key: required", "trust-domain:"}},
	} {
		t.Run(tc.binary, func(t *testing.T) {
			out, code := runToExit(t, tc.binary, nil, append(append([]string{}, quietAddrs[tc.binary]...), tc.args...)...)
			if code <= 0 || strings.Contains(out, "msg=listening") {
				t.Errorf("exit %d, want a failure before listening", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not name %q", w)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// TestBinariesPlaintextSaysSo: without TLS flags a binary runs, warns at
// start and exports sluice_tls_enabled 0.
func TestBinariesPlaintextSaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes")
	}
	ctl := startController(t)
	if v, ok := metric(t, ctl.admin, "sluice_tls_enabled"); !ok || v != 0 {
		t.Errorf("sluice_tls_enabled = %v (present %v), want 0", v, ok)
	}
	if out := ctl.Output(); !strings.Contains(out, `"level":"WARN","msg":"PLAINTEXT MODE`) {
		t.Errorf("no plaintext warning in:\n%s", out)
	}
	ctl.stop(t)
}

// TestControllerTakesZoneLoadsOnlyFromAggregators runs the controller
// in-process behind mutual TLS and sends it zone loads under several
// identities: only an aggregator's are applied, and an aggregator whose
// identity names a zone speaks for that zone alone.
func TestControllerTakesZoneLoadsOnlyFromAggregators(t *testing.T) {
	ca, err := devpki.NewCA("e2e ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	source := func(name, uri string) *identity.Source {
		t.Helper()
		leaf, err := ca.Issue(uri, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		f, err := ca.WriteLeaf(dir, name, leaf)
		if err != nil {
			t.Fatal(err)
		}
		src, err := identity.NewSource(identity.Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: e2eTrustDomain})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}

	cfg := controller.DefaultConfig()
	cfg.RequirePeerIdentity = true
	reg := prometheus.NewRegistry()
	svc, err := controller.New(cfg, limits.Static{}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(source("controller", identity.ControllerURI(e2eTrustDomain)).ServerOption())
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
		svc.Drain()
		g.Stop()
		<-served
	})

	send := func(src *identity.Source, zone string) *sluicev1.StreamZoneLoadsResponse {
		t.Helper()
		cc, err := grpc.NewClient(lis.Addr().String(), src.DialOption(identity.Kinds(identity.Controller)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		st, err := sluicev1.NewZoneLoadServiceClient(cc).StreamZoneLoads(ctx)
		if err != nil {
			t.Fatal(err)
		}
		load := &sluicev1.ZoneLoad{AggregatorId: "agg-" + zone, Zone: zone, Interval: durationpb.New(time.Second)}
		if err := st.Send(&sluicev1.StreamZoneLoadsRequest{Load: load}); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		return resp
	}

	zoneA := source("aggregator-zone-a", identity.AggregatorURI(e2eTrustDomain, "zone-a"))
	for _, tc := range []struct {
		name string
		src  *identity.Source
		zone string
		want string // reject reason contains; empty: accepted
	}{
		{"aggregator of its zone", zoneA, "zone-a", ""},
		{"aggregator of another zone", zoneA, "zone-b", `may speak for zone "zone-a" only`},
		{"zone-less aggregator", source("aggregator", identity.AggregatorURI(e2eTrustDomain, "")), "zone-c", ""},
		{"a workload", source("checkout", identity.WorkloadURI(e2eTrustDomain, "checkout")), "zone-a", "is a workload, not an aggregator"},
	} {
		resp := send(tc.src, tc.zone)
		switch {
		case tc.want == "" && !resp.GetAccepted():
			t.Errorf("%s: rejected: %s", tc.name, resp.GetRejectReason())
		case tc.want != "" && (resp.GetAccepted() || !strings.HasPrefix(resp.GetRejectReason(), "identity_mismatch: ") ||
			!strings.Contains(resp.GetRejectReason(), tc.want)):
			t.Errorf("%s: response %v, want identity_mismatch: …%s", tc.name, resp, tc.want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var rejected float64
	for _, mf := range mfs {
		if mf.GetName() == "sluice_controller_zone_loads_rejected_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == "identity_mismatch" {
						rejected += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if rejected != 2 {
		t.Errorf("zone_loads_rejected_total{reason=identity_mismatch} = %v, want 2", rejected)
	}
}
