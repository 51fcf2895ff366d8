// Package loadgen sends paced, open-loop HTTP load through sidecars and counts
// per second and per caller what was offered, admitted and dropped.
//
// Open loop: requests leave on schedule whether or not earlier ones have
// returned, as real callers' traffic does; a dropped request is not retried.
// When more requests are in flight than the generator allows, it skips the
// request and counts it, so an overloaded generator shows in its numbers
// instead of quietly sending less.
package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/pkg/health"
)

// Caller is one source of load.
type Caller struct {
	Name string
	// Rate is the offered rate in requests per second at time t since the
	// start of the run.
	Rate func(t time.Duration) float64
	// Header, when set, is added to each of the caller's requests after
	// the caller header, which a value of its own replaces: a caller that
	// names another, or carries x-forwarded-client-cert.
	Header http.Header
	// Client, when set, sends the caller's requests instead of the
	// generator's own: a caller with its own client certificate.
	Client *http.Client
	// Method and Path, when set, replace GET and Options.Path for this
	// caller: one of several procedures a caller uses.
	Method, Path string
	// Vary, when set, is called with the number of each of the caller's
	// requests (0, 1, …, in the order they are sent) and the request's
	// headers, after Header: a caller whose requests carry many values
	// (a tenant each, a client address each). It is called from many
	// goroutines at once.
	Vary func(n uint64, h http.Header)
	// Send, when set, sends the caller's n-th request to target itself,
	// instead of an HTTP request: a caller that asks another API (Envoy's
	// rate limit service, say). It returns the request's outcome, Admitted,
	// Dropped or Errored, and is called from many goroutines at once.
	Send func(ctx context.Context, target string, n uint64) Outcome
}

// Outcome is what a Caller.Send request got.
type Outcome uint8

// Outcomes.
const (
	Admitted Outcome = iota
	Dropped
	Errored
)

// Options configures a Generator.
type Options struct {
	// Targets are the sidecars' base URLs; each caller's requests go
	// round-robin over them.
	Targets []string
	Callers []Caller
	// Header carries the caller's name; default x-sluice-caller.
	Header string
	// Path is requested on every target; default "/".
	Path string
	// Tick is the pacing step; default 5ms.
	Tick time.Duration
	// MaxInFlight bounds concurrent requests; default 1024.
	MaxInFlight int
	// Duration bounds the run, and the per-second table; required.
	Duration time.Duration
	// SecondEnded, when set, is called from Run's goroutine as soon as
	// each second of the run has passed, to sample state at that moment
	// (a drop ratio, say). Run's onSecond comes later, once the second's
	// requests have returned.
	SecondEnded func(second int)
}

// Second is what one caller saw in one second, by the second requests left.
type Second struct {
	Sent     int64 // requests sent
	Admitted int64 // answered 2xx
	Dropped  int64 // answered 429
	Errors   int64 // transport errors and other statuses
	// Unavailable counts the 503s among Errors: an app that sheds load
	// itself (internal/testkit/knee) answers them.
	Unavailable int64
	Skipped     int64 // not sent: too many in flight
}

// Generator runs one load run. Stats may be read while it runs.
type Generator struct {
	opts   Options
	client *http.Client
	sem    chan struct{}
	sent   []atomic.Uint64 // by caller: requests numbered so far, for Caller.Vary
	start  time.Time

	// counts[caller][second] are updated with atomics by request goroutines.
	counts [][]counters
	wg     sync.WaitGroup
}

type counters struct {
	sent, admitted, dropped, errors, skipped, unavailable atomic.Int64
	// latency counts the admitted (2xx) requests by the time to their
	// answer, on pkg/health's scale.
	latency [health.Buckets]atomic.Int64
}

