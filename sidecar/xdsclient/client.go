// Package xdsclient subscribes to sluice DropPolicy resources by name over ADS.
//
// go-control-plane has no client fit for a sidecar (its SotW client is
// wildcard-only, has no delta and no reconnect, and holds a lock while blocked
// in Recv), and grpc-go's is internal. This one does the small part sluice
// needs: one resource type, named subscriptions, delta (default) or
// state-of-the-world, ACK/NACK, reconnect with backoff and failover across
// servers. It keeps the last accepted resources across stream losses: a lost
// controller is handled by the policy's TTL and fail mode, not by forgetting.
package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/liveness"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
)

// maxRecvMsgSize bounds one xDS response. gRPC's 4 MiB default is too small
// for a policy table of 100k buckets (about 6 MB).
const maxRecvMsgSize = 64 << 20

// Protocol is the xDS variant a Client speaks.
type Protocol uint8

const (
	// Delta is incremental xDS: the server sends changes and removals, and a
	// reconnecting client names the versions it holds, so it is sent only
	// what changed. The default.
	Delta Protocol = iota
	// SotW is state-of-the-world xDS. It can not signal removals of a custom
	// type, and a reconnecting client is sent all its resources again.
	SotW
)

func (p Protocol) String() string {
	switch p {
	case Delta:
		return "delta"
	case SotW:
		return "sotw"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// Handler receives the resources. Its methods are called from Run's
// goroutine, one at a time, and block the stream while they run: they should
// swap a snapshot and return.
type Handler interface {
	// Update is called with each new version of a subscribed resource; an
	// error makes the client NACK that response (error_detail carries the
	// message) and keep the last good resource.
	Update(name string, p *sluicev1.DropPolicy) error
	// Remove is called when the server removes a subscribed resource (delta
	// removed_resources).
	Remove(name string)
}

// Config configures a Client.
type Config struct {
	Servers []string // host:port of controllers or relays, tried in order, failover to the next on error
	// ShardCount is how many controller shards to assume at start when
	// Servers name "{shard}" (pkg/shard): the client subscribes at the
	// shard that owns its callee, and follows the count the shards
	// announce: a count too small costs a redirect, one too large names a
	// shard that may not exist (failed dials, then shard 0 is asked), and
	// neither costs the policy held. 0 means 1. Ignored when no server
	// names a shard.
	ShardCount  int
	NodeID      string   // core.v3 Node id, e.g. pod name
	Cluster     string   // Node cluster: the service name
	Zone        string   // Node locality zone
	Resources   []string // resource names, e.g. "callee/checkout"
	Protocol    Protocol
	DialOptions []grpc.DialOption // default: insecure credentials (plaintext, local dev); internal/identity gives mutual TLS that checks the server's SPIFFE identity
	// Reconnect backoff with jitter; defaults 100ms and 5s; reset after a
	// stream that received something.
	BackoffMin, BackoffMax time.Duration
	Logger                 *slog.Logger // nil discards
	Registerer             prometheus.Registerer
}

const (
	defaultBackoffMin = 100 * time.Millisecond
	defaultBackoffMax = 5 * time.Second
)

// Client holds one ADS stream at a time to one of its servers.
type Client struct {
	cfg      Config
	h        Handler
	log      *slog.Logger
	m        metrics
	node     *core.Node
	dialOpts []grpc.DialOption
	names    map[string]struct{} // subscribed resource names

	running   atomic.Bool
	connected atomic.Bool

	// templated says that Servers name "{shard}"; fixed at New.
	templated bool
	// Run's goroutine alone uses these. callee is the subscribed callee,
	// whose owner shard the servers are for, when Servers are templated;
	// shards is the count in force; moved is set by apply when a shard
	// said the callee is another's, and fresh makes the next subscription
	// name no versions (see followShard).
	callee string
	shards int
	moved  bool
	fresh  bool

	// mu protects held. Only Run's goroutine writes it; Policy reads it.
	// It is never held across Recv or a Handler call.
	mu   sync.Mutex
	held map[string]heldResource
}

// heldResource is the last accepted version of a resource.
type heldResource struct {
	policy *sluicev1.DropPolicy
	// version is the delta resource version (a content hash with
	// go-control-plane), sent back in initial_resource_versions on
	// reconnect. Empty under SotW, which has only per-response versions.
	version string
}

// New validates cfg, fills in its defaults and returns a Client. It does not
// connect; Run does.
func New(cfg Config, h Handler) (*Client, error) {
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = defaultBackoffMin
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = max(defaultBackoffMax, cfg.BackoffMin)
	}
	if cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// Keepalive first, so that the caller's options may override it: a frozen server is
	// found in seconds, and the client fails over (see pkg/liveness).
	cfg.DialOptions = append([]grpc.DialOption{liveness.DialOption()}, cfg.DialOptions...)
	cfg.Servers = append([]string(nil), cfg.Servers...)
	cfg.Resources = append([]string(nil), cfg.Resources...)
	if err := validate(cfg, h); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		cfg: cfg,
		h:   h,
		log: logger,
		m:   newMetrics(cfg.Registerer, logger),
		node: &core.Node{
			Id:            cfg.NodeID,
			Cluster:       cfg.Cluster,
			Locality:      &core.Locality{Zone: cfg.Zone},
			UserAgentName: "sluice-xdsclient",
		},
		dialOpts: cfg.DialOptions,
		names:    make(map[string]struct{}, len(cfg.Resources)),
		held:     make(map[string]heldResource, len(cfg.Resources)),
	}
	for _, n := range cfg.Resources {
		c.names[n] = struct{}{}
		if svc, ok := strings.CutPrefix(n, names.CalleePrefix); ok {
			c.callee = svc
		}
	}
	c.shards = max(cfg.ShardCount, 1)
	c.templated = shard.Templated(cfg.Servers)
	return c, nil
}

