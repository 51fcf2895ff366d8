// Package history is sluice's store: per-minute load of every bucket, the
// limits in force, proposed limits awaiting review, and an append-only audit
// log of every change. Postgres (pgx) backs it in production; Memory is its
// in-memory twin for the demo, the simulator and tests. One conformance suite
// (historytest) runs against both, so they can not drift apart.
//
// Times are UTC. Rates are requests per second, finite and never negative.
// The store stamps every change (UpdatedAt, CreatedAt, DecidedAt, At) with
// its clock (WithClock; time.Now by default) at microsecond precision,
// which is what Postgres keeps. Invalid input is refused with an error that
// wraps ErrInvalid and names the field, before anything is written.
//
// Modes, fail modes, enforcements and tiers are sluice's domain types
// (dropratio.Mode, dataplane.FailMode, dataplane.Enforcement,
// criticality.Tier); the store
// spells them in its rows as their text forms, and refuses a row it can not
// read back, naming the column.
//
// A bucket's key is (callee, caller, procedure) in every table and every
// call; Bucket says what each shape means. A callee's HTTP routes, which
// name its procedures, are kept whole per callee (SetRoutes) and checked
// with pkg/routes, the code the sidecar matches with.
//
// A callee counting cost (ServiceLimits.Cost, the limits file's unit: cost)
// keeps its limits, capacities and rates in cost units per second: "rps"
// in the store's names (limit_rps, Limit) is then "units/s".
//
// The package imports pgx, the standard library, pkg/names, pkg/routes and
// those types only.
package history

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/routes"
)

// Bucket is one bucket key: a (callee, caller) pair when Procedure is "";
// for a callee that declares procedures, a (callee, caller, procedure)
// leaf, or with Caller AnyCaller, the procedure's own level (its capacity,
// the sum of its leaves' load).
type Bucket struct {
	Callee    string
	Caller    string
	Procedure string
}

// AnyCaller is Bucket.Caller for a procedure's own level: "checkout/*/pay".
const AnyCaller = "*"

// Path is the bucket as people and the configurator write it:
// "checkout/web", "checkout/web/create-charge", "checkout/*/create-charge",
// "checkout/web//shop.Checkout/Pay". (Not String: every type that embeds
// Bucket would print as its key alone.)
func (b Bucket) Path() string {
	if b.Procedure == "" {
		return b.Callee + "/" + b.Caller
	}
	return b.Callee + "/" + b.Caller + "/" + b.Procedure
}

// MinuteRow is one bucket's load during one minute, as the controller saw it.
// Rates are finite and >= 0, and PeakOffered >= MeanOffered.
type MinuteRow struct {
	Bucket
	Minute      time.Time // start of the minute, truncated to the minute; years 1970 to 9999
	PeakOffered float64   // highest offered rate of any tick in the minute
	MeanOffered float64   // mean offered rate over the minute
	MeanDropped float64   // mean rate of enforced drops over the minute
	// Cost is the bucket's cost load in the minute when its callee counts
	// cost (units per second); nil when it counts requests.
	Cost *CostLoad
}

// CostLoad is a bucket's cost rates, in cost units per second: the peak
// of the minute's (or day's) ticks and the mean over them, offered (priced
// at admission) and admitted (as the sidecars counted it, reported costs
// included). Finite and >= 0, each peak >= its mean.
type CostLoad struct {
	PeakOffered, MeanOffered   float64
	PeakAdmitted, MeanAdmitted float64
}

// DailyPeak is the rollup of one bucket's minute rows over one UTC day:
// deriving limits over weeks reads these, not minutes.
type DailyPeak struct {
	Bucket
	Day         time.Time // midnight UTC
	PeakOffered float64   // highest PeakOffered of the day's minutes
	MeanOffered float64   // mean of the day's MeanOffered
	MeanDropped float64   // mean of the day's MeanDropped
	Minutes     int       // minute rows the day has: coverage, at most 1440
	// Cost is the rollup of the day's minutes that carry a cost load,
	// CostMinutes of them (its coverage); nil when none do.
	Cost        *CostLoad
	CostMinutes int
}

