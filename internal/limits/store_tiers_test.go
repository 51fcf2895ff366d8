package limits

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/history"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const tiersCostYAML = `
services:
  ledger:
    capacity: 10000
    slo: {latency_p99: 250ms, errors: 0.5%}
    criticality:
      from: header x-tier
      default: SHEDDABLE_PLUS
      max: CRITICAL
    callers:
      web:   {limit: 6000, criticality: CRITICAL, max_criticality: CRITICAL_PLUS}
      batch: {limit: 8000, criticality: SHEDDABLE, max_concurrency: 12}
    procedures:
      /ledger.Ledger/Post: {criticality: CRITICAL_PLUS}
  llm:
    unit: cost
    capacity: 20000
    default_limit: 900
    cost:
      default: 2
      from: header x-sluice-request-cost
      response: x-sluice-cost
      max: 5000
    callers:
      chat: {limit: 5000, max_concurrency: 40}
      ops:  {max_concurrency: 3}
    procedures:
      /llm.Chat/Complete:
        cost: 10
        capacity: 8000
        callers:
          chat: {max_concurrency: 5}
          ops:  {limit: 100}
`

// The same limits written to Postgres, through the store's API, read back
// as the Set the limits file makes: tiers, cost, caps and an objective
// included.
func TestFromHistoryTiersCostEqualsFile(t *testing.T) {
	ctx := context.Background()
	want, err := Parse(strings.NewReader(tiersCostYAML))
	if err != nil {
		t.Fatal(err)
	}
	url := pgtest.URL(t)
	if _, err := history.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	st, err := history.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := history.Change{Actor: "alice", Reason: "as the file"}
	f := func(v float64) *float64 { return &v }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(st.SetService(ctx, history.ServiceLimits{Callee: "ledger", Capacity: f(10000),
		Criticality: &history.CriticalitySettings{Header: "x-tier", Default: criticality.SheddablePlus},
		SLO:         &history.ObjectiveSettings{LatencyP99: 250 * time.Millisecond, Errors: 0.005}}, c))
	must(st.SetService(ctx, history.ServiceLimits{Callee: "llm", Capacity: f(20000), DefaultLimit: f(900),
		Cost: &history.CostSettings{Default: f(2), Max: f(5000), RequestHeader: "x-sluice-request-cost", ResponseHeader: "x-sluice-cost"}}, c))
	for _, l := range []history.BucketLimit{
		{Bucket: history.Bucket{Callee: "ledger", Caller: "web"}, Limit: 6000},
		{Bucket: history.Bucket{Callee: "ledger", Caller: "batch"}, Limit: 8000},
		{Bucket: history.Bucket{Callee: "llm", Caller: "chat"}, Limit: 5000},
		{Bucket: history.Bucket{Callee: "llm", Caller: history.AnyCaller, Procedure: "/llm.Chat/Complete"}, Limit: 8000},
		{Bucket: history.Bucket{Callee: "llm", Caller: "ops", Procedure: "/llm.Chat/Complete"}, Limit: 100},
	} {
		must(st.SetLimit(ctx, l, c))
	}
	for _, s := range []history.BucketSettings{
		{Bucket: history.Bucket{Callee: "ledger", Caller: "web"}, Criticality: criticality.Critical, MaxCriticality: criticality.CriticalPlus},
		{Bucket: history.Bucket{Callee: "ledger", Caller: "batch"}, Criticality: criticality.Sheddable, MaxConcurrency: 12},
		{Bucket: history.Bucket{Callee: "ledger", Caller: history.AnyCaller, Procedure: "/ledger.Ledger/Post"}, Criticality: criticality.CriticalPlus},
		{Bucket: history.Bucket{Callee: "llm", Caller: "chat"}, MaxConcurrency: 40},
		{Bucket: history.Bucket{Callee: "llm", Caller: "ops"}, MaxConcurrency: 3},
		{Bucket: history.Bucket{Callee: "llm", Caller: history.AnyCaller, Procedure: "/llm.Chat/Complete"}, Cost: f(10)},
		{Bucket: history.Bucket{Callee: "llm", Caller: "chat", Procedure: "/llm.Chat/Complete"}, MaxConcurrency: 5},
	} {
		must(st.SetSettings(ctx, s, c))
	}
	l, err := st.Limits(ctx)
	must(err)
	got, err := FromHistory(l)
	must(err)
	if !reflect.DeepEqual(got.Services(), want.Services()) {
		t.Fatalf("services %v, want %v", got.Services(), want.Services())
	}
	for _, name := range want.Services() {
		// nil and empty maps are the same limits: EquateEmpty.
		if d := gocmp.Diff(want.Service(name), got.Service(name), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s from Postgres differs from the file's (-file +postgres):\n%s", name, d)
		}
	}
	if !reflect.DeepEqual(got.Warnings(), want.Warnings()) {
		t.Errorf("warnings %q, the file's %q", got.Warnings(), want.Warnings())
	}
}

// Stored settings no limits file could say are errors naming the row.
func TestFromHistoryRefusesTiersCostMisfits(t *testing.T) {
	up := dataplane.EnforceUpstream
	f := func(v float64) *float64 { return &v }
	_, err := FromHistory(history.Limits{
		Services: []history.ServiceLimits{
			{Callee: "plain"},
			{Callee: "tiered", Enforcement: &up, Criticality: &history.CriticalitySettings{}},
			{Callee: "cheap", Cost: &history.CostSettings{Max: f(5)}},
			{Callee: "priced", Cost: &history.CostSettings{}, SLO: &history.ObjectiveSettings{Errors: 0.01}},
			{Callee: "vague", SLO: &history.ObjectiveSettings{}},
		},
		Buckets: []history.BucketLimit{{Bucket: history.Bucket{Callee: "cheap", Caller: "app"}, Limit: 1, Enforcement: &up}},
		Settings: []history.BucketSettings{
			{Bucket: history.Bucket{Callee: "plain", Caller: "web"}, Criticality: criticality.Critical},
			{Bucket: history.Bucket{Callee: "plain", Caller: history.AnyCaller, Procedure: "/p.P/M"}, Cost: f(1)},
			{Bucket: history.Bucket{Callee: "cheap", Caller: history.AnyCaller, Procedure: "/p.P/M"}, Cost: f(9)},
			{Bucket: history.Bucket{Callee: "cheap", Caller: "app"}, MaxConcurrency: 2},
		},
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"settings plain/web: criticality: needs the criticality of plain",
		"settings plain/*//p.P/M: cost: needs unit cost on plain",
		"settings cheap/*//p.P/M: cost: 9 is above the service's cost.max 5",
		"settings cheap/app: max_concurrency: upstream",
		"service tiered: enforcement: upstream: the service has criticality tiers",
		"limit cheap/app: enforcement: upstream: the service counts cost",
		"service priced: slo: not with unit: cost",
		"service vague: slo: latency_p99, errors: neither is set",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
