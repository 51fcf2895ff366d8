package reporter

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// TestWindowReportsDescriptors runs a real Limiter with a descriptor under
// a Window: regular reports carry the window's descriptor counts, bounded
// by the heavy-set size; urgent ones carry none; what came before the
// Window is its baseline.
func TestWindowReportsDescriptors(t *testing.T) {
	const k = 8
	l := sidecar.NewLimiter(sidecar.LimiterOptions{DescriptorHeavy: k})
	l.SetPolicy(&sidecar.Policy{
		Name: names.Callee("api"), Service: "api", LiveInstances: 1,
		Descriptors: []sidecar.DescriptorPolicy{{
			Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"},
			LimitRPS: 20, MissingLimitRPS: 20, Quantile: allowance.DefaultQuantile,
		}},
	})
	s := l.Service("api")
	decide := func(value string, n int) {
		for range n {
			s.Decide("web")
			s.DecideDescriptor(0, value)
		}
	}
	decide("before", 100) // the baseline: never reported
	start := time.Unix(0, 0)
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api"}, Interval: time.Second, SurgeChecks: true}, start, l)

	for v := range 3 * k {
		decide(fmt.Sprint("heavy-", v), 50+v)
	}
	for v := range 1000 {
		decide(fmt.Sprint("light-", v), 1)
	}
	offered := uint64(1000)
	for v := range 3 * k {
		offered += uint64(50 + v)
	}
	rep := w.Tick(start.Add(time.Second), l)
	if len(rep.GetDescriptors()) != 1 {
		t.Fatalf("report has descriptors %v, want tenant", rep.GetDescriptors())
	}
	d := rep.GetDescriptors()[0]
	if d.GetDescriptor_() != "tenant" || d.GetOffered() != offered || d.GetDropped() == 0 || d.GetDropped() > offered {
		t.Errorf("tenant: offered %d dropped %d, want offered %d and some dropped", d.GetOffered(), d.GetDropped(), offered)
	}
	if len(d.GetValues()) != k {
		t.Fatalf("%d values, want the heavy-set bound %d", len(d.GetValues()), k)
	}
	for i, v := range d.GetValues() {
		// The largest, largest first: heavy-23 … heavy-16.
		if want := fmt.Sprint("heavy-", 3*k-1-i); v.GetValue() != want || v.GetOffered() < uint64(50+3*k-1-i) {
			t.Errorf("values[%d] = %s=%d, want %s", i, v.GetValue(), v.GetOffered(), want)
		}
	}

	// A surge report carries no descriptors, and leaves their window
	// running.
	decide("burst", 2000)
	urgent := w.Check(start.Add(1100*time.Millisecond), l)
	if urgent == nil || !urgent.GetUrgent() || len(urgent.GetDescriptors()) != 0 {
		t.Fatalf("surge check: %v", urgent)
	}
	rep = w.Tick(start.Add(2*time.Second), l)
	d = rep.GetDescriptors()[0]
	if d.GetOffered() != 2000 || len(d.GetValues()) != 1 || d.GetValues()[0].GetValue() != "burst" {
		t.Errorf("after the surge: %v", d)
	}
	// The report's window is since the surge report; the descriptors' is
	// since the last regular one, over which their counts ran.
	if rw, dw := rep.GetWindow().AsDuration(), rep.GetDescriptorWindow().AsDuration(); rw != 900*time.Millisecond || dw != time.Second {
		t.Errorf("after the surge: window %v, descriptor window %v; want 900ms and 1s", rw, dw)
	}
}