// Source says where a limit came from.
type Source string

// Sources.
const (
	Manual  Source = "manual"  // set by an operator
	Derived Source = "derived" // an approved proposal from history
)

// BucketLimit is the limit of one bucket.
//
// Mode says whether it is enforced or only observed; Enforcement, which data
// plane carries out its ratio: sluice's sidecar, or one upstream of it (the
// caller's proxyless gRPC client, the callee's Envoy), which the callee's
// sidecar then only counts (docs/dataplanes.md). Both are set in every
// limit the store returns. In a limit given to SetLimit, nil keeps the
// bucket's own, or inherits (see SetLimit).
type BucketLimit struct {
	Bucket
	Limit       float64 // rps, >= 0; 0 blocks
	Mode        *dropratio.Mode
	Enforcement *dataplane.Enforcement
	// Burst is how far above its limit the bucket may admit after a quiet
	// period (finite, >= 0, in its callee's units), Payback the window
	// over which it pays back what it admitted above its limit (0 to
	// MaxPayback); 0 is none for both. Set in every limit the store
	// returns; in one given to SetLimit, nil keeps the bucket's own, or 0.
	// Approve keeps them.
	Burst     *float64
	Payback   *time.Duration
	Source    Source
	UpdatedBy string
	Reason    string
	UpdatedAt time.Time
}

// MaxPayback bounds BucketLimit.Payback.
const MaxPayback = time.Hour

// ServiceLimits are a callee's own settings: a default limit for callers
// without one, a capacity all callers share, the mode and enforcement its
// callers inherit, and what its sidecars do when their policy expires.
// Nil rates mean none. Mode, FailMode and Enforcement are set in every
// ServiceLimits the store returns; in one given to SetService, nil keeps
// the callee's own, or takes the default (see SetService).
type ServiceLimits struct {
	Callee       string
	DefaultLimit *float64
	Capacity     *float64
	Mode         *dropratio.Mode
	FailMode     *dataplane.FailMode
	Enforcement  *dataplane.Enforcement
	// Cost, when set, says the callee counts cost units rather than
	// requests (the limits file's unit: cost) and how its requests are
	// priced; nil: it counts requests. Criticality, when set, declares the
	// callee's tiers; nil: none. Both are replaced by SetService as the
	// rates are: nil removes them.
	Cost        *CostSettings
	Criticality *CriticalitySettings
	// SLO, when set, is the callee's objective (the limits file's slo
	// block), from which the controller estimates its capacity; nil:
	// none. Replaced by SetService as the rates are.
	SLO       *ObjectiveSettings
	UpdatedBy string
	Reason    string
	UpdatedAt time.Time
}

// The defaults of a callee's cost block, in its units: what a nil
// CostSettings.Default and Max stand for (internal/limits reads them so).
const (
	DefaultCost    = 1.0 // a request's cost when nothing else prices it
	DefaultMaxCost = 1e6 // a larger cost is absurd: clamped to it
)

// CostSettings price a callee's requests (the limits file's cost block).
// Nil and "" are the file's defaults.
type CostSettings struct {
	Default *float64 // a request nothing else prices; finite, >= 0; nil: DefaultCost
	Max     *float64 // a larger cost is clamped to it; finite, > 0; nil: DefaultMaxCost
	// RequestHeader is the request header the callee trusts to carry a
	// cost, ResponseHeader the one (or trailer) its app reports the real
	// cost in: lower-case header names, "" for none.
	RequestHeader  string
	ResponseHeader string
}

// CriticalitySettings declare a callee's tiers (the limits file's
// criticality block). "" and criticality.None are the file's defaults.
type CriticalitySettings struct {
	Header       string           // lower case; "": criticality.DefaultHeader
	Default, Max criticality.Tier // None: CRITICAL
}

// ObjectiveSettings are a callee's objective (issue #18): a p99 latency
// and an error ratio, each 0 when unset, not both. Not with a unit of
// cost: health counts requests.
type ObjectiveSettings struct {
	LatencyP99 time.Duration // > 0, at most MaxObjectiveLatency; 0: unset
	Errors     float64       // in (0, 1); 0: unset
}

