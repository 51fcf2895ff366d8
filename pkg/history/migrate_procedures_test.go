package history

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// A database at 0002_enforcement, with the rows a binary of that schema
// writes, upgrades to procedures: every old row reads back as the bucket it
// was, with procedure "", and the new keys live beside it.
func TestMigrateProceduresKeepsOldRows(t *testing.T) {
	ctx := t.Context()
	ms := allMigrations(t)
	i := indexOf(t, ms, "0003_procedures")
	url := pgtest.URL(t)
	mustMigrate(t, url, ms[:i])

	// What a 0002 binary's store wrote (its SQL, as this binary's store
	// can not write a schema it does not have): a bucket's number and its
	// minute, its daily rollup, a limit, a pending proposal, audit entries.
	day := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	web := Bucket{Callee: "checkout", Caller: "web"}
	conn, err := pgx.Connect(ctx, url)
	must(t, err)
	var oldID int64
	for _, sql := range []string{
		`INSERT INTO buckets (callee, caller) VALUES ('checkout', 'web')`,
		`CREATE TABLE minute_load_p20260302 PARTITION OF minute_load FOR VALUES FROM ('2026-03-02 00:00:00+00') TO ('2026-03-03 00:00:00+00')`,
		`INSERT INTO minute_load SELECT id, '2026-03-02 00:00:00+00', 9, 8, 1 FROM buckets`,
		`INSERT INTO daily_load SELECT id, '2026-03-02', 9, 8, 1, 1 FROM buckets`,
		`INSERT INTO bucket_limits (callee, caller, limit_rps, mode, source, updated_by, reason, updated_at)
			VALUES ('checkout', 'web', 100, 'enforce', 'manual', 'alice', 'before', now())`,
		`INSERT INTO audit_log (at, actor, action, callee, caller, new_value, reason)
			VALUES (now(), 'alice', 'set_limit', 'checkout', 'web', '100 rps, enforce, manual', 'before')`,
	} {
		_, err := conn.Exec(ctx, sql)
		must(t, err)
	}
	must(t, conn.QueryRow(ctx, `INSERT INTO proposals (callee, caller, proposed, peak_lookback, peak_recent, status, created_by, created_at)
		VALUES ('checkout', 'web', 120, 96, 90, 'pending', 'bob', now()) RETURNING id`).Scan(&oldID))
	must(t, conn.Close(ctx))

	if applied := mustMigrate(t, url, ms); len(applied) != len(ms)-i || applied[0] != "0003_procedures" {
		t.Fatalf("migrate applied %v, want 0003_procedures and on", applied)
	}
	s, err := open(ctx, url, ms, newOptions(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	rows, err := s.Minutes(ctx, web, day, day.Add(time.Hour))
	must(t, err)
	if len(rows) != 1 || rows[0].Bucket != web || rows[0].PeakOffered != 9 {
		t.Errorf("old minute rows %+v, want the one of %s", rows, web.Path())
	}
	peaks, err := s.DailyPeaks(ctx, Filter{Callee: "checkout"}, day, day.AddDate(0, 0, 1))
	must(t, err)
	if len(peaks) != 1 || peaks[0].Bucket != web || peaks[0].Minutes != 1 {
		t.Errorf("old daily peaks %+v, want one day of %s", peaks, web.Path())
	}
	l, err := s.Limits(ctx)
	must(t, err)
	if len(l.Buckets) != 1 || l.Buckets[0].Bucket != web || l.Buckets[0].Limit != 100 {
		t.Errorf("old limits %+v, want %s at 100", l.Buckets, web.Path())
	}
	es, err := s.Audit(ctx, Filter{}, time.Time{}, 0)
	must(t, err)
	for _, e := range es {
		if e.Procedure != "" || e.Callee != "checkout" || e.Caller != "web" {
			t.Errorf("old audit entry %+v, want checkout/web with no procedure", e)
		}
	}

	// The old bucket's number serves; a leaf and the procedure's level get
	// their own; the old pending proposal and a leaf's are both pending,
	// and approving the old one sets the caller's limit, not a leaf's.
	leaf := Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}
	level := Bucket{Callee: "checkout", Caller: AnyCaller, Procedure: "create-charge"}
	must(t, s.WriteMinutes(ctx, []MinuteRow{
		{Bucket: web, Minute: day.Add(time.Minute), PeakOffered: 5, MeanOffered: 5},
		{Bucket: leaf, Minute: day, PeakOffered: 4, MeanOffered: 3},
		{Bucket: level, Minute: day, PeakOffered: 6, MeanOffered: 5},
	}))
	var nbuckets int
	must(t, s.Pool().QueryRow(ctx, `SELECT count(*) FROM buckets`).Scan(&nbuckets))
	if nbuckets != 3 {
		t.Errorf("%d buckets, want 3: the old one reused, a leaf and a procedure level", nbuckets)
	}
	_, err = s.Propose(ctx, []Proposal{{Bucket: leaf, Proposed: 50, PeakLookback: 40, PeakRecent: 40}}, Change{Actor: "bob", Reason: "derive"})
	must(t, err)
	pending, err := s.Proposals(ctx, Filter{Callee: "checkout"})
	must(t, err)
	if len(pending) != 2 || pending[0].ID != oldID || pending[1].Bucket != leaf {
		t.Errorf("pending %+v, want the old proposal and the leaf's", pending)
	}
	_, err = s.Approve(ctx, []int64{oldID}, Change{Actor: "carol", Reason: "after"})
	must(t, err)
	l, err = s.Limits(ctx)
	must(t, err)
	if len(l.Buckets) != 1 || l.Buckets[0].Bucket != web || l.Buckets[0].Limit != 120 {
		t.Errorf("limits after approving the old proposal %+v, want %s at 120", l.Buckets, web.Path())
	}
}

func indexOf(t *testing.T, ms []migration, version string) int {
	t.Helper()
	for i, m := range ms {
		if m.version == version {
			return i
		}
	}
	t.Fatalf("no migration %s", version)
	return -1
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
