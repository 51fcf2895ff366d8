//go:build unix

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testkit"
)

// writeHostileLimits writes a limits file for checkout: each caller's limit in rps, and the
// fail mode.
func writeHostileLimits(t *testing.T, failMode string, limits map[string]float64) string {
	t.Helper()
	doc := "services:\n  checkout:\n    fail_mode: " + failMode + "\n    callers:\n"
	for caller, limit := range limits {
		doc += fmt.Sprintf("      %s: {limit: %v}\n", caller, limit)
	}
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// cappedApp is an app that serves at most capacity connections at once, as a real one with
// a bounded pool does: the next connection waits in the listen queue. It reads every body to
// its end, and records the most connections it ever had open.
type cappedApp struct {
	srv            *httptest.Server
	open, maxOpen  atomic.Int64
	slots          chan struct{}
	mu             sync.Mutex // protects conns
	conns          map[net.Conn]bool
	bodiesComplete atomic.Int64
}

func newCappedApp(t *testing.T, capacity int) *cappedApp {
	a := &cappedApp{slots: make(chan struct{}, capacity), conns: make(map[net.Conn]bool)}
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err == nil && r.ContentLength > 0 {
			a.bodiesComplete.Add(1)
		}
	}))
	a.srv.Listener = &cappedListener{Listener: a.srv.Listener, a: a}
	a.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed || s == http.StateHijacked {
			a.release(c)
		}
	}
	a.srv.Start()
	t.Cleanup(a.srv.Close)
	return a
}

func (a *cappedApp) release(c net.Conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns[c] {
		delete(a.conns, c)
		a.open.Add(-1)
		<-a.slots
	}
}

// cappedListener accepts a connection only when the app has a slot for it.
type cappedListener struct {
	net.Listener
	a *cappedApp
}

func (l *cappedListener) Accept() (net.Conn, error) {
	l.a.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.a.slots
		return nil, err
	}
	l.a.mu.Lock()
	l.a.conns[c] = true
	l.a.mu.Unlock()
	if n := l.a.open.Add(1); n > l.a.maxOpen.Load() {
		l.a.maxOpen.Store(n) // only Accept's goroutine raises it
	}
	return c, nil
}

// slowPoster holds POSTs that declare a gigabyte and send a byte every trickle, each on its
// own connection, from conns goroutines until ctx ends; a request that is answered (or cut)
// is followed by another after a pause. It counts the answers by status.
type slowPoster struct {
	target  string
	caller  string
	trickle time.Duration
	sent    atomic.Int64
	byCode  sync.Map // status code → *atomic.Int64
	longest atomic.Int64
}

func (p *slowPoster) run(ctx context.Context, conns int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				p.once(ctx)
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		})
	}
	return &wg
}

// once holds one slow POST until it is answered or ctx ends.
func (p *slowPoster) once(ctx context.Context) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.target)
	if err != nil {
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	p.sent.Add(1)
	begin := time.Now()
	head := "POST /upload HTTP/1.1\r\nHost: checkout\r\nx-sluice-caller: " + p.caller + "\r\nContent-Length: 1000000000\r\n\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		return
	}
	answered := make(chan int, 1)
	go func() {
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- 0
			return
		}
		res.Body.Close()
		answered <- res.StatusCode
	}()
	tick := time.NewTicker(p.trickle)
	defer tick.Stop()
	for {
		select {
		case code := <-answered:
			if held := time.Since(begin); code != 0 && int64(held) > p.longest.Load() {
				p.longest.Store(int64(held)) // one goroutine at a time may race here; a log figure
			}
			n, _ := p.byCode.LoadOrStore(code, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			return
		case <-tick.C:
			if _, err := c.Write([]byte("x")); err != nil {
				// The proxy closed the connection; its answer, if any, is on the way.
				continue
			}
		}
	}
}