// MaxObjectiveLatency bounds ObjectiveSettings.LatencyP99: the store
// keeps it in milliseconds as a double, and a p99 objective of a day
// says nothing a capacity would not.
const MaxObjectiveLatency = 24 * time.Hour

// BucketSettings are a bucket's settings other than its limit, which it
// may have without a limit:
//
//   - a caller (Procedure ""): its default tier, the highest it may claim,
//     and its cap on requests in flight;
//   - a (caller, procedure) leaf: its cap on requests in flight;
//   - a procedure (Caller AnyCaller): its default tier and static cost.
//
// Zero values are none. Whether the callee declares tiers or counts cost,
// as a tier or a cost needs, limits.FromHistory checks.
type BucketSettings struct {
	Bucket
	Criticality    criticality.Tier
	MaxCriticality criticality.Tier
	MaxConcurrency uint32
	Cost           *float64 // finite, >= 0
	UpdatedBy      string
	Reason         string
	UpdatedAt      time.Time
}

// IsZero reports whether s sets nothing.
func (s BucketSettings) IsZero() bool {
	return s.Criticality == criticality.None && s.MaxCriticality == criticality.None && s.MaxConcurrency == 0 && s.Cost == nil
}

// Limits is every limit in force, one consistent read.
//
// For a callee that declares procedures, Buckets holds three kinds of
// limits: (callee, caller, "") the caller's limit across procedures,
// (callee, caller, procedure) a leaf's, and (callee, AnyCaller, procedure)
// the procedure's capacity. A leaf's and a procedure's Mode and
// Enforcement are kept but not used: a leaf is enforced as its caller is.
type Limits struct {
	Services []ServiceLimits  // sorted by Callee
	Buckets  []BucketLimit    // sorted by Callee, Caller, Procedure (bytewise: AnyCaller sorts before names)
	Routes   []ServiceRoutes  // sorted by Callee; callees without routes are left out
	Settings []BucketSettings // sorted as Buckets; buckets without settings are left out
}

// ServiceRoutes are a callee's HTTP routes, in order: the first that
// matches a request names its procedure (pkg/routes).
type ServiceRoutes struct {
	Callee string
	Routes []routes.Route // 1 to routes.MaxRoutes, valid for routes.CompileRoutes
}

// ProposalStatus is where a proposal is in review.
type ProposalStatus string

// Proposal statuses.
const (
	Pending    ProposalStatus = "pending"
	Approved   ProposalStatus = "approved"
	Rejected   ProposalStatus = "rejected"
	Superseded ProposalStatus = "superseded" // a newer proposal for the same bucket replaced it
)

// Proposal is a limit derived from history, awaiting an operator.
type Proposal struct {
	ID int64
	Bucket
	Current      *float64 // the limit in force when proposed, as the proposer saw it; nil when none
	Proposed     float64
	PeakLookback float64  // peak over the look-back window (default 4 weeks)
	PeakRecent   float64  // peak over the recent window (default 7 days)
	Flags        []string // e.g. "lowers below recent peak", "step down needs approval"
	Status       ProposalStatus
	CreatedBy    string
	CreatedAt    time.Time
	DecidedBy    string
	DecidedAt    time.Time // zero while pending
	Reason       string    // the decision's reason
}

// AuditEntry is one change, as the audit log keeps it forever.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	Action string // "set_limit", "delete_limit", "set_service", "set_settings", "set_mode", "set_routes", "approve", "reject", "propose", "write_history"
	Bucket        // Caller and Procedure are "" for service-level changes (set_service, set_routes, a callee's set_mode)
	Old    string // the previous value, rendered for people; "" when none
	New    string
	Reason string
}

// Change says who changes something and why; both are required (at most
// MaxActorLen and MaxReasonLen bytes of UTF-8).
type Change struct {
	Actor  string
	Reason string
}

// HistoryNote says what an operator wrote into a bucket's minute history, for
// the audit log (LimitStore.AuditHistory).
type HistoryNote struct {
	Bucket
	What string // e.g. "synthetic: 40,320 minutes …"; required, at most MaxReasonLen bytes
}

