package sidecar

import (
	"bufio"
	"net"
	"net/http"
	"net/textproto"
	"sync"
	"time"

	"github.com/sluicehq/sluice/pkg/health"
)

// What the callee does with the requests a sidecar lets through (issue
// #18): each admitted request's latency and outcome, per procedure, in a
// health.Recorder the table holds by procedure index, so that the request
// path finds it without a lookup. Recorders live in the ServiceLimiter by
// procedure name across policies, as the leaves' counters do, so that a
// policy swap loses no count.

// HealthCounts is what the callee did with one procedure's admitted
// requests since the last TakeHealth.
type HealthCounts struct {
	Procedure string // "" for a callee that declares none
	health.Counts
}

// recorderLocked returns the recorder of procedure, made on first use;
// s.mu held.
func (s *ServiceLimiter) recorderLocked(procedure string) *health.Recorder {
	if r := s.recorders[procedure]; r != nil {
		return r
	}
	if s.recorders == nil {
		s.recorders = map[string]*health.Recorder{}
	}
	r := &health.Recorder{}
	s.recorders[procedure] = r
	return r
}

// healthRecorders returns the recorders of procs' procedures, by index;
// s.mu held.
func (s *ServiceLimiter) healthRecorders(procs *procedures) []*health.Recorder {
	rs := make([]*health.Recorder, len(procs.names))
	for i, name := range procs.names {
		rs[i] = s.recorderLocked(name)
	}
	return rs
}

// TakeHealth appends what the callee did with each procedure's requests
// since the last call, one entry per procedure that answered a request
// or has one in flight, to dst, and returns it. A procedure the policy no
// longer declares is reported while it has answers to report and is
// forgotten after. One reader per service: its report Window.
func (l *Limiter) TakeHealth(service string, dst []HealthCounts) []HealthCounts {
	s := l.lookup(service)
	if s == nil {
		return dst
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	current := s.table.Load().procs
	for name, r := range s.recorders {
		var c health.Counts
		r.Take(&c)
		if c.Answered() > 0 || c.InFlight > 0 {
			dst = append(dst, HealthCounts{Procedure: name, Counts: c})
			continue
		}
		if _, ok := current.index(name); !ok {
			delete(s.recorders, name)
		}
	}
	return dst
}

// upstreamWriter is the response writer the middleware hands the proxy,
// to learn how the callee answered: the status it wrote, and, for a gRPC
// call, the grpc-status of its trailers (or of a trailers-only answer),
// read from the header map once the proxy returns. Pooled: the request
// path allocates nothing.
type upstreamWriter struct {
	http.ResponseWriter
	status   int
	hijacked bool // the connection left HTTP (an upgrade): not an answer to count
}

var upstreamWriters = sync.Pool{New: func() any { return new(upstreamWriter) }}

func (w *upstreamWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *upstreamWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// FlushError flushes what the handler wrote, as http.ResponseController
// does through Unwrap; Flush is for handlers that assert http.Flusher, as
// streaming ones often do, and would otherwise find the wrapper has none.
// A flush before WriteHeader sends 200.
func (w *upstreamWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *upstreamWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController (which the proxy flushes and
// hijacks through) reach the server's writer.
func (w *upstreamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack keeps what handlers that assert http.Hijacker on their writer
// found before the middleware wrapped it (an upgrade to websockets, say):
// an app behind the library's middleware, not only the sidecar's proxy.
func (w *upstreamWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return c, rw, err
}

// outcome is how the callee answered; the proxy has returned.
func (w *upstreamWriter) outcome(grpcCall bool) health.Outcome {
	if grpcCall && w.status == http.StatusOK {
		v, ok := grpcStatusKeys.value(w.ResponseWriter.Header())
		if !ok {
			return health.Failed // an answer without a status: the stream broke
		}
		return health.GRPCOutcome(grpcCode(v))
	}
	return health.HTTPOutcome(max(w.status, http.StatusOK))
}

// grpcStatusKeys are grpc-status's keys in a response's header map.
var grpcStatusKeys = newResponseKeys("grpc-status")

// responseKeys are the keys a response field (lower case) may have in a
// handler's header map once it returned: a header, or a declared trailer,
// under its canonical name; an undeclared trailer (http.TrailerPrefix),
// canonical as ReverseProxy writes it, or as a handler gave it.
type responseKeys struct{ header, trailer, trailerLower string }

func newResponseKeys(lower string) responseKeys {
	canonical := textproto.CanonicalMIMEHeaderKey(lower)
	return responseKeys{canonical, http.TrailerPrefix + canonical, http.TrailerPrefix + lower}
}

// value returns the field's first value in h, and whether it has one.
func (k responseKeys) value(h http.Header) (string, bool) {
	for _, key := range [...]string{k.header, k.trailer, k.trailerLower} {
		if v := h[key]; len(v) > 0 {
			return v[0], true
		}
	}
	return "", false
}

// grpcCode parses a grpc-status value; an unparsable one is UNKNOWN (2).
func grpcCode(s string) uint32 {
	if s == "" || len(s) > 3 {
		return 2
	}
	n := uint32(0)
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 2
		}
		n = n*10 + uint32(s[i]-'0')
	}
	return n
}

// serveUpstream has next answer r through w, counting the answer's
// latency and outcome in rec. A handler that panics (the proxy does when
// the caller goes) is counted as abandoned, and the panic goes on.
func serveUpstream(next http.Handler, w http.ResponseWriter, r *http.Request, rec *health.Recorder) {
	uw := upstreamWriters.Get().(*upstreamWriter)
	uw.ResponseWriter, uw.status, uw.hijacked = w, 0, false
	rec.Start()
	began := time.Now()
	done := false
	defer func() {
		o := health.Abandoned
		if done && !uw.hijacked {
			o = uw.outcome(grpcRequest(r))
		}
		rec.Done(time.Since(began), o)
		uw.ResponseWriter = nil
		upstreamWriters.Put(uw)
	}()
	next.ServeHTTP(uw, r)
	done = true
}
