package sidecar

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Outbound enforcement: the caller decides before a request crosses the
// network, as Uber's mesh clients do. The caller keeps a Limiter of its own
// for the direction (see Limiter), holding its "caller/<self>" policy, whose
// peers are the callees; its ServiceLimiter is bound to the caller's own
// service name. UnaryClientInterceptor, StreamClientInterceptor and
// RoundTripper decide each call with it, keyed by the callee, so the counts
// it keeps are per (caller, callee), the same buckets the callee's inbound
// sidecar counts, reported with direction OUTBOUND.
//
// A call the caller admits reaches the callee's inbound sidecar too, if it
// runs one. So that the two sides neither decide nor count it twice, the
// client marks it: it sets the caller header to its own service name and
// DecidedHeader to the same name, and the inbound side (Middleware and the
// server interceptors), when it trusts marks (TrustDecided), neither decides
// nor counts a request whose DecidedHeader equals its caller, unless its
// policy declares procedures: the caller decides per callee, not per
// procedure, so such a callee decides and counts every request in its leaf,
// and the controller publishes the caller no rule toward it (the caller
// admits those calls). The controller then adds up, per bucket,
// what callers offered outbound and what reached the callee unmarked, and
// gives both sides the bucket's one ratio (docs/architecture.md, "Outbound
// enforcement").

// DecidedHeader is the request header (HTTP) or metadata key (gRPC) with which
// an outbound-enforcing caller marks a call it has already decided and
// counted. Its value is the caller's service name; the callee's inbound side
// honours the mark only when it equals the caller header, so a mark forwarded
// by an app that copies incoming headers onto its own calls does not exempt
// those calls; with an authenticated caller (HTTPOptions.Identify), only
// when it names the authenticated service. Even then a caller that marks
// its calls without enforcing escapes its limit: the inbound side honours
// marks only with TrustDecided, set where the callers are trusted to
// enforce their own outbound limits.
const DecidedHeader = "x-sluice-decided"

// decidedKey is DecidedHeader as net/http stores it.
var decidedKey = textproto.CanonicalMIMEHeaderKey(DecidedHeader)

// decidedUpstream reports whether an inbound request carrying marks (the
// values of DecidedHeader) from caller was decided by the caller already.
func decidedUpstream(marks []string, caller string) bool {
	return len(marks) > 0 && caller != "" && marks[0] == caller
}

// DecidedUpstream returns how many inbound requests s let through without a
// decision because their caller had decided them already (DecidedHeader).
// They are in no other count.
func (s *ServiceLimiter) DecidedUpstream() uint64 { return s.upstream.Load() }

// ClientOptions configure the outbound interceptors and RoundTripper. The
// zero value is ready to use.
type ClientOptions struct {
	// CallerHeader names the header (metadata key) the client sets to its
	// own service name, so that the callee's sidecar knows who calls; it
	// must match the callee side's CallerHeader. DefaultCallerHeader when
	// empty.
	CallerHeader string
	// Callee maps a call's destination to the callee's service name: a gRPC
	// ClientConn's target ("xds:///checkout", "dns:///checkout.shop:8080")
	// or an HTTP request's host ("checkout.shop.svc.cluster.local:8080").
	// Nil means CalleeFromTarget. It runs on every call: a function that
	// allocates costs the call its allocation-free decision. A name that is
	// not a valid service name counts as names.Unknown.
	Callee func(target string) string
	// CalleeHeader, HTTP only: when set, a request carrying this header is
	// counted against the callee it names, whatever its host, e.g. for
	// calls through an egress gateway whose host is the gateway's.
	CalleeHeader string
}

