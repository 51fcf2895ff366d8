package limits

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/history"
)

var change = history.Change{Actor: "test", Reason: "test"}

func TestFromHistory(t *testing.T) {
	capacity, def := 1000.0, 200.0
	set := FromHistory(history.Limits{
		Services: []history.ServiceLimits{{Callee: "checkout", Capacity: &capacity, DefaultLimit: &def, Mode: history.Shadow, FailMode: history.FailHold}},
		Buckets: []history.BucketLimit{
			{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Limit: 100, Mode: history.Enforce},
			{Bucket: history.Bucket{Callee: "orders", Caller: "web"}, Limit: 0},
		},
	})
	co := set.Service("checkout")
	if co.Capacity != 1000 || co.DefaultLimit != 200 || co.Mode != dropratio.Shadow || co.FailMode != FailHold {
		t.Errorf("checkout = %+v", co)
	}
	if b := co.Bucket("web"); b != (Bucket{Limit: 100, Mode: dropratio.Enforce}) {
		t.Errorf("checkout/web = %+v", b)
	}
	if b := co.Bucket("other"); b != (Bucket{Limit: 200, Mode: dropratio.Shadow}) {
		t.Errorf("checkout/other = %+v, want the service default in its mode", b)
	}
	or := set.Service("orders")
	if !math.IsInf(or.Capacity, 1) || or.Bucket("web") != (Bucket{Limit: 0, Mode: dropratio.Enforce}) || or.FailMode != FailOpen {
		t.Errorf("orders = %+v, want no capacity, web blocked, fail open", or)
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
	must(mem.SetService(ctx, history.ServiceLimits{Callee: "checkout", Enforcement: history.EnforceUpstream}, change))
	set := func(caller string, e history.Enforcement) {
		t.Helper()
		must(mem.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "checkout", Caller: caller}, Limit: 10, Enforcement: e}, change))
	}
	set("web", "")                        // takes the callee's
	set("batch", history.EnforceSidecar)  // its own
	set("unknown", "")                    // reserved: never the callee's
	set("mobile", history.EnforceSidecar) // its own, then kept
	set("mobile", "")                     // keeps sidecar
	must(mem.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "orders", Caller: "app"}, Limit: 5, Enforcement: history.EnforceUpstream}, change))
	l, err := mem.Limits(ctx)
	must(err)
	s := FromHistory(l)
	for _, tc := range []struct {
		callee, caller string
		want           Enforcement
	}{
		{"checkout", "web", EnforceUpstream},
		{"checkout", "batch", EnforceSidecar},
		{"checkout", "unknown", EnforceSidecar},
		{"checkout", "mobile", EnforceSidecar},
		{"checkout", "other", EnforceUpstream}, // no limit of its own: the service's default
		{"orders", "app", EnforceUpstream},
		{"orders", "other", EnforceSidecar},
	} {
		if got := s.Service(tc.callee).Bucket(tc.caller).Enforcement; got != tc.want {
			t.Errorf("%s/%s: %v, want %v", tc.callee, tc.caller, got, tc.want)
		}
	}
	if err := mem.SetLimit(ctx, history.BucketLimit{Bucket: history.Bucket{Callee: "a", Caller: "b"}, Limit: 1, Enforcement: "envoy"}, change); err == nil ||
		!strings.Contains(err.Error(), "limit.enforcement") {
		t.Errorf("SetLimit with enforcement envoy: %v, want an error naming limit.enforcement", err)
	}
}
