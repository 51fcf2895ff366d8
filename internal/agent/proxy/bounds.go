package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// What one caller, or many, may hold of the app through the proxy. A request that would go
// past a bound is answered by the proxy at once; nothing queues.
//
// The defaults follow Envoy's circuit breakers (max_requests and max_connections, 1024 each):
// a real service rarely comes near them, and an attacker holding requests open stops there.
const (
	// DefaultBodyTimeout is the time any request body may take to arrive, whatever its size,
	// from the moment its headers were read; a larger body earns more at DefaultMinBodyRate.
	// An attacker trickling a body a byte at a time holds its request (and an upstream
	// connection) about 30s.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultMinBodyRate is the least rate, in bytes per second, at which a body past the body
	// timeout must have come: Kestrel's MinRequestBodyDataRate. A body of n bytes may take
	// BodyTimeout + n/rate, so a 100 MB upload at any rate above 240 B/s passes (in about
	// 5 days at worst), while 1 byte every 5s is cut after about 30s.
	DefaultMinBodyRate = 240
	// DefaultMaxRequests bounds the requests in flight to the app (Envoy's max_requests).
	DefaultMaxRequests = 1024
	// DefaultMaxConns bounds the connections open to the app (Envoy's max_connections).
	DefaultMaxConns = 1024
	// DefaultGRPCMaxMessage bounds one gRPC message through the forwarder, which holds each
	// whole while it carries it: grpc-go's own default for what a server receives, so an app
	// that kept it refuses nothing more than before.
	DefaultGRPCMaxMessage = 4 << 20
)

// Reasons the proxy answers a request itself, the label values of
// sluice_sidecar_proxy_refused_total.
const (
	ReasonMaxRequests = "max_requests" // in flight to the app: MaxRequests
	ReasonMaxConns    = "max_connections"
	ReasonBodyTimeout = "body_timeout" // the body slower than BodyTimeout and MinBodyRate allow
)

// errMaxConns is the dial error of a connection over MaxConns.
var errMaxConns = errors.New("sluice: connections to the app at their bound")

// Messages of the proxy's own refusals; printable ASCII without '%', as gRPC messages.
const (
	msgMaxRequests = "sluice: too many requests in flight to the app"
	msgMaxConns    = "sluice: too many connections to the app"
)

// bounds holds the proxy's counts of what is open toward the app, and their metrics. Its
// methods are safe for concurrent use.
type bounds struct {
	bodyTimeout time.Duration
	minBodyRate int64 // bytes per second; 0 for none, BodyTimeout is then a total
	maxRequests int64
	maxConns    int64

	inFlight atomic.Int64 // requests between admission and the end of ServeHTTP
	conns    atomic.Int64 // app connections dialled (or being dialled) and not closed

	// Resolved once: nothing per request looks up a label.
	refusedMaxRequests, refusedMaxConns, bodyTimeouts prometheus.Counter
	collectors                                        []prometheus.Collector
}

func newBounds(o Options) *bounds {
	b := &bounds{bodyTimeout: o.BodyTimeout, maxRequests: int64(o.MaxRequests), maxConns: int64(o.MaxConns)}
	if o.MinBodyRate > 0 {
		b.minBodyRate = int64(o.MinBodyRate)
	}
	const ns, sub = "sluice", "sidecar_proxy"
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "refused_total",
		Help: "Requests the proxy answered itself instead of the app, by reason: max_requests (503, the " +
			"requests in flight to the app at their bound), max_connections (503, the connections to the app " +
			"at their bound), body_timeout (408, the request body came slower than the body timeout and " +
			"minimum body rate allow).",
	}, []string{"reason"})
	b.refusedMaxRequests = refused.WithLabelValues(ReasonMaxRequests)
	b.refusedMaxConns = refused.WithLabelValues(ReasonMaxConns)
	b.bodyTimeouts = refused.WithLabelValues(ReasonBodyTimeout)
	b.collectors = []prometheus.Collector{
		refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_in_flight",
			Help: "Requests being forwarded to the app; bounded by --proxy-max-requests.",
		}, func() float64 { return float64(b.inFlight.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "upstream_connections",
			Help: "Connections open to the app; bounded by --proxy-max-connections.",
		}, func() float64 { return float64(b.conns.Load()) }),
	}
	return b
}

// admit takes a slot for a request in flight, or reports that there is none. A caller that
// got true calls done once.
func (b *bounds) admit() bool {
	if b.inFlight.Add(1) > b.maxRequests {
		b.inFlight.Add(-1)
		b.refusedMaxRequests.Inc()
		return false
	}
	return true
}

func (b *bounds) done() { b.inFlight.Add(-1) }

// dialer wraps dial so that at most maxConns connections to the app are open at once. Over
// the bound it fails at once with errMaxConns (Transport.MaxConnsPerHost would queue the
// request instead, holding the caller and its connection).
//
// In-flight requests bound the connections already (an HTTP/1.1 request holds one, HTTP/2
// multiplexes), and idle ones are reused before a new one is dialled; this is the hard bound
// behind that, for dials racing a connection's release.
func (b *bounds) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if b.conns.Add(1) > b.maxConns {
			b.conns.Add(-1)
			return nil, errMaxConns
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			b.conns.Add(-1)
			return nil, err
		}
		return &countedConn{Conn: c, n: &b.conns}, nil
	}
}

// countedConn gives back its slot in bounds.conns when first closed.
type countedConn struct {
	net.Conn
	n    *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.n.Add(-1) })
	return err
}

