package configurator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the output")

// cliNow is the clock of the in-memory CLI tests: mid-day, like now.
var cliNow = now

// noUser is an OS without a user name for this process.
func noUser() (string, error) { return "", errors.New("no user for this uid") }

// env is a fake environment.
type env map[string]string

func (e env) lookup(k string) (string, bool) { v, ok := e[k]; return v, ok }

// harness runs the configurator in-process against one store.
type harness struct {
	t     *testing.T
	store history.Store
	env   env
}

// newMemory returns a harness over a fresh in-memory store whose clock is
// cliNow.
func newMemory(t *testing.T) *harness {
	t.Helper()
	return &harness{t: t, store: history.NewMemory(history.WithClock(func() time.Time { return cliNow })), env: env{"USER": "alice"}}
}

// run executes the configurator with args and returns its stdout and
// error; stderr goes to the test log.
func (h *harness) run(args ...string) (string, error) {
	h.t.Helper()
	cmd := NewCommand(Options{
		Now:       func() time.Time { return cliNow },
		Open:      func(context.Context, string) (history.Store, error) { return h.store, nil },
		Migrate:   func(context.Context, string) ([]string, error) { return nil, nil },
		LookupEnv: h.env.lookup,
		// No OS user: $USER from the fake environment names the actor.
		CurrentUser: noUser,
	})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"--database-url", "memory://"}, args...))
	err := cmd.ExecuteContext(h.t.Context())
	if errOut.Len() > 0 {
		h.t.Logf("configurator %s: stderr:\n%s", strings.Join(args, " "), errOut.String())
	}
	return out.String(), err
}

