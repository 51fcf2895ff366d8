package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Memory is the in-memory Store: the same rules as Postgres, for the demo,
// the simulator and tests. It is safe for concurrent use. What it returns
// is a copy: changing it changes nothing in the store.
type Memory struct {
	opts options

	// mu guards everything below. Each call holds it throughout, so every
	// call is atomic, as a Postgres transaction is.
	mu        sync.Mutex
	minutes   map[Bucket]map[int64]MinuteRow // by Unix minute
	daily     map[dayKey]*dayAgg
	services  map[string]ServiceLimits
	buckets   map[Bucket]BucketLimit
	settings  map[Bucket]BucketSettings
	routes    map[string][]routes.Route     // by callee; never empty
	proposals []Proposal                    // proposals[i].ID == i+1
	audit     []AuditEntry                  // audit[i].ID == i+1
	subs      map[chan struct{}]func() bool // Changes subscribers and their context.AfterFunc stops
	closed    bool
}

type dayKey struct {
	Bucket
	day int64 // Unix seconds of the UTC midnight
}

// dayAgg is what Postgres' daily_load row holds.
type dayAgg struct {
	peak, sumOffered, sumDropped float64
	minutes                      int
	// The cost rollup: peaks, sums of means, minutes with a cost load.
	costPeakOff, costSumOff, costPeakAdm, costSumAdm float64
	costMinutes                                      int
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory. WithClock sets its clock.
func NewMemory(opts ...Option) *Memory {
	return &Memory{
		opts:     newOptions(opts),
		minutes:  map[Bucket]map[int64]MinuteRow{},
		daily:    map[dayKey]*dayAgg{},
		services: map[string]ServiceLimits{},
		buckets:  map[Bucket]BucketLimit{},
		settings: map[Bucket]BucketSettings{},
		routes:   map[string][]routes.Route{},
		subs:     map[chan struct{}]func() bool{},
	}
}

// Close ends every Changes subscription. The store stays readable; it
// refuses new subscriptions.
func (m *Memory) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	for ch, stop := range m.subs {
		stop()
		close(ch)
	}
	clear(m.subs)
}

// WriteMinutes implements LoadStore.
func (m *Memory) WriteMinutes(ctx context.Context, rows []MinuteRow) error {
	if err := checkMinutes(rows); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rows {
		r.Minute = r.Minute.UTC()
		byMinute := m.minutes[r.Bucket]
		if byMinute == nil {
			byMinute = map[int64]MinuteRow{}
			m.minutes[r.Bucket] = byMinute
		}
		key := r.Minute.Unix() / 60
		if _, dup := byMinute[key]; dup {
			continue // the first write wins
		}
		r.Cost = copyOpt(r.Cost)
		byMinute[key] = r
		dk := dayKey{r.Bucket, dayOf(r.Minute).Unix()}
		a := m.daily[dk]
		if a == nil {
			a = &dayAgg{peak: r.PeakOffered}
			m.daily[dk] = a
		}
		a.peak = max(a.peak, r.PeakOffered)
		a.sumOffered += r.MeanOffered
		a.sumDropped += r.MeanDropped
		a.minutes++
		if c := r.Cost; c != nil {
			a.costPeakOff, a.costPeakAdm = max(a.costPeakOff, c.PeakOffered), max(a.costPeakAdm, c.PeakAdmitted)
			a.costSumOff += c.MeanOffered
			a.costSumAdm += c.MeanAdmitted
			a.costMinutes++
		}
	}
	return nil
}

// Minutes implements LoadStore.
func (m *Memory) Minutes(ctx context.Context, b Bucket, from, to time.Time) ([]MinuteRow, error) {
	if err := checkBucket("bucket.", b); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []MinuteRow
	for _, r := range m.minutes[b] {
		if !r.Minute.Before(from) && r.Minute.Before(to) {
			r.Cost = copyOpt(r.Cost)
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b MinuteRow) int { return a.Minute.Compare(b.Minute) })
	return out, nil
}

