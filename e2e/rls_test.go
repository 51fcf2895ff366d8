//go:build unix

package e2e

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testkit"
)

// rlsLimits makes checkout count cost, and limits web's charges to 100
// units a second and batch to 400.
const rlsLimits = `services:
  checkout:
    unit: cost
    callers:
      batch: {limit: 400}
    routes:
      - {route: "POST /v1/charges", procedure: create-charge}
    procedures:
      create-charge:
        callers:
          web: {limit: 100}
`

// TestEnvoyRLSAsProcesses: no proxied request at all; two real sidecars
// answer Envoy's rate limit service (--rls-listen) from their limiters,
// with the real controller and aggregator closing the loop, and a client
// built from go-control-plane's stubs sends what Envoy's ratelimit filter
// sends: one descriptor of a source_cluster, a :path and a :method entry,
// with hits_addend the request's cost. web's charges cost 5 units at 100
// rps, 500 units a second against a limit of 100; batch's reads cost 2 at
// 40 rps, 80 a second against 400.
//
// The cost is known as each call is decided (hits_addend), but the first
// seconds, before the loop answers, admit everything: that overshoot is
// web's debt, which the controller makes it pay back by a lowered limit
// (as TestCostLimitsAsProcesses), so they are not judged. From warm on,
// web's admitted units are within ±5 % of its limit (which they would
// miss five times over if hits_addend counted as 1), and batch loses
// < 0.1 %.
func TestEnvoyRLSAsProcesses(t *testing.T) { retryBusy(testEnvoyRLSAsProcesses)(t) }

func testEnvoyRLSAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 35 s")
	}
	const (
		webLimit  = 100.0 // units a second, web's create-charge leaf
		webHits   = 5
		webRate   = 100.0 // calls a second: 5× the limit in units
		batchHits = 2
		batchRate = 40.0
		warm      = 15 // the cold start and its debt: not judged
		runFor    = 25
	)
	limitsFile := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(limitsFile, []byte(rlsLimits), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := startController(t, "--limits="+limitsFile, "--warmup=1s")
	waitReady(t, ctl.proc, ctl.admin)
	agg := startAggregator(t, "zone-a", ctl.addr)
	waitReady(t, agg.proc, agg.admin)
	var sidecars []*node
	var rlsAddrs []string
	for _, id := range []string{"sidecar-1", "sidecar-2"} {
		// The proxy's upstream is never called: nothing is proxied.
		p := start(t, id, "sidecar", "--id="+id, "--service=checkout", "--zone=zone-a", "--upstream=http://127.0.0.1:9",
			"--aggregators="+agg.addr, "--controllers="+ctl.addr,
			"--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0", "--rls-listen=127.0.0.1:0", "--rls-headers")
		s := &node{proc: p, admin: p.addr(t, "admin"), addr: p.addr(t, "http")}
		waitReady(t, s.proc, s.admin)
		sidecars = append(sidecars, s)
		rlsAddrs = append(rlsAddrs, p.addr(t, "grpc"))
	}
	testkit.WaitFor(t, startTimeout, "the controller publishes checkout's cost unit and procedures", func() bool {
		p := policy(t, ctl.admin, "callee/checkout")
		return p.GetUnit() == sluicev1.Unit_UNIT_COST && len(p.GetProcedures()) > 0
	})
	for _, s := range sidecars {
		testkit.WaitFor(t, startTimeout, s.Name()+" holds a policy for checkout", func() bool {
			_, ok := metric(t, s.admin, "sluice_sidecar_policy_peers", `service="checkout"`)
			return ok
		})
	}

	clients := map[string]rlsv3.RateLimitServiceClient{}
	for _, a := range rlsAddrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients[a] = rlsv3.NewRateLimitServiceClient(conn)
	}
	// ask sends what Envoy's filter sends for one request of caller,
	// method and path, costing hits.
	ask := func(caller, method, path string, hits uint32) func(context.Context, string, uint64) loadgen.Outcome {
		req := &rlsv3.RateLimitRequest{Domain: "checkout", HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: "source_cluster", Value: caller}, {Key: "path", Value: path}, {Key: "method", Value: method},
			},
		}}}
		return func(ctx context.Context, target string, _ uint64) loadgen.Outcome {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			resp, err := clients[target].ShouldRateLimit(ctx, req)
			switch {
			case err != nil:
				return loadgen.Errored
			case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
				return loadgen.Dropped
			case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
				return loadgen.Admitted
			}
			return loadgen.Errored
		}
	}
	g, err := loadgen.New(loadgen.Options{
		Targets: rlsAddrs,
		Callers: []loadgen.Caller{
			{Name: "web", Rate: rate(webRate), Send: ask("web", "POST", "/v1/charges", webHits)},
			{Name: "batch", Rate: rate(batchRate), Send: ask("batch", "GET", "/v1/items/7?full=1", batchHits)},
		},
		Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ratios := make([]float64, runFor)
	ctx, cancel := context.WithTimeout(context.Background(), runFor*time.Second+startTimeout)
	defer cancel()
	if err := g.Run(ctx, func(s int) {
		ratios[s] = leafRatio(policy(t, ctl.admin, "callee/checkout"), "web", "create-charge")
	}); err != nil {
		t.Fatal(err)
	}
	for s := range runFor {
		w, b := g.Second("web", s), g.Second("batch", s)
		t.Logf("t=%2ds web sent=%3d admitted=%3d (%3d units, ratio %.3f) | batch sent=%2d dropped=%d | errors=%d skipped=%d",
			s, w.Sent, w.Admitted, w.Admitted*webHits, ratios[s], b.Sent, b.Dropped, w.Errors+b.Errors, w.Skipped+b.Skipped)
	}
	requireOnSchedule(t, g, 0, runFor)
	for _, c := range []string{"web", "batch"} {
		if s := g.Sum(c, 0, runFor+1); s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost calls", c, s.Errors, s.Skipped)
		}
	}

	if got := admittedRate(g, "web", warm, runFor) * webHits; math.Abs(got-webLimit) > 0.05*webLimit {
		t.Errorf("web: %.1f units a second admitted over seconds [%d, %d), want its limit %v ± 5 %%", got, warm, runFor, webLimit)
	} else {
		t.Logf("web: %.1f units a second admitted over seconds [%d, %d) (limit %v)", got, warm, runFor, webLimit)
	}
	s := g.Sum("batch", 0, runFor+1)
	loss := float64(s.Dropped) / float64(s.Sent)
	t.Logf("batch lost %.3f %% (%d of %d)", 100*loss, s.Dropped, s.Sent)
	if loss >= 0.001 {
		t.Errorf("batch, under its limit, lost %.3f %% (%d of %d), want < 0.1 %%", 100*loss, s.Dropped, s.Sent)
	}

	// The calls were counted as requests are, in their procedures' leaves,
	// and web's refusals say so in Envoy's terms.
	for _, sc := range sidecars {
		if n, _ := metric(t, sc.admin, "sluice_sidecar_requests_total", `peer="web"`, `procedure="create-charge"`, `outcome="dropped"`); !(n > 0) {
			t.Errorf("%s: no dropped requests of web's create-charge counted", sc.Name())
		}
		if n, _ := metric(t, sc.admin, "sluice_sidecar_rls_requests_total", `code="over_limit"`); !(n > 0) {
			t.Errorf("%s: sluice_sidecar_rls_requests_total{code=\"over_limit\"} = %v, want > 0", sc.Name(), n)
		}
	}
	resp, err := clients[rlsAddrs[0]].ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "source_cluster", Value: "batch"}, {Key: "path", Value: "/v1/items/7"}, {Key: "method", Value: "GET"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.1.2.3"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()
	if len(st) != 2 || st[0].GetCurrentLimit().GetRequestsPerUnit() != 400 || st[0].GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND ||
		st[1].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetCurrentLimit() != nil {
		t.Errorf("statuses %v, want batch's limit of 400 per second, and an unmapped descriptor OK with no limit", st)
	}
	var limitHeader string
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "x-ratelimit-limit" {
			limitHeader = h.GetValue()
		}
	}
	if !strings.HasPrefix(limitHeader, "400, 400;w=1") {
		t.Errorf("x-ratelimit-limit %q, want 400, 400;w=1", limitHeader)
	}
	if n, _ := metric(t, sidecars[0].admin, "sluice_sidecar_rls_unmapped_total", `reason="descriptor"`); n != 1 {
		t.Errorf("sluice_sidecar_rls_unmapped_total{reason=\"descriptor\"} = %v, want 1", n)
	}
}
