package sim

import (
	"math"
	"testing"
	"time"
)

func series(offered, admitted []float64, allowed float64) *BucketSeries {
	b := &BucketSeries{Callee: "api", Caller: "web", Limit: allowed, Offered: offered, Admitted: admitted}
	for i := range offered {
		b.Dropped = append(b.Dropped, offered[i]-admitted[i])
		b.Allowed = append(b.Allowed, allowed)
	}
	return b
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*max(1, math.Abs(b)) }

// A surge, worked out by hand: allowed 20 throughout; over limit in
// seconds 2 to 5; within ±5 % from second 4.
func TestMeasureSurge(t *testing.T) {
	b := series(
		[]float64{10, 10, 100, 100, 100, 100, 10},
		[]float64{10, 10, 100, 50, 20.5, 20, 5},
		20)
	m := Measure(b, time.Second)
	if m.OverBins != 4 || m.Episodes != 1 || m.Unenforced != 0 {
		t.Errorf("over %d bins in %d episodes, %d unenforced; want 4 in 1, 0", m.OverBins, m.Episodes, m.Unenforced)
	}
	if m.TimeToEnforce != 2*time.Second {
		t.Errorf("time to enforce %v, want 2s (second 4 − second 2)", m.TimeToEnforce)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"peak overshoot", m.PeakOvershoot, (100.0 - 20) / 20},
		{"steady-state error", m.SteadyStateError, (0.5/20 + 0) / 2},
		{"collateral", m.Collateral, 5.0 / 30},
		{"wrongly dropped", m.WronglyDropped, 5.0 / 430},
		{"wrongly allowed", m.WronglyAllowed, (80 + 30 + 0.5) / 430},
		{"offered", m.Offered, 430},
		{"peak offered", m.PeakOffered, 100},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if m.SteadyBins != 2 {
		t.Errorf("%d steady bins, want 2 (seconds 4 and 5)", m.SteadyBins)
	}
}

// A change of demand within an episode starts a transient: the seconds
// until the admitted rate is back within ±5 % are not steady.
func TestMeasureTransient(t *testing.T) {
	offered := []float64{100, 100, 100, 200, 200, 200, 200}
	b := series(offered, []float64{100, 50, 50, 100, 75, 50, 50}, 50)
	b.Nominal = offered
	m := Measure(b, time.Second)
	if m.TimeToEnforce != time.Second {
		t.Errorf("time to enforce %v, want 1s", m.TimeToEnforce)
	}
	if m.SteadyBins != 4 || m.SteadyStateError != 0 {
		t.Errorf("%d steady bins with error %v; want 4 (seconds 1, 2, 5, 6) with 0", m.SteadyBins, m.SteadyStateError)
	}
	if !near(m.PeakOvershoot, 1) {
		t.Errorf("peak overshoot %v, want 1", m.PeakOvershoot)
	}

	// Without the nominal rate, the observed one tells the change.
	b.Nominal = nil
	if m := Measure(b, time.Second); m.SteadyBins != 4 {
		t.Errorf("without Nominal: %d steady bins, want 4", m.SteadyBins)
	}

	// Noise in the offered rate is not a change of demand.
	b.Nominal = []float64{100, 100, 100, 100, 100, 100, 100}
	if m := Measure(b, time.Second); m.SteadyBins != 6 || !near(m.SteadyStateError, (1+0.5)/6) {
		t.Errorf("steady nominal: %d steady bins, error %v; want 6, %v", m.SteadyBins, m.SteadyStateError, (1+0.5)/6)
	}
}

func TestMeasureEpisodes(t *testing.T) {
	// Two episodes: the first enforced after 1 s, the second after 2 s, a
	// third never.
	b := series(
		[]float64{100, 100, 10, 100, 100, 100, 10, 100},
		[]float64{100, 20, 10, 100, 60, 20, 10, 100},
		20)
	m := Measure(b, time.Second)
	if m.Episodes != 3 || m.Unenforced != 1 || m.TimeToEnforce != 2*time.Second {
		t.Errorf("%d episodes, %d unenforced, time to enforce %v; want 3, 1, 2s (the slowest)", m.Episodes, m.Unenforced, m.TimeToEnforce)
	}
}

