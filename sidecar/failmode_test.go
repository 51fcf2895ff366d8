package sidecar

import (
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// metricValues gathers g and returns the values of the series of the
// counter or gauge name, keyed by their labels, "k=v,k=v" in the order
// Prometheus sorts them.
func metricValues(t *testing.T, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			out[strings.Join(labels, ",")] = v
		}
	}
	return out
}

// t0 is when the tests' policies arrive.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	testTTL   = 10 * time.Second
	testDecay = 30 * time.Second
)

// failPolicy is a policy for checkout with a 10s TTL, a 30s decay and four
// live instances.
func failPolicy(mode dataplane.FailMode, rules ...Rule) *Policy {
	p := policy("checkout", rules...)
	p.TTL = testTTL
	p.FailOpenDecay = testDecay
	p.FailMode = mode
	p.LiveInstances = 4
	return p
}

// decideN decides n requests of peer and returns how many were dropped and
// shadow dropped.
func decideN(s *ServiceLimiter, peer string, n int) (drops, shadows int) {
	for range n {
		d := s.Decide(peer)
		if d.Drop {
			drops++
		}
		if d.Shadow {
			shadows++
		}
	}
	return drops, shadows
}

func TestStripeIsOneCacheLine(t *testing.T) {
	if n := unsafe.Sizeof(stripe{}); n != 64 {
		t.Errorf("a stripe is %d bytes, want 64: one cache line", n)
	}
}

// TestPolicyStateTransitions follows one policy from fresh through stale to
// expired, and back to fresh when a new one arrives, in Status and in the
// gauges.
func TestPolicyStateTransitions(t *testing.T) {
	for _, mode := range []dataplane.FailMode{dataplane.FailOpen, dataplane.FailHold, dataplane.FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			l := NewLimiter(LimiterOptions{})
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(l.Collector())
			check := func(at time.Duration, want PolicyState) {
				t.Helper()
				l.Expire(t0.Add(at))
				st := l.Status("checkout")
				if st.State != want || st.Age != at || st.FailMode != mode || !st.Received.Equal(t0) {
					t.Fatalf("at %v: status %+v, want %v at age %v, mode %v, received %v", at, st, want, at, mode, t0)
				}
				states := metricValues(t, reg, "sluice_sidecar_policy_state")
				for _, s := range []PolicyState{Fresh, Stale, Expired} {
					v := 0.0
					if s == want {
						v = 1
					}
					if got, ok := states["service=checkout,state="+s.String()]; !ok || got != v {
						t.Errorf("at %v: policy_state{state=%q} = %v (present %v), want %v", at, s, got, ok, v)
					}
				}
				if got := metricValues(t, reg, "sluice_sidecar_policy_age_seconds")["service=checkout"]; got != at.Seconds() {
					t.Errorf("at %v: policy_age_seconds = %v", at, got)
				}
			}

			if st := l.Status("checkout"); st.State != NoPolicy {
				t.Fatalf("before any policy: %+v", st)
			}
			l.SetPolicyAt(failPolicy(mode, Rule{Peer: "web", DropRatio: 0.5, LimitRPS: 100, AllowedRPS: 100}), t0)
			check(0, Fresh)
			check(testTTL/2-time.Millisecond, Fresh)
			check(testTTL/2, Stale)
			check(testTTL-time.Millisecond, Stale)
			check(testTTL, Expired)
			check(testTTL+time.Hour, Expired)

			// A new policy, even one with the same content, is fresh at
			// once, before any Expire.
			next := t0.Add(testTTL + time.Hour + time.Second)
			l.SetPolicyAt(failPolicy(mode, Rule{Peer: "web", DropRatio: 0.5, LimitRPS: 100, AllowedRPS: 100}), next)
			if st := l.Status("checkout"); st.State != Fresh || !st.Received.Equal(next) || st.Age != 0 {
				t.Fatalf("after a refresh: %+v", st)
			}
			if r, ok := l.Service("checkout").Ratio("web"); r != 0.5 || !ok {
				t.Errorf("after a refresh: ratio %v, %v; want the policy's 0.5", r, ok)
			}
			l.Expire(next.Add(time.Second))
			if st := l.Status("checkout"); st.State != Fresh || st.Age != time.Second {
				t.Fatalf("a second after a refresh: %+v", st)
			}

			l.RemovePolicy("checkout")
			if st := l.Status("checkout"); st.State != NoPolicy {
				t.Fatalf("after RemovePolicy: %+v", st)
			}
		})
	}
}

// TestSetPolicyWithoutTimeStartsAtNextExpire: SetPolicy leaves the time of
// receipt to the next Expire.
func TestSetPolicyWithoutTimeStartsAtNextExpire(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(failPolicy(dataplane.FailOpen, Rule{Peer: "web", DropRatio: 0.5}))
	if st := l.Status("checkout"); st.State != Fresh || !st.Received.IsZero() {
		t.Fatalf("after SetPolicy: %+v", st)
	}
	l.Expire(t0)
	l.Expire(t0.Add(testTTL - time.Millisecond))
	if st := l.Status("checkout"); st.State != Stale || !st.Received.Equal(t0) {
		t.Fatalf("TTL counted from the first Expire: %+v", st)
	}
}

