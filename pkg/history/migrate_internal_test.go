package history

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// These tests play binaries of other versions by handing the migration
// runner and the schema check a shorter list of migrations (an older
// binary) or a longer one (a newer binary), against a real Postgres.

func allMigrations(t *testing.T) []migration {
	t.Helper()
	ms, err := loadMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 2 {
		t.Fatalf("want at least two migrations to play an older binary, have %d", len(ms))
	}
	return ms
}

// logTo returns options whose logger writes text to buf.
func logTo(buf *bytes.Buffer) options {
	return newOptions([]Option{WithLogger(slog.New(slog.NewTextHandler(buf, nil)))})
}

func mustMigrate(t *testing.T, url string, ms []migration) []string {
	t.Helper()
	applied, err := migrate(t.Context(), url, ms, newOptions(nil))
	if err != nil {
		t.Fatalf("migrate with %s: %v", latest(ms), err)
	}
	return applied
}

func TestEveryMigrationDeclaresOlderBinaries(t *testing.T) {
	ms := allMigrations(t)
	for v := range olderBinaries {
		if !slices.ContainsFunc(ms, func(m migration) bool { return m.version == v }) {
			t.Errorf("olderBinaries declares %s, which is no migration", v)
		}
	}
	// What docs/operations.md ("Rollback") says of each.
	want := map[string]bool{"0001_init": false, "0002_enforcement": true, "0003_procedures": false, "0004_tiers_cost": false, "0005_cost_history": true, "0006_burst_payback": true, "0007_slo": true}
	for v, ok := range want {
		if olderBinaries[v] != ok {
			t.Errorf("%s: older binaries may run = %v; docs/operations.md says %v", v, olderBinaries[v], ok)
		}
	}
}

// An older binary on a schema newer by a migration that lets it run: it
// opens with a warning naming both versions, and its migrate changes nothing.
func TestOlderBinaryOnCompatibleSchema(t *testing.T) {
	ctx := t.Context()
	ms := allMigrations(t)
	url := pgtest.URL(t)
	mustMigrate(t, url, ms)
	older := ms[:len(ms)-1]
	if !ms[len(ms)-1].olderMayRun {
		// The newest real migration is incompatible: add a compatible one.
		older = ms
		ms = append(slices.Clone(ms), migration{version: "9000_compatible_test", sql: `CREATE TABLE compat_test (x int)`, olderMayRun: true})
		mustMigrate(t, url, ms)
	}

	var log bytes.Buffer
	s, err := open(ctx, url, older, logTo(&log))
	if err != nil {
		t.Fatalf("older binary (%s) on a compatible newer schema (%s): %v", latest(older), latest(ms), err)
	}
	s.Close()
	got := log.String()
	for _, want := range []string{"level=WARN", "binary_schema=" + latest(older), "database_schema=" + latest(ms), "newer_migrations=" + latest(ms)} {
		if !strings.Contains(got, want) {
			t.Errorf("open's log lacks %q:\n%s", want, got)
		}
	}

	log.Reset()
	applied, err := migrate(ctx, url, older, logTo(&log))
	if err != nil || len(applied) != 0 {
		t.Errorf("older binary's migrate on a compatible newer schema: applied %v, %v; want nothing, no error", applied, err)
	}
	if !strings.Contains(log.String(), "database_schema="+latest(ms)) {
		t.Errorf("older binary's migrate did not warn:\n%s", log.String())
	}
}