// validate reports every problem of cfg at once, each naming its field.
func validate(cfg Config, h Handler) error {
	var errs []error
	if h == nil {
		errs = append(errs, errors.New("handler: must not be nil"))
	}
	if len(cfg.Servers) == 0 {
		errs = append(errs, errors.New("Servers: at least one host:port is required"))
	}
	for i, s := range cfg.Servers {
		if host, port, err := net.SplitHostPort(shard.Addrs([]string{s}, 0)[0]); err != nil || host == "" || port == "" {
			errs = append(errs, fmt.Errorf("Servers[%d]: %q is not host:port", i, s))
		}
	}
	if cfg.NodeID == "" {
		errs = append(errs, errors.New("NodeID: must not be empty"))
	}
	if len(cfg.Resources) == 0 {
		errs = append(errs, errors.New("Resources: at least one resource name is required (wildcard is not supported)"))
	}
	seen := make(map[string]bool, len(cfg.Resources))
	for i, n := range cfg.Resources {
		// Named resources only: "*" (wildcard) makes the server scan
		// its whole table per update, so it is refused here.
		svc, ok := strings.CutPrefix(n, names.CalleePrefix)
		if !ok {
			svc, ok = strings.CutPrefix(n, names.CallerPrefix)
		}
		switch {
		case !ok || svc == "":
			errs = append(errs, fmt.Errorf("Resources[%d]: %q is not callee/<service> or caller/<service>", i, n))
		case seen[n]:
			errs = append(errs, fmt.Errorf("Resources[%d]: %q is listed twice", i, n))
		}
		seen[n] = true
	}
	if shard.Templated(cfg.Servers) {
		// One owner per client: the shard of its one callee. A caller's
		// outbound policy spans every shard's callees, and sharded
		// controllers do not serve it.
		callees := 0
		for i, n := range cfg.Resources {
			if strings.HasPrefix(n, names.CalleePrefix) {
				callees++
			} else {
				errs = append(errs, fmt.Errorf("Resources[%d]: %q: sharded controllers (Servers naming %s) serve callee policies only", i, n, shard.Placeholder))
			}
		}
		if callees > 1 {
			errs = append(errs, fmt.Errorf("Resources: %d callees; with sharded controllers a client subscribes to one", callees))
		}
	}
	if cfg.ShardCount < 0 || cfg.ShardCount > shard.MaxCount {
		errs = append(errs, fmt.Errorf("ShardCount: %d is not in [0, %d]", cfg.ShardCount, shard.MaxCount))
	}
	if cfg.Protocol != Delta && cfg.Protocol != SotW {
		errs = append(errs, fmt.Errorf("Protocol: %d is neither Delta (0) nor SotW (1)", cfg.Protocol))
	}
	if cfg.BackoffMin < 0 {
		errs = append(errs, fmt.Errorf("BackoffMin: %v is negative", cfg.BackoffMin))
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		errs = append(errs, fmt.Errorf("BackoffMax: %v is below BackoffMin %v", cfg.BackoffMax, cfg.BackoffMin))
	}
	if len(cfg.Servers) > 0 {
		// grpc.NewClient does not connect; it checks the options (for
		// example that transport credentials are set), so a bad option is
		// an error now rather than on every reconnect.
		if cc, err := grpc.NewClient(shard.Addrs(cfg.Servers[:1], 0)[0], cfg.DialOptions...); err != nil {
			errs = append(errs, fmt.Errorf("DialOptions: %w", err))
		} else {
			_ = cc.Close()
		}
	}
	return errors.Join(errs...)
}