// TestFailOpenDecays: from the TTL on, the ratio falls linearly to 0 over
// the decay window, the drops follow it, every request the policy's ratio
// would have dropped and the decayed one admitted is counted as fail-open,
// and shadow rules decay without counting.
func TestFailOpenDecays(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		t.Run(strategy.String(), func(t *testing.T) {
			l := NewLimiter(LimiterOptions{Strategy: strategy, OneStripe: true})
			const p0, shadowP0 = 0.8, 0.5
			l.SetPolicyAt(failPolicy(dataplane.FailOpen,
				Rule{Peer: "web", DropRatio: p0},
				Rule{Peer: "batch", DropRatio: shadowP0, Mode: dropratio.Shadow},
				Rule{Peer: "calm"},
			), t0)
			s := l.Service("checkout")

			// tolerance bounds |drops - n·p0·keep|. Diffuse on one stripe:
			// the picked requests and their thinning are each exact to
			// one. Random: the picks are binomial (5 standard deviations),
			// and each of the 8 stripes thins with its own diffusion.
			tolerance := func(n int, p0, keep float64) float64 {
				if strategy == Diffuse {
					return 2
				}
				return 5*math.Sqrt(float64(n)*p0*(1-p0))*keep + nStripes
			}

			// Up to the TTL, nothing changes.
			l.Expire(t0.Add(testTTL - time.Millisecond))
			if drops, _ := decideN(s, "web", 1000); math.Abs(float64(drops)-p0*1000) > tolerance(1000, p0, 1) {
				t.Fatalf("stale: %d of 1000 dropped, want %v", drops, p0*1000)
			}
			before := counts(l, "checkout", "web")

			// 100ms steps from the TTL to the end of the decay window and
			// a second beyond, n requests of each peer per step.
			const step, n = 100 * time.Millisecond, 400
			var offered, dropped int
			sawBetween := false
			for at := testTTL; at <= testTTL+testDecay+time.Second; at += step {
				l.Expire(t0.Add(at))
				f := min(float64(at-testTTL)/float64(testDecay), 1)
				want := p0 * (1 - f)
				st := l.Status("checkout")
				if st.State != Expired || math.Abs(st.Decay-f) > 1e-9 {
					t.Fatalf("at %v: status %+v, want expired with decay %v", at, st, f)
				}
				if r, ok := s.Ratio("web"); !ok || math.Abs(r-want) > 1e-6 {
					t.Fatalf("at %v: Ratio(web) = %v, %v; want %v", at, r, ok, want)
				}
				if r, _ := s.Ratio("batch"); math.Abs(r-shadowP0*(1-f)) > 1e-6 {
					t.Fatalf("at %v: Ratio(batch) = %v, want %v", at, r, shadowP0*(1-f))
				}
				sawBetween = sawBetween || (want > 0.1 && want < 0.7)

				drops, shadows := decideN(s, "web", n)
				if shadows != 0 {
					t.Fatalf("at %v: %d shadow drops of an enforced rule", at, shadows)
				}
				tol := tolerance(n, p0, 1-f)
				if math.Abs(float64(drops)-n*want) > tol+1e-9 {
					t.Fatalf("at %v: %d of %d dropped, want %v ± %.1f", at, drops, n, n*want, tol)
				}
				if at >= testTTL+testDecay && drops != 0 {
					t.Fatalf("at %v, after the decay window: %d drops", at, drops)
				}
				if bd, bs := decideN(s, "batch", n); bd != 0 || math.Abs(float64(bs)-n*shadowP0*(1-f)) > tolerance(n, shadowP0, 1-f)+1e-9 {
					t.Fatalf("at %v: shadow rule: %d dropped, %d shadow dropped, want 0 and %v", at, bd, bs, n*shadowP0*(1-f))
				}
				if cd, cs := decideN(s, "calm", n); cd+cs != 0 {
					t.Fatalf("at %v: a ratio-0 peer: %d dropped, %d shadow dropped", at, cd, cs)
				}
				offered += n
				dropped += drops
			}
			if !sawBetween {
				t.Fatal("the test never looked at the middle of the decay")
			}

			// Every request the policy's ratio picked is either dropped or
			// fail-open; the picked ones are n·p0 of the offered.
			after := counts(l, "checkout", "web")
			if got := after.Dropped - before.Dropped; got != uint64(dropped) {
				t.Fatalf("dropped counter moved by %d, %d drops seen", got, dropped)
			}
			failOpen := s.failCounts().failOpen
			picked := float64(failOpen) + float64(dropped)
			tol := 1.0
			if strategy == Random {
				tol = 5 * math.Sqrt(float64(offered)*p0*(1-p0))
			}
			if math.Abs(picked-p0*float64(offered)) > tol {
				t.Errorf("fail-open %d + dropped %d = %v, want the policy's %v of %d offered (± %.0f)",
					failOpen, dropped, picked, p0, offered, tol)
			}
			if failOpen == 0 || float64(failOpen) < float64(offered-dropped)*0.5 {
				t.Errorf("fail-open %d of %d admitted", failOpen, offered-dropped)
			}
			if fc := s.failCounts(); fc.localAdmitted+fc.localDropped+fc.localShadow != 0 {
				t.Errorf("local counters moved under fail-open: %+v", fc)
			}
		})
	}
}

