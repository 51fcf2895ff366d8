package configurator

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

// What a new user meets first: derive on an empty database, the actor,
// --now, and machine output that scripts can rely on.

func TestDeriveWithoutHistorySaysWhatItNeeds(t *testing.T) {
	h := newMemory(t)
	out := h.must("derive")
	want := `no history in the database for every bucket in the last 4w.
derive needs --min-days 7 days, each with --min-coverage 80% of its 1440 minutes, in the last --lookback 4w.
The controller writes a row per bucket per minute when run with --database-url.
For a demo: configurator history seed --synthetic 4w --reason "try derive" (made-up history; see its --help).
`
	if out != want {
		t.Errorf("derive on an empty store:\n%s\nwant:\n%s", out, want)
	}
	out = h.must("derive", "--callee", "checkout", "--min-days", "3", "--lookback", "2w")
	if !strings.Contains(out, "no history in the database for the buckets checkout/* in the last 2w.") ||
		!strings.Contains(out, "--min-days 3 days") || !strings.Contains(out, "--lookback 2w") {
		t.Errorf("derive --callee checkout on an empty store names neither the filter nor the settings:\n%s", out)
	}

	// Too little: the refusals, then the same advice.
	seed(t, h.store, cliNow, batch, 3, 50)
	out = h.must("derive")
	for _, want := range []string{
		"checkout  batch   3 days of history, need 7",
		"no proposals; 1 bucket refused, 0 buckets unchanged\n\ntoo little history in the database for every bucket to propose any limit.\n",
		"derive needs --min-days 7 days",
		"configurator history seed --synthetic 4w",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("derive with too little history lacks %q:\n%s", want, out)
		}
	}

	// JSON stays one document on stdout; the advice goes to stderr.
	cmd := NewCommand(Options{Now: func() time.Time { return cliNow }, LookupEnv: env{}.lookup, CurrentUser: noUser,
		Open: func(context.Context, string) (history.Store, error) { return h.store, nil }})
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--database-url", "memory://", "derive", "--dry-run", "-o", "json"})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	var d derivationOutput
	if err := json.Unmarshal(stdout.Bytes(), &d); err != nil || len(d.Refusals) != 1 {
		t.Errorf("derive -o json: %v, %+v:\n%s", err, d, stdout.String())
	}
	if !strings.Contains(stderr.String(), "too little history") {
		t.Errorf("derive -o json wrote no advice to stderr: %q", stderr.String())
	}
}

func TestDeriveNamesTheDatabase(t *testing.T) {
	url := pgtest.URL(t)
	mustPG(t, url, "migrate")
	out := mustPG(t, url, "derive")
	if !regexp.MustCompile(`^no history in database "sluice_test_[0-9a-f]+" on 127\.0\.0\.1:\d+ for every bucket`).MatchString(out) {
		t.Errorf("derive on an empty Postgres:\n%s", out)
	}
	if strings.Contains(out, "postgres@") || strings.Contains(out, "sslmode") {
		t.Errorf("derive prints the URL, not a description: %s", out)
	}
	for url, want := range map[string]string{
		"postgres://u:secret@db.example:6432/sluice":   `database "sluice" on db.example:6432`,
		"host=/run/pg dbname=limits user=x password=y": `database "limits" on /run/pg`,
		"memory://": "the database",
	} {
		if got := describeDB(url); got != want {
			t.Errorf("describeDB(%q) = %q, want %q", url, got, want)
		}
	}
}

