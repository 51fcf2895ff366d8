package aggregator

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// Bounds bound what one report may claim, so that a broken or hostile
// sidecar can neither grow the aggregator's memory without bound nor poison
// the zone's sums. Zero fields take their defaults. (They are not rate
// limits, which the aggregator knows nothing of: it only adds up rates.)
type Bounds struct {
	// MaxPeersPerReport bounds the entries kept of one report, each a
	// (peer, procedure) leaf, besides the reserved ones (see reserved):
	// the excess, the smallest rates first, is folded into names.Overflow
	// (see State.fold). A report with more than absurdPeersFactor times
	// as many entries is rejected whole, a bound on the work one report
	// costs. Default 10000.
	MaxPeersPerReport int
	// MaxRate bounds a peer's offered rate in one report, in requests per
	// second. Default 1e7.
	MaxRate float64
	// MaxCostPerRequest bounds what one request of a report may cost, in
	// the callee's units (issue #16): an entry whose offered_cost is above
	// it times its offered requests, or whose admitted_cost is above it
	// times the requests that can have completed in the window (those
	// offered in it, and those in flight when it began: the sidecar's last
	// report's in_flight; plus one) is left out (EntryBadCost). Default
	// 1e12, the most a sidecar prices a request at whatever a callee's
	// cost.max says (a callee may price above the 1e6 default), so that an
	// honest entry is never left out; lower it for callees known cheaper.
	MaxCostPerRequest float64
	// MinWindow and MaxWindow bound a report's window: rates over a
	// shorter one are noise, a longer one is stale. Defaults 10ms, 60s.
	MinWindow, MaxWindow time.Duration
	// MaxSidecars bounds the sidecars the aggregator keeps. Default 100000.
	MaxSidecars int
	// MaxInterval bounds the report interval a sidecar announces: a
	// report announcing a longer one is rejected, and a sidecar is
	// dropped from the sums after staleAfter of its intervals (or
	// windows) without a report, each counted as at most MaxInterval.
	// So one report keeps a sidecar in the sums for at most staleAfter ×
	// MaxInterval. Default 10s.
	MaxInterval time.Duration

	// Quotas of one identity: the service a sender speaks for (see
	// Sender). They cost that identity alone. A new sidecar beyond its
	// quota is rejected; entries beyond theirs are folded into
	// names.Overflow, so that the identity's load stays whole and only
	// the leaves that came last lose their own buckets. The quotas count
	// entries, (peer, procedure) leaves: a callee's procedures multiply
	// its buckets as its callers do.

	// MaxSidecarsPerIdentity bounds the sidecar ids one identity holds.
	// Default 2000: more replicas of one service in one zone than we know
	// of.
	MaxSidecarsPerIdentity int
	// MaxPeersPerIdentity bounds the distinct leaves (callers, or
	// callees for outbound reports, each with a procedure) across one
	// identity's sidecars, besides the reserved ones, which bounds its
	// part of the zone load. Default 10000, a report's default bound: a
	// service's sidecars see the same callers.
	MaxPeersPerIdentity int
	// MaxEntriesPerIdentity bounds the (sidecar, peer, procedure) rates
	// kept for one identity, besides the reserved ones' (four per
	// sidecar), about 56 bytes each: its memory. Default 1000000.
	MaxEntriesPerIdentity int
	// MaxValuesPerIdentity bounds the (sidecar, descriptor, value) rates
	// kept for one identity, besides the reserved values
	// (descriptor.Reserved: at most two per descriptor of a sidecar): its
	// memory for descriptors. A held value costs at most about 280 bytes:
	// its 24-byte rate and its string of up to descriptor.MaxValueLen
	// bytes, allocated apart. The default, 200000, is about 56 MB, what
	// MaxEntriesPerIdentity's million entries of 56 bytes hold; without
	// it one identity could hold MaxSidecarsPerIdentity ×
	// descriptor.MaxPerService × MaxReportValues = 2000 × 4 × 4096 values,
	// about 9 GB. A report that would take its identity past it keeps its
	// largest values, the rest left out and counted (EntryQuotaValues; see
	// State.capValues). Default 200000: 2000 sidecars reporting 100
	// values each, or 780 sidecars a full heavy set of 256.
	MaxValuesPerIdentity int

	// MaxReportValues bounds the values of one descriptor in one report:
	// entries beyond it are left out and counted (EntryTooManyValues).
	// A sidecar sends at most its heavy set (pkg/heavy, default 256).
	// Default 4096, at most 65536.
	MaxReportValues int
	// MaxDescriptorValues bounds the values of one (service, descriptor)
	// in a zone load: the largest by offered rate are kept, the rest
	// counted in values_cut. Default 1024, at most 65536. See size.go for
	// what it costs a zone load.
	MaxDescriptorValues int
}

// DefaultBounds returns the bounds that zero fields take.
func DefaultBounds() Bounds {
	return Bounds{
		MaxPeersPerReport: 10000,
		MaxRate:           1e7,
		MaxCostPerRequest: 1e12,
		MinWindow:         10 * time.Millisecond,
		MaxWindow:         60 * time.Second,
		MaxSidecars:       100000,
		MaxInterval:       10 * time.Second,

		MaxSidecarsPerIdentity: 2000,
		MaxPeersPerIdentity:    10000,
		MaxEntriesPerIdentity:  1000000,
		MaxValuesPerIdentity:   200000,

		MaxReportValues:     4096,
		MaxDescriptorValues: 1024,
	}
}

func (b Bounds) withDefaults() Bounds {
	d := DefaultBounds()
	b.MaxPeersPerReport = cmp.Or(b.MaxPeersPerReport, d.MaxPeersPerReport)
	b.MaxRate = cmp.Or(b.MaxRate, d.MaxRate)
	b.MaxCostPerRequest = cmp.Or(b.MaxCostPerRequest, d.MaxCostPerRequest)
	b.MinWindow = cmp.Or(b.MinWindow, d.MinWindow)
	b.MaxWindow = cmp.Or(b.MaxWindow, d.MaxWindow)
	b.MaxSidecars = cmp.Or(b.MaxSidecars, d.MaxSidecars)
	b.MaxInterval = cmp.Or(b.MaxInterval, d.MaxInterval)
	b.MaxSidecarsPerIdentity = cmp.Or(b.MaxSidecarsPerIdentity, d.MaxSidecarsPerIdentity)
	b.MaxPeersPerIdentity = cmp.Or(b.MaxPeersPerIdentity, d.MaxPeersPerIdentity)
	b.MaxEntriesPerIdentity = cmp.Or(b.MaxEntriesPerIdentity, d.MaxEntriesPerIdentity)
	b.MaxValuesPerIdentity = cmp.Or(b.MaxValuesPerIdentity, d.MaxValuesPerIdentity)
	b.MaxReportValues = cmp.Or(b.MaxReportValues, d.MaxReportValues)
	b.MaxDescriptorValues = cmp.Or(b.MaxDescriptorValues, d.MaxDescriptorValues)
	return b
}