// TestFailOpenDefaultsAndBlockedPeer: a policy without TTL or decay gets
// 10s and 30s; a blocked peer (limit 0) decays like any other.
func TestFailOpenDefaults(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := policy("checkout", Rule{Peer: "web", DropRatio: 0.6})
	l.SetPolicyAt(p, t0)
	s := l.Service("checkout")
	l.Expire(t0.Add(DefaultPolicyTTL - time.Millisecond))
	if st := s.Status(); st.State != Stale {
		t.Fatalf("just before the default TTL: %+v", st)
	}
	l.Expire(t0.Add(DefaultPolicyTTL + DefaultFailOpenDecay/2))
	if r, _ := s.Ratio("web"); math.Abs(r-0.3) > 1e-6 {
		t.Errorf("half way through the default decay: ratio %v, want 0.3", r)
	}
}

// TestFailHoldKeeps: an expired hold policy keeps every ratio, for ever.
func TestFailHoldKeeps(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := failPolicy(dataplane.FailHold, Rule{Peer: "web", DropRatio: 0.8}, Rule{Peer: "batch", DropRatio: 0.5, Mode: dropratio.Shadow})
	l.SetPolicyAt(p, t0)
	s := l.Service("checkout")
	for _, at := range []time.Duration{testTTL, testTTL + testDecay, 24 * time.Hour} {
		l.Expire(t0.Add(at))
		if st := s.Status(); st.State != Expired || st.FailMode != dataplane.FailHold || st.Decay != 0 {
			t.Fatalf("at %v: %+v", at, st)
		}
		if r, ok := s.Ratio("web"); r != 0.8 || !ok {
			t.Errorf("at %v: ratio %v, %v; want 0.8", at, r, ok)
		}
		if drops, _ := decideN(s, "web", 1000); math.Abs(float64(drops)-800) > nStripes/2 {
			t.Errorf("at %v: %d of 1000 dropped, want 800", at, drops)
		}
		if _, shadows := decideN(s, "batch", 1000); math.Abs(float64(shadows)-500) > nStripes/2 {
			t.Errorf("at %v: %d of 1000 shadow dropped, want 500", at, shadows)
		}
	}
	if fc := s.failCounts(); fc != (failCounts{}) {
		t.Errorf("fail-mode counters moved under hold: %+v", fc)
	}
}

// TestFailLocalTokenBucket: an expired local policy admits limit / live
// instances per second of each limited peer, drops the rest, and admits
// peers without a limit; fractions of a token carry over.
func TestFailLocalTokenBucket(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		t.Run(strategy.String(), func(t *testing.T) {
			l := NewLimiter(LimiterOptions{Strategy: strategy})
			inf := math.Inf(1)
			l.SetPolicyAt(failPolicy(dataplane.FailLocal, // 4 live instances
				Rule{Peer: "web", DropRatio: 0.9, LimitRPS: 1000, AllowedRPS: 1000},   // 250/s here
				Rule{Peer: "mobile", LimitRPS: 10, AllowedRPS: 10},                    // 2.5/s: fractions
				Rule{Peer: "capacity", DropRatio: 0.3, LimitRPS: inf, AllowedRPS: 50}, // no limit of its own
				Rule{Peer: "blocked", DropRatio: 0.99, LimitRPS: 0, AllowedRPS: 0},
				Rule{Peer: "batch", DropRatio: 0.2, LimitRPS: 400, AllowedRPS: 400, Mode: dropratio.Shadow}, // 100/s
			), t0)
			s := l.Service("checkout")
			start := t0.Add(testTTL)

			// 20 requests of each peer per millisecond, an Expire every
			// 100ms as the sidecar does, for 4 seconds; admitted counted
			// per second.
			peers := []string{"web", "mobile", "capacity", "blocked", "batch"}
			var admitted [4][5]int
			var shadowed [4]int
			for ms := range 4000 {
				if ms%100 == 0 {
					l.Expire(start.Add(time.Duration(ms) * time.Millisecond))
				}
				for i, peer := range peers {
					for range 20 {
						d := s.Decide(peer)
						if !d.Drop {
							admitted[ms/1000][i]++
						}
						if d.Shadow {
							shadowed[ms/1000]++
						}
					}
				}
			}
			if st := s.Status(); st.State != Expired || st.FailMode != dataplane.FailLocal {
				t.Fatalf("status %+v", st)
			}
			for sec := range 4 {
				// The bucket starts full (LocalBurst: 25 tokens) and gets
				// 25 per Expire: 250 in every second.
				if got := admitted[sec][0]; got != 250 {
					t.Errorf("second %d: web admitted %d, want 250 (1000 rps / 4 instances)", sec, got)
				}
				if got := admitted[sec][2]; got != 20000 {
					t.Errorf("second %d: capacity (no limit) admitted %d of 20000", sec, got)
				}
				if got := admitted[sec][3]; got != 0 {
					t.Errorf("second %d: blocked admitted %d", sec, got)
				}
				if got := admitted[sec][4]; got != 20000 {
					t.Errorf("second %d: shadow rule admitted %d of 20000", sec, got)
				}
				if got := shadowed[sec]; got != 20000-100 {
					t.Errorf("second %d: %d shadow drops, want %d (400 rps / 4 instances admitted)", sec, got, 20000-100)
				}
			}
			// 2.5 per second: a token (the least burst) at the start, then
			// a quarter token per Expire, carried over: 1 + 39 × 0.25.
			mobile := admitted[0][1] + admitted[1][1] + admitted[2][1] + admitted[3][1]
			if mobile != 10 {
				t.Errorf("mobile admitted %d in 4s, want 10 (2.5 rps)", mobile)
			}

			fc := s.failCounts()
			web, blocked := counts(l, "checkout", "web"), counts(l, "checkout", "blocked")
			wantAdmitted := uint64(1000 + 10 + 400)
			wantDropped := (web.Dropped) + (blocked.Dropped) + uint64(80000-mobile)
			if fc.localAdmitted != wantAdmitted || fc.localDropped != wantDropped || fc.localShadow != 80000-400 {
				t.Errorf("local counters %+v, want %d admitted, %d dropped, %d shadow", fc, wantAdmitted, wantDropped, 80000-400)
			}
			if web.Dropped != 80000-1000 || blocked.Dropped != 80000 {
				t.Errorf("dropped: web %d, blocked %d", web.Dropped, blocked.Dropped)
			}
			if fc.failOpen != 0 {
				t.Errorf("fail-open counted under local: %d", fc.failOpen)
			}
			for _, peer := range []string{"web", "mobile", "blocked", "batch"} {
				if _, ok := s.Ratio(peer); ok {
					t.Errorf("Ratio(%s) has a ratio under local", peer)
				}
			}
			if r, ok := s.Ratio("capacity"); r != 0 || !ok {
				t.Errorf("Ratio(capacity) = %v, %v; want 0: a peer without a limit is admitted", r, ok)
			}
		})
	}
}

