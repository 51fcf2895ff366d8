//go:build unix

// The caller table can not be captured: a flood of made-up caller names,
// or names that sort before the real callers, must not leave a limited
// caller without its own counters at a sidecar (issue 13).

package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/sidecar"
)

const (
	// tableMaxPeers is the attacked sidecars' --max-peers: small, so
	// that filling it takes a second, not 200,000 requests.
	tableMaxPeers = 32
	// tableRSSBound bounds the resident memory of an attacked sidecar.
	// A sidecar at rest is about 15 MiB; a table of tableMaxPeers peers
	// and a handful of limited ones adds well under one.
	tableRSSBound = 48 << 20
	// tableTolerance is how far above its limit a limited caller's
	// admitted rate may be, averaged over the judged seconds.
	tableTolerance = 0.25
)

// tableLimits writes callers' limits (name: rps) for checkout to path,
// atomically: the controller polls the file and must never read half of it.
func tableLimits(t *testing.T, path string, callers map[string]float64) {
	t.Helper()
	doc := "services:\n  checkout:\n    callers:\n"
	for name, limit := range callers {
		doc += fmt.Sprintf("      %s: {limit: %v}\n", name, limit)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tableLoop starts a controller reading limitsFile (polled every 200 ms)
// and one aggregator, and returns the controller and the aggregator.
func tableLoop(t *testing.T, limitsFile string) (ctl, agg *node) {
	t.Helper()
	ctl = startController(t, "--limits="+limitsFile, "--limits-reload=200ms", "--warmup=1s")
	waitReady(t, ctl.proc, ctl.admin)
	agg = startAggregator(t, "zone-a", ctl.addr)
	waitReady(t, agg.proc, agg.admin)
	return ctl, agg
}

// startTableSidecar starts a checkout sidecar with --max-peers maxPeers in
// front of app, and waits until it is ready.
func startTableSidecar(t *testing.T, id, app string, maxPeers int, ctl, agg *node) *node {
	t.Helper()
	p := start(t, id, "sidecar", "--id="+id, "--service=checkout", "--zone=zone-a", "--upstream="+app,
		"--aggregators="+agg.addr, "--controllers="+ctl.addr, fmt.Sprintf("--max-peers=%d", maxPeers),
		"--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0")
	n := &node{proc: p, admin: p.addr(t, "admin"), addr: p.addr(t, "http")}
	waitReady(t, p, n.admin)
	return n
}

// tableApp is the app behind the sidecars: it answers every request.
func tableApp(t *testing.T) string {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	}))
	t.Cleanup(app.Close)
	return app.URL
}

// sendAs sends one request per name through the sidecar at url, eight at a
// time, each name in the caller header, and returns how many were answered.
func sendAs(t *testing.T, url string, callers []string) int {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: getTimeout}
	var mu sync.Mutex
	answered := 0
	var g sync.WaitGroup
	const workers = 8
	for w := range workers {
		g.Go(func() {
			for i := w; i < len(callers); i += workers {
				req, err := http.NewRequest(http.MethodGet, url+"/", nil)
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set(sidecar.DefaultCallerHeader, callers[i])
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				answered++
				mu.Unlock()
			}
		})
	}
	g.Wait()
	return answered
}

// tableRun is a load run of fixed rates through one sidecar.
type tableRun struct {
	g       *loadgen.Generator
	seconds int
	ctx     context.Context
}

func newTableRun(t *testing.T, target string, seconds int, callers map[string]float64) *tableRun {
	t.Helper()
	var cs []loadgen.Caller
	for name, r := range callers {
		cs = append(cs, loadgen.Caller{Name: name, Rate: rate(r)})
	}
	g, err := loadgen.New(loadgen.Options{Targets: []string{"http://" + target}, Callers: cs, Duration: time.Duration(seconds) * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &tableRun{g: g, seconds: seconds}
}

// run runs the load to its end, calling onSecond at the start of each
// second, and logs each caller's seconds.
func (r *tableRun) run(t *testing.T, onSecond func(s int), callers ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.seconds)*time.Second+startTimeout)
	defer cancel()
	if err := r.g.Run(ctx, onSecond); err != nil {
		t.Fatal(err)
	}
	for s := range r.seconds {
		line := fmt.Sprintf("t=%2ds", s)
		for _, c := range callers {
			x := r.g.Second(c, s)
			line += fmt.Sprintf(" | %s sent=%3d admitted=%3d", c, x.Sent, x.Admitted)
		}
		t.Log(line)
	}
}

