package limits

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

var change = history.Change{Actor: "test", Reason: "test"}

func TestFromHistory(t *testing.T) {
	capacity, def := 1000.0, 200.0
	set, err := FromHistory(history.Limits{
		Services: []history.ServiceLimits{{Callee: "checkout", Capacity: &capacity, DefaultLimit: &def, Mode: new(dropratio.Shadow), FailMode: new(dataplane.FailHold)}},
		Buckets: []history.BucketLimit{
			{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 100, Mode: new(dropratio.Enforce)},
			{Bucket: history.Bucket{Callee: "orders", Caller: "web"}, Limit: 0},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	co := set.Service("checkout")
	if co.Capacity != 1000 || co.DefaultLimit != 200 || co.Mode != dropratio.Shadow || co.FailMode != dataplane.FailHold {
		t.Errorf("checkout = %+v", co)
	}
	if b := co.Bucket("web"); b != (Bucket{Limit: 100, Mode: dropratio.Enforce}) {
		t.Errorf("checkout/web = %+v", b)
	}
	if b := co.Bucket("other"); b != (Bucket{Limit: 200, Mode: dropratio.Shadow}) {
		t.Errorf("checkout/other = %+v, want the service default in its mode", b)
	}
	or := set.Service("orders")
	if !math.IsInf(or.Capacity, 1) || or.Bucket("web") != (Bucket{Limit: 0, Mode: dropratio.Enforce}) || or.FailMode != dataplane.FailOpen {
		t.Errorf("orders = %+v, want no capacity, web blocked, fail open", or)
	}
}

// A setting the store holds but sluice does not know is an error that names
// it, never a default: an unknown fail mode must not become open.
func TestFromHistoryRefusesUnknownSettings(t *testing.T) {
	set, err := FromHistory(history.Limits{
		Services: []history.ServiceLimits{
			{Callee: "checkout", FailMode: new(dataplane.FailMode(3))},
			{Callee: "orders", Mode: new(dropratio.Mode(2)), Enforcement: new(dataplane.Enforcement(2))},
		},
		Buckets: []history.BucketLimit{
			{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 1, Mode: new(dropratio.Mode(5)), Enforcement: new(dataplane.Enforcement(9))},
		},
	})
	if set != nil || err == nil {
		t.Fatalf("FromHistory = %v, %v; want an error", set, err)
	}
	for _, want := range []string{
		`service checkout: fail_mode: FailMode(3) is not open, hold or local`,
		`service orders: mode: Mode(2) is not enforce or shadow`,
		`service orders: enforcement: Enforcement(2) is not sidecar or upstream`,
		`limit checkout/web: mode: Mode(5) is not enforce or shadow`,
		`limit checkout/web: enforcement: Enforcement(9) is not sidecar or upstream`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %s:\n%v", want, err)
		}
	}
}

// fixed is the in-memory store, its Limits replaced by fixed ones.
type fixed struct {
	*history.Memory
	limits history.Limits
}

func (f fixed) Limits(context.Context) (history.Limits, error) { return f.limits, nil }

// A store whose limits name an unknown fail mode is not ready, and a Store
// that read good limits before keeps them.
func TestStoreRefusesUnknownFailMode(t *testing.T) {
	ctx := t.Context()
	bad := history.Limits{Services: []history.ServiceLimits{{Callee: "checkout", FailMode: new(dataplane.FailMode(3))}}}
	var reloads []error
	s := NewStore(fixed{history.NewMemory(), bad}, time.Hour, nil)
	s.OnReload = func(err error) { reloads = append(reloads, err) }
	s.reload(ctx)
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "fail_mode") {
		t.Errorf("Ready() = %v, want an error naming fail_mode", err)
	}
	if len(reloads) != 1 || reloads[0] == nil {
		t.Errorf("OnReload got %v, want one error", reloads)
	}
	if s.Limits().Len() != 0 {
		t.Errorf("limits %v, want none", s.Limits().Services())
	}

	good := history.Limits{Services: []history.ServiceLimits{{Callee: "checkout", FailMode: new(dataplane.FailHold)}}}
	s.store = fixed{history.NewMemory(), good}
	s.reload(ctx)
	s.store = fixed{history.NewMemory(), bad}
	s.reload(ctx)
	if got := s.Limits().Service("checkout"); got == nil || got.FailMode != dataplane.FailHold {
		t.Errorf("checkout after a bad read: %+v, want the last good limits, fail mode hold", got)
	}
}

// failing is the real in-memory store, made to fail Limits on demand.
type failing struct {
	*history.Memory
	mu   sync.Mutex
	fail bool
}

func (f *failing) Limits(ctx context.Context) (history.Limits, error) {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	if fail {
		return history.Limits{}, errors.New("connection refused")
	}
	return f.Memory.Limits(ctx)
}

func TestStoreFollowsChangesAndKeepsLimitsThroughFailures(t *testing.T) {
	mem := &failing{Memory: history.NewMemory(), fail: true}
	ctx, cancel := context.WithCancel(context.Background())
	s := NewStore(mem, time.Hour, nil)
	var mu sync.Mutex
	var reloadErrs int
	s.OnReload = func(err error) {
		if err != nil {
			mu.Lock()
			reloadErrs++
			mu.Unlock()
		}
	}
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("the first read fails", func() bool { mu.Lock(); defer mu.Unlock(); return reloadErrs > 0 })
	if s.Ready() == nil {
		t.Fatal("ready before any limits were read")
	}

	mem.mu.Lock()
	mem.fail = false
	mem.mu.Unlock()
	set := func(limit float64) {
		err := mem.SetLimit(context.Background(), history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: limit}, change)
		if err != nil {
			t.Fatal(err)
		}
	}
	set(100)
	wait("the change notification brings limit 100", func() bool {
		return s.Limits().Service("checkout").Bucket("web").Limit == 100
	})
	if err := s.Ready(); err != nil {
		t.Errorf("not ready after a read: %v", err)
	}

	// The store fails: the last limits stay.
	mem.mu.Lock()
	mem.fail = true
	mem.mu.Unlock()
	set(50)
	wait("the failed read is counted", func() bool { mu.Lock(); defer mu.Unlock(); return reloadErrs > 1 })
	if got := s.Limits().Service("checkout").Bucket("web").Limit; got != 100 {
		t.Errorf("limit while the store fails = %v, want the last read 100", got)
	}
}