// TestFailLocalSteadyExcess: a bucket drained at every refill by a steady
// excess admits its rate, fractions of a token included: it used to lose
// the fraction a drained bucket carries to the burst's cap at each refill,
// and admit 20 of a 25 rps share.
func TestFailLocalSteadyExcess(t *testing.T) {
	for _, tc := range []struct {
		limit float64 // over failPolicy's 4 live instances
		want  int     // admitted over 10 s
	}{
		{limit: 1000, want: 2500},   // 25 tokens a refill
		{limit: 100, want: 250},     // 2.5 a refill: was 200
		{limit: 133.2, want: 333},   // 3.33: was 300
		{limit: 1332, want: 3330},   // 33.3: was 3300
		{limit: 10, want: 25},       // 0.25, with the least burst of one token
		{limit: 2000.4, want: 5001}, // 50.01
	} {
		l := NewLimiter(LimiterOptions{})
		l.SetPolicyAt(failPolicy(dataplane.FailLocal, Rule{Peer: "web", LimitRPS: tc.limit}), t0)
		s := l.Service("checkout")
		start := t0.Add(testTTL)
		admitted := 0
		// 5 requests a millisecond, far more than any share here, and an
		// Expire every 100ms as the sidecar does.
		for ms := range 10000 {
			if ms%100 == 0 {
				l.Expire(start.Add(time.Duration(ms) * time.Millisecond))
			}
			for range 5 {
				if !s.Decide("web").Drop {
					admitted++
				}
			}
		}
		// A full bucket at the first Expire, a refill at each of the 99
		// others: the rate's worth, the burst being one refill's, give or
		// take the fraction of a token left at the end.
		if d := admitted - tc.want; d < -1 || d > 1 {
			t.Errorf("limit %v over 4 instances: admitted %d in 10s, want %d", tc.limit, admitted, tc.want)
		}
	}
}

// TestFailLocalLateRefill: an Expire that comes late refills for the whole
// time it missed, even beyond the burst, so a busy machine does not lower
// the local rate.
func TestFailLocalLateRefill(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicyAt(failPolicy(dataplane.FailLocal, Rule{Peer: "web", LimitRPS: 400}), t0) // 100/s
	s := l.Service("checkout")
	start := t0.Add(testTTL)
	l.Expire(start) // full: 10 tokens
	admitted := 0
	for _, at := range []time.Duration{500 * time.Millisecond, time.Second} {
		for range 1000 {
			if !s.Decide("web").Drop {
				admitted++
			}
		}
		l.Expire(start.Add(at))
	}
	for range 1000 {
		if !s.Decide("web").Drop {
			admitted++
		}
	}
	if admitted != 110 {
		t.Errorf("admitted %d over one second with Expires 500ms apart, want 110 (10 + 100/s)", admitted)
	}
}

// TestLocalWithoutLiveInstances: a policy that does not know how many
// instances there are (0) has each enforce the whole limit, rather than
// block.
func TestLocalWithoutLiveInstances(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := failPolicy(dataplane.FailLocal, Rule{Peer: "web", LimitRPS: 100})
	p.LiveInstances = 0
	l.SetPolicyAt(p, t0)
	l.Expire(t0.Add(testTTL))
	if got := l.Service("checkout").table.Load().verdicts[leaf{"web", "", 0}].bucket.perSec; got != 100*tokenUnit {
		t.Errorf("bucket rate %v tokens/s, want 100", got/tokenUnit)
	}
}

