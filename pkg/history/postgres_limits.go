package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/routes"
)

// notifyChannel is the channel limit changes are announced on.
const notifyChannel = "sluice_limits"

const (
	selectBucketLimit = `SELECT callee, caller, procedure, limit_rps AS "limit", mode, enforcement, burst, payback_ms, source, updated_by, reason, updated_at FROM bucket_limits`
	selectService     = `SELECT callee, default_limit, capacity, mode, fail_mode, enforcement, updated_by, reason, updated_at,
		unit, cost_default, cost_max, cost_request_header, cost_response_header,
		tiers, criticality_header, criticality_default, criticality_max, slo_latency_p99_ms, slo_errors FROM service_limits`
	selectSettings = `SELECT callee, caller, procedure, criticality, max_criticality, max_concurrency, cost, updated_by, reason, updated_at FROM bucket_settings`
	selectProposal = `SELECT id, callee, caller, procedure, current_limit AS current, proposed, peak_lookback, peak_recent, flags, status,
		created_by, created_at, decided_by, COALESCE(decided_at, '0001-01-01 00:00:00+00') AS decided_at, reason FROM proposals`
	selectAudit = `SELECT id, at, actor, action, callee, caller, procedure, old_value AS old, new_value AS new, reason FROM audit_log`
)

// bucketRow and serviceRow are rows of bucket_limits and service_limits as
// pgx scans them: settings as the text the tables keep, which rowToLimit and
// rowToService read back with their types' parsers.
type bucketRow struct {
	Bucket
	Limit             float64
	Mode, Enforcement string
	Burst             float64
	PaybackMs         int64
	Source            Source
	UpdatedBy, Reason string
	UpdatedAt         time.Time
}

type serviceRow struct {
	Callee                                string
	DefaultLimit, Capacity                *float64
	Mode, FailMode, Enforcement           string
	UpdatedBy, Reason                     string
	UpdatedAt                             time.Time
	Unit                                  string
	CostDefault, CostMax                  *float64
	CostRequestHeader, CostResponseHeader string
	Tiers                                 bool
	CriticalityHeader                     string
	CriticalityDefault, CriticalityMax    string
	SloLatencyP99Ms, SloErrors            float64
}

type settingsRow struct {
	Bucket
	Criticality, MaxCriticality string
	MaxConcurrency              int64
	Cost                        *float64
	UpdatedBy, Reason           string
	UpdatedAt                   time.Time
}

// parseTier reads a tier column: "" is None.
func parseTier(s string) (criticality.Tier, error) {
	if s == "" {
		return criticality.None, nil
	}
	return criticality.ParseConfig(s)
}

// rowToSettings scans a bucket_settings row (selectSettings' columns).
func rowToSettings(row pgx.CollectableRow) (BucketSettings, error) {
	r, err := pgx.RowToStructByName[settingsRow](row)
	if err != nil {
		return BucketSettings{}, err
	}
	var errs []error
	s := BucketSettings{Bucket: r.Bucket, Cost: r.Cost, UpdatedBy: r.UpdatedBy, Reason: r.Reason, UpdatedAt: r.UpdatedAt}
	if t := column("criticality", r.Criticality, parseTier, &errs); t != nil {
		s.Criticality = *t
	}
	if t := column("max_criticality", r.MaxCriticality, parseTier, &errs); t != nil {
		s.MaxCriticality = *t
	}
	if r.MaxConcurrency < 0 || r.MaxConcurrency > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("max_concurrency: %d is out of range", r.MaxConcurrency))
	}
	s.MaxConcurrency = uint32(r.MaxConcurrency)
	if err := errors.Join(errs...); err != nil {
		return BucketSettings{}, fmt.Errorf("bucket_settings row %s: %w", r.Path(), err)
	}
	return s, nil
}

// rowToLimit scans a bucket_limits row (selectBucketLimit's columns). A
// setting it can not read is an error naming the row and the column,
// never a default: a fail mode or mode this binary does not know (written
// by a newer one, say) must not silently become another.
func rowToLimit(row pgx.CollectableRow) (BucketLimit, error) {
	r, err := pgx.RowToStructByName[bucketRow](row)
	if err != nil {
		return BucketLimit{}, err
	}
	var errs []error
	l := BucketLimit{
		Bucket: r.Bucket, Limit: r.Limit,
		Mode:        column("mode", r.Mode, dropratio.ParseMode, &errs),
		Enforcement: column("enforcement", r.Enforcement, dataplane.ParseEnforcement, &errs),
		Burst:       new(r.Burst), Payback: new(time.Duration(r.PaybackMs) * time.Millisecond),
		Source: r.Source, UpdatedBy: r.UpdatedBy, Reason: r.Reason, UpdatedAt: r.UpdatedAt,
	}
	if err := errors.Join(errs...); err != nil {
		return BucketLimit{}, fmt.Errorf("bucket_limits row %s: %w", r.Path(), err)
	}
	return l, nil
}

