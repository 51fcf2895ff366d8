package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/ticker"
)

// The aggregator's flushes and the controller's ticks follow internal/ticker's
// Schedule on the virtual clock: a poke runs at once unless the last run was
// less than the gap ago, then as soon as the gap allows; pokes before that
// run coalesce.
func TestPokeOnTheVirtualClock(t *testing.T) {
	e := &engine{sc: &Scenario{Duration: time.Minute}}
	tk := ticker.NewSchedule(ticker.MinGap(2 * time.Second)) // gap 100ms: a twentieth
	var runs []time.Duration
	run := func() { runs = append(runs, e.now) }
	ms := time.Millisecond
	for _, at := range []time.Duration{0, 50 * ms, 60 * ms, 90 * ms, 300 * ms, 350 * ms} {
		e.at(at, func() { e.poke(&tk, run) })
	}
	// A periodic run at 500ms moves the gap: the poke at 550 waits for 600.
	e.at(500*ms, func() { tk.Ran(Epoch.Add(e.now)); run() })
	e.at(550*ms, func() { e.poke(&tk, run) })
	e.run()
	// 0: runs at once; 50, 60, 90: one run at 100; 300: at once; 350: at
	// 400; 500 periodic; 550: at 600.
	if want := []time.Duration{0, 100 * ms, 300 * ms, 400 * ms, 500 * ms, 600 * ms}; !slices.Equal(runs, want) {
		t.Errorf("runs at %v, want %v", runs, want)
	}
}

// Each flow that names what it calls is decided by the production sidecar
// in its own leaf (caller, procedure): the sidecars' counters per leaf add
// up to the engine's buckets, and a procedure's capacity drops its callers'
// requests of that procedure only.
func TestFlowsDecidedInTheirLeaf(t *testing.T) {
	doc := strings.Replace(withProcedures, "duration: 10s", "duration: 10s\narrivals: deterministic\nloop: {warmup: 0s, tick: 100ms}", 1) +
		`  - {callee: checkout, caller: web, request: "POST /v1/charges", rate: {constant: 300}}
  - {callee: checkout, caller: web, request: "GET /v1/items/42", rate: {constant: 50}}
  - {callee: checkout, caller: app, procedure: /shop.Checkout/Pay, rate: {constant: 40}}
  - {callee: checkout, caller: app, request: "GET /v1/items/7", rate: {constant: 30}}
  - {callee: checkout, caller: app, rate: {constant: 20}}
`
	sc, err := Parse(strings.NewReader(doc), "leaves")
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(sc, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.run()
	if e.err != nil {
		t.Fatal(e.err)
	}
	r := e.result()
	counted := map[Bucket]float64{}
	for _, s := range e.sidecars {
		for _, c := range s.svc.AppendCounts(nil) {
			counted[Bucket{s.svc.Name(), c.Peer, c.Procedure}] += float64(c.Offered)
		}
	}
	offered := map[Bucket]float64{}
	byCaller := map[string]float64{}
	for _, b := range r.Buckets {
		for _, v := range b.Offered {
			offered[b.Bucket()] += v
			byCaller[b.Caller] += v
		}
	}
	// Until the first policy names the callee's procedures, a sidecar
	// counts every request of a caller in its leaf "".
	for caller, total := range byCaller {
		early := counted[Bucket{"checkout", caller, ""}]
		if early > 0.05*total {
			t.Errorf("%s: %v of %v requests counted before the first policy; the bounds below mean little", caller, early, total)
		}
		for b, n := range offered {
			if b.Caller != caller {
				continue
			}
			if got := counted[b]; got > n || got < n-early {
				t.Errorf("%s: the sidecars counted %v requests in the leaf, the engine offered %v (%v before the first policy)", b, got, n, early)
			}
		}
	}
	for b, n := range counted {
		if _, ok := offered[b]; !ok && b.Procedure != "" && n > 0 {
			t.Errorf("%s: %v requests counted in a leaf no flow calls", b, n)
		}
	}
	// create-charge's capacity of 100 drops web's charges, not its items.
	for _, b := range r.Buckets {
		dropped := 0.0
		for _, v := range b.Dropped[5:] {
			dropped += v
		}
		if cut := b.Procedure == "create-charge"; cut != (dropped > 0) {
			t.Errorf("%s: %v requests dropped in the last 5s", b.Bucket(), dropped)
		}
	}
}
