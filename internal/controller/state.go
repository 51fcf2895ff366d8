package controller

import (
	"cmp"
	"strings"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/adaptive"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/shard"
)

// StateConfig holds what the pure part of the controller needs to know.
type StateConfig struct {
	// StaleAfter is how many of its own flush intervals an aggregator may
	// stay silent before its load leaves the sums.
	StaleAfter int
	// Warmup is how long after start the controller collects zone loads
	// before it publishes anything: a restarted controller must not push
	// ratios computed from half a picture.
	Warmup time.Duration
	// PolicyTTL is the TTL written into every policy. Unchanged policies
	// are re-issued every half TTL so that sidecars can tell a quiet
	// controller from a lost one.
	PolicyTTL time.Duration
	// FailOpenDecay is written into every policy.
	FailOpenDecay time.Duration
	// RepublishThreshold is the relative change of a bucket's admitted
	// share, (1−p), that makes a policy worth pushing before its refresh is
	// due. 0.005 means: push when some caller's admitted rate would move by
	// more than half a percent.
	RepublishThreshold float64
	// MaxAggregators bounds the aggregators whose loads are held.
	MaxAggregators int
	// MaxPolicyPeers bounds the peers one policy lists; the rest are shed
	// (see capPeers). 0, and anything above dataplane.MaxPolicyPeers, the
	// most a sidecar accepts, mean that bound.
	MaxPolicyPeers int
	// MaxDescriptorValues bounds the values of one descriptor that a
	// policy lists, and that a zone load may carry (the largest are kept);
	// 0 means DefaultMaxDescriptorValues. See rankValues.
	MaxDescriptorValues int
	// DescriptorHold is how long a compliant descriptor value stays listed
	// (ratio 0, its last offered rate) after the last tick in which a zone
	// reported it, so that a value whose count hovers around the sidecars'
	// report threshold is not dropped by their local allowance in every
	// window it goes unreported; 0 lists a value only while it is
	// reported. See holdValues.
	DescriptorHold time.Duration
	// CostPayback is the window over which a bucket of a callee counting
	// cost pays back what it admitted above its limit (see debt.go); 0
	// means DefaultCostPayback.
	CostPayback time.Duration
	// Law configures the control law.
	Law dropratio.Config
	// Shard is this controller's place among the shards (shard.go); the
	// zero Map, like shard.Single, owns every callee.
	Shard shard.Map
}

// State is the controller's logic without goroutines, sockets or clocks:
// zone loads in, drop policies out, time as an argument. Not safe for
// concurrent use; the Service guards it, the simulator drives it directly.
type State struct {
	cfg   StateConfig
	start time.Time
	law   *dropratio.Law
	// descLaw runs the law over descriptor values: one service per
	// (service, descriptor), one caller per value (stepDescriptors).
	descLaw *dropratio.Law
	// held holds, per descriptor, the compliant values its policy listed
	// at the last tick, with their last report: rebuilt every tick from
	// the list, so at most MaxDescriptorValues per descriptor and only of
	// descriptors the limits give. Nil while DescriptorHold is 0.
	held map[descriptorKey]map[string]heldValue
	// estimators hold, per callee and procedure with an objective, its
	// capacity estimator, and objectives the objective it was made for
	// (adaptive.go).
	estimators map[ServiceProcedure]*adaptive.Estimator
	objectives map[ServiceProcedure]adaptive.Objective
	// levels holds the level of every bucket that holds less than a full
	// one or owes debt, in its callee's units (see debt.go): only buckets
	// with a finite limit of their own that hold a burst, pay back or
	// count cost, and none that is quiet (full: at dropratio.LevelTop).
	levels map[levelKey]float64
	// ordered holds the limit the last tick gave the law for each bucket
	// that holds a level, and bucketOffered each one's offered rate this
	// tick. The reports a tick sums were counted before the last tick's
	// order reached the sidecars, so the level they show is a tick behind
	// what the bucket admits: a tick gives the law the level as it will
	// stand once that tick has passed, the bucket admitting the smaller
	// of its offered rate and the limit it was given. Without that, a
	// debt paid back a tick late runs past 0 (its bucket admits under its
	// limit for a tick, lost), and a burst's tokens are spent twice.
	// ordering collects this tick's orders; stepDt is this tick's step.
	ordered, ordering map[levelKey]float64
	bucketOffered     map[levelKey]float64
	stepDt            time.Duration

	aggs map[string]*aggregatorLoad

	lastStep  time.Time // zero before the first step
	lastJoin  time.Time // when an aggregator last appeared
	warm      bool
	urgent    bool // set by Apply on a surge; see TakeUrgent
	dropped   Dropped
	published map[string]*published

	// owned is the limits set without other shards' callees, computed from
	// ownedFrom (see ownedSet).
	ownedFrom, owned *limits.Set

	// A tick that costs what changed (quiet.go). full turns it off: every
	// tick steps and renders every callee, the tick the incremental one
	// must equal (tests). merged holds the last tick's merged loads (sum),
	// loads its TickResult.Loads, scratch one callee's law input at a
	// time and quietVerdicts the quiet callees' verdicts: room each tick
	// reuses from the one before. perSet caches what is derived from the
	// limits set's services.
	full          bool
	merged        [2]map[string][]peerTotals
	loads         []BucketLoad
	scratch       []dropratio.Caller
	quietVerdicts []dropratio.Verdict
	perSet        setCache
	scratchEntry  *peerSlab // State.unchanged's, one entry at a time
}

