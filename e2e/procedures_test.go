//go:build unix

package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testkit"
)

// procedureLimits is the limits file of TestProcedureLimitsAsProcesses: the
// README's nested limits, scaled to a test. web may send 40 rps of charges
// (its leaf) and 300 rps in all (its caller limit); the charges of every
// caller share a capacity of 200.
const procedureLimits = `services:
  checkout:
    callers:
      web:    {limit: 300}
      mobile: {limit: 300}
    routes:
      - {route: "POST /v1/charges", procedure: create-charge}
      - {route: "GET /v1/items/{id}", procedure: get-item}
    procedures:
      create-charge:
        capacity: 200
        callers:
          web: {limit: 40}
`

// startProcedureLoop runs a controller with limits, one aggregator and two
// checkout sidecars in front of upstream, and waits until both hold a
// policy that declares procedures.
func startProcedureLoop(t *testing.T, limitsDoc, upstream string) (ctl *node, sidecars []*node) {
	t.Helper()
	ctl, _, sidecars = startCheckoutLoop(t, limitsDoc, upstream, "checkout's procedures", func(p *sluicev1.DropPolicy) bool {
		return len(p.GetProcedures()) > 0
	})
	return ctl, sidecars
}

// startCheckoutLoop runs a controller with limitsDoc, one aggregator and
// two checkout sidecars in front of upstream, and waits until the
// controller publishes a policy for checkout that published says it has
// (what, for the message), and both sidecars hold a policy.
func startCheckoutLoop(t *testing.T, limitsDoc, upstream, what string, published func(*sluicev1.DropPolicy) bool) (ctl, agg *node, sidecars []*node) {
	t.Helper()
	limitsFile := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(limitsFile, []byte(limitsDoc), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl = startController(t, "--limits="+limitsFile, "--warmup=1s")
	waitReady(t, ctl.proc, ctl.admin)
	agg = startAggregator(t, "zone-a", ctl.addr)
	waitReady(t, agg.proc, agg.admin)
	for _, id := range []string{"sidecar-1", "sidecar-2"} {
		s := startSidecar(t, id, "zone-a", upstream, agg.addr, ctl.addr)
		waitReady(t, s.proc, s.admin)
		sidecars = append(sidecars, s)
	}
	testkit.WaitFor(t, startTimeout, "the controller publishes "+what, func() bool {
		return published(policy(t, ctl.admin, "callee/checkout"))
	})
	for _, s := range sidecars {
		testkit.WaitFor(t, startTimeout, s.Name()+" holds a policy for checkout", func() bool {
			_, ok := metric(t, s.admin, "sluice_sidecar_policy_peers", `service="checkout"`)
			return ok
		})
	}
	return ctl, agg, sidecars
}

// leafRatio is the drop ratio of the (peer, procedure) leaf in p; NaN when
// p does not list it.
func leafRatio(p *sluicev1.DropPolicy, peer, procedure string) float64 {
	for _, pp := range p.GetPeers() {
		if pp.GetPeer() == peer && pp.GetProcedure() == procedure {
			return pp.GetDropRatio()
		}
	}
	return math.NaN()
}

// TestProcedureLimitsAsProcesses: web sends POST /v1/charges at 5× its
// procedure limit and GET /v1/items/{id} well under its caller limit,
// while mobile sends charges under the procedure's capacity, through two
// real sidecars. web's charges are held to their limit; its item reads and
// mobile, whose leaves are under every level, lose nothing.
func TestProcedureLimitsAsProcesses(t *testing.T) { retryBusy(testProcedureLimitsAsProcesses)(t) }

func testProcedureLimitsAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 25 s")
	}
	const (
		chargeLimit = 40.0  // web's create-charge leaf
		chargeRate  = 200.0 // 5× it
		calm        = 40.0  // web's item reads and mobile's charges
		runFor      = 15
		held        = 2 // the 3rd second: web's charges are held from here on
	)
	var reached sync.Map // "METHOD path-kind caller" → *atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := r.URL.Path
		if strings.HasPrefix(kind, "/v1/items/") {
			kind = "/v1/items/{id}"
		}
		n, _ := reached.LoadOrStore(r.Method+" "+kind+" "+r.Header.Get("x-sluice-caller"), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		io.WriteString(w, "from the app\n")
	}))
	t.Cleanup(app.Close)
	ctl, sidecars := startProcedureLoop(t, procedureLimits, app.URL)

	as := func(caller string) http.Header { return http.Header{"X-Sluice-Caller": {caller}} }
	g, err := loadgen.New(loadgen.Options{
		Targets: targets(sidecars),
		Callers: []loadgen.Caller{
			{Name: "web-charges", Header: as("web"), Method: http.MethodPost, Path: "/v1/charges", Rate: rate(chargeRate)},
			{Name: "web-items", Header: as("web"), Path: "/v1/items/42", Rate: rate(calm)},
			{Name: "mobile-charges", Header: as("mobile"), Method: http.MethodPost, Path: "/v1/charges", Rate: rate(calm)},
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
		c, i, m := g.Second("web-charges", s), g.Second("web-items", s), g.Second("mobile-charges", s)
		t.Logf("t=%2ds web charges sent=%3d admitted=%3d (ratio %.3f) | web items sent=%2d dropped=%d | mobile charges sent=%2d dropped=%d | errors=%d skipped=%d",
			s, c.Sent, c.Admitted, ratios[s], i.Sent, i.Dropped, m.Sent, m.Dropped, c.Errors+i.Errors+m.Errors, c.Skipped+i.Skipped+m.Skipped)
	}
	requireOnSchedule(t, g, 0, runFor)
	for _, flow := range []string{"web-charges", "web-items", "mobile-charges"} {
		if s := g.Sum(flow, 0, runFor+1); s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", flow, s.Errors, s.Skipped)
		}
	}

	if got := admittedRate(g, "web-charges", held, runFor); math.Abs(got-chargeLimit) > 0.05*chargeLimit {
		t.Errorf("web's charges: %.1f rps admitted over seconds [%d, %d), want %v ± 5 %%", got, held, runFor, chargeLimit)
	} else {
		t.Logf("web's charges: %.1f rps admitted over seconds [%d, %d) (leaf limit %v)", got, held, runFor, chargeLimit)
	}
	for _, flow := range []string{"web-items", "mobile-charges"} {
		s := g.Sum(flow, 0, runFor+1)
		loss := float64(s.Dropped) / float64(s.Sent)
		t.Logf("%s lost %.3f %% (%d of %d)", flow, 100*loss, s.Dropped, s.Sent)
		if loss >= 0.001 {
			t.Errorf("%s, under every level of its limits, lost %.3f %% (%d of %d), want < 0.1 %%", flow, 100*loss, s.Dropped, s.Sent)
		}
	}
	// The app saw exactly what was admitted, each on its own route.
	for key, flow := range map[string]string{
		"POST /v1/charges web": "web-charges", "GET /v1/items/{id} web": "web-items", "POST /v1/charges mobile": "mobile-charges",
	} {
		n, _ := reached.Load(key)
		var got int64
		if n != nil {
			got = n.(*atomic.Int64).Load()
		}
		if want := g.Sum(flow, 0, runFor+1).Admitted; got != want {
			t.Errorf("the app served %d %q, want %d (the admitted ones)", got, key, want)
		}
	}

	// A refused charge names the bucket that refused it.
	refusal := probeRefusal(t, "http://"+sidecars[0].addr+"/v1/charges", "web")
	if p := refusal.Get("RateLimit-Policy"); !strings.Contains(p, "create-charge") {
		t.Errorf("a refused charge's RateLimit-Policy is %q, want it to name the create-charge bucket", p)
	}
	for _, s := range sidecars {
		if n, _ := metric(t, s.admin, "sluice_sidecar_requests_total", `peer="web"`, `procedure="create-charge"`, `outcome="dropped"`); !(n > 0) {
			t.Errorf("%s: sluice_sidecar_requests_total{peer=\"web\",procedure=\"create-charge\",outcome=\"dropped\"} = %v, want > 0", s.Name(), n)
		}
	}
}