// CalleeFromTarget is the default mapping of ClientOptions.Callee: the first
// DNS label of the destination's host, which is the Kubernetes (and Istio)
// service name however the name is qualified. A gRPC target's scheme and
// authority are skipped, and a port is stripped:
//
//	xds:///checkout                          → checkout
//	dns:///checkout.shop.svc:8080            → checkout
//	checkout.shop.svc.cluster.local:8080     → checkout
//	127.0.0.1:8080, [::1]:8080, unix:///sock → "" (counts as unknown)
//
// An IP address or a socket path names no service: dial by service name, or
// set ClientOptions.Callee. The namespace is dropped, so two services of the
// same name in different namespaces share buckets, as they share limits
// (limits name services, not namespaces). It allocates nothing.
func CalleeFromTarget(target string) string {
	s := target
	// A scheme has no ':', so the first ':' either starts "://" or
	// separates a port (or is "unix:path").
	if i := strings.IndexByte(s, ':'); i >= 0 {
		scheme := s[:i]
		if scheme == "unix" || scheme == "unix-abstract" {
			return ""
		}
		if strings.HasPrefix(s[i+1:], "//") {
			// scheme://authority/endpoint: the endpoint names the service.
			rest := s[i+3:]
			j := strings.IndexByte(rest, '/')
			if j < 0 {
				return ""
			}
			s = rest[j+1:]
		}
	}
	// One pass to the end of the first label.
	end, digits := len(s), true
	for k := 0; k < len(s); k++ {
		c := s[k]
		if c == '.' || c == ':' || c == '/' || c == '?' || c == '#' || c == '[' {
			end = k
			break
		}
		digits = digits && '0' <= c && c <= '9'
	}
	// An all-digit label starts an IPv4 address (Kubernetes service names
	// start with a letter); "[" or "::" an IPv6 one.
	if end == 0 || digits || strings.HasPrefix(s[end:], "::") {
		return ""
	}
	return s[:end]
}

func (o ClientOptions) callee() func(string) string {
	if o.Callee != nil {
		return o.Callee
	}
	return CalleeFromTarget
}

// UnaryClientInterceptor enforces s's outbound policy on unary calls: s is
// the caller's own service, bound on its outbound Limiter, and the callee is
// opts.Callee of the ClientConn's target. A dropped call is never sent: it
// fails with the RESOURCE_EXHAUSTED status (and RetryInfo) that
// UnaryServerInterceptor returns. An admitted call carries the caller header
// and DecidedHeader, both set to s's name.
//
// The two keys are appended to the outgoing metadata: the callee reads the
// first value, so a caller header the app set itself wins, the mark then
// does not match it, and the callee decides the call again (a double
// decision, never a call that escapes both). The app should not set them.
//
// The decision allocates nothing, and neither does a drop; an admitted call
// allocates its outgoing metadata, next to what the call itself allocates.
func (s *ServiceLimiter) UnaryClientInterceptor(opts ClientOptions) grpc.UnaryClientInterceptor {
	key := strings.ToLower(cmp.Or(opts.CallerHeader, DefaultCallerHeader))
	callee := opts.callee()
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if d := s.Decide(callee(cc.Target())); d.Drop {
			return d.v.grpcErr
		}
		return invoker(metadata.AppendToOutgoingContext(ctx, key, s.name, DecidedHeader, s.name), method, req, reply, cc, callOpts...)
	}
}

// StreamClientInterceptor enforces s's outbound policy on streams, once per
// stream when it opens, the way UnaryClientInterceptor does per call.
func (s *ServiceLimiter) StreamClientInterceptor(opts ClientOptions) grpc.StreamClientInterceptor {
	key := strings.ToLower(cmp.Or(opts.CallerHeader, DefaultCallerHeader))
	callee := opts.callee()
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		if d := s.Decide(callee(cc.Target())); d.Drop {
			return nil, d.v.grpcErr
		}
		return streamer(metadata.AppendToOutgoingContext(ctx, key, s.name, DecidedHeader, s.name), desc, cc, method, callOpts...)
	}
}

