package history

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// migrations are the schema's forward-only steps, applied in name order. A
// released file is never edited: a change is a new file.
//
//go:embed migrations/*.sql
var migrations embed.FS

// Advisory lock keys, (namespace, key), so that sluice's locks can not
// collide with another application's in the same database.
const (
	lockNamespace  = 0x736c7563 // "sluc"
	lockMigrate    = 1          // session lock: one migrator at a time
	lockPartitions = 2          // xact lock: creating and dropping minute_load partitions
	lockLimits     = 3          // xact lock: limit, proposal and audit changes, one at a time
)

type migration struct {
	version string // file name without ".sql", e.g. "0001_init"
	sql     string
	// olderMayRun says whether binaries built before this migration may
	// keep running on a database that has it: true for additive changes
	// (new tables, new columns that are nullable or have a default, new
	// indexes), which an older binary neither reads nor has to write; false
	// for anything an older binary would trip over (a renamed or dropped
	// column, a new NOT NULL column without a default, a changed meaning).
	olderMayRun bool
}

// olderBinaries is every migration's declaration of olderMayRun, kept here
// rather than in the SQL files because released files are never edited.
// A migration without an entry fails loadMigrations, and so every test:
// the question must be answered when the migration is written.
var olderBinaries = map[string]bool{
	// The schema itself: no binary that uses the store predates it.
	"0001_init": false,
	// Two columns with a default; older binaries neither read nor write
	// them, and the rows they insert get 'sidecar'. They do ignore the
	// column: a bucket declared upstream is enforced by the callee's
	// sidecar under them (docs/operations.md, "Rollback").
	"0002_enforcement": true,
	// The procedure joins the keys of bucket_limits and proposals: an
	// older binary's upserts name a conflict target, (callee, caller), that
	// is no longer unique, and it would read a leaf's limit or a
	// procedure's capacity as a caller's limit.
	"0003_procedures": false,
	// Tiers, cost units and caps: an older binary would ignore them, and
	// count requests of a callee whose limits are in cost units, and shed
	// every tier alike: a changed meaning.
	"0004_tiers_cost": false,
	// Nullable columns and columns with a default: older binaries name
	// the columns they write and read, and their rows have no cost.
	"0005_cost_history": true,
	// Columns with a default of 0; older binaries neither read nor write
	// them, and their upserts leave them as they are. Under an older
	// binary a limit's burst and payback are ignored: it enforces the
	// tightest edge and pays nothing back, the defaults.
	"0006_burst_payback": true,
	// Columns with a default of 0; older binaries neither read nor write
	// them. Under an older binary a callee's objective is ignored: it is
	// limited by its written capacity alone, as before objectives.
	"0007_slo": true,
}

// loadMigrations reads the embedded migrations, sorted by version.
func loadMigrations() ([]migration, error) {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	out := make([]migration, 0, len(files))
	for _, f := range files {
		b, err := migrations.ReadFile(f)
		if err != nil {
			return nil, err
		}
		v := strings.TrimSuffix(path.Base(f), ".sql")
		ok, declared := olderBinaries[v]
		if !declared {
			return nil, fmt.Errorf("migration %s does not declare whether older binaries may run on it (olderBinaries in migrate.go)", v)
		}
		out = append(out, migration{version: v, sql: string(b), olderMayRun: ok})
	}
	return out, nil
}

// SchemaVersions returns the versions of every migration this binary has,
// in order; the last is the schema version it needs.
func SchemaVersions() []string {
	ms, err := loadMigrations()
	if err != nil {
		panic(err) // embedded at build time: can not fail at run time
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.version
	}
	return out
}

// Migrate brings the database at url to this binary's schema and returns
// the versions it applied, none when the schema was current. Each migration
// runs in its own transaction, recorded in schema_migrations with whether
// binaries older than it may run on it (see olderBinaries). It holds an
// advisory lock throughout, so two migrators at once are safe: the second
// waits, then finds nothing to do.
//
// A database with migrations this binary does not know is left alone when
// every one of them lets older binaries run (logged as a warning, WithLogger)
// and refused with ErrSchemaTooNew otherwise.
func Migrate(ctx context.Context, url string, opts ...Option) (applied []string, err error) {
	ms, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	return migrate(ctx, url, ms, newOptions(opts))
}