// DailyPeaks implements LoadStore.
func (m *Memory) DailyPeaks(ctx context.Context, f Filter, from, to time.Time) ([]DailyPeak, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	lo, hi := ceilDay(from).Unix(), ceilDay(to).Unix()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []DailyPeak
	for k, a := range m.daily {
		if k.day < lo || k.day >= hi || !f.matches(k.Bucket) {
			continue
		}
		d := DailyPeak{
			Bucket:      k.Bucket,
			Day:         time.Unix(k.day, 0).UTC(),
			PeakOffered: a.peak,
			MeanOffered: a.sumOffered / float64(a.minutes),
			MeanDropped: a.sumDropped / float64(a.minutes),
			Minutes:     a.minutes,
			CostMinutes: a.costMinutes,
		}
		if n := float64(a.costMinutes); n > 0 {
			d.Cost = &CostLoad{PeakOffered: a.costPeakOff, MeanOffered: a.costSumOff / n, PeakAdmitted: a.costPeakAdm, MeanAdmitted: a.costSumAdm / n}
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DailyPeak) int {
		return cmp.Or(compareBuckets(a.Bucket, b.Bucket), a.Day.Compare(b.Day))
	})
	return out, nil
}

// Retain implements LoadStore.
func (m *Memory) Retain(ctx context.Context, before time.Time) (int, error) {
	cut := dayOf(before).Unix() // days starting before it end at or before before
	m.mu.Lock()
	defer m.mu.Unlock()
	dropped := map[int64]bool{}
	for b, byMinute := range m.minutes {
		for key, r := range byMinute {
			if day := dayOf(r.Minute).Unix(); day < cut {
				dropped[day] = true
				delete(byMinute, key)
			}
		}
		if len(byMinute) == 0 {
			delete(m.minutes, b)
		}
	}
	maps.DeleteFunc(m.daily, func(k dayKey, _ *dayAgg) bool { return k.day < cut })
	return len(dropped), nil
}

func (f Filter) matches(b Bucket) bool {
	return (f.Callee == "" || f.Callee == b.Callee) && (f.Caller == "" || f.Caller == b.Caller) &&
		(f.Procedure == "" || f.Procedure == b.Procedure)
}

func compareBuckets(a, b Bucket) int {
	return cmp.Or(cmp.Compare(a.Callee, b.Callee), cmp.Compare(a.Caller, b.Caller), cmp.Compare(a.Procedure, b.Procedure))
}

// Limits implements LimitStore.
func (m *Memory) Limits(ctx context.Context) (Limits, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var l Limits
	for _, s := range m.services {
		l.Services = append(l.Services, copyService(s))
	}
	for _, b := range m.buckets {
		l.Buckets = append(l.Buckets, copyLimit(b))
	}
	slices.SortFunc(l.Services, func(a, b ServiceLimits) int { return cmp.Compare(a.Callee, b.Callee) })
	slices.SortFunc(l.Buckets, func(a, b BucketLimit) int { return compareBuckets(a.Bucket, b.Bucket) })
	for _, callee := range slices.Sorted(maps.Keys(m.routes)) {
		l.Routes = append(l.Routes, ServiceRoutes{Callee: callee, Routes: slices.Clone(m.routes[callee])})
	}
	for _, s := range m.settings {
		s.Cost = copyOpt(s.Cost)
		l.Settings = append(l.Settings, s)
	}
	slices.SortFunc(l.Settings, func(a, b BucketSettings) int { return compareBuckets(a.Bucket, b.Bucket) })
	return l, nil
}

// SetSettings implements LimitStore.
func (m *Memory) SetSettings(ctx context.Context, s BucketSettings, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkBucketSettings(s); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.clock()
	o, had := m.settings[s.Bucket]
	if s.IsZero() {
		if !had {
			return nil
		}
		delete(m.settings, s.Bucket)
	} else {
		s.Cost = copyOpt(s.Cost)
		s.UpdatedBy, s.Reason, s.UpdatedAt = c.Actor, c.Reason, now
		m.settings[s.Bucket] = s
	}
	m.appendAudit(now, c, "set_settings", s.Bucket, renderSettings(o), renderSettings(s))
	m.notify()
	return nil
}

// SetRoutes implements LimitStore.
func (m *Memory) SetRoutes(ctx context.Context, callee string, rs []routes.Route, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkRoutes(callee, rs); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.routes[callee]
	if len(rs) == 0 {
		delete(m.routes, callee)
	} else {
		m.routes[callee] = slices.Clone(rs)
	}
	m.appendAudit(m.opts.clock(), c, "set_routes", Bucket{Callee: callee}, renderRoutes(old), renderRoutes(rs))
	m.notify()
	return nil
}