// requireLimited fails the test unless caller's admitted rate over seconds
// [from, to) is at most its limit, give or take tableTolerance, and logs it.
func (r *tableRun) requireLimited(t *testing.T, caller string, limit float64, from, to int) {
	t.Helper()
	admitted := admittedRate(r.g, caller, from, to)
	sent := float64(r.g.Sum(caller, from, to).Sent) / float64(to-from)
	t.Logf("%s: offered %.1f rps, admitted %.1f rps over seconds [%d, %d); limit %v", caller, sent, admitted, from, to, limit)
	if admitted > limit*(1+tableTolerance) {
		t.Errorf("%s admitted %.1f rps over seconds [%d, %d), above its limit %v (+%.0f %%): not limited at this sidecar",
			caller, admitted, from, to, limit, 100*tableTolerance)
	}
}

// requireVictim asserts that victim, under its limit, kept its allowance:
// what the generator sent it, up to the limit.
func (r *tableRun) requireVictim(t *testing.T, victim string, limit float64, from, to int) {
	t.Helper()
	sent := float64(r.g.Sum(victim, from, to).Sent) / float64(to-from)
	requireAllowance(t, victim, admittedRate(r.g, victim, from, to), math.Min(sent, limit))
}

// TestHostileTableFloodThenNewLimit floods a real sidecar with distinct
// made-up caller names, far more than its --max-peers, and then adds a
// limit for a new caller, mobile, to the controller's limits file. mobile,
// sending 3× its limit, must be held to it at the flooded sidecar within a
// few seconds, and victim, under its limit, keep its allowance.
//
// Before: the table only grew, so the flood left no room, and mobile's
// requests were counted and judged as _overflow. The controller never saw
// mobile's load, its ratio stayed 0, and all of it was admitted (100/100
// in the issue). Now a limited caller always has its own slot.
func TestHostileTableFloodThenNewLimit(t *testing.T) { retryBusy(testHostileTableFloodThenNewLimit)(t) }

func testHostileTableFloodThenNewLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 20 s")
	}
	const (
		mobileLimit, mobileRate = 20.0, 60.0
		victimLimit, victimRate = 40.0, 30.0
		flood                   = 2000  // distinct names, 60× --max-peers
		seconds, judged         = 12, 6 // of load; judged from this second on
	)
	limitsFile := filepath.Join(t.TempDir(), "limits.yaml")
	tableLimits(t, limitsFile, map[string]float64{"victim": victimLimit})
	ctl, agg := tableLoop(t, limitsFile)
	sc := startTableSidecar(t, "sidecar-flooded", tableApp(t), tableMaxPeers, ctl, agg)

	names := make([]string, flood)
	for i := range names {
		names[i] = fmt.Sprintf("flood-%05d", i)
	}
	start := time.Now()
	answered := sendAs(t, "http://"+sc.addr, names)
	peers, _ := metric(t, sc.admin, "sluice_sidecar_peers")
	t.Logf("flood: %d distinct callers in %v, %d answered; the sidecar has %.0f peers (--max-peers %d)",
		flood, time.Since(start).Round(time.Millisecond), answered, peers, tableMaxPeers)
	if peers < tableMaxPeers {
		t.Fatalf("the flood did not fill the table: %.0f peers", peers)
	}

	// The operator adds mobile's limit; the controller reloads the file.
	tableLimits(t, limitsFile, map[string]float64{"victim": victimLimit, "mobile": mobileLimit})
	r := newTableRun(t, sc.addr, seconds, map[string]float64{"mobile": mobileRate, "victim": victimRate})
	listed := -1
	r.run(t, func(s int) {
		if _, ok := metric(t, sc.admin, "sluice_sidecar_drop_ratio", `peer="mobile"`); ok && listed < 0 {
			listed = s
		}
	}, "mobile", "victim")
	t.Logf("the flooded sidecar held a policy listing mobile from second %d", listed)
	if listed < 0 || listed >= judged {
		t.Errorf("the flooded sidecar listed mobile from second %d, want before second %d, the first judged", listed, judged)
	}
	requireOnSchedule(t, r.g, judged, seconds)
	r.requireLimited(t, "mobile", mobileLimit, judged, seconds)
	if n, _ := metric(t, sc.admin, "sluice_sidecar_requests_total", `peer="mobile"`, `outcome="dropped"`); !(n > 0) {
		t.Errorf("the flooded sidecar dropped none of mobile's requests (sluice_sidecar_requests_total{peer=\"mobile\"}: %v)", n)
	}
	r.requireVictim(t, "victim", victimLimit, judged, seconds)
	requireRSS(t, sc, tableRSSBound)
}

