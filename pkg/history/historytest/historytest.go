// Package historytest is the conformance suite of history.Store: every
// implementation runs it, so Memory and Postgres keep the same rules.
package historytest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// signalTimeout bounds every wait for a Changes signal. It is a deadline
// for a broken store, not a measure of a working one.
const signalTimeout = 30 * time.Second

// Run runs the suite. open must return a new, empty store on every call and
// close it when t ends; subtests run in parallel, each with its own store.
func Run(t *testing.T, open func(t *testing.T) history.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s history.Store)
	}{
		{"WriteMinutesIdempotent", testWriteMinutesIdempotent},
		{"WriteMinutesFirstInBatchWins", testWriteMinutesFirstInBatchWins},
		{"WriteMinutesConcurrent", testWriteMinutesConcurrent},
		{"WriteMinutesAllOrNothing", testWriteMinutesAllOrNothing},
		{"RollupExact", testRollupExact},
		{"MinutesRange", testMinutesRange},
		{"DailyPeaksFilterAndOrder", testDailyPeaksFilterAndOrder},
		{"DailyPeaksDayRange", testDailyPeaksDayRange},
		{"Retain", testRetain},
		{"SetLimit", testSetLimit},
		{"SetLimitModeDefaults", testSetLimitModeDefaults},
		{"Enforcement", testEnforcement},
		{"DeleteLimit", testDeleteLimit},
		{"SetService", testSetService},
		{"SetMode", testSetMode},
		{"Propose", testPropose},
		{"ProposeSupersedes", testProposeSupersedes},
		{"ProposeConcurrent", testProposeConcurrent},
		{"Approve", testApprove},
		{"Reject", testReject},
		{"NotDecidable", testNotDecidable},
		{"Audit", testAudit},
		{"AuditHistory", testAuditHistory},
		{"ReturnsCopies", testReturnsCopies},
		{"Changes", testChanges},
		{"ChangesCoalesce", testChangesCoalesce},
		{"ChangesEnd", testChangesEnd},
		{"Invalid", testInvalid},
		{"NotFound", testNotFound},
		{"ProcedureMinutes", testProcedureMinutes},
		{"ProcedureLimits", testProcedureLimits},
		{"CallerModeWithoutLimit", testCallerModeWithoutLimit},
		{"Routes", testRoutes},
		{"ServiceTiersCost", testServiceTiersCost},
		{"BucketSettings", testBucketSettings},
		{"CostMinutes", testCostMinutes},
		{"BurstPayback", testBurstPayback},
		{"Objective", testObjective},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// ---- fixtures and helpers ----

var (
	alice = history.Change{Actor: "alice", Reason: "first reason"}
	bob   = history.Change{Actor: "bob", Reason: "second reason"}

	// day0 is a fixed UTC midnight: history is about the past, whatever
	// the clock says.
	day0 = time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)

	ab = history.Bucket{Callee: "a", Caller: "b"}
	ac = history.Bucket{Callee: "a", Caller: "c"}
	bb = history.Bucket{Callee: "b", Caller: "b"}
)

func day(n int) time.Time { return day0.AddDate(0, 0, n) }

// minute is minute m of day d.
func minute(d, m int) time.Time { return day(d).Add(time.Duration(m) * time.Minute) }

func row(b history.Bucket, at time.Time, peak, mean, dropped float64) history.MinuteRow {
	return history.MinuteRow{Bucket: b, Minute: at, PeakOffered: peak, MeanOffered: mean, MeanDropped: dropped}
}

func f64(v float64) *float64 { return &v }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func eq[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// wantErr checks that err wraps target and, for ErrInvalid, names field.
func wantErr(t *testing.T, what string, err, target error, field string) {
	t.Helper()
	switch {
	case !errors.Is(err, target):
		t.Errorf("%s: error %v, want %v", what, err, target)
	case field != "" && !strings.Contains(err.Error(), field):
		t.Errorf("%s: error %q does not name the field %q", what, err, field)
	}
}

// stamp is a window of real time around a change; stores stamp changes at
// microsecond precision.
type stamp struct{ from, to time.Time }

func begin() stamp { return stamp{from: time.Now().UTC().Truncate(time.Microsecond)} }

func (s stamp) end() stamp { s.to = time.Now().UTC(); return s }

func (s stamp) check(t *testing.T, what string, at time.Time) {
	t.Helper()
	if at.Before(s.from) || at.After(s.to) || at.Location() != time.UTC {
		t.Errorf("%s = %v, want a UTC time in [%v, %v]", what, at, s.from, s.to)
	}
}

func limits(t *testing.T, s history.Store) history.Limits {
	t.Helper()
	l, err := s.Limits(t.Context())
	must(t, err)
	return l
}

func bucketLimit(t *testing.T, s history.Store, b history.Bucket) (history.BucketLimit, bool) {
	t.Helper()
	for _, l := range limits(t, s).Buckets {
		if l.Bucket == b {
			return l, true
		}
	}
	return history.BucketLimit{}, false
}

func audit(t *testing.T, s history.Store, f history.Filter) []history.AuditEntry {
	t.Helper()
	es, err := s.Audit(t.Context(), f, time.Time{}, 0)
	must(t, err)
	return es
}

// entry is an audit entry without its ID and time, for comparisons.
type entry struct {
	Actor, Action, Callee, Caller, Old, New, Reason string
}

func entries(es []history.AuditEntry) []entry {
	out := make([]entry, len(es))
	for i, e := range es {
		out[i] = entry{e.Actor, e.Action, e.Callee, e.Caller, e.Old, e.New, e.Reason}
	}
	return out
}

func dailyPeaks(t *testing.T, s history.Store, f history.Filter, from, to time.Time) []history.DailyPeak {
	t.Helper()
	ds, err := s.DailyPeaks(t.Context(), f, from, to)
	must(t, err)
	return ds
}

func minutes(t *testing.T, s history.Store, b history.Bucket, from, to time.Time) []history.MinuteRow {
	t.Helper()
	rs, err := s.Minutes(t.Context(), b, from, to)
	must(t, err)
	return rs
}

func propose(t *testing.T, s history.Store, c history.Change, ps ...history.Proposal) []history.Proposal {
	t.Helper()
	got, err := s.Propose(t.Context(), ps, c)
	must(t, err)
	return got
}

func proposal(b history.Bucket, proposed float64) history.Proposal {
	return history.Proposal{Bucket: b, Proposed: proposed, PeakLookback: proposed / 1.25, PeakRecent: proposed / 2}
}

func ids(ps []history.Proposal) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.ID
	}
	return out
}

// waitSignal waits for one signal on ch, failing the test after
// signalTimeout or if ch is closed.
func waitSignal(t *testing.T, ch <-chan struct{}, after string) {
	t.Helper()
	timer := time.NewTimer(signalTimeout)
	defer timer.Stop()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("after %s: Changes channel closed, want a signal", after)
		}
	case <-timer.C:
		t.Fatalf("after %s: no Changes signal within %v", after, signalTimeout)
	}
}

