package sim

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit/knee"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/health"
)

const modelled = `
duration: 60s
zones: [zone-a]
services:
  api:
    sidecars: {zone-a: 4}
    knee: {workers: 8, service: 20ms, queue: 40}
  db:
    sidecars: {zone-a: 1}
flows:
  - {callee: api, caller: web, rate: {constant: 10}}
events:
`

func TestParseKnee(t *testing.T) {
	sc, err := Parse(strings.NewReader(modelled+"  - {at: 20s, brownout: {callee: api, workers: 4, for: 10s}}\n  - {at: 40s, brownout: {callee: api, service: 40ms}}\n"), "m")
	if err != nil {
		t.Fatal(err)
	}
	if k := sc.Service("api").Knee; k == nil || *k != (knee.Config{Workers: 8, Service: 20 * time.Millisecond, Queue: 40}) {
		t.Fatalf("knee %+v", k)
	}
	for _, tc := range []struct {
		at   time.Duration
		want float64 // the fleet's: 4 instances
	}{{0, 1600}, {19 * time.Second, 1600}, {20 * time.Second, 800}, {29 * time.Second, 800}, {30 * time.Second, 1600}, {40 * time.Second, 800}, {59 * time.Second, 800}} {
		if got := sc.ModelledCapacity("api", tc.at); got != tc.want {
			t.Errorf("at %v: fleet knee %v, want %v", tc.at, got, tc.want)
		}
	}
	if got := sc.ModelledCapacity("db", 0); !math.IsInf(got, 1) {
		t.Errorf("db, not modelled: %v, want +Inf", got)
	}

	for _, tc := range []struct{ events, want string }{
		{"  - {at: 5s, brownout: {callee: db, workers: 1}}", "service db has no knee"},
		{"  - {at: 5s, brownout: {callee: api}}", "needs workers, service or both"},
		{"  - {at: 5s, brownout: {callee: api, workers: 0, for: -1s}}", "workers: 0 is outside"},
		{"  - {at: 5s, brownout: {callee: nope, workers: 1}}", `"nope" is not in services`},
		{"  - {at: 5s, brownout: {callee: api, workers: 2, for: 10s}}\n  - {at: 10s, brownout: {callee: api, workers: 1}}", "overlaps the one before, which ends at 15s"},
	} {
		_, err := Parse(strings.NewReader(modelled+tc.events+"\n"), "m")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.events, err, tc.want)
		}
	}
	bad := strings.Replace(modelled, "knee: {workers: 8, service: 20ms, queue: 40}", "knee: {service: 0s, queue: -1}", 1)
	_, err = Parse(strings.NewReader(bad), "m")
	for _, want := range []string{"knee.workers: missing", "knee.service: 0s is outside", "knee.queue: -1 is outside"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a bad knee: %v, want it to say %q", err, want)
		}
	}
}

// The sidecar counts its instance's fluid answers in whole requests,
// losing none: over many steps the counts add up to the model's, and
// every answer is in a latency bucket.
func TestUpstreamCounts(t *testing.T) {
	up, err := newUpstream(knee.Config{Workers: 2, Service: 20 * time.Millisecond, Queue: 5}) // 100 rps
	if err != nil {
		t.Fatal(err)
	}
	var total health.Counts
	for i := range 300 {
		rate := 50.0
		if i >= 100 {
			rate = 150 // past the knee: a queue, then 503s
		}
		up.serve(10*time.Millisecond, rate)
		if i%37 == 0 || i == 299 {
			var c health.Counts
			up.take(&c)
			sum := uint64(0)
			for j, n := range c.Latency {
				sum += n
				total.Latency[j] += n
			}
			if sum != c.Answered() {
				t.Fatalf("step %d: %d in latency buckets, %d answered", i, sum, c.Answered())
			}
			total.OK += c.OK
			total.Failed += c.Failed
		}
	}
	// 1s at 50 rps, 2s at 150 against a knee of 100: about 250 answered
	// (50 + 200), 95 refused (the queue of 5 holds the rest).
	if total.OK < 240 || total.OK > 251 || total.Failed < 90 || total.Failed > 96 {
		t.Errorf("%d ok, %d failed; want about 250 and 95", total.OK, total.Failed)
	}
	slow := uint64(0)
	for j := health.Bucket(25 * time.Millisecond); j < health.Buckets; j++ {
		slow += total.Latency[j]
	}
	if slow == 0 {
		t.Errorf("no answer slower than the service time after the queue filled: %v", total.Latency)
	}
}

// The measures must see what they are for: a phase whose estimate swings
// past the band twice oscillates, one that never gets there is never
// found.
func TestMeasureCapacityPhase(t *testing.T) {
	obj := adaptive.Objective{LatencyP99: 200 * time.Millisecond, Errors: 0.01}
	for _, tc := range []struct {
		name     string
		estimate []float64 // seconds 10..19, the knee 100 from 10 on (200 before)
		reached  time.Duration
		over     int
	}{
		{"sheds and holds", []float64{150, 105, 98, 100, 102, 99, 100, 101, 100, 99}, 2 * time.Second, 0},
		{"one overshoot", []float64{95, 100, 115, 104, 100, 99, 100, 101, 100, 99}, time.Second, 1},
		{"oscillates", []float64{95, 120, 90, 125, 85, 120, 100, 101, 100, 99}, time.Second, 3},
		{"never sheds", []float64{190, 180, 170, 160, 150, 140, 130, 120, 115, 111}, -1, 0},
	} {
		s := &CapacitySeries{Objective: obj}
		for bin := range 20 {
			k, est := 200.0, 200.0
			if bin >= 10 {
				k, est = 100, tc.estimate[bin-10]
			}
			s.Knee, s.Estimate = append(s.Knee, k), append(s.Estimate, est)
			s.P99, s.Errors = append(s.P99, 0), append(s.Errors, 0)
			s.Goodput, s.Admitted = append(s.Goodput, est), append(s.Admitted, est)
		}
		p := measureCapacityPhase(s, 10, 20, true)
		if p.Reached != tc.reached || p.Overshoots != tc.over {
			t.Errorf("%s: reached %v with %d overshoots, want %v with %d", tc.name, p.Reached, p.Overshoots, tc.reached, tc.over)
		}
	}
}

// An estimate found the knee when it stays within the band, not when it
// passes through it.
func TestMeasureCapacityFound(t *testing.T) {
	s := &CapacitySeries{Objective: adaptive.Objective{Errors: 0.01}}
	for _, est := range []float64{150, 95, 80, 85, 105, 96, 100, 120, 99, 101} { // the knee 100 throughout
		s.Knee, s.Estimate = append(s.Knee, 100), append(s.Estimate, est)
		s.P99, s.Errors, s.Goodput, s.Admitted = append(s.P99, 0), append(s.Errors, 0), append(s.Goodput, est), append(s.Admitted, est)
	}
	p := measureCapacityPhase(s, 0, len(s.Knee), true)
	if p.Reached != 2*time.Second || p.Found != 5*time.Second {
		t.Errorf("reached %v, found %v; want 2s (95 passes through), 5s (105, 96, 100 stay)", p.Reached, p.Found)
	}
	p = measureCapacityPhase(s, 8, len(s.Knee), true)
	if p.Found != -1 {
		t.Errorf("found %v in a phase that ends within the band before %v; want never", p.Found, CapacityHeld)
	}
}
