package reporter

import (
	"cmp"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/health"
	"github.com/sluicehq/sluice/sidecar"
	"google.golang.org/protobuf/types/known/durationpb"
)

// WindowConfig configures a Window.
type WindowConfig struct {
	// Header is what every report repeats; its Service is the one whose
	// counters the Source is asked for.
	Header Header
	// Interval is the report interval: a window shorter than half of it
	// (at least MinInterval) folds into the next (see Tick).
	Interval time.Duration
	// SurgeChecks says that Check is called between reports. Without it
	// the Window keeps nothing for them (a snapshot and a detector per
	// sidecar, which scale mode would hold for 100,000 sidecars) and Check
	// reports nothing.
	SurgeChecks bool
	// Project turns on surge projection (see Projector) for a Source
	// that takes provisional ratios (ProvisionalSource), with surge
	// checks every Check. Without SurgeChecks it does nothing.
	Project bool
	Check   time.Duration
	// HealthGate turns on the health fast path (see HealthGate) for an
	// inbound Source that measures its callee's health (HealthSource)
	// and takes provisional ratios, at surge checks: it acts only for a
	// callee whose policy declares an objective. Without SurgeChecks it
	// does nothing.
	HealthGate bool
}

// DefaultProjectSteps is how many projection steps a sidecar takes per
// surge check: a Window.Project every 25 ms at the default 100 ms checks,
// besides the checks, a step closer than half a step to the last one
// skipped. A step reads the counters and sums them by bucket, as a check
// does, and only while the policy has a rule to project from.
const DefaultProjectSteps = 4

// ProvisionalSource is a Source that holds policies and takes provisional
// ratios: sidecar.Limiter.
type ProvisionalSource interface {
	Policy(service string) *sidecar.Policy
	SetProvisional(service string, ps []sidecar.Provisional)
}

// Window is the timing logic of a sidecar's reports without the timers: the
// snapshots of the counters that bound the report window and the last surge
// check's, the SurgeDetector that judges them and the Trail of checks since
// the last report. Tick is the step of the report interval and Check the
// step of a surge check; each returns the report to send at once, or nil,
// and a report it returns starts the next window.
//
// It is pure: time arrives as an argument and the counters are read through
// the Source handed to each step, so the Reporter's loop drives it with real
// tickers and the simulator with its virtual clock, and both run the same
// rules. Not safe for concurrent use.
type Window struct {
	hdr       Header
	minWindow time.Duration
	checks    bool

	surge SurgeDetector
	trail Trail
	proj  *Projector // nil: no projection
	// projThen is the per-bucket counts at the projector's last step
	// (a check or a Project), at projAt; pcur is Project's scratch.
	projThen map[bucket]sidecar.PeerCounts
	projAt   time.Time
	pcur     []sidecar.PeerCounts
	sinceBuf []Since       // since's scratch
	minStep  time.Duration // half a projection step
	// prev is the snapshot at the start of the report window, checked the
	// one at the last surge check (or prev's, since the report); cur is
	// scratch, swapped with prev when a report goes out.
	prev, checked, cur []sidecar.PeerCounts
	prevAt, checkedAt  time.Time
	// before is the snapshot checked held before the last check or
	// report moved it on, at beforeAt: the window since it spans the last
	// two, whatever a report reset, so that a projection that starts
	// soon after a check (or a report) still counts what the surge's
	// onset admitted before it (see Projector.Started).
	before   []sidecar.PeerCounts
	beforeAt time.Time
	// descs is the scratch of the descriptors' counts, reused; descAt is
	// when they were last rotated, the start of their window. descDue says
	// that a tick folded its window into one that did not carry them: the
	// next report whose descriptor window is half an interval long, urgent
	// or not, carries them (see Tick).
	descs   []sidecar.DescriptorCounts
	descAt  time.Time
	descDue bool
	// health is the callee's health since the last regular report, by
	// procedure, taken at the report and, while the health gate judges,
	// at every check; healthAt is when that window began. hscratch is
	// TakeHealth's scratch.
	health   []sidecar.HealthCounts
	hscratch []sidecar.HealthCounts
	healthAt time.Time

	// gate is the health fast path; nil: off. gatePol is the policy its
	// cut was last laid over, gateSum its scratch. projOut is the surge
	// projection's ratios in force, which the gate's cut lays over, and
	// provOut the scratch of the two together.
	gate    *HealthGate
	gatePol *sidecar.Policy
	gateSum health.Counts
	projOut []sidecar.Provisional
	provOut []sidecar.Provisional
}

