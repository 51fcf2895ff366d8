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
	// DefaultBodyTimeout bounds the time to read a request's body, from the moment its headers
	// were read. 30s lets a 30 MB upload through at 1 MB/s; an attacker trickling a body a
	// byte at a time holds its request (and an upstream connection) 30s at most.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultMaxRequests bounds the requests in flight to the app (Envoy's max_requests).
	DefaultMaxRequests = 1024
	// DefaultMaxConns bounds the connections open to the app (Envoy's max_connections).
	DefaultMaxConns = 1024
)

// Reasons the proxy answers a request itself, the label values of
// sluice_sidecar_proxy_refused_total.
const (
	ReasonMaxRequests = "max_requests" // in flight to the app: MaxRequests
	ReasonMaxConns    = "max_connections"
	ReasonBodyTimeout = "body_timeout"
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
	const ns, sub = "sluice", "sidecar_proxy"
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "refused_total",
		Help: "Requests the proxy answered itself instead of the app, by reason: max_requests (503, the " +
			"requests in flight to the app at their bound), max_connections (503, the connections to the app " +
			"at their bound), body_timeout (408, the request body took longer than the body timeout).",
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

// errBodyTimeout is the read error of a body that took longer than the body timeout.
var errBodyTimeout = fmt.Errorf("sluice: request body not read within the body timeout: %w", os.ErrDeadlineExceeded)

// limitBody bounds the time to read r's body, if it has one, to the body timeout counted from
// now, and returns the request to forward in r's place. gRPC over HTTP/2 is exempt: its request body is the client's half of
// a stream, which may rightly stay open and silent for hours (a bidirectional watch); those
// calls are bounded by MaxRequests only.
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
	if err := rc.SetReadDeadline(time.Now().Add(b.bodyTimeout)); err != nil {
		// A ResponseWriter without deadlines (a wrapper that hides them): unbounded, as
		// before. The servers of this package always support them.
		return r
	}
	body := &deadlineBody{ReadCloser: r.Body, rc: rc}
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
	rc      *http.ResponseController
	ended   bool        // Read saw the end of the body or an error; Read's alone
	expired atomic.Bool // a Read failed because the deadline passed
}

func (d *deadlineBody) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if err == nil || d.ended {
		return n, err
	}
	d.ended = true
	if err == io.EOF {
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
