// Package knee is a test app whose latency rises with concurrency, and a
// deterministic model of the same knee.
//
// [Handler] is the app: a fixed number of workers (a semaphore) and a
// bounded queue in front of them. Each request holds a worker for a fixed
// service time, so the app serves at most Workers/Service requests per
// second, its knee. Below the knee a request finds a free worker and takes
// the service time; above it requests wait in the queue and latency grows
// with the queue; a request that finds the queue full is answered 503.
//
// [Sim] is the same knee as a fluid queue stepped in simulated time: what
// the app's latency, goodput and errors would be at an offered rate. The
// capacity estimator's tests run against it as their recorded curve.
//
// The package imports only the standard library, as internal/testkit does,
// so that pure packages' tests and e2e child processes may use it.
package knee

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync/atomic"
	"time"
)

// Config is the shape of a knee: Workers requests served at once, each
// for Service, and at most Queue more waiting.
type Config struct {
	Workers int
	Service time.Duration
	Queue   int
}

// Knee is the most requests per second the app serves: Workers/Service.
func (c Config) Knee() float64 {
	if c.Workers <= 0 || c.Service <= 0 {
		return 0
	}
	return float64(c.Workers) / c.Service.Seconds()
}

// Validate reports every field out of range at once.
func (c Config) Validate() error {
	var errs []error
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers: %d, want at least 1", c.Workers))
	}
	if c.Service <= 0 {
		errs = append(errs, fmt.Errorf("service: %v, want above 0", c.Service))
	}
	if c.Queue < 0 {
		errs = append(errs, fmt.Errorf("queue: %d, want 0 or more", c.Queue))
	}
	return errors.Join(errs...)
}

// Handler is the app. It starts no goroutine of its own: each request is
// served on the goroutine the server gave it, which waits for a worker and
// then for the service time, or gives up when the request's context ends.
type Handler struct {
	cfg Config
	// slots holds one token per request in the app, queued or served:
	// Workers + Queue of them; a request that finds it full is refused.
	slots chan struct{}
	// workers holds one token per request being served.
	workers chan struct{}

	served, refused, inFlight atomic.Int64
}

// New returns the app for cfg.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("knee config: %w", err)
	}
	return &Handler{
		cfg:     cfg,
		slots:   make(chan struct{}, cfg.Workers+cfg.Queue),
		workers: make(chan struct{}, cfg.Workers),
	}, nil
}

// ServeHTTP serves one request: 200 after waiting for a worker and holding
// it for the service time, 503 at once if the queue is full. A request
// whose context ends first gets no answer from the app.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case h.slots <- struct{}{}:
	default:
		h.refused.Add(1)
		http.Error(w, "queue full", http.StatusServiceUnavailable)
		return
	}
	defer func() { <-h.slots }()
	h.inFlight.Add(1)
	defer h.inFlight.Add(-1)

	ctx := r.Context()
	select {
	case h.workers <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-h.workers }()
	t := time.NewTimer(h.cfg.Service)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return
	}
	h.served.Add(1)
	w.WriteHeader(http.StatusOK)
}

// Stats is what the app has done so far.
type Stats struct {
	Served, Refused int64 // answered 200, answered 503
	InFlight        int64 // in the app now, queued or served
}

// Stats returns the app's counts.
func (h *Handler) Stats() Stats {
	return Stats{Served: h.served.Load(), Refused: h.refused.Load(), InFlight: h.inFlight.Load()}
}

// Sim is the knee as a fluid queue in simulated time: requests arrive at an
// offered rate, enter service at up to Workers/Service per second in
// arrival order, wait in a queue of at most Queue requests, and are refused
// beyond it. A request's latency is its wait in the queue plus the service
// time, counted when it enters service. It is deterministic: the same calls
// give the same ticks.
type Sim struct {
	cfg  Config
	step time.Duration // the fluid's time step

	now     time.Duration
	backlog float64 // requests waiting for a worker
	in, out float64 // requests that joined the queue, that entered service, since the start
	// arrivals[i] is (time, in) at the end of a step, a ring of the last
	// len(arrivals) steps: it turns "the request entering service now"
	// into "when it arrived".
	arrivals []mark
	next     int
	done     []served // this tick's requests entering service
}

// mark is how many requests had joined the queue by a time, in seconds.
type mark struct{ at, n float64 }

// served is a step's requests entering service and their latency in seconds.
type served struct{ latency, n float64 }