// waitClosed drains ch until it is closed, failing the test after
// signalTimeout.
func waitClosed(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	timer := time.NewTimer(signalTimeout)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("%s: Changes channel not closed within %v", why, signalTimeout)
		}
	}
}

// ---- minute rows and the rollup ----

func testWriteMinutesIdempotent(t *testing.T, s history.Store) {
	ctx := t.Context()
	first := []history.MinuteRow{
		row(ab, minute(0, 0), 10, 5, 1),
		row(ab, minute(0, 1), 20, 6, 0),
	}
	must(t, s.WriteMinutes(ctx, first))
	// Again, with other values and one new minute: the stored minutes keep
	// their first values and count once; the new one is added.
	again := []history.MinuteRow{
		row(ab, minute(0, 0), 99, 99, 99),
		row(ab, minute(0, 1), 98, 98, 98),
		row(ab, minute(0, 2), 30, 7, 2),
	}
	must(t, s.WriteMinutes(ctx, again))
	must(t, s.WriteMinutes(ctx, again))

	eq(t, "minutes", minutes(t, s, ab, day(0), day(1)), append(first, again[2]))
	eq(t, "daily peaks", dailyPeaks(t, s, history.Filter{}, day(0), day(1)), []history.DailyPeak{
		{Bucket: ab, Day: day(0), PeakOffered: 30, MeanOffered: 6, MeanDropped: 1, Minutes: 3},
	})
}

func testWriteMinutesFirstInBatchWins(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.WriteMinutes(ctx, []history.MinuteRow{
		row(ab, minute(0, 5), 40, 4, 0),
		row(ab, minute(0, 5), 80, 8, 0), // same bucket and minute: ignored
		row(ac, minute(0, 5), 10, 1, 0),
	}))
	eq(t, "minutes", minutes(t, s, ab, day(0), day(1)), []history.MinuteRow{row(ab, minute(0, 5), 40, 4, 0)})
	eq(t, "daily peaks", dailyPeaks(t, s, history.Filter{Callee: "a", Caller: "b"}, day(0), day(1)), []history.DailyPeak{
		{Bucket: ab, Day: day(0), PeakOffered: 40, MeanOffered: 4, MeanDropped: 0, Minutes: 1},
	})
}