// New validates opts and builds a Generator.
func New(opts Options) (*Generator, error) {
	var errs []error
	if len(opts.Targets) == 0 {
		errs = append(errs, errors.New("loadgen: Targets: at least one is required"))
	}
	if len(opts.Callers) == 0 {
		errs = append(errs, errors.New("loadgen: Callers: at least one is required"))
	}
	if opts.Duration <= 0 {
		errs = append(errs, errors.New("loadgen: Duration: must be positive"))
	}
	for i, c := range opts.Callers {
		if c.Name == "" || c.Rate == nil {
			errs = append(errs, fmt.Errorf("loadgen: Callers[%d]: needs a Name and a Rate", i))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if opts.Header == "" {
		opts.Header = "x-sluice-caller"
	}
	if opts.Path == "" {
		opts.Path = "/"
	}
	if opts.Tick <= 0 {
		opts.Tick = 5 * time.Millisecond
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 1024
	}
	seconds := int(opts.Duration/time.Second) + 2
	g := &Generator{
		opts: opts,
		client: &http.Client{
			Timeout: 5 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        opts.MaxInFlight,
				MaxIdleConnsPerHost: opts.MaxInFlight,
				IdleConnTimeout:     30 * time.Second,
				DisableCompression:  true,
			},
		},
		sem:    make(chan struct{}, opts.MaxInFlight),
		counts: make([][]counters, len(opts.Callers)),
		sent:   make([]atomic.Uint64, len(opts.Callers)),
	}
	for i := range g.counts {
		g.counts[i] = make([]counters, seconds)
	}
	return g, nil
}

// Run sends load until Duration has passed or ctx ends, then waits for the
// requests in flight. onSecond, if set, is called after each full second with
// its index, from Run's goroutine.
func (g *Generator) Run(ctx context.Context, onSecond func(second int)) error {
	defer g.client.CloseIdleConnections()
	g.start = time.Now()
	ctx, cancel := context.WithTimeout(ctx, g.opts.Duration)
	defer cancel()
	t := time.NewTicker(g.opts.Tick)
	defer t.Stop()

	due := make([]float64, len(g.opts.Callers)) // requests owed, fractional
	last := g.start
	reported := 0
	ended := 0 // seconds passed to SecondEnded
	endSeconds := func(upTo int) {
		for ; g.opts.SecondEnded != nil && ended < upTo; ended++ {
			g.opts.SecondEnded(ended)
		}
	}
	// pace sends what the schedule owes up to now.
	pace := func(now time.Time) int {
		elapsed := now.Sub(g.start)
		if elapsed > g.opts.Duration {
			elapsed, now = g.opts.Duration, g.start.Add(g.opts.Duration)
		}
		step := now.Sub(last).Seconds()
		last = now
		sec := int(elapsed / time.Second)
		if elapsed >= g.opts.Duration {
			// The final catch-up belongs to the run's last second.
			sec = int((g.opts.Duration - 1) / time.Second)
		}
		for i, c := range g.opts.Callers {
			due[i] += c.Rate(elapsed) * step
			for ; due[i] >= 1; due[i]-- {
				g.send(ctx, i, sec)
			}
		}
		return sec
	}
	for {
		select {
		case <-ctx.Done():
			deadline := errors.Is(ctx.Err(), context.DeadlineExceeded)
			if deadline {
				// Ticks run late on a busy machine: settle the schedule's
				// last stretch so a run always offers what it promised.
				pace(g.start.Add(g.opts.Duration))
				endSeconds(int(g.opts.Duration / time.Second))
			}
			g.wg.Wait()
			if onSecond != nil {
				for ; reported < int(g.opts.Duration/time.Second); reported++ {
					onSecond(reported)
				}
			}
			if deadline {
				return nil
			}
			return ctx.Err()
		case now := <-t.C:
			sec := pace(now)
			endSeconds(sec)
			// Report a second once its requests had a moment to return.
			for onSecond != nil && reported < sec-1 {
				onSecond(reported)
				reported++
			}
		}
	}
}

func (g *Generator) send(ctx context.Context, caller, sec int) {
	c := &g.counts[caller][sec]
	select {
	case g.sem <- struct{}{}:
	default:
		c.skipped.Add(1)
		return
	}
	c.sent.Add(1)
	n := g.sent[caller].Add(1) - 1
	// Each caller balances its own requests, as the caller's own client
	// (its Envoy's round robin) does in a mesh. One turn shared by all
	// callers let their interleaving pick the targets: web and mobile at
	// 60 rps each alternated, so web reached three of the demo's six
	// sidecars until its surge reached all six, and the three it had not
	// reached had no share of it to project from.
	target := g.opts.Targets[(n+uint64(caller))%uint64(len(g.opts.Targets))]
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() { <-g.sem }()
		// The request outlives the run's deadline: it was sent in time.
		cl := &g.opts.Callers[caller]
		if cl.Send != nil {
			switch cl.Send(context.WithoutCancel(ctx), target, n) {
			case Admitted:
				c.admitted.Add(1)
			case Dropped:
				c.dropped.Add(1)
			default:
				c.errors.Add(1)
			}
			return
		}
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx),
			cmp.Or(cl.Method, http.MethodGet), target+cmp.Or(cl.Path, g.opts.Path), nil)
		if err != nil {
			c.errors.Add(1)
			return
		}
		req.Header.Set(g.opts.Header, cl.Name)
		for k, v := range cl.Header {
			req.Header[http.CanonicalHeaderKey(k)] = v
		}
		if cl.Vary != nil {
			cl.Vary(n, req.Header)
		}
		client := g.client
		if cl.Client != nil {
			client = cl.Client
		}
		began := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			c.errors.Add(1)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			c.admitted.Add(1)
			c.latency[health.Bucket(time.Since(began))].Add(1)
		case resp.StatusCode == http.StatusServiceUnavailable:
			c.errors.Add(1)
			c.unavailable.Add(1)
		case resp.StatusCode == http.StatusTooManyRequests:
			c.dropped.Add(1)
		default:
			c.errors.Add(1)
		}
	}()
}