// must runs args and fails the test on an error.
func (h *harness) must(args ...string) string {
	h.t.Helper()
	out, err := h.run(args...)
	if err != nil {
		h.t.Fatalf("configurator %s: %v\noutput:\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// seed writes n full days of minute rows for b, ending yesterday (relative
// to at), with a daily peak of peak and a mean of peak/2.
func seed(t *testing.T, st history.Store, at time.Time, b history.Bucket, n int, peak float64) {
	t.Helper()
	var rows []history.MinuteRow
	start := startOfDay(at).AddDate(0, 0, -n)
	for m := range n * 1440 {
		r := history.MinuteRow{Bucket: b, Minute: start.Add(time.Duration(m) * time.Minute), PeakOffered: peak / 2, MeanOffered: peak / 4}
		if m%1440 == 600 { // one minute a day at the peak
			r.PeakOffered, r.MeanOffered = peak, peak/2
		}
		rows = append(rows, r)
	}
	if err := st.WriteMinutes(t.Context(), rows); err != nil {
		t.Fatalf("seed %v: %v", b, err)
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run with -update to accept):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func limitsOf(t *testing.T, st history.Store) map[history.Bucket]history.BucketLimit {
	t.Helper()
	lim, err := st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[history.Bucket]history.BucketLimit{}
	for _, l := range lim.Buckets {
		out[l.Bucket] = l
	}
	return out
}

var (
	mobile = history.Bucket{Callee: "checkout", Caller: "mobile"}
	batch  = history.Bucket{Callee: "checkout", Caller: "batch"}
	search = history.Bucket{Callee: "search", Caller: "web"}
)

// TestReviewTable checks review's table against a golden file: alignment,
// human-friendly numbers, Δ and flags, including the flag review adds.
func TestReviewTable(t *testing.T) {
	h := newMemory(t)
	ctx := t.Context()
	c := history.Change{Actor: "alice", Reason: "test"}
	if err := h.store.SetLimit(ctx, history.BucketLimit{Bucket: web, Limit: 1000, Source: history.Derived}, c); err != nil {
		t.Fatal(err)
	}
	if err := h.store.SetLimit(ctx, history.BucketLimit{Bucket: batch, Limit: 20000, Source: history.Manual}, c); err != nil {
		t.Fatal(err)
	}
	_, err := h.store.Propose(ctx, []history.Proposal{
		{Bucket: web, Current: ptr(1000), Proposed: 1300, PeakLookback: 1034.5, PeakRecent: 987.25},
		{Bucket: batch, Current: ptr(20000), Proposed: 2400, PeakLookback: 1900, PeakRecent: 1850, Flags: []string{FlagReplacesManual, FlagStepDown}},
		{Bucket: mobile, Proposed: 88, PeakLookback: 70.1, PeakRecent: 12.5, Flags: []string{FlagNewLimit}},
		{Bucket: search, Current: ptr(5), Proposed: 4.2, PeakLookback: 4.2, PeakRecent: 4.5},
	}, c)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "review", h.must("review"))
	golden(t, "review_checkout", h.must("review", "--callee", "checkout", "--caller", "web"))
}

// TestLifecycleMemory walks derive → review → approve → audit against the
// in-memory store, with the guard rails on the way.
func TestLifecycleMemory(t *testing.T) {
	h := newMemory(t)
	seed(t, h.store, cliNow, web, 10, 1000)   // 1250 → 1300
	seed(t, h.store, cliNow, mobile, 10, 200) // 250, but its limit is 1000: a step down to 25 %
	seed(t, h.store, cliNow, batch, 3, 50)    // too little history
	ctx := t.Context()
	if err := h.store.SetLimit(ctx, history.BucketLimit{Bucket: mobile, Limit: 1000, Source: history.Derived}, history.Change{Actor: "bob", Reason: "old"}); err != nil {
		t.Fatal(err)
	}

	out := h.must("derive", "--dry-run")
	for _, want := range []string{"checkout  mobile  1,000    250", "step down needs approval", "checkout  batch   3 days of history, need 7", "dry run: 2 proposals not written"} {
		if !strings.Contains(out, want) {
			t.Errorf("derive --dry-run output lacks %q:\n%s", want, out)
		}
	}
	if ps, _ := h.store.Proposals(ctx, history.Filter{}); len(ps) != 0 {
		t.Fatalf("--dry-run wrote %d proposals", len(ps))
	}

	out = h.must("derive")
	if !strings.Contains(out, "wrote 2 proposals (ids 1–2)") {
		t.Errorf("derive output:\n%s", out)
	}

	var rows []proposalRow
	if err := json.Unmarshal([]byte(h.must("review", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Caller != "mobile" || rows[0].Proposed != 250 || rows[1].Caller != "web" || rows[1].Proposed != 1300 {
		t.Fatalf("review -o json: %+v", rows)
	}
	if d := rows[0].DeltaPct; d == nil || *d != -75 {
		t.Errorf("mobile delta_pct = %v; want -75", d)
	}
	if !slices.Equal(rows[0].Flags, []string{"step_down_needs_approval"}) {
		t.Errorf("mobile flags = %q; want the code step_down_needs_approval", rows[0].Flags)
	}
	if rows[1].Current != nil || rows[1].DeltaPct != nil || !slices.Equal(rows[1].Flags, []string{"new_limit"}) {
		t.Errorf("web row: %+v", rows[1])
	}

	// --all skips the step down, and says so.
	out = h.must("approve", "--all", "--reason", "weekly review")
	if !strings.Contains(out, "approved 1 proposal") || !strings.Contains(out, "skipped 1 proposal") || !strings.Contains(out, "1   checkout  mobile  1,000 → 250 (-75%)") {
		t.Errorf("approve --all output:\n%s", out)
	}
	lim := limitsOf(t, h.store)
	if l := lim[web]; l.Limit != 1300 || l.Source != history.Derived || l.UpdatedBy != "alice" || l.Reason != "weekly review" {
		t.Errorf("web limit after approve: %+v", l)
	}
	if l := lim[mobile]; l.Limit != 1000 {
		t.Errorf("mobile was approved by --all: %+v", l)
	}
	// Naming the bucket is the explicit approval.
	h.must("approve", "checkout/mobile", "--reason", "yes, really")
	if l := limitsOf(t, h.store)[mobile]; l.Limit != 250 || l.Source != history.Derived {
		t.Errorf("mobile limit after explicit approve: %+v", l)
	}
	if out := h.must("review"); out != "no pending proposals\n" {
		t.Errorf("review after approving all:\n%s", out)
	}

	// Derive again: nothing changed, nothing proposed.
	out = h.must("derive")
	if !strings.Contains(out, "no proposals; 1 bucket refused, 2 buckets unchanged") {
		t.Errorf("second derive:\n%s", out)
	}

	var audit []auditRow
	if err := json.Unmarshal([]byte(h.must("audit", "checkout", "-o", "json")), &audit); err != nil {
		t.Fatal(err)
	}
	var approvals []string
	for _, e := range audit {
		if e.Action == "approve" {
			approvals = append(approvals, e.Caller+" by "+e.Actor+": "+e.Reason)
		}
	}
	if strings.Join(approvals, "; ") != "mobile by alice: yes, really; web by alice: weekly review" {
		t.Errorf("approve audit entries: %q", approvals)
	}
}

func TestApproveForceAndReject(t *testing.T) {
	h := newMemory(t)
	seed(t, h.store, cliNow, mobile, 8, 200)
	seed(t, h.store, cliNow, web, 8, 100)
	c := history.Change{Actor: "bob", Reason: "old"}
	if err := h.store.SetLimit(t.Context(), history.BucketLimit{Bucket: mobile, Limit: 1000, Source: history.Derived}, c); err != nil {
		t.Fatal(err)
	}
	h.must("derive")
	out := h.must("reject", "--id", "2", "--reason", "not now")
	if !strings.Contains(out, "rejected 1 proposal") || !strings.Contains(out, "checkout  web") {
		t.Errorf("reject output:\n%s", out)
	}
	// A callee alone is not an explicit approval of a step down; --force is.
	out = h.must("approve", "checkout", "--reason", "r")
	if !strings.Contains(out, "skipped 1 proposal") {
		t.Errorf("approve checkout:\n%s", out)
	}
	h.must("approve", "checkout", "--force", "--reason", "r")
	if l := limitsOf(t, h.store)[mobile]; l.Limit != 250 {
		t.Errorf("mobile after --force: %+v", l)
	}
	if _, ok := limitsOf(t, h.store)[web]; ok {
		t.Error("rejected proposal was applied")
	}
}

func TestSetModeAudit(t *testing.T) {
	h := newMemory(t)
	out := h.must("set", "checkout/web", "--limit", "1500", "--mode", "shadow", "--reason", "launch")
	if out != "checkout/web: limit 1,500 rps, shadow, manual (new)\n" {
		t.Errorf("set output: %q", out)
	}
	out = h.must("set", "checkout/web", "--limit", "2000", "--reason", "more")
	if out != "checkout/web: limit 2,000 rps, shadow, manual\n  was limit 1,500 rps, shadow, manual\n" {
		t.Errorf("set again: %q", out)
	}
	out = h.must("set", "checkout", "--capacity", "5000", "--fail-mode", "hold", "--reason", "db")
	if out != "checkout: default limit none, capacity 5,000 rps, enforce, fail mode hold\n" {
		t.Errorf("set callee: %q", out)
	}
	h.must("set", "checkout", "--default-limit", "100", "--reason", "default")
	lim, err := h.store.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s := lim.Services[0]; *s.Capacity != 5000 || *s.DefaultLimit != 100 || *s.FailMode != dataplane.FailHold {
		t.Errorf("service after two sets: %+v", s)
	}
	h.must("set", "checkout", "--capacity", "none", "--reason", "gone")
	if lim, _ := h.store.Limits(t.Context()); lim.Services[0].Capacity != nil {
		t.Errorf("capacity none kept %v", *lim.Services[0].Capacity)
	}

	if out := h.must("enforce", "checkout/web", "--reason", "looks right"); out != "checkout/web: enforce (1 limit)\n" {
		t.Errorf("enforce: %q", out)
	}
	if l := limitsOf(t, h.store)[web]; *l.Mode != dropratio.Enforce {
		t.Errorf("mode after enforce: %v", *l.Mode)
	}
	h.must("shadow", "checkout", "--reason", "incident")
	if l := limitsOf(t, h.store)[web]; *l.Mode != dropratio.Shadow {
		t.Errorf("mode after shadow checkout: %v", *l.Mode)
	}
	h.must("set", "checkout/web", "--limit", "none", "--reason", "remove")
	if _, ok := limitsOf(t, h.store)[web]; ok {
		t.Error("--limit none kept the limit")
	}

	out = h.must("audit", "--since", "1h")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// 9 changes; shadow of a callee switched the callee and its bucket.
	if len(lines) != 10 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("audit: %d lines:\n%s", len(lines), out)
	}
	for _, want := range []string{"delete_limit", "set_mode", "set_service", "set_limit", "alice", "launch"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(lines[1], "delete_limit") {
		t.Errorf("audit is not newest first:\n%s", out)
	}
	if out := h.must("audit", "--limit", "2"); len(strings.Split(strings.TrimSpace(out), "\n")) != 3 {
		t.Errorf("audit --limit 2:\n%s", out)
	}
}

func TestHistoryCommand(t *testing.T) {
	h := newMemory(t)
	seed(t, h.store, cliNow, web, 5, 100)
	seed(t, h.store, cliNow.AddDate(0, 0, -7), web, 3, 400) // days 10..8 ago: a gap after
	h.must("set", "checkout/web", "--limit", "500", "--reason", "r")
	png := filepath.Join(t.TempDir(), "web.png")
	out := h.must("history", "checkout/web", "--days", "14", "--png", png)
	golden(t, "history", strings.ReplaceAll(out, png, "web.png"))
	b, err := os.ReadFile(png)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 1000 {
		t.Errorf("%s is not a PNG (%d bytes)", png, len(b))
	}
}

func TestSparkline(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want string
	}{
		{[]float64{0, 1, 2, 3, 4, 5, 6, 7, 8}, "▁▁▂▃▄▅▆▇█"},
		{[]float64{100, math.NaN(), 50}, "█ ▄"},
		{[]float64{0, 0}, "▁▁"},
		{nil, ""},
	} {
		if got := sparkline(tc.in); got != tc.want {
			t.Errorf("sparkline(%v) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// TestBacktestCommand runs the hand-computed case of TestReplayHandComputed
// through the store and the command.
func TestBacktestCommand(t *testing.T) {
	h := newMemory(t)
	start := startOfDay(cliNow).Add(-2 * time.Hour)
	var rows []history.MinuteRow
	for i, r := range []float64{50, 150, 200, 80} {
		rows = append(rows, history.MinuteRow{Bucket: web, Minute: start.Add(time.Duration(i) * time.Minute), PeakOffered: r, MeanOffered: r})
	}
	if err := h.store.WriteMinutes(t.Context(), rows); err != nil {
		t.Fatal(err)
	}
	h.must("set", "checkout/web", "--limit", "100", "--reason", "r")

	var res []backtestRow
	if err := json.Unmarshal([]byte(h.must("backtest", "checkout/web", "--current", "--days", "2", "-o", "json")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || *res[0].Limit != 100 || res[0].LimitFrom != "current" || res[0].Minutes != 4 || res[0].Share != 0.313 || // 0.3125, rounded as the table's 31.3%
		res[0].DropMinutes != 2 || res[0].WorstRatio != 0.5 || !res[0].FirstDrop.Equal(start.Add(time.Minute)) || !res[0].LastDrop.Equal(start.Add(2*time.Minute)) {
		t.Errorf("backtest --current: %+v", res)
	}

	// A proposal of 200 would have dropped nothing; without one, --proposed
	// falls back to the limit in force.
	if _, err := h.store.Propose(t.Context(), []history.Proposal{{Bucket: web, Current: ptr(100), Proposed: 200, PeakLookback: 200, PeakRecent: 200}}, history.Change{Actor: "a", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	out := h.must("backtest", "checkout", "--from", start.Format(time.RFC3339), "--to", start.Add(time.Hour).Format("2006-01-02T15:04"))
	golden(t, "backtest", out)
	out = h.must("backtest", "--current", "--days", "1")
	golden(t, "backtest_current", out)
}

func TestCompletionNeedsNoDatabase(t *testing.T) {
	cmd := NewCommand(Options{LookupEnv: env{}.lookup})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"completion", "bash"})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "__start_configurator") {
		t.Errorf("completion bash printed no bash completion:\n%.300s", out.String())
	}
}

// TestSettingsLayering: the config file and the environment set settings;
// a setting of another subcommand in the file is ignored; an unknown one is
// an error; per-invocation flags such as --reason are not settings.
func TestSettingsLayering(t *testing.T) {
	h := newMemory(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "configurator.yaml")
	if err := os.WriteFile(file, []byte("actor: from-file\nlookback: 2w\noutput: json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.env["SLUICE_CONFIGURATOR_CONFIG"] = file
	if out := h.must("review"); out != "[]\n" {
		t.Errorf("review with output: json in the file printed %q", out)
	}
	h.must("set", "checkout/web", "--limit", "1", "--reason", "r")
	h.env["SLUICE_CONFIGURATOR_ACTOR"] = "from-env"
	h.must("set", "checkout/web", "--limit", "2", "--reason", "r")
	h.must("set", "checkout/web", "--limit", "3", "--reason", "r", "--actor", "from-flag")
	entries, err := h.store.Audit(t.Context(), history.Filter{}, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var actors []string
	for _, e := range entries {
		actors = append(actors, e.Actor)
	}
	if got := strings.Join(actors, ","); got != "from-flag,from-env,from-file" {
		t.Errorf("actors, newest first: %s", got)
	}

	h.env["SLUICE_CONFIGURATOR_REASON"] = "sneaky"
	if _, err := h.run("set", "checkout/web", "--limit", "4"); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Errorf("--reason from the environment: %v", err)
	}
	if err := os.WriteFile(file, []byte("lookbak: 2w\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.run("review"); err == nil || !strings.Contains(err.Error(), `unknown setting "lookbak"`) {
		t.Errorf("unknown setting: %v", err)
	}
}

// TestErrors: bad input fails with a message naming the argument or flag.
func TestErrors(t *testing.T) {
	h := newMemory(t)
	seed(t, h.store, cliNow, web, 1, 10)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"derive", "--lookback", "4x"}, `--lookback`},
		{[]string{"derive", "--lookback", "4x"}, `unknown unit "x"`},
		{[]string{"derive", "--recent", "-7d"}, `--recent`},
		{[]string{"derive", "--headroom", "-1"}, `--headroom -1 is outside [0, 100]`},
		{[]string{"derive", "--headroom", "NaN"}, `--headroom NaN`},
		{[]string{"derive", "--callee", "bad name"}, `--callee`},
		{[]string{"review", "-o", "xml"}, `"xml" is not table, json or yaml`},
		{[]string{"set", "checkout/web", "--limit", "-5", "--reason", "r"}, `--limit -5 is negative`},
		{[]string{"set", "checkout/web", "--limit", "NaN", "--reason", "r"}, `--limit is NaN`},
		{[]string{"set", "checkout/web", "--limit", "lots", "--reason", "r"}, `--limit "lots" is not a number`},
		{[]string{"set", "checkout/web", "--limit", "+Inf", "--reason", "r"}, `--limit is infinite`},
		{[]string{"set", "checkout/web", "--limit", "10"}, `--reason is required`},
		{[]string{"set", "checkout/web", "--limit", "10", "--reason", " "}, `--reason is required`},
		{[]string{"set", "checkout/web", "--reason", "r"}, `--limit is required`},
		{[]string{"set", "checkout/web", "--limit", "1", "--mode", "loud", "--reason", "r"}, `--mode "loud" is not enforce or shadow`},
		{[]string{"set", "checkout/web", "--limit", "1", "--capacity", "5", "--reason", "r"}, `--capacity is a callee's setting`},
		{[]string{"set", "checkout", "--fail-mode", "maybe", "--reason", "r"}, `--fail-mode "maybe" is not open, hold or local`},
		{[]string{"set", "checkout", "--limit", "5", "--reason", "r"}, `--limit needs callee/caller`},
		{[]string{"set", "checkout", "--reason", "r"}, `nothing to set for checkout`},
		{[]string{"set", "checkout", "--default-limit", "-1", "--reason", "r"}, `--default-limit -1 is negative`},
		{[]string{"set", "check out/web", "--limit", "1", "--reason", "r"}, `bucket "check out/web": callee`},
		{[]string{"set", "checkout/", "--limit", "1", "--reason", "r"}, `bucket "checkout/": caller: empty name`},
		// A leaf of a procedure checkout does not declare: the controller
		// could not load it.
		{[]string{"set", "checkout/web/x", "--limit", "1", "--reason", "r"}, `limit checkout/web/x: left out: no route of checkout names x`},
		{[]string{"set", "checkout/web/x/", "--limit", "1", "--reason", "r"}, `bucket "checkout/web/x/": procedure`},
		{[]string{"set", "checkout/*", "--limit", "1", "--reason", "r"}, `want checkout/*/PROCEDURE`},
		{[]string{"set", "checkout/web/x", "--limit", "1", "--mode", "shadow", "--reason", "r"}, `--mode: checkout/web/x is enforced as its caller is`},
		{[]string{"shadow", "checkout/*/x", "--reason", "r"}, `checkout/*/x is enforced as its caller is`},
		{[]string{"routes", "set", "checkout", "/v1/*=all", "GET /v1/x=x", "--reason", "r"}, `shadowed by route 0`},
		{[]string{"routes", "set", "checkout", "/v1/x", "--reason", "r"}, `want PATTERN=PROCEDURE`},
		{[]string{"review", "checkout/web", "--callee", "checkout"}, `not both`},
		{[]string{"derive", "--procedure", "a//b"}, `--procedure: procedure "a//b" has an empty part`},
		{[]string{"shadow", "checkout/web", "--reason", "r"}, `unknown bucket checkout/web`},
		{[]string{"enforce", "checkout/web"}, `--reason is required`},
		{[]string{"approve", "checkout/web", "--reason", "r"}, `no pending proposal for checkout/web`},
		{[]string{"approve", "--id", "7", "--reason", "r"}, `--id 7: no pending proposal`},
		{[]string{"approve", "--all"}, `--reason is required`},
		{[]string{"approve", "--reason", "r"}, `say which proposals to approve`},
		{[]string{"reject", "--all", "checkout/web", "--reason", "r"}, `--all selects every pending proposal`},
		{[]string{"approve", "--id", "x", "--reason", "r"}, `"--id"`},
		{[]string{"history", "checkout/mobile"}, `unknown bucket checkout/mobile: no history in the last 28 days`},
		{[]string{"history", "checkout"}, `want callee/caller`},
		{[]string{"history", "checkout/web", "--days", "0"}, `--days 0 is below 1`},
		{[]string{"audit", "--since", "3q"}, `--since`},
		{[]string{"audit", "--limit", "-1"}, `--limit -1 is negative`},
		{[]string{"backtest", "--from", "2026-13-01"}, `--from "2026-13-01" is not a time`},
		{[]string{"backtest", "--current", "--proposed"}, `--proposed and --current exclude each other`},
		{[]string{"backtest", "--from", "2026-03-10", "--to", "2026-03-01"}, `is not before --to`},
		{[]string{"backtest", "--release-rate", "1"}, `ReleaseRate`},
		{[]string{"backtest", "nosuch"}, `unknown bucket nosuch`},
		{[]string{"migrate", "extra"}, `unknown command "extra"`},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"--log-level", "loud", "review"}, `log-level`},
	} {
		_, err := h.run(tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("configurator %s: error %v; want it to contain %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}

	// No --database-url at all.
	cmd := NewCommand(Options{LookupEnv: env{}.lookup})
	cmd.SetOut(new(bytes.Buffer))
	cmd.SetErr(new(bytes.Buffer))
	cmd.SetArgs([]string{"review"})
	if err := cmd.ExecuteContext(t.Context()); err == nil || !strings.Contains(err.Error(), "--database-url is required (or set SLUICE_CONFIGURATOR_DATABASE_URL)") {
		t.Errorf("review without --database-url: %v", err)
	}
}
