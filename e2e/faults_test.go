//go:build unix

// Faults with real processes: the binaries of binaries_test.go, killed,
// restarted, cut off from each other and from Postgres under load, with an
// upstream app that counts what gets through. docs/operations.md quotes
// the figures these tests log.

package e2e

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
)

// The load of every fault test: web surges to five times its limit for the
// whole run, batch stays under its own. The limit is low so that a loaded
// 2-core machine running ten race-instrumented processes keeps up, and high
// enough that one request is 2 % of it.
const (
	faultLimit = 50.0  // rps, web's limit and batch's
	faultWeb   = 250.0 // rps, web's offered rate: 5× its limit
	faultBatch = 20.0  // rps, batch's offered rate: under its limit
	// faultTolerance is "within ±5 % of the limit".
	faultTolerance = 0.05
	// faultWindow is how many seconds the admitted rate is averaged over
	// before it is compared with the limit: per second, the scheduler of a
	// loaded machine moves a few requests across second boundaries, which
	// alone is ±5 % of 50 rps.
	faultWindow = 3
	// processGoroutineSlack is how many goroutines a surviving process may
	// have above its count before the fault, once the loop has recovered:
	// a stream or a timer in flight, not a stream per fault.
	processGoroutineSlack = 10
)

// upstream is the app behind a zone's sidecars. It counts what reaches it —
// the admitted requests — per caller and per second of arrival, second s
// being [start+s, start+s+1).
type upstream struct {
	srv   *httptest.Server
	start atomic.Int64 // unix nanoseconds of second 0; 0 counts nothing
	web   []atomic.Int64
	batch []atomic.Int64
	other atomic.Int64 // callers other than web and batch: probes
}

