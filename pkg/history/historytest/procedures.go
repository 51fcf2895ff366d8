package historytest

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/routes"
)

// The buckets of a callee that declares procedures (issue #14): a caller's
// own bucket, its leaves, a procedure's own level, and a gRPC leaf.
var (
	cWeb     = history.Bucket{Callee: "checkout", Caller: "web"}
	cWebPay  = history.Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}
	cAnyPay  = history.Bucket{Callee: "checkout", Caller: history.AnyCaller, Procedure: "create-charge"}
	cWebGRPC = history.Bucket{Callee: "checkout", Caller: "web", Procedure: "/shop.Checkout/Pay"}
	cMobPay  = history.Bucket{Callee: "checkout", Caller: "mobile", Procedure: "create-charge"}
)

// Minute rows of one (callee, caller) pair's leaves and of a procedure's
// own level are buckets of their own: written, read and rolled up apart,
// selected by the procedure, and sorted by callee, caller, procedure.
func testProcedureMinutes(t *testing.T, s history.Store) {
	ctx := t.Context()
	rows := []history.MinuteRow{
		row(cWeb, minute(0, 0), 10, 9, 0),
		row(cWebPay, minute(0, 0), 4, 3, 1),
		row(cAnyPay, minute(0, 0), 7, 6, 1),
		row(cWebGRPC, minute(0, 0), 2, 2, 0),
		row(cMobPay, minute(0, 0), 3, 3, 0),
		row(cWebPay, minute(0, 1), 5, 4, 0),
	}
	must(t, s.WriteMinutes(ctx, rows))
	must(t, s.WriteMinutes(ctx, rows)) // idempotent per (callee, caller, procedure, minute)

	eq(t, "leaf minutes", minutes(t, s, cWebPay, day(0), day(1)), []history.MinuteRow{rows[1], rows[5]})
	eq(t, "procedure minutes", minutes(t, s, cAnyPay, day(0), day(1)), []history.MinuteRow{rows[2]})
	eq(t, "gRPC minutes", minutes(t, s, cWebGRPC, day(0), day(1)), []history.MinuteRow{rows[3]})
	eq(t, "caller minutes", minutes(t, s, cWeb, day(0), day(1)), []history.MinuteRow{rows[0]})

	keys := func(ds []history.DailyPeak) []history.Bucket {
		var out []history.Bucket
		for _, d := range ds {
			out = append(out, d.Bucket)
		}
		return out
	}
	// '*' sorts before every service name, "" before every procedure.
	eq(t, "callee", keys(dailyPeaks(t, s, history.Filter{Callee: "checkout"}, day(0), day(1))),
		[]history.Bucket{cAnyPay, cMobPay, cWeb, cWebGRPC, cWebPay})
	eq(t, "caller and its leaves", keys(dailyPeaks(t, s, history.Filter{Callee: "checkout", Caller: "web"}, day(0), day(1))),
		[]history.Bucket{cWeb, cWebGRPC, cWebPay})
	eq(t, "procedure", keys(dailyPeaks(t, s, history.Filter{Callee: "checkout", Procedure: "create-charge"}, day(0), day(1))),
		[]history.Bucket{cAnyPay, cMobPay, cWebPay})
	got := dailyPeaks(t, s, history.Filter{Callee: "checkout", Caller: history.AnyCaller, Procedure: "create-charge"}, day(0), day(1))
	eq(t, "procedure level", got, []history.DailyPeak{{Bucket: cAnyPay, Day: day(0), PeakOffered: 7, MeanOffered: 6, MeanDropped: 1, Minutes: 1}})
	leaf := dailyPeaks(t, s, history.Filter{Callee: "checkout", Caller: "web", Procedure: "create-charge"}, day(0), day(1))
	eq(t, "leaf rollup", leaf, []history.DailyPeak{{Bucket: cWebPay, Day: day(0), PeakOffered: 5, MeanOffered: 3.5, MeanDropped: 0.5, Minutes: 2}})
}

