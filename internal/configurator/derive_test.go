package configurator

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/routes"
)

// now is mid-day, so a 28d look-back overlaps 29 UTC days, today partial.
var now = time.Date(2026, 3, 15, 12, 0, 0, 0, time.UTC)

var web = history.Bucket{Callee: "checkout", Caller: "web"}

// daysAgo returns the UTC midnight n days before now's day.
func daysAgo(n int) time.Time { return startOfDay(now).AddDate(0, 0, -n) }

// full returns n full-coverage days of b ending yesterday, all at peak.
func full(b history.Bucket, n int, peak float64) []history.DailyPeak {
	var out []history.DailyPeak
	for i := n; i >= 1; i-- {
		out = append(out, history.DailyPeak{Bucket: b, Day: daysAgo(i), PeakOffered: peak, MeanOffered: peak / 2, Minutes: 1440})
	}
	return out
}

// with returns ps with the day n days ago set to peak (full coverage).
func with(ps []history.DailyPeak, n int, peak float64) []history.DailyPeak {
	for i := range ps {
		if ps[i].Day.Equal(daysAgo(n)) {
			ps[i].PeakOffered = peak
			return ps
		}
	}
	panic(fmt.Sprintf("no day %d ago", n))
}

func ptr(v float64) *float64 { return &v }

func own(b history.Bucket, limit float64, src history.Source) history.Limits {
	return history.Limits{Buckets: []history.BucketLimit{{Bucket: b, Limit: limit, Mode: new(dropratio.Enforce), Source: src}}}
}