func newUpstream(t *testing.T, seconds int) *upstream {
	u := &upstream{web: make([]atomic.Int64, seconds+5), batch: make([]atomic.Int64, seconds+5)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.count(r.Header.Get("x-sluice-caller"))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) count(caller string) {
	start := u.start.Load()
	var series []atomic.Int64
	switch caller {
	case "web":
		series = u.web
	case "batch":
		series = u.batch
	}
	if start == 0 || series == nil {
		u.other.Add(1)
		return
	}
	s := int((time.Now().UnixNano() - start) / int64(time.Second))
	if s >= 0 && s < len(series) {
		series[s].Add(1)
	}
}

// faultLoad is one run of load: web and batch from a generator through the
// sidecars, for seconds, and what the upstreams counted.
type faultLoad struct {
	g       *loadgen.Generator
	ups     []*upstream
	begin   time.Time
	seconds int
	done    chan error
}

// runLoad starts the load in the background; wait collects it. The test's
// cleanup cancels and waits for a run the test did not wait for.
func runLoad(t *testing.T, seconds int, targets []string, ups ...*upstream) *faultLoad {
	t.Helper()
	return runLoadWith(t, seconds, targets, nil, ups...)
}

// runLoadWith is runLoad with more callers besides web and batch.
func runLoadWith(t *testing.T, seconds int, targets []string, extra []loadgen.Caller, ups ...*upstream) *faultLoad {
	t.Helper()
	g, err := loadgen.New(loadgen.Options{
		Targets:  targets,
		Callers:  append([]loadgen.Caller{{Name: "web", Rate: rate(faultWeb)}, {Name: "batch", Rate: rate(faultBatch)}}, extra...),
		Duration: time.Duration(seconds) * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	l := &faultLoad{g: g, ups: ups, seconds: seconds, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	l.begin = time.Now()
	for _, u := range ups {
		u.start.Store(l.begin.UnixNano())
	}
	go func() { l.done <- g.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		<-l.done
		l.done <- nil
	})
	return l
}

// at sleeps until second s of the run.
func (l *faultLoad) at(s float64) {
	time.Sleep(time.Until(l.begin.Add(time.Duration(s * float64(time.Second)))))
}

// wait waits for the run to end, checks that the rig itself lost nothing
// and logs the seconds.
func (l *faultLoad) wait(t *testing.T, note func(s int) string) {
	t.Helper()
	select {
	case err := <-l.done:
		l.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("load: %v", err)
		}
	case <-time.After(time.Duration(l.seconds)*time.Second + startTimeout):
		t.Fatal("the load generator did not finish")
	}
	for _, caller := range []string{"web", "batch"} {
		// The last second holds the requests the generator settled at the
		// very end of the run.
		if s := l.g.Sum(caller, 0, l.seconds+1); s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", caller, s.Errors, s.Skipped)
		}
	}
	// The two counts of what got through agree: the generator's 2xx
	// answers and the upstreams' arrivals.
	var arrived int64
	for s := range l.seconds + 5 {
		arrived += l.web(s)
	}
	if answered := l.g.Sum("web", 0, l.seconds+1).Admitted; arrived != answered {
		t.Errorf("web: the upstreams counted %d requests, the generator %d answered 2xx", arrived, answered)
	}
	for s := range l.seconds {
		w, b := l.g.Second("web", s), l.g.Second("batch", s)
		line := fmt.Sprintf("t=%2ds web sent=%3d admitted(upstream)=%3d | batch sent=%2d dropped=%d", s, w.Sent, l.web(s), b.Sent, b.Dropped)
		if note != nil {
			line += " | " + note(s)
		}
		t.Log(line)
	}
}

// web is what the upstreams counted of web in second s: the admitted rate.
func (l *faultLoad) web(s int) int64 {
	var n int64
	for _, u := range l.ups {
		n += u.web[s].Load()
	}
	return n
}

// mean is web's mean admitted rate over seconds [from, to).
func (l *faultLoad) mean(from, to int) float64 {
	var n int64
	for s := from; s < to; s++ {
		n += l.web(s)
	}
	return float64(n) / float64(to-from)
}

// peak is web's highest admitted rate in one second of [from, to).
func (l *faultLoad) peak(from, to int) int64 {
	var p int64
	for s := from; s < to; s++ {
		p = max(p, l.web(s))
	}
	return p
}

// within says whether rate is within ±faultTolerance of the limit.
func within(rate float64) bool { return math.Abs(rate-faultLimit) <= faultTolerance*faultLimit }

// recovered is the time to recover from a fault at second from: the number
// of seconds until the first second s whose window [s, s+faultWindow) has
// a mean admitted rate within ±5 % of the limit; -1 if none does before
// the run ends.
func (l *faultLoad) recovered(from int) int {
	for s := from; s+faultWindow <= l.seconds; s++ {
		if within(l.mean(s, s+faultWindow)) {
			return s - from
		}
	}
	return -1
}

// checkSteady asserts that web's admitted rate over [from, to) is within
// ±5 % of the limit.
func (l *faultLoad) checkSteady(t *testing.T, what string, from, to int) float64 {
	t.Helper()
	m := l.mean(from, to)
	if !within(m) {
		t.Errorf("%s: web admitted %.1f rps over seconds [%d, %d), want %v ± 5 %%", what, m, from, to, faultLimit)
	} else {
		t.Logf("%s: web admitted %.1f rps over seconds [%d, %d) (limit %v, %+.1f %%)", what, m, from, to, faultLimit, 100*(m/faultLimit-1))
	}
	return m
}

// batchLossBound is how much of batch's traffic, under its limit, may be
// dropped: nothing, but for what a stall of a loaded machine does. The load
// generator then sends a second's requests in a burst, a sidecar's surge
// check sees batch at several times its rate for a tenth of a second, and
// the ratio it gets is released over a few seconds.
const batchLossBound = 0.02

// checkLong is checkSteady for a long window, a minute or more: there the
// median second must be within ±5 % of the limit, and the mean within
// ±10 %. On a loaded machine a stall of the load generator sends a burst
// that a sidecar's surge check (a tenth of a second) can take for a surge:
// the ratio jumps and is released over a few seconds, during which web gets
// less than its limit. A minute with two such stalls has its mean 4 % low
// while every other second is at the limit; the median is what the loop
// did, the mean bounds what the stalls cost.
func (l *faultLoad) checkLong(t *testing.T, what string, from, to int) {
	t.Helper()
	var secs []float64
	for s := from; s < to; s++ {
		secs = append(secs, float64(l.web(s)))
	}
	slices.Sort(secs)
	median, mean := secs[len(secs)/2], l.mean(from, to)
	if !within(median) || math.Abs(mean-faultLimit) > 2*faultTolerance*faultLimit {
		t.Errorf("%s: web admitted a median %.0f rps a second, a mean of %.1f, over seconds [%d, %d); want the median within %v ± 5 %%, the mean ± 10 %%",
			what, median, mean, from, to, faultLimit)
	} else {
		t.Logf("%s: web admitted a median %.0f rps a second, a mean of %.1f rps, over seconds [%d, %d) (limit %v)", what, median, mean, from, to, faultLimit)
	}
}

// checkBatch asserts that batch, under its limit, lost (about) nothing.
func (l *faultLoad) checkBatch(t *testing.T) {
	t.Helper()
	b := l.g.Sum("batch", 0, l.seconds+1)
	if loss := float64(b.Dropped) / float64(b.Sent); loss > batchLossBound {
		t.Errorf("batch, under its limit, lost %d of %d requests (%.1f %%), bound %.0f %%", b.Dropped, b.Sent, 100*loss, 100*batchLossBound)
	} else if b.Dropped > 0 {
		t.Logf("batch, under its limit, lost %d of %d requests (%.1f %%): a stall of the machine", b.Dropped, b.Sent, 100*loss)
	}
}

// writeFaultLimits writes the limits file: web and batch limited to
// faultLimit in checkout, with the given fail mode.
func writeFaultLimits(t *testing.T, failMode string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	doc := fmt.Sprintf("services:\n  checkout:\n    fail_mode: %s\n    callers:\n      web: {limit: %v}\n      batch: {limit: %v}\n",
		failMode, faultLimit, faultLimit)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startAggregatorAs starts an aggregator with its own id, so that a zone
// can have several.
func startAggregatorAs(t *testing.T, id, zone, controllers string) *node {
	t.Helper()
	p := start(t, id, "aggregator", "--id="+id, "--zone="+zone, "--controllers="+controllers,
		"--grpc-addr=127.0.0.1:0", "--admin-addr=127.0.0.1:0")
	n := &node{proc: p, admin: p.addr(t, "admin"), addr: p.addr(t, "grpc")}
	waitReady(t, p, n.admin)
	return n
}

// startFaultSidecars starts n sidecars of zone in front of app, reporting
// to aggregators and taking policies from controllers (comma-separated,
// in failover order), and waits until each holds a policy that lists web.
func startFaultSidecars(t *testing.T, n int, zone, app, aggregators, controllers string) []*node {
	t.Helper()
	var ns []*node
	for i := range n {
		ns = append(ns, startSidecar(t, fmt.Sprintf("sidecar-%s-%d", zone, i+1), zone, app, aggregators, controllers))
	}
	for _, s := range ns {
		waitReady(t, s.proc, s.admin)
		testkit.WaitFor(t, startTimeout, s.Name()+" holds a policy that lists web", func() bool {
			_, ok := metric(t, s.admin, "sluice_sidecar_drop_ratio", `peer="web"`)
			return ok
		})
	}
	return ns
}

func targets(sidecars []*node) []string {
	var ts []string
	for _, s := range sidecars {
		ts = append(ts, "http://"+s.addr)
	}
	return ts
}

// freeAddr returns a loopback address that nothing listens on now, for a
// process that must come back on the same address after a restart.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape is metric for goroutines other than the test's: the sum of name's
// samples whose labels include every one of labels; NaN when there is none.
func scrape(admin, name string, labels ...string) (float64, error) {
	m, err := metrics(admin)
	if err != nil {
		return 0, err
	}
	if sum, ok := m.Sum(name, labels...); ok {
		return sum, nil
	}
	return math.NaN(), nil
}

// sampler reads metrics once per second of a run, at its end, from its own
// goroutine, which ends after the run's last second (or at the test's
// cleanup).
type sampler struct {
	quit chan struct{}
	done chan struct{}
	mu   sync.Mutex // protects errs
	errs []string
}

func (l *faultLoad) sample(t *testing.T, fn func(s int) error) *sampler {
	sm := &sampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(sm.done)
		for s := 0; s < l.seconds; s++ {
			wake := time.NewTimer(time.Until(l.begin.Add(time.Duration(s+1) * time.Second)))
			select {
			case <-sm.quit:
				wake.Stop()
				return
			case <-wake.C:
			}
			if err := fn(s); err != nil {
				sm.mu.Lock()
				sm.errs = append(sm.errs, fmt.Sprintf("t=%ds: %v", s, err))
				sm.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		close(sm.quit)
		<-sm.done
	})
	return sm
}

// check waits for the sampler's last second (what it wrote may be read
// after) and fails the test with what it found.
func (sm *sampler) check(t *testing.T) {
	t.Helper()
	select {
	case <-sm.done:
	case <-time.After(time.Minute):
		t.Fatal("the sampler did not finish")
	}
	for i, e := range sm.errs {
		if i == 10 {
			t.Errorf("... and %d more", len(sm.errs)-10)
			break
		}
		t.Error(e)
	}
}

// baseline is the test process's goroutines and live heap before a fault
// test started anything.
type baseline struct {
	goroutines int
	heap       uint64
}

func takeBaseline(t *testing.T) baseline {
	t.Helper()
	binary(t, "controller") // the build is once per run, not the test's
	return baseline{goroutines: runtime.NumGoroutine(), heap: heapAfterGC()}
}

// check asserts that once everything the test started is stopped, the test
// process is back to its goroutines and (within shutdownHeapSlack) its
// live heap.
func (b baseline) check(t *testing.T) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections() // child.Get keeps no idle connections
	deadline := time.Now().Add(15 * time.Second)
	for runtime.NumGoroutine() > b.goroutines && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > b.goroutines {
		var sb strings.Builder
		pprof.Lookup("goroutine").WriteTo(&sb, 1)
		t.Errorf("%d goroutines after shutdown, %d before the test:\n%s", n, b.goroutines, sb.String())
	}
	heap := heapAfterGC()
	t.Logf("test process after shutdown: %d goroutines (%d before), live heap %.1f MB (%.1f MB before)",
		runtime.NumGoroutine(), b.goroutines, mb(heap), mb(b.heap))
	if heap > b.heap+shutdownHeapSlack {
		t.Errorf("live heap %.1f MB after shutdown, %.1f MB before the test", mb(heap), mb(b.heap))
	}
}

// goroutines is a process's go_goroutines.
func goroutines(t *testing.T, n *node) float64 {
	t.Helper()
	v, ok := metric(t, n.admin, "go_goroutines")
	if !ok {
		t.Fatalf("%s exports no go_goroutines", n.Name())
	}
	return v
}

// checkGoroutines asserts that a process that lived through the fault has
// about as many goroutines as before it.
func checkGoroutines(t *testing.T, n *node, before float64) {
	t.Helper()
	after := goroutines(t, n)
	t.Logf("%s: %v goroutines before the fault, %v after recovery", n.Name(), before, after)
	if after > before+processGoroutineSlack {
		t.Errorf("%s: %v goroutines after recovery, %v before the fault: a leak per fault", n.Name(), after, before)
	}
}

// stopAll sends SIGTERM to every node still running, data plane first, and
// checks each exits 0.
func stopAll(t *testing.T, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		if !n.Exited() {
			n.stop(t)
		}
	}
}

