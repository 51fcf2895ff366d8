package history_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/history/historytest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// migrated returns the URL of a fresh, migrated database.
func migrated(t testing.TB) string {
	t.Helper()
	url := pgtest.URL(t)
	if _, err := history.Migrate(context.Background(), url); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return url
}

// open opens a store on url, closed when t ends.
func open(t testing.TB, url string) *history.Postgres {
	t.Helper()
	s, err := history.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestPostgres(t *testing.T) {
	historytest.Run(t, func(t *testing.T) history.Store { return open(t, migrated(t)) })
}

func TestMigrateFromEmpty(t *testing.T) {
	ctx := t.Context()
	url := pgtest.URL(t)
	applied, err := history.Migrate(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if want := history.SchemaVersions(); !slices.Equal(applied, want) || len(want) == 0 {
		t.Fatalf("applied %v, want every migration %v", applied, want)
	}
	s := open(t, url)
	var tables []string
	rows, err := s.Pool().Query(ctx, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"audit_log", "bucket_limits", "bucket_settings", "buckets", "daily_load", "minute_load", "proposals", "routes", "schema_migrations", "service_limits"}
	if !slices.Equal(tables, want) {
		t.Errorf("tables %v, want %v", tables, want)
	}

	again, err := history.Migrate(ctx, url)
	if err != nil || len(again) != 0 {
		t.Errorf("second Migrate applied %v, %v; want nothing", again, err)
	}
}

func TestMigrateConcurrently(t *testing.T) {
	url := pgtest.URL(t)
	const migrators = 4
	applied := make([][]string, migrators)
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	for i := range migrators {
		wg.Go(func() { applied[i], errs[i] = history.Migrate(t.Context(), url) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var total []string
	for _, a := range applied {
		total = append(total, a...)
	}
	if !slices.Equal(total, history.SchemaVersions()) {
		t.Errorf("migrators applied %v between them; want each migration exactly once", applied)
	}
	open(t, url) // the schema is current
}

func TestOpenChecksSchema(t *testing.T) {
	ctx := t.Context()
	url := pgtest.URL(t)
	if _, err := history.Open(ctx, url); !errors.Is(err, history.ErrSchemaTooOld) {
		t.Errorf("Open on an empty database: %v, want ErrSchemaTooOld", err)
	}

	url = migrated(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ('9999_from_the_future')`); err != nil {
		t.Fatal(err)
	}
	if _, err := history.Open(ctx, url); !errors.Is(err, history.ErrSchemaTooNew) {
		t.Errorf("Open on a newer schema: %v, want ErrSchemaTooNew", err)
	}
	if _, err := history.Migrate(ctx, url); !errors.Is(err, history.ErrSchemaTooNew) {
		t.Errorf("Migrate on a newer schema: %v, want ErrSchemaTooNew", err)
	}

	if _, err := conn.Exec(ctx, `DELETE FROM schema_migrations`); err != nil {
		t.Fatal(err)
	}
	if _, err := history.Open(ctx, url); !errors.Is(err, history.ErrSchemaTooOld) {
		t.Errorf("Open with a migration missing: %v, want ErrSchemaTooOld", err)
	}
}

func partitions(t *testing.T, s *history.Postgres) []string {
	t.Helper()
	rows, err := s.Pool().Query(t.Context(), `
		SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'minute_load'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestPartitionsCreatedAndRetained(t *testing.T) {
	ctx := t.Context()
	s := open(t, migrated(t))
	if got := partitions(t, s); len(got) != 0 {
		t.Fatalf("partitions before any write: %v", got)
	}
	day := time.Date(2026, 2, 27, 0, 0, 0, 0, time.UTC)
	var rows []history.MinuteRow
	for d := range 4 { // crosses a month end
		rows = append(rows, history.MinuteRow{
			Bucket: history.Bucket{Callee: "a", Caller: "b"},
			Minute: day.AddDate(0, 0, d).Add(23*time.Hour + 59*time.Minute), PeakOffered: 1, MeanOffered: 1,
		})
	}
	if err := s.WriteMinutes(ctx, rows); err != nil {
		t.Fatal(err)
	}
	want := []string{"minute_load_p20260227", "minute_load_p20260228", "minute_load_p20260301", "minute_load_p20260302"}
	if got := partitions(t, s); !slices.Equal(got, want) {
		t.Fatalf("partitions %v, want %v", got, want)
	}
	// Each row went to its day's partition.
	var n int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM minute_load_p20260228`).Scan(&n); err != nil || n != 1 {
		t.Errorf("rows in minute_load_p20260228: %d, %v; want 1", n, err)
	}

	dropped, err := s.Retain(ctx, day.AddDate(0, 0, 2))
	if err != nil || dropped != 2 {
		t.Fatalf("Retain = %d, %v; want 2 days", dropped, err)
	}
	if got := partitions(t, s); !slices.Equal(got, want[2:]) {
		t.Errorf("partitions after Retain %v, want %v", got, want[2:])
	}

	// A second store (another process) dropped a partition this one
	// thinks it has: the write finds out and creates it again.
	other := open(t, s.Pool().Config().ConnString())
	if _, err := other.Retain(ctx, day.AddDate(0, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteMinutes(ctx, rows[3:]); err != nil {
		t.Fatalf("write after another store dropped the partition: %v", err)
	}
	if got := partitions(t, s); !slices.Equal(got, want[3:]) {
		t.Errorf("partitions %v, want %v", got, want[3:])
	}
}

func TestAuditLogIsAppendOnly(t *testing.T) {
	ctx := t.Context()
	s := open(t, migrated(t))
	c := history.Change{Actor: "alice", Reason: "test"}
	if err := s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "a", Caller: "b"}, Limit: 1}, c); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`UPDATE audit_log SET actor = 'mallory'`,
		`DELETE FROM audit_log`,
		`TRUNCATE audit_log`,
	} {
		_, err := s.Pool().Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "append-only") {
			t.Errorf("%s: %v, want refused as append-only", sql, err)
		}
	}
	es, err := s.Audit(ctx, history.Filter{}, time.Time{}, 0)
	if err != nil || len(es) != 1 || es[0].Actor != "alice" {
		t.Errorf("audit log after the attempts: %+v, %v", es, err)
	}
}

func TestNotifyCarriesNothingUncommitted(t *testing.T) {
	// A change that fails (here: refused as not found) must not announce
	// anything: the notification is part of the transaction. A second
	// listener that did hear something would fail the ordering below.
	ctx := t.Context()
	url := migrated(t)
	s := open(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `LISTEN sluice_limits`); err != nil {
		t.Fatal(err)
	}
	c := history.Change{Actor: "alice", Reason: "test"}
	if err := s.DeleteLimit(ctx, history.Bucket{Callee: "a", Caller: "b"}, c); !errors.Is(err, history.ErrNotFound) {
		t.Fatalf("DeleteLimit: %v", err)
	}
	if err := s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "a", Caller: "b"}, Limit: 1}, c); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload != "set_limit" {
		t.Errorf("first notification %q, want the committed set_limit (the failed delete_limit must not notify)", n.Payload)
	}
}

// TestSurvivesServerRestart stops and starts Postgres under a store with a
// live Changes subscription: the subscription reconnects and signals, and
// the pool serves again.
func TestSurvivesServerRestart(t *testing.T) {
	ctx := t.Context()
	s := open(t, migrated(t))
	ch, err := s.Changes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := history.Change{Actor: "alice", Reason: "test"}
	b := history.Bucket{Callee: "a", Caller: "b"}
	if err := s.SetLimit(ctx, history.BucketLimit{Bucket: b, Limit: 1}, c); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, ch, "SetLimit before the restart")

	pgtest.StopServer(t)
	if _, err := s.Limits(ctx); err == nil {
		t.Fatal("Limits succeeded with the server down")
	}
	pgtest.StartServer(t)

	// Changes may have been missed while the server was down: the
	// listener says so once it is back.
	waitSignal(t, ch, "the restart")

	// The pool drops its dead connections and serves again. A call may
	// still meet a connection that died with the server; the controller
	// retries, and so does this test, until a deadline.
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	retry := time.NewTicker(50 * time.Millisecond) // paces retries; nothing waits on it
	defer retry.Stop()
	for attempt := 1; ; attempt++ {
		err := s.SetLimit(ctx, history.BucketLimit{Bucket: b, Limit: 2}, c)
		if err == nil {
			t.Logf("the pool served again at attempt %d", attempt)
			break
		}
		select {
		case <-deadline.C:
			t.Fatalf("the pool did not recover within 30s: %v", err)
		case <-retry.C:
		}
	}
	waitSignal(t, ch, "SetLimit after the restart")
	l, err := s.Limits(ctx)
	if err != nil || len(l.Buckets) != 1 || l.Buckets[0].Limit != 2 {
		t.Fatalf("limits after the restart: %+v, %v", l, err)
	}
}

// TestStoresShareBuckets: a store that starts cold (another process, a
// restart) finds the bucket numbers another store made, and numbers only
// buckets that are new.
func TestStoresShareBuckets(t *testing.T) {
	ctx := t.Context()
	url := migrated(t)
	first, second := open(t, url), open(t, url)
	day := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	ab, ac := history.Bucket{Callee: "a", Caller: "b"}, history.Bucket{Callee: "a", Caller: "c"}
	write := func(s *history.Postgres, b history.Bucket, minute int) {
		t.Helper()
		r := history.MinuteRow{Bucket: b, Minute: day.Add(time.Duration(minute) * time.Minute), PeakOffered: 2, MeanOffered: 1}
		if err := s.WriteMinutes(ctx, []history.MinuteRow{r}); err != nil {
			t.Fatal(err)
		}
	}
	write(first, ab, 0)
	write(second, ab, 1) // known to the database, not to second
	write(second, ac, 0) // new
	write(first, ac, 1)

	for _, s := range []*history.Postgres{first, second} {
		ds, err := s.DailyPeaks(ctx, history.Filter{}, day, day.AddDate(0, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 2 || ds[0].Bucket != ab || ds[0].Minutes != 2 || ds[1].Bucket != ac || ds[1].Minutes != 2 {
			t.Errorf("daily peaks: %+v; want a/b and a/c with 2 minutes each", ds)
		}
		ms, err := s.Minutes(ctx, ac, day, day.AddDate(0, 0, 1))
		if err != nil || len(ms) != 2 {
			t.Errorf("minutes of a/c: %+v, %v; want 2", ms, err)
		}
	}
	var n, maxID int
	if err := first.Pool().QueryRow(ctx, `SELECT count(*), max(id) FROM buckets`).Scan(&n, &maxID); err != nil {
		t.Fatal(err)
	}
	if n != 2 || maxID != 2 {
		t.Errorf("buckets: %d numbered up to %d; want 2 numbered 1 and 2 (none used up by known buckets)", n, maxID)
	}
}

func waitSignal(t *testing.T, ch <-chan struct{}, after string) {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("after %s: Changes channel closed", after)
		}
	case <-timer.C:
		t.Fatalf("after %s: no Changes signal within 30s", after)
	}
}

// A row holding a setting this binary can not read (a newer binary's fail
// mode, say, once its migration widened the column's check) is an error
// naming the row and the column, never a default: an unknown fail mode must
// not be read as open.
func TestUnknownStoredSettingIsAnError(t *testing.T) {
	ctx := t.Context()
	s := open(t, migrated(t))
	c := history.Change{Actor: "test", Reason: "test"}
	if err := s.SetService(ctx, history.ServiceLimits{Callee: "checkout"}, c); err != nil {
		t.Fatal(err)
	}
	if err := s.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 1}, c); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`ALTER TABLE service_limits DROP CONSTRAINT service_limits_fail_mode_check`,
		`UPDATE service_limits SET fail_mode = 'closed'`,
		`ALTER TABLE bucket_limits DROP CONSTRAINT bucket_limits_mode_check`,
		`UPDATE bucket_limits SET mode = 'loud'`,
	} {
		if _, err := s.Pool().Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	l, err := s.Limits(ctx)
	if err == nil {
		t.Fatalf("Limits() = %+v, want an error", l)
	}
	if want := `service_limits row checkout: fail_mode: "closed" is not open, hold or local`; !strings.Contains(err.Error(), want) {
		t.Errorf("Limits(): %v\nwant it to say %s", err, want)
	}
	if _, err := s.Pool().Exec(ctx, `UPDATE service_limits SET fail_mode = 'hold'`); err != nil {
		t.Fatal(err)
	}
	if l, err = s.Limits(ctx); err == nil || !strings.Contains(err.Error(), `bucket_limits row checkout/web: mode: "loud" is not enforce or shadow`) {
		t.Errorf("Limits() = %+v, %v; want an error naming bucket_limits row checkout/web and its mode", l, err)
	}
	_, err = s.SetMode(ctx, history.Filter{Callee: "checkout"}, dropratio.Shadow, c)
	if err == nil || !strings.Contains(err.Error(), `bucket_limits row checkout/web: mode: "loud"`) {
		t.Errorf("SetMode over the unreadable row: %v, want an error naming it", err)
	}
}