// TestRefreshEndsFailMode: a new policy ends an open or local fail mode at
// once: the next decision follows it.
func TestRefreshEndsFailMode(t *testing.T) {
	for _, mode := range []dataplane.FailMode{dataplane.FailOpen, dataplane.FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			l := NewLimiter(LimiterOptions{})
			rules := []Rule{{Peer: "web", DropRatio: 0.5, LimitRPS: 4, AllowedRPS: 4}}
			l.SetPolicyAt(failPolicy(mode, rules...), t0)
			s := l.Service("checkout")
			l.Expire(t0.Add(testTTL + testDecay)) // open: ratio 0 now; local: 1 rps
			if drops, _ := decideN(s, "web", 1000); (mode == dataplane.FailOpen) != (drops == 0) {
				t.Fatalf("expired: %d of 1000 dropped", drops)
			}
			// The same content again: still a refresh.
			l.SetPolicyAt(failPolicy(mode, rules...), t0.Add(testTTL+testDecay+time.Second))
			if st := s.Status(); st.State != Fresh {
				t.Fatalf("after the refresh: %+v", st)
			}
			if drops, _ := decideN(s, "web", 1000); math.Abs(float64(drops)-500) > nStripes/2 {
				t.Errorf("after the refresh: %d of 1000 dropped, want 500", drops)
			}
			if r, ok := s.Ratio("web"); r != 0.5 || !ok {
				t.Errorf("after the refresh: ratio %v, %v", r, ok)
			}
		})
	}
}

// TestNewPeerUnderFailMode: a table rebuilt for a peer first seen while a
// fail mode is in force keeps the fail mode's verdicts.
func TestNewPeerUnderFailMode(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := failPolicy(dataplane.FailLocal, Rule{Peer: "web", LimitRPS: 0})
	l.SetPolicyAt(p, t0)
	l.Expire(t0.Add(testTTL))
	s := l.Service("checkout")
	s.Decide("someone-else") // a new table, copy on write
	if d := s.Decide("web"); !d.Drop || d.Rule() != &p.Peers[0] {
		t.Errorf("after a new peer: web's decision %+v, want a drop by its empty bucket", d)
	}
	if d := s.Decide("someone-else"); d.Drop || d.Rule() != nil {
		t.Errorf("the new, unlisted peer: %+v", d)
	}
}

// TestDecideAllocatesNothingInFailModes: every fail mode's decisions are
// allocation free, admitted and dropped.
func TestDecideAllocatesNothingInFailModes(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		for _, mode := range []dataplane.FailMode{dataplane.FailOpen, dataplane.FailHold, dataplane.FailLocal} {
			t.Run(strategy.String()+"/"+mode.String(), func(t *testing.T) {
				l := NewLimiter(LimiterOptions{Strategy: strategy})
				l.SetPolicyAt(failPolicy(mode,
					Rule{Peer: "admitted", LimitRPS: 1e12},
					Rule{Peer: "dropped", DropRatio: math.Nextafter(1, 0), LimitRPS: 0},
					Rule{Peer: "shadow", DropRatio: math.Nextafter(1, 0), LimitRPS: 0, Mode: dropratio.Shadow},
					Rule{Peer: "unlimited", DropRatio: 0.5, LimitRPS: math.Inf(1)},
				), t0)
				s := l.Service("checkout")
				l.Expire(t0.Add(testTTL + testDecay/2))
				if st := s.Status(); st.State != Expired {
					t.Fatalf("status %+v", st)
				}
				for _, peer := range []string{"admitted", "dropped", "shadow", "unlimited", "unlisted"} {
					s.Decide(peer) // first sighting
					var drops, shadows int
					got := testing.AllocsPerRun(1000, func() {
						d := s.Decide(peer)
						if d.Drop {
							drops++
						}
						if d.Shadow {
							shadows++
						}
					})
					if got != 0 {
						t.Errorf("%s: %v allocations per Decide", peer, got)
					}
					if peer == "dropped" && drops == 0 || peer == "shadow" && shadows == 0 {
						t.Errorf("%s: no drop to measure", peer)
					}
				}
			})
		}
	}
}