// kill9 kills a process with SIGKILL and waits until it is gone.
func kill9(t *testing.T, n *node) {
	t.Helper()
	if err := n.Kill(stopTimeout); err != nil {
		t.Fatal(err)
	}
}

// TestFaultAggregatorKilledMidSurge: zone a has two aggregator replicas,
// its sidecars list both (a1 first); zones b and c have one each. Mid-surge
// a1 is killed with SIGKILL. The controller drops a1's zone load at once (its
// stream ended), the sidecars fail over to a2, and web's admitted rate is
// back within ±5 % of its limit within aggregatorKillBound.
func TestFaultAggregatorKilledMidSurge(t *testing.T) { retryBusy(testFaultAggregatorKilledMidSurge)(t) }

func testFaultAggregatorKilledMidSurge(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test with processes: about 40 s")
	}
	const (
		runFor = 28
		killAt = 12
		// aggregatorKillBound is the documented bound on the time back to
		// ±5 %: the sidecars' failover (100 ms backoff), a report, a
		// flush and a tick are about 2 s; the rest is margin for a loaded
		// 2-core machine.
		aggregatorKillBound = 8
	)
	base := takeBaseline(t)

	limits := writeFaultLimits(t, "open")
	ctl := startController(t, "--limits="+limits, "--warmup=1s")
	waitReady(t, ctl.proc, ctl.admin)
	a1 := startAggregatorAs(t, "aggregator-a1", "zone-a", ctl.addr)
	a2 := startAggregatorAs(t, "aggregator-a2", "zone-a", ctl.addr)
	b1 := startAggregatorAs(t, "aggregator-b1", "zone-b", ctl.addr)
	c1 := startAggregatorAs(t, "aggregator-c1", "zone-c", ctl.addr)
	app := newUpstream(t, runFor)
	var sidecars []*node
	sidecars = append(sidecars, startFaultSidecars(t, 2, "zone-a", app.srv.URL, a1.addr+","+a2.addr, ctl.addr)...)
	sidecars = append(sidecars, startFaultSidecars(t, 2, "zone-b", app.srv.URL, b1.addr, ctl.addr)...)
	sidecars = append(sidecars, startFaultSidecars(t, 2, "zone-c", app.srv.URL, c1.addr, ctl.addr)...)

	load := runLoad(t, runFor, targets(sidecars), app)
	load.at(killAt - 0.5)
	// a2 gains zone a's sidecars' streams: b1 and the controller are the
	// processes whose goroutines must come back.
	ctlGoroutines := goroutines(t, ctl)
	b1Goroutines := goroutines(t, b1)
	load.at(killAt)
	kill9(t, a1)
	killed := time.Now()
	testkit.WaitFor(t, 2*startTimeout, "a2 holds zone a's two sidecars", func() bool {
		n, _ := metric(t, a2.admin, "sluice_aggregator_sidecars")
		return n == 2
	})
	t.Logf("FIGURE aggregator kill: a2 held both of zone a's sidecars %v after the kill", time.Since(killed).Round(10*time.Millisecond))
	load.wait(t, nil)
	requireOnSchedule(t, load.g, 6, runFor)

	load.checkSteady(t, "before the kill", 6, killAt)
	took := load.recovered(killAt)
	t.Logf("FIGURE aggregator kill: web back within ±5 %% of its limit %d s after the kill (bound %d s); the worst second admitted %d (limit %v)",
		took, aggregatorKillBound, load.peak(killAt, killAt+max(took, 0)+faultWindow), faultLimit)
	if took < 0 || took > aggregatorKillBound {
		t.Errorf("web was back within ±5 %% %d s after the kill, want within %d s", took, aggregatorKillBound)
	}
	load.checkSteady(t, "after the failover", killAt+aggregatorKillBound, runFor)
	load.checkBatch(t)
	for _, s := range sidecars[:2] {
		if n, _ := metric(t, s.admin, "sluice_sidecar_report_failovers_total"); !(n > 0) {
			t.Errorf("%s: sluice_sidecar_report_failovers_total = %v, want > 0", s.Name(), n)
		}
	}
	if n, _ := metric(t, ctl.admin, "sluice_controller_aggregators"); n != 3 {
		t.Errorf("sluice_controller_aggregators = %v after the kill, want 3", n)
	}
	checkGoroutines(t, ctl, ctlGoroutines)
	checkGoroutines(t, b1, b1Goroutines)

	stopAll(t, append(sidecars, a2, b1, c1, ctl)...)
	app.srv.Close()
	base.check(t)
}

