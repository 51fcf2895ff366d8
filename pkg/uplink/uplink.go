// Package uplink keeps one long-lived gRPC stream open to one of several
// servers and sends it the latest of a series of messages.
//
// It serves the tiers of sluice that send complete pictures upwards (a
// sidecar's load report, an aggregator's zone load): each message replaces
// the previous one, so a message that could not be sent yet is worth nothing
// once a newer one exists. An Uplink therefore holds at most one pending
// message, Offer never blocks, and a server that is down, slow or refuses the
// stream costs the caller nothing but the messages it supersedes.
package uplink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/pkg/liveness"
)

// Defaults of Config.
const (
	DefaultBackoffMin  = 100 * time.Millisecond
	DefaultBackoffMax  = 5 * time.Second
	DefaultOpenTimeout = 5 * time.Second
)

// Config configures an Uplink. Addrs and Open are required.
type Config[Req, Resp any] struct {
	// Addrs are the servers, tried in order. After any failure (the
	// stream could not be opened, or broke, or went quiet) the Uplink moves
	// on to the next address, wrapping around after the last.
	Addrs []string
	// DialOptions for every connection; default plaintext (insecure
	// transport credentials). When set, they must include credentials.
	DialOptions []grpc.DialOption
	// Open opens the stream on a fresh connection, e.g.
	// sluicev1.NewLoadReportServiceClient(cc).StreamLoadReports(ctx).
	// ctx ends the stream when it is cancelled.
	Open func(ctx context.Context, cc grpc.ClientConnInterface) (grpc.BidiStreamingClient[Req, Resp], error)
	// OnResponse, if set, is called with every response, from the
	// receiving goroutine, one call at a time. It must not block for long:
	// the next response is not read until it returns.
	OnResponse func(*Resp)
	// BackoffMin and BackoffMax bound the jittered exponential wait
	// between failed attempts; defaults DefaultBackoffMin and
	// DefaultBackoffMax. The wait starts again from BackoffMin after a
	// healthy stream (one that delivered a response).
	BackoffMin, BackoffMax time.Duration
	// OpenTimeout bounds how long opening a stream may take, default
	// DefaultOpenTimeout. It catches a server that accepts the TCP
	// connection and then never completes the HTTP/2 handshake.
	OpenTimeout time.Duration
	// ResponseTimeout, if positive, declares a stream dead when a sent
	// message has not been answered by any response for that long. It
	// catches a server that is wedged but keeps its connection open, for
	// protocols where the server answers every message. Zero disables it.
	ResponseTimeout time.Duration
	// Logger for connection changes; never called per message. Default
	// discards.
	Logger *slog.Logger
}

// Stats are plain cumulative counters, for callers to export as metrics.
type Stats struct {
	Sent       uint64 // messages a stream's Send accepted
	Superseded uint64 // pending messages replaced by a newer Offer before they were sent
	Failovers  uint64 // attempts that failed and moved on to the next address
	Streams    uint64 // streams opened
	Responses  uint64 // responses received
}

// Uplink sends the latest offered message over one stream to one of
// Config.Addrs. Offer, Connected and Stats are safe for concurrent use, also
// with Run; Run may run once at a time.
type Uplink[Req, Resp any] struct {
	cfg Config[Req, Resp]
	log *slog.Logger

	mu      sync.Mutex // protects pending
	pending *Req       // the next message to send; nil when there is none

	// wake holds a token when pending may have been set since the sender
	// last looked. Capacity 1, so Offer never blocks on it.
	wake chan struct{}

	running   atomic.Bool
	connected atomic.Bool

	sent, superseded, failovers, streams, responses atomic.Uint64
}

