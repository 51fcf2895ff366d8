package aggregator

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Sharded controllers (pkg/shard): with Controllers naming "{shard}", the
// aggregator holds one link per controller shard and sends each shard the
// entries of the callees it owns. The count is the shards' to say: every
// answer of a shard announces it, and the aggregator routes under every
// count its shards last announced, so that while a reshard is under way
// (some shards restarted with the new count, some not yet) each callee goes
// to its owner under both counts and no owner goes without its load. A
// shard that is away keeps its last count in the set for countMemory: a
// callee sent to one more shard costs nothing (a shard keeps only its
// own), one sent to none would lose its load; a shard away longer was
// scaled away. It opens links to new shards as the count grows, and keeps
// them.

// countMemory is how long a shard's last announced count is routed by
// after its last answer: longer than a restart and its warm-up.
const countMemory = time.Minute

// shardLink is the link to one controller shard: its uplinks (one per
// replica with fan-out, else one) and the count it announced last.
type shardLink struct {
	index     int
	ups       []*zoneUplink
	announced atomic.Int32 // 0 before the shard answered
	answered  atomic.Int64 // unix nanoseconds of its last answer
}

// links holds the shard links. New and FlushNow grow it; Run starts them.
type links struct {
	mu   sync.Mutex
	all  []*shardLink
	ctx  context.Context // Run's, nil before Run: links made then wait for it
	wg   *sync.WaitGroup
	make func(index int) (*shardLink, error)
}

// list returns the links made so far.
func (l *links) list() []*shardLink {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// uplinks returns every uplink of every link, for metrics and readiness.
func (l *links) uplinks() []*zoneUplink {
	var out []*zoneUplink
	for _, sl := range l.list() {
		out = append(out, sl.ups...)
	}
	return out
}

// grow makes the links up to n, starting the new ones when Run runs.
// Making one fails only on a bad address or dial option, which New's
// links show first.
func (l *links) grow(n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.all) < n {
		sl, err := l.make(len(l.all))
		if err != nil {
			return fmt.Errorf("open a link to controller shard %d: %w", len(l.all), err)
		}
		l.all = append(l.all, sl)
		if l.ctx != nil && l.ctx.Err() == nil {
			l.start(sl)
		}
	}
	return nil
}

// start runs sl's uplinks under Run's context. l.mu must be held.
func (l *links) start(sl *shardLink) {
	for _, up := range sl.ups {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			_ = up.Run(l.ctx)
		}()
	}
}

// run starts every link made so far and every one made until ctx is done,
// and returns once they all stopped.
func (l *links) run(ctx context.Context) {
	var wg sync.WaitGroup
	l.mu.Lock()
	l.ctx, l.wg = ctx, &wg
	for _, sl := range l.all {
		l.start(sl)
	}
	l.mu.Unlock()
	<-ctx.Done()
	l.mu.Lock() // no link starts past here: grow sees ctx done
	l.mu.Unlock()
	wg.Wait()
}

// counts returns the shard counts to route under at now: those the shards
// announced in their last answers, connected or not, within countMemory;
// configured when none has.
func (l *links) counts(configured int, now time.Time) []int {
	var out []int
	for _, sl := range l.list() {
		n := int(sl.announced.Load())
		if n < 1 || now.Sub(time.Unix(0, sl.answered.Load())) > countMemory {
			continue
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		out = append(out, max(configured, 1))
	}
	slices.Sort(out)
	return out
}

// SplitZoneLoad returns, for each of n shards, the part of zl it owns under
// any of counts: an inbound entry by its service (the callee), an outbound
// entry by each of its peers (the callees). Every shard gets a zone load,
// empty if need be: it tells the shard the zone is alive, which its warm-up
// waits for. The parts share zl's entries; the caller must not modify them.
func SplitZoneLoad(zl *sluicev1.ZoneLoad, n int, counts []int) []*sluicev1.ZoneLoad {
	parts := make([]*sluicev1.ZoneLoad, n)
	for i := range parts {
		parts[i] = &sluicev1.ZoneLoad{AggregatorId: zl.GetAggregatorId(), Zone: zl.GetZone(), Interval: zl.GetInterval(), Urgent: zl.GetUrgent()}
	}
	owners := make([]bool, n)
	ownersOf := func(callee string) {
		clear(owners)
		for _, c := range counts {
			if o := shard.Owner(callee, c); o < n {
				owners[o] = true
			}
		}
	}
	for _, sl := range zl.GetServices() {
		if sl.GetDirection() != sluicev1.Direction_DIRECTION_OUTBOUND {
			ownersOf(sl.GetService())
			for i, own := range owners {
				if own {
					parts[i].Services = append(parts[i].Services, sl)
				}
			}
			continue
		}
		// Outbound: a caller's entry lists its callees, which may belong
		// to several shards; each gets the entry with its own peers.
		byShard := make([][]*sluicev1.PeerRate, n)
		for _, p := range sl.GetPeers() {
			ownersOf(p.GetPeer())
			for i, own := range owners {
				if own {
					byShard[i] = append(byShard[i], p)
				}
			}
		}
		for i, peers := range byShard {
			if len(peers) == 0 {
				continue
			}
			part := proto.CloneOf(sl)
			part.Peers = peers
			parts[i].Services = append(parts[i].Services, part)
		}
	}
	return parts
}