// setCache holds what a State derives from the services of one limits
// set, for the ticks under that set: keyed by the services' pointers,
// which a set never changes (limits.NewSet).
type setCache struct {
	set      *limits.Set
	plain    map[*limits.Service]bool            // State.plain
	levels   map[*limits.Service]bool            // State.mayHoldLevels
	callers  map[*limits.Service][]string        // State.sortedCallers
	limited  map[*limits.Service][]string        // State.limitedCallers
	declared map[*limits.Service]map[string]bool // State.declared
}

// under makes c the cache of set, emptied when it was another's.
func (c *setCache) under(set *limits.Set) {
	if c.set != set {
		*c = setCache{set: set, plain: map[*limits.Service]bool{}, levels: map[*limits.Service]bool{},
			callers: map[*limits.Service][]string{}, limited: map[*limits.Service][]string{}, declared: map[*limits.Service]map[string]bool{}}
	}
}

type aggregatorLoad struct {
	zone     string
	interval time.Duration
	seen     time.Time
	load     *sluicev1.ZoneLoad
}

// NewState returns the state of a controller that starts at now.
func NewState(cfg StateConfig, now time.Time) (*State, error) {
	law, err := dropratio.New(cfg.Law)
	if err != nil {
		return nil, err
	}
	// Descriptor values are spared no minimum rate: MinRate matters only
	// when a limit is under it (1 rps by default), and a per-value limit
	// of 0.1 rps (logins per client address) is one that must hold.
	descCfg := cfg.Law
	descCfg.MinRate = 0
	descLaw, err := dropratio.New(descCfg)
	if err != nil {
		return nil, err
	}
	return &State{
		cfg:       cfg,
		start:     now,
		law:       law,
		descLaw:   descLaw,
		aggs:      map[string]*aggregatorLoad{},
		published: map[string]*published{},
		levels:    map[levelKey]float64{},

		ordering:      map[levelKey]float64{},
		bucketOffered: map[levelKey]float64{},
	}, nil
}

// Apply validates a zone load and makes it its aggregator's current load,
// replacing the previous one: a duplicated or late flush never adds up.
// A load whose envelope is bad is refused with a *RejectError and changes
// nothing; bad service entries are removed from load (Apply owns it) and
// counted in TakeDropped, and the rest of the load is applied. It is
// CheckZoneLoad and ApplyChecked.
func (s *State) Apply(load *sluicev1.ZoneLoad, now time.Time) error {
	c, err := CheckZoneLoad(s.cfg, load)
	if err != nil {
		return err
	}
	return s.ApplyChecked(c, now)
}

