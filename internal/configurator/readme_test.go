package configurator

import (
	"bytes"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

// README's lifecycle transcript is what scripts/lifecycle-demo.sh (make
// lifecycle-demo) prints. TestReadmeLifecycle runs the same commands
// in-process against a real Postgres and compares their output with README's,
// byte for byte but for the times the real clock stamps; and it checks the
// facts the transcript's prose relies on against the store itself, so that
// refreshing README can not make a broken lifecycle look right.

const (
	readmePath    = "../../README.md"
	scriptPath    = "../../scripts/lifecycle-demo.sh"
	readmeSection = "### Limits from history: the lifecycle"
)

// step is one "$ command" of the transcript and the output README shows.
type step struct {
	line   string // after "$ ", comment included
	output string
}

// readmeTranscript returns the first console block of README's lifecycle
// section, split into steps.
func readmeTranscript(t *testing.T) []step {
	t.Helper()
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+readmeSection+"\n")
	if !ok {
		t.Fatalf("README has no section %q", readmeSection)
	}
	_, block, ok := strings.Cut(section, "```console\n")
	if !ok {
		t.Fatalf("README's %q has no ```console block", readmeSection)
	}
	block, _, ok = strings.Cut(block, "```\n")
	if !ok {
		t.Fatal("README's transcript block does not end")
	}
	var steps []step
	for _, line := range strings.SplitAfter(block, "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, step{line: strings.TrimSuffix(cmd, "\n")})
			continue
		}
		if len(steps) == 0 {
			t.Fatalf("README's transcript starts with %q, not a $ command", line)
		}
		steps[len(steps)-1].output += line
	}
	for i := range steps {
		// A blank line separates a step from the next; it is the script's
		// echo, not the command's output.
		if o := steps[i].output; o == "\n" || strings.HasSuffix(o, "\n\n") {
			steps[i].output = o[:len(o)-1]
		}
	}
	return steps
}

// scriptLines returns the command lines scripts/lifecycle-demo.sh runs:
// its run '…' and run "…" lines, with $now as the script sets it.
func scriptLines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(scriptPath)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^now="\$\{LIFECYCLE_NOW:-([^}]+)\}"$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("lifecycle-demo.sh: no now=\"${LIFECYCLE_NOW:-…}\" line")
	}
	now := string(m[1])
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^run (?:'([^']*)'|"([^"]*)")$`).FindAllSubmatch(b, -1) {
		if len(m[1]) > 0 {
			out = append(out, string(m[1]))
		} else {
			out = append(out, strings.ReplaceAll(string(m[2]), "$now", now))
		}
	}
	return out
}

// shellWords splits a command line as the shell would for these lines:
// words separated by spaces, '…' and "…" quoting (no escapes inside),
// and a # that starts a word starting a comment.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case r == '#' && !in:
			return words
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("unterminated quote in %q", line)
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

var (
	// The audit log's times and a proposal's created_at come from the real
	// clock; everything else is fixed by the transcript's clock.
	auditTime   = regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ`)
	decidedTime = regexp.MustCompile(`"(created_at|decided_at)": "[^"]*"`)
)

func maskTimes(s string) string {
	s = auditTime.ReplaceAllString(s, "YYYY-MM-DD hh:mm:ssZ")
	return decidedTime.ReplaceAllString(s, `"$1": "…"`)
}

