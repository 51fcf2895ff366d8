//go:build unix

// Hostile input end to end: a flood of made-up caller names through a real
// sidecar, hostile caller headers, and messages at and past the gRPC size
// limits of the real binaries. Unix only, like binaries_test.go, whose
// helpers (get, metric, startController, startAggregator) it uses.

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

const (
	// floodDirect callers are decided by the sidecar's own Limiter, the one
	// its HTTP middleware uses: a million HTTP requests would take minutes
	// on two cores, ten times that under the race detector.
	floodDirect = 1_000_000
	// floodDirectRate paces them below what one report may claim
	// (aggregator --max-rate 1e7 rps, over a surge window of 100 ms), so
	// that this stays a test of the peer cap, not of that bound.
	floodDirectRate = 500_000
	// floodHTTP requests go through the sidecar's proxy over loopback, one
	// new caller each, a tenth of them hostile names.
	floodHTTP = 50_000

	// floodHeapBound bounds the growth of the live heap (after GC) of the
	// whole loop — sidecar, aggregator and controller, which all see the
	// flood's names — from before the flood to after it. Without the peer
	// cap the sidecar alone would hold an entry of 600 bytes for each of
	// the million names, 600 MB; with it the flood costs about 3 MB.
	floodHeapBound = 32 << 20
	// shutdownHeapSlack is how far above its value before the cluster
	// started the heap may stay once the cluster is closed.
	shutdownHeapSlack = 8 << 20
)

// heapAfterGC returns the live heap after two collections (the second
// frees what finalizers of the first released).
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func mb(n uint64) float64 { return float64(n) / (1 << 20) }

// metricValue is metric without a test: the sum of name's samples on an
// admin port, for a goroutine that samples.
func metricValue(admin, name string) (float64, bool) {
	m, err := metrics(admin)
	if err != nil {
		return 0, false
	}
	return m.Sum(name)
}

// randomName returns a valid service name of 8 to 40 bytes.
func randomName(r *rand.Rand, buf []byte) string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	const rest = alnum + "._-"
	b := buf[:8+r.IntN(33)]
	b[0] = alnum[r.IntN(len(alnum))]
	for i := 1; i < len(b); i++ {
		b[i] = rest[r.IntN(len(rest))]
	}
	return string(b)
}

// hostileCallers are the caller headers a tenth of the HTTP flood sends:
// whether the sidecar counts each as invalid (it becomes unknown either
// way, or a peer of its own when valid).
var hostileCallers = []struct {
	name    string
	value   string
	invalid bool
}{
	{"254 bytes", strings.Repeat("x", names.MaxLen+1), true},
	{"16 KiB", strings.Repeat("y", 16<<10), true},
	{"not UTF-8", "caller-\xff\xfe\xc3", true},
	{"space", "bad caller", true},
	{"slash", "web/../admin", true},
	{"leading dash", "-web", true},
	{"empty", "", false},
	{"reserved overflow", names.Overflow, false},
	{"253 bytes", strings.Repeat("z", names.MaxLen), false},
	{"no header", "\x00absent", false}, // sent without the header
}

