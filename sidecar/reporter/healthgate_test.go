package reporter

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

func TestMissCut(t *testing.T) {
	obj := adaptive.Objective{LatencyP99: 200 * time.Millisecond, Errors: 0.01}
	for _, c := range []struct {
		name string
		p99  time.Duration
		errs float64
		want float64
	}{
		{"met", 200 * time.Millisecond, 0.01, 0},
		{"p99 a quarter over: the gradient", 250 * time.Millisecond, 0, 0.2},
		{"p99 just over: at least a tenth", 210 * time.Millisecond, 0, minGateCut},
		{"p99 far over: at most half", 2 * time.Second, 0, maxGateCut},
		{"errors over: the excess share", 100 * time.Millisecond, 0.208, 0.2},
		{"both: the larger", 400 * time.Millisecond, 0.208, 0.5},
	} {
		if got := missCut(obj, c.p99, c.errs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: missCut(p99 %v, errors %v) = %v, want %v", c.name, c.p99, c.errs, got, c.want)
		}
	}
	if got := missCut(adaptive.Objective{Errors: 0.01}, time.Hour, 0); got != 0 {
		t.Errorf("an errors-only objective cut %v for latency", got)
	}
}

// answers returns a check window's counts: n answers at d, failed of
// them failed.
func answers(n, failed uint64, d time.Duration) *health.Counts {
	c := &health.Counts{OK: n - failed, Failed: failed}
	c.Latency[health.Bucket(d)] = n
	return c
}

// TestHealthGateEpisode: a miss is acted on at the first check that sees
// it, the cut held for one tick and no longer, then the gate rests while
// the miss goes on (the controller decides) and is armed again only after
// the objective is met once more. Too few answers say nothing.
func TestHealthGateEpisode(t *testing.T) {
	obj := adaptive.Objective{LatencyP99: 200 * time.Millisecond}
	g := NewHealthGate(time.Second)
	admitted := func() map[bucket]uint64 { return map[bucket]uint64{{peer: "web"}: 100} }
	at := time.Unix(0, 0)
	check := func(c *health.Counts) bool {
		at = at.Add(100 * time.Millisecond)
		g.Add(at, c)
		return g.Step(at, obj, admitted)
	}
	for range 10 {
		if check(answers(100, 0, 20*time.Millisecond)) {
			t.Fatal("a healthy callee began an episode")
		}
	}
	if check(answers(1, 0, time.Second)); g.Shedding() != 0 {
		t.Fatal("one slow answer among a thousand fast ones began an episode")
	}
	if !check(answers(100, 0, 600*time.Millisecond)) || g.Shedding() != maxGateCut {
		t.Fatalf("the first check that saw a p99 of 600ms against 200ms: shedding %v, want %v", g.Shedding(), maxGateCut)
	}
	began := at
	for at.Add(100*time.Millisecond).Sub(began) < time.Second {
		if check(answers(100, 0, 600*time.Millisecond)) || g.Shedding() != maxGateCut {
			t.Fatalf("%v into the episode: shedding %v, changed; want the cut held for a tick", at.Sub(began), g.Shedding())
		}
	}
	if !check(answers(100, 0, 600*time.Millisecond)) || g.Shedding() != 0 {
		t.Fatalf("a tick into the episode: shedding %v, want it over", g.Shedding())
	}
	for range 20 {
		if check(answers(100, 0, 600*time.Millisecond)) {
			t.Fatal("a resting gate began an episode on its own while the miss went on")
		}
	}
	for range 10 {
		check(answers(100, 0, 20*time.Millisecond))
	}
	if !check(answers(100, 0, 600*time.Millisecond)) || g.Episodes() != 2 {
		t.Errorf("a miss after the objective was met again: episodes %d, want 2", g.Episodes())
	}
	if g.Step(at.Add(100*time.Millisecond), adaptive.Objective{}, admitted); g.Shedding() != 0 {
		t.Error("a policy without an objective left the cut in force")
	}

	few := NewHealthGate(time.Second)
	few.Add(at, answers(minGateAnswers-1, minGateAnswers-1, time.Minute))
	if few.Step(at, obj, admitted) {
		t.Errorf("%d answers, all failed, began an episode: too few to judge", minGateAnswers-1)
	}
}