// TestFaultControllerKilledAndRestarted: mid-surge the controller is
// killed with SIGKILL and started again on the same address 3 s later,
// with the default warm-up (5 s) and policy TTL (10 s). The kill comes at
// the worst moment: just before the controller would have refreshed the
// policies, which it does every half TTL, so the sidecars' policies are
// already 4-5 s old. Then 5 s are left before they expire, and the
// restart takes the 3 s down, the start and the 5 s warm-up: the policies
// expire for a few seconds, and fail mode open starts its decay (30 s).
//
// What it asserts: no spurious 0 and no spike — every sidecar's ratio for
// web stays near the surge's 0.8, no second admits less than half or more
// than twice the limit (a ratio of 0 would admit 5×) — and once the new
// controller publishes, web is back within ±5 % of its limit within
// controllerRestartBound. It measures for docs/operations.md how long the
// policies were expired and how far the ratio decayed meanwhile.
func TestFaultControllerKilledAndRestarted(t *testing.T) {
	retryBusy(testFaultControllerKilledAndRestarted)(t)
}

func testFaultControllerKilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test with processes: about 45 s")
	}
	const (
		runFor = 60
		killAt = 9 // at the first refresh-to-be from this second on
		// refreshWait bounds each wait for the refresh schedule: at most
		// half the default TTL (30 s) between refreshes.
		refreshWait = 20 * time.Second
		down        = 3 * time.Second
		// controllerRestartBound is the documented bound on the time from
		// the kill back to ±5 % for good: 3 s down, the start and warm-up
		// (5 s), the sidecars' xDS reconnect, and the seconds the expired
		// policies' decay takes to undo; the margin is for a loaded
		// machine.
		controllerRestartBound = 18
	)
	base := takeBaseline(t)

	limits := writeFaultLimits(t, "open")
	ctlAddr := freeAddr(t)
	// A republish threshold of 5 %: on a busy machine the measured rates
	// jitter by more than the default 0.5 %, and every push of a changed
	// ratio makes the policies young again, so the test never saw them
	// reach the refresh age it waits for. 0.8 ± 5 % of the admitted share
	// is 50 ± 2.5 rps, within what the test allows anyway.
	ctlArgs := []string{"--limits=" + limits, "--grpc-addr=" + ctlAddr, "--republish-threshold=0.05"}
	ctl := startController(t, append(ctlArgs, "--warmup=1s")...) // the first start has nothing to wait for
	waitReady(t, ctl.proc, ctl.admin)
	var aggs, sidecars []*node
	app := newUpstream(t, runFor)
	for _, zone := range []string{"zone-a", "zone-b", "zone-c"} {
		agg := startAggregatorAs(t, "aggregator-"+zone, zone, ctlAddr)
		aggs = append(aggs, agg)
		sidecars = append(sidecars, startFaultSidecars(t, 2, zone, app.srv.URL, agg.addr, ctlAddr)...)
	}

	load := runLoad(t, runFor, targets(sidecars), app)
	// Each second, every sidecar's ratio for web, the age of its policy
	// and whether it has expired.
	minRatio := make([]float64, runFor)
	maxRatio := make([]float64, runFor)
	maxAge := make([]float64, runFor)  // the oldest policy a sidecar held, seconds
	expired := make([]float64, runFor) // sidecars whose policy had expired
	sm := load.sample(t, func(s int) error {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, sc := range sidecars {
			r, err := scrape(sc.admin, "sluice_sidecar_drop_ratio", `peer="web"`)
			if err != nil {
				return err
			}
			lo, hi = min(lo, r), max(hi, r)
			age, err := scrape(sc.admin, "sluice_sidecar_policy_age_seconds")
			if err != nil {
				return err
			}
			maxAge[s] = max(maxAge[s], age)
			exp, err := scrape(sc.admin, "sluice_sidecar_policy_state", `state="expired"`)
			if err != nil {
				return err
			}
			expired[s] += exp
		}
		minRatio[s], maxRatio[s] = lo, hi
		return nil
	})
	load.at(killAt)
	// Wait for the worst moment: just before a refresh, when the policies
	// are as old as they get. The controller issues an unchanged policy
	// again on the first tick after it reaches its refresh age, fixed per
	// name; a policy pushed early because its ratio moved starts the wait
	// over. The window is a second and a half wide, so that polling, which
	// on a busy machine takes most of a second to scrape six sidecars, does
	// not step over it.
	youngest := func() float64 {
		y := math.Inf(1)
		for _, sc := range sidecars {
			age, _ := metric(t, sc.admin, "sluice_sidecar_policy_age_seconds")
			y = min(y, age)
		}
		return y
	}
	refresh := controller.RefreshAge(names.Callee("checkout"), controller.DefaultConfig().PolicyTTL).Seconds()
	testkit.WaitFor(t, 2*refreshWait, fmt.Sprintf("the sidecars' policies are %.1f s old, just before their refresh at %.1f s", refresh-1.5, refresh), func() bool {
		return youngest() >= refresh-1.5
	})
	sidecarGoroutines := goroutines(t, sidecars[0])
	aggGoroutines := goroutines(t, aggs[0])
	kill9(t, ctl)
	killed := time.Now()
	time.Sleep(down)
	ctl = startController(t, ctlArgs...)
	restarted := time.Now()
	testkit.WaitFor(t, 2*startTimeout, "every sidecar and aggregator is connected to the new controller", func() bool {
		streams, _ := metric(t, ctl.admin, "sluice_controller_xds_streams")
		aggregators, _ := metric(t, ctl.admin, "sluice_controller_aggregators")
		warm, _ := metric(t, ctl.admin, "sluice_controller_warm")
		return streams == float64(len(sidecars)) && aggregators == float64(len(aggs)) && warm == 1
	})
	t.Logf("FIGURE controller restart: down %v; every sidecar and aggregator connected and the new controller warm %v after its start",
		restarted.Sub(killed).Round(10*time.Millisecond), time.Since(restarted).Round(10*time.Millisecond))
	testkit.WaitFor(t, startTimeout, "every sidecar holds a fresh policy from the new controller", func() bool {
		for _, sc := range sidecars {
			if n, _ := metric(t, sc.admin, "sluice_sidecar_policy_state", `state="fresh"`); n != 1 {
				return false
			}
		}
		return true
	})
	fresh := time.Since(killed)
	killSec := int(killed.Sub(load.begin) / time.Second)
	freshSec := int(killed.Add(fresh).Sub(load.begin)/time.Second) + 1
	if freshSec+8 > runFor {
		t.Fatalf("every sidecar was fresh again at t=%ds, too late to measure the recovery in a run of %d s", freshSec, runFor)
	}
	sm.check(t)
	load.wait(t, func(s int) string {
		return fmt.Sprintf("web ratio at the sidecars %.3f..%.3f, oldest policy %.1fs, %v expired", minRatio[s], maxRatio[s], maxAge[s], expired[s])
	})
	requireOnSchedule(t, load.g, 5, runFor)

	oldest, expiredFor, lowest := 0.0, 0, 1.0
	for s := killSec; s < runFor; s++ {
		oldest = max(oldest, maxAge[s])
		lowest = min(lowest, minRatio[s])
		if expired[s] > 0 {
			expiredFor++
		}
	}
	t.Logf("FIGURE controller restart: killed with policies %.1f s old; every sidecar fresh again %v after the kill; the oldest policy was %.1f s old (default TTL), expired in %d sampled seconds; web's ratio fell to %.3f at the lowest (0.8 before); the worst second admitted %d (limit %v)",
		maxAge[killSec], fresh.Round(100*time.Millisecond), oldest, expiredFor, lowest, load.peak(killSec, runFor), faultLimit)

	load.checkSteady(t, "before the kill", 5, killSec)
	// With the defaults a restart of a few seconds fits in the TTL even
	// at the worst moment (controller.Config.RestartMargin: half the TTL
	// less the warm-up, 10 s): no sidecar falls back to its fail mode.
	if expiredFor > 0 {
		t.Errorf("policies expired in %d sampled seconds of a %v restart, with the default TTL and warm-up", expiredFor, down)
	}
	// No spurious 0, no spike: the ratio every sidecar held for web stays
	// near the surge's 0.8 (1 − 50/250) through the outage and the
	// restart — expired, it decays by 0.8 every 30 s — and no second
	// admits less than half or more than twice the limit.
	for s := killSec; s < runFor; s++ {
		if minRatio[s] < 0.6 || maxRatio[s] > 0.9 {
			t.Errorf("t=%ds: the sidecars' ratios for web were %.3f..%.3f, want within 0.6..0.9 (0.8 holds web at its limit)", s, minRatio[s], maxRatio[s])
		}
		if n := float64(load.web(s)); n < 0.5*faultLimit || n > 2*faultLimit {
			t.Errorf("t=%ds: web admitted %v, want within 0.5..2 × the limit %v", s, n, faultLimit)
		}
	}
	// Measured from the first full second in which every sidecar held a
	// policy of the new controller again: measured from the restart, the
	// window would be within ±5 % before the expiry that follows it.
	took := load.recovered(freshSec)
	if took >= 0 {
		took += freshSec - killSec
	}
	t.Logf("FIGURE controller restart: web back within ±5 %% of its limit for good %d s after the kill (bound %d s)", took, controllerRestartBound)
	if took < 0 || took > controllerRestartBound {
		t.Errorf("web was back within ±5 %% for good %d s after the kill, want within %d s", took, controllerRestartBound)
	}
	if took >= 0 {
		load.checkSteady(t, "after the restart", killSec+took, runFor)
	}
	load.checkBatch(t)
	checkGoroutines(t, sidecars[0], sidecarGoroutines)
	checkGoroutines(t, aggs[0], aggGoroutines)

	stopAll(t, append(sidecars, append(aggs, ctl)...)...)
	app.srv.Close()
	base.check(t)
}

