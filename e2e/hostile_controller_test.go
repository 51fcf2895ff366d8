//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/identity"
	"github.com/sluicehq/sluice/internal/identity/devpki"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testkit"
)

// TestHostileOutboundFalseClaims: a workload holding a valid certificate
// for service abuser reports, as if it enforced outbound, 10^6 rps of calls
// to checkout, a callee with a capacity of 100 rps and no limit for abuser.
// The innocent caller victim offers 80 rps, under its limit and within the
// capacity. Before, the controller added abuser's claim to checkout's
// capacity split unchecked: the split gave victim 50 rps, a 37 % cut, for
// as long as the claim lasted (issue 13). Now a claim toward a callee with
// a capacity counts only for a bucket with a limit: victim keeps its 80
// rps, and the controller counts the refused claims.
func TestHostileOutboundFalseClaims(t *testing.T) { retryBusy(testHostileOutboundFalseClaims)(t) }

func testHostileOutboundFalseClaims(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 15 s")
	}
	const (
		capacity   = 100.0
		victimRate = 80.0
		claim      = 1e6
		runFor     = 12 // seconds of load
		judgeFrom  = 3  // the claim is in the controller's sums from here on
	)
	ca, err := devpki.NewCA("e2e ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	limitsFile := filepath.Join(dir, "limits.yaml")
	doc := fmt.Sprintf("services:\n  checkout:\n    capacity: %v\n    callers:\n      victim: {limit: 100}\n", capacity)
	if err := os.WriteFile(limitsFile, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "from the app") }))
	t.Cleanup(app.Close)

	ctl, agg := startMTLSControlPlane(t, ca, dir, limitsFile)
	scP := start(t, "sidecar-1", "sidecar", append(tlsArgs(t, ca, dir, "checkout", identity.WorkloadURI(e2eTrustDomain, "checkout")),
		"--id=sidecar-1", "--service=checkout", "--zone=zone-a", "--upstream="+app.URL, "--aggregators="+agg.addr,
		"--controllers="+ctl.addr, "--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0")...)
	sc := &node{proc: scP, admin: scP.addr(t, "admin"), addr: scP.addr(t, "http")}
	testkit.WaitFor(t, startTimeout, "the sidecar holds checkout's policy", func() bool {
		_, ok := metric(t, sc.admin, "sluice_sidecar_policy_peers", `service="checkout"`)
		return ok
	})

	// The attacker: a raw client with abuser's own certificate, reporting
	// outbound calls to checkout it never makes, every half second.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	attacked := make(chan error, 1)
	go func() { attacked <- claimOutbound(ctx, ca, dir, agg.addr, claim) }()

	g, err := loadgen.New(loadgen.Options{
		Targets:  []string{"http://" + sc.addr},
		Callers:  []loadgen.Caller{{Name: "victim", Rate: rate(victimRate)}},
		Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	refused, _ := metric(t, ctl.admin, "sluice_controller_outbound_claims_refused_total")
	cancel()
	if err := <-attacked; err != nil {
		t.Fatalf("the attacker's reports: %v", err)
	}
	for s := range runFor {
		v := g.Second("victim", s)
		t.Logf("t=%2ds victim sent=%3d admitted=%3d dropped=%3d errors=%d", s, v.Sent, v.Admitted, v.Dropped, v.Errors)
	}
	requireOnSchedule(t, g, judgeFrom, runFor)
	t.Logf("controller: %v outbound claims refused", refused)
	if !(refused > 0) {
		t.Error("the controller refused no outbound claim: the attack did not reach it")
	}
	sent := float64(g.Sum("victim", judgeFrom, runFor).Sent) / float64(runFor-judgeFrom)
	requireAllowance(t, "victim", admittedRate(g, "victim", judgeFrom, runFor), min(sent, capacity))
	requireRSS(t, ctl, 100<<20)
}

// claimOutbound reports, as sidecar abuser-1 of service abuser, claim rps
// of outbound calls to checkout over one stream to the aggregator at addr,
// every half second until ctx ends; it fails if a report is not accepted.
func claimOutbound(ctx context.Context, ca *devpki.CA, dir, addr string, claim float64) error {
	leaf, err := ca.Issue(identity.WorkloadURI(e2eTrustDomain, "abuser"), time.Hour)
	if err != nil {
		return err
	}
	f, err := ca.WriteLeaf(dir, "abuser", leaf)
	if err != nil {
		return err
	}
	src, err := identity.NewSource(identity.Config{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA, TrustDomain: e2eTrustDomain})
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient(addr, src.DialOption(identity.Kinds(identity.Aggregator)))
	if err != nil {
		return err
	}
	defer cc.Close()
	st, err := sluicev1.NewLoadReportServiceClient(cc).StreamLoadReports(ctx)
	if err != nil {
		return err
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		report := &sluicev1.LoadReport{
			SidecarId: "abuser-1", Service: "abuser", Direction: sluicev1.Direction_DIRECTION_OUTBOUND, Zone: "zone-a",
			Window: durationpb.New(time.Second), Peers: []*sluicev1.PeerCounts{{Peer: "checkout", Offered: uint64(claim)}},
		}
		if err := st.Send(&sluicev1.StreamLoadReportsRequest{Report: report}); err != nil {
			return ctxOr(ctx, err)
		}
		resp, err := st.Recv()
		if err != nil {
			return ctxOr(ctx, err)
		}
		if !resp.GetAccepted() {
			return fmt.Errorf("report rejected: %s", resp.GetRejectReason())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// ctxOr is nil once ctx has ended (the stream's error is then the end of
// the test), else err.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
