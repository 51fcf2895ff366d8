package sidecar

import (
	"cmp"
	"encoding/base64"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// DefaultCallerHeader is the request header (HTTP) or metadata key (gRPC)
// that names the calling service.
const DefaultCallerHeader = "x-sluice-caller"

// HTTPOptions configure Middleware. The zero value is ready to use.
type HTTPOptions struct {
	// CallerHeader names the request header that carries the caller's
	// service name; DefaultCallerHeader when empty. A request without it
	// counts as names.Unknown. It is believed as the network is: any
	// client that reaches the handler can name any caller. With Identify
	// it no longer names the caller.
	CallerHeader string
	// Identify, when set, names the caller from what authenticates the
	// request (PeerCertIdentity, XFCCIdentity) instead of CallerHeader; a
	// request it finds no identity in counts as names.Unknown. A caller
	// header that disagrees with the identity is counted
	// (sluice_sidecar_caller_mismatch_total) and ignored, or refused with
	// RejectMismatch.
	Identify Identify
	// RejectMismatch, with Identify, refuses a request whose caller header
	// names another caller than its identity: 403 Forbidden, or
	// PERMISSION_DENIED for a gRPC call, before any decision.
	RejectMismatch bool
	// TrustDecided lets a request that its caller marked as decided already
	// (DecidedHeader, set by the caller's outbound enforcement) through
	// undecided and uncounted when the mark names its caller: with
	// Identify, its authenticated caller, and the policy declares no
	// procedures (see resolveCaller). Otherwise marks are counted
	// (sluice_sidecar_decided_ignored_total) and the request is decided
	// like any other. Set it only for callers trusted to enforce their
	// own outbound limits: a caller that marks its calls without
	// enforcing escapes its limit.
	TrustDecided bool
	// RateLimitHeaders says which rate-limit headers admitted responses
	// carry: none (the default), the IETF draft's, or Envoy's
	// X-RateLimit-* (which drops then carry too). See RateLimitHeaders,
	// and renderAdmit for what the values say.
	RateLimitHeaders RateLimitHeaders
}

func (o HTTPOptions) rules() callerRules {
	return callerRules{authenticated: o.Identify != nil, rejectMismatch: o.RejectMismatch, trustDecided: o.TrustDecided}
}

// Middleware enforces s's policy on inbound HTTP requests: the peer is the
// caller named by opts.Identify, or else by opts.CallerHeader, and the
// procedure, when the policy declares procedures, the one its routes give
// the request's method and path (see DecideHTTP), and, when the policy has
// criticality, the tier its criticality header and the policy's defaults
// give it (see DecideHTTPTier; the header is the policy's, read afresh
// with each policy). A dropped request never reaches next.
// It gets 429 Too Many Requests with Retry-After (see retryAfter),
// x-envoy-ratelimited: true (so that Envoy does not retry it, see
// envoyRateLimited), the RateLimit-Policy / RateLimit headers of
// draft-ietf-httpapi-ratelimit-headers, and a short text body; or, when it
// is a gRPC call (see isGRPCContentType), the trailers-only response a gRPC
// server would send for the status that UnaryServerInterceptor returns
// (RESOURCE_EXHAUSTED with a RetryInfo of the same delay), with the same
// headers. With opts.RateLimitHeaders XRateLimitHeaders, both also carry
// X-RateLimit-Limit, -Remaining (0) and -Reset.
//
// An admitted request reaches next with the rate-limit headers of
// opts.RateLimitHeaders already in the response's header map, when its
// caller's rule has a quota to announce and is not in shadow mode (see
// renderAdmit); the app may overwrite them, and headers it adds with Add
// (httputil.ReverseProxy copies the app's this way) come after them.
// Otherwise, shadow drops included, it reaches next untouched. Neither path
// allocates: every value was rendered when the policy was installed.
//
// A gRPC call's caller is its metadata key opts.CallerHeader, which is the
// HTTP/2 header of that name.
//
// A request the bucket admits is then decided by each of the policy's
// descriptors (issue #15), each taking its value from the request by its
// source: a header, r.RemoteAddr, or X-Forwarded-For as r arrived (see
// descriptor_edges.go). One that any descriptor drops gets a drop's answer
// as above, the descriptor's (DecideDescriptor renders it); admitted, it
// goes on as above, without allocating.
//
// With opts.TrustDecided, a request whose DecidedHeader names its caller
// was decided and counted by the caller's outbound enforcement: it reaches
// next undecided and uncounted by its bucket (but in DecidedUpstream). It
// gets the rate-limit headers its caller's rule announces all the same, and
// its descriptors, which only the callee's policy has, decide it as any
// other's.
func (s *ServiceLimiter) Middleware(next http.Handler, opts HTTPOptions) http.Handler {
	key := textproto.CanonicalMIMEHeaderKey(cmp.Or(opts.CallerHeader, DefaultCallerHeader))
	form := opts.RateLimitHeaders
	rules := opts.rules()
	refusal := renderRefusal(s.name)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var header, id string
		if v := r.Header[key]; len(v) > 0 {
			header = v[0]
		}
		res := Authenticated
		if opts.Identify != nil {
			id, res = opts.Identify(r)
		}
		t := s.table.Load()
		caller, decided, reject := s.resolveCaller(rules, header, id, res, r.Header[decidedKey], t.fineLeaves())
		if reject {
			refusal.write(w, grpcRequest(r))
			return
		}
		idx := t.procs.http(r.Method, r.URL.Path)
		var tier string // decided requests have none: see fineLeaves
		if t.crit != nil {
			if v := r.Header[t.crit.httpKey]; len(v) > 0 {
				tier = v[0]
			}
		}
		var v *verdict
		var d Decision
		if decided {
			if form != NoRateLimitHeaders {
				v = s.verdictOf(t, caller, idx)
			}
		} else {
			d = s.decideRequest(t, r, caller, idx, tier)
			if d.Drop {
				if d.flags()&priceFromHeader != 0 { // the request's own price
					w.Header()[httpCostKey] = r.Header[t.cost.httpReq]
				}
				if grpcRequest(r) {
					d.v.http.writeGRPC(w, form)
				} else {
					d.v.http.write(w, form)
				}
				return
			}
			v = d.v
		}
		if dv := s.decideDescriptorsHTTP(r); dv != nil {
			d.Done(0, false) // refused after all: it holds its slot no longer
			if grpcRequest(r) {
				dv.http.writeGRPC(w, form)
			} else {
				dv.http.write(w, form)
			}
			return
		}
		if form != NoRateLimitHeaders && v != nil && v.admit != nil {
			v.admit.setHTTP(w.Header(), form)
		}
		if d.pending() {
			// After the handler, whether it returns or panics (as
			// ReverseProxy does when the client goes): its header map
			// holds the response's headers and trailers then.
			defer d.doneHTTP(w)
		}
		serveUpstream(next, w, r, t.health[idx])
	})
}

