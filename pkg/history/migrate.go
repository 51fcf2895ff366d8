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
		out = append(out, migration{version: strings.TrimSuffix(path.Base(f), ".sql"), sql: string(b)})
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
// runs in its own transaction, recorded in schema_migrations. It holds an
// advisory lock throughout, so two migrators at once are safe: the second
// waits, then finds nothing to do. A database with migrations this binary
// does not know is refused with ErrSchemaTooNew.
func Migrate(ctx context.Context, url string) (applied []string, err error) {
	ms, err := loadMigrations()
	if err != nil {
		return nil, err
	}
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
	done, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if unknown := unknownVersions(done, ms); len(unknown) > 0 {
		return nil, fmt.Errorf("migrate: database has migrations %v: %w", unknown, ErrSchemaTooNew)
	}
	for _, m := range ms {
		if slices.Contains(done, m.version) {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, m.version)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate: apply %s: %w", m.version, err)
		}
		applied = append(applied, m.version)
	}
	return applied, nil
}

// querier is what both a connection and a pool can do.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func appliedVersions(ctx context.Context, q querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func unknownVersions(done []string, ms []migration) []string {
	var unknown []string
	for _, v := range done {
		if !slices.ContainsFunc(ms, func(m migration) bool { return m.version == v }) {
			unknown = append(unknown, v)
		}
	}
	return unknown
}

// checkSchema refuses a database whose schema is not exactly this binary's.
func checkSchema(ctx context.Context, q querier) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	done, err := appliedVersions(ctx, q)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
		return fmt.Errorf("no schema_migrations table: %w", ErrSchemaTooOld)
	}
	if err != nil {
		return err
	}
	if unknown := unknownVersions(done, ms); len(unknown) > 0 {
		return fmt.Errorf("database has migrations %v: %w", unknown, ErrSchemaTooNew)
	}
	var missing []string
	for _, m := range ms {
		if !slices.Contains(done, m.version) {
			missing = append(missing, m.version)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("database lacks migrations %v: %w", missing, ErrSchemaTooOld)
	}
	return nil
}