// Validate reports every bound that is out of range, naming the field. Zero
// fields are fine: they take their defaults.
func (b Bounds) Validate() error {
	var errs []error
	if b.MaxPeersPerReport < 0 {
		errs = append(errs, fmt.Errorf("max-peers-per-report: must be >= 0 (0 for the default), got %d", b.MaxPeersPerReport))
	}
	if b.MaxRate < 0 || math.IsNaN(b.MaxRate) || math.IsInf(b.MaxRate, 0) {
		errs = append(errs, fmt.Errorf("max-rate: must be finite and >= 0 (0 for the default), got %v", b.MaxRate))
	}
	if b.MaxCostPerRequest < 0 || math.IsNaN(b.MaxCostPerRequest) || math.IsInf(b.MaxCostPerRequest, 0) {
		errs = append(errs, fmt.Errorf("max-report-cost-per-request: must be finite and >= 0 (0 for the default), got %v", b.MaxCostPerRequest))
	}
	if b.MinWindow < 0 {
		errs = append(errs, fmt.Errorf("Bounds.MinWindow: must be >= 0 (0 for the default), got %v", b.MinWindow))
	}
	if b.MaxWindow < 0 {
		errs = append(errs, fmt.Errorf("Bounds.MaxWindow: must be >= 0 (0 for the default), got %v", b.MaxWindow))
	}
	if d := b.withDefaults(); b.MinWindow >= 0 && b.MaxWindow >= 0 && d.MinWindow > d.MaxWindow {
		errs = append(errs, fmt.Errorf("Bounds.MinWindow: %v is above Bounds.MaxWindow %v", d.MinWindow, d.MaxWindow))
	}
	if b.MaxSidecars < 0 || b.MaxSidecars > zoneload.MaxLiveSidecars {
		errs = append(errs, fmt.Errorf("max-sidecars: must be in [0, %d] (0 for the default), got %d", zoneload.MaxLiveSidecars, b.MaxSidecars))
	}
	if b.MaxInterval < 0 {
		errs = append(errs, fmt.Errorf("max-report-interval: must be >= 0 (0 for the default), got %v", b.MaxInterval))
	}
	if d := b.withDefaults(); b.MinWindow >= 0 && b.MaxInterval >= 0 && d.MinWindow > d.MaxInterval {
		errs = append(errs, fmt.Errorf("max-report-interval: %v is below Bounds.MinWindow %v", d.MaxInterval, d.MinWindow))
	}
	for _, q := range []struct {
		flag string
		v    int
	}{
		{"max-sidecars-per-identity", b.MaxSidecarsPerIdentity},
		{"max-peers-per-identity", b.MaxPeersPerIdentity},
		{"max-entries-per-identity", b.MaxEntriesPerIdentity},
		{"max-values-per-identity", b.MaxValuesPerIdentity},
	} {
		if q.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must be >= 0 (0 for the default), got %d", q.flag, q.v))
		}
	}
	for _, q := range []struct {
		flag string
		v    int
	}{
		{"max-report-values", b.MaxReportValues},
		{"max-descriptor-values", b.MaxDescriptorValues},
	} {
		if q.v < 0 || q.v > maxValuesBound {
			errs = append(errs, fmt.Errorf("%s: must be in [0, %d] (0 for the default), got %d", q.flag, maxValuesBound, q.v))
		}
	}
	return errors.Join(errs...)
}

// Reasons a report is rejected. They are metric label values and the first
// word of the reject_reason sent back to the sidecar.
const (
	ReasonEmptyReport     = "empty_report"      // the request carried no report
	ReasonBadSidecarID    = "bad_sidecar_id"    // empty, or longer than names.MaxLen
	ReasonBadName         = "bad_name"          // service or peer fails names.Check, or the service is names.Overflow
	ReasonBadDirection    = "bad_direction"     // neither inbound nor outbound
	ReasonBadWindow       = "bad_window"        // missing, or outside [MinWindow, MaxWindow]
	ReasonTooManyPeers    = "too_many_peers"    // more than absurdPeersFactor × MaxPeersPerReport entries
	ReasonDuplicatePeer   = "duplicate_peer"    // a (peer, procedure, criticality) listed twice
	ReasonBadCounts       = "bad_counts"        // dropped + shadow_dropped above offered
	ReasonAbsurdRate      = "absurd_rate"       // a peer's offered rate above MaxRate
	ReasonTooManySidecars = "too_many_sidecars" // a new sidecar while MaxSidecars are kept
	ReasonBadInterval     = "bad_interval"      // an interval above MaxInterval
	ReasonIDInUse         = "id_in_use"         // the sidecar id is held by another live stream of the identity
	ReasonQuotaSidecars   = "quota_sidecars"    // a new sidecar while its identity holds MaxSidecarsPerIdentity
)

// Reasons lists every reject reason, for metrics resolved up front.
var Reasons = []string{
	ReasonEmptyReport, ReasonBadSidecarID, ReasonBadName, ReasonBadDirection, ReasonBadWindow,
	ReasonTooManyPeers, ReasonDuplicatePeer, ReasonBadCounts, ReasonAbsurdRate, ReasonTooManySidecars,
	ReasonBadInterval, ReasonIDInUse, ReasonQuotaSidecars,
}

// EntryBadProcedure is why an entry of a report is left out, the rest of
// the report kept: its procedure is neither "" nor a valid procedure name
// (names.CheckProcedure). A metric label value. The entry's load is lost,
// not folded: a sidecar sends only the procedures its policy declares and
// names.Other, so a bad one is a bug or a lie, and a name it can not spell
// is no bucket to keep.
const EntryBadProcedure = "bad_procedure"