// decideRequest decides r of caller to procedure index idx with tier
// header value tier under t, priced by its cost header when the policy
// trusts one.
func (s *ServiceLimiter) decideRequest(t *table, r *http.Request, caller string, idx uint32, tier string) Decision {
	var raw string
	if c := t.cost; c != nil && c.httpReq != "" {
		if v := r.Header[c.httpReq]; len(v) > 0 {
			raw = v[0]
		}
	}
	return s.decide(t, caller, idx, tier, raw, 0)
}

// grpcRequest reports whether r is a gRPC call, for the answers that
// differ: asked only of the requests that are refused or dropped.
func grpcRequest(r *http.Request) bool {
	ct := r.Header["Content-Type"]
	return len(ct) > 0 && isGRPCContentType(ct[0])
}

// refusal is the answer to a request refused before any decision because
// its caller header disagrees with its authenticated identity
// (RejectMismatch): 403 Forbidden, or PERMISSION_DENIED for a gRPC call.
// Rendered once per middleware; its slices are shared (cap == len).
type refusal struct {
	body          []byte
	contentLength []string
	grpcErr       error
	grpcStatus    []string
	grpcMessage   []string
}

func renderRefusal(service string) *refusal {
	msg := "request to service " + service + " refused by sluice: its caller header names another caller than its authenticated identity"
	st := status.New(codes.PermissionDenied, msg)
	f := &refusal{body: []byte(msg + "\n"), grpcErr: st.Err()}
	f.contentLength = []string{strconv.Itoa(len(f.body))}
	f.grpcStatus, f.grpcMessage, _ = grpcTrailers(st)
	return f
}