// testWriteMinutesConcurrent: writers racing over the same minutes, and the
// same new days, still count every minute once.
func testWriteMinutesConcurrent(t *testing.T, s history.Store) {
	const writers, perDay = 4, 60
	var batch []history.MinuteRow
	for d := range 3 {
		for m := range perDay {
			batch = append(batch, row(ab, minute(d, m), 2, 1, 0))
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			// Each writer sends the batch in its own order.
			b := slices.Clone(batch)
			if w%2 == 1 {
				slices.Reverse(b)
			}
			errs[w] = s.WriteMinutes(t.Context(), b)
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	var want []history.DailyPeak
	for d := range 3 {
		want = append(want, history.DailyPeak{Bucket: ab, Day: day(d), PeakOffered: 2, MeanOffered: 1, Minutes: perDay})
	}
	eq(t, "daily peaks", dailyPeaks(t, s, history.Filter{}, day(0), day(3)), want)
}

func testWriteMinutesAllOrNothing(t *testing.T, s history.Store) {
	err := s.WriteMinutes(t.Context(), []history.MinuteRow{
		row(ab, minute(0, 0), 10, 5, 0),
		row(ab, minute(0, 1), 1, 5, 0), // peak below mean
	})
	wantErr(t, "WriteMinutes with a bad row", err, history.ErrInvalid, "rows[1].peak_offered")
	eq(t, "minutes after a refused batch", len(minutes(t, s, ab, day(0), day(1))), 0)
	eq(t, "daily peaks after a refused batch", len(dailyPeaks(t, s, history.Filter{}, day(0), day(1))), 0)
	must(t, s.WriteMinutes(t.Context(), nil)) // nothing to write is fine
}

func testRollupExact(t *testing.T, s history.Store) {
	ctx := t.Context()
	// Integral values: sums are exact in any order of addition.
	must(t, s.WriteMinutes(ctx, []history.MinuteRow{
		row(ab, minute(0, 0), 10, 4, 1),
		row(ab, minute(0, 7), 30, 8, 3),
		row(ab, minute(1, 0), 5, 5, 0),
		row(ac, minute(0, 0), 100, 50, 10),
	}))
	// A second batch for the same day adds to its rollup.
	must(t, s.WriteMinutes(ctx, []history.MinuteRow{
		row(ab, minute(0, 1439), 20, 12, 2),
		row(ab, minute(0, 3), 10, 0, 0),
	}))
	eq(t, "daily peaks", dailyPeaks(t, s, history.Filter{}, day(0), day(2)), []history.DailyPeak{
		{Bucket: ab, Day: day(0), PeakOffered: 30, MeanOffered: 6, MeanDropped: 1.5, Minutes: 4},
		{Bucket: ab, Day: day(1), PeakOffered: 5, MeanOffered: 5, MeanDropped: 0, Minutes: 1},
		{Bucket: ac, Day: day(0), PeakOffered: 100, MeanOffered: 50, MeanDropped: 10, Minutes: 1},
	})
}

func testMinutesRange(t *testing.T, s history.Store) {
	var rows []history.MinuteRow
	for m := 9; m >= 0; m-- { // written newest first: read oldest first
		rows = append(rows, row(ab, minute(0, m), float64(m), 0, 0))
	}
	rows = append(rows, row(ac, minute(0, 3), 1, 1, 1))
	must(t, s.WriteMinutes(t.Context(), rows))

	// [from, to): minute 2 is in, minute 5 is not. The bounds' location
	// does not matter; rows come back in UTC.
	berlin := time.FixedZone("UTC+1", 3600)
	got := minutes(t, s, ab, minute(0, 2).In(berlin), minute(0, 5).In(berlin))
	eq(t, "minutes [2, 5)", got, []history.MinuteRow{
		row(ab, minute(0, 2), 2, 0, 0), row(ab, minute(0, 3), 3, 0, 0), row(ab, minute(0, 4), 4, 0, 0),
	})
	for _, r := range got {
		if r.Minute.Location() != time.UTC {
			t.Errorf("minute %v is not in UTC", r.Minute)
		}
	}
	eq(t, "minutes of a bucket without rows", len(minutes(t, s, bb, day(0), day(1))), 0)
	eq(t, "minutes of an empty range", len(minutes(t, s, ab, minute(0, 3), minute(0, 3))), 0)
	eq(t, "whole day", len(minutes(t, s, ab, day(0), day(1))), 10)
}

func testDailyPeaksFilterAndOrder(t *testing.T, s history.Store) {
	zz := history.Bucket{Callee: "a", Caller: "z"}
	b0 := history.Bucket{Callee: "b", Caller: "0"}
	// Byte order, as Go sorts: upper case before lower case, "_overflow"
	// after letters and digits.
	upper := history.Bucket{Callee: "a", Caller: "Z"}
	over := history.Bucket{Callee: "a", Caller: "_overflow"}
	var rows []history.MinuteRow
	for _, b := range []history.Bucket{b0, zz, over, ab, upper} {
		for d := 2; d >= 0; d-- {
			rows = append(rows, row(b, minute(d, 0), 1, 1, 0))
		}
	}
	must(t, s.WriteMinutes(t.Context(), rows))

	keys := func(ds []history.DailyPeak) []string {
		var out []string
		for _, d := range ds {
			out = append(out, fmt.Sprintf("%s/%s@%d", d.Callee, d.Caller, int(d.Day.Sub(day0).Hours()/24)))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		f    history.Filter
		want []string
	}{
		{"all", history.Filter{}, []string{"a/Z@0", "a/Z@1", "a/_overflow@0", "a/_overflow@1", "a/b@0", "a/b@1", "a/z@0", "a/z@1", "b/0@0", "b/0@1"}},
		{"callee", history.Filter{Callee: "a"}, []string{"a/Z@0", "a/Z@1", "a/_overflow@0", "a/_overflow@1", "a/b@0", "a/b@1", "a/z@0", "a/z@1"}},
		{"caller", history.Filter{Caller: "z"}, []string{"a/z@0", "a/z@1"}},
		{"bucket", history.Filter{Callee: "b", Caller: "0"}, []string{"b/0@0", "b/0@1"}},
		{"nothing", history.Filter{Callee: "nobody"}, nil},
	} {
		eq(t, "DailyPeaks "+tc.name, keys(dailyPeaks(t, s, tc.f, day(0), day(2))), tc.want)
	}
}

func testDailyPeaksDayRange(t *testing.T, s history.Store) {
	var rows []history.MinuteRow
	for d := range 4 {
		rows = append(rows, row(ab, minute(d, 600), 1, 1, 0))
	}
	must(t, s.WriteMinutes(t.Context(), rows))
	days := func(from, to time.Time) []int {
		var out []int
		for _, d := range dailyPeaks(t, s, history.Filter{}, from, to) {
			out = append(out, int(d.Day.Sub(day0).Hours()/24))
		}
		return out
	}
	// A day is in when its midnight is in [from, to).
	eq(t, "[day1, day3)", days(day(1), day(3)), []int{1, 2})
	eq(t, "[day1 noon, day3 noon)", days(day(1).Add(12*time.Hour), day(3).Add(12*time.Hour)), []int{2, 3})
	eq(t, "[day0, day0)", days(day(0), day(0)), nil)
}

func testRetain(t *testing.T, s history.Store) {
	ctx := t.Context()
	var rows []history.MinuteRow
	for d := range 4 {
		rows = append(rows, row(ab, minute(d, 0), 1, 1, 0), row(ac, minute(d, 1439), 2, 2, 0))
	}
	must(t, s.WriteMinutes(ctx, rows))

	// Day 1 ends at the midnight starting day 2: it goes, with day 0.
	n, err := s.Retain(ctx, day(2))
	must(t, err)
	eq(t, "days dropped", n, 2)
	// before in the middle of day 2: day 2 is not over, so it stays.
	n, err = s.Retain(ctx, day(2).Add(23*time.Hour))
	must(t, err)
	eq(t, "days dropped mid-day", n, 0)

	eq(t, "minutes of dropped days", len(minutes(t, s, ab, day(0), day(2))), 0)
	eq(t, "minutes kept", minutes(t, s, ac, day(0), day(4)), []history.MinuteRow{
		row(ac, minute(2, 1439), 2, 2, 0), row(ac, minute(3, 1439), 2, 2, 0),
	})
	var kept []time.Time
	for _, d := range dailyPeaks(t, s, history.Filter{Callee: "a", Caller: "b"}, day(-10), day(10)) {
		kept = append(kept, d.Day)
	}
	eq(t, "daily rows kept", kept, []time.Time{day(2), day(3)})

	// A dropped day written again counts afresh.
	must(t, s.WriteMinutes(ctx, []history.MinuteRow{row(ab, minute(0, 5), 3, 3, 0)}))
	eq(t, "rewritten day", dailyPeaks(t, s, history.Filter{Callee: "a", Caller: "b"}, day(0), day(1)),
		[]history.DailyPeak{{Bucket: ab, Day: day(0), PeakOffered: 3, MeanOffered: 3, Minutes: 1}})
}

// ---- limits ----

func testSetLimit(t *testing.T, s history.Store) {
	ctx := t.Context()
	win := begin()
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ac, Limit: 100}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 50, Mode: new(dropratio.Shadow), Source: history.Derived,
		UpdatedBy: "ignored", Reason: "ignored"}, alice))
	win = win.end()

	l := limits(t, s)
	if len(l.Buckets) != 2 {
		t.Fatalf("limits: %+v, want two buckets", l.Buckets)
	}
	for _, b := range l.Buckets {
		win.check(t, "UpdatedAt", b.UpdatedAt)
		if b.UpdatedBy != "alice" || b.Reason != "first reason" {
			t.Errorf("bucket %v updated by %q for %q, want alice for the change's reason", b.Bucket, b.UpdatedBy, b.Reason)
		}
	}
	strip := func(bs []history.BucketLimit) []history.BucketLimit {
		out := slices.Clone(bs)
		for i := range out {
			out[i].UpdatedAt = time.Time{}
			out[i].Burst, out[i].Payback = nil, nil // BurstPayback tests them
		}
		return out
	}
	eq(t, "buckets, sorted", strip(l.Buckets), []history.BucketLimit{
		{Bucket: ab, Limit: 50, Mode: new(dropratio.Shadow), Enforcement: new(dataplane.EnforceSidecar), Source: history.Derived, UpdatedBy: "alice", Reason: "first reason"},
		{Bucket: ac, Limit: 100, Mode: new(dropratio.Enforce), Enforcement: new(dataplane.EnforceSidecar), Source: history.Manual, UpdatedBy: "alice", Reason: "first reason"},
	})

	// Replace: an empty Mode keeps the bucket's.
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 0}, bob))
	got, _ := bucketLimit(t, s, ab)
	eq(t, "replaced", []any{got.Limit, *got.Mode, got.Source, got.UpdatedBy, got.Reason},
		[]any{0.0, dropratio.Shadow, history.Manual, "bob", "second reason"})

	eq(t, "audit", entries(audit(t, s, history.Filter{})), []entry{
		{"bob", "set_limit", "a", "b", "50 rps, shadow, derived", "0 rps, shadow, manual", "second reason"},
		{"alice", "set_limit", "a", "b", "", "50 rps, shadow, derived", "first reason"},
		{"alice", "set_limit", "a", "c", "", "100 rps, enforce, manual", "first reason"},
	})
}

func testSetLimitModeDefaults(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a", Mode: new(dropratio.Shadow)}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1}, alice)) // new: the callee's mode
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: bb, Limit: 1}, alice)) // new, callee without settings: enforce
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ac, Limit: 1, Mode: new(dropratio.Enforce)}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ac, Limit: 2}, alice)) // existing: its own mode
	for b, want := range map[history.Bucket]dropratio.Mode{ab: dropratio.Shadow, bb: dropratio.Enforce, ac: dropratio.Enforce} {
		got, _ := bucketLimit(t, s, b)
		eq(t, fmt.Sprintf("mode of %v", b), *got.Mode, want)
	}
}