// Filter selects buckets; empty fields match everything. Non-empty Callee
// and Caller must be valid service names (Caller may be AnyCaller), a
// non-empty Procedure a valid procedure name. A Filter with Caller "web"
// and no Procedure selects web's caller bucket and each of its leaves.
type Filter struct {
	Callee    string
	Caller    string
	Procedure string
}

// Errors callers branch on.
var (
	ErrNotFound     = errors.New("history: not found")
	ErrInvalid      = errors.New("history: invalid input")
	ErrSchemaTooOld = errors.New("history: database schema is older than this binary; run the migrate command")
	ErrSchemaTooNew = errors.New("history: database schema is newer than this binary")
	ErrNotDecidable = errors.New("history: proposal is not pending")
	// ErrNoCallerLimit: SetMode of a caller that has leaf limits but no
	// limit of its own (see LimitStore.SetMode).
	ErrNoCallerLimit = errors.New("history: the caller has no limit of its own")
)

// callerTarget reports whether f names a caller rather than a leaf or a
// procedure's capacity: SetMode then switches the caller's own limits
// (procedure "") alone.
func (f Filter) callerTarget() bool {
	return f.Caller != "" && f.Caller != AnyCaller && f.Procedure == ""
}

// noCallerLimit is the error of SetMode for a leaf b whose caller has no
// limit of its own.
func noCallerLimit(b Bucket) error {
	p := b.Callee + "/" + b.Caller
	return fmt.Errorf("%s has no limit of its own; its leaves are enforced as it is: set a limit on %s, or set the callee's mode: %w", p, p, ErrNoCallerLimit)
}

// LoadStore keeps minute rows and their daily rollup.
type LoadStore interface {
	// WriteMinutes stores rows in one batch (COPY in Postgres), all or
	// nothing, and adds them to the daily rollup. Writing the same (bucket,
	// minute) again is idempotent: the first row written for it, in this
	// batch or an earlier one, stays, and it never double counts. Any
	// invalid row refuses the whole batch (ErrInvalid naming rows[i]).
	WriteMinutes(ctx context.Context, rows []MinuteRow) error
	// Minutes returns one bucket's rows in [from, to), oldest first.
	Minutes(ctx context.Context, b Bucket, from, to time.Time) ([]MinuteRow, error)
	// DailyPeaks returns the rollup of the days whose midnight lies in
	// [from, to) for the buckets f selects, sorted by callee, caller, day.
	DailyPeaks(ctx context.Context, f Filter, from, to time.Time) ([]DailyPeak, error)
	// Retain drops every UTC day that ends at or before before: its minute
	// rows (in Postgres, the day's whole partition) and its daily rows. A
	// day still in progress at before is kept whole. It returns how many
	// days of minute data it dropped.
	Retain(ctx context.Context, before time.Time) (int, error)
}