// TestFailModesConcurrently: decisions racing with Expire and policy swaps
// stay counted exactly once, and every drop is under an enforced rule.
// Run with -race.
func TestFailModesConcurrently(t *testing.T) {
	// Expire's clock runs far ahead of the deciders: no peer may look idle.
	l := NewLimiter(LimiterOptions{MaxPeers: 8, PeerIdle: -1})
	policies := []*Policy{
		failPolicy(dataplane.FailOpen, Rule{Peer: "a", DropRatio: 0.5}, Rule{Peer: "b", DropRatio: 0.3, Mode: dropratio.Shadow, LimitRPS: 1}),
		failPolicy(dataplane.FailLocal, Rule{Peer: "a", DropRatio: 0.5, LimitRPS: 40}, Rule{Peer: "b", LimitRPS: 0, Mode: dropratio.Shadow}),
		failPolicy(dataplane.FailHold, Rule{Peer: "a", DropRatio: 0.2}),
	}
	l.SetPolicyAt(policies[0], t0)
	s := l.Service("checkout")
	var calls, drops, shadows atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	peers := []string{"a", "b", "c", ""}
	for g := range 4 {
		wg.Go(func() {
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := s.Decide(peers[i%len(peers)])
				calls.Add(1)
				if d.Drop {
					drops.Add(1)
					if r := d.Rule(); r == nil || r.Mode != dropratio.Enforce || r.upstream() {
						t.Errorf("drop under rule %+v", r)
						return
					}
				}
				if d.Shadow {
					shadows.Add(1)
					if r := d.Rule(); r == nil || r.Mode != dropratio.Shadow {
						t.Errorf("shadow drop under rule %+v", r)
						return
					}
				}
			}
		})
	}
	// Every 50 Expires (5s of policy time at 100ms) a new policy: each
	// one goes fresh, stale, expired, and part of its fail mode.
	now := t0
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < 3000 || drops.Load() == 0 || shadows.Load() == 0; i++ {
		if time.Now().After(deadline) {
			close(stop)
			t.Fatalf("after %d steps: %d calls, %d drops, %d shadow drops", i, calls.Load(), drops.Load(), shadows.Load())
		}
		now = now.Add(testTTL / 50)
		if i%200 == 199 {
			l.SetPolicyAt(policies[(i/200)%len(policies)], now)
		}
		l.Expire(now)
	}
	close(stop)
	waitTimeout(t, &wg)

	var total PeerCounts
	for _, c := range l.AppendCounts("checkout", nil) {
		total.Offered += c.Offered
		total.Dropped += c.Dropped
		total.ShadowDropped += c.ShadowDropped
	}
	if want := (PeerCounts{Offered: calls.Load(), Dropped: drops.Load(), ShadowDropped: shadows.Load()}); total != want {
		t.Errorf("counters sum to %+v, decisions were %+v", total, want)
	}
	fc := s.failCounts()
	if fc.localDropped > total.Dropped || fc.localShadow > total.ShadowDropped {
		t.Errorf("local counters %+v exceed the totals %+v", fc, total)
	}
}

// TestFailModeMetrics: the collector exports the fail-mode counters, and
// the drop ratio in force: decayed under open, absent under local.
func TestFailModeMetrics(t *testing.T) {
	l := NewLimiter(LimiterOptions{OneStripe: true})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(l.Collector())
	l.SetPolicyAt(failPolicy(dataplane.FailOpen, Rule{Peer: "web", DropRatio: 0.8}, Rule{Peer: "batch", DropRatio: 0.4, Mode: dropratio.Shadow}), t0)
	s := l.Service("checkout")
	l.Expire(t0.Add(testTTL + testDecay*3/4))
	drops, _ := decideN(s, "web", 1000) // 800 picked, a quarter of them dropped
	ratios := metricValues(t, reg, "sluice_sidecar_drop_ratio")
	if got := ratios["criticality=,mode=enforce,peer=web,procedure=,service=checkout"]; math.Abs(got-0.2) > 1e-9 {
		t.Errorf("drop_ratio{web} = %v, want 0.2", got)
	}
	if got := ratios["criticality=,mode=shadow,peer=batch,procedure=,service=checkout"]; math.Abs(got-0.1) > 1e-9 {
		t.Errorf("drop_ratio{batch} = %v, want 0.1", got)
	}
	if got := metricValues(t, reg, "sluice_sidecar_fail_open_total")["service=checkout"]; got != float64(800-drops) || drops != 200 {
		t.Errorf("fail_open_total = %v with %d drops, want 600 and 200", got, drops)
	}

	l.SetPolicyAt(failPolicy(dataplane.FailLocal, Rule{Peer: "web", DropRatio: 0.8, LimitRPS: 400}, Rule{Peer: "batch", LimitRPS: 0, Mode: dropratio.Shadow}), t0)
	l.Expire(t0.Add(testTTL)) // web: 10 tokens
	decideN(s, "web", 30)
	decideN(s, "batch", 5)
	if got := metricValues(t, reg, "sluice_sidecar_drop_ratio"); len(got) != 0 {
		t.Errorf("drop_ratio under local: %v, want no series", got)
	}
	want := map[string]float64{
		"outcome=admitted,service=checkout":       15, // 10 tokens, and 5 shadow drops
		"outcome=dropped,service=checkout":        20,
		"outcome=shadow_dropped,service=checkout": 5,
	}
	got := metricValues(t, reg, "sluice_sidecar_local_decisions_total")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("local_decisions_total{%s} = %v, want %v", k, got[k], v)
		}
	}
	if got := metricValues(t, reg, "sluice_sidecar_fail_open_total")["service=checkout"]; got != 600 {
		t.Errorf("fail_open_total = %v after the fail-open ended, want 600 still", got)
	}
	if n, err := testutil.GatherAndLint(reg); err != nil || len(n) != 0 {
		t.Errorf("lint: %v %v", n, err)
	}
}