// testEnforcement: like the mode, a bucket limit's enforcement is its own,
// kept when not given, else its callee's (but for the reserved callers),
// else sidecar; a callee's is kept when not given; approving a proposal
// keeps it; the audit shows it.
func testEnforcement(t *testing.T, s history.Store) {
	ctx := t.Context()
	up := dataplane.EnforceUpstream
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a", Enforcement: new(up)}, alice))
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a", Capacity: f64(10)}, alice)) // kept
	au := history.Bucket{Callee: "a", Caller: "unknown"}
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1}, alice))                                             // the callee's
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: au, Limit: 1}, alice))                                             // reserved: sidecar
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: bb, Limit: 1}, alice))                                             // no settings: sidecar
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ac, Limit: 1, Enforcement: new(dataplane.EnforceSidecar)}, alice)) // its own
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ac, Limit: 2}, alice))                                             // kept
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: bb, Limit: 2, Enforcement: new(up)}, alice))                       // changed
	propose(t, s, alice, proposal(bb, 300))
	ps, err := s.Proposals(ctx, history.Filter{})
	must(t, err)
	_, err = s.Approve(ctx, ids(ps), bob) // keeps bb's
	must(t, err)
	for b, want := range map[history.Bucket]dataplane.Enforcement{ab: up, au: dataplane.EnforceSidecar, ac: dataplane.EnforceSidecar, bb: up} {
		got, _ := bucketLimit(t, s, b)
		eq(t, fmt.Sprintf("enforcement of %v", b), *got.Enforcement, want)
	}
	eq(t, "callee a's enforcement", *limits(t, s).Services[0].Enforcement, up)
	eq(t, "audit of the approval", entries(audit(t, s, history.Filter{Callee: "b"}))[0],
		entry{"bob", "approve", "b", "b", "2 rps, enforce, manual, enforced upstream", "300 rps, enforce, derived, enforced upstream", "second reason"})
	wantErr(t, "a bad enforcement", s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1, Enforcement: new(dataplane.Enforcement(2))}, alice),
		history.ErrInvalid, "limit.enforcement")
	wantErr(t, "a bad service enforcement", s.SetService(ctx, history.ServiceLimits{Callee: "a", Enforcement: new(dataplane.Enforcement(2))}, alice),
		history.ErrInvalid, "service.enforcement")
}

func testDeleteLimit(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 7}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ac, Limit: 8}, alice))
	must(t, s.DeleteLimit(ctx, ab, bob))
	if _, ok := bucketLimit(t, s, ab); ok {
		t.Error("deleted limit still listed")
	}
	if _, ok := bucketLimit(t, s, ac); !ok {
		t.Error("the other bucket's limit went too")
	}
	eq(t, "audit", entries(audit(t, s, history.Filter{Caller: "b"}))[0],
		entry{"bob", "delete_limit", "a", "b", "7 rps, enforce, manual", "", "second reason"})

	n := len(audit(t, s, history.Filter{}))
	wantErr(t, "delete again", s.DeleteLimit(ctx, ab, bob), history.ErrNotFound, "")
	eq(t, "audit entries after a refused delete", len(audit(t, s, history.Filter{})), n)
}

func testSetService(t *testing.T, s history.Store) {
	ctx := t.Context()
	win := begin()
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "b"}, alice))
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a", DefaultLimit: f64(100), Capacity: f64(500),
		Mode: new(dropratio.Shadow), FailMode: new(dataplane.FailLocal)}, alice))
	win = win.end()
	l := limits(t, s)
	for _, svc := range l.Services {
		win.check(t, "UpdatedAt", svc.UpdatedAt)
	}
	strip := func(ss []history.ServiceLimits) []history.ServiceLimits {
		out := slices.Clone(ss)
		for i := range out {
			out[i].UpdatedAt = time.Time{}
		}
		return out
	}
	eq(t, "services, sorted", strip(l.Services), []history.ServiceLimits{
		{Callee: "a", DefaultLimit: f64(100), Capacity: f64(500), Mode: new(dropratio.Shadow), FailMode: new(dataplane.FailLocal),
			Enforcement: new(dataplane.EnforceSidecar), UpdatedBy: "alice", Reason: "first reason"},
		{Callee: "b", Mode: new(dropratio.Enforce), FailMode: new(dataplane.FailOpen), Enforcement: new(dataplane.EnforceSidecar), UpdatedBy: "alice", Reason: "first reason"},
	})

	// Replace: rates as given (nil: none), empty modes kept.
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a", Capacity: f64(250)}, bob))
	eq(t, "replaced", strip(limits(t, s).Services)[0], history.ServiceLimits{
		Callee: "a", Capacity: f64(250), Mode: new(dropratio.Shadow), FailMode: new(dataplane.FailLocal),
		Enforcement: new(dataplane.EnforceSidecar), UpdatedBy: "bob", Reason: "second reason"})

	eq(t, "audit", entries(audit(t, s, history.Filter{Callee: "a"})), []entry{
		{"bob", "set_service", "a", "",
			"default 100 rps, capacity 500 rps, mode shadow, fail local",
			"default none, capacity 250 rps, mode shadow, fail local", "second reason"},
		{"alice", "set_service", "a", "", "", "default 100 rps, capacity 500 rps, mode shadow, fail local", "first reason"},
	})
}

func testSetMode(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a"}, alice))
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "b"}, alice))
	for _, b := range []history.Bucket{ab, ac, bb} {
		must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: b, Limit: 10}, alice))
	}
	modes := func() map[string]dropratio.Mode {
		l := limits(t, s)
		out := map[string]dropratio.Mode{}
		for _, svc := range l.Services {
			out[svc.Callee] = *svc.Mode
		}
		for _, b := range l.Buckets {
			out[b.Callee+"/"+b.Caller] = *b.Mode
		}
		return out
	}
	before := len(audit(t, s, history.Filter{}))

	// A callee: its own mode and all its buckets.
	n, err := s.SetMode(ctx, history.Filter{Callee: "a"}, dropratio.Shadow, bob)
	must(t, err)
	eq(t, "selected by callee a", n, 3)
	eq(t, "modes", modes(), map[string]dropratio.Mode{
		"a": dropratio.Shadow, "a/b": dropratio.Shadow, "a/c": dropratio.Shadow, "b": dropratio.Enforce, "b/b": dropratio.Enforce})
	es := audit(t, s, history.Filter{})
	eq(t, "audit", entries(es[:len(es)-before]), []entry{
		{"bob", "set_mode", "a", "c", "enforce", "shadow", "second reason"},
		{"bob", "set_mode", "a", "b", "enforce", "shadow", "second reason"},
		{"bob", "set_mode", "a", "", "enforce", "shadow", "second reason"},
	})
	got, _ := bucketLimit(t, s, ac)
	eq(t, "switched bucket's updater", []string{got.UpdatedBy, got.Reason}, []string{"bob", "second reason"})

	// Again: the same selection, nothing to change, nothing audited.
	before = len(audit(t, s, history.Filter{}))
	n, err = s.SetMode(ctx, history.Filter{Callee: "a"}, dropratio.Shadow, bob)
	must(t, err)
	eq(t, "selected again", n, 3)
	eq(t, "audit entries after a no-op", len(audit(t, s, history.Filter{})), before)

	// A caller across callees: buckets only, never a callee's settings.
	n, err = s.SetMode(ctx, history.Filter{Caller: "b"}, dropratio.Enforce, alice)
	must(t, err)
	eq(t, "selected by caller b", n, 2)
	eq(t, "modes", modes(), map[string]dropratio.Mode{
		"a": dropratio.Shadow, "a/b": dropratio.Enforce, "a/c": dropratio.Shadow, "b": dropratio.Enforce, "b/b": dropratio.Enforce})

	// One bucket.
	n, err = s.SetMode(ctx, history.Filter{Callee: "a", Caller: "c"}, dropratio.Enforce, alice)
	must(t, err)
	eq(t, "selected one bucket", n, 1)
	eq(t, "mode of a/c", modes()["a/c"], dropratio.Enforce)

	_, err = s.SetMode(ctx, history.Filter{Callee: "nobody"}, dropratio.Shadow, alice)
	wantErr(t, "SetMode selecting nothing", err, history.ErrNotFound, "")
}