// partition forwards TCP connections, from one zone to the controller, and
// can cut them. Cut, it forwards no byte either way and connects nothing
// new, but closes nothing either: the peers see silence, as in a network
// partition, and not the resets a killed process's kernel sends. Healed,
// what was held flows again.
type partition struct {
	ln     net.Listener
	target string
	quit   chan struct{} // closed by close
	wg     sync.WaitGroup

	mu    sync.Mutex // protects up and conns
	up    chan struct{}
	conns map[net.Conn]struct{}
}

func newPartition(t *testing.T, target string) *partition {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln, target: target, quit: make(chan struct{}), up: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.up)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *partition) addr() string { return p.ln.Addr().String() }

// pass waits while the link is cut; false once it is closed.
func (p *partition) pass() bool {
	p.mu.Lock()
	up := p.up
	p.mu.Unlock()
	select {
	case <-up:
		return true
	case <-p.quit:
		return false
	}
}

func (p *partition) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
		p.up = make(chan struct{})
	default:
	}
}

func (p *partition) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.up:
	default:
		close(p.up)
	}
}

// track remembers c so that close can end it; false when closing.
func (p *partition) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.quit:
		c.Close()
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *partition) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() {
			if !p.pass() {
				return
			}
			u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				c.Close()
				return
			}
			if !p.track(u) {
				return
			}
			p.wg.Go(func() { p.pipe(u, c) })
			p.pipe(c, u)
		})
	}
}