// Enforcement through the store: a callee's is its callers' default (but
// the reserved ones'), resolved when a bucket's limit is written, as its
// mode is.
func TestFromHistoryEnforcement(t *testing.T) {
	ctx := context.Background()
	mem := history.NewMemory()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(mem.SetService(ctx, history.ServiceLimits{Callee: "checkout", Enforcement: new(dataplane.EnforceUpstream)}, change))
	set := func(caller string, e *dataplane.Enforcement) {
		t.Helper()
		must(mem.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: caller}, Limit: 10, Enforcement: e}, change))
	}
	set("web", nil)                              // takes the callee's
	set("batch", new(dataplane.EnforceSidecar))  // its own
	set("unknown", nil)                          // reserved: never the callee's
	set("mobile", new(dataplane.EnforceSidecar)) // its own, then kept
	set("mobile", nil)                           // keeps sidecar
	must(mem.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "orders", Caller: "app"}, Limit: 5, Enforcement: new(dataplane.EnforceUpstream)}, change))
	l, err := mem.Limits(ctx)
	must(err)
	s, err := FromHistory(l)
	must(err)
	for _, tc := range []struct {
		callee, caller string
		want           dataplane.Enforcement
	}{
		{"checkout", "web", dataplane.EnforceUpstream},
		{"checkout", "batch", dataplane.EnforceSidecar},
		{"checkout", "unknown", dataplane.EnforceSidecar},
		{"checkout", "mobile", dataplane.EnforceSidecar},
		{"checkout", "other", dataplane.EnforceUpstream}, // no limit of its own: the service's default
		{"orders", "app", dataplane.EnforceUpstream},
		{"orders", "other", dataplane.EnforceSidecar},
	} {
		if got := s.Service(tc.callee).Bucket(tc.caller).Enforcement; got != tc.want {
			t.Errorf("%s/%s: %v, want %v", tc.callee, tc.caller, got, tc.want)
		}
	}
	if err := mem.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "a", Caller: "b"}, Limit: 1, Enforcement: new(dataplane.Enforcement(2))}, change); err == nil ||
		!strings.Contains(err.Error(), "limit.enforcement") {
		t.Errorf("SetLimit with enforcement 2: %v, want an error naming limit.enforcement", err)
	}
}