// modeFor is the mode a bucket's limit gets when none is given: its own,
// else its callee's, else enforce. Caller holds mu.
func (m *Memory) modeFor(b Bucket) dropratio.Mode {
	if old, ok := m.buckets[b]; ok {
		return *old.Mode
	}
	if s, ok := m.services[b.Callee]; ok {
		return *s.Mode
	}
	return dropratio.Enforce
}

// enforcementFor is the enforcement a bucket's limit gets when none is
// given: its own, else its callee's (but for the reserved callers), else
// sidecar. Caller holds mu.
func (m *Memory) enforcementFor(b Bucket) dataplane.Enforcement {
	if old, ok := m.buckets[b]; ok {
		return *old.Enforcement
	}
	return inheritedEnforcement(b, m.services[b.Callee].Enforcement)
}

// SetLimit implements LimitStore.
func (m *Memory) SetLimit(ctx context.Context, l BucketLimit, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkBucketLimit(l); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.clock()
	l.Mode = setting(l.Mode, nil, m.modeFor(l.Bucket))
	l.Enforcement = setting(l.Enforcement, nil, m.enforcementFor(l.Bucket))
	o := m.buckets[l.Bucket] // its burst and payback, nil when it has no limit
	l.Burst, l.Payback = setting(l.Burst, o.Burst, 0), setting(l.Payback, o.Payback, 0)
	if l.Source == "" {
		l.Source = Manual
	}
	l.UpdatedBy, l.Reason, l.UpdatedAt = c.Actor, c.Reason, now
	var old string
	if o, ok := m.buckets[l.Bucket]; ok {
		old = renderLimit(o)
	}
	m.buckets[l.Bucket] = l
	m.appendAudit(now, c, "set_limit", l.Bucket, old, renderLimit(l))
	m.notify()
	return nil
}

// DeleteLimit implements LimitStore.
func (m *Memory) DeleteLimit(ctx context.Context, b Bucket, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkBucket("bucket.", b); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.buckets[b]
	if !ok {
		return fmt.Errorf("delete limit of %s: %w", b.Path(), ErrNotFound)
	}
	delete(m.buckets, b)
	m.appendAudit(m.opts.clock(), c, "delete_limit", b, renderLimit(o), "")
	m.notify()
	return nil
}

// SetService implements LimitStore.
func (m *Memory) SetService(ctx context.Context, s ServiceLimits, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkServiceLimits(s); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.clock()
	s = copyService(s)
	o, had := m.services[s.Callee]
	var old string
	if had {
		old = renderService(o)
	}
	s.Mode = setting(s.Mode, o.Mode, dropratio.Enforce)
	s.FailMode = setting(s.FailMode, o.FailMode, dataplane.FailOpen)
	s.Enforcement = setting(s.Enforcement, o.Enforcement, dataplane.EnforceSidecar)
	s.UpdatedBy, s.Reason, s.UpdatedAt = c.Actor, c.Reason, now
	m.services[s.Callee] = s
	m.appendAudit(now, c, "set_service", Bucket{Callee: s.Callee}, old, renderService(s))
	m.notify()
	return nil
}

// SetMode implements LimitStore.
func (m *Memory) SetMode(ctx context.Context, f Filter, mode dropratio.Mode, c Change) (int, error) {
	if err := checkChange(c); err != nil {
		return 0, err
	}
	if err := checkFilter(f); err != nil {
		return 0, err
	}
	if err := checkSetting("mode", mode); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	callerOnly := f.callerTarget()
	if callerOnly {
		for _, b := range slices.SortedFunc(maps.Keys(m.buckets), compareBuckets) {
			if _, own := m.buckets[Bucket{Callee: b.Callee, Caller: b.Caller}]; b.Procedure != "" && f.matches(b) && !own {
				return 0, fmt.Errorf("set mode of %s: %w", f, noCallerLimit(b))
			}
		}
	}
	now := m.opts.clock()
	var selected, changed int
	// Services first, then buckets, each in order: the audit reads in the
	// same order as Postgres writes it.
	if f.Caller == "" && f.Procedure == "" {
		for _, callee := range slices.Sorted(maps.Keys(m.services)) {
			s := m.services[callee]
			if f.Callee != "" && f.Callee != callee {
				continue
			}
			selected++
			if *s.Mode == mode {
				continue
			}
			changed++
			m.appendAudit(now, c, "set_mode", Bucket{Callee: callee}, s.Mode.String(), mode.String())
			s.Mode, s.UpdatedBy, s.Reason, s.UpdatedAt = new(mode), c.Actor, c.Reason, now
			m.services[callee] = s
		}
	}
	for _, b := range slices.SortedFunc(maps.Keys(m.buckets), compareBuckets) {
		l := m.buckets[b]
		if !f.matches(b) || callerOnly && b.Procedure != "" {
			continue
		}
		selected++
		if *l.Mode == mode {
			continue
		}
		changed++
		m.appendAudit(now, c, "set_mode", b, l.Mode.String(), mode.String())
		l.Mode, l.UpdatedBy, l.Reason, l.UpdatedAt = new(mode), c.Actor, c.Reason, now
		m.buckets[b] = l
	}
	if selected == 0 {
		return 0, fmt.Errorf("set mode of %s: %w", f, ErrNotFound)
	}
	if changed > 0 {
		m.notify()
	}
	return selected, nil
}