func TestActorDefaultsToTheOSUser(t *testing.T) {
	for _, tc := range []struct {
		name   string
		osUser func() (string, error)
		env    env
		want   string // "" : writes are refused
	}{
		{"os user first", func() (string, error) { return "osuser", nil }, env{"USER": "envuser"}, "osuser"},
		{"then $USER", noUser, env{"USER": "envuser"}, "envuser"},
		{"blank os user", func() (string, error) { return " ", nil }, env{"USER": "envuser"}, "envuser"},
		{"neither", noUser, env{}, ""},
		{"empty $USER", noUser, env{"USER": ""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMemory(t)
			h.env = tc.env
			run := func(args ...string) (string, error) {
				cmd := NewCommand(Options{Now: func() time.Time { return cliNow }, LookupEnv: tc.env.lookup, CurrentUser: tc.osUser,
					Open: func(context.Context, string) (history.Store, error) { return h.store, nil }})
				var out bytes.Buffer
				cmd.SetOut(&out)
				cmd.SetErr(new(bytes.Buffer))
				cmd.SetArgs(append([]string{"--database-url", "memory://"}, args...))
				err := cmd.ExecuteContext(t.Context())
				return out.String(), err
			}
			_, err := run("set", "checkout/web", "--limit", "10", "--reason", "r")
			if tc.want == "" {
				if err == nil || !strings.Contains(err.Error(), "--actor is required") || !strings.Contains(err.Error(), "SLUICE_CONFIGURATOR_ACTOR") {
					t.Fatalf("set without any actor: %v; want it refused, naming --actor", err)
				}
				for _, args := range [][]string{{"review"}, {"audit"}, {"derive", "--dry-run"}} {
					if _, err := run(args...); err != nil {
						t.Errorf("%s needs no actor, but: %v", args[0], err)
					}
				}
				for _, args := range [][]string{{"derive"}, {"shadow", "checkout/web", "--reason", "r"}, {"approve", "--all", "--reason", "r"},
					{"history", "seed", "--synthetic", "1d", "--reason", "r"}} {
					if _, err := run(args...); err == nil || !strings.Contains(err.Error(), "--actor is required") {
						t.Errorf("%s without an actor: %v", strings.Join(args, " "), err)
					}
				}
				if _, err := run("set", "checkout/web", "--limit", "10", "--reason", "r", "--actor", "named"); err != nil {
					t.Fatal(err)
				}
				tc.want = "named"
			} else if err != nil {
				t.Fatal(err)
			}
			es, err := h.store.Audit(t.Context(), history.Filter{}, time.Time{}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != 1 || es[0].Actor != tc.want {
				t.Errorf("audit %+v; want one entry by %s", es, tc.want)
			}
		})
	}

	var help bytes.Buffer
	cmd := NewCommand(Options{LookupEnv: env{}.lookup, CurrentUser: noUser})
	cmd.SetOut(&help)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "default: the OS user (os/user, else $USER)") || strings.Contains(help.String(), `"unknown"`) {
		t.Errorf("--help does not say what --actor defaults to:\n%s", help.String())
	}
}

// --now moves the windows over history, and only them.
func TestNowFlag(t *testing.T) {
	h := newMemory(t)
	past := time.Date(2025, 6, 2, 12, 0, 0, 0, time.UTC)
	seed(t, h.store, past, web, 8, 1000)
	if _, err := h.run("history", "checkout/web"); err == nil {
		t.Fatal("history of 2025 found at the real clock's 2026")
	}
	out := h.must("history", "checkout/web", "--days", "3", "--now", "2025-06-02T12:00")
	if !strings.Contains(out, "2025-05-31  1,000") || !strings.Contains(out, "2025-06-01  1,000") || strings.Contains(out, "2025-05-30") {
		t.Errorf("history --now 2025-06-02T12:00 --days 3:\n%s", out)
	}
	h.env["SLUICE_CONFIGURATOR_NOW"] = "2025-06-02T12:00:00Z"
	out = h.must("derive", "--dry-run")
	if !strings.Contains(out, "checkout  web     none     1,300") {
		t.Errorf("derive with SLUICE_CONFIGURATOR_NOW in 2025:\n%s", out)
	}
	// The store, not --now, stamps changes.
	h.must("set", "checkout/web", "--limit", "5", "--reason", "r")
	es, err := h.store.Audit(t.Context(), history.Filter{}, time.Time{}, 0)
	if err != nil || len(es) != 1 || !es[0].At.Equal(cliNow) {
		t.Errorf("audit with --now set: %+v, %v; want the store's clock %v", es, err, cliNow)
	}
	if _, err := h.run("review", "--now", "yesterday"); err == nil || !strings.Contains(err.Error(), `--now "yesterday" is not a time`) {
		t.Errorf("--now yesterday: %v", err)
	}
}