// TestFloodOfDistinctCallers sends a million distinct random caller names
// into a real sidecar's Limiter and 50,000 more (a tenth of them hostile)
// through its HTTP proxy, in a loop of one sidecar, one aggregator and a
// controller. The sidecar must keep counters for at most MaxPeers callers
// and count the rest as _overflow, count every request once, and report
// all of it: reports within the aggregator's bounds, none rejected, the
// overflow reaching the controller. Meanwhile web, a caller with a limit,
// sends 5× it; once the flood is over it must be back within ±5 % of its
// limit within floodRecoveryBound. The heap must stay within
// floodHeapBound of its size before the flood, and once the loop is shut
// down, heap and goroutines must be back where they were.
func TestFloodOfDistinctCallers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: about 30 s, longer under the race detector")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("names from seed %d", seed)
	goroutinesBefore := runtime.NumGoroutine()
	heapBefore := heapAfterGC()

	cfg := controller.DefaultConfig()
	cfg.Warmup = time.Second
	logs := &testLog{w: t.Output()}
	c, err := testbed.Start(testbed.Options{
		Service:         "checkout",
		Zones:           []string{"zone-a"},
		SidecarsPerZone: 1,
		Limits:          checkoutLimits(),
		Controller:      &cfg,
		// The counts below read the callers the flood named long after
		// their last request when the machine is slow (the HTTP flood took
		// 65 s in CI): eviction of idle callers, tested in sidecar, must
		// not take their counts away before they are read.
		PeerIdle: 30 * time.Minute,
		Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	var closeOnce sync.Once
	closeCluster := func() {
		closeOnce.Do(func() {
			if err := c.Close(); err != nil {
				t.Errorf("close cluster: %v", err)
			}
			logs.close()
		})
	}
	t.Cleanup(closeCluster)
	testkit.WaitFor(t, 15*time.Second, "the sidecar holds a policy", func() bool { return c.Policy() != nil })

	sc := c.Sidecars[0]
	s := sc.Agent.Limiter().Service("checkout")
	maxPeers := agent.DefaultConfig().MaxPeers
	// web and batch have limits: they have counters of their own besides
	// the MaxPeers others. byPeer below leaves out web.
	const limited = 1 // batch

	// web, a caller with a limit, sends 5× it through the sidecar from
	// before the flood to after it (its own load is no part of the flood's
	// counts below). Being the first caller, it keeps a counter of its
	// own. The flood must not take the limit away: after the flood, web is
	// back within ±5 % of its limit within floodRecoveryBound.
	web := startFloodWebLoad(t, c.SidecarURLs())
	testkit.WaitFor(t, 15*time.Second, "web is held at its limit before the flood", func() bool {
		p := c.Policy()
		return web.second() >= 3 && p != nil && p.Rule("web") != nil && p.Rule("web").DropRatio > 0.5
	})

	counted := func() (total uint64, byPeer map[string]sidecar.PeerCounts) {
		byPeer = map[string]sidecar.PeerCounts{}
		for _, pc := range s.AppendCounts(nil) {
			if pc.Peer == "web" {
				continue
			}
			total += pc.Offered
			byPeer[pc.Peer] = pc
		}
		return total, byPeer
	}
	startTotal, _ := counted()
	heapStart := heapAfterGC()

	// What the aggregator flushes and the controller publishes, sampled
	// while the flood lasts: the largest of each.
	agg := c.Aggregators[0].AdminAddr
	var maxBuckets, maxPolicy atomic.Int64
	var overflowSeen atomic.Bool // the controller summed the overflow's load
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if b, ok := metricValue(agg, "sluice_aggregator_flush_buckets"); ok && int64(b) > maxBuckets.Load() {
				maxBuckets.Store(int64(b))
			}
			if p := c.Policy(); p != nil {
				if int64(len(p.Peers)) > maxPolicy.Load() {
					maxPolicy.Store(int64(len(p.Peers)))
				}
			}
			// The overflow is nearly all of the flood's floodDirectRate;
			// unlimited, it is in no policy.
			if o, ok := metricValue(c.ControllerAdminAddr(), "sluice_controller_offered_rps"); ok && o > floodDirectRate/10 {
				overflowSeen.Store(true)
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	})

	// The million, decided in-process by two goroutines, paced.
	floodStart := web.second()
	start := time.Now()
	var g sync.WaitGroup
	const workers = 2
	for w := range workers {
		g.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			buf := make([]byte, 64)
			n := floodDirect / workers
			for i := range n {
				if i%1000 == 0 {
					due := start.Add(time.Duration(float64(i) / (floodDirectRate / workers) * float64(time.Second)))
					time.Sleep(time.Until(due))
				}
				s.Decide(randomName(r, buf))
			}
		})
	}
	g.Wait()
	t.Logf("%d distinct callers decided in-process in %v", floodDirect, time.Since(start).Round(time.Millisecond))

	total, byPeer := counted()
	if got := total - startTotal; got != floodDirect {
		t.Errorf("%d decisions counted, want %d: every request counted once", got, floodDirect)
	}

	// The callers that got counters of their own keep calling, a few
	// times a second each for three report intervals, so that every
	// report names them all: MaxPeers and the reserved two.
	var tracked []string
	for peer := range byPeer {
		if peer != names.Unknown && peer != names.Overflow {
			tracked = append(tracked, peer)
		}
	}
	repeats := 0
	for round := time.NewTicker(100 * time.Millisecond); repeats < 30*len(tracked); <-round.C {
		for _, peer := range tracked {
			s.Decide(peer)
		}
		repeats += len(tracked)
	}
	if len(byPeer) > maxPeers+2+limited {
		t.Errorf("%d peers with counters after the flood, want at most MaxPeers %d + unknown and _overflow + batch", len(byPeer), maxPeers)
	}
	if ov := byPeer[names.Overflow].Offered; ov < floodDirect-uint64(maxPeers) {
		t.Errorf("_overflow counted %d, want at least %d: everyone past the first %d", ov, floodDirect-maxPeers, maxPeers)
	}

	// The HTTP flood: new callers and hostile headers through the proxy.
	invalidBefore, _ := metric(t, sc.AdminAddr, "sluice_sidecar_invalid_peer_names_total")
	sent, invalidSent := floodOverHTTP(t, sc.URL(), seed)
	total, byPeer = counted()
	if got := total - startTotal - floodDirect - uint64(repeats); got != uint64(sent) {
		t.Errorf("%d HTTP requests counted, %d sent", got, sent)
	}
	if len(byPeer) > maxPeers+2+limited {
		t.Errorf("%d peers with counters after the HTTP flood, want at most %d + 3", len(byPeer), maxPeers)
	}
	invalid, _ := metric(t, sc.AdminAddr, "sluice_sidecar_invalid_peer_names_total")
	if got := invalid - invalidBefore; got != float64(invalidSent) {
		t.Errorf("sluice_sidecar_invalid_peer_names_total rose by %v, %d invalid names sent", got, invalidSent)
	}
	checkHeadersRefused(t, sc.Addr, s)
	floodEnd := web.second()

	// The loop carries it: the overflow reaches the controller, through
	// reports that are all accepted and within the aggregator's bound. The
	// flood's last report, flush and tick take up to three intervals.
	time.Sleep(3 * time.Second)
	close(stopSampling)
	sampler.Wait()
	if !overflowSeen.Load() {
		t.Error("the controller's sluice_controller_offered_rps never showed the overflow's load: the flood did not reach the controller")
	}
	if n, _ := metric(t, agg, "sluice_aggregator_reports_total"); n == 0 {
		t.Error("the aggregator received no reports")
	}
	if n, _ := metric(t, agg, "sluice_aggregator_reports_rejected_total"); n != 0 {
		t.Errorf("the aggregator rejected %v reports", n)
	}
	if n, _ := metric(t, sc.AdminAddr, "sluice_sidecar_report_rejected_total"); n != 0 {
		t.Errorf("the sidecar had %v reports rejected", n)
	}
	// The sidecar's report names every peer it tracks: MaxPeers, the two
	// reserved ones and batch, far below what one report may carry.
	buckets := maxBuckets.Load()
	if limit := aggregator.DefaultBounds().MaxPeersPerReport; buckets < int64(maxPeers) || buckets > int64(maxPeers+2+limited) || buckets > int64(limit) {
		t.Errorf("the aggregator flushed at most %d buckets during the flood, want %d to %d (MaxPeers + 3), below --max-peers-per-report %d",
			buckets, maxPeers, maxPeers+2+limited, limit)
	}
	if n := maxPolicy.Load(); n > int64(maxPeers+2) {
		t.Errorf("the controller's policy listed %d callers, want at most %d", n, maxPeers+2)
	}

	heapFlood := heapAfterGC() // the flood counted, reported, summed and published
	growth := int64(heapFlood) - int64(heapStart)
	t.Logf("live heap: %.1f MB before the cluster, %.1f MB before the flood, %.1f MB after it (%+.1f MB); %d peers tracked, at most %d buckets flushed, %d callers in a policy",
		mb(heapBefore), mb(heapStart), mb(heapFlood), float64(growth)/(1<<20), len(byPeer), buckets, maxPolicy.Load())
	if growth > floodHeapBound {
		t.Errorf("the flood grew the live heap by %d MB, bound %d MB", growth>>20, floodHeapBound>>20)
	}

	web.check(t, floodStart, floodEnd)
	closeCluster()
	deadline := time.Now().Add(15 * time.Second)
	for runtime.NumGoroutine() > goroutinesBefore && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutinesBefore {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines after shutdown, %d before the cluster started:\n%s", n, goroutinesBefore, b.String())
	}
	heapAfter := heapAfterGC()
	t.Logf("after shutdown: live heap %.1f MB, %d goroutines (%d before)", mb(heapAfter), runtime.NumGoroutine(), goroutinesBefore)
	if heapAfter > heapBefore+shutdownHeapSlack {
		t.Errorf("live heap %d MB after shutdown, %d MB before the cluster started", heapAfter>>20, heapBefore>>20)
	}
}

