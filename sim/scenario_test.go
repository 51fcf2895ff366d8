package sim

import (
	"strings"
	"testing"
	"time"
)

const minimal = `
duration: 10s
zones: [zone-a, zone-b]
services:
  api:
    sidecars: {zone-a: 3, zone-b: 1}
flows:
  - {callee: api, caller: web, rate: {constant: 10}}
`

func TestParseDefaults(t *testing.T) {
	sc, err := Parse(strings.NewReader(minimal), "mini")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "mini" || sc.Seed != 1 || sc.Step != 10*time.Millisecond || sc.Arrivals != Poisson {
		t.Errorf("name %q seed %d step %v arrivals %v", sc.Name, sc.Seed, sc.Step, sc.Arrivals)
	}
	l := sc.Loop
	c := l.Controller
	// DESIGN.md's defaults.
	if l.ReportInterval != time.Second || l.FlushInterval != time.Second || c.Tick != time.Second ||
		l.SurgeCheck != 100*time.Millisecond || l.PushDelay != 50*time.Millisecond || l.AggregatorStaleAfter != 3 || c.StaleAfter != 3 ||
		c.Law.PMax != 0.99 || c.Law.MinRate != 1 || c.Law.ReleaseRate != 2 ||
		c.PolicyTTL != 30*time.Second || c.Warmup != 5*time.Second {
		t.Errorf("loop defaults: %+v", l)
	}
	// Without weights a flow follows the sidecars: 3 to 1.
	if w := sc.Flows[0].Weights; len(w) != 2 || w[0] != 0.75 || w[1] != 0.25 {
		t.Errorf("weights %v, want [0.75 0.25]", w)
	}
	if sc.Limits.Len() != 0 || sc.Sidecars() != 4 {
		t.Errorf("limits %d services, %d sidecars", sc.Limits.Len(), sc.Sidecars())
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want []string // each must appear in the error
	}{
		{"empty", "", []string{"empty scenario"}},
		{"unknown top-level field", minimal + "durations: 5s\n", []string{"durations: unknown field (line 9)", "known: arrivals"}},
		{"unknown nested field", strings.Replace(minimal, "{constant: 10}", "{rampp: []}", 1), []string{"flows[0].rate.rampp: unknown field"}},
		{"several problems at once", minimal + "loop: {tick: fast, p_mx: 1}\nseed: -1\n", []string{"loop.tick:", "loop.p_mx: unknown field", "seed:"}},
		{"a number for a duration", minimal + "step: 10\n", []string{`step: duration "10": missing unit after 10`}},
		{"missing duration", strings.Replace(minimal, "duration: 10s", "", 1), []string{"duration: missing"}},
		{"odd duration", strings.Replace(minimal, "10s", "10.5s", 1), []string{"duration: 10.5s is not a whole number of seconds"}},
		{"step", minimal + "step: 7ms\n", []string{"step: 7ms must be at least 1ms and divide 1s"}},
		{"two rates", strings.Replace(minimal, "{constant: 10}", "{constant: 10, ramp: [{at: 0s, rps: 1}]}", 1), []string{"flows[0].rate: needs exactly one of constant, steps, ramp, diurnal; has 2"}},
		{"ramp order", strings.Replace(minimal, "{constant: 10}", "{ramp: [{at: 2s, rps: 1}, {at: 1s, rps: 2}]}", 1), []string{"flows[0].rate.ramp[1].at: 1s is not after the previous point's 2s"}},
		{"negative rate", strings.Replace(minimal, "{constant: 10}", "{steps: [{at: 0s, rps: -3}]}", 1), []string{"flows[0].rate.steps[0].rps: -3 is not a rate"}},
		{"unknown callee", strings.Replace(minimal, "callee: api", "callee: apo", 1), []string{`flows[0].callee: "apo" is not in services`}},
		{"reserved caller", strings.Replace(minimal, "caller: web", "caller: unknown", 1), []string{"flows[0].caller: invalid caller name"}},
		{"unknown zone", strings.Replace(minimal, "zone-b: 1}", "zone-c: 1}", 1), []string{"services.api.sidecars.zone-c: no such zone"}},
		{"weight without sidecars", strings.Replace(minimal, "zone-b: 1}", "zone-b: 0}", 1) + "  - {callee: api, caller: m, zones: {zone-b: 1}, rate: {constant: 1}}\n",
			[]string{"flows[1].zones.zone-b: service api has no sidecars in zone zone-b"}},
		{"limits", minimal + "limits: {services: {api: {callers: {web: {limit: -1}}}}}\n",
			[]string{"limits: invalid limits:", "services.api.callers.web.limit: -1 is not a finite rate"}},
		{"limits of no service", minimal + "limits: {services: {other: {capacity: 5}}}\n", []string{"limits.services.other: no such service in services"}},
		{"limits unknown field", minimal + "limits: {services: {api: {capacityy: 3}}}\n", []string{"limits: decode limits:", "capacityy"}},
		{"event", minimal + "events:\n  - {at: 2s, kill_aggregator: zone-z}\n  - {at: 20s, restart_controller: {down: 1s}}\n  - {at: 1s}\n",
			[]string{`events[0].kill_aggregator: "zone-z" is not a zone`, "events[1].at: 20s is outside the run [0, 10s)", "events[2]: needs exactly one of"}},
		{"law", minimal + "loop: {p_max: 1, release_rate: 1, tick: 5ms, report_interval: 2m}\n",
			[]string{"loop.p_max: 1 is outside (0, 1)", "loop.release_rate: 1 must be a finite factor > 1", "loop.tick: 5ms is outside [10ms, 1m]", "loop.report_interval: 2m0s is outside"}},
		{"retry", strings.Replace(minimal, "rate: {constant: 10}}", "rate: {constant: 10}, retry: {backoff: 1ms}}", 1),
			[]string{"flows[0].retry.max_retries: missing", "flows[0].retry.backoff: 1ms is outside [step 10ms, 1m]"}},
		{"surge check", minimal + "loop: {surge_check: 2s}\n", []string{"loop.surge_check: 2s is outside [10ms, report_interval 1s]"}},
		{"targets", minimal + "targets: {collateral_drops: 2}\n", []string{"targets.collateral_drops: 2 is not a fraction"}},
		{"wrong shape", minimal + "zones: {zone-a: 1}\n", []string{"zones: want a list, got a mapping"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.doc), "bad")
			if err == nil {
				t.Fatalf("no error; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestBuiltinScenariosParse(t *testing.T) {
	for _, name := range Builtin() {
		for _, arg := range []string{name, name + ".yaml", "scenarios/" + name + ".yaml"} {
			sc, err := Load(arg)
			if err != nil {
				t.Fatalf("Load(%q): %v", arg, err)
			}
			if sc.Name != name || sc.Description == "" {
				t.Errorf("Load(%q): name %q, description %q", arg, sc.Name, sc.Description)
			}
		}
	}
	if _, err := Load("no-such-scenario"); err == nil || !strings.Contains(err.Error(), "uber-surge") {
		t.Errorf("an unknown name: %v; want an error that lists the built-in scenarios", err)
	}
	if _, err := Load("some/dir/x.yaml"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing file: %v", err)
	}
}
