package limits

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

const good = `
services:
  checkout:
    capacity: 1000
    default_limit: 200
    fail_mode: hold
    callers:
      web:   {limit: 100}
      batch: {limit: 50, mode: shadow}
  orders:
    mode: shadow
    callers:
      web: {limit: 0}
`

func TestParse(t *testing.T) {
	set, err := Parse(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Services(); strings.Join(got, ",") != "checkout,orders" {
		t.Errorf("services = %v", got)
	}
	co := set.Service("checkout")
	if co.Capacity != 1000 || co.DefaultLimit != 200 || co.Mode != dropratio.Enforce || co.FailMode != dataplane.FailHold {
		t.Errorf("checkout = %+v", co)
	}
	for _, tc := range []struct {
		svc, caller string
		want        Bucket
	}{
		{"checkout", "web", Bucket{Limit: 100, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar}},
		{"checkout", "batch", Bucket{Limit: 50, Mode: dropratio.Shadow, Enforcement: dataplane.EnforceSidecar}},
		{"checkout", "other", Bucket{Limit: 200, Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar}},           // the default limit
		{"orders", "web", Bucket{Limit: 0, Mode: dropratio.Shadow, Enforcement: dataplane.EnforceSidecar}},                  // inherits the service's mode
		{"orders", "other", Bucket{Limit: math.Inf(1), Mode: dropratio.Shadow, Enforcement: dataplane.EnforceSidecar}},      // no default: unlimited
		{"unconfigured", "web", Bucket{Limit: math.Inf(1), Mode: dropratio.Enforce, Enforcement: dataplane.EnforceSidecar}}, // no limits at all
	} {
		if got := set.Service(tc.svc).Bucket(tc.caller); got != tc.want {
			t.Errorf("%s/%s = %+v, want %+v", tc.svc, tc.caller, got, tc.want)
		}
	}
	if o := set.Service("orders"); !math.IsInf(o.Capacity, 1) || o.FailMode != dataplane.FailOpen {
		t.Errorf("orders defaults = %+v", o)
	}
}

func TestParseReportsEveryProblemWithItsPath(t *testing.T) {
	bad := `
services:
  checkout:
    capacity: -1
    mode: strict
    fail_mode: closed
    callers:
      web: {limit: .nan}
      "bad name": {limit: 1}
      nolimit: {mode: shadow}
`
	_, err := Parse(strings.NewReader(bad))
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{
		"services.checkout.capacity", "services.checkout.mode", "services.checkout.fail_mode",
		"services.checkout.callers.web.limit", "services.checkout.callers.bad name", "services.checkout.callers.nolimit.limit: missing",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestParseRejectsUnknownFields(t *testing.T) {
	_, err := Parse(strings.NewReader("services:\n  checkout:\n    capacty: 5\n"))
	if err == nil || !strings.Contains(err.Error(), "capacty") {
		t.Errorf("typo accepted: %v", err)
	}
}

func TestEmptyDocument(t *testing.T) {
	set, err := Parse(strings.NewReader(""))
	if err != nil || set.Len() != 0 {
		t.Errorf("empty = %v, %v", set, err)
	}
}

func TestFileReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := LoadFile(context.Background(), path, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	reloads := make(chan error, 10)
	f.OnReload = func(err error) { reloads <- err }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	wait := func() error {
		select {
		case err := <-reloads:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("no reload")
			return nil
		}
	}

	writeAtomically(t, path, "services:\n  checkout:\n    callers:\n      web: {limit: 7}\n")
	if err := wait(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := f.Limits().Service("checkout").Bucket("web").Limit; got != 7 {
		t.Errorf("limit after reload = %v, want 7", got)
	}

	// A bad edit is reported once and the last good limits stay.
	writeAtomically(t, path, "services: [nonsense")
	if err := wait(); err == nil {
		t.Fatal("bad file reloaded without error")
	}
	if got := f.Limits().Service("checkout").Bucket("web").Limit; got != 7 {
		t.Errorf("limit after a bad edit = %v, want the last good 7", got)
	}
	select {
	case err := <-reloads:
		t.Errorf("the same bad contents were reloaded again: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// writeAtomically replaces path as editors and ConfigMap updates do: the
// poller never sees a half-written file.
func writeAtomically(t *testing.T, path, contents string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(contents), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyReloadKeepsLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	os.WriteFile(path, []byte(good), 0o644)
	f, err := LoadFile(context.Background(), path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	var reloads int
	f.OnReload = func(error) { reloads++ }
	os.WriteFile(path, nil, 0o644) // a writer's truncate, before its write
	f.reload(context.Background())
	if f.Limits().Service("checkout") == nil || reloads != 0 {
		t.Errorf("an empty read replaced the limits (reloads %d)", reloads)
	}
	os.WriteFile(path, []byte("services: {}\n"), 0o644)
	f.reload(context.Background())
	if f.Limits().Len() != 0 || reloads != 1 {
		t.Errorf("services: {} did not remove every limit: %d left", f.Limits().Len())
	}
}

func TestLoadFileFailsAtStartup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	os.WriteFile(path, []byte("services:\n  x:\n    callers:\n      web: {limit: -3}\n"), 0o644)
	_, err := LoadFile(context.Background(), path, 0, nil)
	if err == nil || !strings.Contains(err.Error(), "services.x.callers.web.limit") || !strings.Contains(err.Error(), path) {
		t.Errorf("LoadFile = %v, want an error naming the file and the field", err)
	}
	if _, err := LoadFile(context.Background(), filepath.Join(t.TempDir(), "missing.yaml"), 0, nil); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestParseEnforcement(t *testing.T) {
	set, err := Parse(strings.NewReader(`
services:
  checkout:              # fronted by Envoy: every named caller upstream
    enforcement: upstream
    default_limit: 10
    callers:
      web:     {limit: 100, enforcement: sidecar}
      app:     {limit: 5}
      unknown: {limit: 1}
  orders:
    callers:
      mobile: {limit: 3, enforcement: upstream} # a proxyless gRPC client
      web:    {limit: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		svc, caller string
		want        dataplane.Enforcement
	}{
		{"checkout", "web", dataplane.EnforceSidecar},       // its own overrides the service's
		{"checkout", "app", dataplane.EnforceUpstream},      // inherits the service's
		{"checkout", "other", dataplane.EnforceUpstream},    // no entry: the service's
		{"checkout", "unknown", dataplane.EnforceSidecar},   // reserved: never inherits
		{"checkout", "_overflow", dataplane.EnforceSidecar}, // reserved: never inherits
		{"orders", "mobile", dataplane.EnforceUpstream},
		{"orders", "web", dataplane.EnforceSidecar},
		{"orders", "other", dataplane.EnforceSidecar},
		{"unconfigured", "web", dataplane.EnforceSidecar},
	} {
		if got := set.Service(tc.svc).Bucket(tc.caller).Enforcement; got != tc.want {
			t.Errorf("%s/%s: enforcement %v, want %v", tc.svc, tc.caller, got, tc.want)
		}
	}
	if got := set.Service("checkout").Enforcement; got != dataplane.EnforceUpstream {
		t.Errorf("checkout's default enforcement = %v, want upstream", got)
	}

	_, err = Parse(strings.NewReader(`
services:
  checkout:
    enforcement: envoy
    callers:
      web: {limit: 1, enforcement: proxyless}
`))
	for _, want := range []string{
		`services.checkout.enforcement: "envoy" is not sidecar or upstream`,
		`services.checkout.callers.web.enforcement: "proxyless" is not sidecar or upstream`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}