// floodRecoveryBound is the documented bound on the time from the end of
// the flood until web is back within ±5 % of its limit; floodAfter is how
// long web's load goes on after the flood.
const (
	floodRecoveryBound = 8
	floodAfter         = 15
)

// floodWebLoad is web's load during TestFloodOfDistinctCallers.
type floodWebLoad struct {
	g     *loadgen.Generator
	begin time.Time // just before Run: its seconds count from here, within a few µs
	stop  func()    // ends the run and waits for it; idempotent
}

func startFloodWebLoad(t *testing.T, targets []string) *floodWebLoad {
	t.Helper()
	g, err := loadgen.New(loadgen.Options{
		Targets:  targets,
		Callers:  []loadgen.Caller{{Name: "web", Rate: rate(surgeRate)}},
		Duration: 5 * time.Minute, // ended by stop
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(done)
		g.Run(ctx, nil)
	}()
	var once sync.Once
	w := &floodWebLoad{g: g, begin: begin, stop: func() { once.Do(func() { cancel(); <-done }) }}
	t.Cleanup(w.stop)
	return w
}

// second is the run's current second. (Generator.Elapsed may not be read
// while Run starts.)
func (w *floodWebLoad) second() int { return int(time.Since(w.begin) / time.Second) }

// check lets web's load go on for floodAfter seconds after the flood, stops
// it, and asserts that web was back within ±5 % of its limit (the mean
// admitted rate over 3 s) within floodRecoveryBound of the flood's end, and
// stayed there.
func (w *floodWebLoad) check(t *testing.T, floodStart, floodEnd int) {
	t.Helper()
	end := floodEnd + floodAfter
	for w.second() < end+1 {
		time.Sleep(100 * time.Millisecond)
	}
	w.stop()
	mean := func(from, to int) float64 { return admittedRate(w.g, "web", from, to) }
	for s := floodStart; s < end; s++ {
		x := w.g.Second("web", s)
		t.Logf("web t=%2ds sent=%3d admitted=%3d skipped=%d errors=%d", s, x.Sent, x.Admitted, x.Skipped, x.Errors)
	}
	back := -1
	for s := floodEnd; s+3 <= end; s++ {
		if math.Abs(mean(s, s+3)-limit) <= 0.05*limit {
			back = s - floodEnd
			break
		}
	}
	t.Logf("web admitted %.1f rps during the flood (seconds [%d, %d)), limit %v; back within ±5 %% %d s after it (bound %d s)",
		mean(floodStart, floodEnd), floodStart, floodEnd, limit, back, floodRecoveryBound)
	if back < 0 || back > floodRecoveryBound {
		t.Errorf("web was back within ±5 %% of its limit %d s after the flood, want within %d s", back, floodRecoveryBound)
		return
	}
	if m := mean(floodEnd+back, end); math.Abs(m-limit) > 0.05*limit {
		t.Errorf("web admitted %.1f rps over seconds [%d, %d) after the flood, want %v ± 5 %%", m, floodEnd+back, end, limit)
	}
}

// floodOverHTTP sends floodHTTP requests through the sidecar at url, each
// from a new random caller or, one in ten, from a hostile header, and
// checks every answer. It returns how many it sent, and how many of them
// named an invalid caller.
func floodOverHTTP(t *testing.T, url string, seed uint64) (sent, invalid int) {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 8, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	const workers = 8
	var (
		nSent, nInvalid atomic.Int64
		mu              sync.Mutex
		failures        []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	start := time.Now()
	var g sync.WaitGroup
	for w := range workers {
		g.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(1000+w)))
			buf := make([]byte, 64)
			for i := w; i < floodHTTP; i += workers {
				req, err := http.NewRequest(http.MethodGet, url+"/flood", nil)
				if err != nil {
					fail("new request: %v", err)
					return
				}
				if i%10 == 0 {
					h := hostileCallers[(i/10)%len(hostileCallers)]
					if h.value != "\x00absent" {
						req.Header.Set(sidecar.DefaultCallerHeader, h.value)
					}
					if h.invalid {
						nInvalid.Add(1)
					}
				} else {
					req.Header.Set(sidecar.DefaultCallerHeader, "http-"+randomName(r, buf))
				}
				resp, err := client.Do(req)
				if err != nil {
					fail("request %d: %v", i, err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				nSent.Add(1)
				if resp.StatusCode != http.StatusOK {
					fail("request %d (caller %.40q): status %d", i, req.Header.Get(sidecar.DefaultCallerHeader), resp.StatusCode)
				}
			}
		})
	}
	g.Wait()
	t.Logf("%d requests over HTTP in %v (%.0f/s)", nSent.Load(), time.Since(start).Round(time.Millisecond),
		float64(nSent.Load())/time.Since(start).Seconds())
	for _, f := range failures {
		t.Error(f)
	}
	return int(nSent.Load()), int(nInvalid.Load())
}