// Run holds a stream to the first server that answers, reconnecting with
// backoff and failing over to the next server on error. It returns nil once
// ctx is done and everything it started has stopped, or an error at once if
// the Client is already running.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("xdsclient: Run is already running")
	}
	defer c.running.Store(false)

	backoff := c.cfg.BackoffMin
	var timer *time.Timer
	server := 0
	// probe makes the next attempt ask shard 0 instead of the owner: the
	// owner under the count in force did not answer at any of its
	// addresses, and may be gone (the shards were scaled down, and the
	// count the client holds names a shard that no longer exists). Shard
	// 0 always exists, and answers with the count, or owns the callee.
	probe := false
	// hops counts the moves made at once since a stream last stayed: shards
	// that disagree on the count (a reshard under way) could send a client
	// back and forth; past maxHops a move waits for the backoff.
	hops := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			c.m.reconnects.Inc()
		}
		servers := c.servers(probe)
		addr := servers[server%len(servers)]
		probed := probe
		probe = false
		c.moved = false
		received, err := c.runStream(ctx, addr)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case c.moved && c.templated:
			// Another shard owns the callee: go to its first address,
			// naming no versions (see followShard); at once, unless
			// shard 0 was asked because the owner did not answer, or
			// the shards sent the client around: then after the backoff,
			// which keeps growing while the owner stays away.
			c.m.moves.Inc()
			c.log.Info("xds: the callee's policy is at another shard", "server", addr,
				"shards", c.shards, "owner", shard.Owner(c.callee, c.shards), "next_server", c.servers(false)[0])
			server = 0
			if hops++; !probed && hops <= maxHops {
				continue
			}
		case received && !c.moved:
			// The server worked: retry it first, soon. If it is really
			// gone, the next attempt fails and moves on.
			hops = 0
			backoff = c.cfg.BackoffMin
		default:
			// Nothing received, or an unsharded address led to a shard
			// that does not own the callee: the next address, with
			// backoff (behind a Service another shard may answer).
			server = (server + 1) % len(servers)
			probe = c.templated && !probed && server == 0 && shard.Owner(c.callee, c.shards) != 0
		}
		next := c.servers(probe)
		wait := jitter(backoff)
		backoff = min(2*backoff, c.cfg.BackoffMax)
		c.log.Warn("xds stream ended", "server", addr, "error", err, "retry_in", wait,
			"next_server", next[server%len(next)])

		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait) // since Go 1.23 Reset needs no drain
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// servers are the addresses of the shard that owns the callee under the
// count in force, or shard 0's when probe is set (see Run), or Servers as
// they are when they name no shard.
func (c *Client) servers(probe bool) []string {
	switch {
	case !c.templated:
		return c.cfg.Servers
	case probe:
		return shard.Addrs(c.cfg.Servers, 0)
	}
	return shard.Addrs(c.cfg.Servers, shard.Owner(c.callee, c.shards))
}