// ApplyChecked makes a checked zone load its aggregator's current load,
// as Apply does, and counts what the check removed (TakeDropped). An
// aggregator beyond MaxAggregators is refused with a *RejectError, and
// its load counts nothing.
func (s *State) ApplyChecked(c CheckedLoad, now time.Time) error {
	load := c.load
	id := load.GetAggregatorId()
	prev, ok := s.aggs[id]
	if !ok && len(s.aggs) >= s.cfg.MaxAggregators {
		return reject("too_many_aggregators", "already holding %d aggregators", len(s.aggs))
	}
	s.dropped.merge(c.dropped)
	if !ok {
		s.lastJoin = now
		s.urgent = s.urgent || load.GetUrgent()
	} else if !s.urgent {
		s.urgent = load.GetUrgent() || zoneSurged(prev.load, load)
	}
	s.aggs[id] = &aggregatorLoad{
		zone:     load.GetZone(),
		interval: load.GetInterval().AsDuration(),
		seen:     now,
		load:     load,
	}
	return nil
}

// TakeUrgent reports whether a zone load applied since the last call showed
// a surge — the aggregator marked it urgent, or some bucket's rate in that
// zone jumped (dropratio.Jumped) — and clears the mark. The service ticks
// at once when it is set instead of waiting for the next tick. An
// aggregator's first load is urgent only when it says so.
func (s *State) TakeUrgent() bool {
	u := s.urgent
	s.urgent = false
	return u
}

// Dropped counts the service entries Apply left out of zone loads.
type Dropped struct {
	// ByReason counts them by reason, a metric label.
	ByReason map[string]int
	// BadProcedures counts the peer entries left out of service entries
	// that were kept, for ReasonBadProcedure.
	BadProcedures int
	// BadCriticality counts the peer entries left out of service entries
	// that were kept, for ReasonBadCriticality.
	BadCriticality int
	// First is the first one, with its aggregator, for a log line.
	First        *RejectError
	AggregatorID string
	// BadDescriptors counts the descriptor entries, and values of them,
	// left out of service entries that were kept, by reason (the
	// ReasonDescriptor* and ReasonValue* labels); FirstDescriptor tells
	// the first one, for a log line.
	BadDescriptors  map[string]int
	FirstDescriptor string
	// BadHealth counts the health entries left out of service entries
	// that were kept, by reason (the ReasonHealth* labels); FirstHealth
	// tells the first one, for a log line.
	BadHealth   map[string]int
	FirstHealth string
	// NotOwned counts the entries of callees another shard owns, left out
	// (shard.go); not an error while a reshard is under way.
	NotOwned int
}

// merge adds o's counts to d's, keeping d's first of each kind.
func (d *Dropped) merge(o Dropped) {
	if o.ByReason != nil {
		if d.ByReason == nil {
			d.ByReason = map[string]int{}
			d.First, d.AggregatorID = o.First, o.AggregatorID
		}
		for r, n := range o.ByReason {
			d.ByReason[r] += n
		}
	}
	d.BadProcedures += o.BadProcedures
	d.BadCriticality += o.BadCriticality
	d.NotOwned += o.NotOwned
	if o.BadDescriptors != nil {
		if d.BadDescriptors == nil {
			d.BadDescriptors = map[string]int{}
			d.FirstDescriptor = o.FirstDescriptor
		}
		for r, n := range o.BadDescriptors {
			d.BadDescriptors[r] += n
		}
	}
	if o.BadHealth != nil {
		if d.BadHealth == nil {
			d.BadHealth = map[string]int{}
			d.FirstHealth = o.FirstHealth
		}
		for r, n := range o.BadHealth {
			d.BadHealth[r] += n
		}
	}
}

func (d *Dropped) add(aggregatorID string, errs []*RejectError) {
	if len(errs) == 0 {
		return
	}
	if d.ByReason == nil {
		d.ByReason = map[string]int{}
		d.First, d.AggregatorID = errs[0], aggregatorID
	}
	for _, e := range errs {
		d.ByReason[e.Reason]++
	}
}

