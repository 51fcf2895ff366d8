package e2e

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/testbed"
	"github.com/sluicehq/sluice/internal/testkit"
)

// startCallers starts one instance of service per zone, each enforcing
// outbound in process (testbed.Caller), and waits until every one holds its
// caller/<service> policy: the controller publishes it once the instances'
// first outbound reports are in, before any traffic.
func startCallers(t *testing.T, c *testbed.Cluster, service string) []*testbed.Caller {
	t.Helper()
	var callers []*testbed.Caller
	for _, zone := range []string{"zone-a", "zone-b", "zone-c"} {
		cl, err := c.StartCaller(service, service+"-"+zone, zone)
		if err != nil {
			t.Fatal(err)
		}
		callers = append(callers, cl)
	}
	testkit.WaitFor(t, 15*time.Second, service+"'s instances hold caller/"+service, func() bool {
		for _, cl := range callers {
			if cl.Limiter.Policy(service) == nil {
				return false
			}
		}
		return true
	})
	return callers
}

func callerURLs(callers []*testbed.Caller) []string {
	urls := make([]string, len(callers))
	for i, cl := range callers {
		urls[i] = "http://" + cl.Addr
	}
	return urls
}

// outboundRatio is the ratio cl applies to its calls to checkout now.
func outboundRatio(cl *testbed.Caller) float64 {
	if p := cl.Limiter.Policy(cl.Service); p != nil {
		if r := p.Rule("checkout"); r != nil {
			return r.DropRatio
		}
	}
	return 0
}

// TestOutboundLoopHoldsASurge is TestLoopHoldsASurge with the callers
// enforcing outbound: web's and batch's instances (one per zone) decide
// every call to checkout before it leaves, with the caller/<svc> policies
// the controller computes from their OUTBOUND reports; web calls over gRPC
// through the client interceptors, batch over HTTP through the
// RoundTripper. checkout still runs its inbound sidecars, with its
// callee/checkout policy. Web goes from half
// its limit to 5× it: its global admitted rate holds the limit within the
// inbound test's ±5 %, batch (under its limit) loses nothing, and no call is
// decided twice: checkout's sidecars let every call through as decided
// upstream, count none of them, and drop none.
func TestOutboundLoopHoldsASurge(t *testing.T) { retryBusy(testOutboundLoopHoldsASurge)(t) }