// HealthSource is a Source that also measures what the callee does with
// the requests it admits (issue #18); sidecar.Limiter implements it. A
// Window whose Source implements it puts the service's health in every
// regular report, over the window since the last one: TakeHealth returns
// what was counted since its last call, reusing dst, so a service has one
// such reader, its Window.
type HealthSource interface {
	TakeHealth(service string, dst []sidecar.HealthCounts) []sidecar.HealthCounts
}

// WindowSource is a Source that learns from each report window (issue
// #16): sidecar.Limiter implements it. EndWindow is called once per
// report, with the time since the previous call: a leaf priced by its
// responses moves its mean reported cost, and a capped leaf's share of its
// concurrency cap follows its part of the bucket's offered rate.
type WindowSource interface {
	EndWindow(service string, window time.Duration)
}

// NewWindow starts the first report window at now: src's counters as they
// are then are the baseline, not reported.
func NewWindow(cfg WindowConfig, now time.Time, src Source) *Window {
	w := &Window{
		hdr:       cfg.Header,
		minWindow: max(cfg.Interval/2, MinInterval),
		checks:    cfg.SurgeChecks,
		prev:      src.AppendCounts(cfg.Header.Service, nil),
		prevAt:    now,
	}
	if ds, ok := src.(DescriptorSource); ok {
		// The baseline, as for the counters: a window starts now.
		w.descs = ds.RotateDescriptors(cfg.Header.Service, w.descs[:0])
		w.descAt = now
	}
	if hs, ok := src.(HealthSource); ok && cfg.Header.Direction == sidecar.Inbound {
		w.hscratch = hs.TakeHealth(cfg.Header.Service, w.hscratch[:0]) // the baseline, not reported
		w.healthAt = now
	}
	if w.checks {
		w.checked, w.checkedAt = slices.Clone(w.prev), now
		w.before, w.beforeAt = slices.Clone(w.prev), now
		w.trail.Reset(w.prev, now)
		// Inbound only: an outbound limiter's projection (a caller's
		// share of a callee's limit) has not been evaluated.
		if _, ok := src.(ProvisionalSource); ok && cfg.Project && cfg.Header.Direction == sidecar.Inbound {
			check := cmp.Or(cfg.Check, DefaultSurgeCheck(cfg.Interval))
			w.proj = NewProjector(cfg.Interval, check, surgeMinCount(w.surge))
			w.projThen, w.projAt = sumByBucket(w.prev), now
			w.minStep = check / (2 * DefaultProjectSteps)
		}
		_, provisional := src.(ProvisionalSource)
		_, measured := src.(HealthSource)
		if cfg.HealthGate && provisional && measured && cfg.Header.Direction == sidecar.Inbound {
			w.gate = NewHealthGate(cfg.Interval)
		}
	}
	return w
}

// Tick is the report interval's step at now: the report of the window since
// the last report, or nil when that window is shorter than half an interval.
// Such a short window is the rest of one a surge report cut short, or the
// gap between a tick read late and the next one on schedule; its rate would
// mean little (the aggregator rejects windows under MinInterval), so it
// folds into the next window instead. The window is measured, not assumed:
// a late tick makes a longer window and the rate stays right.
//
// A report Tick sends carries the descriptors' counts. A tick that folds
// leaves them due unless the report it folds into carried them (see
// sendUrgent): the next report whose descriptor window is half an
// interval long carries them. Otherwise a sidecar whose surge reports keep
// falling within half an interval before its ticks (one a surging tenant
// is pinned to) would report no descriptors, and rotate no sketch, for as
// long as it surges: the tenant's value reached no policy, and the local
// allowance, sized for one interval, counted over several and then
// started afresh (tenants-zipf: a pinned abuser admitted ~140 rps four
// seconds in). When no surge report follows, the first surge check at
// which the folded window has grown to half an interval sends it (see
// Check), not the next tick a whole interval later.
func (w *Window) Tick(now time.Time, src Source) *sluicev1.LoadReport {
	if now.Sub(w.prevAt) < w.minWindow {
		if w.descAt.Before(w.prevAt) {
			w.descDue = true
		}
		return nil
	}
	w.cur = src.AppendCounts(w.hdr.Service, w.cur[:0])
	return w.regular(now, src)
}

