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
	"github.com/sluicehq/sluice/pkg/names"
)

// Bounds bound what one report may claim, so that a broken or hostile
// sidecar can neither grow the aggregator's memory without bound nor poison
// the zone's sums. Zero fields take their defaults. (They are not rate
// limits, which the aggregator knows nothing of: it only adds up rates.)
type Bounds struct {
	// MaxPeersPerReport bounds the peers in one report. Default 10000.
	MaxPeersPerReport int
	// MaxRate bounds a peer's offered rate in one report, in requests per
	// second. Default 1e7.
	MaxRate float64
	// MinWindow and MaxWindow bound a report's window: rates over a
	// shorter one are noise, a longer one is stale. Defaults 10ms, 60s.
	MinWindow, MaxWindow time.Duration
	// MaxSidecars bounds the sidecars the aggregator keeps. Default 100000.
	MaxSidecars int
}

// DefaultBounds returns the bounds that zero fields take.
func DefaultBounds() Bounds {
	return Bounds{
		MaxPeersPerReport: 10000,
		MaxRate:           1e7,
		MinWindow:         10 * time.Millisecond,
		MaxWindow:         60 * time.Second,
		MaxSidecars:       100000,
	}
}

func (b Bounds) withDefaults() Bounds {
	d := DefaultBounds()
	if b.MaxPeersPerReport == 0 {
		b.MaxPeersPerReport = d.MaxPeersPerReport
	}
	if b.MaxRate == 0 {
		b.MaxRate = d.MaxRate
	}
	if b.MinWindow == 0 {
		b.MinWindow = d.MinWindow
	}
	if b.MaxWindow == 0 {
		b.MaxWindow = d.MaxWindow
	}
	if b.MaxSidecars == 0 {
		b.MaxSidecars = d.MaxSidecars
	}
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
	if b.MinWindow < 0 {
		errs = append(errs, fmt.Errorf("Bounds.MinWindow: must be >= 0 (0 for the default), got %v", b.MinWindow))
	}
	if b.MaxWindow < 0 {
		errs = append(errs, fmt.Errorf("Bounds.MaxWindow: must be >= 0 (0 for the default), got %v", b.MaxWindow))
	}
	if d := b.withDefaults(); b.MinWindow >= 0 && b.MaxWindow >= 0 && d.MinWindow > d.MaxWindow {
		errs = append(errs, fmt.Errorf("Bounds.MinWindow: %v is above Bounds.MaxWindow %v", d.MinWindow, d.MaxWindow))
	}
	if b.MaxSidecars < 0 {
		errs = append(errs, fmt.Errorf("max-sidecars: must be >= 0 (0 for the default), got %d", b.MaxSidecars))
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
	ReasonTooManyPeers    = "too_many_peers"    // more than MaxPeersPerReport
	ReasonDuplicatePeer   = "duplicate_peer"    // a peer listed twice
	ReasonBadCounts       = "bad_counts"        // dropped + shadow_dropped above offered
	ReasonAbsurdRate      = "absurd_rate"       // a peer's offered rate above MaxRate
	ReasonTooManySidecars = "too_many_sidecars" // a new sidecar while MaxSidecars are kept
)

// Reasons lists every reject reason, for metrics resolved up front.
var Reasons = []string{
	ReasonEmptyReport, ReasonBadSidecarID, ReasonBadName, ReasonBadDirection, ReasonBadWindow,
	ReasonTooManyPeers, ReasonDuplicatePeer, ReasonBadCounts, ReasonAbsurdRate, ReasonTooManySidecars,
}

// RejectError says why Apply rejected a whole report.
type RejectError struct {
	Reason string // one of the Reason constants: short, bounded, a metric label
	Detail string // for humans: which field, which value
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Detail }

func reject(reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
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

	sidecars map[string]*sidecarLoad // by sidecar id
	// order is the ids of sidecars, sorted, or nil after a sidecar came or
	// went. Flush adds up floating-point rates in this order, so that the
	// same sidecars give bit-identical sums whatever order they came in.
	order []string
	// stale collects sidecars dropped for silence until TakeStale.
	stale []string
	// urgent is set by Apply when a report shows a surge; see TakeUrgent.
	// urgentFlush marks the next Flush's zone load urgent, so that the
	// controller acts on it at once too.
	urgent, urgentFlush bool
}

// sidecarLoad is the latest accepted report of one sidecar, as rates.
type sidecarLoad struct {
	service   string
	direction sluicev1.Direction
	interval  time.Duration // the sidecar's report interval (else its window), for staleness
	seen      time.Time     // when the report was applied, by the aggregator's clock
	peers     []peerRate    // sorted by peer
}

type peerRate struct {
	peer                     string
	offered, dropped, shadow float64 // requests per second
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
		sidecars:   make(map[string]*sidecarLoad),
	}
}