// TestHostileSortedNameSquat spoofs twice a table's worth of caller names
// that sort before the real callers' (aaa-…) through two sidecars, the
// second with a larger table, so that all of them reach the controller;
// restarts the first while the spoofing goes on at the second; then stops
// spoofing. At the restarted sidecar web, sending 3× its limit, must be
// held to it, and victim, under its limit, have counters of its own and
// keep its allowance.
//
// Before: the controller listed every caller it saw, spoofed ones too, and
// a sidecar pre-filled its table from the policy in name order, as far as
// --max-peers allowed; the restarted sidecar gave every slot to spoofed
// names, its table never shrank, and web and victim were _overflow there
// for good: web unlimited. Now the controller lists only callers with a
// limit or a ratio, and those always have their own slot.
func TestHostileSortedNameSquat(t *testing.T) { retryBusy(testHostileSortedNameSquat)(t) }

func testHostileSortedNameSquat(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 25 s")
	}
	const (
		webLimit, webRate       = 20.0, 60.0
		victimLimit, victimRate = 40.0, 30.0
		spoofed                 = 2 * tableMaxPeers
		seconds, judged         = 10, 5
	)
	limitsFile := filepath.Join(t.TempDir(), "limits.yaml")
	tableLimits(t, limitsFile, map[string]float64{"web": webLimit, "victim": victimLimit})
	ctl, agg := tableLoop(t, limitsFile)
	app := tableApp(t)
	first := startTableSidecar(t, "sidecar-1", app, tableMaxPeers, ctl, agg)
	other := startTableSidecar(t, "sidecar-2", app, 4*tableMaxPeers, ctl, agg)

	// The spoofing: each name a few times a second, so that every report
	// names them all.
	names := make([]string, spoofed)
	for i := range names {
		names[i] = fmt.Sprintf("aaa-%03d", i)
	}
	spoof := func(ctx context.Context, targets ...*node) {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, n := range targets {
				sendAs(t, "http://"+n.addr, names)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var spoofing sync.WaitGroup
	spoofing.Go(func() { spoof(ctx, first, other) })
	testkit.WaitFor(t, startTimeout, "the aggregator flushes every spoofed name", func() bool {
		b, _ := metric(t, agg.admin, "sluice_aggregator_flush_buckets")
		return b >= spoofed
	})
	testkit.WaitFor(t, startTimeout, "the controller runs the law over every spoofed name", func() bool {
		b, _ := metric(t, ctl.admin, "sluice_controller_buckets")
		return b >= spoofed
	})

	// sidecar-1 restarts while the spoofing goes on at sidecar-2.
	cancel()
	spoofing.Wait()
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	spoofing.Go(func() { spoof(ctx, other) })
	first.stop(t)
	restarted := startTableSidecar(t, "sidecar-1b", app, tableMaxPeers, ctl, agg)
	testkit.WaitFor(t, startTimeout, "the restarted sidecar holds a policy", func() bool {
		_, ok := metric(t, restarted.admin, "sluice_sidecar_policy_peers")
		return ok
	})
	// Two more controller ticks over the spoofed names, which still come
	// through sidecar-2, while the restarted sidecar is connected.
	ticks := func() float64 {
		n, _ := metric(t, ctl.admin, "sluice_controller_tick_duration_seconds_count")
		return n
	}
	ticked := ticks()
	testkit.WaitFor(t, startTimeout, "two controller ticks over the spoofed names", func() bool {
		b, _ := metric(t, ctl.admin, "sluice_controller_buckets")
		return b >= spoofed && ticks() >= ticked+2
	})
	cancel()
	spoofing.Wait()
	peers, _ := metric(t, restarted.admin, "sluice_sidecar_peers")
	listed, _ := metric(t, restarted.admin, "sluice_sidecar_policy_peers")
	t.Logf("spoofed %d names that sort first; the restarted sidecar holds a policy of %.0f callers and has %.0f peers (--max-peers %d)",
		spoofed, listed, peers, tableMaxPeers)

	r := newTableRun(t, restarted.addr, seconds, map[string]float64{"web": webRate, "victim": victimRate})
	r.run(t, nil, "web", "victim")
	requireOnSchedule(t, r.g, judged, seconds)
	r.requireLimited(t, "web", webLimit, judged, seconds)
	if n, ok := metric(t, restarted.admin, "sluice_sidecar_requests_total", `peer="victim"`); !ok || n == 0 {
		t.Errorf("the restarted sidecar has no counters of victim's own: it was judged as another peer")
	}
	r.requireVictim(t, "victim", victimLimit, judged, seconds)
	requireRSS(t, restarted, tableRSSBound)
}