// LimitStore keeps limits, proposals and the audit log. Every change to a
// limit is audited and announced to Changes in the same transaction.
//
// Every mutating call needs a Change with an Actor and a Reason; the store
// sets UpdatedBy, Reason and UpdatedAt (CreatedBy, DecidedBy, …) from it and
// its clock, ignoring what the argument holds there. A call that changes
// nothing (SetMode to the mode in force) audits nothing.
type LimitStore interface {
	Limits(ctx context.Context) (Limits, error)
	// SetLimit creates or replaces a bucket's limit, audited as
	// "set_limit". An empty Source means Manual. A nil Mode keeps the
	// bucket's current mode; a bucket without a limit takes its callee's
	// mode (ServiceLimits.Mode), or enforce when the callee has none.
	// Enforcement likewise: nil keeps the bucket's, else takes its
	// callee's (but for the reserved callers unknown and _overflow),
	// else sidecar.
	SetLimit(ctx context.Context, l BucketLimit, c Change) error
	// DeleteLimit removes a bucket's limit ("delete_limit"); ErrNotFound
	// when it has none.
	DeleteLimit(ctx context.Context, b Bucket, c Change) error
	// SetRoutes replaces a callee's HTTP routes, in order ("set_routes",
	// with Caller ""); no routes removes them. Routes that
	// routes.CompileRoutes refuses are ErrInvalid, with its reasons.
	SetRoutes(ctx context.Context, callee string, rs []routes.Route, c Change) error
	// SetSettings creates or replaces a bucket's settings other than its
	// limit ("set_settings"); settings that set nothing (IsZero) remove
	// them. Removing none changes nothing and audits nothing.
	SetSettings(ctx context.Context, s BucketSettings, c Change) error
	// SetService creates or replaces a callee's own settings
	// ("set_service", with Caller ""). A nil Mode, FailMode or
	// Enforcement keeps the current one, or enforce, open and sidecar for a
	// new callee.
	SetService(ctx context.Context, s ServiceLimits, c Change) error
	// SetMode switches the mode of the limits f selects: bucket limits,
	// and when f.Caller is "" also the selected callees' own settings
	// (Caller "" with a Callee: the callee's own mode and every bucket of
	// it). With a Caller (not AnyCaller) and no Procedure it selects the
	// caller's own limits alone, never its leaves': a leaf is enforced as
	// its caller is (limits.FromHistory), so switching a leaf's mode
	// would change nothing. When a caller f selects has leaf limits but
	// no limit of its own, it changes nothing and returns
	// ErrNoCallerLimit naming it: its leaves are in the callee's mode. It
	// returns how many limits it selected, those already in mode m
	// included, and audits ("set_mode") the ones it changed. ErrNotFound
	// when f selects nothing.
	SetMode(ctx context.Context, f Filter, m dropratio.Mode, c Change) (int, error)

	// Propose stores proposals as pending, superseding pending proposals
	// for the same buckets (status Superseded, decided by c), audits each
	// ("propose") and returns them, in order, with their IDs. The caller
	// sets Bucket, Current, Proposed, PeakLookback, PeakRecent and Flags;
	// the store sets the rest. Two proposals for one bucket are invalid.
	Propose(ctx context.Context, ps []Proposal, c Change) ([]Proposal, error)
	// Proposals returns proposals the filter and statuses select (no
	// statuses: pending only), sorted by callee, caller, ID.
	Proposals(ctx context.Context, f Filter, statuses ...ProposalStatus) ([]Proposal, error)
	// Approve applies pending proposals as derived limits ("approve"),
	// keeping each bucket's mode (a bucket without a limit takes its
	// callee's mode, or enforce); Reject closes them ("reject"). Both
	// return the decided proposals sorted by ID, and both are all or
	// nothing: an unknown ID is ErrNotFound, a proposal that is not pending
	// ErrNotDecidable, and then nothing changes. Repeated IDs count once;
	// no IDs is no change.
	Approve(ctx context.Context, ids []int64, c Change) ([]Proposal, error)
	Reject(ctx context.Context, ids []int64, c Change) ([]Proposal, error)

	// AuditHistory records, one "write_history" entry per note with the
	// note as its new value, that minute history was written by hand (the
	// configurator's history seed). The controller's own minutes are not
	// audited: they are what happened. Rows an operator adds are not, and
	// limits are derived from them, so who added them and why is kept. It
	// changes no limit, so it announces nothing to Changes.
	AuditHistory(ctx context.Context, notes []HistoryNote, c Change) error

	// Audit returns entries the filter selects with At at or after since,
	// newest (highest ID) first, at most limit of them (0: all).
	Audit(ctx context.Context, f Filter, since time.Time, limit int) ([]AuditEntry, error)

	// Changes signals, coalesced, after every committed limit change (the
	// channel holds at most one pending signal), until ctx ends or the
	// store is closed; then the channel is closed. A change committed after
	// Changes returns is always signalled. After a lost connection it
	// signals once more, since changes may have been missed; readers
	// re-read Limits on every signal.
	Changes(ctx context.Context) (<-chan struct{}, error)
}

// Store is the whole store.
type Store interface {
	LoadStore
	LimitStore
	// Close ends Changes subscriptions and releases connections. It is
	// idempotent.
	Close()
}