// checkHeadersRefused sends caller headers that HTTP itself forbids (a NUL,
// a bare CR) on a raw connection: the server must answer 400 before the
// request reaches the Limiter, which counts nothing (web's load, which goes
// on meanwhile, aside).
func checkHeadersRefused(t *testing.T, addr string, s *sidecar.ServiceLimiter) {
	t.Helper()
	before := uint64(0)
	for _, pc := range s.AppendCounts(nil) {
		if pc.Peer != "web" {
			before += pc.Offered
		}
	}
	for _, value := range []string{"web\x00admin", "web\rX-Evil: 1"} {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: sidecar\r\n%s: %s\r\nConnection: close\r\n\r\n", sidecar.DefaultCallerHeader, value)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("caller %q: %v", value, err)
		} else if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("caller %q: status %d, want 400", value, resp.StatusCode)
		}
		conn.Close()
	}
	after := uint64(0)
	for _, pc := range s.AppendCounts(nil) {
		if pc.Peer != "web" {
			after += pc.Offered
		}
	}
	if after != before {
		t.Errorf("%d requests with malformed headers reached the Limiter", after-before)
	}
}

// gRPC message size limits of the real binaries, as their commands set them
// (internal/aggregator/command.go, internal/controller/command.go).
var (
	aggregatorMaxRecv = aggregator.DefaultBounds().MaxReportSize()
	controllerMaxRecv = zoneload.MaxMessageSize
)