// Propose implements LimitStore.
func (m *Memory) Propose(ctx context.Context, ps []Proposal, c Change) ([]Proposal, error) {
	if err := checkChange(c); err != nil {
		return nil, err
	}
	if err := checkProposals(ps); err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.clock()
	fresh := make(map[Bucket]bool, len(ps))
	for _, p := range ps {
		fresh[p.Bucket] = true
	}
	for i := range m.proposals {
		if old := &m.proposals[i]; old.Status == Pending && fresh[old.Bucket] {
			old.Status, old.DecidedBy, old.DecidedAt, old.Reason = Superseded, c.Actor, now, c.Reason
		}
	}
	out := make([]Proposal, len(ps))
	for i, p := range ps {
		p = Proposal{
			ID:           int64(len(m.proposals) + 1),
			Bucket:       p.Bucket,
			Current:      copyOpt(p.Current),
			Proposed:     p.Proposed,
			PeakLookback: p.PeakLookback,
			PeakRecent:   p.PeakRecent,
			Flags:        copyFlags(p.Flags),
			Status:       Pending,
			CreatedBy:    c.Actor,
			CreatedAt:    now,
		}
		m.proposals = append(m.proposals, p)
		out[i] = copyProposal(p)
		old := ""
		if p.Current != nil {
			old = renderRate(*p.Current)
		}
		m.appendAudit(now, c, "propose", p.Bucket, old, renderProposal(p))
	}
	return out, nil
}

