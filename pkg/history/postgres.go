package history

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is the Store on Postgres: one connection pool, plus one
// dedicated connection per Changes subscription.
type Postgres struct {
	pool   *pgxpool.Pool
	listen *pgx.ConnConfig // for Changes' own connections
	opts   options

	partMu sync.Mutex     // guards parts
	parts  map[int64]bool // UTC days (Unix seconds) whose minute_load partition is known to exist

	bucketMu sync.RWMutex // guards ids and names: the buckets table, as far as this process has seen it
	ids      map[Bucket]int32
	names    map[int32]Bucket

	mu      sync.Mutex // guards closed, and wg.Add against Close's wg.Wait
	closed  bool
	closing context.Context // cancelled by Close: ends Changes goroutines
	cancel  context.CancelFunc
	wg      sync.WaitGroup // Changes goroutines
}

var _ Store = (*Postgres)(nil)

// Open connects to the database at url (a postgres:// URL or key=value
// DSN; pool_max_conns and friends apply), pings it, and checks that this
// binary may run on its schema: ErrSchemaTooOld means run Migrate;
// ErrSchemaTooNew means the database has a migration this binary does not
// know and that does not let older binaries run. A database newer only by
// migrations that do is opened, with a warning to the logger (WithLogger).
func Open(ctx context.Context, url string, opts ...Option) (*Postgres, error) {
	ms, err := loadMigrations()
	if err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	return open(ctx, url, ms, newOptions(opts))
}

// open is Open for a binary with the migrations ms.
func open(ctx context.Context, url string, ms []migration, o options) (*Postgres, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		// Return instants in UTC, as the package promises, not time.Local.
		c.TypeMap().RegisterType(&pgtype.Type{
			Name: "timestamptz", OID: pgtype.TimestamptzOID,
			Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC},
		})
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open history: ping: %w", err)
	}
	if err := checkSchema(ctx, pool, ms, o); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open history: %w", err)
	}
	p := &Postgres{
		pool:   pool,
		listen: cfg.ConnConfig.Copy(),
		opts:   o,
		parts:  map[int64]bool{},
		ids:    map[Bucket]int32{},
		names:  map[int32]Bucket{},
	}
	p.closing, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Pool is the store's connection pool, for callers that share it (one pool
// per process) and for tests.
func (p *Postgres) Pool() *pgxpool.Pool { return p.pool }

// Close ends Changes subscriptions, waits for their goroutines, and closes
// the pool. It is idempotent.
func (p *Postgres) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.pool.Close()
}

// filterSQL appends f's conditions on the columns callee, caller and
// procedure to a WHERE clause.
// A condition for an empty field is left out, not written as a no-op OR,
// so that the planner can use the primary key.
func filterSQL(sql string, args []any, f Filter) (string, []any) {
	for _, c := range [...]struct{ column, v string }{{"callee", f.Callee}, {"caller", f.Caller}, {"procedure", f.Procedure}} {
		if c.v != "" {
			args = append(args, c.v)
			sql += fmt.Sprintf(" AND %s = $%d", c.column, len(args))
		}
	}
	return sql, args
}