// pipe copies src to dst while the link is up, and closes both at the end
// of either.
func (p *partition) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *partition) close() {
	p.mu.Lock()
	select {
	case <-p.quit:
		p.mu.Unlock()
		return
	default:
	}
	close(p.quit)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// TestFaultZoneCut cuts zone c off from the controller mid-surge: its
// aggregator's zone-load stream and its sidecars' xDS streams go silent
// (a partition, below), while zone c's own links — sidecars to their
// aggregator, callers to the sidecars — stay up, as they would. Fail mode
// open, with a policy TTL and a decay of 4 s each to keep the test short.
//
// Why not stop the aggregator: SIGKILL resets its connections, which a
// partition does not, and SIGSTOP freezes zone c's reports as well and
// leaves its sidecars' xDS streams to the controller up, so zone c would
// keep getting policies computed without its load. Why not network
// namespaces: they need root and interfaces set up outside the test.
//
// What the test asserts: the controller drops zone c's load within a few
// flush intervals; zones a and b together are held at the limit (they get
// all of it: the controller no longer sees zone c); zone c's sidecars hold
// their policy for its TTL, then fail open, decaying to admit all of zone
// c's traffic, counted as fail-open decisions; once the cut heals, the
// whole fleet is back within ±5 % of the limit within zoneHealBound.
func TestFaultZoneCut(t *testing.T) { retryBusy(testFaultZoneCut)(t) }

func testFaultZoneCut(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test with processes: about 45 s")
	}
	const (
		runFor = 38
		cutAt  = 10
		healAt = 24
		ttl    = 4 * time.Second
		decay  = 4 * time.Second
		// zoneHealBound is the documented bound on the time from the heal
		// back to ±5 %: zone c's xDS stream resumes as the partition lets
		// its bytes through, its aggregator's stream may have to be
		// redialled (backoff at most 1 s), then a flush and a tick.
		zoneHealBound = 8
	)
	base := takeBaseline(t)

	limits := writeFaultLimits(t, "open")
	ctl := startController(t, "--limits="+limits, "--warmup=1s", "--policy-ttl="+ttl.String(), "--fail-open-decay="+decay.String())
	waitReady(t, ctl.proc, ctl.admin)
	link := newPartition(t, ctl.addr)
	var aggs, sidecars []*node
	apps := map[string]*upstream{}
	for _, zone := range []string{"zone-a", "zone-b", "zone-c"} {
		to := ctl.addr
		if zone == "zone-c" {
			to = link.addr()
		}
		apps[zone] = newUpstream(t, runFor)
		agg := startAggregatorAs(t, "aggregator-"+zone, zone, to)
		aggs = append(aggs, agg)
		sidecars = append(sidecars, startFaultSidecars(t, 2, zone, apps[zone].srv.URL, agg.addr, to)...)
	}
	cut := sidecars[4:] // zone c's

	load := runLoad(t, runFor, targets(sidecars), apps["zone-a"], apps["zone-b"], apps["zone-c"])
	ab := &faultLoad{ups: []*upstream{apps["zone-a"], apps["zone-b"]}, seconds: runFor} // zones a and b
	c := &faultLoad{ups: []*upstream{apps["zone-c"]}, seconds: runFor}                  // zone c
	expired := make([]float64, runFor)                                                  // zone c's sidecars with an expired policy
	aggregators := make([]float64, runFor)                                              // zone loads the controller holds
	sm := load.sample(t, func(s int) error {
		for _, sc := range cut {
			e, err := scrape(sc.admin, "sluice_sidecar_policy_state", `state="expired"`)
			if err != nil {
				return err
			}
			expired[s] += e
		}
		n, err := scrape(ctl.admin, "sluice_controller_aggregators")
		aggregators[s] = n
		return err
	})
	load.at(cutAt - 0.5)
	ctlGoroutines := goroutines(t, ctl)
	cutSidecarGoroutines := goroutines(t, cut[0])
	cutAggGoroutines := goroutines(t, aggs[2])
	load.at(cutAt)
	link.cut()
	cutTime := time.Now()
	testkit.WaitFor(t, startTimeout, "the controller drops zone c's load", func() bool {
		n, _ := metric(t, ctl.admin, "sluice_controller_aggregators")
		return n == 2
	})
	t.Logf("FIGURE zone cut: the controller dropped zone c's load %v after the cut", time.Since(cutTime).Round(10*time.Millisecond))
	testkit.WaitFor(t, startTimeout, "zone c's sidecars' policies expire", func() bool {
		for _, sc := range cut {
			if n, _ := metric(t, sc.admin, "sluice_sidecar_policy_state", `state="expired"`); n != 1 {
				return false
			}
		}
		return true
	})
	t.Logf("FIGURE zone cut: zone c's policies expired (fail mode open) %v after the cut (TTL %v)", time.Since(cutTime).Round(10*time.Millisecond), ttl)
	load.at(healAt)
	link.heal()
	healed := time.Now()
	testkit.WaitFor(t, startTimeout, "zone c's sidecars hold a fresh policy again", func() bool {
		for _, sc := range cut {
			if n, _ := metric(t, sc.admin, "sluice_sidecar_policy_state", `state="fresh"`); n != 1 {
				return false
			}
		}
		return true
	})
	t.Logf("FIGURE zone cut: zone c's sidecars fresh again %v after the heal", time.Since(healed).Round(10*time.Millisecond))
	sm.check(t)
	load.wait(t, func(s int) string {
		return fmt.Sprintf("zones a+b admitted %3d, zone c %3d | zone loads held %v, zone c sidecars expired %v",
			ab.web(s), c.web(s), aggregators[s], expired[s])
	})
	requireOnSchedule(t, load.g, 5, runFor)

	load.checkSteady(t, "before the cut", 5, cutAt)
	// Zone c's share of web: a third of 250 rps, ~83 rps.
	offeredC := faultWeb / 3
	// While cut, after the controller dropped zone c (3 flushes) and the
	// ratio settled, zones a and b get the whole limit between them.
	if m := ab.mean(cutAt+4, healAt); !within(m) {
		t.Errorf("zones a and b admitted %.1f rps of web while zone c was cut, want the whole limit %v ± 5 %%", m, faultLimit)
	} else {
		t.Logf("FIGURE zone cut: zones a and b admitted %.1f rps of web while zone c was cut (the whole limit, %v)", m, faultLimit)
	}
	// Zone c: held its ratio (a fifth of its traffic) for the TTL, then
	// failed open; from TTL + decay + 2 s on (the last refresh may be up to
	// half a TTL old at the cut) it admits everything.
	openFrom := cutAt + int((ttl+decay)/time.Second) + 2
	if openFrom >= healAt {
		t.Fatalf("the cut is too short to see zone c fail open: %d ≥ %d", openFrom, healAt)
	}
	if m := c.mean(openFrom, healAt); m < 0.9*offeredC {
		t.Errorf("zone c admitted %.1f rps of web once failed open, want all of its %.0f rps", m, offeredC)
	} else {
		t.Logf("FIGURE zone cut: zone c admitted %.1f rps of web (all of its %.0f) from %d s after the cut: the fleet admitted %.1f rps against a limit of %v",
			m, offeredC, openFrom-cutAt, load.mean(openFrom, healAt), faultLimit)
	}
	if m := c.mean(cutAt, cutAt+2); m > 0.5*offeredC {
		t.Errorf("zone c admitted %.1f rps of web right after the cut, want its held ratio (about %.0f)", m, offeredC/5)
	}
	for _, sc := range cut {
		if n, _ := metric(t, sc.admin, "sluice_sidecar_fail_open_total"); !(n > 0) {
			t.Errorf("%s: sluice_sidecar_fail_open_total = %v, want > 0", sc.Name(), n)
		}
	}
	took := load.recovered(healAt)
	t.Logf("FIGURE zone cut: web back within ±5 %% of its limit %d s after the heal (bound %d s)", took, zoneHealBound)
	if took < 0 || took > zoneHealBound {
		t.Errorf("web was back within ±5 %% %d s after the heal, want within %d s", took, zoneHealBound)
	}
	load.checkSteady(t, "after the heal", healAt+zoneHealBound, runFor)
	load.checkBatch(t)
	if n, _ := metric(t, ctl.admin, "sluice_controller_aggregators"); n != 3 {
		t.Errorf("sluice_controller_aggregators = %v after the heal, want 3", n)
	}
	checkGoroutines(t, ctl, ctlGoroutines)
	checkGoroutines(t, cut[0], cutSidecarGoroutines)
	checkGoroutines(t, aggs[2], cutAggGoroutines)

	stopAll(t, append(sidecars, append(aggs, ctl)...)...)
	link.close()
	for _, u := range apps {
		u.srv.Close()
	}
	base.check(t)
}