// rowToService scans a service_limits row (selectService's columns), as
// rowToLimit does.
func rowToService(row pgx.CollectableRow) (ServiceLimits, error) {
	r, err := pgx.RowToStructByName[serviceRow](row)
	if err != nil {
		return ServiceLimits{}, err
	}
	var errs []error
	s := ServiceLimits{
		Callee: r.Callee, DefaultLimit: r.DefaultLimit, Capacity: r.Capacity,
		Mode:        column("mode", r.Mode, dropratio.ParseMode, &errs),
		FailMode:    column("fail_mode", r.FailMode, dataplane.ParseFailMode, &errs),
		Enforcement: column("enforcement", r.Enforcement, dataplane.ParseEnforcement, &errs),
		UpdatedBy:   r.UpdatedBy, Reason: r.Reason, UpdatedAt: r.UpdatedAt,
	}
	switch r.Unit {
	case "requests":
	case "cost":
		s.Cost = &CostSettings{Default: r.CostDefault, Max: r.CostMax, RequestHeader: r.CostRequestHeader, ResponseHeader: r.CostResponseHeader}
	default:
		errs = append(errs, fmt.Errorf("unit: %q is not requests or cost", r.Unit))
	}
	if r.Tiers {
		c := &CriticalitySettings{Header: r.CriticalityHeader}
		if t := column("criticality_default", r.CriticalityDefault, parseTier, &errs); t != nil {
			c.Default = *t
		}
		if t := column("criticality_max", r.CriticalityMax, parseTier, &errs); t != nil {
			c.Max = *t
		}
		s.Criticality = c
	}
	if r.SloLatencyP99Ms != 0 || r.SloErrors != 0 {
		// Rounded: a duration in milliseconds as a double comes back a
		// nanosecond short of what was written now and then.
		s.SLO = &ObjectiveSettings{LatencyP99: time.Duration(math.Round(r.SloLatencyP99Ms * float64(time.Millisecond))), Errors: r.SloErrors}
	}
	if err := errors.Join(errs...); err != nil {
		return ServiceLimits{}, fmt.Errorf("service_limits row %s: %w", r.Callee, err)
	}
	return s, nil
}

// column reads a setting kept as text with its type's parser; an error
// names the column.
func column[T any](name, text string, parse func(string) (T, error), errs *[]error) *T {
	v, err := parse(text)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s: %w", name, err))
		return nil
	}
	return &v
}

// Limits implements LimitStore: both tables are read in one snapshot.
func (p *Postgres) Limits(ctx context.Context) (Limits, error) {
	var l Limits
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, selectService+` ORDER BY callee`)
		if err != nil {
			return err
		}
		if l.Services, err = pgx.CollectRows(rows, rowToService); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, selectBucketLimit+` ORDER BY callee, caller, procedure`)
		if err != nil {
			return err
		}
		if l.Buckets, err = pgx.CollectRows(rows, rowToLimit); err != nil {
			return err
		}
		if l.Routes, err = readRoutes(ctx, tx); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, selectSettings+` ORDER BY callee, caller, procedure`)
		if err != nil {
			return err
		}
		l.Settings, err = pgx.CollectRows(rows, rowToSettings)
		return err
	})
	if err != nil {
		return Limits{}, fmt.Errorf("read limits: %w", err)
	}
	return nonNilLimits(l), nil
}

// nonNilLimits makes empty lists nil, as Memory returns them.
func nonNilLimits(l Limits) Limits {
	if len(l.Services) == 0 {
		l.Services = nil
	}
	if len(l.Buckets) == 0 {
		l.Buckets = nil
	}
	if len(l.Routes) == 0 {
		l.Routes = nil
	}
	if len(l.Settings) == 0 {
		l.Settings = nil
	}
	return l
}

// change runs fn in a transaction that holds the limits lock, so that
// changes, and the old values their audit entries show, are serialised.
// now is read under the lock, so audit times rise with audit IDs. When fn
// reports a limit change, it is announced in the same transaction:
// listeners hear of it when, and only if, it commits.
func (p *Postgres) change(ctx context.Context, what string, fn func(tx pgx.Tx, now time.Time) (changed bool, err error)) error {
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, lockNamespace, lockLimits); err != nil {
			return err
		}
		changed, err := fn(tx, p.opts.clock())
		if err != nil || !changed {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, notifyChannel, what)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// bucketLimits reads the limits of buckets that have one.
