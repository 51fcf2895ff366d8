package controller

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

// TestMigrateCommandOnNewerSchema: this binary's migrate on a database a
// newer binary migrated. A newer migration that lets older binaries run is
// left alone with a warning naming it; one that does not is refused.
func TestMigrateCommandOnNewerSchema(t *testing.T) {
	url := pgtest.URL(t)
	ctx := t.Context()
	if _, err := history.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	newer := func(version string, ok bool) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, older_binaries_may_run) VALUES ($1, $2)`, version, ok); err != nil {
			t.Fatal(err)
		}
	}
	migrate := func() (string, string, error) {
		cmd := MigrateCommand("controller")
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs([]string{"--database-url", url})
		err := cmd.ExecuteContext(ctx)
		return out.String(), errOut.String(), err
	}

	newer("9000_additive", true)
	out, stderr, err := migrate()
	if err != nil || out != "up to date\n" {
		t.Fatalf("migrate on a compatible newer schema: %q, %v", out, err)
	}
	if !strings.Contains(stderr, "level=WARN") || !strings.Contains(stderr, "database_schema=9000_additive") {
		t.Errorf("migrate did not warn of the newer schema:\n%s", stderr)
	}
	db, err := history.Open(ctx, url)
	if err != nil {
		t.Fatalf("open a compatible newer schema: %v", err)
	}
	db.Close()

	newer("9001_renames", false)
	if _, _, err := migrate(); !errors.Is(err, history.ErrSchemaTooNew) || !strings.Contains(err.Error(), "9001_renames") {
		t.Errorf("migrate on an incompatible newer schema: %v", err)
	}
	if _, err := history.Open(ctx, url); !errors.Is(err, history.ErrSchemaTooNew) {
		t.Errorf("open an incompatible newer schema: %v", err)
	}
}