// New checks cfg and returns an Uplink that sends nothing until Run.
func New[Req, Resp any](cfg Config[Req, Resp]) (*Uplink[Req, Resp], error) {
	var errs []error
	if len(cfg.Addrs) == 0 {
		errs = append(errs, errors.New("Addrs: at least one address is required"))
	}
	for i, a := range cfg.Addrs {
		if a == "" {
			errs = append(errs, fmt.Errorf("Addrs[%d]: empty address", i))
		}
	}
	if cfg.Open == nil {
		errs = append(errs, errors.New("Open: required"))
	}
	if cfg.BackoffMin < 0 || cfg.BackoffMax < 0 {
		errs = append(errs, fmt.Errorf("BackoffMin, BackoffMax: must not be negative, got %v, %v", cfg.BackoffMin, cfg.BackoffMax))
	}
	if cfg.OpenTimeout < 0 || cfg.ResponseTimeout < 0 {
		errs = append(errs, fmt.Errorf("OpenTimeout, ResponseTimeout: must not be negative, got %v, %v", cfg.OpenTimeout, cfg.ResponseTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = cfg.BackoffMin
	}
	if cfg.OpenTimeout == 0 {
		cfg.OpenTimeout = DefaultOpenTimeout
	}
	if len(cfg.DialOptions) == 0 {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// Keepalive first, so that the caller's options may override it: a frozen server is
	// found in seconds, and the Uplink fails over (see pkg/liveness).
	cfg.DialOptions = append([]grpc.DialOption{liveness.DialOption()}, cfg.DialOptions...)
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Uplink[Req, Resp]{cfg: cfg, log: log, wake: make(chan struct{}, 1)}, nil
}

// Offer makes m the next message to send, replacing (and counting as
// superseded) a message offered earlier that was not sent yet. It never
// blocks, whether or not Run is running or the server reads. The Uplink
// keeps m until it is sent or superseded: the caller must not modify it
// afterwards.
//
// A message that was sent but not answered when its stream died is sent
// again on the next stream, unless a newer one was offered meanwhile: the
// latest message reaches a server at least once, and possibly twice, which
// is harmless when each message replaces the previous one.
func (u *Uplink[Req, Resp]) Offer(m *Req) {
	if m == nil {
		return
	}
	u.mu.Lock()
	if u.pending != nil {
		u.superseded.Add(1)
	}
	u.pending = m
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default: // a token is already there; the sender will see m
	}
}

// take returns and clears the pending message.
func (u *Uplink[Req, Resp]) take() *Req {
	u.mu.Lock()
	defer u.mu.Unlock()
	m := u.pending
	u.pending = nil
	return m
}

// putBack makes m pending again after a failed Send, unless a newer message
// was offered meanwhile. The message may or may not have reached the server;
// sending it again is harmless because every message replaces the previous
// one.
func (u *Uplink[Req, Resp]) putBack(m *Req) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.pending == nil {
		u.pending = m
	}
}

// Connected reports whether the current stream has proven itself: it is open
// and at least one response arrived on it. Use it for readiness.
func (u *Uplink[Req, Resp]) Connected() bool { return u.connected.Load() }

// Stats returns the counters so far. The fields are read one by one, so
// they need not be mutually consistent to the last message.
func (u *Uplink[Req, Resp]) Stats() Stats {
	return Stats{
		Sent:       u.sent.Load(),
		Superseded: u.superseded.Load(),
		Failovers:  u.failovers.Load(),
		Streams:    u.streams.Load(),
		Responses:  u.responses.Load(),
	}
}

// Run keeps a stream open until ctx is cancelled, failing over between the
// addresses, and sends every offered message that is not superseded first.
// It returns nil once ctx is cancelled and every goroutine it started has
// stopped, or an error at once if Run is already running.
func (u *Uplink[Req, Resp]) Run(ctx context.Context) error {
	if !u.running.CompareAndSwap(false, true) {
		return errors.New("uplink: Run is already running")
	}
	defer u.running.Store(false)

	attempt := 0 // failed attempts since the last healthy stream
	for i := 0; ; i = (i + 1) % len(u.cfg.Addrs) {
		addr := u.cfg.Addrs[i]
		healthy, err := u.session(ctx, addr)
		if ctx.Err() != nil {
			return nil
		}
		u.failovers.Add(1)
		if healthy {
			// The server worked until now: back off from the start again.
			// Even so, wait the shortest backoff, so that a server that
			// answers once and then drops every stream can not make a
			// hot loop.
			attempt = 0
			u.log.Warn("uplink stream ended, failing over", "addr", addr, "error", err)
		} else {
			u.log.Warn("uplink attempt failed, failing over", "addr", addr, "error", err)
		}
		if !sleep(ctx, u.backoff(attempt)) {
			return nil
		}
		attempt++
	}
}

// backoff returns the wait after the given number of consecutive failed
// attempts: exponential from BackoffMin, capped at BackoffMax, with "equal
// jitter" (half fixed, half random) so that many clients that lost the same
// server do not return to the next one in lockstep.
func (u *Uplink[Req, Resp]) backoff(attempt int) time.Duration {
	d := u.cfg.BackoffMin
	for range min(attempt, 32) {
		d *= 2
		if d >= u.cfg.BackoffMax {
			break
		}
	}
	d = min(d, u.cfg.BackoffMax)
	half := d / 2
	return half + rand.N(half+1)
}

// sleep waits for d or until ctx is done; it reports whether the wait ended
// because d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

var (
	errOpenTimeout     = errors.New("opening the stream timed out")
	errResponseTimeout = errors.New("no response to a sent message in time")
)

// session runs one stream to addr until it fails or ctx is cancelled. It
// reports whether the stream was healthy (delivered a response) and why it
// ended. It returns only after the goroutines it started have stopped.
func (u *Uplink[Req, Resp]) session(ctx context.Context, addr string) (healthy bool, err error) {
	cc, err := grpc.NewClient(addr, u.cfg.DialOptions...)
	if err != nil {
		return false, fmt.Errorf("create client for %s: %w", addr, err)
	}
	defer cc.Close()

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	stream, err := u.open(sctx, cancel, cc)
	if err != nil {
		return false, fmt.Errorf("open stream to %s: %w", addr, err)
	}
	u.streams.Add(1)
	// The stream is open, but gRPC does not wait for the server to accept
	// it: a server without the service, or whose handler fails at once,
	// shows only in Recv. So the stream proves itself with its first
	// response, and until then counts as a failed attempt.

	defer u.connected.Store(false)
	var (
		wg          sync.WaitGroup
		acks        acks
		gotResponse atomic.Bool
		last        *Req // the last message handed to Send; the sender's, read after wg.Wait
	)
	wg.Go(func() { u.receive(stream, cancel, &acks, &gotResponse, addr) })
	wg.Go(func() { last = u.send(sctx, stream, cancel, &acks) })
	if rt := u.cfg.ResponseTimeout; rt > 0 {
		wg.Go(func() { watchdog(sctx, cancel, &acks, rt) })
	}

	<-sctx.Done()
	wg.Wait()
	if last != nil && acks.unanswered() {
		// The last message may have died with the stream (a server that
		// failed the stream at once, or went quiet): the next stream
		// starts with it unless a newer one is waiting.
		u.putBack(last)
	}
	return gotResponse.Load(), context.Cause(sctx)
}

// open opens the stream on cc; cancel ends sctx, the stream's context.
//
// NewClient connects lazily, so Open is where a dead address shows:
// gRPC fails the call once the connection attempt fails. A server that
// accepts TCP but never speaks HTTP/2 would keep it waiting for the
// connect timeout (20s), hence the shorter guard.
func (u *Uplink[Req, Resp]) open(sctx context.Context, cancel context.CancelCauseFunc, cc *grpc.ClientConn) (grpc.BidiStreamingClient[Req, Resp], error) {
	guard := time.AfterFunc(u.cfg.OpenTimeout, func() { cancel(errOpenTimeout) })
	stream, err := u.cfg.Open(sctx, cc)
	if !guard.Stop() {
		err = errOpenTimeout
	}
	return stream, err
}

// receive is a session's receiving goroutine: it reads responses until
// the stream fails, and then cancels the session.
func (u *Uplink[Req, Resp]) receive(stream grpc.BidiStreamingClient[Req, Resp], cancel context.CancelCauseFunc, acks *acks, gotResponse *atomic.Bool, addr string) {
	for {
		resp, err := stream.Recv()
		if err != nil {
			cancel(fmt.Errorf("receive: %w", err))
			return
		}
		u.responses.Add(1)
		if gotResponse.CompareAndSwap(false, true) {
			u.connected.Store(true)
			u.log.Info("uplink connected", "addr", addr)
		}
		acks.answered(time.Now())
		if u.cfg.OnResponse != nil {
			u.cfg.OnResponse(resp)
		}
	}
}

// send is a session's sending goroutine: it sends every pending message
// until sctx ends, or until Send fails and it cancels the session. It
// returns the last message it handed to Send, or nil.
func (u *Uplink[Req, Resp]) send(sctx context.Context, stream grpc.BidiStreamingClient[Req, Resp], cancel context.CancelCauseFunc, acks *acks) (last *Req) {
	for {
		if m := u.take(); m != nil {
			acks.sending(time.Now())
			last = m
			// Send may block on flow control while the server does
			// not read; Offer is unaffected, and cancelling sctx
			// unblocks it.
			if err := stream.Send(m); err != nil {
				cancel(fmt.Errorf("send: %w", err)) // m is put back by session
				return last
			}
			u.sent.Add(1)
			continue // look again before waiting: Offer may have raced
		}
		select {
		case <-sctx.Done():
			return last
		case <-u.wake:
		}
	}
}

// watchdog is a session's ResponseTimeout goroutine: it cancels the
// session once a sent message has gone unanswered for rt.
func watchdog(sctx context.Context, cancel context.CancelCauseFunc, acks *acks, rt time.Duration) {
	t := time.NewTicker(max(rt/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-sctx.Done():
			return
		case now := <-t.C:
			if acks.overdue(now, rt) {
				cancel(errResponseTimeout)
				return
			}
		}
	}
}

// acks tracks whether sent messages are being answered, for
// ResponseTimeout. Safe for concurrent use.
type acks struct {
	mu          sync.Mutex // protects the fields below
	outstanding int        // messages sent and not yet answered
	since       time.Time  // when the oldest unanswered message was sent, or the last answer came
}

func (a *acks) sending(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.outstanding == 0 {
		a.since = now
	}
	a.outstanding++
}

func (a *acks) answered(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// A response answers the oldest message; the next one is measured
	// from now, which errs on the lenient side. Unsolicited responses
	// (more answers than messages) leave nothing outstanding.
	a.outstanding = max(a.outstanding-1, 0)
	a.since = now
}

func (a *acks) unanswered() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.outstanding > 0
}

func (a *acks) overdue(now time.Time, timeout time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.outstanding > 0 && now.Sub(a.since) > timeout
}
