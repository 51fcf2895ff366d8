package history

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// A database at 0003_procedures, with a callee's settings and a limit as a
// binary of that schema writes them, upgrades to tiers and cost: the
// callee counts requests and declares no tiers, its rows read back as
// they were, and it has no bucket settings.
func TestMigrateTiersCostKeepsOldRows(t *testing.T) {
	ctx := t.Context()
	ms := allMigrations(t)
	i := indexOf(t, ms, "0004_tiers_cost")
	url := pgtest.URL(t)
	mustMigrate(t, url, ms[:i])
	conn, err := pgx.Connect(ctx, url)
	must(t, err)
	for _, sql := range []string{
		`INSERT INTO service_limits (callee, default_limit, capacity, mode, fail_mode, updated_by, reason, updated_at)
			VALUES ('checkout', 50, 500, 'shadow', 'hold', 'alice', 'before', now())`,
		`INSERT INTO bucket_limits (callee, caller, limit_rps, mode, source, updated_by, reason, updated_at)
			VALUES ('checkout', 'web', 100, 'enforce', 'manual', 'alice', 'before', now())`,
	} {
		_, err := conn.Exec(ctx, sql)
		must(t, err)
	}
	must(t, conn.Close(ctx))
	if applied := mustMigrate(t, url, ms); len(applied) != len(ms)-i || applied[0] != "0004_tiers_cost" {
		t.Fatalf("migrate applied %v, want 0004_tiers_cost and on", applied)
	}
	s, err := open(ctx, url, ms, newOptions(nil))
	must(t, err)
	defer s.Close()
	l, err := s.Limits(ctx)
	must(t, err)
	if len(l.Services) != 1 || l.Services[0].Cost != nil || l.Services[0].Criticality != nil || *l.Services[0].Capacity != 500 {
		t.Errorf("old service %+v, want capacity 500, counting requests, no tiers", l.Services)
	}
	if len(l.Buckets) != 1 || l.Buckets[0].Limit != 100 || l.Settings != nil {
		t.Errorf("old limits %+v, settings %+v; want web at 100 and no settings", l.Buckets, l.Settings)
	}
	if got := renderService(l.Services[0]); got != "default 50 rps, capacity 500 rps, mode shadow, fail hold" {
		t.Errorf("old service renders %q, as before 0004", got)
	}
}
