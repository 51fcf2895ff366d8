package configurator

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/history"
)

// set's objective flags (issue #18) on a real Postgres: the controller
// loads the objective set, each flag sets its half, "none" unsets it, and
// bad values are refused naming the flag, before anything is written.
func TestSetObjectivePostgres(t *testing.T) {
	url := pgtest.URL(t)
	mustPG(t, url, "migrate")
	out := mustPG(t, url, "set", "search", "--capacity", "900", "--slo-latency-p99", "200ms", "--slo-errors", "1%", "--reason", "capacity from health")
	if !strings.Contains(out, "slo (latency_p99 200ms, errors 1%)") {
		t.Errorf("set search prints %q, want its objective", out)
	}
	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	objective := func() adaptive.Objective {
		t.Helper()
		lim, err := st.Limits(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		set, err := limits.FromHistory(lim)
		if err != nil {
			t.Fatal(err)
		}
		return set.Service("search").SLO
	}
	if got, want := objective(), (adaptive.Objective{LatencyP99: 200 * time.Millisecond, Errors: 0.01}); got != want {
		t.Errorf("the controller loads search's objective %+v, want %+v", got, want)
	}
	mustPG(t, url, "set", "search", "--slo-errors", "none", "--reason", "latency alone")
	if got, want := objective(), (adaptive.Objective{LatencyP99: 200 * time.Millisecond}); got != want {
		t.Errorf("after --slo-errors none: %+v, want %+v", got, want)
	}
	mustPG(t, url, "set", "search", "--slo-latency-p99", "none", "--reason", "no objective")
	if got := objective(); got != (adaptive.Objective{}) {
		t.Errorf("after --slo-latency-p99 none: %+v, want none", got)
	}

	mustPG(t, url, "set", "llm", "--unit", "cost", "--reason", "tokens")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "search", "--slo-latency-p99", "fast"}, `--slo-latency-p99 "fast"`},
		{[]string{"set", "search", "--slo-latency-p99", "48h"}, `--slo-latency-p99 "48h": at most 24h0m0s`},
		{[]string{"set", "search", "--slo-errors", "100%"}, `--slo-errors: "100%" is not a share`},
		{[]string{"set", "search/web", "--slo-errors", "1%"}, `--slo-errors is a callee's setting`},
		{[]string{"set", "llm", "--slo-errors", "1%"}, `slo: not with unit: cost`},
	} {
		_, err := runPG(t, url, append(c.args, "--reason", "r")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("configurator %s: error %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	if got := objective(); got != (adaptive.Objective{}) {
		t.Errorf("after refused sets: search's objective %+v, want none still", got)
	}
}