// regular sends the regular report of the window since the last report,
// with the descriptors; w.cur holds the counters at now.
func (w *Window) regular(now time.Time, src Source) *sluicev1.LoadReport {
	start := w.prevAt
	rep := w.send(w.prev, w.prevAt, now, false)
	w.addDescriptors(rep, now, src)
	w.addHealth(rep, now, src)
	w.endWindow(start, now, src)
	return rep
}

// addDescriptors ends the descriptors' window at now and puts what src
// counted in it in rep, if src counts descriptors.
func (w *Window) addDescriptors(rep *sluicev1.LoadReport, now time.Time, src Source) {
	w.descDue = false
	ds, ok := src.(DescriptorSource)
	if !ok {
		return
	}
	w.descs = ds.RotateDescriptors(w.hdr.Service, w.descs[:0])
	rep.Descriptors = descriptorsProto(w.descs)
	if len(w.descs) > 0 {
		// The sketch counted since the last rotation, which a surge
		// report since then did not move: its own window.
		rep.DescriptorWindow = durationpb.New(now.Sub(w.descAt))
	}
	w.descAt = now
}

// addHealth puts what the callee did since the last regular report in
// rep, if src measures it: inbound only, the callee being this sidecar's
// app.
func (w *Window) addHealth(rep *sluicev1.LoadReport, now time.Time, src Source) {
	hs, ok := src.(HealthSource)
	if !ok || w.hdr.Direction != sidecar.Inbound {
		return
	}
	w.takeHealth(now, hs)
	rep.Health = healthProto(w.health)
	if len(rep.Health) > 0 {
		rep.HealthWindow = durationpb.New(now.Sub(w.healthAt))
	}
	w.health, w.healthAt = w.health[:0], now
}

// takeHealth adds what the callee answered since the last take to the
// report's window, and to the health gate's span.
func (w *Window) takeHealth(now time.Time, hs HealthSource) {
	w.hscratch = hs.TakeHealth(w.hdr.Service, w.hscratch[:0])
	w.health = mergeHealth(w.health, w.hscratch)
	if w.gate != nil {
		w.gate.Add(now, sumHealth(&w.gateSum, w.hscratch))
	}
}

// gateStep is the health gate's step at a check at now, before the check
// moves w.checked on: it takes the callee's health when the policy
// declares an objective, judges it, and hands ps the provisional ratios
// when the gate's cut changed, or when the policy under it did.
func (w *Window) gateStep(now time.Time, src Source, ps ProvisionalSource) {
	if w.gate == nil || ps == nil {
		return
	}
	pol := ps.Policy(w.hdr.Service)
	var obj adaptive.Objective
	if pol != nil && !pol.Metered() && !expired(src, w.hdr.Service) {
		// A metered service (cost, concurrency caps) takes no
		// provisional ratios, nor does one whose policy expired (its
		// fail mode decides): the gate would judge, and shed nothing.
		obj = pol.Objective
	}
	if obj != (adaptive.Objective{}) {
		w.takeHealth(now, src.(HealthSource))
	}
	// The tiers' shares of what was admitted since the last report (up
	// to an interval): a check window's tenth of a second may show a
	// small sheddable tier none, and the cut would fall on the critical.
	changed := w.gate.Step(now, obj, func() map[bucket]uint64 { return gateAdmitted(pol, w.prev, w.cur) })
	if changed || (w.gate.Shedding() > 0 && pol != w.gatePol) {
		w.setProvisional(ps, pol)
	}
}

// expired reports whether src holds service's policy past its TTL, as a
// sidecar.Limiter says (Status); a Source that does not say holds none.
func expired(src Source, service string) bool {
	st, ok := src.(interface {
		Status(service string) sidecar.PolicyStatus
	})
	return ok && st.Status(service).State == sidecar.Expired
}

// HealthGate returns the share of the admitted load the health gate's
// episode in force sheds (0: none), and how many episodes it began; 0 and
// 0 when the gate is off.
func (w *Window) HealthGate() (shed float64, episodes uint64) {
	if w.gate == nil {
		return 0, 0
	}
	return w.gate.Shedding(), w.gate.Episodes()
}