// Reasons an entry of a report is left out for its tier (issue #16), the
// rest of the report kept. Metric label values, as EntryBadProcedure.
const (
	// EntryBadCriticality: a criticality outside the enum.
	EntryBadCriticality = "bad_criticality"
	// EntryMixedCriticality: a tiered entry of a (peer, procedure) that
	// the same report also lists untiered. A sidecar resolves every
	// request of a callee with tiers to one, so its leaves are all tiered
	// or all not; a report with both is a bug or a lie, and the untiered
	// entry, what a callee without tiers reports, is the one kept.
	EntryMixedCriticality = "mixed_criticality"
)

// Reasons an entry of a report is left out for its cost or its requests
// in flight (issue #16), the rest of the report kept. Metric label
// values, as EntryBadProcedure. The entry's whole load is lost: its
// requests are counted with costs no one can believe.
const (
	// EntryBadCost: an offered_cost or admitted_cost that is NaN,
	// infinite or negative, or above Bounds.MaxCostPerRequest per
	// request. An admitted_cost above offered_cost is no error: the app
	// may report a request cost more than its price.
	EntryBadCost = "bad_cost"
	// EntryBadInFlight: in_flight above MaxInFlight.
	EntryBadInFlight = "bad_in_flight"
)

// MaxInFlight bounds the requests in flight one sidecar may report for
// one bucket: a million concurrent requests at one process is no
// sidecar's.
const MaxInFlight = 1_000_000

// EntryReasons lists every reason an entry is left out, for metrics
// resolved up front. The descriptors' are in descriptors.go.
var EntryReasons = []string{
	EntryBadProcedure, EntryBadCriticality, EntryMixedCriticality, EntryBadCost, EntryBadInFlight,
	EntryBadDescriptor, EntryBadDescriptorCounts, EntryDuplicateDescriptor, EntryTooManyDescriptors, EntryOutboundDescriptor,
	EntryBadValue, EntryDuplicateValue, EntryTooManyValues, EntryQuotaValues,
	EntryBadHealth, EntryDuplicateHealth, EntryTooManyHealth, EntryOutboundHealth, EntryHealthOverclaim,
}

// Reasons a peer of an accepted report is folded into names.Overflow: the
// bound it would have taken the report or its identity past. They are
// metric label values.
const (
	FoldReport  = "max_peers_per_report"     // beyond MaxPeersPerReport
	FoldEntries = "max_entries_per_identity" // beyond MaxEntriesPerIdentity
	FoldPeers   = "max_peers_per_identity"   // new to its identity, beyond MaxPeersPerIdentity
)

// FoldReasons lists every fold reason, for metrics resolved up front.
var FoldReasons = []string{FoldReport, FoldEntries, FoldPeers}

// absurdPeersFactor times MaxPeersPerReport is the most peers a report may
// name: more is no sidecar's, and would cost the aggregator a sort of
// them. (The gRPC receive limit, MaxReportSize, bounds its bytes.)
const absurdPeersFactor = 10

// RejectError says why Apply rejected a whole report.
type RejectError struct {
	Reason string // one of the Reason constants: short, bounded, a metric label
	Detail string // for humans: which field, which value
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Detail }