func bucketLimits(ctx context.Context, tx pgx.Tx, bs []Bucket) (map[Bucket]BucketLimit, error) {
	callees, callers, procs := splitBuckets(bs)
	rows, err := tx.Query(ctx, selectBucketLimit+`
		WHERE (callee, caller, procedure) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))`, callees, callers, procs)
	if err != nil {
		return nil, err
	}
	ls, err := pgx.CollectRows(rows, rowToLimit)
	if err != nil {
		return nil, err
	}
	out := make(map[Bucket]BucketLimit, len(ls))
	for _, l := range ls {
		out[l.Bucket] = l
	}
	return out, nil
}

// serviceSettings reads the settings of callees that have them.
func serviceSettings(ctx context.Context, tx pgx.Tx, callees []string) (map[string]ServiceLimits, error) {
	rows, err := tx.Query(ctx, selectService+` WHERE callee = ANY($1)`, callees)
	if err != nil {
		return nil, err
	}
	ss, err := pgx.CollectRows(rows, rowToService)
	if err != nil {
		return nil, err
	}
	out := make(map[string]ServiceLimits, len(ss))
	for _, s := range ss {
		out[s.Callee] = s
	}
	return out, nil
}

// bucketDefaults are what a bucket's limit gets when it names no mode or
// enforcement.
type bucketDefaults struct {
	mode        dropratio.Mode
	enforcement dataplane.Enforcement
}

// modesFor is the mode each bucket's limit gets when none is given: its
// own, else its callee's, else enforce; and the enforcement likewise (see
// inheritedEnforcement).
func modesFor(ctx context.Context, tx pgx.Tx, bs []Bucket, current map[Bucket]BucketLimit) (map[Bucket]bucketDefaults, error) {
	var callees []string
	for _, b := range bs {
		callees = append(callees, b.Callee)
	}
	svc, err := serviceSettings(ctx, tx, callees)
	if err != nil {
		return nil, err
	}
	out := make(map[Bucket]bucketDefaults, len(bs))
	for _, b := range bs {
		if l, ok := current[b]; ok {
			out[b] = bucketDefaults{*l.Mode, *l.Enforcement}
		} else if s, ok := svc[b.Callee]; ok {
			out[b] = bucketDefaults{*s.Mode, inheritedEnforcement(b, s.Enforcement)}
		} else {
			out[b] = bucketDefaults{dropratio.Enforce, dataplane.EnforceSidecar}
		}
	}
	return out, nil
}

func splitBuckets(bs []Bucket) (callees, callers, procs []string) {
	callees, callers, procs = make([]string, len(bs)), make([]string, len(bs)), make([]string, len(bs))
	for i, b := range bs {
		callees[i], callers[i], procs[i] = b.Callee, b.Caller, b.Procedure
	}
	return callees, callers, procs
}