// followShard takes what a shard says of itself from a policy it sent, and
// reports whether the policy is the owner's, to be applied. A count
// other than the one in force is taken (sharded controllers announce theirs
// in every policy), and when it moves the callee to another shard the stream
// ends (Run goes there). A policy from a shard that does not own the callee
// is never applied: the client keeps what it holds, and goes to the owner;
// when that is the shard it is on (the two disagree on the owner, as mixed
// releases could), it stays and logs it, its policy held until its TTL.
func (c *Client) followShard(si *sluicev1.ShardInfo) bool {
	if n := int(si.GetCount()); c.templated && n >= 1 && n <= shard.MaxCount && n != c.shards {
		before := shard.Owner(c.callee, c.shards)
		c.shards = n
		if shard.Owner(c.callee, n) != before {
			c.moved, c.fresh = true, true
		}
	}
	if si.GetOwner() {
		return true
	}
	switch {
	case !c.templated:
		// The address may lead to any shard (a Service in front of
		// them): end the stream and try again, another shard may answer.
		c.moved = true
	case shard.Owner(c.callee, c.shards) != int(si.GetIndex()):
		c.moved = true
	default:
		c.log.Warn("xds: a shard says it does not own the callee it owns by our count; staying",
			"callee", c.callee, "shard", si.GetIndex(), "shards", c.shards)
	}
	if c.moved {
		// The next owner is asked without versions: a resuming delta
		// client is told "removed" of every resource it names that a
		// server lacks, and a new owner may not have computed the callee
		// yet. Without versions it just sends it once it has it.
		c.fresh = true
	}
	return false
}

// maxHops is how many moves to another shard a client makes at once
// before it waits for its backoff between them.
const maxHops = 3

// errMoved ends a stream whose server said another shard owns the callee.
var errMoved = errors.New("the callee's policy is at another shard")

// jitter spreads reconnects of many sidecars over [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + rand.N(d/2+1)
}

// Connected reports whether a stream is open and has received at least one
// response. A delta stream that resumed with nothing to update receives
// nothing until the next change, so it reads false until then.
func (c *Client) Connected() bool { return c.connected.Load() }

// Policy returns the last accepted version of a subscribed resource. The
// policy is shared: do not modify it.
func (c *Client) Policy(name string) (*sluicev1.DropPolicy, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.held[name]
	return r.policy, ok
}

func (c *Client) setConnected(v bool) {
	if c.connected.Swap(v) == v {
		return
	}
	if v {
		c.m.connected.Set(1)
	} else {
		c.m.connected.Set(0)
	}
}

// runStream holds one stream to addr until it fails or ctx is done. It
// reports whether the stream received any response, which resets backoff.
func (c *Client) runStream(ctx context.Context, addr string) (received bool, err error) {
	// One ClientConn per attempt: closing it stops all of gRPC's goroutines
	// for it, and the next attempt may go to another server anyway.
	conn, err := grpc.NewClient(addr, c.dialOpts...)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer c.setConnected(false)

	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	s := &stream{c: c, addr: addr}
	if c.cfg.Protocol == SotW {
		return s.runSotW(ctx, ads)
	}
	return s.runDelta(ctx, ads)
}
