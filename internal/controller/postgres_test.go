package controller

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// pgController runs a controller over a real Postgres history store: limits
// from it, minute rows to it, ticking every 100ms with no warm-up.
type pgController struct {
	db       *history.Postgres
	svc      *Service
	store    *limits.Store
	recorder *Recorder
	reg      *prometheus.Registry
}

func startPGController(t *testing.T) *pgController {
	t.Helper()
	url := pgtest.URL(t)
	ctx := context.Background()
	if _, err := history.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	db, err := history.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	reg := prometheus.NewRegistry()
	store := limits.NewStore(db, time.Hour, nil) // only notifications, no resync
	cfg := DefaultConfig()
	cfg.Tick = 100 * time.Millisecond
	cfg.Warmup = 0
	cfg.PolicyTTL = time.Second
	svc, err := New(cfg, store, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	rc := DefaultRecorderConfig()
	rc.Interval = 100 * time.Millisecond
	rec := NewRecorder(rc, db, nil, reg)
	svc.RecordTo(rec)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 3)
	for _, run := range []func(context.Context) error{store.Run, rec.Run, svc.Run} {
		go func() { run(runCtx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
	})
	return &pgController{db: db, svc: svc, store: store, recorder: rec, reg: reg}
}

// feed keeps one aggregator's flush of web at 500 rps fresh, as a live
// aggregator would.
func (c *pgController) feed() {
	z := zoneLoad("agg-a", "zone-a", 2, map[string]float64{"checkout/web": 500})
	c.svc.mu.Lock()
	c.svc.state.Apply(z, time.Now())
	c.svc.mu.Unlock()
}

func (c *pgController) webPolicy() *sluicev1.PeerPolicy {
	for _, p := range c.svc.Policies() {
		if p.GetName() == "callee/checkout" {
			return peer(p, "web")
		}
	}
	return nil
}

func eventually(t *testing.T, timeout time.Duration, what string, feed func(), cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		if feed != nil {
			feed()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

var change = history.Change{Actor: "test", Reason: "test"}

func TestLimitChangeReachesARunningController(t *testing.T) {
	c := startPGController(t)
	ctx := context.Background()
	if err := c.db.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 100, Mode: new(dropratio.Enforce), Source: history.Manual}, change); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "web is limited to 100", c.feed, func() bool {
		p := c.webPolicy()
		return p != nil && p.LimitRps != nil && *p.LimitRps == 100
	})
	// The change travels by NOTIFY: resync is an hour away.
	if err := c.db.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 250, Mode: new(dropratio.Enforce), Source: history.Manual}, change); err != nil {
		t.Fatal(err)
	}
	took := eventually(t, 10*time.Second, "web's new limit of 250 is in the policy", c.feed, func() bool {
		p := c.webPolicy()
		return p != nil && p.LimitRps != nil && *p.LimitRps == 250
	})
	t.Logf("a limit change reached the published policy %v after its commit", took)
	// The ratio then releases from 0.8 to 0.5 at the law's pace.
	eventually(t, 10*time.Second, "web's ratio settles at 0.5", c.feed, func() bool {
		p := c.webPolicy()
		return p.GetDropRatio() > 0.49 && p.GetDropRatio() < 0.51
	})
}

func TestControllerSurvivesPostgresRestart(t *testing.T) {
	c := startPGController(t)
	ctx := context.Background()
	if err := c.db.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 100, Mode: new(dropratio.Enforce), Source: history.Manual}, change); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "web is limited to 100", c.feed, func() bool {
		p := c.webPolicy()
		return p != nil && p.GetDropRatio() > 0.79
	})

	pgtest.StopServer(t)
	// With Postgres gone the controller keeps its cached limits: web stays
	// at 0.8 through refreshes, and minute rows wait in the buffer.
	// Close a minute into the buffer, whatever the wall clock's minute, so
	// that there is something to write.
	c.recorder.Observe(time.Now().Add(2*time.Minute), nil)
	before := testutil.ToFloat64(c.recorder.m.errors)
	published := testutil.ToFloat64(c.svc.m.published)
	eventually(t, 10*time.Second, "a policy refresh and a failed history write while Postgres is down", c.feed, func() bool {
		return testutil.ToFloat64(c.svc.m.published) > published+1 && testutil.ToFloat64(c.recorder.m.errors) > before
	})
	if p := c.webPolicy(); p == nil || p.GetDropRatio() < 0.79 || p.LimitRps == nil || *p.LimitRps != 100 {
		t.Fatalf("while Postgres is down web's policy is %v, want the cached limit of 100 and ratio 0.8", p)
	}
	if c.recorder.Buffered() == 0 {
		t.Fatal("no minute rows buffered while Postgres is down")
	}

	pgtest.StartServer(t)
	// Back: buffered rows are written, and a new limit arrives by NOTIFY
	// on the reconnected listener.
	eventually(t, 60*time.Second, "buffered minute rows written after Postgres came back", c.feed, func() bool {
		return c.recorder.Buffered() == 0
	})
	rows, err := c.db.Minutes(ctx, history.Bucket{Callee: "checkout", Caller: "web"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil || len(rows) == 0 {
		t.Fatalf("minute rows after the restart: %v, %v", rows, err)
	}
	if err := c.db.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 250, Mode: new(dropratio.Enforce), Source: history.Manual}, change); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a limit changed after the restart reaches the controller", c.feed, func() bool {
		p := c.webPolicy()
		return p != nil && p.LimitRps != nil && *p.LimitRps == 250
	})
}

func TestNoPublishingBeforeLimitsAreRead(t *testing.T) {
	// A store that has never answered: the controller must not publish
	// ratios computed without limits.
	src := limits.NewStore(history.NewMemory(), time.Hour, nil)
	cfg := DefaultConfig()
	cfg.Warmup = 0
	svc, err := New(cfg, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if svc.Ready() == nil {
		t.Error("ready before the limits were read")
	}
	svc.state.Apply(zoneLoad("agg-a", "a", 1, map[string]float64{"checkout/web": 500}), time.Now())
	svc.tick(time.Now())
	if len(svc.Policies()) != 0 {
		t.Errorf("published %v before the limits were read", svc.Policies())
	}
}