// A caller's limit, its leaves' and a procedure's capacity are limits of
// their own: set, deleted, proposed, approved and audited by their key.
func testProcedureLimits(t *testing.T, s history.Store) {
	ctx := t.Context()
	for _, l := range []history.BucketLimit{{Bucket: cWeb, Limit: 100}, {Bucket: cWebPay, Limit: 50}, {Bucket: cAnyPay, Limit: 200}, {Bucket: cWebGRPC, Limit: 30}} {
		must(t, s.SetLimit(ctx, l, alice))
	}
	var got []history.Bucket
	for _, l := range limits(t, s).Buckets {
		got = append(got, l.Bucket)
	}
	eq(t, "limits in key order", got, []history.Bucket{cAnyPay, cWeb, cWebGRPC, cWebPay})
	if l, _ := bucketLimit(t, s, cWebPay); l.Limit != 50 {
		t.Errorf("leaf limit %v, want 50", l.Limit)
	}

	must(t, s.DeleteLimit(ctx, cWebPay, bob))
	if _, ok := bucketLimit(t, s, cWebPay); ok {
		t.Error("leaf limit still there after DeleteLimit")
	}
	if l, ok := bucketLimit(t, s, cWeb); !ok || l.Limit != 100 {
		t.Errorf("caller limit %+v, %v after deleting its leaf's; want 100", l, ok)
	}
	wantErr(t, "delete again", s.DeleteLimit(ctx, cWebPay, bob), history.ErrNotFound, "")

	// One pending proposal per key: the leaf's, the caller's and the
	// procedure's are three.
	ps := propose(t, s, bob, proposal(cWeb, 120), proposal(cWebPay, 60), proposal(cAnyPay, 250))
	again := propose(t, s, bob, proposal(cWebPay, 65))
	pending, err := s.Proposals(ctx, history.Filter{Callee: "checkout"})
	must(t, err)
	eq(t, "pending", ids(pending), []int64{ps[2].ID, ps[0].ID, again[0].ID})
	leafOnly, err := s.Proposals(ctx, history.Filter{Callee: "checkout", Caller: "web", Procedure: "create-charge"}, history.Pending, history.Superseded)
	must(t, err)
	eq(t, "leaf proposals", ids(leafOnly), []int64{ps[1].ID, again[0].ID})

	_, err = s.Approve(ctx, []int64{again[0].ID, ps[2].ID}, alice)
	must(t, err)
	if l, ok := bucketLimit(t, s, cWebPay); !ok || l.Limit != 65 || l.Source != history.Derived {
		t.Errorf("approved leaf limit %+v, %v; want 65, derived", l, ok)
	}
	if l, ok := bucketLimit(t, s, cAnyPay); !ok || l.Limit != 250 {
		t.Errorf("approved procedure capacity %+v, %v; want 250", l, ok)
	}
	if l, _ := bucketLimit(t, s, cWeb); l.Limit != 100 {
		t.Errorf("caller limit %v after approving its leaf's, want 100 still", l.Limit)
	}

	// The audit log keeps the procedure, and the filter selects by it.
	es := audit(t, s, history.Filter{Callee: "checkout", Caller: history.AnyCaller, Procedure: "create-charge"})
	var actions []string
	for _, e := range es {
		if e.Bucket != cAnyPay {
			t.Errorf("audit entry %+v is not of %s", e, cAnyPay.Path())
		}
		actions = append(actions, e.Action)
	}
	eq(t, "procedure's audit", actions, []string{"approve", "propose", "set_limit"})

	// Shadowing a leaf shadows it alone; shadowing a caller, its own
	// limit alone (its leaves are enforced as it is).
	n, err := s.SetMode(ctx, history.Filter{Callee: "checkout", Caller: "web", Procedure: "create-charge"}, dropratio.Shadow, alice)
	must(t, err)
	eq(t, "leaf selected", n, 1)
	n, err = s.SetMode(ctx, history.Filter{Callee: "checkout", Caller: "web"}, dropratio.Enforce, alice)
	must(t, err)
	eq(t, "caller selected", n, 1)
	if l, _ := bucketLimit(t, s, cWebPay); *l.Mode != dropratio.Shadow {
		t.Errorf("leaf mode %v after switching its caller, want shadow still: the caller's own limit alone", *l.Mode)
	}
}

// testCallerModeWithoutLimit (issue 14): a caller with leaf limits and no
// limit of its own is in its callee's mode; switching it would rewrite
// its leaves' rows, which no one reads, and report success. SetMode of it
// changes nothing and names it, across callees too; with a limit of its
// own, it switches that alone.
func testCallerModeWithoutLimit(t *testing.T, s history.Store) {
	ctx := t.Context()
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: cWebPay, Limit: 50}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "orders", Caller: "web"}, Limit: 10}, alice))
	before := len(audit(t, s, history.Filter{}))
	for _, f := range []history.Filter{{Callee: "checkout", Caller: "web"}, {Caller: "web"}} {
		_, err := s.SetMode(ctx, f, dropratio.Shadow, bob)
		wantErr(t, "SetMode of "+f.String(), err, history.ErrNoCallerLimit, "checkout/web has no limit of its own")
	}
	if l, _ := bucketLimit(t, s, cWebPay); *l.Mode != dropratio.Enforce {
		t.Errorf("leaf mode %v, want enforce: nothing changes", *l.Mode)
	}
	eq(t, "audit entries after refused SetModes", len(audit(t, s, history.Filter{})), before)

	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: cWeb, Limit: 100}, alice))
	n, err := s.SetMode(ctx, history.Filter{Caller: "web"}, dropratio.Shadow, bob)
	must(t, err)
	eq(t, "web's own limits selected", n, 2)
	if l, _ := bucketLimit(t, s, cWeb); *l.Mode != dropratio.Shadow {
		t.Errorf("checkout/web mode %v, want shadow", *l.Mode)
	}
	if l, _ := bucketLimit(t, s, cWebPay); *l.Mode != dropratio.Enforce {
		t.Errorf("leaf mode %v, want enforce: its row is not its caller's", *l.Mode)
	}
}