func TestMachineOutputRoundsAndUsesCodes(t *testing.T) {
	h := newMemory(t)
	c := history.Change{Actor: "alice", Reason: "test"}
	if _, err := h.store.Propose(t.Context(), []history.Proposal{
		{Bucket: web, Current: ptr(1000), Proposed: 420, PeakLookback: 1054.3729166666667, PeakRecent: 87.24999, Flags: []string{FlagReplacesManual, FlagStepDown}},
		{Bucket: mobile, Proposed: 4.6, PeakLookback: 4.56789, PeakRecent: 4.5, Flags: []string{FlagNewLimit, "Some other proposer's flag!"}},
	}, c); err != nil {
		t.Fatal(err)
	}
	raw := h.must("review", "-o", "json")
	for _, want := range []string{`"delta_pct": -58,`, `"peak_lookback": 1054,`, `"peak_recent": 87.2,`, `"peak_lookback": 4.57,`, `"proposed": 420,`} {
		if !strings.Contains(raw, want) {
			t.Errorf("review -o json lacks %s:\n%s", want, raw)
		}
	}
	if regexp.MustCompile(`\d\.\d{4,}`).MatchString(raw) {
		t.Errorf("review -o json has unrounded numbers:\n%s", raw)
	}
	var rows []proposalRow
	if err := json.Unmarshal([]byte(raw), &rows); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rows[0].Flags, []string{"new_limit", "some_other_proposer_s_flag"}) ||
		!slices.Equal(rows[1].Flags, []string{"replaces_manual", "step_down_needs_approval"}) {
		t.Errorf("flags %q, %q; want codes", rows[0].Flags, rows[1].Flags)
	}
	var yrows []map[string]any
	if err := yaml.Unmarshal([]byte(h.must("review", "-o", "yaml")), &yrows); err != nil {
		t.Fatal(err)
	}
	if yrows[1]["delta_pct"] != -58 || yrows[1]["peak_lookback"] != 1054 {
		t.Errorf("review -o yaml: %v", yrows[1])
	}
	// The table keeps the prose.
	if out := h.must("review"); !strings.Contains(out, "replaces manual limit, step down needs approval") {
		t.Errorf("review table:\n%s", out)
	}
}

func TestFlagCodes(t *testing.T) {
	flags := []string{FlagNewLimit, FlagStepDown, FlagHeldAtRecent, FlagReplacesManual, FlagCurrentHit, FlagBelowRecent}
	seen := map[string]bool{}
	for _, f := range flags {
		c, ok := flagCodes[f]
		if !ok || !regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`).MatchString(c) || seen[c] {
			t.Errorf("flag %q: code %q (known %v); want a unique snake_case code", f, c, ok)
		}
		seen[c] = true
	}
	if len(flagCodes) != len(flags) {
		t.Errorf("flagCodes has %d entries for %d flags", len(flagCodes), len(flags))
	}
	if got := flagCode("  odd -- Flag  2 "); got != "odd_flag_2" {
		t.Errorf("flagCode of an unknown flag = %q", got)
	}
}

func TestRounding(t *testing.T) {
	for _, tc := range []struct {
		fn       func(float64) float64
		name     string
		in, want float64
	}{
		{roundRate, "rate", 1054.3729166666667, 1054},
		{roundRate, "rate", 99.96, 100},
		{roundRate, "rate", 87.249, 87.2},
		{roundRate, "rate", 4.567, 4.57},
		{roundRate, "rate", 0, 0},
		{roundPct, "pct", -57.99999999999999, -58},
		{roundPct, "pct", 33.333333, 33.3},
		{roundShare, "share", 0.3125, 0.313},
		{roundShare, "share", 0.0123456, 0.0123},
		{roundShare, "share", 0.0000423456, 0.000042},
		{roundShare, "share", 0, 0},
	} {
		if got := tc.fn(tc.in); got != tc.want {
			t.Errorf("round %s %v = %v, want %v", tc.name, tc.in, got, tc.want)
		}
	}
}