// upsertLimits writes bucket limits, replacing existing ones.
func upsertLimits(ctx context.Context, tx pgx.Tx, ls []BucketLimit) error {
	n := len(ls)
	callees, callers, modes, sources := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	limits, by, reasons, at := make([]float64, n), make([]string, n), make([]string, n), make([]time.Time, n)
	enfs, procs := make([]string, n), make([]string, n)
	bursts, paybacks := make([]float64, n), make([]int64, n)
	for i, l := range ls {
		if l.Burst != nil {
			bursts[i] = *l.Burst
		}
		if l.Payback != nil {
			paybacks[i] = l.Payback.Milliseconds()
		}
		callees[i], callers[i], procs[i], limits[i], modes[i], sources[i] = l.Callee, l.Caller, l.Procedure, l.Limit, l.Mode.String(), string(l.Source)
		by[i], reasons[i], at[i] = l.UpdatedBy, l.Reason, l.UpdatedAt
		enfs[i] = l.Enforcement.String()
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO bucket_limits (callee, caller, limit_rps, mode, source, updated_by, reason, updated_at, enforcement, procedure, burst, payback_ms)
		SELECT * FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[], $9::text[], $10::text[],
			$11::float8[], $12::int8[])
		ON CONFLICT (callee, caller, procedure) DO UPDATE SET
			limit_rps = excluded.limit_rps, mode = excluded.mode, source = excluded.source,
			updated_by = excluded.updated_by, reason = excluded.reason, updated_at = excluded.updated_at,
			enforcement = excluded.enforcement, burst = excluded.burst, payback_ms = excluded.payback_ms`,
		callees, callers, limits, modes, sources, by, reasons, at, enfs, procs, bursts, paybacks)
	return err
}

var auditColumns = []string{"at", "actor", "action", "callee", "caller", "procedure", "old_value", "new_value", "reason"}

// insertAudit appends entries, in order, so that IDs follow it.
func insertAudit(ctx context.Context, tx pgx.Tx, entries []AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"audit_log"}, auditColumns,
		pgx.CopyFromSlice(len(entries), func(i int) ([]any, error) {
			e := &entries[i]
			return []any{e.At, e.Actor, e.Action, e.Callee, e.Caller, e.Procedure, e.Old, e.New, e.Reason}, nil
		}))
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

func auditEntry(now time.Time, c Change, action string, b Bucket, old, new string) AuditEntry {
	return AuditEntry{At: now, Actor: c.Actor, Action: action, Bucket: b, Old: old, New: new, Reason: c.Reason}
}

// SetLimit implements LimitStore.
func (p *Postgres) SetLimit(ctx context.Context, l BucketLimit, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkBucketLimit(l); err != nil {
		return err
	}
	if l.Source == "" {
		l.Source = Manual
	}
	return p.change(ctx, "set_limit", func(tx pgx.Tx, now time.Time) (bool, error) {
		l := l
		bs := []Bucket{l.Bucket}
		current, err := bucketLimits(ctx, tx, bs)
		if err != nil {
			return false, err
		}
		if l.Mode == nil || l.Enforcement == nil {
			defs, err := modesFor(ctx, tx, bs, current)
			if err != nil {
				return false, err
			}
			l.Mode = setting(l.Mode, nil, defs[l.Bucket].mode)
			l.Enforcement = setting(l.Enforcement, nil, defs[l.Bucket].enforcement)
		}
		o := current[l.Bucket] // its burst and payback, nil when it has no limit
		l.Burst, l.Payback = setting(l.Burst, o.Burst, 0), setting(l.Payback, o.Payback, 0)
		l.UpdatedBy, l.Reason, l.UpdatedAt = c.Actor, c.Reason, now
		if err := upsertLimits(ctx, tx, []BucketLimit{l}); err != nil {
			return false, err
		}
		var old string
		if o, ok := current[l.Bucket]; ok {
			old = renderLimit(o)
		}
		return true, insertAudit(ctx, tx, []AuditEntry{auditEntry(now, c, "set_limit", l.Bucket, old, renderLimit(l))})
	})
}

// DeleteLimit implements LimitStore.
func (p *Postgres) DeleteLimit(ctx context.Context, b Bucket, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkBucket("bucket.", b); err != nil {
		return err
	}
	return p.change(ctx, "delete_limit", func(tx pgx.Tx, now time.Time) (bool, error) {
		rows, err := tx.Query(ctx, `DELETE FROM bucket_limits WHERE callee = $1 AND caller = $2 AND procedure = $3
			RETURNING callee, caller, procedure, limit_rps AS "limit", mode, enforcement, burst, payback_ms, source, updated_by, reason, updated_at`, b.Callee, b.Caller, b.Procedure)
		if err != nil {
			return false, err
		}
		old, err := pgx.CollectOneRow(rows, rowToLimit)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("%s: %w", b.Path(), ErrNotFound)
		}
		if err != nil {
			return false, err
		}
		return true, insertAudit(ctx, tx, []AuditEntry{auditEntry(now, c, "delete_limit", b, renderLimit(old), "")})
	})
}

// SetRoutes implements LimitStore: the callee's rows are replaced whole.
func (p *Postgres) SetRoutes(ctx context.Context, callee string, rs []routes.Route, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkRoutes(callee, rs); err != nil {
		return err
	}
	return p.change(ctx, "set_routes", func(tx pgx.Tx, now time.Time) (bool, error) {
		rows, err := tx.Query(ctx, `DELETE FROM routes WHERE callee = $1 RETURNING position, pattern, procedure`, callee)
		if err != nil {
			return false, err
		}
		old, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (positioned, error) {
			var p positioned
			err := r.Scan(&p.pos, &p.Pattern, &p.Procedure)
			return p, err
		})
		if err != nil {
			return false, err
		}
		slices.SortFunc(old, func(a, b positioned) int { return cmp.Compare(a.pos, b.pos) })
		olds := make([]routes.Route, len(old))
		for i, o := range old {
			olds[i] = o.Route
		}
		_, err = tx.CopyFrom(ctx, pgx.Identifier{"routes"}, []string{"callee", "position", "pattern", "procedure"},
			pgx.CopyFromSlice(len(rs), func(i int) ([]any, error) {
				return []any{callee, int32(i), rs[i].Pattern, rs[i].Procedure}, nil
			}))
		if err != nil {
			return false, err
		}
		return true, insertAudit(ctx, tx, []AuditEntry{auditEntry(now, c, "set_routes", Bucket{Callee: callee}, renderRoutes(olds), renderRoutes(rs))})
	})
}

// positioned is a routes row.
type positioned struct {
	pos int32
	routes.Route
}

// readRoutes reads every callee's routes, in order.
func readRoutes(ctx context.Context, tx pgx.Tx) ([]ServiceRoutes, error) {
	rows, err := tx.Query(ctx, `SELECT callee, pattern, procedure FROM routes ORDER BY callee, position`)
	if err != nil {
		return nil, err
	}
	var (
		out    []ServiceRoutes
		callee string
		r      routes.Route
	)
	_, err = pgx.ForEachRow(rows, []any{&callee, &r.Pattern, &r.Procedure}, func() error {
		if len(out) == 0 || out[len(out)-1].Callee != callee {
			out = append(out, ServiceRoutes{Callee: callee})
		}
		last := &out[len(out)-1]
		last.Routes = append(last.Routes, r)
		return nil
	})
	return out, err
}

// SetService implements LimitStore.
func (p *Postgres) SetService(ctx context.Context, s ServiceLimits, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkServiceLimits(s); err != nil {
		return err
	}
	return p.change(ctx, "set_service", func(tx pgx.Tx, now time.Time) (bool, error) {
		s := copyService(s)
		rows, err := tx.Query(ctx, selectService+` WHERE callee = $1`, s.Callee)
		if err != nil {
			return false, err
		}
		o, err := pgx.CollectOneRow(rows, rowToService)
		had := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
		var old string
		if had {
			old = renderService(o)
		}
		s.Mode = setting(s.Mode, o.Mode, dropratio.Enforce)
		s.FailMode = setting(s.FailMode, o.FailMode, dataplane.FailOpen)
		s.Enforcement = setting(s.Enforcement, o.Enforcement, dataplane.EnforceSidecar)
		s.UpdatedBy, s.Reason, s.UpdatedAt = c.Actor, c.Reason, now
		unit, cost := "requests", CostSettings{}
		if s.Cost != nil {
			unit, cost = "cost", *s.Cost
		}
		tiers, crit := s.Criticality != nil, CriticalitySettings{}
		if tiers {
			crit = *s.Criticality
		}
		var slo ObjectiveSettings
		if s.SLO != nil {
			slo = *s.SLO
		}
		_, err = tx.Exec(ctx, `
			INSERT INTO service_limits (callee, default_limit, capacity, mode, fail_mode, updated_by, reason, updated_at, enforcement,
				unit, cost_default, cost_max, cost_request_header, cost_response_header,
				tiers, criticality_header, criticality_default, criticality_max, slo_latency_p99_ms, slo_errors)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
			ON CONFLICT (callee) DO UPDATE SET
				default_limit = excluded.default_limit, capacity = excluded.capacity, mode = excluded.mode,
				fail_mode = excluded.fail_mode, updated_by = excluded.updated_by, reason = excluded.reason,
				updated_at = excluded.updated_at, enforcement = excluded.enforcement,
				unit = excluded.unit, cost_default = excluded.cost_default, cost_max = excluded.cost_max,
				cost_request_header = excluded.cost_request_header, cost_response_header = excluded.cost_response_header,
				tiers = excluded.tiers, criticality_header = excluded.criticality_header,
				criticality_default = excluded.criticality_default, criticality_max = excluded.criticality_max,
				slo_latency_p99_ms = excluded.slo_latency_p99_ms, slo_errors = excluded.slo_errors`,
			s.Callee, s.DefaultLimit, s.Capacity, s.Mode.String(), s.FailMode.String(), s.UpdatedBy, s.Reason, s.UpdatedAt, s.Enforcement.String(),
			unit, cost.Default, cost.Max, cost.RequestHeader, cost.ResponseHeader,
			tiers, crit.Header, crit.Default.String(), crit.Max.String(),
			float64(slo.LatencyP99)/float64(time.Millisecond), slo.Errors)
		if err != nil {
			return false, err
		}
		return true, insertAudit(ctx, tx, []AuditEntry{auditEntry(now, c, "set_service", Bucket{Callee: s.Callee}, old, renderService(s))})
	})
}

// SetSettings implements LimitStore.
func (p *Postgres) SetSettings(ctx context.Context, s BucketSettings, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkBucketSettings(s); err != nil {
		return err
	}
	return p.change(ctx, "set_settings", func(tx pgx.Tx, now time.Time) (bool, error) {
		rows, err := tx.Query(ctx, `DELETE FROM bucket_settings WHERE callee = $1 AND caller = $2 AND procedure = $3
			RETURNING callee, caller, procedure, criticality, max_criticality, max_concurrency, cost, updated_by, reason, updated_at`,
			s.Callee, s.Caller, s.Procedure)
		if err != nil {
			return false, err
		}
		o, err := pgx.CollectOneRow(rows, rowToSettings)
		had := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
		if s.IsZero() && !had {
			return false, nil
		}
		if !s.IsZero() {
			s.UpdatedBy, s.Reason, s.UpdatedAt = c.Actor, c.Reason, now
			if _, err := tx.Exec(ctx, `INSERT INTO bucket_settings (callee, caller, procedure, criticality, max_criticality,
					max_concurrency, cost, updated_by, reason, updated_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
				s.Callee, s.Caller, s.Procedure, s.Criticality.String(), s.MaxCriticality.String(),
				int64(s.MaxConcurrency), s.Cost, s.UpdatedBy, s.Reason, s.UpdatedAt); err != nil {
				return false, err
			}
		}
		return true, insertAudit(ctx, tx, []AuditEntry{auditEntry(now, c, "set_settings", s.Bucket, renderSettings(o), renderSettings(s))})
	})
}