func TestDerive(t *testing.T) {
	def := DefaultDeriveConfig()
	for _, tc := range []struct {
		name   string
		peaks  []history.DailyPeak
		limits history.Limits
		cfg    func(*DeriveConfig)
		want   Derivation
	}{{
		// 1234 × 1.25 = 1542.5, up to two figures: 1600. The 7-day peak is
		// the 1000 of the last week; the 1234 was 20 days ago.
		name:  "headroom and rounding",
		peaks: with(full(web, 28, 1000), 20, 1234),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 1600, PeakLookback: 1234, PeakRecent: 1000, Flags: []string{FlagNewLimit},
		}}},
	}, {
		// 87.2 × 1.25 = 109 → 110.
		name:  "small rates round up too",
		peaks: full(web, 10, 87.2),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 110, PeakLookback: 87.2, PeakRecent: 87.2, Flags: []string{FlagNewLimit},
		}}},
	}, {
		name:  "headroom 0 still rounds up, never down",
		peaks: full(web, 10, 1234),
		cfg:   func(c *DeriveConfig) { c.Headroom = 0 },
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 1300, PeakLookback: 1234, PeakRecent: 1234, Flags: []string{FlagNewLimit},
		}}},
	}, {
		// Look back 3 days (overlapping 4: days 3, 2, 1 ago and today), while
		// the recent window is 7: the surge of 5 days ago is outside the
		// look-back but inside the recent window, and the guard holds the
		// limit at its peak instead of 100 × 1.25 = 125.
		name:  "recent-peak guard",
		peaks: with(full(web, 10, 100), 5, 480),
		cfg:   func(c *DeriveConfig) { c.Lookback = 3 * Day; c.MinDays = 3 },
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 480, PeakLookback: 100, PeakRecent: 480, Flags: []string{FlagHeldAtRecent, FlagNewLimit},
		}}},
	}, {
		// 300 × 1.25 = 375 → 380, below 1000 × (1 − 0.5) = 500.
		name:   "step down within a wider bound",
		peaks:  full(web, 10, 300),
		limits: own(web, 1000, history.Derived),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Current: ptr(1000), Proposed: 380, PeakLookback: 300, PeakRecent: 300, Flags: nil,
		}}},
		cfg: func(c *DeriveConfig) { c.MaxStepDown = 0.7 }, // 380 ≥ 300: within the bound
	}, {
		name:   "step down beyond the default bound",
		peaks:  full(web, 10, 300),
		limits: own(web, 1000, history.Derived),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Current: ptr(1000), Proposed: 380, PeakLookback: 300, PeakRecent: 300, Flags: []string{FlagStepDown},
		}}},
	}, {
		// 400 × 1.25 = 500 = 1000 × (1 − 0.5): exactly the bound is allowed.
		name:   "step down to exactly the bound",
		peaks:  full(web, 10, 400),
		limits: own(web, 1000, history.Derived),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Current: ptr(1000), Proposed: 500, PeakLookback: 400, PeakRecent: 400,
		}}},
	}, {
		name:   "unchanged derived limit is not proposed again",
		peaks:  full(web, 10, 1000), // 1250 → 1300
		limits: own(web, 1300, history.Derived),
		want:   Derivation{Unchanged: []history.Bucket{web}},
	}, {
		name:   "a manual limit is flagged, even when equal",
		peaks:  full(web, 10, 1000),
		limits: own(web, 1300, history.Manual),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Current: ptr(1300), Proposed: 1300, PeakLookback: 1000, PeakRecent: 1000, Flags: []string{FlagReplacesManual},
		}}},
	}, {
		// The callee's default of 100 is the limit in force, and traffic
		// has been above it.
		name:  "callee default is the current limit",
		peaks: full(web, 10, 1000),
		limits: history.Limits{Services: []history.ServiceLimits{
			{Callee: "checkout", DefaultLimit: ptr(100), Mode: new(dropratio.Enforce), FailMode: new(dataplane.FailOpen)},
		}},
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Current: ptr(100), Proposed: 1300, PeakLookback: 1000, PeakRecent: 1000, Flags: []string{FlagNewLimit, FlagCurrentHit},
		}}},
	}, {
		name:  "too little history",
		peaks: full(web, 3, 1000),
		want:  Derivation{Refusals: []Refusal{{Bucket: web, Days: 3, Reason: "3 days of history, need 7"}}},
	}, {
		// 1151 minutes is below 0.8 × 1440 = 1152: a day that does not count.
		name: "partial days do not count",
		peaks: []history.DailyPeak{
			{Bucket: web, Day: daysAgo(3), PeakOffered: 10, Minutes: 1440},
			{Bucket: web, Day: daysAgo(2), PeakOffered: 10, Minutes: 1151},
			{Bucket: web, Day: daysAgo(1), PeakOffered: 10, Minutes: 1152},
			{Bucket: web, Day: daysAgo(0), PeakOffered: 10, Minutes: 700},
		},
		want: Derivation{Refusals: []Refusal{{Bucket: web, Days: 2, Reason: "2 days of history, need 7 (2 more below 80% coverage)"}}},
	}, {
		name:  "one day",
		peaks: full(web, 1, 1000),
		want:  Derivation{Refusals: []Refusal{{Bucket: web, Days: 1, Reason: "1 day of history, need 7"}}},
	}, {
		// Days before the window neither raise the peak nor count.
		name: "rows outside the window are ignored",
		peaks: append([]history.DailyPeak{
			{Bucket: web, Day: daysAgo(40), PeakOffered: 1e6, Minutes: 1440},
			{Bucket: web, Day: daysAgo(29), PeakOffered: 1e6, Minutes: 1440},
			{Bucket: web, Day: daysAgo(28), PeakOffered: 2000, Minutes: 1440},
		}, full(web, 6, 100)...),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 2500, PeakLookback: 2000, PeakRecent: 100, Flags: []string{FlagNewLimit},
		}}},
	}, {
		name:  "an idle bucket gets the minimum, not a block",
		peaks: full(web, 10, 0),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 1, Flags: []string{FlagNewLimit},
		}}},
	}, {
		name:  "broken rows do not raise a limit",
		peaks: with(with(full(web, 10, 100), 3, math.NaN()), 4, math.Inf(1)),
		want: Derivation{Proposals: []history.Proposal{{
			Bucket: web, Proposed: 130, PeakLookback: 100, PeakRecent: 100, Flags: []string{FlagNewLimit},
		}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := def
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			got := Derive(tc.peaks, tc.limits, cfg, now)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Derive:\n got %s\nwant %s", dump(got), dump(tc.want))
			}
		})
	}
}

