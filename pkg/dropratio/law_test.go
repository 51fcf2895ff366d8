package dropratio

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var inf = math.Inf(1)

func mustNew(t testing.TB, cfg Config) *Law {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return l
}

// find returns the verdict of one bucket; ok is false if it is not in out.
func find(out []ServiceVerdict, service, caller string) (Verdict, bool) {
	for _, sv := range out {
		if sv.Service != service {
			continue
		}
		for _, v := range sv.Verdicts {
			if v.Caller == caller {
				return v, true
			}
		}
	}
	return Verdict{}, false
}

func mustFind(t *testing.T, out []ServiceVerdict, service, caller string) Verdict {
	t.Helper()
	v, ok := find(out, service, caller)
	if !ok {
		t.Fatalf("no verdict for %s <- %s in %+v", service, caller, out)
	}
	return v
}

// near allows for the rounding of 1 - a/b; expected values in these tests are
// written as decimals.
func near(a, b float64) bool {
	return a == b || math.Abs(a-b) <= 1e-12
}

type wantVerdict struct {
	service, caller string
	ratio           float64
	allowed         float64
	reason          Reason
}

func TestStepSingle(t *testing.T) {
	svc := func(capacity float64, callers ...Caller) []Service {
		return []Service{{Name: "api", Capacity: capacity, Callers: callers}}
	}
	tests := []struct {
		name     string
		cfg      func(*Config)
		services []Service
		want     []wantVerdict
	}{
		{
			name:     "under limit",
			services: svc(inf, Caller{Name: "web", Offered: 50, Limit: 100}),
			want:     []wantVerdict{{"api", "web", 0, 100, None}},
		},
		{
			name:     "at limit",
			services: svc(inf, Caller{Name: "web", Offered: 100, Limit: 100}),
			want:     []wantVerdict{{"api", "web", 0, 100, None}},
		},
		{
			name:     "5x over",
			services: svc(inf, Caller{Name: "web", Offered: 500, Limit: 100}),
			want:     []wantVerdict{{"api", "web", 0.8, 100, OverLimit}},
		},
		{
			name:     "15x over",
			services: svc(inf, Caller{Name: "web", Offered: 1500, Limit: 100}),
			want:     []wantVerdict{{"api", "web", 1 - 1.0/15, 100, OverLimit}},
		},
		{
			name:     "1000x over is clamped to PMax",
			services: svc(inf, Caller{Name: "web", Offered: 100000, Limit: 100}),
			want:     []wantVerdict{{"api", "web", 0.99, 100, OverLimit}},
		},
		{
			name:     "PMax clamp with a lower PMax",
			cfg:      func(c *Config) { c.PMax = 0.5 },
			services: svc(inf, Caller{Name: "web", Offered: 500, Limit: 100}),
			want:     []wantVerdict{{"api", "web", 0.5, 100, OverLimit}},
		},
		{
			name:     "no limit",
			services: svc(inf, Caller{Name: "web", Offered: 1e9, Limit: inf}),
			want:     []wantVerdict{{"api", "web", 0, inf, None}},
		},
		{
			name: "limit 0 blocks, even below MinRate and without traffic",
			services: svc(inf,
				Caller{Name: "a", Offered: 10, Limit: 0},
				Caller{Name: "b", Offered: 0.5, Limit: 0},
				Caller{Name: "c", Offered: 0, Limit: 0}),
			want: []wantVerdict{
				{"api", "a", 0.99, 0, OverLimit},
				{"api", "b", 0.99, 0, OverLimit},
				{"api", "c", 0.99, 0, OverLimit}, // listed without traffic: blocked before its first request
			},
		},
		{
			name: "MinRate",
			services: svc(inf,
				Caller{Name: "below", Offered: 0.9, Limit: 0.1},
				Caller{Name: "at", Offered: 1, Limit: 0.5}),
			want: []wantVerdict{
				{"api", "below", 0, 0.1, None},
				{"api", "at", 0.5, 0.5, OverLimit},
			},
		},
		{
			name: "MinRate 0 drops small rates",
			cfg:  func(c *Config) { c.MinRate = 0 },
			services: svc(inf,
				Caller{Name: "below", Offered: 0.8, Limit: 0.2}),
			want: []wantVerdict{{"api", "below", 0.75, 0.2, OverLimit}},
		},
		{
			// Capacity 300 split over demands 50, 80 and 2000: level 170.
			name: "noisy neighbour",
			services: svc(300,
				Caller{Name: "big", Offered: 2000, Limit: inf},
				Caller{Name: "small", Offered: 50, Limit: inf},
				Caller{Name: "medium", Offered: 80, Limit: 100}),
			want: []wantVerdict{
				{"api", "big", 1 - 170.0/2000, 170, OverCapacity},
				{"api", "small", 0, 170, None},
				{"api", "medium", 0, 100, None},
			},
		},
		{
			name: "all callers over capacity",
			services: svc(300,
				Caller{Name: "a", Offered: 400, Limit: inf},
				Caller{Name: "b", Offered: 400, Limit: inf},
				Caller{Name: "c", Offered: 400, Limit: 1000}),
			want: []wantVerdict{
				{"api", "a", 0.75, 100, OverCapacity},
				{"api", "b", 0.75, 100, OverCapacity},
				{"api", "c", 0.75, 100, OverCapacity},
			},
		},
		{
			// Demands 50, 400, 400 over capacity 300: level 125; a's own
			// limit binds first.
			name: "own limit below the fair share",
			services: svc(300,
				Caller{Name: "a", Offered: 400, Limit: 50},
				Caller{Name: "b", Offered: 400, Limit: inf},
				Caller{Name: "c", Offered: 400, Limit: inf}),
			want: []wantVerdict{
				{"api", "a", 0.875, 50, OverLimit},
				{"api", "b", 0.6875, 125, OverCapacity},
				{"api", "c", 0.6875, 125, OverCapacity},
			},
		},
		{
			// Demands 100 and 400 over capacity 200: level 100, equal to a's
			// limit. a would be held to 100 without the capacity, so its own
			// limit is the reason.
			name: "fair share equal to the own limit",
			services: svc(200,
				Caller{Name: "a", Offered: 400, Limit: 100},
				Caller{Name: "b", Offered: 400, Limit: inf}),
			want: []wantVerdict{
				{"api", "a", 0.75, 100, OverLimit},
				{"api", "b", 0.75, 100, OverCapacity},
			},
		},
		{
			// Demands 0.9 and 2 over capacity 1: level 0.5. The small caller
			// is spared drops but not capacity, or b would get 0.5.
			name: "MinRate callers count toward capacity",
			services: svc(1,
				Caller{Name: "a", Offered: 0.9, Limit: inf},
				Caller{Name: "b", Offered: 2, Limit: inf}),
			want: []wantVerdict{
				{"api", "a", 0, 0.5, None},
				{"api", "b", 0.75, 0.5, OverCapacity},
			},
		},
		{
			name:     "capacity that fits is no bound",
			services: svc(1000, Caller{Name: "a", Offered: 400, Limit: inf}),
			want:     []wantVerdict{{"api", "a", 0, inf, None}},
		},
		{
			name:     "capacity 0",
			services: svc(0, Caller{Name: "a", Offered: 10, Limit: inf}, Caller{Name: "idle", Offered: 0, Limit: inf}),
			want: []wantVerdict{
				{"api", "a", 0.99, 0, OverCapacity},
				{"api", "idle", 0, 0, None},
			},
		},
		{
			name:     "capacity 0 and no load",
			services: svc(0, Caller{Name: "idle", Offered: 0, Limit: inf}),
			want:     []wantVerdict{{"api", "idle", 0, inf, None}},
		},
		{
			// Shadow takes part in the split with its would-be demand, so the
			// enforced caller gets the same ratio it would get if both were
			// enforced.
			name: "shadow",
			services: svc(200,
				Caller{Name: "s", Offered: 300, Limit: inf, Mode: Shadow},
				Caller{Name: "e", Offered: 300, Limit: inf, Mode: Enforce},
				Caller{Name: "s5x", Offered: 50, Limit: 10, Mode: Shadow}),
			want: []wantVerdict{
				{"api", "s", 1 - 95.0/300, 95, OverCapacity},
				{"api", "e", 1 - 95.0/300, 95, OverCapacity},
				{"api", "s5x", 0.8, 10, OverLimit},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			l := mustNew(t, cfg)
			out := l.Step(0, tt.services)
			for _, w := range tt.want {
				v := mustFind(t, out, w.service, w.caller)
				if !near(v.Ratio, w.ratio) || v.Target != v.Ratio || !near(v.Allowed, w.allowed) || v.Reason != w.reason {
					t.Errorf("%s <- %s: got ratio %v target %v allowed %v reason %v; want ratio %v allowed %v reason %v",
						w.service, w.caller, v.Ratio, v.Target, v.Allowed, v.Reason, w.ratio, w.allowed, w.reason)
				}
				if got := l.Ratio(w.service, w.caller); got != v.Ratio {
					t.Errorf("Ratio(%s, %s) = %v, want %v", w.service, w.caller, got, v.Ratio)
				}
			}
			// Every input caller, and only those, in caller order.
			var n int
			for _, sv := range out {
				n += len(sv.Verdicts)
				if !slices.IsSortedFunc(sv.Verdicts, func(a, b Verdict) int { return compareStrings(a.Caller, b.Caller) }) {
					t.Errorf("%s: verdicts not sorted by caller", sv.Service)
				}
			}
			if n != len(tt.want) {
				t.Errorf("got %d verdicts, want %d", n, len(tt.want))
			}
		})
	}
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestShadowCarriesMode(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	out := l.Step(0, []Service{{Name: "api", Capacity: inf, Callers: []Caller{
		{Name: "e", Offered: 500, Limit: 100, Mode: Enforce},
		{Name: "s", Offered: 500, Limit: 100, Mode: Shadow},
	}}})
	e, s := mustFind(t, out, "api", "e"), mustFind(t, out, "api", "s")
	if e.Mode != Enforce || s.Mode != Shadow {
		t.Errorf("modes: e %v, s %v; want enforce, shadow", e.Mode, s.Mode)
	}
	if s.Ratio != e.Ratio || s.Target != e.Target || s.Reason != e.Reason {
		t.Errorf("shadow verdict %+v differs from enforced %+v beyond Mode", s, e)
	}
}

// stepOne steps a single bucket api <- web and returns its verdict.
func stepOne(t *testing.T, l *Law, dt time.Duration, offered, limit float64) Verdict {
	t.Helper()
	out := l.Step(dt, []Service{{Name: "api", Capacity: inf, Callers: []Caller{{Name: "web", Offered: offered, Limit: limit}}}})
	return mustFind(t, out, "api", "web")
}

func TestFastAttackSlowRelease(t *testing.T) {
	type tick struct {
		dt      time.Duration
		offered float64 // limit is 100
		target  float64
		ratio   float64
	}
	tests := []struct {
		name  string
		ticks []tick
	}{
		{"from 0.99 to 0 in 7 steps", []tick{ // 95 is under the limit, but inside OpenBelow's band
			{0, 10000, 0.99, 0.99},
			{time.Second, 95, 0, 0.98},
			{time.Second, 95, 0, 0.96},
			{time.Second, 95, 0, 0.92},
			{time.Second, 95, 0, 0.84},
			{time.Second, 95, 0, 0.68},
			{time.Second, 95, 0, 0.36},
			{time.Second, 95, 0, 0},
		}},
		{"from 0.8 to 0 in 3 steps", []tick{
			{0, 500, 0.8, 0.8},
			{time.Second, 100, 0, 0.6},
			{time.Second, 100, 0, 0.2},
			{time.Second, 100, 0, 0},
		}},
		{"release stops at the target", []tick{
			{0, 10000, 0.99, 0.99},
			{time.Second, 1000, 0.9, 0.98},
			{time.Second, 1000, 0.9, 0.96},
			{time.Second, 1000, 0.9, 0.92},
			{time.Second, 1000, 0.9, 0.9},
		}},
		{"fast attack", []tick{
			{0, 125, 0.2, 0.2},
			{time.Second, 500, 0.8, 0.8},
			{time.Second, 10000, 0.99, 0.99},
		}},
		{"attack during release", []tick{
			{0, 500, 0.8, 0.8},
			{time.Second, 100, 0, 0.6},
			{time.Second, 400, 0.75, 0.75},
		}},
		{"release scales with dt", []tick{
			{0, 500, 0.8, 0.8},
			{500 * time.Millisecond, 100, 0, 1 - 0.2*math.Sqrt2},
			{time.Second, 100, 0, 1 - 0.2*math.Sqrt2*2},
			{2 * time.Second, 100, 0, 0},
		}},
		{"dt <= 0 holds the ratio", []tick{
			{0, 500, 0.8, 0.8},
			{0, 100, 0, 0.8},
			{-time.Second, 100, 0, 0.8},
			{0, 10000, 0.99, 0.99},
			{time.Second, 100, 0, 0.98},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustNew(t, DefaultConfig())
			for i, k := range tt.ticks {
				v := stepOne(t, l, k.dt, k.offered, 100)
				if !near(v.Target, k.target) || !near(v.Ratio, k.ratio) {
					t.Fatalf("tick %d: target %v ratio %v, want target %v ratio %v", i, v.Target, v.Ratio, k.target, k.ratio)
				}
			}
			if last := tt.ticks[len(tt.ticks)-1]; (last.ratio == 0) != (l.Len() == 0) {
				t.Errorf("Len() = %d after last ratio %v", l.Len(), last.ratio)
			}
		})
	}
}

func TestCarryOver(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	first := []Service{
		{Name: "api", Capacity: inf, Callers: []Caller{
			{Name: "gone", Offered: 500, Limit: 100, Mode: Shadow},
			{Name: "stays", Offered: 10, Limit: 100},
		}},
		{Name: "db", Capacity: inf, Callers: []Caller{
			{Name: "api", Offered: 1000, Limit: 100},
			{Name: "quiet", Offered: 1, Limit: 100},
		}},
		{Name: "zz", Capacity: inf},
	}
	l.Step(0, first)
	if l.Len() != 2 {
		t.Fatalf("Len() = %d after the first step, want 2 (only buckets above zero are held)", l.Len())
	}

	// Caller api <- gone and the whole service db vanish.
	rest := []Service{
		{Name: "zz", Capacity: inf},
		{Name: "api", Capacity: inf, Callers: []Caller{{Name: "stays", Offered: 10, Limit: 100}}},
	}
	wantGone := []float64{0.6, 0.2, 0}
	wantDB := []float64{0.8, 0.6, 0.2, 0}
	for i := range 5 {
		out := l.Step(time.Second, rest)
		if !slices.IsSortedFunc(out, func(a, b ServiceVerdict) int { return compareStrings(a.Service, b.Service) }) {
			t.Fatalf("step %d: services not sorted: %+v", i, out)
		}
		v, ok := find(out, "api", "gone")
		if i < len(wantGone) {
			if !ok {
				t.Fatalf("step %d: api <- gone missing, want ratio %v", i, wantGone[i])
			}
			want := Verdict{Caller: "gone", Ratio: v.Ratio, Allowed: 100, Limit: 100, Mode: Shadow, Reason: None, Bound: BoundLeaf}
			if !near(v.Ratio, wantGone[i]) || v != want {
				t.Errorf("step %d: api <- gone = %+v, want ratio %v and %+v", i, v, wantGone[i], want)
			}
		} else if ok {
			t.Errorf("step %d: api <- gone still in the output: %+v", i, v)
		}

		v, ok = find(out, "db", "api")
		if i < len(wantDB) {
			if !ok {
				t.Fatalf("step %d: db <- api missing, want ratio %v", i, wantDB[i])
			}
			if !near(v.Ratio, wantDB[i]) || v.Offered != 0 || v.Limit != 100 || v.Target != 0 {
				t.Errorf("step %d: db <- api = %+v, want ratio %v, offered 0, limit 100", i, v, wantDB[i])
			}
		} else if ok {
			t.Errorf("step %d: db <- api still in the output: %+v", i, v)
		}
		if _, ok := find(out, "db", "quiet"); ok {
			t.Errorf("step %d: db <- quiet was at 0 and should not be carried over", i)
		}
		if _, ok := find(out, "api", "stays"); !ok {
			t.Errorf("step %d: api <- stays missing", i)
		}
		if len(out) == 0 || out[len(out)-1].Service != "zz" {
			t.Errorf("step %d: want zz last in %+v", i, out)
		}
	}
	if l.Len() != 0 || len(l.services) != 0 {
		t.Errorf("after release: Len() = %d, %d services held; want all forgotten", l.Len(), len(l.services))
	}
	if r := l.Ratio("db", "api"); r != 0 {
		t.Errorf("Ratio(db, api) = %v after it was forgotten", r)
	}
}

// A caller that comes back while it is still being carried over resumes from
// its carried ratio, not from scratch.
func TestCarryOverReturn(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	stepOne(t, l, 0, 500, 100)
	l.Step(time.Second, nil)
	if r := l.Ratio("api", "web"); !near(r, 0.6) {
		t.Fatalf("carried ratio %v, want 0.6", r)
	}
	if v := stepOne(t, l, time.Second, 95, 100); !near(v.Ratio, 0.2) {
		t.Errorf("ratio on return %v, want 0.2", v.Ratio)
	}
}

// A blocked caller is held at PMax while it is listed, traffic or not, and
// released and forgotten like any other once it is not.
func TestBlockedCallerVanishes(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	for range 3 {
		if v := stepOne(t, l, time.Second, 0, 0); v.Ratio != 0.99 || v.Reason != OverLimit {
			t.Fatalf("listed blocked caller = %+v, want ratio 0.99, over_limit", v)
		}
	}
	want := []float64{0.98, 0.96, 0.92, 0.84, 0.68, 0.36, 0}
	for i, w := range want {
		v := mustFind(t, l.Step(time.Second, nil), "api", "web")
		if !near(v.Ratio, w) || v.Limit != 0 || v.Reason != None {
			t.Fatalf("step %d after it vanished: %+v, want ratio %v, limit 0, reason none", i, v, w)
		}
	}
	if out := l.Step(time.Second, nil); len(out) != 0 || l.Len() != 0 {
		t.Errorf("still held after release: %+v, Len %d", out, l.Len())
	}
}

func TestDuplicates(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	out := l.Step(0, []Service{
		{Name: "api", Capacity: 1000, Callers: []Caller{
			{Name: "web", Offered: 300, Limit: 100, Mode: Shadow},
			{Name: "web", Offered: 200, Limit: 50, Mode: Enforce},
			{Name: "cron", Offered: 100, Limit: inf, Mode: Shadow},
		}},
		{Name: "api", Capacity: 400, Callers: []Caller{
			{Name: "cron", Offered: 400, Limit: inf, Mode: Shadow},
		}},
	})
	if len(out) != 1 || len(out[0].Verdicts) != 2 {
		t.Fatalf("want one service with two callers, got %+v", out)
	}
	// web: 300+200 offered, limit min(100, 50), Enforce wins. Demand 50.
	web := mustFind(t, out, "api", "web")
	if web.Offered != 500 || web.Limit != 50 || web.Mode != Enforce || !near(web.Ratio, 0.9) || web.Reason != OverLimit {
		t.Errorf("web = %+v, want offered 500, limit 50, enforce, ratio 0.9, over_limit", web)
	}
	// cron: 500 offered; capacity min(1000, 400) = 400, demands 50 and 500:
	// level 350.
	cron := mustFind(t, out, "api", "cron")
	if cron.Offered != 500 || cron.Mode != Shadow || !near(cron.Allowed, 350) || !near(cron.Ratio, 0.3) || cron.Reason != OverCapacity {
		t.Errorf("cron = %+v, want offered 500, shadow, allowed 350, ratio 0.3, over_capacity", cron)
	}
}

func TestInvalidInputs(t *testing.T) {
	nan := math.NaN()
	l := mustNew(t, DefaultConfig())
	out := l.Step(0, []Service{
		{Name: "api", Capacity: inf, Callers: []Caller{
			{Name: "offered-nan", Offered: nan, Limit: 1},
			{Name: "offered-inf", Offered: inf, Limit: 1},
			{Name: "offered-neg", Offered: -5, Limit: 1},
			{Name: "offered-neg-inf", Offered: math.Inf(-1), Limit: 1},
			{Name: "limit-nan", Offered: 10, Limit: nan},
			{Name: "limit-neg", Offered: 10, Limit: -1},
			{Name: "limit-neg-inf", Offered: 10, Limit: math.Inf(-1)},
			{Name: "huge", Offered: math.MaxFloat64, Limit: math.SmallestNonzeroFloat64},
			{Name: "huge", Offered: math.MaxFloat64, Limit: math.SmallestNonzeroFloat64},
		}},
		{Name: "capacity-nan", Capacity: nan, Callers: []Caller{{Name: "web", Offered: 10, Limit: inf}}},
		{Name: "capacity-neg", Capacity: -1, Callers: []Caller{{Name: "web", Offered: 10, Limit: inf}}},
		{Name: "tiny", Capacity: math.SmallestNonzeroFloat64, Callers: []Caller{
			{Name: "a", Offered: math.MaxFloat64, Limit: inf},
			{Name: "b", Offered: math.SmallestNonzeroFloat64, Limit: inf},
		}},
	})
	want := map[[2]string]struct {
		offered, limit, ratio float64
		reason                Reason
	}{
		{"api", "offered-nan"}:     {0, 1, 0, None},
		{"api", "offered-inf"}:     {0, 1, 0, None},
		{"api", "offered-neg"}:     {0, 1, 0, None},
		{"api", "offered-neg-inf"}: {0, 1, 0, None},
		{"api", "limit-nan"}:       {10, 0, 0.99, OverLimit},
		{"api", "limit-neg"}:       {10, 0, 0.99, OverLimit},
		{"api", "limit-neg-inf"}:   {10, 0, 0.99, OverLimit},
		{"api", "huge"}:            {math.MaxFloat64, math.SmallestNonzeroFloat64, 0.99, OverLimit},
		{"capacity-nan", "web"}:    {10, inf, 0.99, OverCapacity},
		{"capacity-neg", "web"}:    {10, inf, 0.99, OverCapacity},
		{"tiny", "a"}:              {math.MaxFloat64, inf, 0.99, OverCapacity},
		{"tiny", "b"}:              {math.SmallestNonzeroFloat64, inf, 0, None},
	}
	n := 0
	for _, sv := range out {
		for _, v := range sv.Verdicts {
			n++
			checkVerdict(t, DefaultConfig(), v)
			w, ok := want[[2]string{sv.Service, v.Caller}]
			if !ok {
				t.Errorf("unexpected verdict %s <- %+v", sv.Service, v)
				continue
			}
			if v.Offered != w.offered || v.Limit != w.limit || !near(v.Ratio, w.ratio) || v.Reason != w.reason {
				t.Errorf("%s <- %s = %+v, want offered %v limit %v ratio %v reason %v",
					sv.Service, v.Caller, v, w.offered, w.limit, w.ratio, w.reason)
			}
		}
	}
	if n != len(want) {
		t.Errorf("got %d verdicts, want %d", n, len(want))
	}
}

// checkVerdict checks what must hold for every verdict, whatever the input.
func checkVerdict(t testing.TB, cfg Config, v Verdict) {
	t.Helper()
	if !(v.Ratio >= 0 && v.Ratio <= cfg.PMax) || !(v.Target >= 0 && v.Target <= cfg.PMax) {
		t.Errorf("%s: ratio %v, target %v outside [0, %v]", v.Caller, v.Ratio, v.Target, cfg.PMax)
	}
	if !(v.Allowed >= 0) || !(v.Offered >= 0) || !(v.Limit >= 0) || math.IsInf(v.Offered, 0) {
		t.Errorf("%s: allowed %v, offered %v, limit %v: want non-negative, offered finite", v.Caller, v.Allowed, v.Offered, v.Limit)
	}
	if (v.Target == 0) != (v.Reason == None) {
		t.Errorf("%s: target %v with reason %v", v.Caller, v.Target, v.Reason)
	}
	if math.Signbit(v.Ratio) || math.Signbit(v.Target) {
		t.Errorf("%s: negative zero in ratio %v or target %v", v.Caller, v.Ratio, v.Target)
	}
}

// randomServices returns a mesh with over-limit callers, capacities that
// bind, shadow callers, duplicate names, and values that round badly.
func randomServices(r *rand.Rand, nServices, nCallers int) []Service {
	services := make([]Service, nServices)
	for i := range services {
		s := &services[i]
		s.Name = fmt.Sprintf("svc-%d", r.IntN(nServices))
		s.Capacity = inf
		if r.IntN(3) == 0 {
			s.Capacity = float64(r.IntN(nCallers*100)) + r.Float64()
		}
		for range r.IntN(nCallers + 1) {
			c := Caller{
				Name:    fmt.Sprintf("caller-%d", r.IntN(nCallers)),
				Offered: r.ExpFloat64() * 100,
				Limit:   inf,
			}
			switch r.IntN(4) {
			case 0:
				c.Limit = float64(r.IntN(200)) / 3
			case 1:
				c.Limit = r.Float64() * 100
			}
			if r.IntN(5) == 0 {
				c.Mode = Shadow
			}
			s.Callers = append(s.Callers, c)
		}
	}
	return services
}

// shuffled returns a deep copy of services with services and callers in
// another order.
func shuffled(r *rand.Rand, services []Service) []Service {
	out := slices.Clone(services)
	for i := range out {
		out[i].Callers = slices.Clone(out[i].Callers)
		r.Shuffle(len(out[i].Callers), func(a, b int) {
			out[i].Callers[a], out[i].Callers[b] = out[i].Callers[b], out[i].Callers[a]
		})
	}
	r.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

func sameBits(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }

func TestDeterminism(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		l1, l2 := mustNew(t, DefaultConfig()), mustNew(t, DefaultConfig())
		dts := []time.Duration{0, time.Second, 700 * time.Millisecond, 0, 3 * time.Second, time.Second}
		for step, dt := range dts {
			in := randomServices(r, 8, 12)
			if step == 3 {
				in = in[:len(in)/2] // some buckets vanish
			}
			out1, out2 := l1.Step(dt, in), l2.Step(dt, shuffled(r, in))
			if len(out1) != len(out2) {
				t.Fatalf("seed %d step %d: %d services vs %d", seed, step, len(out1), len(out2))
			}
			for i := range out1 {
				a, b := out1[i], out2[i]
				if a.Service != b.Service || len(a.Verdicts) != len(b.Verdicts) {
					t.Fatalf("seed %d step %d: service %d differs: %+v vs %+v", seed, step, i, a, b)
				}
				for j := range a.Verdicts {
					x, y := a.Verdicts[j], b.Verdicts[j]
					if x.Caller != y.Caller || x.Mode != y.Mode || x.Reason != y.Reason ||
						!sameBits(x.Ratio, y.Ratio) || !sameBits(x.Target, y.Target) || !sameBits(x.Allowed, y.Allowed) ||
						!sameBits(x.Offered, y.Offered) || !sameBits(x.Limit, y.Limit) {
						t.Fatalf("seed %d step %d: %s verdict differs:\n%+v\n%+v", seed, step, a.Service, x, y)
					}
					checkVerdict(t, DefaultConfig(), x)
				}
			}
			if l1.Len() != l2.Len() {
				t.Fatalf("seed %d step %d: Len %d vs %d", seed, step, l1.Len(), l2.Len())
			}
		}
	}
}

// The steady state allocates only the two slices Step returns.
func TestStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := mustNew(t, DefaultConfig())
	in := randomServices(rand.New(rand.NewPCG(1, 2)), 50, 40)
	l.Step(0, in)
	l.Step(time.Second, in)
	if got := testing.AllocsPerRun(20, func() { l.Step(time.Second, in) }); got != 2 {
		t.Errorf("Step allocates %v times in a steady state, want 2", got)
	}
}