// TestFaultPostgresDown stops the controller's Postgres (a fast shutdown,
// the server process really gone) for at least 60 s mid-surge, while the
// controller records minute rows, then starts it again on the same port
// and data. No minute row may be lost: after the controller's shutdown
// flush, every bucket has one row for every minute from its first to the
// last, and the controller counted as written exactly the rows the table
// holds. The buffer metric rises while Postgres is away and drains after.
// The loop, which reads limits from Postgres, holds web at its limit
// throughout.
func TestFaultPostgresDown(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test with processes and Postgres: about 2 minutes")
	}
	const (
		outage = 60 * time.Second
		// drainBound bounds the time from Postgres' return until the
		// buffer is empty: the recorder retries with a backoff that
		// doubles up to 30 s, plus its 5 s write interval.
		drainBound = 45 * time.Second
	)
	url := pgtest.URL(t)
	base := takeBaseline(t) // with Postgres running: its server outlives the test
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := history.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	db, err := history.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	for _, caller := range []string{"web", "batch"} {
		l := history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: caller}, Limit: faultLimit,
			Mode: new(dropratio.Enforce), Source: history.Manual}
		if err := db.SetLimit(ctx, l, history.Change{Actor: "e2e", Reason: "fault test"}); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	ctl := startController(t, "--database-url="+url, "--warmup=1s")
	waitReady(t, ctl.proc, ctl.admin)
	agg := startAggregatorAs(t, "aggregator-zone-a", "zone-a", ctl.addr)
	app := newUpstream(t, 200)
	sidecars := startFaultSidecars(t, 2, "zone-a", app.srv.URL, agg.addr, ctl.addr)

	// The outage must contain a minute boundary, so that a whole minute
	// closes while Postgres is away: it lasts 60 s, longer if the next
	// boundary would fall less than 10 s before its end. The load runs
	// through the outage and 20 s beyond.
	const stopAt = 8 * time.Second
	plannedStop := time.Now().Add(stopAt)
	boundary := plannedStop.Truncate(time.Minute).Add(time.Minute)
	down := max(outage, boundary.Sub(plannedStop)+10*time.Second)
	runFor := int((stopAt + down + 20*time.Second) / time.Second)
	// Ten more callers at 2 rps each, under the default limit (none), so
	// that each minute has a dozen rows.
	var extra []loadgen.Caller
	callers := []string{"web", "batch"}
	for i := range 10 {
		name := fmt.Sprintf("caller-%02d", i)
		extra = append(extra, loadgen.Caller{Name: name, Rate: rate(2)})
		callers = append(callers, name)
	}
	load := runLoadWith(t, runFor, targets(sidecars), extra, app)
	buffered := make([]float64, runFor)
	sm := load.sample(t, func(s int) error {
		n, err := scrape(ctl.admin, "sluice_controller_history_rows_buffered")
		buffered[s] = n
		return err
	})
	load.at(stopAt.Seconds())
	pgtest.StopServer(t)
	stopped := time.Now()
	t.Logf("Postgres stopped at t=%.1fs; the minute %s closes while it is away; down for %v",
		stopped.Sub(load.begin).Seconds(), boundary.Add(-time.Minute).Format("15:04"), down.Round(time.Second))
	downFrom := int(stopped.Sub(load.begin) / time.Second)
	// While down: a minute closes into the buffer, and writing it fails.
	testkit.WaitFor(t, down, "minute rows buffered and a failed write while Postgres is away", func() bool {
		b, _ := metric(t, ctl.admin, "sluice_controller_history_rows_buffered")
		e, _ := metric(t, ctl.admin, "sluice_controller_history_write_errors_total")
		return b > 0 && e > 0
	})
	time.Sleep(time.Until(stopped.Add(down)))
	maxBuffered, _ := metric(t, ctl.admin, "sluice_controller_history_rows_buffered")
	pgtest.StartServer(t)
	back := time.Now()
	backAt := int(back.Sub(load.begin)/time.Second) + 1
	testkit.WaitFor(t, drainBound, "the buffered rows are written after Postgres is back", func() bool {
		b, _ := metric(t, ctl.admin, "sluice_controller_history_rows_buffered")
		return b == 0
	})
	drained := time.Since(back)
	t.Logf("FIGURE Postgres down: %v rows buffered after %v down; the buffer drained %v after Postgres was back (bound %v)",
		maxBuffered, back.Sub(stopped).Round(time.Second), drained.Round(100*time.Millisecond), drainBound)
	sm.check(t)
	load.wait(t, func(s int) string { return fmt.Sprintf("history rows buffered %v", buffered[s]) })

	load.checkSteady(t, "before Postgres stopped", 5, downFrom)
	load.checkLong(t, "FIGURE Postgres down: while Postgres was away", downFrom, backAt-1)
	load.checkSteady(t, "after Postgres came back", backAt, runFor)
	load.checkBatch(t)

	// The controller's shutdown flushes the minute in progress; then the
	// table must hold every minute of every bucket, and exactly what the
	// controller counted as written.
	stopAll(t, sidecars...)
	stopAll(t, agg)
	// The counters just before the shutdown flush, which adds the minute
	// in progress.
	written, _ := metric(t, ctl.admin, "sluice_controller_history_rows_written_total")
	dropped, _ := metric(t, ctl.admin, "sluice_controller_history_rows_dropped_total")
	stopAll(t, ctl)
	if dropped != 0 {
		t.Errorf("sluice_controller_history_rows_dropped_total = %v, want 0", dropped)
	}

	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err = history.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, caller := range callers {
		rows, err := db.Minutes(ctx, history.Bucket{Callee: "checkout", Caller: caller}, load.begin.Add(-time.Hour), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		total += len(rows)
		var minutes []string
		for i, r := range rows {
			minutes = append(minutes, r.Minute.UTC().Format("15:04"))
			if i > 0 && !r.Minute.Equal(rows[i-1].Minute.Add(time.Minute)) {
				t.Errorf("checkout/%s: no row for the minutes between %s and %s", caller, rows[i-1].Minute.Format("15:04"), r.Minute.Format("15:04"))
			}
		}
		last := time.Now().UTC().Truncate(time.Minute)
		if len(rows) == 0 || rows[len(rows)-1].Minute.Before(last.Add(-time.Minute)) || !rows[0].Minute.Before(boundary.Add(-time.Minute).Add(time.Second)) {
			t.Errorf("checkout/%s: minutes %v, want every minute from %s or before to %s or after", caller, minutes,
				boundary.Add(-time.Minute).Format("15:04"), last.Add(-time.Minute).Format("15:04"))
		}
		t.Logf("checkout/%s: one row for each minute of %v", caller, minutes)
	}
	db.Close()
	// written is from before the shutdown flush. The flush writes the
	// minute in progress: a row per bucket with load in it, none when the
	// load stopped just before a minute began; a minute that closed between
	// the scrape and SIGTERM may add a row per bucket more.
	n := float64(len(callers))
	if float64(total) < written || float64(total) > written+2*n {
		t.Errorf("the table holds %d rows, the controller counted %v written before its shutdown flush, want that + 0 to %v", total, written, 2*n)
	}
	t.Logf("FIGURE Postgres down: %d minute rows in the table, %v counted written before the shutdown flush, 0 dropped", total, written)

	app.srv.Close()
	base.check(t)
}