// errBodyTimeout is the read error of a body that came slower than the body timeout and the
// minimum rate allow.
var errBodyTimeout = fmt.Errorf("sluice: request body not read within the body timeout: %w", os.ErrDeadlineExceeded)

// deadlineStep is the least move of a body's deadline worth setting. Setting one costs a
// timer update (on HTTP/2, a message to the connection's goroutine); a body read in one go,
// as most are, earns less than this and sets none beyond the first. A body that earned less
// than deadlineStep since the deadline last moved is cut at most that much early.
const deadlineStep = 100 * time.Millisecond

// limitBody bounds the time to read r's body, if it has one, and returns the request to
// forward in r's place: a body of n bytes may take the body timeout, counted from now, plus
// n divided by the minimum rate (Kestrel's MinRequestBodyDataRate, with the body timeout as
// its grace period). The deadline moves on as the body comes, so a large upload at a steady
// rate above the minimum passes however long it takes, while a trickle at a rate r below it
// is cut after timeout/(1 - r/rate): about the body timeout for a trickle well below. Without
// a rate the body timeout is a total.
//
// gRPC over HTTP/2 is exempt: its request body is the client's half of a stream, which may
// rightly stay open and silent for hours (a bidirectional watch); those calls are bounded
// by MaxRequests only.
//
// The deadline is the server's read deadline (on the connection for HTTP/1.1, on the stream
// for HTTP/2), so a body that stalls completely is cut too: a read blocked on it fails when
// the deadline passes. Then the Transport stops sending the request and closes its connection
// to the app, and handleError answers 408: it finds the body in the request's context, since
// the error it is given may be the request's cancellation (the HTTP/1.1 server cancels a
// request whose connection failed a read) rather than the body's.
func (b *bounds) limitBody(w http.ResponseWriter, r *http.Request) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		return r
	}
	if r.ProtoMajor == 2 && isGRPC(r.Header.Get("Content-Type")) {
		return r
	}
	rc := http.NewResponseController(w)
	start := time.Now().Add(b.bodyTimeout)
	if err := rc.SetReadDeadline(start); err != nil {
		// A ResponseWriter without deadlines (a wrapper that hides them): unbounded, as
		// before. The servers of this package always support them.
		return r
	}
	body := &deadlineBody{ReadCloser: r.Body, rc: rc, start: start, rate: b.minBodyRate}
	r = r.WithContext(context.WithValue(r.Context(), deadlineBodyKey{}, body))
	r.Body = body
	return r
}

// bodyTimedOut reports whether r's body was cut by the body timeout.
func bodyTimedOut(r *http.Request) bool {
	d, _ := r.Context().Value(deadlineBodyKey{}).(*deadlineBody)
	return d != nil && d.expired.Load()
}

type deadlineBodyKey struct{}

// deadlineBody is a request body read under a deadline. Read is called by one goroutine at a
// time (the Transport's writer); expired may be read by any.
type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time // the deadline of an empty body: the end of the headers plus the body timeout
	rate  int64     // the minimum rate, bytes per second; 0 for none

	// Read's alone.
	read   int64         // bytes read so far
	earned time.Duration // what the deadline set last adds to start
	ended  bool          // Read saw the end of the body or an error
	eof    bool          // the end: io.EOF

	expired atomic.Bool // a Read failed because the deadline passed
}

func (d *deadlineBody) Read(p []byte) (int, error) {
	if d.eof {
		// The end stays the end. The Transport reads once more after the body's
		// length to find no more, and under load the body was closed by then: the
		// server's body answered "invalid Read on closed Body", the Transport took
		// the request's write as failed and closed its connection to the app, which
		// cut a response still streaming (TestBodyTimeoutEndsWithTheBody, 1 in 25
		// runs beside three CPU hogs).
		return 0, io.EOF
	}
	n, err := d.ReadCloser.Read(p)
	if err == nil {
		if n > 0 && d.rate > 0 {
			d.extend(n)
		}
		return n, err
	}
	if d.ended {
		return n, err
	}
	d.ended = true
	if err == io.EOF {
		d.eof = true
		// The body is complete: lift the deadline, or the HTTP/1.1 server's background
		// read (which watches for the caller going away while the response streams) would
		// hit it and cancel a response that may rightly take longer.
		_ = d.rc.SetReadDeadline(time.Time{})
		return n, err
	}
	// Otherwise the deadline stays: further reads fail at once, and the server closes the
	// connection instead of draining the rest of a body it would wait for again.
	if errors.Is(err, os.ErrDeadlineExceeded) {
		d.expired.Store(true)
		return n, errBodyTimeout
	}
	return n, err
}

// extend counts n more bytes read and moves the deadline to start plus what they earned at
// the minimum rate, if that moves it by more than deadlineStep.
func (d *deadlineBody) extend(n int) {
	d.read += int64(n)
	earned := rateTime(d.read, d.rate)
	if earned-d.earned <= deadlineStep {
		return
	}
	d.earned = earned
	_ = d.rc.SetReadDeadline(d.start.Add(earned))
}

// maxEarned caps what a body earns: about 146 years, far enough to be no deadline, near
// enough that adding it to a time does not overflow.
const maxEarned = time.Duration(1 << 62)

// rateTime is the time n bytes take at rate bytes per second, at most maxEarned.
func rateTime(n, rate int64) time.Duration {
	t := float64(n) / float64(rate) * float64(time.Second)
	if t >= float64(maxEarned) {
		return maxEarned
	}
	return time.Duration(t)
}
