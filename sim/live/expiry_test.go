package live

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sim"
)

// TestExpiryWatch: the sampled policy states become the stretches the
// simulator reports, each change placed halfway between the samples that
// bracket it, one note per change of a callee.
func TestExpiryWatch(t *testing.T) {
	sc, err := sim.Parse(strings.NewReader(`
duration: 10s
zones: [a]
services:
  api: {sidecars: {a: 2}}
  web: {sidecars: {a: 1}}
limits:
  services:
    api: {fail_mode: local, callers: {x: {limit: 10}}}
flows:
  - {callee: api, caller: x, rate: {constant: 1}}
  - {callee: web, caller: x, rate: {constant: 1}}
`), "watch")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{sc: sc, sidecars: []*sidecarNode{{callee: "api"}, {callee: "api"}, {callee: "web"}}}
	w := newExpiryWatch(c)
	var notes []string
	note := func(at time.Duration, callee, format string, args ...any) {
		notes = append(notes, fmt.Sprintf("%v %s: ", at, callee)+fmt.Sprintf(format, args...))
	}
	yes, no := true, false
	for i, sample := range [][]*bool{
		{&no, &no, &no},
		{&yes, nil, &no}, // the second api sidecar did not answer: as before
		{&yes, &yes, &yes},
		{&no, &yes, &yes},
		{&no, &no, &yes},
	} {
		w.observe(sample, time.Duration(i+1)*time.Second, note)
	}
	got := w.result(10 * time.Second)
	want := []sim.Expiry{
		{Callee: "api", FailMode: "local", TTL: sc.Loop.Controller.PolicyTTL, LiveInstances: 2, From: 1500 * time.Millisecond, To: 4500 * time.Millisecond},
		{Callee: "web", FailMode: "open", TTL: sc.Loop.Controller.PolicyTTL, LiveInstances: 1, From: 2500 * time.Millisecond, To: 10 * time.Second},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("expiries\n%v\nwant\n%v", got, want)
	}
	wantNotes := []string{
		"1.5s api: api: policy expired (30s TTL), fail mode local: at 1 of 2 sidecars by 2.00s",
		"2.5s web: web: policy expired (30s TTL), fail mode open: at 1 of 1 sidecars by 3.00s",
		"4.5s api: api: fresh policy at every sidecar by 5.00s, fail mode over",
	}
	if strings.Join(notes, "\n") != strings.Join(wantNotes, "\n") {
		t.Errorf("notes\n%s\nwant\n%s", strings.Join(notes, "\n"), strings.Join(wantNotes, "\n"))
	}
}