func TestShellWords(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`configurator migrate   # once, and after`, []string{"configurator", "migrate"}},
		{`a --reason "x; y # z" b`, []string{"a", "--reason", "x; y # z", "b"}},
		{`export A=b   # c`, []string{"export", "A=b"}},
		{`a 'it''s' x#y`, []string{"a", "its", "x#y"}},
	} {
		if got := shellWords(t, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("shellWords(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestReadmeLifecycle(t *testing.T) {
	steps := readmeTranscript(t)
	var lines []string
	for _, s := range steps {
		lines = append(lines, s.line)
	}
	if script := scriptLines(t); !slices.Equal(lines, script) {
		t.Fatalf("README's transcript and scripts/lifecycle-demo.sh run different commands:\nREADME:\n  %s\nscript:\n  %s",
			strings.Join(lines, "\n  "), strings.Join(script, "\n  "))
	}

	url := pgtest.URL(t)
	vars := env{} // what the transcript exports; no USER, no OS user: every write names its --actor
	outputs := map[string]string{}
	for i, s := range steps {
		words := shellWords(t, s.line)
		if words[0] == "export" {
			k, v, _ := strings.Cut(words[1], "=")
			if k == "SLUICE_CONFIGURATOR_DATABASE_URL" {
				v = url // this test's database, not the script's
			}
			vars[k] = v
			if s.output != "" {
				t.Errorf("step %d %q: README shows output %q", i, s.line, s.output)
			}
			continue
		}
		if words[0] != "configurator" {
			t.Fatalf("step %d %q: neither export nor configurator", i, s.line)
		}
		cmd := NewCommand(Options{LookupEnv: vars.lookup, CurrentUser: noUser})
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(words[1:])
		if err := cmd.ExecuteContext(t.Context()); err != nil {
			t.Fatalf("step %d: configurator %s: %v\n%s", i, strings.Join(words[1:], " "), err, errOut.String())
		}
		if errOut.Len() > 0 {
			t.Errorf("step %d %q wrote to stderr, which the transcript does not show:\n%s", i, s.line, errOut.String())
		}
		got := out.String()
		outputs[strings.Join(words[1:min(3, len(words))], " ")] = got
		if maskTimes(got) != maskTimes(s.output) {
			t.Errorf("step %d: $ %s\nREADME shows (make lifecycle-demo prints the transcript afresh):\n%s\nthe command prints:\n%s",
				i, s.line, s.output, got)
		}
	}

	// The facts the transcript tells, from the store.
	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ps, err := st.Proposals(t.Context(), history.Filter{}, history.Approved, history.Pending, history.Rejected, history.Superseded)
	if err != nil {
		t.Fatal(err)
	}
	proposed := map[history.Bucket]history.Proposal{}
	for _, p := range ps {
		proposed[p.Bucket] = p
	}
	orders := history.Bucket{Callee: "orders", Caller: "checkout"}
	charges := history.Bucket{Callee: "checkout", Caller: "web", Procedure: "create-charge"}
	if len(ps) != 4 || proposed[web].Status != history.Approved || proposed[mobile].Status != history.Approved ||
		proposed[orders].Status != history.Approved || proposed[charges].Status != history.Approved {
		t.Errorf("proposals: %+v; want web, mobile, orders/checkout and checkout/web/create-charge, all approved", ps)
	}
	if f := proposed[mobile].Flags; !slices.Contains(f, FlagStepDown) || !slices.Contains(f, FlagReplacesManual) {
		t.Errorf("mobile's proposal flags %q; want a step down that replaces the manual limit", f)
	}
	if c := proposed[mobile].Current; c == nil || *c != 1000 {
		t.Errorf("mobile's proposal was against %v; want the manual 1000", c)
	}
	if _, ok := proposed[batch]; ok || !regexp.MustCompile(`checkout +batch +3 days of history, need 7`).MatchString(outputs["derive --actor"]) {
		t.Errorf("batch was not refused for too little history:\n%s", outputs["derive --actor"])
	}
	if out := outputs["approve --all"]; !regexp.MustCompile(`skipped 1 proposal flagged "step down needs approval"(.|\n)*checkout +mobile`).MatchString(out) ||
		strings.Contains(strings.Split(out, "skipped")[0], "mobile") {
		t.Errorf("approve --all did not skip mobile's step down:\n%s", out)
	}
	if out := outputs["backtest checkout"]; strings.Count(out, " 0% of ") != 3 {
		t.Errorf("backtest: want three buckets without a drop:\n%s", out)
	}

	lim := limitsOf(t, st)
	for b, want := range map[history.Bucket]float64{web: proposed[web].Proposed, mobile: proposed[mobile].Proposed, orders: proposed[orders].Proposed} {
		if l := lim[b]; l.Limit != want || l.Source != history.Derived || *l.Mode != dropratio.Enforce || l.UpdatedBy != "carol" {
			t.Errorf("%s limit %+v; want %v, derived, enforced, by carol", bucketString(b), l, want)
		}
	}
	// The procedure steps: what the controller would load from the store.
	stored, err := st.Limits(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	set, err := limits.FromHistory(stored)
	if err != nil {
		t.Fatalf("the limits the transcript leaves do not load: %v", err)
	}
	svc := set.Service("checkout")
	if got := svc.Declared; !slices.Equal(got, []string{"create-charge", "get-item"}) {
		t.Errorf("checkout declares %q, want the two routes' procedures", got)
	}
	if got, want := svc.LeafLimit("web", "create-charge"), proposed[charges].Proposed; got != want {
		t.Errorf("checkout/web/create-charge's limit %v, want the approved %v", got, want)
	}
	if got := svc.ProcedureCapacity("create-charge"); got != 400 {
		t.Errorf("create-charge's capacity %v, want 400", got)
	}

	entries, err := st.Audit(t.Context(), history.Filter{}, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range entries {
		count[e.Actor+" "+e.Action]++
	}
	want := map[string]int{
		"alice write_history": 4 + 6, "alice set_limit": 1, "alice set_routes": 1,
		"bob propose": 3 + 1, "carol approve": 3 + 1, "carol set_mode": 2, "carol set_limit": 1,
	}
	if !maps.Equal(count, want) {
		t.Errorf("audit log by actor and action: %v, want %v", count, want)
	}
}