// probeRefusal sends POST url as caller until one is refused (at most 200,
// while the caller's ratio is high) and returns the refusal's headers.
func probeRefusal(t *testing.T, url, caller string) http.Header {
	t.Helper()
	for range 200 {
		req, err := http.NewRequest(http.MethodPost, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-sluice-caller", caller)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			return resp.Header
		}
	}
	t.Fatalf("200 requests from %s to %s in a row were admitted; want a 429", caller, url)
	return nil
}

// grpcProcedureLimits limits one gRPC method of web's; the others fall in
// _other, which has no limit.
const grpcProcedureLimits = `services:
  checkout:
    callers:
      web: {limit: 300}
    procedures:
      /shop.Checkout/Pay:
        callers:
          web: {limit: 40}
`

// TestProcedureLimitsAsProcessesGRPC: the gRPC variant. web calls
// /shop.Checkout/Pay at 5× its per-method limit and /shop.Checkout/Browse,
// a method the limits do not declare, under its caller limit, through the
// sidecars' proxy over h2c; Pay is held to its limit, Browse loses nothing.
func TestProcedureLimitsAsProcessesGRPC(t *testing.T) {
	retryBusy(testProcedureLimitsAsProcessesGRPC)(t)
}

func testProcedureLimitsAsProcessesGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 25 s")
	}
	const (
		payLimit = 40.0
		payRate  = 200.0
		browse   = 40.0
		runFor   = 15
		held     = 2
	)
	appAddr := startAnyMethodApp(t)
	_, sidecars := startProcedureLoop(t, grpcProcedureLimits, "http://"+appAddr)
	var conns []*grpc.ClientConn
	for _, s := range sidecars {
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns = append(conns, conn)
	}
	load := runGRPCLoad(t, conns, runFor, []grpcFlow{
		{method: "/shop.Checkout/Pay", caller: "web", rate: payRate},
		{method: "/shop.Checkout/Browse", caller: "web", rate: browse},
	})
	for s := range runFor {
		p, b := load.second(0, s), load.second(1, s)
		t.Logf("t=%2ds Pay sent=%3d ok=%3d exhausted=%3d | Browse sent=%2d exhausted=%d | errors=%d", s, p.sent, p.ok, p.exhausted, b.sent, b.exhausted, p.errors+b.errors)
	}
	load.requireOnSchedule(t, 0, runFor)
	if e := load.sum(0, 0, runFor).errors + load.sum(1, 0, runFor).errors; e > 0 {
		t.Errorf("%d calls failed with neither OK nor RESOURCE_EXHAUSTED: the rig, not the limiter", e)
	}
	pay := load.sum(0, held, runFor)
	if got := float64(pay.ok) / float64(runFor-held); math.Abs(got-payLimit) > 0.05*payLimit {
		t.Errorf("web's Pay: %.1f calls/s admitted over seconds [%d, %d), want %v ± 5 %%", got, held, runFor, payLimit)
	} else {
		t.Logf("web's Pay: %.1f calls/s admitted over seconds [%d, %d) (method limit %v)", got, held, runFor, payLimit)
	}
	b := load.sum(1, 0, runFor)
	if loss := float64(b.exhausted) / float64(b.sent); loss >= 0.001 {
		t.Errorf("web's Browse, an undeclared method under web's caller limit, lost %.3f %% (%d of %d)", 100*loss, b.exhausted, b.sent)
	} else {
		t.Logf("web's Browse lost %.3f %% (%d of %d)", 100*loss, b.exhausted, b.sent)
	}
}