// SetMode implements LimitStore.
func (p *Postgres) SetMode(ctx context.Context, f Filter, m dropratio.Mode, c Change) (int, error) {
	if err := checkChange(c); err != nil {
		return 0, err
	}
	if err := checkFilter(f); err != nil {
		return 0, err
	}
	if err := checkSetting("mode", m); err != nil {
		return 0, err
	}
	var selected int
	err := p.change(ctx, "set_mode", func(tx pgx.Tx, now time.Time) (bool, error) {
		selected = 0
		var audit []AuditEntry
		// modeRow scans the key and mode of a row of table.
		modeRow := func(table string) pgx.RowToFunc[BucketLimit] {
			return func(row pgx.CollectableRow) (BucketLimit, error) {
				var (
					b    Bucket
					mode string
				)
				if err := row.Scan(&b.Callee, &b.Caller, &b.Procedure, &mode); err != nil {
					return BucketLimit{}, err
				}
				var errs []error
				l := BucketLimit{Bucket: b, Mode: column("mode", mode, dropratio.ParseMode, &errs)}
				if err := errors.Join(errs...); err != nil {
					return BucketLimit{}, fmt.Errorf("%s row %s: %w", table, strings.TrimSuffix(b.Path(), "/"), err)
				}
				return l, nil
			}
		}
		// Services first, then buckets, each in key order: Memory audits in
		// the same order.
		if f.Caller == "" && f.Procedure == "" {
			sql, args := filterSQL(`SELECT callee, '' AS caller, '' AS procedure, mode FROM service_limits WHERE true`, nil, f)
			rows, err := tx.Query(ctx, sql+` ORDER BY callee FOR UPDATE`, args...)
			if err != nil {
				return false, err
			}
			svcs, err := pgx.CollectRows(rows, modeRow("service_limits"))
			if err != nil {
				return false, err
			}
			selected += len(svcs)
			var changed []string
			for _, s := range svcs {
				if *s.Mode != m {
					changed = append(changed, s.Callee)
					audit = append(audit, auditEntry(now, c, "set_mode", Bucket{Callee: s.Callee}, s.Mode.String(), m.String()))
				}
			}
			if _, err := tx.Exec(ctx, `UPDATE service_limits SET mode = $1, updated_by = $2, reason = $3, updated_at = $4
				WHERE callee = ANY($5)`, m.String(), c.Actor, c.Reason, now, changed); err != nil {
				return false, err
			}
		}
		sql, args := filterSQL(`SELECT callee, caller, procedure, mode FROM bucket_limits WHERE true`, nil, f)
		if f.callerTarget() {
			if err := checkCallerLimits(ctx, tx, f); err != nil {
				return false, err
			}
			sql += ` AND procedure = ''`
		}
		rows, err := tx.Query(ctx, sql+` ORDER BY callee, caller, procedure FOR UPDATE`, args...)
		if err != nil {
			return false, err
		}
		bs, err := pgx.CollectRows(rows, modeRow("bucket_limits"))
		if err != nil {
			return false, err
		}
		selected += len(bs)
		if selected == 0 {
			return false, fmt.Errorf("%s: %w", f, ErrNotFound)
		}
		var changed []Bucket
		for _, b := range bs {
			if *b.Mode != m {
				changed = append(changed, b.Bucket)
				audit = append(audit, auditEntry(now, c, "set_mode", b.Bucket, b.Mode.String(), m.String()))
			}
		}
		callees, callers, procs := splitBuckets(changed)
		if _, err := tx.Exec(ctx, `UPDATE bucket_limits SET mode = $1, updated_by = $2, reason = $3, updated_at = $4
			WHERE (callee, caller, procedure) IN (SELECT * FROM unnest($5::text[], $6::text[], $7::text[]))`,
			m.String(), c.Actor, c.Reason, now, callees, callers, procs); err != nil {
			return false, err
		}
		return len(audit) > 0, insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return 0, err
	}
	return selected, nil
}

// checkCallerLimits returns noCallerLimit for the first leaf, in key
// order, of a caller f selects that has no limit of its own (see
// LimitStore.SetMode). A leaf set concurrently, after the check, is as if
// set after the SetMode: the caller's own limits are all it changes.
func checkCallerLimits(ctx context.Context, tx pgx.Tx, f Filter) error {
	sql, args := filterSQL(`SELECT callee, caller, procedure FROM bucket_limits l WHERE procedure <> ''`, nil, f)
	var b Bucket
	err := tx.QueryRow(ctx, sql+` AND NOT EXISTS (SELECT 1 FROM bucket_limits o
			WHERE o.callee = l.callee AND o.caller = l.caller AND o.procedure = '')
		ORDER BY callee, caller, procedure LIMIT 1`, args...).Scan(&b.Callee, &b.Caller, &b.Procedure)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("%s: %w", f, noCallerLimit(b))
}

// Propose implements LimitStore.
func (p *Postgres) Propose(ctx context.Context, ps []Proposal, c Change) ([]Proposal, error) {
	if err := checkChange(c); err != nil {
		return nil, err
	}
	if err := checkProposals(ps); err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, nil
	}
	var out []Proposal
	err := p.change(ctx, "propose", func(tx pgx.Tx, now time.Time) (bool, error) {
		n := len(ps)
		callees, callers, procs := make([]string, n), make([]string, n), make([]string, n)
		current, proposed, lookback, recent := make([]*float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		flags := make([][]string, n)
		for i, p := range ps {
			callees[i], callers[i], procs[i], current[i] = p.Callee, p.Caller, p.Procedure, p.Current
			proposed[i], lookback[i], recent[i] = p.Proposed, p.PeakLookback, p.PeakRecent
			flags[i] = p.Flags
			if flags[i] == nil {
				flags[i] = []string{}
			}
		}
		if _, err := tx.Exec(ctx, `
			UPDATE proposals SET status = 'superseded', decided_by = $1, decided_at = $2, reason = $3
			WHERE status = 'pending' AND (callee, caller, procedure) IN (SELECT * FROM unnest($4::text[], $5::text[], $6::text[]))`,
			c.Actor, now, c.Reason, callees, callers, procs); err != nil {
			return false, err
		}
		// Flags travel as one JSON array of arrays: Postgres arrays must be
		// rectangular, and flag lists are not.
		rows, err := tx.Query(ctx, `
			INSERT INTO proposals (callee, caller, procedure, current_limit, proposed, peak_lookback, peak_recent, flags,
				status, created_by, created_at)
			SELECT u.callee, u.caller, u.procedure, u.cur, u.proposed, u.lookback, u.recent,
				ARRAY(SELECT jsonb_array_elements_text(f.flags -> (u.ord::int - 1))),
				'pending', $8, $9
			FROM unnest($1::text[], $2::text[], $10::text[], $3::float8[], $4::float8[], $5::float8[], $6::float8[])
				WITH ORDINALITY AS u(callee, caller, procedure, cur, proposed, lookback, recent, ord),
				(SELECT $7::jsonb AS flags) AS f
			ORDER BY u.ord
			RETURNING `+proposalColumns, callees, callers, current, proposed, lookback, recent, flags, c.Actor, now, procs)
		if err != nil {
			return false, err
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[Proposal])
		if err != nil {
			return false, err
		}
		slices.SortFunc(got, func(a, b Proposal) int { return cmp.Compare(a.ID, b.ID) }) // IDs follow ORDER BY ord
		audit := make([]AuditEntry, len(got))
		for i := range got {
			got[i] = normalizeProposal(got[i])
			old := ""
			if got[i].Current != nil {
				old = renderRate(*got[i].Current)
			}
			audit[i] = auditEntry(now, c, "propose", got[i].Bucket, old, renderProposal(got[i]))
		}
		out = got
		return false, insertAudit(ctx, tx, audit) // proposals change no limit: nothing to announce
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// proposalColumns are selectProposal's columns, for RETURNING.
const proposalColumns = `id, callee, caller, procedure, current_limit AS current, proposed, peak_lookback, peak_recent, flags, status,
	created_by, created_at, decided_by, COALESCE(decided_at, '0001-01-01 00:00:00+00') AS decided_at, reason`

// normalizeProposal: no flags is nil, and a zero DecidedAt is time.Time{}.
func normalizeProposal(p Proposal) Proposal {
	if len(p.Flags) == 0 {
		p.Flags = nil
	}
	if p.DecidedAt.IsZero() {
		p.DecidedAt = time.Time{}
	}
	return p
}

// Proposals implements LimitStore.
func (p *Postgres) Proposals(ctx context.Context, f Filter, statuses ...ProposalStatus) ([]Proposal, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	statuses, err := checkStatuses(statuses)
	if err != nil {
		return nil, err
	}
	st := make([]string, len(statuses))
	for i, s := range statuses {
		st[i] = string(s)
	}
	sql, args := filterSQL(selectProposal+` WHERE status = ANY($1)`, []any{st}, f)
	rows, err := p.pool.Query(ctx, sql+` ORDER BY callee, caller, procedure, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("read proposals: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[Proposal])
	if err != nil {
		return nil, fmt.Errorf("read proposals: %w", err)
	}
	for i := range out {
		out[i] = normalizeProposal(out[i])
	}
	if len(out) == 0 {
		out = nil
	}
	return out, nil
}

// Approve implements LimitStore.
func (p *Postgres) Approve(ctx context.Context, ids []int64, c Change) ([]Proposal, error) {
	return p.decide(ctx, ids, c, Approved)
}

// Reject implements LimitStore.
func (p *Postgres) Reject(ctx context.Context, ids []int64, c Change) ([]Proposal, error) {
	return p.decide(ctx, ids, c, Rejected)
}

func (p *Postgres) decide(ctx context.Context, ids []int64, c Change, to ProposalStatus) ([]Proposal, error) {
	if err := checkChange(c); err != nil {
		return nil, err
	}
	ids = uniqueIDs(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	var out []Proposal
	what := map[ProposalStatus]string{Approved: "approve", Rejected: "reject"}[to]
	err := p.change(ctx, what, func(tx pgx.Tx, now time.Time) (bool, error) {
		rows, err := tx.Query(ctx, selectProposal+` WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
		if err != nil {
			return false, err
		}
		ps, err := pgx.CollectRows(rows, pgx.RowToStructByName[Proposal])
		if err != nil {
			return false, err
		}
		// Check every ID before changing anything: all or nothing.
		var missing, closed []int64
		for _, id := range ids {
			i := slices.IndexFunc(ps, func(p Proposal) bool { return p.ID == id })
			switch {
			case i < 0:
				missing = append(missing, id)
			case ps[i].Status != Pending:
				closed = append(closed, id)
			}
		}
		if err := decideErr(to, missing, closed); err != nil {
			return false, err
		}
		if _, err := tx.Exec(ctx, `UPDATE proposals SET status = $1, decided_by = $2, decided_at = $3, reason = $4
			WHERE id = ANY($5)`, string(to), c.Actor, now, c.Reason, ids); err != nil {
			return false, err
		}
		audit := make([]AuditEntry, len(ps))
		for i := range ps {
			ps[i] = normalizeProposal(ps[i])
			ps[i].Status, ps[i].DecidedBy, ps[i].DecidedAt, ps[i].Reason = to, c.Actor, now, c.Reason
			audit[i] = auditEntry(now, c, "reject", ps[i].Bucket, renderProposal(ps[i]), "rejected")
		}
		out = ps
		if to == Rejected {
			return false, insertAudit(ctx, tx, audit) // no limit changed: nothing to announce
		}

		bs := make([]Bucket, len(ps))
		for i, p := range ps {
			bs[i] = p.Bucket
		}
		current, err := bucketLimits(ctx, tx, bs)
		if err != nil {
			return false, err
		}
		defs, err := modesFor(ctx, tx, bs, current)
		if err != nil {
			return false, err
		}
		ls := make([]BucketLimit, len(ps))
		for i, p := range ps {
			ls[i] = BucketLimit{
				Bucket: p.Bucket, Limit: p.Proposed, Mode: new(defs[p.Bucket].mode), Enforcement: new(defs[p.Bucket].enforcement), Source: Derived,
				Burst: setting(nil, current[p.Bucket].Burst, 0), Payback: setting(nil, current[p.Bucket].Payback, 0),
				UpdatedBy: c.Actor, Reason: c.Reason, UpdatedAt: now,
			}
			var old string
			if o, ok := current[p.Bucket]; ok {
				old = renderLimit(o)
			}
			audit[i] = auditEntry(now, c, "approve", p.Bucket, old, renderLimit(ls[i]))
		}
		if err := upsertLimits(ctx, tx, ls); err != nil {
			return false, err
		}
		return true, insertAudit(ctx, tx, audit)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AuditHistory implements LimitStore.
func (p *Postgres) AuditHistory(ctx context.Context, notes []HistoryNote, c Change) error {
	if err := checkChange(c); err != nil {
		return err
	}
	if err := checkNotes(notes); err != nil {
		return err
	}
	if len(notes) == 0 {
		return nil
	}
	return p.change(ctx, "audit history", func(tx pgx.Tx, now time.Time) (bool, error) {
		audit := make([]AuditEntry, len(notes))
		for i, n := range notes {
			audit[i] = auditEntry(now, c, "write_history", n.Bucket, "", n.What)
		}
		return false, insertAudit(ctx, tx, audit) // no limit changed: nothing to announce
	})
}

// Audit implements LimitStore.
func (p *Postgres) Audit(ctx context.Context, f Filter, since time.Time, limit int) ([]AuditEntry, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	if limit < 0 {
		return nil, invalid("limit", "%d is negative", limit)
	}
	sql, args := filterSQL(selectAudit+` WHERE at >= $1`, []any{since}, f)
	sql += ` ORDER BY id DESC`
	if limit > 0 {
		args = append(args, limit)
		sql += fmt.Sprintf(` LIMIT $%d`, len(args))
	}
	rows, err := p.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByName[AuditEntry])
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	if len(out) == 0 {
		out = nil
	}
	return out, nil
}