// Apply checks r and makes its rates the sidecar's latest, replacing, never
// adding to, whatever the sidecar reported before: a duplicated or late
// report can not count twice. now is the arrival time; staleness is
// measured from it, not from the sidecar's clock. A rejected report (a
// *RejectError) changes nothing.
//
// The report's zone is ignored: the aggregator accounts every sidecar to its
// own zone. Apply keeps no reference to r.
func (s *State) Apply(r *sluicev1.LoadReport, now time.Time) error {
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
	if n := len(r.GetPeers()); n > s.bounds.MaxPeersPerReport {
		return reject(ReasonTooManyPeers, "%d peers, at most %d", n, s.bounds.MaxPeersPerReport)
	}
	old, known := s.sidecars[id]
	if !known && len(s.sidecars) >= s.bounds.MaxSidecars {
		return reject(ReasonTooManySidecars, "already %d sidecars, at most %d", len(s.sidecars), s.bounds.MaxSidecars)
	}

	secs := window.Seconds()
	peers := make([]peerRate, 0, len(r.GetPeers()))
	for _, p := range r.GetPeers() {
		if err := names.Check(p.GetPeer()); err != nil {
			return reject(ReasonBadName, "peer: %v", err)
		}
		o, d, sh := p.GetOffered(), p.GetDropped(), p.GetShadowDropped()
		// Dropped requests were not admitted and shadow-dropped ones
		// were: both are parts of offered, and they do not overlap. The
		// sum is checked without overflowing.
		if d > o || sh > o-d {
			return reject(ReasonBadCounts, "peer %q: dropped %d + shadow_dropped %d above offered %d", p.GetPeer(), d, sh, o)
		}
		rate := float64(o) / secs
		if rate > s.bounds.MaxRate {
			return reject(ReasonAbsurdRate, "peer %q: offered rate %.0f/s above %.0f/s", p.GetPeer(), rate, s.bounds.MaxRate)
		}
		peers = append(peers, peerRate{
			peer:    p.GetPeer(),
			offered: rate,
			dropped: float64(d) / secs,
			shadow:  float64(sh) / secs,
		})
	}
	slices.SortFunc(peers, func(a, b peerRate) int { return strings.Compare(a.peer, b.peer) })
	for i := 1; i < len(peers); i++ {
		if peers[i].peer == peers[i-1].peer {
			return reject(ReasonDuplicatePeer, "peer %q listed twice", peers[i].peer)
		}
	}

	if !known {
		old = new(sidecarLoad)
		s.sidecars[id] = old
		s.order = nil
	}
	// Staleness counts the sidecar's intervals, not its last window: a
	// surge report's window is a fraction of the interval.
	interval := window
	if iv := r.GetInterval(); iv != nil && iv.IsValid() {
		interval = max(window, min(iv.AsDuration(), s.bounds.MaxWindow))
	}
	if r.GetUrgent() {
		s.urgent, s.urgentFlush = true, true
	}
	*old = sidecarLoad{service: r.GetService(), direction: dir, interval: interval, seen: now, peers: peers}
	return nil
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

// Remove forgets a sidecar, e.g. when its stream ended. Unknown ids are
// ignored.
func (s *State) Remove(sidecarID string) {
	if _, ok := s.sidecars[sidecarID]; ok {
		delete(s.sidecars, sidecarID)
		s.order = nil
	}
}

// Sidecars returns how many sidecars the state keeps, stale ones that the
// next Flush will drop included.
func (s *State) Sidecars() int { return len(s.sidecars) }

// TakeStale returns the sidecars that Flush dropped for silence since the
// last call, for the service to log, and forgets them.
func (s *State) TakeStale() []string {
	stale := s.stale
	s.stale = nil
	return stale
}

// Flush first drops every sidecar that has been silent for more than
// staleAfter of its own windows at now, then returns the zone's complete
// picture: per (service, direction), sorted, the number of live sidecars
// and per peer, sorted, the sum of their rates. interval is the flush
// interval the controller is told. The same sidecars with the same reports
// give an identical ZoneLoad whatever order they arrived in.
func (s *State) Flush(now time.Time, interval time.Duration) *sluicev1.ZoneLoad {
	for id, sc := range s.sidecars {
		if now.Sub(sc.seen) > time.Duration(s.staleAfter)*sc.interval {
			delete(s.sidecars, id)
			s.order = nil
			s.stale = append(s.stale, id)
		}
	}
	if s.order == nil {
		s.order = slices.Sorted(maps.Keys(s.sidecars))
	}

	type sums struct {
		live  uint32
		peers map[string]*sluicev1.PeerRate
	}
	buckets := make(map[bucketKey]*sums)
	for _, id := range s.order {
		sc := s.sidecars[id]
		k := bucketKey{sc.service, sc.direction}
		b := buckets[k]
		if b == nil {
			b = &sums{peers: make(map[string]*sluicev1.PeerRate)}
			buckets[k] = b
		}
		b.live++
		for _, p := range sc.peers {
			pr := b.peers[p.peer]
			if pr == nil {
				pr = &sluicev1.PeerRate{Peer: p.peer}
				b.peers[p.peer] = pr
			}
			pr.OfferedRps += p.offered
			pr.DroppedRps += p.dropped
			pr.ShadowDroppedRps += p.shadow
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
	for _, k := range keys {
		b := buckets[k]
		sl := &sluicev1.ServiceLoad{
			Service:      k.service,
			Direction:    k.direction,
			LiveSidecars: b.live,
			Peers:        make([]*sluicev1.PeerRate, 0, len(b.peers)),
		}
		for _, peer := range slices.Sorted(maps.Keys(b.peers)) {
			sl.Peers = append(sl.Peers, b.peers[peer])
		}
		out.Services = append(out.Services, sl)
	}
	return out
}