// TestExpiryStep drives the policy clock's step as the agent and the
// simulator do: each Step expires at its instant and says when the state
// changed, from what.
func TestExpiryStep(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	x := Expiry{Limiter: l, Service: "checkout"}
	type step struct {
		at      time.Duration
		set     bool // SetPolicyAt(failPolicy(FailHold), t0+at) before the step
		state   PolicyState
		prev    PolicyState
		changed bool
	}
	for i, s := range []step{
		{at: 0, state: NoPolicy, prev: NoPolicy, changed: false},
		{at: 100 * time.Millisecond, set: true, state: Fresh, prev: NoPolicy, changed: true},
		{at: 200 * time.Millisecond, state: Fresh, prev: Fresh},
		{at: testTTL/2 + 100*time.Millisecond, state: Stale, prev: Fresh, changed: true},
		{at: testTTL + 100*time.Millisecond, state: Expired, prev: Stale, changed: true},
		{at: testTTL + 200*time.Millisecond, state: Expired, prev: Expired},
		{at: testTTL + 250*time.Millisecond, set: true, state: Fresh, prev: Expired, changed: true},
	} {
		if s.set {
			l.SetPolicyAt(failPolicy(dataplane.FailHold, Rule{Peer: "web", DropRatio: 0.5}), t0.Add(s.at))
		}
		st, prev, changed := x.Step(t0.Add(s.at))
		if st.State != s.state || prev != s.prev || changed != s.changed {
			t.Fatalf("step %d at %v: state %v, previous %v, changed %v; want %v, %v, %v",
				i, s.at, st.State, prev, changed, s.state, s.prev, s.changed)
		}
		if s.state == Expired && st.FailMode != dataplane.FailHold {
			t.Fatalf("step %d: fail mode %v, want hold", i, st.FailMode)
		}
	}
}

// Two gRPC procedures of checkout, for the tests of a caller's limit across
// procedures under fail mode local.
const (
	procPay    = "/shop.Checkout/Pay"
	procRefund = "/shop.Checkout/Refund"
)

// localProcedures is a fail-local policy of checkout that declares procPay
// and procRefund, with one live instance: a rate of the rules is this
// sidecar's share.
func localProcedures(rules ...Rule) *Policy {
	p := failPolicy(dataplane.FailLocal, rules...)
	slices.SortFunc(p.Peers, func(a, b Rule) int { return cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier}) })
	p.Procedures = []string{procPay, procRefund}
	p.LiveInstances = 1
	return p
}

// runLocal offers each of methods 100 rps of web for 10s after s's policy
// expired (one request of each, in turn, every 10ms), with an Expire every
// 100ms as the sidecar does, and returns how many of each were admitted.
func runLocal(l *Limiter, s *ServiceLimiter, methods ...string) []int {
	start := t0.Add(testTTL)
	admitted := make([]int, len(methods))
	for ms := 0; ms < 10000; ms += 10 {
		if ms%100 == 0 {
			l.Expire(start.Add(time.Duration(ms) * time.Millisecond))
		}
		for i, m := range methods {
			if !s.DecideGRPC("web", m).Drop {
				admitted[i]++
			}
		}
	}
	return admitted
}

// TestFailLocalCallerLimitAcrossProcedures: under fail mode local the
// leaves of a caller share its limit across procedures. web's limit is 100
// rps; each of its leaves carries it as its own LimitRPS too (the
// controller's min of the two), which alone would admit 100 rps of each.
func TestFailLocalCallerLimitAcrossProcedures(t *testing.T) {
	t.Run("leaves without limits of their own", func(t *testing.T) {
		l := NewLimiter(LimiterOptions{})
		l.SetPolicyAt(localProcedures(
			Rule{Peer: "web", Procedure: procPay, LimitRPS: 100, CallerLimitRPS: 100},
			Rule{Peer: "web", Procedure: procRefund, LimitRPS: 100, CallerLimitRPS: 100},
		), t0)
		s := l.Service("checkout")
		got := runLocal(l, s, procPay, procRefund)
		// The caller's bucket starts full (10 tokens) and gets 10 per
		// Expire: 1000 in 10s, shared.
		if total := got[0] + got[1]; total != 1000 {
			t.Errorf("admitted %v: %d in 10s, want 1000 (100 rps across both procedures, not 200)", got, total)
		}
		if d := got[0] - got[1]; d < -10 || d > 10 {
			t.Errorf("admitted %v: want the limit shared about evenly by equal demand", got)
		}
		fc := s.failCounts()
		if fc.localAdmitted != 1000 || fc.localDropped != 2000-1000 || fc.localShadow != 0 {
			t.Errorf("local counters %+v, want 1000 admitted, 1000 dropped", fc)
		}
		c := leafCounts(l, "checkout")
		if a, b := c["web/"+procPay], c["web/"+procRefund]; a.Dropped+b.Dropped != 1000 || a.Offered != 1000 || b.Offered != 1000 {
			t.Errorf("leaf counts %+v, %+v; want 1000 offered each, 1000 dropped between them", a, b)
		}
	})
	t.Run("a leaf with a tighter limit", func(t *testing.T) {
		l := NewLimiter(LimiterOptions{})
		l.SetPolicyAt(localProcedures(
			Rule{Peer: "web", Procedure: procPay, LimitRPS: 30, CallerLimitRPS: 100},
			Rule{Peer: "web", Procedure: procRefund, LimitRPS: 100, CallerLimitRPS: 100},
		), t0)
		got := runLocal(l, l.Service("checkout"), procPay, procRefund)
		// Pay is held at its 30 rps; a request its own bucket refuses
		// takes nothing from web's, which Refund gets the rest of.
		if d := got[0] - 300; d < -1 || d > 1 {
			t.Errorf("Pay admitted %d in 10s, want 300 (its own 30 rps)", got[0])
		}
		if total := got[0] + got[1]; total != 1000 {
			t.Errorf("admitted %v: %d in 10s, want web's 1000", got, total)
		}
	})
	t.Run("a callee without procedures", func(t *testing.T) {
		// One bucket, as before procedures. CallerLimitRPS is 0 here (the
		// zero Rule): it would block web, but it means nothing without a
		// procedure.
		l := NewLimiter(LimiterOptions{})
		p := failPolicy(dataplane.FailLocal, Rule{Peer: "web", LimitRPS: 100})
		p.LiveInstances = 1
		l.SetPolicyAt(p, t0)
		got := runLocal(l, l.Service("checkout"), procPay, procRefund)
		if total := got[0] + got[1]; total != 1000 {
			t.Errorf("admitted %v: %d in 10s, want 1000", got, total)
		}
	})
	t.Run("only a caller limit", func(t *testing.T) {
		// A leaf without a LimitRPS (no controller sends that; a
		// hand-built policy may) is bounded by its caller's bucket alone.
		l := NewLimiter(LimiterOptions{})
		l.SetPolicyAt(localProcedures(
			Rule{Peer: "web", Procedure: procPay, LimitRPS: math.Inf(1), CallerLimitRPS: 100},
			Rule{Peer: "web", Procedure: procRefund, LimitRPS: math.Inf(1), CallerLimitRPS: 100},
		), t0)
		got := runLocal(l, l.Service("checkout"), procPay, procRefund)
		if total := got[0] + got[1]; total != 1000 {
			t.Errorf("admitted %v: %d in 10s, want 1000", got, total)
		}
	})
}