// startAnyMethodApp serves every gRPC method with an empty reply, over h2c
// (grpc's own server): the app behind the sidecars' proxy.
func startAnyMethodApp(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		var in emptypb.Empty
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		return stream.SendMsg(&emptypb.Empty{})
	}))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// grpcFlow is one method called by one caller at a constant rate.
type grpcFlow struct {
	method, caller string
	rate           float64
}

type grpcSecond struct{ sent, ok, exhausted, errors int64 }

// grpcLoad is what runGRPCLoad saw, per flow and second.
type grpcLoad struct {
	flows []grpcFlow
	mu    sync.Mutex
	secs  [][]grpcSecond // [flow][second]
}

// requireOnSchedule is the e2e requireOnSchedule for a gRPC load: a
// second whose calls went out more than 10 % off their rate was the
// machine's, not the loop's.
func (l *grpcLoad) requireOnSchedule(t *testing.T, from, to int) {
	t.Helper()
	var late []int
	for s := from; s < to; s++ {
		for i, f := range l.flows {
			if loadgen.OffRate(float64(l.second(i, s).sent), f.rate) {
				late = append(late, s)
				break
			}
		}
	}
	if len(late) == 0 {
		return
	}
	tooBusy(t, fmt.Sprintf("the gRPC load went out more than 10 %% off its schedule in seconds %v of [%d, %d): the machine is too busy for this run to say anything about the loop", late, from, to))
}

func (l *grpcLoad) second(flow, s int) grpcSecond {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.secs[flow][s]
}

func (l *grpcLoad) sum(flow, from, to int) grpcSecond {
	var t grpcSecond
	for s := from; s < to; s++ {
		c := l.second(flow, s)
		t.sent, t.ok, t.exhausted, t.errors = t.sent+c.sent, t.ok+c.ok, t.exhausted+c.exhausted, t.errors+c.errors
	}
	return t
}

// runGRPCLoad calls each flow's method at its rate for seconds, round-robin
// over conns, open loop (a call does not wait for the one before), and
// counts each call in the second it was sent.
func runGRPCLoad(t *testing.T, conns []*grpc.ClientConn, seconds int, flows []grpcFlow) *grpcLoad {
	t.Helper()
	l := &grpcLoad{flows: flows, secs: make([][]grpcSecond, len(flows))}
	for i := range flows {
		l.secs[i] = make([]grpcSecond, seconds)
	}
	const tick = 5 * time.Millisecond
	var wg sync.WaitGroup
	start := time.Now()
	sent := make([]float64, len(flows))
	next := 0
	for now := range time.Tick(tick) {
		el := now.Sub(start)
		sec := int(el / time.Second)
		if sec >= seconds {
			break
		}
		for i, f := range flows {
			due := f.rate * el.Seconds()
			for ; sent[i] < due; sent[i]++ {
				conn := conns[next%len(conns)]
				next++
				wg.Go(func() { l.call(conn, i, sec, f) })
			}
		}
	}
	wg.Wait()
	return l
}

func (l *grpcLoad) call(conn *grpc.ClientConn, flow, sec int, f grpcFlow) {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-sluice-caller", f.caller), getTimeout)
	defer cancel()
	err := conn.Invoke(ctx, f.method, &emptypb.Empty{}, &emptypb.Empty{})
	l.mu.Lock()
	defer l.mu.Unlock()
	c := &l.secs[flow][sec]
	c.sent++
	switch status.Code(err) {
	case codes.OK:
		c.ok++
	case codes.ResourceExhausted:
		c.exhausted++
	default:
		c.errors++
		if c.errors == 1 {
			fmt.Fprintf(os.Stderr, "grpc load: %s: %v\n", f.method, err)
		}
	}
}
