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

	// A surge report 100ms into the descriptors' window carries none, and
	// leaves their window running.
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

// TestWindowSurgeReportCarriesHalfAnInterval: a surge report carries the
// descriptors when their window is at least half an interval long, so a
// surging sidecar's values reach the controller at once (tenants-zipf: a
// pinned abuser kept the ratio its first 200 ms earned for two seconds);
// a tick folded into it leaves nothing due; a surge report in a shorter
// window carries none. Without the first rule a sidecar surging just
// before each tick reported no descriptors, and rotated no sketch, while
// it surged.
func TestWindowSurgeReportCarriesHalfAnInterval(t *testing.T) {
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
	rep := w.Check(at(1950), l)
	if rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 1 {
		t.Fatalf("surge 950ms into the descriptors' window: %v, want them", rep)
	}
	d := rep.GetDescriptors()[0]
	if d.GetOffered() != 590 || len(d.GetValues()) == 0 || d.GetValues()[0].GetValue() != "abuser" {
		t.Errorf("descriptors of the surge report: %v", d)
	}
	if rw, dw := rep.GetWindow().AsDuration(), rep.GetDescriptorWindow().AsDuration(); rw != 50*time.Millisecond || dw != 950*time.Millisecond {
		t.Errorf("window %v, descriptor window %v; want 50ms and 950ms", rw, dw)
	}
	if rep := w.Tick(at(2000), l); rep != nil {
		t.Fatalf("tick 50ms after a surge report: %v, want it folded", rep)
	}
	decide("abuser", 500)
	if rep := w.Check(at(2050), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 0 {
		t.Fatalf("surge 100ms after the descriptors' last report: %v, want none: the folded tick left nothing due", rep)
	}
	decide("abuser", 5000)
	if rep := w.Check(at(2150), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 0 {
		t.Fatalf("next surge: %v, want no descriptors", rep)
	}
	decide("abuser", 50000)
	rep = w.Check(at(2450), l)
	if rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 1 {
		t.Fatalf("surge half an interval after the descriptors' last report: %v, want them", rep)
	}
	if dw := rep.GetDescriptorWindow().AsDuration(); dw != 500*time.Millisecond {
		t.Errorf("descriptor window %v, want 500ms", dw)
	}
	if d := rep.GetDescriptors()[0]; d.GetOffered() != 55500 {
		t.Errorf("descriptors: %v, want 55,500 offered", d)
	}
}

// TestWindowFoldedTickReportsAtHalfInterval: when the surge report a tick
// folded into did not carry the descriptors (an earlier one had, less than
// half an interval before) and none carries them after it, the first
// check at which the folded window has grown to half an interval sends
// the tick's regular report with them, not the next tick a whole interval
// later. In tenants-zipf a pinned abuser's sidecar surged as the abuse
// began and folded its tick; the abuser's value then waited for the next
// tick to be reported, unlisted, and the allowance let it through for a
// second more. A service without descriptors still waits for its tick.
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
			for ms := 1100; ms < 1500; ms += 100 {
				decide("calm", 10)
				if rep := w.Check(at(ms), l); rep != nil {
					t.Fatalf("calm check at %dms: %v", ms, rep)
				}
			}
			decide("abuser", 50)
			carried := 0 // the descriptors a report carries: one descriptor or none
			if withDescriptors {
				carried = 1
			}
			if rep := w.Check(at(1500), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != carried {
				t.Fatalf("surge at 1500ms, half an interval into the descriptors' window: %v", rep)
			}
			for ms := 1600; ms < 1900; ms += 100 {
				decide("abuser", 50)
				if rep := w.Check(at(ms), l); rep != nil {
					t.Fatalf("check at %dms, the abuser steady: %v", ms, rep)
				}
			}
			decide("abuser", 500)
			if rep := w.Check(at(1900), l); rep == nil || !rep.GetUrgent() || len(rep.GetDescriptors()) != 0 {
				t.Fatalf("surge at 1900ms, 400ms into the descriptors' window: %v", rep)
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
			if rw, dw := rep.GetWindow().AsDuration(), rep.GetDescriptorWindow().AsDuration(); rw != 500*time.Millisecond || dw != 900*time.Millisecond {
				t.Errorf("window %v, descriptor window %v; want 500ms and 900ms", rw, dw)
			}
			d := rep.GetDescriptors()[0]
			// Since the report at 1500ms: 3 × 50, then 500 a check from 1900ms.
			if d.GetOffered() != 150+3000 || len(d.GetValues()) == 0 || d.GetValues()[0].GetValue() != "abuser" || d.GetValues()[0].GetOffered() != 3150 {
				t.Errorf("descriptors: %v, want 3150 offered, abuser=3150 first", d)
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