// TestDeriveManyBuckets checks grouping and order over several buckets in
// shuffled input.
func TestDeriveManyBuckets(t *testing.T) {
	a := history.Bucket{Callee: "a", Caller: "x"}
	b := history.Bucket{Callee: "b", Caller: "x"}
	c := history.Bucket{Callee: "b", Caller: "y"}
	var peaks []history.DailyPeak
	peaks = append(peaks, full(c, 8, 10)...)
	peaks = append(peaks, full(a, 8, 100)...)
	peaks = append(peaks, full(b, 2, 1000)...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(peaks), func(i, j int) { peaks[i], peaks[j] = peaks[j], peaks[i] })
	got := Derive(peaks, history.Limits{}, DefaultDeriveConfig(), now)
	want := Derivation{
		Proposals: []history.Proposal{
			{Bucket: a, Proposed: 130, PeakLookback: 100, PeakRecent: 100, Flags: []string{FlagNewLimit}},
			{Bucket: c, Proposed: 13, PeakLookback: 10, PeakRecent: 10, Flags: []string{FlagNewLimit}},
		},
		Refusals: []Refusal{{Bucket: b, Days: 2, Reason: "2 days of history, need 7"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Derive:\n got %s\nwant %s", dump(got), dump(want))
	}
}

func TestDeriveConfigValidate(t *testing.T) {
	if err := DefaultDeriveConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	c := DeriveConfig{Lookback: time.Hour, Headroom: -1, Recent: 0, MaxStepDown: 2, MinDays: 0, MinCoverage: math.NaN(), MinLimit: -1}
	err := c.Validate()
	for _, flag := range []string{"--lookback", "--headroom", "--recent", "--max-step-down", "--min-days", "--min-coverage", "--min-limit"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("Validate() = %v; want it to name %s", err, flag)
		}
	}
}

func dump(d Derivation) string {
	s := ""
	for _, p := range d.Proposals {
		cur := "nil"
		if p.Current != nil {
			cur = fmt.Sprint(*p.Current)
		}
		s += fmt.Sprintf("\n  proposal %s/%s current=%s proposed=%v peaks=%v/%v flags=%q", p.Callee, p.Caller, cur, p.Proposed, p.PeakLookback, p.PeakRecent, p.Flags)
	}
	for _, r := range d.Refusals {
		s += fmt.Sprintf("\n  refusal %s/%s days=%d %q", r.Callee, r.Caller, r.Days, r.Reason)
	}
	for _, b := range d.Unchanged {
		s += fmt.Sprintf("\n  unchanged %s/%s", b.Callee, b.Caller)
	}
	return s
}

// TestDeriveRefusesUndeclaredProcedures: history outlives routes. A leaf of
// a procedure the callee's routes no longer name is refused, with the
// reason, so that approving what derive proposed can never write a limit
// the controller could not load; a gRPC method, declared by its limit, and
// _other beside a route, are proposed.
func TestDeriveRefusesUndeclaredProcedures(t *testing.T) {
	renamed := history.Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}
	capacity := history.Bucket{Callee: "checkout", Caller: history.AnyCaller, Procedure: "create-charge"}
	routed := history.Bucket{Callee: "checkout", Caller: "web", Procedure: "charges"}
	other := history.Bucket{Callee: "checkout", Caller: "web", Procedure: "_other"}
	grpc := history.Bucket{Callee: "checkout", Caller: "web", Procedure: "/shop.Checkout/Pay"}
	lonely := history.Bucket{Callee: "orders", Caller: "web", Procedure: "_other"}
	var peaks []history.DailyPeak
	for _, b := range []history.Bucket{renamed, capacity, routed, other, grpc, lonely} {
		peaks = append(peaks, full(b, 28, 100)...)
	}
	current := history.Limits{Routes: []history.ServiceRoutes{{
		Callee: "checkout", Routes: []routes.Route{{Pattern: "POST /v1/charges", Procedure: "charges"}},
	}}}
	d := Derive(peaks, current, DefaultDeriveConfig(), now)
	proposed := map[history.Bucket]bool{}
	for _, p := range d.Proposals {
		proposed[p.Bucket] = true
	}
	for _, b := range []history.Bucket{routed, other, grpc} {
		if !proposed[b] {
			t.Errorf("%s not proposed; proposals %+v, refusals %+v", b.Path(), d.Proposals, d.Refusals)
		}
	}
	refused := map[history.Bucket]string{}
	for _, r := range d.Refusals {
		refused[r.Bucket] = r.Reason
	}
	for b, want := range map[history.Bucket]string{
		renamed:  "no route of checkout names create-charge now",
		capacity: "no route of checkout names create-charge now",
		lonely:   "orders declares no procedure now",
	} {
		if refused[b] != want || proposed[b] {
			t.Errorf("%s: refused %q (proposed %v), want refused %q", b.Path(), refused[b], proposed[b], want)
		}
	}
}
