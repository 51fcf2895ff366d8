package historytest

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/history"
)

// A limit's burst and payback (issue #17) are kept with it: nil in
// SetLimit keeps them, an approved proposal keeps them, they are audited,
// and a limit without them reads 0.
func testBurstPayback(t *testing.T, s history.Store) {
	ctx := t.Context()
	web := history.Bucket{Callee: "checkout", Caller: "web"}
	ten := 10 * time.Second
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: web, Limit: 1000, Burst: f64(2000), Payback: &ten}, alice))
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "batch"}, Limit: 50}, alice))
	check := func(what string, burst float64, payback time.Duration) {
		t.Helper()
		for _, l := range limits(t, s).Buckets {
			if l.Bucket != web {
				if *l.Burst != 0 || *l.Payback != 0 {
					t.Errorf("%s: %s has burst %v, payback %v; want none", what, l.Path(), *l.Burst, *l.Payback)
				}
				continue
			}
			if l.Burst == nil || l.Payback == nil || *l.Burst != burst || *l.Payback != payback {
				t.Errorf("%s: web burst %v, payback %v; want %v, %v", what, l.Burst, l.Payback, burst, payback)
			}
		}
	}
	check("set", 2000, ten)
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: web, Limit: 1200}, bob))
	check("set without them", 2000, ten)
	ps := propose(t, s, alice, proposal(web, 1500))
	_, err := s.Approve(ctx, ids(ps), bob)
	must(t, err)
	check("approved", 2000, ten)
	must(t, s.SetLimit(ctx, history.BucketLimit{Bucket: web, Limit: 1500, Burst: f64(0), Payback: new(time.Duration)}, bob))
	check("set to 0", 0, 0)
	es := entries(audit(t, s, history.Filter{Callee: "checkout", Caller: "web"}))
	if len(es) < 2 || es[len(es)-1].New != "1000 rps, enforce, manual, burst 2000, payback 10s" {
		t.Errorf("audit %+v: want the first set_limit to render its burst and payback", es)
	}
	for _, bad := range []history.BucketLimit{
		{Bucket: web, Limit: 1, Burst: f64(-1)},
		{Bucket: web, Limit: 1, Payback: new(-time.Second)},
		{Bucket: web, Limit: 1, Payback: new(2 * time.Hour)},
	} {
		if err := s.SetLimit(ctx, bad, alice); !errors.Is(err, history.ErrInvalid) {
			t.Errorf("SetLimit(burst %v, payback %v) = %v, want ErrInvalid", bad.Burst, bad.Payback, err)
		}
	}
}