// setProvisional hands ps the surge projection's ratios in force with the
// health gate's cut, if one is in force, laid over pol's leaves: pol is
// the policy both were read against.
func (w *Window) setProvisional(ps ProvisionalSource, pol *sidecar.Policy) {
	out := w.projOut
	if w.gate != nil {
		w.provOut = w.gate.Overlay(w.provOut, pol, w.projOut)
		out, w.gatePol = w.provOut, pol
	}
	ps.SetProvisional(w.hdr.Service, out)
}

// endWindow ends src's window, begun at start (the report before's end:
// every report ends one), at now, if it learns from windows.
func (w *Window) endWindow(start, now time.Time, src Source) {
	if ws, ok := src.(WindowSource); ok {
		ws.EndWindow(w.hdr.Service, now.Sub(start))
	}
}

// Check is a surge check's step at now: an urgent report when a peer's rate
// jumped (see SurgeDetector), to be sent at once, or nil; it carries the
// descriptors when their window is half an interval long (see
// sendUrgent). It is nil too for a
// check less than MinInterval after the last one or after a report (a late
// tick's successor, or a check that coincides with a report): too short a
// window for a rate the aggregator accepts, so it is left to grow.
//
// When a tick folded its window and left the service's descriptors due,
// and no surge report has carried them since, the first check at which
// the window has grown to half an interval sends the folded tick's
// regular report (not urgent), with them. Waiting for the next tick held
// the descriptors back a whole interval: a value that began to abuse as
// its sidecar surged (a pinned tenant) reached no policy until then, and
// the allowance let it through meanwhile (tenants-zipf: a pinned abuser
// whose sidecar folded the tick after its surge reports was admitted 64 rps
// in its second second, over a sketch window of two intervals, then 160 in
// its third, until the policy listed it).
//
// With projection on, Check also moves the surge projection on and gives
// the Source the provisional ratios in force (see Projector): the
// projection reads the check window's counts, the policy, and the surge
// report the check sends, if any.
func (w *Window) Check(now time.Time, src Source) *sluicev1.LoadReport {
	if !w.checks || now.Sub(w.checkedAt) < MinInterval {
		return nil
	}
	w.cur = src.AppendCounts(w.hdr.Service, w.cur[:0])
	ps, _ := src.(ProvisionalSource)
	w.gateStep(now, src, ps)
	if w.proj == nil || ps == nil {
		return w.check(now, src)
	}
	pol := ps.Policy(w.hdr.Service)
	w.proj.Policy(pol, now)
	if w.proj.Idle() {
		w.projOut = nil
		return w.check(now, src)
	}
	cur := sumByBucket(w.cur)
	w.proj.Started(now, cur, w.since()...)
	rep := w.check(now, src)
	w.projectStep(now, cur, ps, pol)
	return rep
}

// Project is a projection step between surge checks (see Projector), at
// now: it starts the episode of a bucket whose rate since the last report
// already shows a surge, without waiting for the check (Projector.Started),
// and moves every episode on. It reports nothing. A sidecar calls it a few times per
// check (DefaultProjectSteps): at ten times its share, the check window
// that reveals a step has admitted a whole second of the share before the
// check sees it, and the step's first second overshoots by a third
// (step-10x), where a quarter of a window admits a quarter of that.
func (w *Window) Project(now time.Time, src Source) {
	ps, _ := src.(ProvisionalSource)
	if w.proj == nil || ps == nil || now.Sub(w.projAt) < w.minStep {
		return
	}
	pol := ps.Policy(w.hdr.Service)
	w.proj.Policy(pol, now)
	if w.proj.Idle() {
		return // no rule to project from: nothing to read
	}
	w.pcur = src.AppendCounts(w.hdr.Service, w.pcur[:0])
	cur := sumByBucket(w.pcur)
	w.proj.Started(now, cur, w.since()...)
	w.projectStep(now, cur, ps, pol)
}

// since returns the windows a projection may start from (see
// Projector.Started): since the last check, since the check before
// (which holds a surge's onset when the last check fell just after it),
// and since the last report (where a small sidecar's jump adds up).
func (w *Window) since() []Since {
	w.sinceBuf = append(w.sinceBuf[:0], Since{sumByBucket(w.checked), w.checkedAt})
	if w.beforeAt.Before(w.checkedAt) && !w.beforeAt.Equal(w.prevAt) {
		w.sinceBuf = append(w.sinceBuf, Since{sumByBucket(w.before), w.beforeAt})
	}
	if w.prevAt.Before(w.checkedAt) {
		w.sinceBuf = append(w.sinceBuf, Since{sumByBucket(w.prev), w.prevAt})
	}
	return w.sinceBuf
}