func (p *slowPoster) count(code int) int64 {
	if n, ok := p.byCode.Load(code); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// TestHostileSlowBodies: an abuser, already over its limit, holds slow POSTs through the
// sidecar: each declares a gigabyte and sends a byte every 200 ms. Before the proxy had
// bounds, every one the limiter admitted held a connection to the app for as long as the
// abuser liked (the issue: 334 held for 60 s); here about 10 a second are admitted, so within
// seconds they filled the app's 64 connections and the victim's requests waited behind them.
// Now each is cut at --proxy-body-timeout (1 s here) plus its bytes at --proxy-min-body-rate
// (5 bytes at 240 B/s: 21 ms more) with 408, its connection to the app closed; the app's
// connections stay under --proxy-max-connections (as the app can see it: never all it has),
// and the victim keeps its allowance.
func TestHostileSlowBodies(t *testing.T) { retryBusy(testHostileSlowBodies)(t) }

func testHostileSlowBodies(t *testing.T) {
	const (
		seconds     = 12
		attackAt    = 3 // the abuser's fast load until then sets its drop ratio; the victim is judged from here
		appCapacity = 64
		proxyBound  = 48 // --proxy-max-requests and --proxy-max-connections: below the app's capacity
		slowConns   = 80
		victimRate  = 30.0
		victimLimit = 100.0
		abuserLimit = 10.0
	)
	app := newCappedApp(t, appCapacity)
	limits := writeHostileLimits(t, "open", map[string]float64{"victim": victimLimit, "abuser": abuserLimit})
	ctl := startController(t, "--limits="+limits, "--warmup=1s")
	waitReady(t, ctl.proc, ctl.admin)
	agg := startAggregatorAs(t, "aggregator-zone-a", "zone-a", ctl.addr)
	p := start(t, "sidecar-1", "sidecar", "--id=sidecar-1", "--service=checkout", "--zone=zone-a",
		"--upstream="+app.srv.URL, "--aggregators="+agg.addr, "--controllers="+ctl.addr,
		"--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0",
		"--proxy-body-timeout=1s", fmt.Sprintf("--proxy-max-requests=%d", proxyBound),
		fmt.Sprintf("--proxy-max-connections=%d", proxyBound))
	sc := &node{proc: p, admin: p.addr(t, "admin"), addr: p.addr(t, "http")}
	waitReady(t, sc.proc, sc.admin)

	// The victim under its limit for the whole run; the abuser at 5× its limit until the
	// slow attack takes over.
	g, err := loadgen.New(loadgen.Options{
		Targets: []string{"http://" + sc.addr},
		Callers: []loadgen.Caller{
			{Name: "victim", Rate: rate(victimRate)},
			{Name: "abuser", Rate: func(at time.Duration) float64 {
				if at < attackAt*time.Second {
					return 5 * abuserLimit
				}
				return 0
			}},
		},
		Duration: seconds * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, nil) }()

	// The attack starts once the abuser's fast load has set its drop ratio at the sidecar,
	// as for any abuser over its limit; the victim is judged from attackAt on.
	testkit.WaitFor(t, startTimeout, "the abuser's fast load sets its drop ratio", func() bool {
		r, ok := metric(t, sc.admin, "sluice_sidecar_drop_ratio", `peer="abuser"`)
		return ok && r > 0
	})
	attack := &slowPoster{target: sc.addr, caller: "abuser", trickle: 200 * time.Millisecond}
	attackCtx, stopAttack := context.WithCancel(ctx)
	wg := attack.run(attackCtx, slowConns)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stopAttack()
	wg.Wait()

	requireOnSchedule(t, g, attackAt, seconds)
	victim := g.Sum("victim", attackAt, seconds)
	span := float64(seconds - attackAt)
	allowance := min(float64(victim.Sent), victimLimit*span) / span
	t.Logf("slow POSTs: %d sent, %d cut with 408, %d dropped (429), %d refused (503), longest held %v; "+
		"the app's most open connections %d (bound %d); bodies the app read whole %d",
		attack.sent.Load(), attack.count(http.StatusRequestTimeout), attack.count(http.StatusTooManyRequests),
		attack.count(http.StatusServiceUnavailable), time.Duration(attack.longest.Load()).Round(time.Millisecond),
		app.maxOpen.Load(), proxyBound, app.bodiesComplete.Load())
	t.Logf("victim: sent %d, admitted %d, dropped %d, errors %d", victim.Sent, victim.Admitted, victim.Dropped, victim.Errors)
	requireAllowance(t, "victim", float64(victim.Admitted)/span, allowance)
	if attack.count(http.StatusRequestTimeout) == 0 {
		t.Error("no slow POST was cut by the body timeout")
	}
	// The sidecar's bound is exact on its side (internal/agent/proxy's TestMaxConnsRefusesAtOnce);
	// the app sees a connection the sidecar closed only when its own read of it ends, a
	// scheduling delay later, and may meanwhile accept the sidecar's next one: on a busy
	// machine its count passes the bound by a few (53 of 48 once in CI). What the bound is
	// for is that the abuser never fills the app: without it, the slow POSTs take all 64.
	if got := app.maxOpen.Load(); got >= appCapacity {
		t.Errorf("the app had %d connections open at once, all it has: the sidecar's bound of %d did not hold", got, proxyBound)
	}
	if cut, ok := metric(t, sc.admin, "sluice_sidecar_proxy_refused_total", `reason="body_timeout"`); !ok || cut == 0 {
		t.Errorf("sluice_sidecar_proxy_refused_total{reason=\"body_timeout\"} = %v (present %v), want the cuts counted", cut, ok)
	}
	requireRSS(t, sc, 100<<20)
}

// TestHostileFrozenController: the controller is frozen (SIGSTOP), its connections open but
// silent. Before keepalives the sidecar's xDS stream looked healthy for as long as the
// kernel kept the connection (40 s and more in the issue): sluice_sidecar_xds_connected stayed
// 1 and nothing failed over. Now the sidecar's pings go unanswered and it reports 0 within
// keepalive time + timeout (15 s); its policy's fail mode (local: each limit as a token
// bucket) has taken over by then, so the victim under its limit keeps its allowance and the
// abuser stays near its limit; after SIGCONT the sidecar reconnects.
func TestHostileFrozenController(t *testing.T) { retryBusy(testHostileFrozenController)(t) }

func testHostileFrozenController(t *testing.T) {
	const (
		seconds     = 22
		freezeAt    = 4
		victimRate  = 30.0
		victimLimit = 50.0
		abuserLimit = 10.0
		// keepaliveBound is liveness.PingInterval + PingTimeout, plus the slack of a busy
		// machine (a ping sent up to a second late, the metric scraped once a second).
		keepaliveBound = 15*time.Second + 3*time.Second
	)
	app := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(app.Close)
	limits := writeHostileLimits(t, "local", map[string]float64{"victim": victimLimit, "abuser": abuserLimit})
	ctl := startController(t, "--limits="+limits, "--warmup=1s", "--policy-ttl=4s")
	waitReady(t, ctl.proc, ctl.admin)
	agg := startAggregatorAs(t, "aggregator-zone-a", "zone-a", ctl.addr)
	sc := startSidecar(t, "sidecar-1", "zone-a", app.URL, agg.addr, ctl.addr)
	waitReady(t, sc.proc, sc.admin)
	connected := func() float64 {
		v, err := scrape(sc.admin, "sluice_sidecar_xds_connected")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	testkit.WaitFor(t, startTimeout, "the sidecar's xDS stream is connected", func() bool { return connected() == 1 })

	g, err := loadgen.New(loadgen.Options{
		Targets:  []string{"http://" + sc.addr},
		Callers:  []loadgen.Caller{{Name: "victim", Rate: rate(victimRate)}, {Name: "abuser", Rate: rate(5 * abuserLimit)}},
		Duration: seconds * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx, nil) }()

	time.Sleep(freezeAt * time.Second)
	if err := ctl.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := ctl.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	testkit.WaitFor(t, keepaliveBound, "the sidecar reports its xDS stream down", func() bool { return connected() == 0 })
	detected := time.Since(frozen)
	expired, err := scrape(sc.admin, "sluice_sidecar_policy_state", `state="expired"`)
	if err != nil {
		t.Fatal(err)
	}
	thaw()
	testkit.WaitFor(t, startTimeout, "the sidecar reconnects after SIGCONT", func() bool { return connected() == 1 })
	reconnected := time.Since(frozen)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	requireOnSchedule(t, g, 1, seconds)
	victim, abuser := g.Sum("victim", 1, seconds), g.Sum("abuser", 1, seconds)
	span := float64(seconds - 1)
	t.Logf("frozen at t=%ds: xds_connected 0 after %v (bound %v), policy expired then: %v; reconnected %v after the freeze",
		freezeAt, detected.Round(100*time.Millisecond), keepaliveBound, expired == 1, reconnected.Round(100*time.Millisecond))
	t.Logf("victim: sent %d admitted %d; abuser: sent %d admitted %d (%.1f rps, limit %v)",
		victim.Sent, victim.Admitted, abuser.Sent, abuser.Admitted, float64(abuser.Admitted)/span, abuserLimit)
	requireAllowance(t, "victim", float64(victim.Admitted)/span, min(float64(victim.Sent)/span, victimLimit))
	if expired != 1 {
		t.Errorf("policy state expired = %v when the stream was found down, want 1: the fail mode in force", expired)
	}
	if got := float64(abuser.Admitted) / span; got > 1.5*abuserLimit {
		t.Errorf("abuser admitted %.1f rps over the run, want it held near its limit %v by the policy and then the local fail mode", got, abuserLimit)
	}
	requireRSS(t, sc, 100<<20)
}