// ---- proposals ----

func testPropose(t *testing.T, s history.Store) {
	ctx := t.Context()
	win := begin()
	in := []history.Proposal{
		{Bucket: ac, Current: f64(80), Proposed: 125, PeakLookback: 100, PeakRecent: 90,
			Flags: []string{"step down needs approval", "lowers below recent peak"},
			// Set by the store, whatever the caller says:
			ID: 999, Status: history.Approved, CreatedBy: "mallory", DecidedBy: "mallory", Reason: "x"},
		{Bucket: ab, Proposed: 10, PeakLookback: 8, PeakRecent: 8},
	}
	got := propose(t, s, alice, in...)
	win = win.end()
	if len(got) != 2 || got[0].ID == got[1].ID || got[0].ID <= 0 || got[1].ID <= got[0].ID {
		t.Fatalf("Propose returned %+v; want two proposals with rising IDs, in order", got)
	}
	for _, p := range got {
		win.check(t, "CreatedAt", p.CreatedAt)
	}
	want := []history.Proposal{
		{ID: got[0].ID, Bucket: ac, Current: f64(80), Proposed: 125, PeakLookback: 100, PeakRecent: 90,
			Flags:  []string{"step down needs approval", "lowers below recent peak"},
			Status: history.Pending, CreatedBy: "alice", CreatedAt: got[0].CreatedAt},
		{ID: got[1].ID, Bucket: ab, Proposed: 10, PeakLookback: 8, PeakRecent: 8,
			Status: history.Pending, CreatedBy: "alice", CreatedAt: got[1].CreatedAt},
	}
	eq(t, "returned", got, want)

	listed, err := s.Proposals(ctx, history.Filter{})
	must(t, err)
	eq(t, "listed, sorted by bucket", listed, []history.Proposal{want[1], want[0]})
	listed, err = s.Proposals(ctx, history.Filter{Caller: "c"}, history.Pending, history.Approved)
	must(t, err)
	eq(t, "listed by caller", listed, want[:1])
	listed, err = s.Proposals(ctx, history.Filter{}, history.Rejected)
	must(t, err)
	eq(t, "none rejected", len(listed), 0)

	eq(t, "audit", entries(audit(t, s, history.Filter{})), []entry{
		{"alice", "propose", "a", "b", "", fmt.Sprintf("proposal %d: 10 rps", got[1].ID), "first reason"},
		{"alice", "propose", "a", "c", "80 rps", fmt.Sprintf("proposal %d: 125 rps", got[0].ID), "first reason"},
	})
	eq(t, "limits after Propose", limits(t, s), history.Limits{})

	got, err = s.Propose(ctx, nil, alice)
	must(t, err)
	eq(t, "nothing proposed", len(got), 0)
}

func testProposeSupersedes(t *testing.T, s history.Store) {
	ctx := t.Context()
	first := propose(t, s, alice, proposal(ab, 100), proposal(ac, 200))
	win := begin()
	second := propose(t, s, bob, proposal(ab, 150))
	win = win.end()

	all, err := s.Proposals(ctx, history.Filter{}, history.Pending, history.Superseded)
	must(t, err)
	if len(all) != 3 {
		t.Fatalf("proposals: %+v, want 3", all)
	}
	old := all[0]
	win.check(t, "superseded DecidedAt", old.DecidedAt)
	eq(t, "superseded", []any{old.ID, old.Status, old.DecidedBy, old.Reason},
		[]any{first[0].ID, history.Superseded, "bob", "second reason"})
	eq(t, "newer", []any{all[1].ID, all[1].Status}, []any{second[0].ID, history.Pending})
	eq(t, "other bucket untouched", []any{all[2].ID, all[2].Status, all[2].DecidedAt}, []any{first[1].ID, history.Pending, time.Time{}})

	pending, err := s.Proposals(ctx, history.Filter{Callee: "a", Caller: "b"})
	must(t, err)
	eq(t, "pending for a/b", ids(pending), ids(second))
}

// testProposeConcurrent: however proposals race, a bucket has at most one
// pending.
func testProposeConcurrent(t *testing.T, s history.Store) {
	const writers = 6
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			_, errs[w] = s.Propose(t.Context(), []history.Proposal{proposal(ab, float64(10+w))}, alice)
		})
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	pending, err := s.Proposals(t.Context(), history.Filter{})
	must(t, err)
	eq(t, "pending proposals", len(pending), 1)
	sup, err := s.Proposals(t.Context(), history.Filter{}, history.Superseded)
	must(t, err)
	eq(t, "superseded proposals", len(sup), writers-1)
}

func testApprove(t *testing.T, s history.Store) {
	ctx := t.Context()
	// ab has a shadow limit; ac has none but its callee is in shadow; bb
	// has nothing at all.
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 5, Mode: new(dropratio.Shadow)}, alice))
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a", Mode: new(dropratio.Shadow)}, alice))
	ps := propose(t, s, alice, proposal(ab, 100), proposal(ac, 200), proposal(bb, 300))
	before := len(audit(t, s, history.Filter{}))

	win := begin()
	got, err := s.Approve(ctx, []int64{ps[2].ID, ps[0].ID, ps[1].ID, ps[0].ID}, bob)
	win = win.end()
	must(t, err)
	eq(t, "approved, by ID", ids(got), ids(ps))
	for i, p := range got {
		win.check(t, "DecidedAt", p.DecidedAt)
		want := ps[i]
		want.Status, want.DecidedBy, want.DecidedAt, want.Reason = history.Approved, "bob", p.DecidedAt, "second reason"
		eq(t, "approved proposal", p, want)
	}

	l := limits(t, s)
	for i := range l.Buckets {
		win.check(t, "UpdatedAt", l.Buckets[i].UpdatedAt)
		l.Buckets[i].UpdatedAt = time.Time{}
		l.Buckets[i].Burst, l.Buckets[i].Payback = nil, nil // BurstPayback tests them
	}
	derived := func(b history.Bucket, limit float64, m dropratio.Mode) history.BucketLimit {
		return history.BucketLimit{Bucket: b, Limit: limit, Mode: new(m), Enforcement: new(dataplane.EnforceSidecar), Source: history.Derived, UpdatedBy: "bob", Reason: "second reason"}
	}
	eq(t, "limits", l.Buckets, []history.BucketLimit{
		derived(ab, 100, dropratio.Shadow), derived(ac, 200, dropratio.Shadow), derived(bb, 300, dropratio.Enforce),
	})
	es := audit(t, s, history.Filter{})
	eq(t, "audit", entries(es[:len(es)-before]), []entry{
		{"bob", "approve", "b", "b", "", "300 rps, enforce, derived", "second reason"},
		{"bob", "approve", "a", "c", "", "200 rps, shadow, derived", "second reason"},
		{"bob", "approve", "a", "b", "5 rps, shadow, manual", "100 rps, shadow, derived", "second reason"},
	})
	pending, err := s.Proposals(ctx, history.Filter{})
	must(t, err)
	eq(t, "pending after approval", len(pending), 0)

	got, err = s.Approve(ctx, nil, bob)
	must(t, err)
	eq(t, "nothing approved", len(got), 0)
}