func (f *refusal) write(w http.ResponseWriter, grpcCall bool) {
	hdr := w.Header()
	if grpcCall {
		hdr["Content-Type"] = grpcContentType
		hdr["Grpc-Status"] = f.grpcStatus
		hdr["Grpc-Message"] = f.grpcMessage
		w.WriteHeader(http.StatusOK)
		return
	}
	hdr["Content-Type"] = textPlain
	hdr["X-Content-Type-Options"] = noSniff
	hdr["Content-Length"] = f.contentLength
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write(f.body) // the caller is gone if this fails; nothing to do
}

// isGRPCContentType reports whether a request's Content-Type makes it a gRPC
// call, the way grpc-go's server decides: application/grpc, alone or
// followed by '+' (a codec) or ';' (parameters). Case matters, and gRPC-Web
// (application/grpc-web) is not gRPC: it is answered as plain HTTP.
func isGRPCContentType(ct string) bool {
	const base = "application/grpc"
	if !strings.HasPrefix(ct, base) {
		return false
	}
	return len(ct) == len(base) || ct[len(base)] == '+' || ct[len(base)] == ';'
}

// httpRejection is a dropped request's response rendered once per rule: the
// 429 of a plain HTTP request and the trailers-only response of a gRPC call.
// Its header values are shared by every rejection under the rule: each slice
// has cap == len, so a later Header().Add copies instead of writing into the
// shared array.
type httpRejection struct {
	retryAfter []string     // Retry-After: see retryAfter
	quota      quotaHeaders // remaining 0 for retryAfter seconds; policy nil when the rule has no quota to announce
	// cost and restore are, for a service counting cost, x-sluice-cost
	// (the leaf's static price; nil when it has none) and
	// x-sluice-restore-rate (the bucket's limit; nil: none). See
	// costTable.decorate.
	cost, restore []string
	contentLength []string
	body          []byte

	// The gRPC status, as grpc-go's server writes it in a trailers-only
	// response.
	grpcStatus  []string // Grpc-Status: the code in decimal
	grpcMessage []string // Grpc-Message: percent-encoded
	grpcDetails []string // Grpc-Status-Details-Bin: nil if the status has no details (or did not marshal)

	// What the server interceptors add to the status as trailer metadata,
	// by the form of rate-limit headers they were asked for:
	// x-envoy-ratelimited always, and the quota headers of the form.
	grpcTrailerDraft, grpcTrailerX metadata.MD
}

// Header values shared by all rejections.
var (
	textPlain       = []string{"text/plain; charset=utf-8"}
	noSniff         = []string{"nosniff"}
	grpcContentType = []string{"application/grpc"}
)

func (h *httpRejection) write(w http.ResponseWriter, form RateLimitHeaders) {
	// Canonical keys assigned directly: no canonicalisation, no formatting.
	hdr := w.Header()
	hdr["Content-Type"] = textPlain
	hdr["X-Content-Type-Options"] = noSniff
	hdr["Content-Length"] = h.contentLength
	h.writeRateLimit(hdr, form)
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(h.body) // the caller is gone if this fails; nothing to do
}

// writeGRPC answers a gRPC call in the trailers-only form: HTTP 200 and the
// status in the headers, no body. With nothing written after WriteHeader
// and no Flush, the HTTP/2 server sends the headers with END_STREAM when the
// handler returns, which a gRPC client reads as the call's trailers.
func (h *httpRejection) writeGRPC(w http.ResponseWriter, form RateLimitHeaders) {
	hdr := w.Header()
	hdr["Content-Type"] = grpcContentType
	hdr["Grpc-Status"] = h.grpcStatus
	hdr["Grpc-Message"] = h.grpcMessage
	if h.grpcDetails != nil {
		hdr["Grpc-Status-Details-Bin"] = h.grpcDetails
	}
	h.writeRateLimit(hdr, form)
	w.WriteHeader(http.StatusOK)
}