// TakeDropped returns the service entries dropped since the last call and
// forgets them. Held as counts by reason, so a caller that never takes
// them (the simulator) holds a few counters, not every bad entry.
func (s *State) TakeDropped() Dropped {
	d := s.dropped
	s.dropped = Dropped{}
	return d
}

// comparePeerRates orders a service's peer entries by peer, procedure and
// tier: a bucket's key.
// The procedure is compared only for one peer, the tier only for one
// leaf: cmp.Or would compare all three for every pair, and this is the
// inner loop of validation, the surge check and the sum.
func comparePeerRates(a, b *sluicev1.PeerRate) int {
	if c := strings.Compare(a.GetPeer(), b.GetPeer()); c != 0 {
		return c
	}
	if c := strings.Compare(a.GetProcedure(), b.GetProcedure()); c != 0 {
		return c
	}
	return cmp.Compare(a.GetCriticality(), b.GetCriticality())
}

// zoneSurged reports whether some bucket's offered rate, inbound or
// outbound, jumped from before to after, up or down (dropratio.Jumped); a
// bucket missing from one of them had rate 0 there. Both loads are
// validated: no service or bucket twice, and each service's peers sorted
// (validateService). Each service's buckets are compared in one merge, not
// through maps of every bucket of the zone, which at 110,000 buckets cost
// the controller two thirds of its CPU (sim/scale's profile).
func zoneSurged(before, after *sluicev1.ZoneLoad) bool {
	type service struct {
		name string
		dir  sluicev1.Direction
	}
	prev := make(map[service]*sluicev1.ServiceLoad, len(before.GetServices()))
	for _, svc := range before.GetServices() {
		prev[service{svc.GetService(), svc.GetDirection()}] = svc
	}
	for _, svc := range after.GetServices() {
		k := service{svc.GetService(), svc.GetDirection()}
		old := prev[k]
		delete(prev, k)
		if peersJumped(old.GetPeers(), svc.GetPeers()) {
			return true
		}
	}
	for _, gone := range prev {
		if peersJumped(gone.GetPeers(), nil) {
			return true
		}
	}
	return false
}

// peersJumped reports whether some bucket's rate jumped from a to b, two
// sorted lists of one service's buckets (comparePeerRates).
func peersJumped(a, b []*sluicev1.PeerRate) bool {
	for i, j := 0, 0; i < len(a) || j < len(b); {
		c := 0
		switch {
		case i == len(a):
			c = 1
		case j == len(b):
			c = -1
		default:
			c = comparePeerRates(a[i], b[j])
		}
		var from, to float64
		switch {
		case c < 0:
			from = a[i].GetOfferedRps()
			i++
		case c > 0:
			to = b[j].GetOfferedRps()
			j++
		default:
			from, to = a[i].GetOfferedRps(), b[j].GetOfferedRps()
			i, j = i+1, j+1
		}
		if dropratio.Jumped(from, to) {
			return true
		}
	}
	return false
}

// Remove forgets an aggregator at once, e.g. when its stream ended: its
// sidecars reconnect elsewhere and must not be counted twice meanwhile.
func (s *State) Remove(aggregatorID string) { delete(s.aggs, aggregatorID) }

// Aggregators is the number of aggregators whose loads are held.
func (s *State) Aggregators() int { return len(s.aggs) }

// Warm reports whether the warm-up after start is over at now: Warmup has
// passed, and no aggregator has joined for half of it, so that aggregators
// still reconnecting after a restart are in the picture. Aggregators that
// keep joining can hold it back to three Warmups at most. Once warm, warm.
func (s *State) Warm(now time.Time) bool {
	if !s.warm {
		up := now.Sub(s.start)
		settled := s.lastJoin.IsZero() || now.Sub(s.lastJoin) >= s.cfg.Warmup/2
		s.warm = up >= s.cfg.Warmup && settled || up >= 3*s.cfg.Warmup
	}
	return s.warm
}