// Tick is what one call of [Sim.Run] saw, as the sidecars in front of the
// app would report it.
type Tick struct {
	Offered  float64       // requests per second sent
	Goodput  float64       // requests per second answered 200
	Refused  float64       // requests per second answered 503
	Errors   float64       // Refused/Offered, 0 without traffic
	P99      time.Duration // 99th percentile latency of the requests answered 200
	InFlight float64       // requests in the app at the end of the tick
}

// NewSim returns the fluid model of cfg, stepped every 10ms.
func NewSim(cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("knee config: %w", err)
	}
	const step = 10 * time.Millisecond
	return &Sim{cfg: cfg, step: step, arrivals: make([]mark, 60*time.Second/step)}, nil
}

// SetWorkers changes the number of workers from now on (a brownout, or its
// end); n < 1 is 1.
func (s *Sim) SetWorkers(n int) { s.cfg.Workers = max(n, 1) }

// SetService changes the service time from now on; d ≤ 0 is left as it was.
func (s *Sim) SetService(d time.Duration) {
	if d > 0 {
		s.cfg.Service = d
	}
}

// Knee is the model's knee now.
func (s *Sim) Knee() float64 { return s.cfg.Knee() }

// Run offers rate requests per second for dt and returns what the app did.
// A NaN, infinite or negative rate offers nothing.
func (s *Sim) Run(dt time.Duration, rate float64) Tick {
	if !(rate >= 0) || math.IsInf(rate, 1) {
		rate = 0
	}
	s.done = s.done[:0]
	var sent, good, refused float64
	mu := s.cfg.Knee()
	for left := dt; left > 0; left -= s.step {
		h := min(left, s.step).Seconds()
		x := rate * h
		sent += x
		over := max(0, s.backlog+x-mu*h-float64(s.cfg.Queue)) // refused: the queue is full
		joined := x - over
		b := min(max(s.backlog+joined-mu*h, 0), float64(s.cfg.Queue))
		n := s.backlog + joined - b
		refused += over
		s.backlog = b
		s.now += min(left, s.step)
		at := s.now.Seconds()
		s.in += joined
		s.out += n
		s.arrivals[s.next] = mark{at, s.in}
		s.next = (s.next + 1) % len(s.arrivals)
		if n > 0 {
			wait := max(0, at-s.arrivedAt(s.out))
			s.done = append(s.done, served{wait + s.cfg.Service.Seconds(), n})
			good += n
		}
	}
	secs := dt.Seconds()
	t := Tick{InFlight: s.backlog + min(float64(s.cfg.Workers), rate*s.cfg.Service.Seconds())}
	if secs > 0 {
		t.Offered, t.Goodput, t.Refused = sent/secs, good/secs, refused/secs
	}
	if sent > 0 {
		t.Errors = refused / sent
	}
	t.P99 = time.Duration(quantile(s.done, 0.99) * float64(time.Second))
	return t
}

// Answered calls fn with each latency the last Run's answered requests met
// (their wait in the queue plus the service time) and how many requests
// met it, fractions of requests included: the input of a latency histogram,
// as the sidecars in front of the app would record it. Refused requests are
// not in it; they are answered at once.
func (s *Sim) Answered(fn func(latency time.Duration, n float64)) {
	for _, m := range s.done {
		fn(time.Duration(m.latency*float64(time.Second)), m.n)
	}
}

// arrivedAt returns when the n-th request since the start joined the
// queue, interpolated between steps; the oldest time the ring holds if it
// is older.
func (s *Sim) arrivedAt(n float64) float64 {
	size := len(s.arrivals)
	newer := s.arrivals[(s.next-1+size)%size]
	for i := 2; i <= size; i++ {
		older := s.arrivals[(s.next-i+size)%size]
		if older.n <= n {
			if newer.n <= older.n {
				return newer.at
			}
			return older.at + (newer.at-older.at)*(n-older.n)/(newer.n-older.n)
		}
		newer = older
	}
	return newer.at
}

// quantile returns the q-quantile of latencies weighted by requests; 0 if
// there are none.
func quantile(ms []served, q float64) float64 {
	var total float64
	for _, m := range ms {
		total += m.n
	}
	if total <= 0 {
		return 0
	}
	// Insertion sort by latency: a tick holds at most a hundred steps.
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].latency < ms[j-1].latency; j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
	var acc float64
	for _, m := range ms {
		acc += m.n
		if acc >= q*total {
			return m.latency
		}
	}
	return ms[len(ms)-1].latency
}