// A callee's routes are kept whole and in order, checked as the sidecar
// compiles them, and audited.
func testRoutes(t *testing.T, s history.Store) {
	ctx := t.Context()
	rs := []routes.Route{
		{Pattern: "POST /v1/charges", Procedure: "create-charge"},
		{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
		{Pattern: "/v1/charges/*", Procedure: "create-charge"},
	}
	ch, err := s.Changes(ctx)
	must(t, err)
	must(t, s.SetRoutes(ctx, "checkout", rs, alice))
	waitSignal(t, ch, "SetRoutes")
	must(t, s.SetRoutes(ctx, "orders", rs[1:2], alice))
	eq(t, "routes", limits(t, s).Routes, []history.ServiceRoutes{{Callee: "checkout", Routes: rs}, {Callee: "orders", Routes: rs[1:2]}})

	shadowed := []routes.Route{{Pattern: "/v1/*", Procedure: "all"}, {Pattern: "GET /v1/items", Procedure: "items"}}
	wantErr(t, "shadowed", s.SetRoutes(ctx, "checkout", shadowed, bob), history.ErrInvalid, "shadowed")
	wantErr(t, "bad callee", s.SetRoutes(ctx, "a/b", rs, bob), history.ErrInvalid, "routes.callee")
	wantErr(t, "_other", s.SetRoutes(ctx, "checkout", []routes.Route{{Pattern: "/x", Procedure: "_other"}}, bob), history.ErrInvalid, "reserved")
	tooMany := make([]routes.Route, routes.MaxRoutes+1)
	for i := range tooMany {
		tooMany[i] = routes.Route{Pattern: "/r" + strconv.Itoa(i), Procedure: "p"}
	}
	wantErr(t, "too many", s.SetRoutes(ctx, "checkout", tooMany, bob), history.ErrInvalid, "MaxRoutes")
	eq(t, "routes after refusals", limits(t, s).Routes[0].Routes, rs)

	must(t, s.SetRoutes(ctx, "checkout", rs[:1], bob))
	must(t, s.SetRoutes(ctx, "orders", nil, bob))
	eq(t, "routes replaced and removed", limits(t, s).Routes, []history.ServiceRoutes{{Callee: "checkout", Routes: rs[:1]}})

	es := audit(t, s, history.Filter{Callee: "checkout"})
	if len(es) != 2 || es[0].Action != "set_routes" || es[0].Caller != "" || es[0].Procedure != "" {
		t.Fatalf("audit %+v, want two set_routes entries of the callee", es)
	}
	eq(t, "audit old", es[0].Old, "POST /v1/charges=create-charge, GET /v1/items/{id}=get-item, /v1/charges/*=create-charge")
	eq(t, "audit new", es[0].New, "POST /v1/charges=create-charge")
}

// invalidProcedureCases are keys that are no bucket.
func invalidProcedureCases(ctx context.Context, s history.Store) []invalidCase {
	at := minute(0, 0)
	return []invalidCase{
		{"any caller without procedure", "rows[0].caller", func() error {
			return s.WriteMinutes(ctx, []history.MinuteRow{row(history.Bucket{Callee: "a", Caller: history.AnyCaller}, at, 1, 1, 0)})
		}},
		{"bad procedure", "rows[0].procedure", func() error {
			return s.WriteMinutes(ctx, []history.MinuteRow{row(history.Bucket{Callee: "a", Caller: "b", Procedure: "a//b"}, at, 1, 1, 0)})
		}},
		{"procedure limit caller", "limit.caller", func() error {
			return s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "a", Caller: "**", Procedure: "p"}, Limit: 1}, alice)
		}},
		{"proposal procedure", "proposals[0].procedure", func() error {
			_, err := s.Propose(ctx, []history.Proposal{{Bucket: history.Bucket{Callee: "a", Caller: "b", Procedure: "p q"}, Proposed: 1}}, alice)
			return err
		}},
		{"filter procedure", "filter.procedure", func() error {
			_, err := s.Proposals(ctx, history.Filter{Procedure: "/x/"})
			return err
		}},
	}
}