func reject(reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Sender is who sent a report, as far as the aggregator can tell.
type Sender struct {
	// Identity is the service the sender may speak for: the service of its
	// verified certificate under mutual TLS; in plaintext the report's own
	// service, a stand-in anyone can claim. Sidecar ids and quotas are per
	// identity: an identity can neither take nor exhaust another's.
	Identity string
	// Holder is the stream that holds the sender's sidecar id; while that
	// sidecar is live, a report from another holder is rejected. The zero
	// value is one holder like any other (the simulator's).
	Holder uint64
}

// State is the pure state of a zone aggregator: the latest rates of every
// live sidecar, and their sums. Time arrives as an argument; it starts no
// goroutines and does no I/O, so the simulator can drive it directly.
//
// State is not safe for concurrent use.
type State struct {
	zone, id   string
	staleAfter int
	bounds     Bounds

	sidecars   map[sidecarKey]*sidecarLoad
	identities map[string]*identityLoad // of the sidecars above
	// order is the keys of sidecars, sorted, or nil after a sidecar came or
	// went. Flush adds up floating-point rates in this order, so that the
	// same sidecars give bit-identical sums whatever order they came in.
	order []sidecarKey
	// stale collects sidecars dropped for silence until TakeStale.
	stale []string
	// capped counts the sums the last Flush capped at zoneload.MaxRate.
	capped int
	// folds counts the peers Apply folded into names.Overflow since the
	// last TakeFolds.
	folds Folds
	// badEntries counts the entries Apply left out of accepted reports
	// since the last TakeRejectedEntries.
	badEntries RejectedEntries
	// descriptorsCut counts the descriptors the last Flush left out;
	// healthCut the health entries.
	descriptorsCut, healthCut int
	// scratch is Flush's, reused from one flush to the next.
	scratch descriptorScratch
	// urgent is set by Apply when a report shows a surge; see TakeUrgent.
	// urgentFlush marks the next Flush's zone load urgent, so that the
	// controller acts on it at once too.
	urgent, urgentFlush bool
}

// sidecarKey identifies a sidecar: its id is the identity's to choose, so
// that ids of different identities never collide.
type sidecarKey struct{ identity, id string }

func compareKeys(a, b sidecarKey) int {
	return cmp.Or(strings.Compare(a.identity, b.identity), strings.Compare(a.id, b.id))
}

// sidecarLoad is the latest accepted report of one sidecar, as rates.
type sidecarLoad struct {
	holder    uint64
	service   string
	direction sluicev1.Direction
	interval  time.Duration // the sidecar's report interval (else its window), for staleness
	seen      time.Time     // when the report was applied, by the aggregator's clock
	peers     []peerRate    // sorted by leaf
	// descriptors are those of the last report that carried them (see
	// keepDescriptors), reported at descriptorsSeen; nil for none.
	descriptors     []descriptorRate
	descriptorsSeen time.Time
	// health is that of the last report that carried it (see
	// keepHealth), reported at healthSeen; nil for none.
	health     []healthRate
	healthSeen time.Time
}

// leaf is a bucket of a report: a peer, the procedure its requests did
// at the callee ("" when the callee declares none), and their tier (None
// when the callee declares none).
type leaf struct {
	peer, procedure string
	tier            criticality.Tier
}

func compareLeaves(a, b leaf) int {
	return cmp.Or(strings.Compare(a.peer, b.peer), strings.Compare(a.procedure, b.procedure), cmp.Compare(a.tier, b.tier))
}

type peerRate struct {
	leaf                             // interned in its identity's peers
	offered, dropped, shadow float64 // requests per second
	// offeredCost and admittedCost are cost units per second, 0 for a
	// callee counting requests; inFlight is the sidecar's gauge.
	offeredCost, admittedCost float64
	inFlight                  uint32
}

// add adds q's rates to p's: p's bucket takes q's load (fold). In flight
// saturates.
func (p *peerRate) add(q peerRate) {
	p.offered += q.offered
	p.dropped += q.dropped
	p.shadow += q.shadow
	p.offeredCost += q.offeredCost
	p.admittedCost += q.admittedCost
	p.inFlight += min(q.inFlight, math.MaxUint32-p.inFlight)
}

func comparePeerRates(a, b peerRate) int { return compareLeaves(a.leaf, b.leaf) }

// identityLoad is what the quotas count of one identity's sidecars.
type identityLoad struct {
	sidecars int
	// entries is the leaves of its sidecars' reports, summed, the
	// reserved ones (reserved) left out.
	entries int
	// peers are its distinct leaves: the one copy of each name that its
	// peerRates refer to, and how many of its sidecars list it. An entry
	// goes when the last report listing it is replaced or removed, so a
	// leaf that no report names any more gives its place back.
	peers map[leaf]*peerRef
	// values is the descriptor values its sidecars hold, summed, the
	// reserved ones left out (heldValues): what MaxValuesPerIdentity
	// bounds.
	values int
}

// reserved reports whether l is one of the leaves that every sidecar may
// report and no quota folds: the caller that names none, and the bucket
// that folded leaves go to, each with no procedure or with names.Other,
// in any tier. Twenty leaves at most (reservedLeaves): a reserved peer
// with a procedure of its own counts against the quotas like any leaf, or
// a sidecar could grow the state with invented procedures of
// names.Unknown; the tiers are five, checked before a leaf gets here.
func reserved(l leaf) bool {
	return (l.peer == names.Unknown || l.peer == names.Overflow) && (l.procedure == "" || l.procedure == names.Other)
}

// reservedLeaves are the leaves reserved reports true for.
var reservedLeaves = func() []leaf {
	var out []leaf
	for _, peer := range []string{names.Unknown, names.Overflow} {
		for _, proc := range []string{"", names.Other} {
			for t := criticality.None; t <= criticality.Sheddable; t++ {
				out = append(out, leaf{peer, proc, t})
			}
		}
	}
	return out
}()

// distinct returns how many of il's distinct leaves are not reserved.
func (il *identityLoad) distinct() int {
	n := len(il.peers)
	for _, r := range reservedLeaves {
		if il.peers[r] != nil {
			n--
		}
	}
	return n
}

type peerRef struct {
	leaf
	n int
}

// bucketKey identifies one ServiceLoad of a ZoneLoad.
type bucketKey struct {
	service   string
	direction sluicev1.Direction
}

// NewState returns the state of aggregator id of zone. A sidecar is dropped
// from the sums when it has not reported for more than staleAfter of its own
// windows (0 or less means 3). Zero fields of bounds take their defaults.
func NewState(zone, id string, staleAfter int, bounds Bounds) *State {
	if staleAfter <= 0 {
		staleAfter = 3
	}
	return &State{
		zone:       zone,
		id:         id,
		staleAfter: staleAfter,
		bounds:     bounds.withDefaults(),
		sidecars:   make(map[sidecarKey]*sidecarLoad),
		identities: make(map[string]*identityLoad),
	}
}

// Apply is ApplyFrom for a sender whose identity is the report's service,
// on the zero holder: what plaintext can tell, for the simulator.
func (s *State) Apply(r *sluicev1.LoadReport, now time.Time) error {
	return s.ApplyFrom(Sender{Identity: r.GetService()}, r, now)
}

// ApplyFrom checks r, sent by from, and makes its rates the sidecar's
// latest, replacing, never adding to, whatever the sidecar reported before:
// a duplicated or late report can not count twice. now is the arrival time;
// staleness is measured from it, not from the sidecar's clock. A rejected
// report (a *RejectError) changes nothing.
//
// The sidecar is (from.Identity, its id). While it is live, only its holder
// may report for it (ReasonIDInUse); once it went stale, the next holder
// takes it. The report's zone is ignored: the aggregator accounts every
// sidecar to its own zone. ApplyFrom keeps no reference to r.
func (s *State) ApplyFrom(from Sender, r *sluicev1.LoadReport, now time.Time) error {
	if err := s.checkHeader(r); err != nil {
		return err
	}
	k := sidecarKey{from.Identity, r.GetSidecarId()}
	old := s.sidecars[k]
	if old != nil && old.holder != from.Holder && !s.isStale(old, now) {
		return reject(ReasonIDInUse, "sidecar id %q of %q is held by another live stream", uplink.Truncate(k.id), uplink.Truncate(k.identity))
	}
	il := s.identities[k.identity]
	if old == nil {
		if len(s.sidecars) >= s.bounds.MaxSidecars {
			return reject(ReasonTooManySidecars, "already %d sidecars, at most %d", len(s.sidecars), s.bounds.MaxSidecars)
		}
		if il != nil && il.sidecars >= s.bounds.MaxSidecarsPerIdentity {
			return reject(ReasonQuotaSidecars, "%q already holds %d sidecar ids, at most %d", uplink.Truncate(k.identity), il.sidecars, s.bounds.MaxSidecarsPerIdentity)
		}
	}
	peers, bad, err := s.checkPeers(r, old)
	if err != nil {
		return err
	}
	descs, descsSeen := keepDescriptors(old, r, s.capValues(il, old, s.checkDescriptors(r, &bad), &bad), now)
	hs, hsSeen := keepHealth(old, r, s.checkHealth(r, &bad), now)
	s.badEntries.add(bad)
	peers = s.fold(il, old, peers)

	if il == nil {
		il = &identityLoad{peers: make(map[leaf]*peerRef)}
		s.identities[k.identity] = il
	}
	if old == nil {
		old = new(sidecarLoad)
		s.sidecars[k] = old
		s.order = nil
		il.sidecars++
	}
	il.hold(peers)
	il.release(old.peers)
	il.values += heldValues(descs) - heldValues(old.descriptors)
	if r.GetUrgent() {
		s.urgent, s.urgentFlush = true, true
	}
	*old = sidecarLoad{holder: from.Holder, service: r.GetService(), direction: r.GetDirection(),
		interval: s.staleInterval(r), seen: now, peers: peers, descriptors: descs, descriptorsSeen: descsSeen,
		health: hs, healthSeen: hsSeen}
	return nil
}

// checkHeader checks everything of r but its peers.
func (s *State) checkHeader(r *sluicev1.LoadReport) error {
	if r == nil {
		return reject(ReasonEmptyReport, "no report")
	}
	id := r.GetSidecarId()
	if id == "" || len(id) > names.MaxLen {
		return reject(ReasonBadSidecarID, "sidecar_id must be 1 to %d bytes, got %d", names.MaxLen, len(id))
	}
	if err := names.Check(r.GetService()); err != nil {
		return reject(ReasonBadName, "service: %v", err)
	}
	if r.GetService() == names.Overflow {
		// The controller refuses a zone load naming it, which would hide
		// the whole zone from it.
		return reject(ReasonBadName, "service: %q is reserved", names.Overflow)
	}
	dir := r.GetDirection()
	if dir != sluicev1.Direction_DIRECTION_INBOUND && dir != sluicev1.Direction_DIRECTION_OUTBOUND {
		return reject(ReasonBadDirection, "direction must be inbound or outbound, got %v", dir)
	}
	if r.GetWindow() == nil {
		return reject(ReasonBadWindow, "no window")
	}
	if err := r.GetWindow().CheckValid(); err != nil {
		return reject(ReasonBadWindow, "window: %v", err)
	}
	window := r.GetWindow().AsDuration()
	if window < s.bounds.MinWindow || window > s.bounds.MaxWindow {
		return reject(ReasonBadWindow, "window %v is outside [%v, %v]", window, s.bounds.MinWindow, s.bounds.MaxWindow)
	}
	if iv := r.GetInterval(); iv != nil && (iv.CheckValid() != nil || iv.AsDuration() > s.bounds.MaxInterval) {
		return reject(ReasonBadInterval, "interval %v is above %v", iv.AsDuration(), s.bounds.MaxInterval)
	}
	if n := len(r.GetPeers()); n > absurdPeersFactor*s.bounds.MaxPeersPerReport {
		return reject(ReasonTooManyPeers, "%d peers, at most %d", n, absurdPeersFactor*s.bounds.MaxPeersPerReport)
	}
	return nil
}

// staleInterval is the time a sidecar counts as one of its intervals for
// staleness: its report interval, else its window, and at most MaxInterval.
// It counts intervals, not the last window: a surge report's window is a
// fraction of the interval.
func (s *State) staleInterval(r *sluicev1.LoadReport) time.Duration {
	iv := r.GetWindow().AsDuration()
	if r.GetInterval() != nil {
		iv = max(iv, r.GetInterval().AsDuration())
	}
	return min(iv, s.bounds.MaxInterval)
}

func (s *State) isStale(sc *sidecarLoad, now time.Time) bool {
	return now.Sub(sc.seen) > time.Duration(s.staleAfter)*sc.interval
}

// checkPeers checks r's entries and returns them as rates, sorted by
// leaf, and the entries it left out: for a bad procedure
// (EntryBadProcedure) or tier (EntryBadCriticality,
// EntryMixedCriticality). Any other bad entry rejects the report.
func (s *State) checkPeers(r *sluicev1.LoadReport, old *sidecarLoad) (peers []peerRate, bad RejectedEntries, err error) {
	secs := r.GetWindow().AsDuration().Seconds()
	peers = make([]peerRate, 0, len(r.GetPeers()))
	for _, p := range r.GetPeers() {
		if err := names.Check(p.GetPeer()); err != nil {
			return nil, bad, reject(ReasonBadName, "peer: %v", err)
		}
		if proc := p.GetProcedure(); proc != "" && !names.ValidProcedure(proc) {
			bad.BadProcedure++
			continue
		}
		c := p.GetCriticality()
		if c < 0 || c > sluicev1.Criticality(criticality.Sheddable) {
			bad.BadCriticality++
			continue
		}
		o, d, sh := p.GetOffered(), p.GetDropped(), p.GetShadowDropped()
		// Dropped requests were not admitted and shadow-dropped ones
		// were: both are parts of offered, and they do not overlap. The
		// sum is checked without overflowing.
		if d > o || sh > o-d {
			return nil, bad, reject(ReasonBadCounts, "peer %q: dropped %d + shadow_dropped %d above offered %d", p.GetPeer(), d, sh, o)
		}
		rate := float64(o) / secs
		if rate > s.bounds.MaxRate {
			return nil, bad, reject(ReasonAbsurdRate, "peer %q: offered rate %.0f/s above %.0f/s", p.GetPeer(), rate, s.bounds.MaxRate)
		}
		if !s.plausibleCost(p, old, leaf{p.GetPeer(), p.GetProcedure(), criticality.Tier(c)}) {
			bad.BadCost++
			continue
		}
		if p.GetInFlight() > MaxInFlight {
			bad.BadInFlight++
			continue
		}
		peers = append(peers, peerRate{
			leaf:         leaf{p.GetPeer(), p.GetProcedure(), criticality.Tier(c)},
			offered:      rate,
			dropped:      float64(d) / secs,
			shadow:       float64(sh) / secs,
			offeredCost:  p.GetOfferedCost() / secs,
			admittedCost: p.GetAdmittedCost() / secs,
			inFlight:     p.GetInFlight(),
		})
	}
	slices.SortFunc(peers, comparePeerRates)
	for i := 1; i < len(peers); i++ {
		if peers[i].leaf == peers[i-1].leaf {
			return nil, bad, reject(ReasonDuplicatePeer, "peer %q procedure %q criticality %v listed twice", peers[i].peer, uplink.Truncate(peers[i].procedure), peers[i].tier)
		}
	}
	peers = unmix(peers, &bad)
	if bad.Total() > 0 {
		// The sidecar holds what it keeps: MaxEntriesPerIdentity counts
		// entries, so no room for the ones left out stays behind (up to
		// absurdPeersFactor × MaxPeersPerReport of them).
		peers = slices.Clone(peers)
	}
	return peers, bad, nil
}

// plausibleCost reports whether p's costs, over its window, are numbers
// one report's requests can have cost: finite, ≥ 0, and at most
// MaxCostPerRequest each. Offered cost prices the requests offered in the
// window; admitted cost may also count requests admitted before it and
// completed in it: at most those offered in it, those in flight when it
// began (before, the sidecar's last in_flight for the leaf; its current one
// if larger, for a first report), and one more (a long request of a
// bucket whose sidecar counts none in flight).
//
// before is looked up in old, the sidecar's last load, under leaf l, only
// when the admitted cost is above what the current in_flight allows: the
// bound only grows with it, and most reports are far under it.
func (s *State) plausibleCost(p *sluicev1.PeerCounts, old *sidecarLoad, l leaf) bool {
	oc, ac := p.GetOfferedCost(), p.GetAdmittedCost()
	if !(oc >= 0) || !(ac >= 0) || math.IsInf(oc, 1) || math.IsInf(ac, 1) {
		return false // also NaN
	}
	m := s.bounds.MaxCostPerRequest
	if oc > m*float64(p.GetOffered()) {
		return false
	}
	admissible := func(inFlight uint32) bool { return ac <= m*(float64(p.GetOffered())+float64(inFlight)+1) }
	return admissible(p.GetInFlight()) || admissible(max(old.inFlight(l), p.GetInFlight()))
}

// inFlight returns the requests of leaf l in flight at sc's sidecar when
// its last report's window closed; 0 for a sidecar not seen before.
func (sc *sidecarLoad) inFlight(l leaf) uint32 {
	if sc == nil {
		return 0
	}
	if i, ok := slices.BinarySearchFunc(sc.peers, l, func(p peerRate, l leaf) int { return compareLeaves(p.leaf, l) }); ok {
		return sc.peers[i].inFlight
	}
	return 0
}

// unmix leaves out of peers, sorted by leaf, the tiered entries of every
// (peer, procedure) that peers also lists untiered (EntryMixedCriticality),
// in place.
func unmix(peers []peerRate, bad *RejectedEntries) []peerRate {
	out := peers[:0]
	for i, p := range peers {
		// Sorted: an untiered entry comes first among its (peer,
		// procedure)'s, and out keeps it.
		if n := len(out); p.tier != criticality.None && n > 0 && out[n-1].tier == criticality.None &&
			out[n-1].peer == p.peer && out[n-1].procedure == p.procedure {
			bad.MixedCriticality++
			continue
		}
		out = append(out, peers[i])
	}
	return out
}

// RejectedEntries counts the entries left out of accepted reports, by
// reason.
type RejectedEntries struct {
	BadProcedure     int // EntryBadProcedure
	BadCriticality   int // EntryBadCriticality
	MixedCriticality int // EntryMixedCriticality
	BadCost          int // EntryBadCost
	BadInFlight      int // EntryBadInFlight

	BadDescriptor       int // EntryBadDescriptor
	BadDescriptorCounts int // EntryBadDescriptorCounts
	DuplicateDescriptor int // EntryDuplicateDescriptor
	TooManyDescriptors  int // EntryTooManyDescriptors
	OutboundDescriptor  int // EntryOutboundDescriptor
	BadValue            int // EntryBadValue
	DuplicateValue      int // EntryDuplicateValue
	TooManyValues       int // EntryTooManyValues
	QuotaValues         int // EntryQuotaValues
	BadHealth           int // EntryBadHealth
	DuplicateHealth     int // EntryDuplicateHealth
	TooManyHealth       int // EntryTooManyHealth
	OutboundHealth      int // EntryOutboundHealth
	HealthOverclaim     int // EntryHealthOverclaim

	// ValueClamped counts values kept but clamped to their descriptor's
	// offered total, which they claimed to exceed: not left out.
	ValueClamped int
}

// ByReason returns the counts of the entries left out, in EntryReasons'
// order (ValueClamped is not one).
func (e RejectedEntries) ByReason() [19]int {
	return [...]int{e.BadProcedure, e.BadCriticality, e.MixedCriticality, e.BadCost, e.BadInFlight,
		e.BadDescriptor, e.BadDescriptorCounts, e.DuplicateDescriptor, e.TooManyDescriptors, e.OutboundDescriptor,
		e.BadValue, e.DuplicateValue, e.TooManyValues, e.QuotaValues,
		e.BadHealth, e.DuplicateHealth, e.TooManyHealth, e.OutboundHealth, e.HealthOverclaim}
}

// Total is every entry left out.
func (e RejectedEntries) Total() int {
	n := 0
	for _, c := range e.ByReason() {
		n += c
	}
	return n
}

func (e *RejectedEntries) add(o RejectedEntries) {
	e.BadProcedure += o.BadProcedure
	e.BadCriticality += o.BadCriticality
	e.MixedCriticality += o.MixedCriticality
	e.BadCost += o.BadCost
	e.BadInFlight += o.BadInFlight
	e.BadDescriptor += o.BadDescriptor
	e.BadDescriptorCounts += o.BadDescriptorCounts
	e.DuplicateDescriptor += o.DuplicateDescriptor
	e.TooManyDescriptors += o.TooManyDescriptors
	e.OutboundDescriptor += o.OutboundDescriptor
	e.BadValue += o.BadValue
	e.DuplicateValue += o.DuplicateValue
	e.TooManyValues += o.TooManyValues
	e.QuotaValues += o.QuotaValues
	e.BadHealth += o.BadHealth
	e.DuplicateHealth += o.DuplicateHealth
	e.TooManyHealth += o.TooManyHealth
	e.OutboundHealth += o.OutboundHealth
	e.HealthOverclaim += o.HealthOverclaim
	e.ValueClamped += o.ValueClamped
}

// TakeRejectedEntries returns the entries left out since the last call,
// and clears them.
func (s *State) TakeRejectedEntries() RejectedEntries {
	e := s.badEntries
	s.badEntries = RejectedEntries{}
	return e
}

// Folds counts peers of accepted reports folded into names.Overflow, by
// the bound that folded them.
type Folds struct {
	Report   int // beyond MaxPeersPerReport (FoldReport)
	Entries  int // beyond the identity's MaxEntriesPerIdentity (FoldEntries)
	Identity int // new to the identity, beyond MaxPeersPerIdentity (FoldPeers)
}

// Total is every peer folded.
func (f Folds) Total() int { return f.Report + f.Entries + f.Identity }

// TakeFolds returns the peers folded since the last call, and clears them.
func (s *State) TakeFolds() Folds {
	f := s.folds
	s.folds = Folds{}
	return f
}

// fold makes peers, a report's checked rates sorted by leaf, fit what its
// sidecar and its identity (il, nil for none yet) may keep, replacing the
// sidecar's old report (nil for a new sidecar), and returns them sorted.
// It never rejects: the leaves beyond the bounds are folded into
// names.Overflow, their rates (offered, dropped, shadow) added to its, so
// that the service's load stays whole and what costs is the folded leaves'
// own buckets. A leaf without a procedure folds into (names.Overflow, ""),
// one with a procedure into (names.Overflow, names.Other), each in its own
// tier: the procedure stays one the callee's table has room for, whatever
// was folded. The reserved leaves are always kept.
//
// Which leaves fold is deterministic, by rank: first the leaves the
// identity already holds (listed by a report of its, this sidecar's old
// one included), then the larger offered rate, then the leaf; the lowest
// ranks fold. Held leaves first: a bucket once given is not taken away by
// a newcomer, so buckets do not flap from report to report, and names made
// up after the fact can not push out the callers a service had. The
// larger rates next: made-up names spread a flood thin, while a caller
// that matters to a limit sends much; and folding the smallest moves the
// least load out of its own bucket. A flood that came first keeps its
// names only while reports name them: a sidecar's report leaves out the
// callers idle over its window, and its replacement releases them.
func (s *State) fold(il *identityLoad, old *sidecarLoad, peers []peerRate) []peerRate {
	if il == nil {
		il = &identityLoad{}
	}
	n, held := 0, 0 // the report's leaves that may fold, and those the identity holds
	for _, p := range peers {
		if !reserved(p.leaf) {
			n++
			if il.peers[p.leaf] != nil {
				held++
			}
		}
	}
	after, oldOwn := il.distinctAfter(old, peers)
	// Each bound keeps a prefix of the ranked leaves; held ones rank
	// first, so the identity's bound keeps all held ones that the others
	// keep. (Were held ones folded, its room would be larger than
	// counted: no matter, every new one folds too.)
	kReport := min(n, s.bounds.MaxPeersPerReport)
	kEntries := min(kReport, max(0, s.bounds.MaxEntriesPerIdentity-(il.entries-oldOwn)))
	kPeers := min(kEntries, held+max(0, s.bounds.MaxPeersPerIdentity-after))
	if kPeers == n {
		return peers
	}
	s.folds.Report += n - kReport
	s.folds.Entries += kReport - kEntries
	s.folds.Identity += kEntries - kPeers

	own := make([]peerRate, 0, n) // built only when some fold: most reports keep all
	for _, p := range peers {
		if !reserved(p.leaf) {
			own = append(own, p)
		}
	}
	slices.SortFunc(own, func(a, b peerRate) int {
		ha, hb := il.peers[a.leaf] != nil, il.peers[b.leaf] != nil
		if ha != hb {
			if ha {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.offered, a.offered), compareLeaves(a.leaf, b.leaf))
	})
	out := own[:kPeers:kPeers]
	// The leaves folded ones go to: without a procedure, and with; each
	// in the folded leaf's tier, so that a tier's load stays its own.
	var overflow [2][criticality.Sheddable + 1]peerRate
	var used [2][criticality.Sheddable + 1]bool
	at := func(l leaf) (int, criticality.Tier) {
		if l.procedure != "" {
			return 1, l.tier
		}
		return 0, l.tier
	}
	for _, p := range peers {
		switch i, t := at(p.leaf); {
		case p.peer == names.Overflow && reserved(p.leaf):
			overflow[i][t], used[i][t] = p, true
		case reserved(p.leaf):
			out = append(out, p)
		}
	}
	// In rank order, so that the same report and state give the same sum.
	for _, p := range own[kPeers:] {
		i, t := at(p.leaf)
		o := &overflow[i][t]
		o.leaf = leaf{names.Overflow, [2]string{"", names.Other}[i], t}
		o.add(p)
		used[i][t] = true
	}
	for i := range overflow {
		for t := range overflow[i] {
			if used[i][t] {
				out = append(out, overflow[i][t])
			}
		}
	}
	slices.SortFunc(out, comparePeerRates)
	return out
}

// distinctAfter returns how many distinct leaves, reserved ones left out,
// il holds once a sidecar's report peers replaces its old one (nil for a
// new sidecar), before any leaf new to il comes: those only the old
// report listed go. It also returns how many entries the old report
// counts against il, reserved ones left out.
func (il *identityLoad) distinctAfter(old *sidecarLoad, peers []peerRate) (after, oldOwn int) {
	after = il.distinct()
	if old == nil {
		return after, 0
	}
	j := 0
	for _, p := range old.peers {
		if reserved(p.leaf) {
			continue
		}
		oldOwn++
		for j < len(peers) && compareLeaves(peers[j].leaf, p.leaf) < 0 {
			j++
		}
		if il.peers[p.leaf].n == 1 && (j == len(peers) || peers[j].leaf != p.leaf) {
			after--
		}
	}
	return after, oldOwn
}

// hold counts peers as listed once more, and makes each refer to the
// identity's one copy of its names, so that a leaf that many sidecars
// list is kept once.
func (il *identityLoad) hold(peers []peerRate) {
	for i := range peers {
		p := &peers[i]
		ref := il.peers[p.leaf]
		if ref == nil {
			ref = &peerRef{leaf: p.leaf}
			il.peers[ref.leaf] = ref
		}
		ref.n++
		p.leaf = ref.leaf
		if !reserved(p.leaf) {
			il.entries++
		}
	}
}

// release undoes hold.
func (il *identityLoad) release(peers []peerRate) {
	for _, p := range peers {
		if ref := il.peers[p.leaf]; ref.n <= 1 {
			delete(il.peers, p.leaf)
		} else {
			ref.n--
		}
		if !reserved(p.leaf) {
			il.entries--
		}
	}
}

// TakeUrgent reports whether an urgent report (LoadReport.urgent: a
// sidecar saw a caller's rate jump) was applied since the last call, and
// clears the mark. The service flushes at once when it is set, instead of
// waiting for its interval, and the flush is marked urgent so that the
// controller acts at once too. The aggregator does not judge jumps itself:
// one sidecar's rate at a few dozen requests per second is too noisy to
// compare report by report, and the sidecar judges with its Poisson
// threshold on finer windows.
func (s *State) TakeUrgent() bool {
	u := s.urgent
	s.urgent = false
	return u
}

// Remove forgets identity's sidecar id if holder holds it, e.g. when the
// holder's stream ended; a sidecar that another stream took over after it
// went stale stays. Unknown sidecars are ignored.
func (s *State) Remove(identity, id string, holder uint64) {
	k := sidecarKey{identity, id}
	if sc, ok := s.sidecars[k]; ok && sc.holder == holder {
		s.remove(k, sc)
	}
}

func (s *State) remove(k sidecarKey, sc *sidecarLoad) {
	delete(s.sidecars, k)
	s.order = nil
	il := s.identities[k.identity]
	il.release(sc.peers)
	il.values -= heldValues(sc.descriptors)
	if il.sidecars--; il.sidecars == 0 {
		delete(s.identities, k.identity)
	}
}

// Sidecars returns how many sidecars the state keeps, stale ones that the
// next Flush will drop included.
func (s *State) Sidecars() int { return len(s.sidecars) }

// TakeStale returns the ids of the sidecars that Flush dropped for silence
// since the last call, for the service to log, and forgets them.
func (s *State) TakeStale() []string {
	stale := s.stale
	s.stale = nil
	return stale
}

// Capped returns how many sums the last Flush capped at zoneload.MaxRate,
// the most the controller accepts: (service, direction, peer, procedure,
// tier) sums, and descriptors' and their values'.
func (s *State) Capped() int { return s.capped }

// Flush first drops every sidecar that has been silent for more than
// staleAfter of its own windows at now, then returns the zone's complete
// picture: per (service, direction), sorted, the number of live sidecars,
// per (peer, procedure, tier) leaf, sorted, the sum of their rates, and per
// descriptor, sorted, its sums (sumDescriptors). interval is the flush
// interval the controller is told. The same sidecars with the same reports
// give an identical ZoneLoad whatever order they arrived in.
//
// Every sum is within what the controller accepts (zoneload): a sum above
// zoneload.MaxRate is scaled down to it, so that many sidecars each within
// MaxRate can not make the controller refuse the whole zone.
func (s *State) Flush(now time.Time, interval time.Duration) *sluicev1.ZoneLoad {
	for k, sc := range s.sidecars {
		if s.isStale(sc, now) {
			s.remove(k, sc)
			s.stale = append(s.stale, k.id)
		}
	}
	if s.order == nil {
		s.order = slices.SortedFunc(maps.Keys(s.sidecars), compareKeys)
	}

	type sums struct {
		live        uint32
		peers       map[leaf]*sluicev1.PeerRate
		descriptors []*sidecarLoad // the sidecars whose descriptors count
		health      []*sidecarLoad // the sidecars whose health counts
	}
	buckets := make(map[bucketKey]*sums)
	for _, k := range s.order {
		sc := s.sidecars[k]
		bk := bucketKey{sc.service, sc.direction}
		b := buckets[bk]
		if b == nil {
			b = &sums{peers: make(map[leaf]*sluicev1.PeerRate)}
			buckets[bk] = b
		}
		b.live = min(b.live+1, zoneload.MaxLiveSidecars)
		if s.descriptorsLive(sc, now) {
			b.descriptors = append(b.descriptors, sc)
		}
		if s.healthLive(sc, now) {
			b.health = append(b.health, sc)
		}
		for _, p := range sc.peers {
			pr := b.peers[p.leaf]
			if pr == nil {
				pr = &sluicev1.PeerRate{Peer: p.peer, Procedure: p.procedure, Criticality: sluicev1.Criticality(p.tier)}
				b.peers[p.leaf] = pr
			}
			pr.OfferedRps += p.offered
			pr.DroppedRps += p.dropped
			pr.ShadowDroppedRps += p.shadow
			pr.OfferedCostRps += p.offeredCost
			pr.AdmittedCostRps += p.admittedCost
			pr.InFlight += min(p.inFlight, math.MaxUint32-pr.InFlight)
		}
	}

	keys := slices.SortedFunc(maps.Keys(buckets), func(a, b bucketKey) int {
		return cmp.Or(strings.Compare(a.service, b.service), cmp.Compare(a.direction, b.direction))
	})
	out := &sluicev1.ZoneLoad{
		AggregatorId: s.id,
		Zone:         s.zone,
		Interval:     durationpb.New(interval),
		Services:     make([]*sluicev1.ServiceLoad, 0, len(keys)),
		Urgent:       s.urgentFlush,
	}
	s.urgentFlush = false
	s.capped, s.descriptorsCut, s.healthCut = 0, 0, 0
	for _, k := range keys {
		b := buckets[k]
		sl := &sluicev1.ServiceLoad{
			Service:      k.service,
			Direction:    k.direction,
			LiveSidecars: b.live,
			Peers:        make([]*sluicev1.PeerRate, 0, len(b.peers)),
		}
		for _, l := range slices.SortedFunc(maps.Keys(b.peers), compareLeaves) {
			pr := b.peers[l]
			if capRate(pr) {
				s.capped++
			}
			sl.Peers = append(sl.Peers, pr)
		}
		sl.Descriptors = s.sumDescriptors(b.descriptors)
		sl.Health = s.sumHealth(b.health)
		out.Services = append(out.Services, sl)
	}
	return out
}

// capRate scales pr down so that its offered rate is at most
// zoneload.MaxRate, keeping dropped and shadow-dropped the same shares of
// it, and its cost rates at most zoneload.MaxCostRate, keeping admitted
// cost's ratio to offered cost; and reports whether it did.
func capRate(pr *sluicev1.PeerRate) bool {
	capped := false
	if m := max(pr.OfferedCostRps, pr.AdmittedCostRps); m > zoneload.MaxCostRate {
		f := zoneload.MaxCostRate / m
		pr.OfferedCostRps = min(pr.OfferedCostRps*f, zoneload.MaxCostRate)
		pr.AdmittedCostRps = min(pr.AdmittedCostRps*f, zoneload.MaxCostRate)
		capped = true
	}
	if pr.OfferedRps <= zoneload.MaxRate {
		return capped
	}
	f := zoneload.MaxRate / pr.OfferedRps
	pr.OfferedRps = zoneload.MaxRate
	pr.DroppedRps = min(pr.DroppedRps*f, zoneload.MaxRate)
	pr.ShadowDroppedRps = min(pr.ShadowDroppedRps*f, zoneload.MaxRate-pr.DroppedRps)
	return true
}