func testReject(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 5}, alice))
	ps := propose(t, s, alice, proposal(ab, 100))
	lim := limits(t, s)
	win := begin()
	got, err := s.Reject(ctx, ids(ps), bob)
	win = win.end()
	must(t, err)
	if len(got) != 1 {
		t.Fatalf("Reject returned %+v", got)
	}
	win.check(t, "DecidedAt", got[0].DecidedAt)
	eq(t, "rejected", []any{got[0].Status, got[0].DecidedBy, got[0].Reason}, []any{history.Rejected, "bob", "second reason"})
	eq(t, "limits after Reject", limits(t, s), lim)
	eq(t, "audit", entries(audit(t, s, history.Filter{}))[0],
		entry{"bob", "reject", "a", "b", fmt.Sprintf("proposal %d: 100 rps", ps[0].ID), "rejected", "second reason"})
	listed, err := s.Proposals(ctx, history.Filter{}, history.Rejected)
	must(t, err)
	eq(t, "listed as rejected", listed, got)
}

func testNotDecidable(t *testing.T, s history.Store) {
	ctx := t.Context()
	done := propose(t, s, alice, proposal(ab, 100))
	_, err := s.Approve(ctx, ids(done), alice)
	must(t, err)
	old := propose(t, s, alice, proposal(ac, 1))
	propose(t, s, alice, proposal(ac, 2)) // supersedes old
	open := propose(t, s, alice, proposal(bb, 300))

	type state struct {
		limits    history.Limits
		proposals []history.Proposal
		audit     []history.AuditEntry
	}
	snapshot := func() state {
		ps, err := s.Proposals(ctx, history.Filter{}, history.Pending, history.Approved, history.Rejected, history.Superseded)
		must(t, err)
		return state{limits(t, s), ps, audit(t, s, history.Filter{})}
	}
	before := snapshot()
	for _, tc := range []struct {
		name string
		call func(context.Context, []int64, history.Change) ([]history.Proposal, error)
		ids  []int64
		err  error
	}{
		{"approve approved", s.Approve, ids(done), history.ErrNotDecidable},
		{"reject approved", s.Reject, ids(done), history.ErrNotDecidable},
		{"approve superseded", s.Approve, ids(old), history.ErrNotDecidable},
		{"approve pending and approved", s.Approve, append(ids(open), ids(done)...), history.ErrNotDecidable},
		{"reject pending and superseded", s.Reject, append(ids(open), ids(old)...), history.ErrNotDecidable},
		{"approve pending and unknown", s.Approve, append(ids(open), 1_000_000), history.ErrNotFound},
		{"reject unknown", s.Reject, []int64{-1}, history.ErrNotFound},
	} {
		got, err := tc.call(ctx, tc.ids, bob)
		wantErr(t, tc.name, err, tc.err, "")
		if len(got) != 0 {
			t.Errorf("%s: returned %+v with its error", tc.name, got)
		}
		eq(t, "state after "+tc.name, snapshot(), before)
	}
}

// ---- audit ----

func testAudit(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: bb, Limit: 2}, alice))
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a"}, alice))
	all := audit(t, s, history.Filter{})
	if len(all) != 3 {
		t.Fatalf("audit: %+v, want 3 entries", all)
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID >= all[i-1].ID || all[i].At.After(all[i-1].At) {
			t.Errorf("audit not newest first: %+v before %+v", all[i-1], all[i])
		}
	}
	eq(t, "actions, newest first", []string{all[0].Action, all[1].Action, all[2].Action},
		[]string{"set_service", "set_limit", "set_limit"})

	got, err := s.Audit(ctx, history.Filter{}, time.Time{}, 2)
	must(t, err)
	eq(t, "limit 2", got, all[:2])
	got, err = s.Audit(ctx, history.Filter{}, all[0].At.Add(time.Microsecond), 0)
	must(t, err)
	eq(t, "since after the newest", len(got), 0)
	got, err = s.Audit(ctx, history.Filter{}, all[1].At, 0)
	must(t, err)
	var want []history.AuditEntry
	for _, e := range all {
		if !e.At.Before(all[1].At) {
			want = append(want, e)
		}
	}
	eq(t, "since the second newest", got, want)
	got, err = s.Audit(ctx, history.Filter{Callee: "a"}, time.Time{}, 0)
	must(t, err)
	eq(t, "callee a", entries(got), entries([]history.AuditEntry{all[0], all[2]}))
	got, err = s.Audit(ctx, history.Filter{Callee: "a", Caller: "b"}, time.Time{}, 0)
	must(t, err)
	eq(t, "bucket a/b", entries(got), entries(all[2:]))
}

func testAuditHistory(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.AuditHistory(ctx, nil, alice)) // nothing to note: no entry
	eq(t, "entries after no notes", len(audit(t, s, history.Filter{})), 0)
	st := begin()
	must(t, s.AuditHistory(ctx, []history.HistoryNote{{Bucket: ab, What: "synthetic: 10 minutes"}, {Bucket: bb, What: "synthetic: 20 minutes"}}, bob))
	st = st.end()
	all := audit(t, s, history.Filter{})
	eq(t, "entries", entries(all), entries([]history.AuditEntry{
		{Actor: "bob", Action: "write_history", Bucket: bb, New: "synthetic: 20 minutes", Reason: bob.Reason},
		{Actor: "bob", Action: "write_history", Bucket: ab, New: "synthetic: 10 minutes", Reason: bob.Reason},
	}))
	for _, e := range all {
		st.check(t, "write_history at", e.At)
	}
	eq(t, "limits", limits(t, s), history.Limits{}) // it changes no limit
}