// migrate is Migrate with the migrations of a binary: the tests pass a
// shorter list to play an older binary, or a longer one to play a newer.
func migrate(ctx context.Context, url string, ms []migration, o options) (applied []string, err error) {
	// One connection, not a pool: the advisory lock belongs to a session.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, $2)`, lockNamespace, lockMigrate); err != nil {
		return nil, fmt.Errorf("migrate: take the migration lock: %w", err)
	}
	// Closing the session releases the lock too; unlocking first lets the
	// next migrator go without waiting for the disconnect.
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, $2)`, lockNamespace, lockMigrate)

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    text PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	if err := recordCompatibility(ctx, conn, ms); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	done, err := appliedMigrations(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	newer, err := checkNewer(done, ms)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if len(newer) > 0 {
		// Applying an older migration on top of newer ones would be a
		// path no binary was tested on.
		if missing := missingVersions(done, ms); len(missing) > 0 {
			return nil, fmt.Errorf("migrate: the database has migrations %v, newer than this binary, but lacks %v: migrate with the newest binary: %w",
				versions(newer), missing, ErrSchemaTooNew)
		}
		warnNewer(o, ms, newer)
		return nil, nil
	}
	for _, m := range ms {
		if slices.ContainsFunc(done, func(a appliedMigration) bool { return a.version == m.version }) {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, older_binaries_may_run) VALUES ($1, $2)`, m.version, m.olderMayRun)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate: apply %s: %w", m.version, err)
		}
		applied = append(applied, m.version)
	}
	return applied, nil
}

// compatColumn records, per applied migration, whether binaries that
// predate it may run on the database. It is what lets an older binary, which
// can not know a newer migration, decide from the database alone. NULL is
// "not recorded" (the migration was applied by a binary from before the
// column, and this binary does not know it either), and counts as no.
const compatColumn = "older_binaries_may_run"