func testOutboundLoopHoldsASurge(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: about 40 s")
	}
	c := startCluster(t)
	web := startCallers(t, c, "web")
	batch := startCallers(t, c, "batch")

	const (
		surgeStart = 5
		surgeEnd   = 25
		runFor     = 35
	)
	ratios := make([]float64, runFor)
	gw, err := loadgen.New(loadgen.Options{
		Targets: callerURLs(web),
		Path:    "/grpc", // see testbed.Caller
		Callers: []loadgen.Caller{{Name: "web", Rate: func(t time.Duration) float64 {
			if t >= surgeStart*time.Second && t < surgeEnd*time.Second {
				return surgeRate
			}
			return calmRate
		}}},
		Duration:    runFor * time.Second,
		SecondEnded: func(s int) { ratios[s] = outboundRatio(web[0]) },
	})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := loadgen.New(loadgen.Options{
		Targets:  callerURLs(batch),
		Callers:  []loadgen.Caller{{Name: "batch", Rate: rate(calmRate)}},
		Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, g := range []*loadgen.Generator{gw, gb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.Run(context.Background(), nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for s := range runFor {
		w, b := gw.Second("web", s), gb.Second("batch", s)
		t.Logf("t=%2ds web sent=%3d admitted=%3d dropped=%3d ratio=%.3f | batch sent=%3d dropped=%d errors=%d skipped=%d",
			s, w.Sent, w.Admitted, w.Dropped, ratios[s], b.Sent, b.Dropped, w.Errors+b.Errors, w.Skipped+b.Skipped)
	}

	requireOnSchedule(t, gw, 0, runFor)
	wsum, bsum := gw.Sum("web", 0, runFor), gb.Sum("batch", 0, runFor)
	for name, s := range map[string]loadgen.Second{"web": wsum, "batch": bsum} {
		if s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", name, s.Errors, s.Skipped)
		}
	}

	enforced := -1
	for s := surgeStart; s < surgeEnd; s++ {
		if math.Abs(float64(gw.Second("web", s).Admitted)-limit) <= 0.05*limit {
			enforced = s - surgeStart
			break
		}
	}
	t.Logf("time to enforce: %d s", enforced)

	steady := admittedRate(gw, "web", surgeStart+5, surgeEnd)
	if math.Abs(steady-limit) > 0.05*limit {
		t.Errorf("web admitted %.1f rps over the steady state, want %v ± 5 %%", steady, limit)
	} else {
		t.Logf("web admitted %.1f rps over the steady state (limit %v)", steady, limit)
	}
	if loss := float64(bsum.Dropped) / float64(bsum.Sent); loss >= 0.001 {
		t.Errorf("batch, under its limit, lost %.3f %% (%d of %d)", 100*loss, bsum.Dropped, bsum.Sent)
	}

	// Every drop happened at the caller, before the network: web's
	// instances counted exactly the drops its load generator saw, and
	// checkout's sidecars decided and counted none of the callers' calls.
	var outDropped, outOffered uint64
	for _, cl := range web {
		for _, pc := range cl.Limiter.AppendCounts("web", nil) {
			if pc.Peer == "checkout" {
				outDropped += pc.Dropped
				outOffered += pc.Offered
			} else if pc.Offered > 0 {
				t.Errorf("%s counted %d calls to %q, want every call to checkout", cl.Name, pc.Offered, pc.Peer)
			}
		}
	}
	if outDropped != uint64(wsum.Dropped) || outOffered != uint64(wsum.Sent) {
		t.Errorf("web's instances counted %d offered, %d dropped; the load generator sent %d and saw %d dropped",
			outOffered, outDropped, wsum.Sent, wsum.Dropped)
	}
	var upstream uint64
	for _, s := range c.Sidecars {
		in := s.Agent.Limiter().Service("checkout")
		upstream += in.DecidedUpstream()
		for _, pc := range in.AppendCounts(nil) {
			if pc.Offered > 0 {
				t.Errorf("%s decided %d calls from %q again (%d dropped), want none: they were decided upstream",
					s.Name, pc.Offered, pc.Peer, pc.Dropped)
			}
		}
	}
	if want := uint64(wsum.Admitted + bsum.Admitted); upstream != want {
		t.Errorf("checkout's sidecars let %d calls through as decided upstream, want the %d admitted", upstream, want)
	}

	testkit.WaitFor(t, 15*time.Second, "web's outbound ratio returns to 0 after the surge", func() bool {
		for _, cl := range web {
			if outboundRatio(cl) != 0 {
				return false
			}
		}
		return true
	})
}

// TestOutboundMixedFleet: web's traffic comes partly from instances that
// enforce outbound and partly straight to checkout's sidecars, unmarked, as
// from instances that do not; after a calm start (which also warms the
// rig's connections) it rises to 150 + 100 rps, together 2.5× web's limit:
// enough for the failures this guards against to stand out, light enough
// for a loaded 2-core machine under the race detector. The controller adds the two per bucket, both sides apply the one
// ratio to what they decide, and web's admitted total holds the limit
// within ±5 %, not twice it; every drop happened once, on the side that
// decided the call.
func TestOutboundMixedFleet(t *testing.T) { retryBusy(testOutboundMixedFleet)(t) }

func testOutboundMixedFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: about 30 s")
	}
	c := startCluster(t)
	web := startCallers(t, c, "web")

	const (
		runFor      = 25
		surgeStart  = 5
		steadyFrom  = surgeStart + 5
		outRate     = 150.0
		directRate  = 100.0
		bucketLimit = limit
	)
	after := func(r float64) func(time.Duration) float64 {
		return func(t time.Duration) float64 {
			if t < surgeStart*time.Second {
				return r / 10
			}
			return r
		}
	}
	gOut, err := loadgen.New(loadgen.Options{
		Targets: callerURLs(web), Callers: []loadgen.Caller{{Name: "web", Rate: after(outRate)}}, Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	gIn, err := loadgen.New(loadgen.Options{
		Targets:  c.SidecarURLs(),
		Callers:  []loadgen.Caller{{Name: "web", Rate: after(directRate)}, {Name: "batch", Rate: rate(calmRate)}},
		Duration: runFor * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, g := range []*loadgen.Generator{gOut, gIn} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.Run(context.Background(), nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for s := range runFor {
		o, d := gOut.Second("web", s), gIn.Second("web", s)
		t.Logf("t=%2ds web outbound sent=%3d admitted=%3d | direct sent=%3d admitted=%3d | total admitted=%3d",
			s, o.Sent, o.Admitted, d.Sent, d.Admitted, o.Admitted+d.Admitted)
	}
	requireOnSchedule(t, gOut, 0, runFor)
	requireOnSchedule(t, gIn, 0, runFor)
	out, direct, batch := gOut.Sum("web", 0, runFor), gIn.Sum("web", 0, runFor), gIn.Sum("batch", 0, runFor)
	for name, s := range map[string]loadgen.Second{"web outbound": out, "web direct": direct, "batch": batch} {
		if s.Errors > 0 || s.Skipped > 0 {
			t.Errorf("%s: %d errors, %d skipped: the rig, not the limiter, lost requests", name, s.Errors, s.Skipped)
		}
	}

	// The median second, not the mean: on a loaded machine the load
	// generators stall now and then and catch up in a burst, which the
	// loop rightly takes for a surge (fast attack, slow release) and which
	// would drag a mean down for reasons that are the rig's. What this
	// test guards against is far outside ±5 % either way: twice the limit
	// (each side admitting it), about 81 % of it (checkout's sidecars
	// counting the 60 rps of admitted outbound calls again: p from 310
	// rps), or 64 % (deciding them again: 0.4² · 150 + 40).
	totals := make([]float64, 0, runFor-steadyFrom)
	for s := steadyFrom; s < runFor; s++ {
		totals = append(totals, float64(gOut.Second("web", s).Admitted+gIn.Second("web", s).Admitted))
	}
	slices.Sort(totals)
	median := (totals[(len(totals)-1)/2] + totals[len(totals)/2]) / 2
	mean := admittedRate(gOut, "web", steadyFrom, runFor) + admittedRate(gIn, "web", steadyFrom, runFor)
	if math.Abs(median-bucketLimit) > 0.05*bucketLimit {
		t.Errorf("web admitted %.1f rps in total in the median second of the steady state (mean %.1f), want %v ± 5 %%", median, mean, bucketLimit)
	} else {
		t.Logf("web admitted %.1f rps in total in the median second (mean %.1f: %.1f outbound, %.1f direct), limit %v", median, mean,
			admittedRate(gOut, "web", steadyFrom, runFor), admittedRate(gIn, "web", steadyFrom, runFor), bucketLimit)
	}
	if batch.Dropped > 0 {
		t.Errorf("batch, under its limit, lost %d of %d", batch.Dropped, batch.Sent)
	}

	// The inbound side decided exactly the unmarked calls, and dropped
	// exactly what the direct sender saw dropped; the callers, exactly
	// what the outbound sender saw dropped.
	var inOffered, inDropped, outOffered, outDropped uint64
	for _, s := range c.Sidecars {
		for _, pc := range s.Agent.Limiter().AppendCounts("checkout", nil) {
			if pc.Peer == "web" {
				inOffered += pc.Offered
				inDropped += pc.Dropped
			}
		}
	}
	for _, cl := range web {
		for _, pc := range cl.Limiter.AppendCounts("web", nil) {
			if pc.Peer == "checkout" {
				outOffered += pc.Offered
				outDropped += pc.Dropped
			}
		}
	}
	if inOffered != uint64(direct.Sent) || inDropped != uint64(direct.Dropped) {
		t.Errorf("checkout's sidecars decided %d web calls and dropped %d; %d were sent unmarked and %d seen dropped",
			inOffered, inDropped, direct.Sent, direct.Dropped)
	}
	if outOffered != uint64(out.Sent) || outDropped != uint64(out.Dropped) {
		t.Errorf("web's instances decided %d calls and dropped %d; %d were sent through them and %d seen dropped",
			outOffered, outDropped, out.Sent, out.Dropped)
	}
}