// testReturnsCopies: changing what a store returned changes nothing in it.
func testReturnsCopies(t *testing.T, s history.Store) {
	ctx := t.Context()
	svc := history.ServiceLimits{Callee: "a", Capacity: f64(10), Mode: new(dropratio.Shadow), FailMode: new(dataplane.FailHold)}
	must(t, s.SetService(ctx, svc, alice))
	lim := history.BucketLimit{Bucket: ab, Limit: 5, Enforcement: new(dataplane.EnforceUpstream)}
	must(t, s.SetLimit(ctx, lim, alice))
	*svc.Mode, *svc.FailMode, *lim.Enforcement = dropratio.Enforce, dataplane.FailLocal, dataplane.EnforceSidecar
	in := []history.Proposal{{Bucket: ab, Proposed: 1, Flags: []string{"x"}, Current: f64(3)}}
	got := propose(t, s, alice, in...)
	got[0].Flags[0], *got[0].Current = "changed", 99
	in[0].Flags[0], *in[0].Current = "changed", 99
	l := limits(t, s)
	*l.Services[0].Capacity = 99
	*l.Services[0].Mode, *l.Services[0].FailMode, *l.Services[0].Enforcement = dropratio.Enforce, dataplane.FailLocal, dataplane.EnforceUpstream
	*l.Buckets[0].Mode, *l.Buckets[0].Enforcement = dropratio.Enforce, dataplane.EnforceSidecar

	ps, err := s.Proposals(ctx, history.Filter{})
	must(t, err)
	eq(t, "stored flags", ps[0].Flags, []string{"x"})
	eq(t, "stored current", *ps[0].Current, 3.0)
	l = limits(t, s)
	eq(t, "stored capacity", *l.Services[0].Capacity, 10.0)
	eq(t, "stored service settings", []any{*l.Services[0].Mode, *l.Services[0].FailMode, *l.Services[0].Enforcement},
		[]any{dropratio.Shadow, dataplane.FailHold, dataplane.EnforceSidecar})
	eq(t, "stored bucket settings", []any{*l.Buckets[0].Mode, *l.Buckets[0].Enforcement}, []any{dropratio.Shadow, dataplane.EnforceUpstream})
}

// ---- changes ----

func testChanges(t *testing.T, s history.Store) {
	ctx := t.Context()
	ch, err := s.Changes(ctx)
	must(t, err)
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1}, alice))
	waitSignal(t, ch, "SetLimit")
	must(t, s.SetService(ctx, history.ServiceLimits{Callee: "a"}, alice))
	waitSignal(t, ch, "SetService")
	_, err = s.SetMode(ctx, history.Filter{Callee: "a"}, dropratio.Shadow, alice)
	must(t, err)
	waitSignal(t, ch, "SetMode")
	ps := propose(t, s, alice, proposal(ac, 10))
	_, err = s.Approve(ctx, ids(ps), alice)
	must(t, err)
	waitSignal(t, ch, "Approve")
	must(t, s.DeleteLimit(ctx, ab, alice))
	waitSignal(t, ch, "DeleteLimit")

	// Every subscriber hears of a change.
	ch2, err := s.Changes(ctx)
	must(t, err)
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 2}, alice))
	waitSignal(t, ch, "SetLimit, first subscriber")
	waitSignal(t, ch2, "SetLimit, second subscriber")
}

// testChangesCoalesce: a subscriber that does not read never blocks a
// writer; it finds a signal when it reads.
func testChangesCoalesce(t *testing.T, s history.Store) {
	ctx := t.Context()
	ch, err := s.Changes(ctx)
	must(t, err)
	for i := range 5 {
		must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: float64(i)}, alice))
	}
	waitSignal(t, ch, "five unread changes")
}

func testChangesEnd(t *testing.T, s history.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := s.Changes(ctx)
	must(t, err)
	other, err := s.Changes(t.Context())
	must(t, err)
	cancel()
	waitClosed(t, ch, "after its context ended")

	must(t, s.SetLimit(t.Context(), history.BucketLimit{Bucket: ab, Limit: 1}, alice))
	waitSignal(t, other, "SetLimit, on a subscription whose context is live")

	s.Close()
	waitClosed(t, other, "after Close")
	s.Close() // idempotent
	if _, err := s.Changes(t.Context()); err == nil {
		t.Error("Changes on a closed store succeeded")
	}
}

// ---- refused input ----

// invalidCase is a call a store must refuse with history.ErrInvalid,
// naming field.
type invalidCase struct {
	name  string
	field string
	call  func() error
}

func testInvalid(t *testing.T, s history.Store) {
	ctx := t.Context()
	cases := slices.Concat(invalidLoadCases(ctx, s), invalidLimitCases(ctx, s), invalidProposalCases(ctx, s), invalidProcedureCases(ctx, s))
	for _, tc := range cases {
		wantErr(t, tc.name, tc.call(), history.ErrInvalid, tc.field)
	}
	// Nothing above changed anything.
	eq(t, "minutes", len(minutes(t, s, ab, day(0), day(1))), 0)
	eq(t, "limits", limits(t, s), history.Limits{})
	eq(t, "audit", len(audit(t, s, history.Filter{})), 0)
	ps, err := s.Proposals(ctx, history.Filter{}, history.Pending, history.Approved, history.Rejected, history.Superseded)
	must(t, err)
	eq(t, "proposals", len(ps), 0)
}

// invalidLoadCases write and read minute history.
func invalidLoadCases(ctx context.Context, s history.Store) []invalidCase {
	long := strings.Repeat("x", 300)
	good := row(ab, minute(0, 0), 2, 1, 0)
	bad := func(mut func(r *history.MinuteRow)) []history.MinuteRow {
		r := good
		mut(&r)
		return []history.MinuteRow{good, r}
	}
	return []invalidCase{
		{"row callee", "rows[1].callee", func() error { return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.Callee = "" })) }},
		{"row caller", "rows[1].caller", func() error { return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.Caller = "bad name" })) }},
		{"row long name", "rows[1].callee", func() error { return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.Callee = long })) }},
		{"row NaN", "rows[1].mean_offered", func() error {
			return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.MeanOffered = math.NaN() }))
		}},
		{"row Inf", "rows[1].peak_offered", func() error {
			return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.PeakOffered = math.Inf(1) }))
		}},
		{"row negative", "rows[1].mean_dropped", func() error {
			return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.MeanDropped = -1 }))
		}},
		{"row peak < mean", "rows[1].peak_offered", func() error {
			return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.PeakOffered = 0.5 }))
		}},
		{"row minute not truncated", "rows[1].minute", func() error {
			return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.Minute = r.Minute.Add(time.Second) }))
		}},
		{"row zero minute", "rows[1].minute", func() error { return s.WriteMinutes(ctx, bad(func(r *history.MinuteRow) { r.Minute = time.Time{} })) }},
		{"minutes bucket", "bucket.caller", func() error { _, err := s.Minutes(ctx, history.Bucket{Callee: "a"}, day(0), day(1)); return err }},
		{"daily filter", "filter.callee", func() error { _, err := s.DailyPeaks(ctx, history.Filter{Callee: "-x"}, day(0), day(1)); return err }},
	}
}