// RoundTripper wraps next (http.DefaultTransport when nil) with s's outbound
// policy: s is the caller's own service, bound on its outbound Limiter, and
// the callee is opts.CalleeHeader if set and present, else opts.Callee of the
// request's host (Request.Host, else URL.Host). A dropped request is never
// sent: the caller gets, with a nil error, the response the callee's sidecar
// would have given (see Middleware): 429 with Retry-After,
// x-envoy-ratelimited, RateLimit-Policy, RateLimit and a short text body, or
// for a gRPC call (Content-Type application/grpc) a trailers-only
// RESOURCE_EXHAUSTED with the same headers. The request's body
// is closed, as http.RoundTripper requires.
//
// An admitted request goes to next as a shallow copy whose header map is a
// copy with the caller header and DecidedHeader set to s's name: a
// RoundTripper must not modify the request it was given.
//
// The decision allocates nothing. A drop allocates only the response it
// hands over, which the caller owns.
func (s *ServiceLimiter) RoundTripper(next http.RoundTripper, opts ClientOptions) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	t := &roundTripper{
		s:         s,
		next:      next,
		callerKey: textproto.CanonicalMIMEHeaderKey(cmp.Or(opts.CallerHeader, DefaultCallerHeader)),
		callee:    opts.callee(),
		self:      []string{s.name},
	}
	if opts.CalleeHeader != "" {
		t.calleeKey = textproto.CanonicalMIMEHeaderKey(opts.CalleeHeader)
	}
	return t
}

type roundTripper struct {
	s         *ServiceLimiter
	next      http.RoundTripper
	callerKey string
	calleeKey string // "" when not configured
	callee    func(string) string
	// self is the header value set on admitted requests, shared: cap ==
	// len, so a later Add on the copy's header copies instead of writing
	// into it.
	self []string
}

// decide decides req without sending it; the allocation-free part.
func (t *roundTripper) decide(req *http.Request) Decision {
	if t.calleeKey != "" {
		if v := req.Header[t.calleeKey]; len(v) > 0 {
			return t.s.Decide(v[0])
		}
	}
	host := req.Host
	if host == "" && req.URL != nil {
		host = req.URL.Host
	}
	return t.s.Decide(t.callee(host))
}

func (t *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if d := t.decide(req); d.Drop {
		if req.Body != nil {
			req.Body.Close()
		}
		ct := req.Header["Content-Type"]
		return d.v.http.response(req, len(ct) > 0 && isGRPCContentType(ct[0])), nil
	}
	r2 := new(http.Request)
	*r2 = *req
	r2.Header = req.Header.Clone()
	if r2.Header == nil {
		r2.Header = make(http.Header, 2)
	}
	r2.Header[t.callerKey] = t.self
	r2.Header[decidedKey] = t.self
	return t.next.RoundTrip(r2)
}

// response is the rejection as a client-side response to req: what write
// (or, for a gRPC call, writeGRPC) would have sent over the wire. The header
// map and body are new; the header values are shared, as in write.
func (h *httpRejection) response(req *http.Request, grpcCall bool) *http.Response {
	hdr := make(http.Header, 8)
	res := &http.Response{
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  hdr,
		Request: req,
	}
	h.writeRateLimit(hdr, NoRateLimitHeaders)
	if grpcCall {
		hdr["Content-Type"] = grpcContentType
		hdr["Grpc-Status"] = h.grpcStatus
		hdr["Grpc-Message"] = h.grpcMessage
		if h.grpcDetails != nil {
			hdr["Grpc-Status-Details-Bin"] = h.grpcDetails
		}
		res.Status, res.StatusCode = "200 OK", http.StatusOK
		res.Body = http.NoBody
		return res
	}
	hdr["Content-Type"] = textPlain
	hdr["X-Content-Type-Options"] = noSniff
	hdr["Content-Length"] = h.contentLength
	res.Status, res.StatusCode = "429 Too Many Requests", http.StatusTooManyRequests
	res.ContentLength = int64(len(h.body))
	res.Body = io.NopCloser(bytes.NewReader(h.body))
	return res
}

// renderRejection renders what a request that rule r of service's policy
// drops gets, told to come back after retryAfter of r's ratio and limit.
// Outbound, service is the caller and r.Peer the callee, so the names swap:
// the message always says who called whom.
func renderRejection(service string, dir Direction, r *Rule) (*httpRejection, error) {
	retry := retryAfter(r.DropRatio, r.LimitRPS)
	if dir == Outbound {
		swapped := *r
		swapped.Peer = service
		service = r.Peer
		r = &swapped
	}
	grpcErr := renderGRPC(service, r, retry)
	return renderHTTP(service, r, retry, grpcErr), grpcErr
}
