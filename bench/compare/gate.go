package compare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/agent/proxy"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
)

// CallerHeader names the caller on every request, for both designs.
const CallerHeader = "x-sluice-caller"

// Decider is a remote rate-limit decision: Redis's token bucket or fixed
// window.
type Decider interface {
	Decide(ctx context.Context, key string) (bool, error)
}

// Gate is the Redis design's request path: a reverse proxy that asks Redis
// about every request before forwarding it, answers 429 when Redis says no,
// and fails open (forwards the request) when Redis can not be asked. The
// proxy behind it is sluice's own (internal/agent/proxy), so that a comparison of
// the two request paths measures the decisions and nothing else.
type Gate struct {
	Decider Decider
	Service string // the key is "Service:caller"
	Next    http.Handler

	// Counters, cumulative: read them while the gate serves.
	Decisions  atomic.Int64
	Dropped    atomic.Int64
	FailedOpen atomic.Int64
}

func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	caller := r.Header.Get(CallerHeader)
	if caller == "" {
		caller = names.Unknown
	}
	g.Decisions.Add(1)
	ok, err := g.Decider.Decide(r.Context(), g.Service+":"+caller)
	switch {
	case err != nil:
		// Fail open: a limiter that is down must not take the service
		// down with it. The request goes through uncounted.
		g.FailedOpen.Add(1)
	case !ok:
		g.Dropped.Add(1)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate limited", http.StatusTooManyRequests)
		return
	}
	g.Next.ServeHTTP(w, r)
}

// GateCounts is a snapshot of a gate's counters.
type GateCounts struct{ Decisions, Dropped, FailedOpen int64 }

// Counts reads the counters.
func (g *Gate) Counts() GateCounts {
	return GateCounts{g.Decisions.Load(), g.Dropped.Load(), g.FailedOpen.Load()}
}

// Server is an HTTP server on a loopback port, owned by whoever started it.
type Server struct {
	URL  string
	srv  *http.Server
	done chan struct{}
}

// Serve starts h on a free 127.0.0.1 port with the sidecar's server
// settings (HTTP/1.1 and h2c).
func Serve(h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s := &Server{URL: "http://" + ln.Addr().String(), srv: proxy.NewServer("", h), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.srv.Serve(ln)
	}()
	return s, nil
}

// Close stops the server and waits for it.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	<-s.done
}

// App answers every request at once with a short body: the service behind
// every proxy.
func App() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok\n")
	})
}

// NewGateProxy is the Redis design's proxy in front of upstream.
func NewGateProxy(upstream string, d Decider, service string) (*Gate, *proxy.Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, nil, err
	}
	p, err := proxy.New(u, proxy.Options{})
	if err != nil {
		return nil, nil, err
	}
	return &Gate{Decider: d, Service: service, Next: p}, p, nil
}

// NewSidecar is sluice's request path as the sidecar binary builds it
// (internal/agent): the limiter's middleware in front of the same proxy,
// holding a policy that names every caller in callers with ratio 0, as a
// controller publishes for callers under their limits. Its xDS client and
// reporter are not run: they never touch a request. Close the agent when
// done.
func NewSidecar(upstream, service string, callers []string) (*agent.Agent, error) {
	cfg := agent.DefaultConfig()
	cfg.Service = service
	cfg.ID = "bench-sidecar"
	cfg.Upstream = upstream
	// The sidecar binary tracks at most agent.MaxPeersBound callers (its
	// reports must fit the aggregator's bound); beyond, callers share the
	// overflow bucket, as they would in production.
	cfg.MaxPeers = min(max(len(callers)+16, sidecar.DefaultMaxPeers), agent.MaxPeersBound)
	a, err := agent.New(cfg, nil, nil)
	if err != nil {
		return nil, err
	}
	a.Limiter().SetPolicy(OpenPolicy(service, callers))
	return a, nil
}

// OpenPolicy is a policy that lists every caller under a limit of its own
// and drops none of them.
func OpenPolicy(service string, callers []string) *sidecar.Policy {
	rules := make([]sidecar.Rule, len(callers))
	for i, c := range callers {
		rules[i] = sidecar.Rule{Peer: c, LimitRPS: 1e9, AllowedRPS: 1e9, OfferedRPS: 1}
	}
	slices.SortFunc(rules, func(a, b sidecar.Rule) int { return strings.Compare(a.Peer, b.Peer) })
	return &sidecar.Policy{Name: names.Callee(service), Service: service, Direction: sidecar.Inbound,
		Peers: rules, TTL: time.Hour, FailMode: dataplane.FailOpen, FailOpenDecay: time.Minute}
}

// HTTPOp sends GET / to base with the key as the caller, over client. A 429
// is a drop; any other status but 200 is an error.
func HTTPOp(client *http.Client, base string) Op {
	return func(ctx context.Context, key string) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
		if err != nil {
			return false, err
		}
		req.Header.Set(CallerHeader, key)
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return false, err
		case resp.StatusCode == http.StatusOK:
			return true, nil
		case resp.StatusCode == http.StatusTooManyRequests:
			return false, nil
		}
		return false, errors.New(resp.Status)
	}
}

// NewHTTPClient keeps one warm connection per concurrent caller.
func NewHTTPClient(concurrency int) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        concurrency,
			MaxIdleConnsPerHost: concurrency,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}
}