// TestWindowFoldedTickLeavesDescriptorsDue: a tick that folds its window
// into the next (a surge report came less than half an interval before)
// leaves the descriptors due, and the next report carries them, a surge
// report included; a surge report after that carries none again. Without
// it a sidecar surging just before each tick reported no descriptors, and
// rotated no sketch, while it surged.
func TestWindowFoldedTickLeavesDescriptorsDue(t *testing.T) {
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	l.SetPolicy(&sidecar.Policy{
		Name: names.Callee("api"), Service: "api", LiveInstances: 1,
		Descriptors: []sidecar.DescriptorPolicy{{
			Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"},
			LimitRPS: 20, MissingLimitRPS: 20, Quantile: allowance.DefaultQuantile,
		}},
	})
	s := l.Service("api")
	decide := func(value string, n int) {
		for range n {
			s.Decide("web")
			s.DecideDescriptor(0, value)
		}
	}
	start := time.Unix(0, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api"}, Interval: time.Second, SurgeChecks: true}, start, l)
	decide("calm", 100)
	if rep := w.Tick(at(1000), l); len(rep.GetDescriptors()) != 1 {
		t.Fatalf("first tick: %v", rep)
	}
	decide("calm", 90)
	if rep := w.Check(at(1900), l); rep != nil {
		t.Fatalf("calm check: %v", rep)
	}
	decide("abuser", 500)
	if rep := w.Check(at(1950), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 0 {
		t.Fatalf("surge before the tick: %v", rep)
	}
	if rep := w.Tick(at(2000), l); rep != nil {
		t.Fatalf("tick 50ms after a surge report: %v, want it folded", rep)
	}
	decide("abuser", 500)
	rep := w.Check(at(2050), l)
	if rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 1 {
		t.Fatalf("surge after the folded tick: %v, want the descriptors", rep)
	}
	d := rep.GetDescriptors()[0]
	if d.GetOffered() != 1090 || len(d.GetValues()) == 0 || d.GetValues()[0].GetValue() != "abuser" {
		t.Errorf("descriptors after the folded tick: %v", d)
	}
	if rw, dw := rep.GetWindow().AsDuration(), rep.GetDescriptorWindow().AsDuration(); rw != 100*time.Millisecond || dw != 1050*time.Millisecond {
		t.Errorf("window %v, descriptor window %v; want 100ms and 1.05s", rw, dw)
	}
	decide("abuser", 5000)
	if rep := w.Check(at(2150), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 0 {
		t.Fatalf("next surge: %v, want no descriptors", rep)
	}
}

// TestWindowFoldedTickReportsAtHalfInterval: when no surge report carries
// the descriptors a folded tick left due, the first check at which the
// folded window has grown to half an interval sends the tick's regular
// report with them, not the next tick a whole interval later. In
// tenants-zipf a pinned abuser's sidecar surged as the abuse began and
// folded its tick; the abuser's value then waited for the next tick to be
// reported, unlisted, and the allowance let it through for a second more.
// A service without descriptors still waits for its tick.
func TestWindowFoldedTickReportsAtHalfInterval(t *testing.T) {
	for _, withDescriptors := range []bool{true, false} {
		t.Run(fmt.Sprint("descriptors=", withDescriptors), func(t *testing.T) {
			l := sidecar.NewLimiter(sidecar.LimiterOptions{})
			p := &sidecar.Policy{Name: names.Callee("api"), Service: "api", LiveInstances: 1}
			if withDescriptors {
				p.Descriptors = []sidecar.DescriptorPolicy{{
					Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant-id"},
					LimitRPS: 20, MissingLimitRPS: 20, Quantile: allowance.DefaultQuantile,
				}}
			}
			l.SetPolicy(p)
			s := l.Service("api")
			decide := func(value string, n int) {
				for range n {
					s.Decide("web")
					s.DecideDescriptor(0, value)
				}
			}
			start := time.Unix(0, 0)
			at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
			w := NewWindow(WindowConfig{Header: Header{SidecarID: "a", Service: "api"}, Interval: time.Second, SurgeChecks: true}, start, l)
			decide("calm", 100)
			if rep := w.Tick(at(1000), l); rep == nil {
				t.Fatal("first tick: nil")
			}
			for ms := 1100; ms < 1900; ms += 100 {
				decide("calm", 10)
				if rep := w.Check(at(ms), l); rep != nil {
					t.Fatalf("calm check at %dms: %v", ms, rep)
				}
			}
			decide("abuser", 500)
			if rep := w.Check(at(1900), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 0 {
				t.Fatalf("surge at 1900ms: %v", rep)
			}
			decide("abuser", 500)
			if rep := w.Tick(at(2000), l); rep != nil {
				t.Fatalf("tick 100ms after a surge report: %v, want it folded", rep)
			}
			// The abuser holds its rate: no surge, no fall.
			for ms := 2000; ms < 2400; ms += 100 {
				if ms > 2000 {
					decide("abuser", 500)
				}
				if rep := w.Check(at(ms), l); rep != nil {
					t.Fatalf("check at %dms, %dms since the surge report: %v, want nil", ms, ms-1900, rep)
				}
			}
			decide("abuser", 500)
			rep := w.Check(at(2400), l)
			if !withDescriptors {
				if rep != nil {
					t.Fatalf("check at 2400ms without descriptors: %v, want nil until the tick", rep)
				}
				return
			}
			if rep == nil || rep.GetUrgent() || len(rep.GetDescriptors()) != 1 {
				t.Fatalf("check at 2400ms, half an interval after the surge report: %v, want the folded tick's regular report", rep)
			}
			if rw, dw := rep.GetWindow().AsDuration(), rep.GetDescriptorWindow().AsDuration(); rw != 500*time.Millisecond || dw != 1400*time.Millisecond {
				t.Errorf("window %v, descriptor window %v; want 500ms and 1.4s", rw, dw)
			}
			d := rep.GetDescriptors()[0]
			if d.GetOffered() != 80+3000 || len(d.GetValues()) == 0 || d.GetValues()[0].GetValue() != "abuser" || d.GetValues()[0].GetOffered() != 3000 {
				t.Errorf("descriptors: %v, want 3080 offered, abuser=3000 first", d)
			}
			decide("abuser", 500)
			if rep := w.Check(at(2500), l); rep != nil {
				t.Fatalf("check after the folded tick's report: %v, want nil", rep)
			}
			decide("abuser", 2500)
			rep = w.Tick(at(3000), l)
			if rep == nil || len(rep.GetDescriptors()) != 1 {
				t.Fatalf("next tick: %v", rep)
			}
			if rw, dw := rep.GetWindow().AsDuration(), rep.GetDescriptorWindow().AsDuration(); rw != 600*time.Millisecond || dw != 600*time.Millisecond {
				t.Errorf("next tick: window %v, descriptor window %v; want 600ms each", rw, dw)
			}
		})
	}
}