// sized returns the message that build makes with a name of n bytes, for
// the n that makes the message exactly size bytes on the wire.
func sized(t *testing.T, size int, build func(name string) proto.Message) proto.Message {
	t.Helper()
	n := size
	for range 8 {
		m := build(strings.Repeat("n", n))
		got := proto.Size(m)
		if got == size {
			return m
		}
		n += size - got
	}
	t.Fatalf("no message of exactly %d bytes", size)
	return nil
}

// TestMessageSizeLimits sends the real aggregator and controller binaries a
// message of exactly their gRPC receive limit and one byte more. The first
// is read and rejected by validation (its one name is megabytes long), the
// second by gRPC (RESOURCE_EXHAUSTED, the stream ends); either way the
// process keeps serving, and the next good message on a new stream is
// accepted.
func TestMessageSizeLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with the binaries: about 10 s")
	}
	ctl := startController(t, "--warmup=0s")
	agg := startAggregator(t, "zone-a", ctl.addr)
	waitReady(t, agg.proc, agg.admin)

	report := func(name string) *sluicev1.StreamLoadReportsRequest {
		return &sluicev1.StreamLoadReportsRequest{Report: &sluicev1.LoadReport{
			SidecarId: "flood-1", Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
			Window: durationpb.New(time.Second), Peers: []*sluicev1.PeerCounts{{Peer: name, Offered: 1}},
		}}
	}
	// The name is the zone's: the controller refuses a zone load whole only
	// for its envelope, and leaves out a service entry with a bad peer.
	zoneLoad := func(name string) *sluicev1.StreamZoneLoadsRequest {
		return &sluicev1.StreamZoneLoadsRequest{Load: &sluicev1.ZoneLoad{
			AggregatorId: "flood-agg", Zone: name, Interval: durationpb.New(time.Second),
			Services: []*sluicev1.ServiceLoad{{Service: "checkout", Direction: sluicev1.Direction_DIRECTION_INBOUND,
				LiveSidecars: 1, Peers: []*sluicev1.PeerRate{{Peer: "web", OfferedRps: 1}}}},
		}}
	}
	for _, tc := range []struct {
		name    string
		addr    string
		limit   int
		build   func(string) proto.Message
		send    func(context.Context, *grpc.ClientConn, proto.Message) (accepted bool, reason string, err error)
		metric  string
		admin   string
		goodMsg proto.Message
	}{
		{"aggregator", agg.addr, aggregatorMaxRecv, func(n string) proto.Message { return report(n) }, sendReport,
			"sluice_aggregator_reports_rejected_total", agg.admin, report("web")},
		{"controller", ctl.addr, controllerMaxRecv, func(n string) proto.Message { return zoneLoad(n) }, sendZoneLoad,
			"sluice_controller_zone_loads_rejected_total", ctl.admin, zoneLoad("zone-z")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(tc.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			accepted, reason, err := tc.send(ctx, conn, sized(t, tc.limit, tc.build))
			if err != nil || accepted || !strings.HasPrefix(reason, "bad_name") {
				t.Errorf("a message of exactly %d MiB: accepted %v, reason %.80q, error %v; want it read and rejected as bad_name",
					tc.limit>>20, accepted, reason, err)
			}
			_, _, err = tc.send(ctx, conn, sized(t, tc.limit+1, tc.build))
			if status.Code(err) != codes.ResourceExhausted {
				t.Errorf("a message of %d MiB + 1 byte: error %v, want RESOURCE_EXHAUSTED", tc.limit>>20, err)
			}
			accepted, reason, err = tc.send(ctx, conn, tc.goodMsg)
			if err != nil || !accepted {
				t.Errorf("a good message afterwards: accepted %v, reason %q, error %v", accepted, reason, err)
			}
			// Both rejections are counted, each by its reason.
			for _, reason := range []string{"bad_name", "too_large"} {
				label := `reason="` + reason + `"`
				testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("%s{%s} counts one", tc.metric, label), func() bool {
					n, _ := metric(t, tc.admin, tc.metric, label)
					return n == 1
				})
			}
			t.Logf("%s: a message of %d MiB is read and rejected, one byte more is refused by gRPC; both counted", tc.name, tc.limit>>20)
		})
	}
}

func sendReport(ctx context.Context, conn *grpc.ClientConn, m proto.Message) (bool, string, error) {
	st, err := sluicev1.NewLoadReportServiceClient(conn).StreamLoadReports(ctx)
	if err != nil {
		return false, "", err
	}
	defer st.CloseSend()
	if err := st.Send(m.(*sluicev1.StreamLoadReportsRequest)); err != nil && !errors.Is(err, io.EOF) {
		return false, "", err
	}
	resp, err := st.Recv()
	return resp.GetAccepted(), resp.GetRejectReason(), err
}

func sendZoneLoad(ctx context.Context, conn *grpc.ClientConn, m proto.Message) (bool, string, error) {
	st, err := sluicev1.NewZoneLoadServiceClient(conn).StreamZoneLoads(ctx)
	if err != nil {
		return false, "", err
	}
	defer st.CloseSend()
	if err := st.Send(m.(*sluicev1.StreamZoneLoadsRequest)); err != nil && !errors.Is(err, io.EOF) {
		return false, "", err
	}
	resp, err := st.Recv()
	return resp.GetAccepted(), resp.GetRejectReason(), err
}
