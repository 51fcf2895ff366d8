package controller

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
)

func parseLimits(t *testing.T, doc string) *limits.Set {
	t.Helper()
	set, err := limits.Parse(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// Buckets the limits declare enforced upstream are marked in the callee's
// policy, with their ratio, and MODE_SHADOW on the wire; every other bucket
// is as before.
func TestUpstreamBucketsAreMarked(t *testing.T) {
	set := parseLimits(t, `
services:
  checkout:              # fronted by Envoy
    enforcement: upstream
    default_limit: 100
    callers:
      web:     {limit: 100, enforcement: sidecar}
      app:     {limit: 100}
      batch:   {limit: 100, mode: shadow}
      unknown: {limit: 100}
  orders:
    callers:
      mobile: {limit: 50, enforcement: upstream} # a proxyless gRPC client
      web:    {limit: 50}
`)
	s := warmState(t)
	now := t0.Add(2 * time.Second)
	if err := s.Apply(zoneLoad("a", "zone-a", 2, map[string]float64{
		"checkout/web": 200, "checkout/app": 200, "checkout/batch": 200, "checkout/unknown": 200, "checkout/other": 200,
		"orders/mobile": 100, "orders/web": 100,
	}), now); err != nil {
		t.Fatal(err)
	}
	res := s.Tick(now, set)
	for _, tc := range []struct {
		policy, peer string
		mode         sluicev1.Mode
		upstream     bool
	}{
		{"callee/checkout", "web", sluicev1.Mode_MODE_ENFORCE, false},     // its own says sidecar
		{"callee/checkout", "app", sluicev1.Mode_MODE_SHADOW, true},       // the service's default
		{"callee/checkout", "other", sluicev1.Mode_MODE_SHADOW, true},     // no entry: the service's default
		{"callee/checkout", "batch", sluicev1.Mode_MODE_SHADOW, false},    // shadow: nothing drops it anywhere
		{"callee/checkout", "unknown", sluicev1.Mode_MODE_ENFORCE, false}, // reserved: no Envoy header names it
		{"callee/orders", "mobile", sluicev1.Mode_MODE_SHADOW, true},
		{"callee/orders", "web", sluicev1.Mode_MODE_ENFORCE, false},
	} {
		p := res.Changed[tc.policy]
		if p == nil {
			t.Fatalf("%s not published: %v", tc.policy, slices.Sorted(maps.Keys(res.Changed)))
		}
		pp := peer(p, tc.peer)
		if pp == nil {
			t.Fatalf("%s lists no %s", tc.policy, tc.peer)
		}
		if pp.GetMode() != tc.mode || pp.GetEnforcedUpstream() != tc.upstream {
			t.Errorf("%s %s: mode %v, enforced_upstream %v; want %v, %v", tc.policy, tc.peer, pp.GetMode(), pp.GetEnforcedUpstream(), tc.mode, tc.upstream)
		}
		// The ratio is the bucket's either way: the sidecar weighs
		// arrivals with it, the proxyless routes and runtime layers
		// carry it out.
		if math.Abs(pp.GetDropRatio()-0.5) > 1e-9 {
			t.Errorf("%s %s: ratio %v, want 0.5", tc.policy, tc.peer, pp.GetDropRatio())
		}
	}

	// Declaring a bucket sidecar-enforced again republishes at once.
	later := now.Add(time.Second)
	if err := s.Apply(zoneLoad("a", "zone-a", 2, map[string]float64{
		"checkout/web": 200, "checkout/app": 200, "checkout/batch": 200, "checkout/unknown": 200, "checkout/other": 200,
		"orders/mobile": 100, "orders/web": 100,
	}), later); err != nil {
		t.Fatal(err)
	}
	res = s.Tick(later, parseLimits(t, `
services:
  checkout:
    enforcement: upstream
    default_limit: 100
    callers:
      web:     {limit: 100, enforcement: sidecar}
      app:     {limit: 100}
      batch:   {limit: 100, mode: shadow}
      unknown: {limit: 100}
  orders:
    callers:
      mobile: {limit: 50}
      web:    {limit: 50}
`))
	p := res.Changed["callee/orders"]
	if p == nil {
		t.Fatalf("callee/orders not republished after mobile's enforcement changed: %v", slices.Sorted(maps.Keys(res.Changed)))
	}
	if pp := peer(p, "mobile"); pp.GetEnforcedUpstream() || pp.GetMode() != sluicev1.Mode_MODE_ENFORCE {
		t.Errorf("orders/mobile back to sidecar: mode %v, enforced_upstream %v", pp.GetMode(), pp.GetEnforcedUpstream())
	}
	if res.Changed["callee/checkout"] != nil {
		t.Error("callee/checkout republished though nothing in it changed")
	}
}

// A caller enforced upstream of a callee that declares gRPC methods only
// has each of its leaves marked, each with its own ratio: the proxyless
// routes carry one per method. Its other callers' leaves are as before.
func TestUpstreamLeavesAreMarked(t *testing.T) {
	set := parseLimits(t, `
services:
  checkout:
    callers:
      web:    {limit: 300, enforcement: upstream} # a proxyless gRPC client
      mobile: {limit: 300}
    procedures:
      /shop.Checkout/Pay:
        callers:
          web:    {limit: 40}
          mobile: {limit: 40}
`)
	res := tickOnce(t, set, leafLoad("a", map[string]float64{
		"checkout/web//shop.Checkout/Pay": 200, "checkout/web/_other": 50, "checkout/mobile//shop.Checkout/Pay": 200,
	}))
	p := res.Changed["callee/checkout"]
	if p == nil {
		t.Fatalf("callee/checkout not published: %v", slices.Sorted(maps.Keys(res.Changed)))
	}
	for _, tc := range []struct {
		peer, procedure string
		ratio           float64
		mode            sluicev1.Mode
		upstream        bool
	}{
		{"web", "/shop.Checkout/Pay", 0.8, sluicev1.Mode_MODE_SHADOW, true},
		{"web", "_other", 0, sluicev1.Mode_MODE_SHADOW, true}, // listed: web's limit across procedures
		{"mobile", "/shop.Checkout/Pay", 0.8, sluicev1.Mode_MODE_ENFORCE, false},
	} {
		pp := wantRatio(t, p, tc.peer, tc.procedure, tc.ratio)
		if pp == nil {
			t.Errorf("%s/%s not listed", tc.peer, tc.procedure)
			continue
		}
		if pp.GetMode() != tc.mode || pp.GetEnforcedUpstream() != tc.upstream {
			t.Errorf("%s/%s: mode %v, enforced_upstream %v; want %v, %v", tc.peer, tc.procedure, pp.GetMode(), pp.GetEnforcedUpstream(), tc.mode, tc.upstream)
		}
	}
}