// benchMesh is the production shape: 1,100 services of 100 callers, a tenth of
// callers over their limit, a tenth of services over capacity.
func benchMesh() []Service {
	r := rand.New(rand.NewPCG(7, 7))
	services := make([]Service, 1100)
	for i := range services {
		s := &services[i]
		s.Name = fmt.Sprintf("service-%04d", i)
		s.Capacity = inf
		if i%10 == 0 {
			s.Capacity = 5000
		}
		s.Callers = make([]Caller, 100)
		for j := range s.Callers {
			c := &s.Callers[j]
			c.Name = fmt.Sprintf("caller-%03d", j)
			c.Offered = 10 + r.Float64()*90
			c.Limit = 200
			if j%10 == 0 {
				c.Limit = c.Offered / (1 + 4*r.Float64())
			}
		}
		r.Shuffle(len(s.Callers), func(a, b int) { s.Callers[a], s.Callers[b] = s.Callers[b], s.Callers[a] })
	}
	return services
}

func BenchmarkStep(b *testing.B) {
	in := benchMesh()
	l := mustNew(b, DefaultConfig())
	l.Step(0, in)
	b.ReportAllocs()
	for b.Loop() {
		l.Step(time.Second, in)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(1100*100), "ns/bucket")
}

func TestSeedHoldsThenReleases(t *testing.T) {
	l := mustNew(t, DefaultConfig())
	l.Seed("checkout", "web", 0.8)
	l.Seed("checkout", "web", 0.1) // a bucket with state keeps it
	l.Seed("checkout", "batch", 0) // nothing to seed
	l.Seed("checkout", "nan", math.NaN())
	if l.Len() != 1 {
		t.Fatalf("Len = %d after seeding one bucket", l.Len())
	}
	// A partial picture: only a third of web's 500 rps is visible. The
	// first step (dt 0) keeps the seeded ratio instead of dropping to 0.4.
	in := []Service{{Name: "checkout", Capacity: math.Inf(1), Callers: []Caller{{Name: "web", Offered: 500.0 / 3, Limit: 100}}}}
	v := mustFind(t, l.Step(0, in), "checkout", "web")
	if v.Ratio != 0.8 {
		t.Errorf("first step ratio = %v, want the seeded 0.8", v.Ratio)
	}
	// Still partial a second later: the release is bounded from the seed.
	v = mustFind(t, l.Step(time.Second, in), "checkout", "web")
	if math.Abs(v.Ratio-0.6) > 1e-12 {
		t.Errorf("second step ratio = %v, want 1 − 0.2·2 = 0.6", v.Ratio)
	}
	// Seeds above PMax are clamped.
	l.Seed("orders", "web", 1.5)
	if got := l.Ratio("orders", "web"); got != DefaultConfig().PMax {
		t.Errorf("seeded 1.5 → %v, want PMax", got)
	}
}

func TestJumped(t *testing.T) {
	for _, tc := range []struct {
		before, after float64
		want          bool
	}{
		{100, 150, true},
		{100, 149, false},
		{0, 10, true},
		{0, 9, false},  // too little to tell from noise
		{4, 12, false}, // 3× but a rise of 8 rps
		{150, 100, true},
		{149, 100, false},
		{10, 0, true},
		{math.NaN(), 1000, false},
	} {
		if got := Jumped(tc.before, tc.after); got != tc.want {
			t.Errorf("Jumped(%v, %v) = %v, want %v", tc.before, tc.after, got, tc.want)
		}
	}
}