// Proposals implements LimitStore.
func (m *Memory) Proposals(ctx context.Context, f Filter, statuses ...ProposalStatus) ([]Proposal, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	statuses, err := checkStatuses(statuses)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Proposal
	for _, p := range m.proposals {
		if f.matches(p.Bucket) && slices.Contains(statuses, p.Status) {
			out = append(out, copyProposal(p))
		}
	}
	slices.SortFunc(out, func(a, b Proposal) int {
		return cmp.Or(compareBuckets(a.Bucket, b.Bucket), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// Approve implements LimitStore.
func (m *Memory) Approve(ctx context.Context, ids []int64, c Change) ([]Proposal, error) {
	return m.decide(ids, c, Approved)
}

// Reject implements LimitStore.
func (m *Memory) Reject(ctx context.Context, ids []int64, c Change) ([]Proposal, error) {
	return m.decide(ids, c, Rejected)
}

func (m *Memory) decide(ids []int64, c Change, to ProposalStatus) ([]Proposal, error) {
	if err := checkChange(c); err != nil {
		return nil, err
	}
	ids = uniqueIDs(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Check every ID before changing anything: all or nothing.
	var missing, closed []int64
	for _, id := range ids {
		switch {
		case id < 1 || id > int64(len(m.proposals)):
			missing = append(missing, id)
		case m.proposals[id-1].Status != Pending:
			closed = append(closed, id)
		}
	}
	if err := decideErr(to, missing, closed); err != nil {
		return nil, err
	}
	now := m.opts.clock()
	out := make([]Proposal, 0, len(ids))
	for _, id := range ids {
		p := &m.proposals[id-1]
		p.Status, p.DecidedBy, p.DecidedAt, p.Reason = to, c.Actor, now, c.Reason
		out = append(out, copyProposal(*p))
		if to == Rejected {
			m.appendAudit(now, c, "reject", p.Bucket, renderProposal(*p), "rejected")
			continue
		}
		l := BucketLimit{
			Bucket: p.Bucket, Limit: p.Proposed, Mode: new(m.modeFor(p.Bucket)), Enforcement: new(m.enforcementFor(p.Bucket)), Source: Derived,
			UpdatedBy: c.Actor, Reason: c.Reason, UpdatedAt: now,
		}
		o, ok := m.buckets[p.Bucket]
		l.Burst, l.Payback = setting(nil, o.Burst, 0), setting(nil, o.Payback, 0)
		var old string
		if ok {
			old = renderLimit(o)
		}
		m.buckets[p.Bucket] = l
		m.appendAudit(now, c, "approve", p.Bucket, old, renderLimit(l))
	}
	if to == Approved {
		m.notify()
	}
	return out, nil
}

// decideErr is why Approve or Reject refuses: unknown IDs first, then IDs
// that are not pending.
func decideErr(to ProposalStatus, missing, closed []int64) error {
	verb := map[ProposalStatus]string{Approved: "approve", Rejected: "reject"}[to]
	switch {
	case len(missing) > 0:
		return fmt.Errorf("%s proposals %v: %w", verb, missing, ErrNotFound)
	case len(closed) > 0:
		return fmt.Errorf("%s proposals %v: %w", verb, closed, ErrNotDecidable)
	}
	return nil
}

// Audit implements LimitStore.
func (m *Memory) Audit(ctx context.Context, f Filter, since time.Time, limit int) ([]AuditEntry, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	if limit < 0 {
		return nil, invalid("limit", "%d is negative", limit)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []AuditEntry
	for i := len(m.audit) - 1; i >= 0 && (limit == 0 || len(out) < limit); i-- {
		e := m.audit[i]
		if f.matches(e.Bucket) && !e.At.Before(since) {
			out = append(out, e)
		}
	}
	return out, nil
}

// AuditHistory implements LimitStore.
func (m *Memory) AuditHistory(ctx context.Context, notes []HistoryNote, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkNotes(notes); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.opts.clock()
	for _, n := range notes {
		m.appendAudit(now, c, "write_history", n.Bucket, "", n.What)
	}
	return nil
}

// appendAudit records one change. Caller holds mu.
func (m *Memory) appendAudit(at time.Time, c Change, action string, b Bucket, old, new string) {
	m.audit = append(m.audit, AuditEntry{
		ID: int64(len(m.audit) + 1), At: at, Actor: c.Actor, Action: action,
		Bucket: b, Old: old, New: new, Reason: c.Reason,
	})
}

// Changes implements LimitStore.
func (m *Memory) Changes(ctx context.Context) (<-chan struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errors.New("history: changes: the store is closed")
	}
	ch := make(chan struct{}, 1)
	m.subs[ch] = context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.subs[ch]; ok { // Close may have closed it already
			delete(m.subs, ch)
			close(ch)
		}
	})
	return ch, nil
}

// notify signals every subscriber, coalescing with a signal not yet read.
// Caller holds mu, after the change is made: a reader woken by it sees it.
func (m *Memory) notify() {
	for ch := range m.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (f Filter) String() string {
	s := cmp.Or(f.Callee, "*") + "/" + cmp.Or(f.Caller, "*")
	if f.Procedure != "" {
		s += "/" + f.Procedure
	}
	return s
}

// copyOpt copies an optional value: a rate, a setting.
func copyOpt[T any](v *T) *T {
	if v == nil {
		return nil
	}
	return new(*v)
}

// copyFlags copies flags; none is nil, as Postgres returns it.
func copyFlags(f []string) []string {
	if len(f) == 0 {
		return nil
	}
	return slices.Clone(f)
}

func copyService(s ServiceLimits) ServiceLimits {
	s.DefaultLimit, s.Capacity = copyOpt(s.DefaultLimit), copyOpt(s.Capacity)
	s.Mode, s.FailMode, s.Enforcement = copyOpt(s.Mode), copyOpt(s.FailMode), copyOpt(s.Enforcement)
	if s.Cost != nil {
		c := *s.Cost
		c.Default, c.Max = copyOpt(c.Default), copyOpt(c.Max)
		s.Cost = &c
	}
	s.Criticality = copyOpt(s.Criticality)
	s.SLO = copyOpt(s.SLO)
	return s
}

func copyLimit(l BucketLimit) BucketLimit {
	l.Mode, l.Enforcement = copyOpt(l.Mode), copyOpt(l.Enforcement)
	return l
}

func copyProposal(p Proposal) Proposal {
	p.Current, p.Flags = copyOpt(p.Current), copyFlags(p.Flags)
	return p
}