// writeRateLimit sets the headers both forms share: Retry-After,
// x-envoy-ratelimited, the draft's RateLimit fields always, and Envoy's
// X-RateLimit-* when form asks for them.
func (h *httpRejection) writeRateLimit(hdr http.Header, form RateLimitHeaders) {
	hdr["Retry-After"] = h.retryAfter
	hdr["X-Envoy-Ratelimited"] = envoyRateLimited
	if h.cost != nil {
		if _, echoed := hdr[httpCostKey]; !echoed { // the request's own price, set by the edge
			hdr[httpCostKey] = h.cost
		}
	}
	if h.restore != nil {
		hdr[httpRestoreKey] = h.restore
	}
	h.quota.setHTTP(hdr, DraftRateLimitHeaders)
	if form == XRateLimitHeaders {
		h.quota.setHTTP(hdr, XRateLimitHeaders)
	}
}

// grpcTrailer is the trailer metadata the server interceptors send with a
// drop's status.
func (h *httpRejection) grpcTrailer(form RateLimitHeaders) metadata.MD {
	switch form {
	case DraftRateLimitHeaders:
		return h.grpcTrailerDraft
	case XRateLimitHeaders:
		return h.grpcTrailerX
	}
	return envoyRateLimitedMD
}

// maxSFInteger is the largest integer a structured field (RFC 9651) holds.
const maxSFInteger = 999_999_999_999_999

// renderHTTP renders the rejection of a request under rule r of service,
// told to wait retry seconds, whose gRPC form carries grpcErr's status.
func renderHTTP(service string, r *Rule, retry int, grpcErr error) *httpRejection {
	h := &httpRejection{
		retryAfter: seconds[min(max(retry, MinRetryAfter), MaxRetryAfter)],
		body:       []byte("request from caller " + r.Peer + " to " + target(service, r) + " was rate limited by sluice\n"),
	}
	h.contentLength = []string{strconv.Itoa(len(h.body))}
	// The quota is what the bucket may send now, which is never above its
	// limit; nothing is announced when the bucket is unbounded. Nothing is
	// left of it until the ratio is released.
	h.quota, _ = renderQuota(policyName(service, r), r, 0, retry)
	h.grpcTrailerDraft = h.quota.metadata(DraftRateLimitHeaders, envoyRateLimitedMD)
	h.grpcTrailerX = h.quota.metadata(XRateLimitHeaders, envoyRateLimitedMD)
	// The gRPC form carries exactly the status the interceptors return.
	h.grpcStatus, h.grpcMessage, h.grpcDetails = grpcTrailers(status.Convert(grpcErr))
	return h
}

// grpcTrailers renders st as grpc-go's server puts a status in trailers:
// grpc-status, grpc-message percent-encoded, and, when st has details,
// grpc-status-details-bin as the unpadded base64 of the google.rpc.Status.
// Like grpc-go, it leaves details out if the status does not marshal
// (a message that is not valid UTF-8).
func grpcTrailers(st *status.Status) (code, msg, details []string) {
	code = []string{strconv.Itoa(int(st.Code()))}
	msg = []string{encodeGRPCMessage(st.Message())}
	if p := st.Proto(); len(p.GetDetails()) > 0 {
		if b, err := proto.Marshal(p); err == nil {
			details = []string{base64.RawStdEncoding.EncodeToString(b)}
		}
	}
	return code, msg, details
}

// encodeGRPCMessage percent-encodes msg for the grpc-message header as the
// gRPC spec (PROTOCOL-HTTP2.md) asks and grpc-go does: printable ASCII other
// than '%' stays, every other byte of the UTF-8 encoding becomes %XX, and an
// invalid byte is encoded as U+FFFD.
func encodeGRPCMessage(msg string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for _, r := range msg { // invalid UTF-8 yields utf8.RuneError, U+FFFD
		if ' ' <= r && r <= '~' && r != '%' {
			b.WriteByte(byte(r))
			continue
		}
		var buf [utf8.UTFMax]byte
		for _, c := range buf[:utf8.EncodeRune(buf[:], r)] {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
	}
	return b.String()
}