// TestHealthGateSheddableFirst: an episode's cut falls on the least
// critical tier first, whole, before the next loses anything; the ratios
// it lays over are the projection's where it has one, the policy's
// elsewhere; leaves it cannot cut are left alone.
func TestHealthGateSheddableFirst(t *testing.T) {
	g := NewHealthGate(time.Second)
	admitted := map[bucket]uint64{
		{peer: "batch", tier: criticality.Sheddable}:    100,
		{peer: "web", tier: criticality.Critical}:       200,
		{peer: "mobile", tier: criticality.Critical}:    100,
		{peer: "admin", tier: criticality.CriticalPlus}: 50,
	}
	at := time.Unix(0, 0)
	g.Add(at, answers(100, 0, 2*time.Second))
	if !g.Step(at, adaptive.Objective{LatencyP99: 200 * time.Millisecond}, func() map[bucket]uint64 { return admitted }) {
		t.Fatal("no episode")
	}
	// Half of 450 is 225: batch's 100 whole, then 125 of critical's 300.
	want := [criticality.Count + 1]float64{criticality.Sheddable: 1, criticality.Critical: 125.0 / 300}
	for tier, c := range g.tierCut {
		if math.Abs(c-want[tier]) > 1e-9 {
			t.Errorf("tier %v loses %v, want %v", criticality.Tier(tier), c, want[tier])
		}
	}
	pol := &sidecar.Policy{Service: "api", Peers: []sidecar.Rule{
		{Peer: "admin", Tier: criticality.CriticalPlus, Mode: dropratio.Enforce},
		{Peer: "batch", Tier: criticality.Sheddable, Mode: dropratio.Enforce, DropRatio: 0.2},
		{Peer: "mobile", Tier: criticality.Critical, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceUpstream, DropRatio: 0.3},
		{Peer: "shadow", Tier: criticality.Critical, Mode: dropratio.Shadow},
		{Peer: "web", Tier: criticality.Critical, Mode: dropratio.Enforce, DropRatio: 0.1},
	}}
	proj := []sidecar.Provisional{{Peer: "web", Tier: criticality.Critical, Ratio: 0.4}}
	if out := NewHealthGate(time.Second).Overlay(nil, pol, proj); len(out) != 1 || &out[0] == &proj[0] {
		t.Errorf("no episode: Overlay returned %v sharing proj's array %v; want a copy (proj is the projector's scratch)", out, &out[0] == &proj[0])
	}
	got := map[string]float64{}
	for _, p := range g.Overlay(nil, pol, proj) {
		got[p.Peer] = p.Ratio
	}
	wantRatios := map[string]float64{
		"batch": 1,                     // shed whole
		"web":   1 - 0.6*(1-125.0/300), // the projection's ratio, cut further
	}
	if len(got) != len(wantRatios) {
		t.Errorf("provisional ratios %v, want exactly %v (admin's tier is not cut; mobile is enforced upstream; shadow is not enforced)", got, wantRatios)
	}
	for peer, w := range wantRatios {
		if math.Abs(got[peer]-w) > 1e-9 {
			t.Errorf("%s: ratio %v, want %v", peer, got[peer], w)
		}
	}
}