// An older binary on a schema newer by a migration that does not let it
// run: refused, naming the migration and what to do.
func TestOlderBinaryOnIncompatibleSchema(t *testing.T) {
	ctx := t.Context()
	ms := allMigrations(t)
	url := pgtest.URL(t)
	newer := append(slices.Clone(ms), migration{
		version:     "9000_incompatible_test",
		sql:         `ALTER TABLE bucket_limits RENAME COLUMN reason TO why`,
		olderMayRun: false,
	})
	mustMigrate(t, url, newer)

	for name, run := range map[string]func() error{
		"open": func() error {
			s, err := open(ctx, url, ms, newOptions(nil))
			if err == nil {
				s.Close()
			}
			return err
		},
		"migrate": func() error { _, err := migrate(ctx, url, ms, newOptions(nil)); return err },
	} {
		err := run()
		if !errors.Is(err, ErrSchemaTooNew) {
			t.Errorf("%s of an older binary on an incompatible newer schema: %v, want ErrSchemaTooNew", name, err)
			continue
		}
		for _, want := range []string{"9000_incompatible_test", "older binaries may not run on", latest(ms), "run a binary that has it"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q lacks %q", name, err, want)
			}
		}
	}
}

// A newer binary on an older schema: refused, saying to run migrate; and
// migrate then brings it up to date.
func TestNewerBinaryOnOlderSchema(t *testing.T) {
	ctx := t.Context()
	ms := allMigrations(t)
	url := pgtest.URL(t)
	mustMigrate(t, url, ms[:1])

	_, err := open(ctx, url, ms, newOptions(nil))
	if !errors.Is(err, ErrSchemaTooOld) {
		t.Fatalf("newer binary on an older schema: %v, want ErrSchemaTooOld", err)
	}
	for _, want := range []string{ms[1].version, "migrate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if applied := mustMigrate(t, url, ms); !slices.Equal(applied, versions(asApplied(ms[1:]))) {
		t.Errorf("migrate applied %v, want %v", applied, ms[1:])
	}
	s, err := open(ctx, url, ms, newOptions(nil))
	if err != nil {
		t.Fatalf("open after migrate: %v", err)
	}
	s.Close()
}

func asApplied(ms []migration) []appliedMigration {
	out := make([]appliedMigration, len(ms))
	for i, m := range ms {
		out[i] = appliedMigration{version: m.version}
	}
	return out
}

// A database migrated before schema_migrations recorded compatibility: an
// older binary must not guess, so it refuses; the next migrate records what
// it knows, and then the older binary may run.
func TestCompatibilityRecordedForEarlierMigrations(t *testing.T) {
	ctx := t.Context()
	ms := allMigrations(t)
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// What the runner did before the column: version only.
	if _, err := conn.Exec(ctx, `CREATE TABLE schema_migrations (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if _, err := conn.Exec(ctx, m.sql); err != nil {
			t.Fatalf("apply %s: %v", m.version, err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, m.version); err != nil {
			t.Fatal(err)
		}
	}

	// The current binary runs on it as it is: it knows every migration.
	s, err := open(ctx, url, ms, newOptions(nil))
	if err != nil {
		t.Fatalf("current binary on a schema migrated by the old runner: %v", err)
	}
	s.Close()
	older := ms[:len(ms)-1]
	if _, err := open(ctx, url, older, newOptions(nil)); !errors.Is(err, ErrSchemaTooNew) || !strings.Contains(err.Error(), "does not record") {
		t.Errorf("older binary, compatibility not recorded: %v, want ErrSchemaTooNew saying it is not recorded", err)
	}

	if applied := mustMigrate(t, url, ms); len(applied) != 0 {
		t.Errorf("migrate applied %v; want nothing, only the column", applied)
	}
	rows, err := conn.Query(ctx, `SELECT version, older_binaries_may_run FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (migration, error) {
		var m migration
		return m, r.Scan(&m.version, &m.olderMayRun)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ms {
		ms[i].sql = ""
	}
	if !slices.Equal(got, ms) {
		t.Errorf("schema_migrations after migrate: %+v, want %+v", got, ms)
	}
	if ms[len(ms)-1].olderMayRun {
		s, err := open(ctx, url, older, newOptions(nil))
		if err != nil {
			t.Fatalf("older binary once compatibility is recorded: %v", err)
		}
		s.Close()
	}
}