// TestFailLocalCallerBucketConcurrently: deciders racing on two leaves of
// a caller admit exactly the caller bucket's tokens, and each leaf's own
// bucket is charged only for what it admitted: the tokens of requests
// the caller's bucket refused go back. Run with -race.
func TestFailLocalCallerBucketConcurrently(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	// The caller's bucket holds 100 tokens (1000 rps, LocalBurst); each
	// leaf's 100000.
	l.SetPolicyAt(localProcedures(
		Rule{Peer: "web", Procedure: procPay, LimitRPS: 1e6, CallerLimitRPS: 1000},
		Rule{Peer: "web", Procedure: procRefund, LimitRPS: 1e6, CallerLimitRPS: 1000},
	), t0)
	s := l.Service("checkout")
	l.Expire(t0.Add(testTTL)) // derives; no refill after it
	var admitted [2]atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				k := (g + i) % 2
				if !s.DecideGRPC("web", []string{procPay, procRefund}[k]).Drop {
					admitted[k].Add(1)
				}
			}
		})
	}
	waitTimeout(t, &wg)
	if a, b := admitted[0].Load(), admitted[1].Load(); a+b != 100 {
		t.Errorf("admitted %d + %d, want the caller bucket's 100 tokens", a, b)
	}
	tbl := s.table.Load()
	for k, proc := range []string{procPay, procRefund} {
		v := tbl.verdicts[leaf{"web", proc, 0}]
		if v == nil || v.bucket == nil || v.caller == nil {
			t.Fatalf("web/%s: verdict %+v, want a bucket of its own and its caller's", proc, v)
		}
		if got, want := v.bucket.tokens.Load(), v.bucket.burst-admitted[k].Load()*tokenUnit; got != want {
			t.Errorf("web/%s: %d units left in its own bucket, want %d: charged for refused requests", proc, got, want)
		}
	}
}

// TestDecideAllocatesNothingWithCallerBuckets: fail mode local's decisions
// of leaves that share their caller's bucket allocate nothing, admitted,
// dropped by their own bucket, dropped by the caller's (a token given
// back), and shadow dropped.
func TestDecideAllocatesNothingWithCallerBuckets(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		t.Run(strategy.String(), func(t *testing.T) {
			l := NewLimiter(LimiterOptions{Strategy: strategy})
			l.SetPolicyAt(localProcedures(
				Rule{Peer: "admitted", Procedure: procPay, LimitRPS: 1e12, CallerLimitRPS: 1e12},
				Rule{Peer: "own", Procedure: procPay, LimitRPS: 0, CallerLimitRPS: 1e12},
				Rule{Peer: "caller", Procedure: procPay, LimitRPS: 1e12, CallerLimitRPS: 0},
				Rule{Peer: "shadow", Procedure: procPay, LimitRPS: 1e12, CallerLimitRPS: 0, Mode: dropratio.Shadow},
			), t0)
			s := l.Service("checkout")
			l.Expire(t0.Add(testTTL))
			for _, peer := range []string{"admitted", "own", "caller", "shadow"} {
				s.DecideGRPC(peer, procPay) // first sighting
				var drops, shadows int
				got := testing.AllocsPerRun(1000, func() {
					d := s.DecideGRPC(peer, procPay)
					if d.Drop {
						drops++
					}
					if d.Shadow {
						shadows++
					}
				})
				if got != 0 {
					t.Errorf("%s: %v allocations per DecideGRPC", peer, got)
				}
				if want := peer == "own" || peer == "caller"; (drops > 0) != want || peer == "shadow" && shadows == 0 {
					t.Errorf("%s: %d drops, %d shadow drops", peer, drops, shadows)
				}
			}
		})
	}
}