// projectStep moves the projection on to now, whose counts are cur, and
// hands its ratios to ps, read against pol. A step under minStep after the last is skipped,
// the ratios in force kept: the Reporter's step ticker and check ticker
// fire at unrelated phases, and a step microseconds after a check
// predicted its next count from nothing (a ratio of 0 or 0.99 held for a
// whole step).
func (w *Window) projectStep(now time.Time, cur map[bucket]sidecar.PeerCounts, ps ProvisionalSource, pol *sidecar.Policy) {
	if now.Sub(w.projAt) < w.minStep {
		return
	}
	w.projOut = w.proj.Check(now, w.projThen, cur, now.Sub(w.projAt))
	w.setProvisional(ps, pol)
	w.projThen, w.projAt = cur, now
}

// check is Check's surge check, with w.cur read at now.
func (w *Window) check(now time.Time, src Source) *sluicev1.LoadReport {
	if w.surge.Surging(w.checked, w.cur, now.Sub(w.checkedAt)) {
		// Report the check window alone: its rate is the surge's, not
		// diluted by the calm before it. The aggregator keeps rates, so
		// the earlier part of the window is not missed.
		return w.sendUrgent(w.checked, w.checkedAt, now, src)
	}
	if !w.checkedAt.Equal(w.prevAt) && w.surge.SurgingSinceReport(w.prev, w.cur, now.Sub(w.prevAt)) {
		// A sidecar with a few requests per check window never sees
		// MinCount in one (a 10× surge to 170 rps is 17 per 100ms): the
		// window since the last report adds up to it, a check or two
		// later. Reported over the last checks that hold MinCount
		// requests, not the whole window: its rate is then the surge's.
		from, fromAt := w.trail.Since(w.cur, surgeMinCount(w.surge))
		return w.sendUrgent(from, fromAt, now, src)
	}
	if w.descDue && len(w.descs) > 0 && now.Sub(w.prevAt) >= w.minWindow {
		return w.regular(now, src)
	}
	w.setChecked(w.cur, now)
	w.trail.Add(w.cur, now)
	return nil
}

// sendUrgent sends a surge report as send does. It carries the
// descriptors when their window is at least half an interval long: a
// surge's values reach the controller now, urgently, not at the next tick
// (tenants-zipf: a pinned abuser's sidecar surges as its abuse begins, and
// the abuser kept the ratio its first 200 ms had earned for two seconds).
// A shorter window runs on: the local allowances are sized for an
// interval, and a window much shorter would let a value through at a
// multiple of its limit.
func (w *Window) sendUrgent(from []sidecar.PeerCounts, fromAt, now time.Time, src Source) *sluicev1.LoadReport {
	start := w.prevAt
	rep := w.send(from, fromAt, now, true)
	if now.Sub(w.descAt) >= w.minWindow {
		w.addDescriptors(rep, now, src)
	}
	w.endWindow(start, now, src)
	return rep
}

// send builds the report of the window from the snapshot from, taken at
// fromAt, to w.cur, taken at now, and starts the next window at now.
func (w *Window) send(from []sidecar.PeerCounts, fromAt, now time.Time, urgent bool) *sluicev1.LoadReport {
	rep := Build(w.hdr, from, w.cur, fromAt, now.Sub(fromAt))
	rep.Urgent = urgent
	w.prev, w.cur = w.cur, w.prev
	w.prevAt = now
	if w.proj != nil {
		w.proj.Reported(rep, now)
	}
	if w.checks {
		w.surge.Reported(rep)
		w.setChecked(w.prev, now)
		w.trail.Reset(w.prev, now)
	}
	return rep
}

// setChecked makes snap, taken at at, the last check's snapshot, and the
// one it replaces the check before's, unless that one is under
// MinInterval old: the Reporter's report and check tickers fire together
// every tenth check, in either order, and a report just after a check
// would otherwise move the check before on to that check, and the window
// meant to span the report would begin a moment before it.
func (w *Window) setChecked(snap []sidecar.PeerCounts, at time.Time) {
	if at.Sub(w.checkedAt) >= MinInterval {
		w.before, w.checked = w.checked, w.before
		w.beforeAt = w.checkedAt
	}
	w.checked, w.checkedAt = append(w.checked[:0], snap...), at
}