func TestMeasureNeverEnforced(t *testing.T) {
	m := Measure(series([]float64{50, 50}, []float64{50, 50}, 10), time.Second)
	if m.TimeToEnforce != -1 || m.Unenforced != 1 || !math.IsNaN(m.SteadyStateError) {
		t.Errorf("time to enforce %v, unenforced %d, steady %v; want -1, 1, NaN", m.TimeToEnforce, m.Unenforced, m.SteadyStateError)
	}
	if !math.IsNaN(m.Collateral) {
		t.Errorf("collateral %v without an under-limit second; want NaN", m.Collateral)
	}
	if !near(m.WronglyAllowed, 80.0/100) || m.WronglyDropped != 0 {
		t.Errorf("wrongly allowed %v, dropped %v; want 0.8, 0", m.WronglyAllowed, m.WronglyDropped)
	}
}

func TestMeasureShadowAndUnbounded(t *testing.T) {
	b := series([]float64{50, 50}, []float64{50, 50}, 10)
	b.Shadow = true
	m := Measure(b, time.Second)
	if m.Over() || m.WronglyAllowed != 0 || m.Collateral != 0 {
		t.Errorf("shadow: over %v, wrongly allowed %v, collateral %v; want false, 0, 0", m.Over(), m.WronglyAllowed, m.Collateral)
	}
	m = Measure(series([]float64{50, 50}, []float64{50, 40}, math.Inf(1)), time.Second)
	if m.Over() || !near(m.Collateral, 0.1) || !near(m.WronglyDropped, 0.1) {
		t.Errorf("unbounded: over %v, collateral %v, wrongly dropped %v; want false, 0.1, 0.1", m.Over(), m.Collateral, m.WronglyDropped)
	}
}

func TestSummarize(t *testing.T) {
	ttl, steady, coll := 1500*time.Millisecond, 0.02, 0.001
	r := &Result{
		Scenario: &Scenario{Name: "hand", Duration: 4 * time.Second, Targets: Targets{TimeToEnforce: &ttl, SteadyStateError: &steady, CollateralDrops: &coll}},
		Buckets: []BucketSeries{
			*series([]float64{100, 100, 100, 100}, []float64{100, 100, 20, 20}, 20),
			*series([]float64{10, 10, 10, 10}, []float64{10, 10, 9, 10}, 20),
		},
		ControlPlane: ControlPlane{Reports: Tier{Messages: 8, Bytes: 4000}},
	}
	r.Buckets[1].Caller = "mobile"
	s := Summarize(r)
	if s.Bystanders != 1 || !near(s.BystanderCollateral, 1.0/40) {
		t.Errorf("%d bystanders losing %v; want 1 losing 1/40", s.Bystanders, s.BystanderCollateral)
	}
	if s.WorstTimeToEnforce != 2*time.Second || s.WorstSteadyStateError != 0 {
		t.Errorf("worst time to enforce %v, steady %v; want 2s, 0", s.WorstTimeToEnforce, s.WorstSteadyStateError)
	}
	if !near(s.WronglyAllowed, 160.0/440) || !near(s.WronglyDropped, 1.0/440) {
		t.Errorf("wrongly allowed %v, dropped %v; want 160/440, 1/440", s.WronglyAllowed, s.WronglyDropped)
	}
	if s.ReportBytesPerSec != 1000 {
		t.Errorf("report bytes/s %v, want 1000", s.ReportBytesPerSec)
	}
	met := map[string]bool{}
	for _, c := range s.Targets {
		met[c.Name] = c.Met
	}
	if want := map[string]bool{"time to enforce": false, "steady-state error": true, "collateral drops": false}; len(met) != 3 ||
		met["time to enforce"] != want["time to enforce"] || met["steady-state error"] != want["steady-state error"] || met["collateral drops"] != want["collateral drops"] {
		t.Errorf("targets met: %v, want %v", met, want)
	}
}

func TestReversals(t *testing.T) {
	for _, c := range []struct {
		ratio []float64
		want  int
	}{
		{nil, 0},
		{[]float64{0, 0, 0}, 0},
		{[]float64{0, 0.9, 0.9, 0.5, 0}, 1},                // a surge and its release
		{[]float64{0, 0.9, 0, 0.9, 0}, 3},                  // oscillation
		{[]float64{0.5, 0.505, 0.498, 0.503, 0.5}, 0},      // noise under ReversalStep
		{[]float64{0.5, 0.4, 0.3, 0.305, 0.2, 0.25, 0}, 2}, // a wiggle under ReversalStep, then a turn up and down
	} {
		if got := Reversals(c.ratio); got != c.want {
			t.Errorf("Reversals(%v) = %d, want %d", c.ratio, got, c.want)
		}
	}
}