// invalidLimitCases set and delete limits, and set services and modes.
func invalidLimitCases(ctx context.Context, s history.Store) []invalidCase {
	lim := history.BucketLimit{Bucket: ab, Limit: 1}
	return []invalidCase{
		{"limit NaN", "limit.limit", func() error { return s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: math.NaN()}, alice) }},
		{"limit Inf", "limit.limit", func() error { return s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: math.Inf(1)}, alice) }},
		{"limit negative", "limit.limit", func() error { return s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: -1}, alice) }},
		{"limit mode", "limit.mode", func() error {
			return s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1, Mode: new(dropratio.Mode(2))}, alice)
		}},
		{"limit source", "limit.source", func() error {
			return s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1, Source: "guess"}, alice)
		}},
		{"limit callee", "limit.callee", func() error {
			return s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Caller: "b"}, Limit: 1}, alice)
		}},
		{"limit no actor", "change.actor", func() error { return s.SetLimit(ctx, lim, history.Change{Reason: "r"}) }},
		{"limit blank actor", "change.actor", func() error { return s.SetLimit(ctx, lim, history.Change{Actor: " ", Reason: "r"}) }},
		{"limit no reason", "change.reason", func() error { return s.SetLimit(ctx, lim, history.Change{Actor: "a"}) }},
		{"limit NUL in reason", "change.reason", func() error { return s.SetLimit(ctx, lim, history.Change{Actor: "a", Reason: "a\x00b"}) }},
		{"limit bad UTF-8 actor", "change.actor", func() error { return s.SetLimit(ctx, lim, history.Change{Actor: "\xff", Reason: "r"}) }},
		{"limit long reason", "change.reason", func() error {
			return s.SetLimit(ctx, lim, history.Change{Actor: "a", Reason: strings.Repeat("r", history.MaxReasonLen+1)})
		}},
		{"delete no reason", "change.reason", func() error { return s.DeleteLimit(ctx, ab, history.Change{Actor: "a"}) }},
		{"delete bucket", "bucket.callee", func() error { return s.DeleteLimit(ctx, history.Bucket{Callee: "é", Caller: "b"}, alice) }},
		{"service capacity", "service.capacity", func() error {
			return s.SetService(ctx, history.ServiceLimits{Callee: "a", Capacity: f64(-5)}, alice)
		}},
		{"service default", "service.default_limit", func() error {
			return s.SetService(ctx, history.ServiceLimits{Callee: "a", DefaultLimit: f64(math.NaN())}, alice)
		}},
		{"service fail mode", "service.fail_mode", func() error {
			return s.SetService(ctx, history.ServiceLimits{Callee: "a", FailMode: new(dataplane.FailMode(3))}, alice)
		}},
		{"service mode", "service.mode", func() error {
			return s.SetService(ctx, history.ServiceLimits{Callee: "a", Mode: new(dropratio.Mode(9))}, alice)
		}},
		{"service callee", "service.callee", func() error { return s.SetService(ctx, history.ServiceLimits{}, alice) }},
		{"service no actor", "change.actor", func() error {
			return s.SetService(ctx, history.ServiceLimits{Callee: "a"}, history.Change{Reason: "r"})
		}},
		{"mode unknown", "mode", func() error {
			_, err := s.SetMode(ctx, history.Filter{Callee: "a"}, dropratio.Mode(2), alice)
			return err
		}},
		{"mode filter", "filter.caller", func() error {
			_, err := s.SetMode(ctx, history.Filter{Caller: "a/b"}, dropratio.Shadow, alice)
			return err
		}},
		{"mode no reason", "change.reason", func() error {
			_, err := s.SetMode(ctx, history.Filter{Callee: "a"}, dropratio.Shadow, history.Change{Actor: "a"})
			return err
		}},
	}
}

// invalidProposalCases propose, decide, and read proposals and the audit log.
func invalidProposalCases(ctx context.Context, s history.Store) []invalidCase {
	return []invalidCase{
		{"propose NaN", "proposals[0].proposed", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: ab, Proposed: math.NaN()}}, alice)
			return err
		}},
		{"propose current", "proposals[0].current", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: ab, Proposed: 1, Current: f64(-1)}}, alice)
			return err
		}},
		{"propose peak", "proposals[1].peak_recent", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: ab, Proposed: 1}, {Bucket: ac, Proposed: 1, PeakRecent: math.Inf(1)}}, alice)
			return err
		}},
		{"propose empty flag", "proposals[0].flags[1]", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: ab, Proposed: 1, Flags: []string{"x", ""}}}, alice)
			return err
		}},
		{"propose same bucket twice", "proposals[1].bucket", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: ab, Proposed: 1}, {Bucket: ab, Proposed: 2}}, alice)
			return err
		}},
		{"propose no actor", "change.actor", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: ab, Proposed: 1}}, history.Change{Reason: "r"})
			return err
		}},
		{"approve no reason", "change.reason", func() error { _, err := s.Approve(ctx, []int64{1}, history.Change{Actor: "a"}); return err }},
		{"reject no actor", "change.actor", func() error { _, err := s.Reject(ctx, []int64{1}, history.Change{Reason: "r"}); return err }},
		{"proposals status", "statuses[0]", func() error { _, err := s.Proposals(ctx, history.Filter{}, "open"); return err }},
		{"proposals filter", "filter.callee", func() error { _, err := s.Proposals(ctx, history.Filter{Callee: " "}); return err }},
		{"history note what", "notes[1].what", func() error {
			return s.AuditHistory(ctx, []history.HistoryNote{{Bucket: ab, What: "x"}, {Bucket: ac, What: " "}}, alice)
		}},
		{"history note bucket", "notes[0].caller", func() error {
			return s.AuditHistory(ctx, []history.HistoryNote{{Bucket: history.Bucket{Callee: "a"}, What: "x"}}, alice)
		}},
		{"history note no reason", "change.reason", func() error {
			return s.AuditHistory(ctx, []history.HistoryNote{{Bucket: ab, What: "x"}}, history.Change{Actor: "a"})
		}},
		{"audit limit", "limit", func() error { _, err := s.Audit(ctx, history.Filter{}, time.Time{}, -1); return err }},
		{"audit filter", "filter.caller", func() error { _, err := s.Audit(ctx, history.Filter{Caller: "x y"}, time.Time{}, 0); return err }},
	}
}

func testNotFound(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: ab, Limit: 1}, alice))
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"DeleteLimit of a bucket without a limit", func() error { return s.DeleteLimit(ctx, ac, alice) }},
		{"SetMode of an unknown callee", func() error {
			_, err := s.SetMode(ctx, history.Filter{Callee: "zz"}, dropratio.Shadow, alice)
			return err
		}},
		{"SetMode of an unknown bucket", func() error {
			_, err := s.SetMode(ctx, history.Filter{Callee: "a", Caller: "zz"}, dropratio.Shadow, alice)
			return err
		}},
		{"Approve of an unknown ID", func() error { _, err := s.Approve(ctx, []int64{42}, alice); return err }},
		{"Reject of an unknown ID", func() error { _, err := s.Reject(ctx, []int64{42}, alice); return err }},
	} {
		wantErr(t, tc.name, tc.call(), history.ErrNotFound, "")
	}
	eq(t, "audit entries", len(audit(t, s, history.Filter{})), 1)
}