// TestWindowHealthGateStandsDown: a callee that takes no provisional
// ratios, its leaves metered (here a concurrency cap) or its policy
// expired (its fail mode decides), is not acted on by the gate, which
// says so: no episode, nothing shed.
func TestWindowHealthGateStandsDown(t *testing.T) {
	rule := sidecar.Rule{Peer: "web", Mode: dropratio.Enforce, LimitRPS: 1000, AllowedRPS: 1000, OfferedRPS: 100}
	capped := rule
	capped.MaxConcurrency = 50
	for _, c := range []struct {
		name   string
		rule   sidecar.Rule
		expire bool
	}{{"metered", capped, false}, {"expired", rule, true}} {
		l := sidecar.NewLimiter(sidecar.LimiterOptions{})
		received := time.Now()
		l.SetPolicyAt(&sidecar.Policy{Name: names.Callee("api"), Service: "api", LiveInstances: 1, TTL: time.Second,
			Objective: adaptive.Objective{Errors: 0.01}, Peers: []sidecar.Rule{c.rule}}, received)
		if c.expire {
			l.Expire(received.Add(time.Minute))
		}
		h := l.Service("api").Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}), sidecar.HTTPOptions{})
		start := time.Unix(0, 0)
		w := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api"}, Interval: time.Second, SurgeChecks: true, HealthGate: true}, start, l)
		for i := range 3 {
			for range 200 {
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				req.Header.Set(sidecar.DefaultCallerHeader, "web")
				h.ServeHTTP(httptest.NewRecorder(), req)
			}
			w.Check(start.Add(time.Duration(i+1)*100*time.Millisecond), l)
		}
		if shed, n := w.HealthGate(); shed != 0 || n != 0 {
			t.Errorf("%s: a callee failing every request: shedding %v in %d episodes, want none", c.name, shed, n)
		}
	}
}

// TestWindowHealthGate runs the gate under a Window over a real Limiter
// and its middleware: the app fails every request against an objective of
// 1 % errors; at the first check after, the sidecar drops half of web's
// requests; a tick later it drops none again while the app goes on
// failing. The regular reports still carry every answer once, though the
// gate took the health at each check.
func TestWindowHealthGate(t *testing.T) {
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	l.SetPolicy(&sidecar.Policy{Name: names.Callee("api"), Service: "api", LiveInstances: 1,
		Objective: adaptive.Objective{Errors: 0.01},
		Peers:     []sidecar.Rule{{Peer: "web", Mode: dropratio.Enforce, LimitRPS: 1000, AllowedRPS: 1000, OfferedRPS: 100}}})
	fail := false
	h := l.Service("api").Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if fail {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}), sidecar.HTTPOptions{})
	serve := func(n int) (admitted int) {
		for range n {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set(sidecar.DefaultCallerHeader, "web")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusTooManyRequests {
				admitted++
			}
		}
		return admitted
	}
	start := time.Unix(0, 0)
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api"}, Interval: time.Second, SurgeChecks: true, HealthGate: true}, start, l)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }

	answered := serve(100)
	w.Check(at(100), l)
	fail = true
	answered += serve(100)
	w.Check(at(200), l)
	// Half the span's answers failed against 1 %: the excess share.
	if shed, n := w.HealthGate(); math.Abs(shed-(0.5-0.01)/0.99) > 1e-9 || n != 1 {
		t.Fatalf("after a check window of failures: shedding %v in %d episodes, want %v in 1", shed, n, (0.5-0.01)/0.99)
	}
	if got := serve(1000); got < 450 || got > 550 {
		t.Errorf("while shedding web's sidecar admitted %d of 1000, want about half", got)
	} else {
		answered += got
	}
	rep := w.Tick(at(1000), l)
	if hs := rep.GetHealth(); len(hs) != 1 || int(hs[0].GetOk()+hs[0].GetFailed()) != answered {
		t.Errorf("the regular report's health %v, want all %d answers of its window", hs, answered)
	}
	for ms := 1100; ms <= 1300; ms += 100 {
		w.Check(at(ms), l)
	}
	if shed, n := w.HealthGate(); shed != 0 || n != 1 {
		t.Errorf("a tick after the episode began, the app still failing: shedding %v in %d episodes, want 0 in 1", shed, n)
	}
	if got := serve(100); got != 100 {
		t.Errorf("after the episode web's sidecar admitted %d of 100, want all: the controller decides now", got)
	}
}