// Second returns what caller saw in second sec (0-based), by name.
func (g *Generator) Second(caller string, sec int) Second {
	for i, c := range g.opts.Callers {
		if c.Name == caller && sec >= 0 && sec < len(g.counts[i]) {
			k := &g.counts[i][sec]
			return Second{Sent: k.sent.Load(), Admitted: k.admitted.Load(), Dropped: k.dropped.Load(), Errors: k.errors.Load(), Skipped: k.skipped.Load(),
				Unavailable: k.unavailable.Load()}
		}
	}
	return Second{}
}

// Sum adds up seconds [from, to) of caller.
func (g *Generator) Sum(caller string, from, to int) Second {
	var s Second
	for sec := from; sec < to; sec++ {
		s.Add(g.Second(caller, sec))
	}
	return s
}

// Add adds x's counts to s's.
func (s *Second) Add(x Second) {
	s.Sent += x.Sent
	s.Admitted += x.Admitted
	s.Dropped += x.Dropped
	s.Errors += x.Errors
	s.Skipped += x.Skipped
	s.Unavailable += x.Unavailable
}

// Latency counts caller's admitted (2xx) requests sent in seconds [from,
// to) by the time to their answer, on pkg/health's scale (health.Quantile
// reads a percentile off it).
func (g *Generator) Latency(caller string, from, to int) [health.Buckets]int64 {
	var out [health.Buckets]int64
	for i, c := range g.opts.Callers {
		if c.Name != caller {
			continue
		}
		for sec := max(from, 0); sec < to && sec < len(g.counts[i]); sec++ {
			for b := range out {
				out[b] += g.counts[i][sec].latency[b].Load()
			}
		}
	}
	return out
}

// Elapsed is the time since Run started.
func (g *Generator) Elapsed() time.Duration { return time.Since(g.start) }

// OffSchedule lists the seconds in [from, to) in which some caller sent
// more than 10 % and 5 requests off what its Rate asked for: a machine too
// busy to run the generator on time, which then catches up in a burst. A
// rate measured over such seconds measured the machine, not what it was
// sent to; the simulator's live mode judges its runs the same way.
func (g *Generator) OffSchedule(from, to int) []int {
	var late []int
	for sec := max(from, 0); sec < to && sec < len(g.counts[0]); sec++ {
		for i, c := range g.opts.Callers {
			if OffRate(float64(g.counts[i][sec].sent.Load()), nominal(c.Rate, sec)) {
				late = append(late, sec)
				break
			}
		}
	}
	return late
}

// OffRate reports whether sent requests in a second are off the want its
// rate asked for by more than 10 % and 5 requests: the one rule by which a
// load run, here and in the simulator's live mode, is said to be off its
// schedule.
func OffRate(sent, want float64) bool {
	d := math.Abs(sent - want)
	return d > 5 && d > 0.1*want
}

// nominal is the mean of rate over second sec, from 100 samples.
func nominal(rate func(time.Duration) float64, sec int) float64 {
	const n = 100
	sum := 0.0
	for k := range n {
		sum += rate(time.Duration(sec)*time.Second + time.Duration(k)*time.Second/n)
	}
	return sum / n
}