// recordCompatibility adds compatColumn to schema_migrations if it is
// missing, and fills it in for the migrations this binary knows. Adding a
// nullable column is itself a change older binaries tolerate: they insert
// only version and read only version. Caller holds the migration lock.
func recordCompatibility(ctx context.Context, conn *pgx.Conn, ms []migration) error {
	var has bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = 'schema_migrations'::regclass AND attname = $1 AND NOT attisdropped)`, compatColumn).Scan(&has)
	if err != nil {
		return fmt.Errorf("read schema_migrations columns: %w", err)
	}
	if !has {
		// Checked first so that a current database is not locked
		// exclusively, however briefly, on every migrate.
		if _, err := conn.Exec(ctx, `ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS `+compatColumn+` boolean`); err != nil {
			return fmt.Errorf("add schema_migrations.%s: %w", compatColumn, err)
		}
		if _, err := conn.Exec(ctx, `COMMENT ON COLUMN schema_migrations.`+compatColumn+` IS
			'may binaries built before this migration run on the database? NULL: not recorded, taken as no'`); err != nil {
			return fmt.Errorf("comment schema_migrations.%s: %w", compatColumn, err)
		}
	}
	vs, oks := make([]string, len(ms)), make([]bool, len(ms))
	for i, m := range ms {
		vs[i], oks[i] = m.version, m.olderMayRun
	}
	// Only NULLs: a declaration never changes once released, and a newer
	// binary knows better than this one about its own migrations.
	if _, err := conn.Exec(ctx, `UPDATE schema_migrations s SET `+compatColumn+` = u.ok
		FROM unnest($1::text[], $2::bool[]) AS u(version, ok)
		WHERE s.version = u.version AND s.`+compatColumn+` IS NULL`, vs, oks); err != nil {
		return fmt.Errorf("record schema_migrations.%s: %w", compatColumn, err)
	}
	return nil
}

// querier is what both a connection and a pool can do.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// appliedMigration is a row of schema_migrations.
type appliedMigration struct {
	version     string
	olderMayRun *bool // nil: not recorded
}

// appliedMigrations reads schema_migrations, in version order. A table
// from before compatColumn reads as if every row were NULL there.
func appliedMigrations(ctx context.Context, q querier) ([]appliedMigration, error) {
	read := func(sql string) ([]appliedMigration, error) {
		rows, err := q.Query(ctx, sql)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (appliedMigration, error) {
			var a appliedMigration
			err := r.Scan(&a.version, &a.olderMayRun)
			return a, err
		})
	}
	out, err := read(`SELECT version, ` + compatColumn + ` FROM schema_migrations ORDER BY version`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column: no migrate since the column came
		out, err = read(`SELECT version, NULL::boolean FROM schema_migrations ORDER BY version`)
	}
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return out, nil
}

// checkNewer returns the migrations the database has and ms lacks: none, or
// only ones that let older binaries run. Otherwise it refuses with
// ErrSchemaTooNew, naming each migration that does not and what to do.
func checkNewer(done []appliedMigration, ms []migration) ([]appliedMigration, error) {
	var newer []appliedMigration
	var refuse []string
	for _, a := range done {
		if slices.ContainsFunc(ms, func(m migration) bool { return m.version == a.version }) {
			continue
		}
		newer = append(newer, a)
		switch {
		case a.olderMayRun == nil:
			refuse = append(refuse, a.version+" (which does not record whether older binaries may run on it)")
		case !*a.olderMayRun:
			refuse = append(refuse, a.version+" (which older binaries may not run on)")
		}
	}
	if len(refuse) == 0 {
		return newer, nil
	}
	return nil, fmt.Errorf("database has migration %s, newer than this binary (its schema is %s): "+
		"run a binary that has it (migrations are forward-only: an older binary can come back only with a database restored from before that migration): %w",
		strings.Join(refuse, ", "), latest(ms), ErrSchemaTooNew)
}

func missingVersions(done []appliedMigration, ms []migration) []string {
	var missing []string
	for _, m := range ms {
		if !slices.ContainsFunc(done, func(a appliedMigration) bool { return a.version == m.version }) {
			missing = append(missing, m.version)
		}
	}
	return missing
}

func versions(as []appliedMigration) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.version
	}
	return out
}

// latest is the schema version a binary with ms needs.
func latest(ms []migration) string {
	if len(ms) == 0 {
		return "none"
	}
	return ms[len(ms)-1].version
}

// warnNewer says that this binary runs on a schema newer than its own,
// which the newer migrations allow.
func warnNewer(o options, ms []migration, newer []appliedMigration) {
	o.log.Warn("database schema is newer than this binary; its newer migrations let older binaries run, so this one does, without what they added",
		"binary_schema", latest(ms), "database_schema", newer[len(newer)-1].version, "newer_migrations", strings.Join(versions(newer), ","))
}

// checkSchema refuses a database this binary may not run on: one that
// lacks a migration of ms (ErrSchemaTooOld: run migrate), or has a newer
// one that does not let older binaries run (ErrSchemaTooNew). A database
// that is newer only by migrations that do is accepted with a warning.
func checkSchema(ctx context.Context, q querier, ms []migration, o options) error {
	done, err := appliedMigrations(ctx, q)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
		return fmt.Errorf("no schema_migrations table: the database has no sluice schema yet (`configurator migrate` or `controller migrate` applies it): %w", ErrSchemaTooOld)
	}
	if err != nil {
		return err
	}
	newer, err := checkNewer(done, ms)
	if err != nil {
		return err
	}
	if missing := missingVersions(done, ms); len(missing) > 0 {
		return fmt.Errorf("database lacks migration %s, which this binary needs (`configurator migrate` or `controller migrate` applies it): %w",
			strings.Join(missing, ", "), ErrSchemaTooOld)
	}
	if len(newer) > 0 {
		warnNewer(o, ms, newer)
	}
	return nil
}
