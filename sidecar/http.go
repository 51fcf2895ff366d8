package sidecar

import (
	"cmp"
	"encoding/base64"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// DefaultCallerHeader is the request header (HTTP) or metadata key (gRPC)
// that names the calling service.
const DefaultCallerHeader = "x-sluice-caller"

// retryAfterSeconds is what rejections ask callers to wait: one controller
// tick, after which the ratio may have changed.
const retryAfterSeconds = 1

// HTTPOptions configure Middleware. The zero value is ready to use.
type HTTPOptions struct {
	// CallerHeader names the request header that carries the caller's
	// service name; DefaultCallerHeader when empty. A request without it
	// counts as names.Unknown.
	CallerHeader string
	// IgnoreDecided decides and counts requests that their caller marked
	// as decided already (DecidedHeader) like any other, for callees whose
	// callers are not trusted to mark honestly. Then those callers must
	// not enforce outbound as well: their calls would be counted twice.
	IgnoreDecided bool
}

// Middleware enforces s's policy on inbound HTTP requests: the peer is the
// caller named by opts.CallerHeader. A dropped request never reaches next.
// It gets 429 Too Many Requests with Retry-After and the RateLimit-Policy /
// RateLimit headers of draft-ietf-httpapi-ratelimit-headers, and a short
// text body; or, when it is a gRPC call (see isGRPCContentType), the
// trailers-only response a gRPC server would send for the status that
// UnaryServerInterceptor returns (RESOURCE_EXHAUSTED with a RetryInfo),
// with the same Retry-After and RateLimit headers. Admitted requests, shadow
// drops included, reach next untouched.
//
// A gRPC call's caller is its metadata key opts.CallerHeader, which is the
// HTTP/2 header of that name.
//
// A request whose DecidedHeader names its caller was decided and counted by
// the caller's outbound enforcement: it reaches next undecided and uncounted
// (but in DecidedUpstream), unless opts.IgnoreDecided.
func (s *ServiceLimiter) Middleware(next http.Handler, opts HTTPOptions) http.Handler {
	key := textproto.CanonicalMIMEHeaderKey(cmp.Or(opts.CallerHeader, DefaultCallerHeader))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var caller string
		if v := r.Header[key]; len(v) > 0 {
			caller = v[0]
		}
		if !opts.IgnoreDecided && decidedUpstream(r.Header[decidedKey], caller) {
			s.upstream.Add(1)
			next.ServeHTTP(w, r)
			return
		}
		if d := s.Decide(caller); d.Drop {
			if ct := r.Header["Content-Type"]; len(ct) > 0 && isGRPCContentType(ct[0]) {
				d.v.http.writeGRPC(w)
			} else {
				d.v.http.write(w)
			}
			return
		}
		next.ServeHTTP(w, r)
	})
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
	policy        []string // RateLimit-Policy; nil when the rule has no quota to announce
	contentLength []string
	body          []byte

	// The gRPC status, as grpc-go's server writes it in a trailers-only
	// response.
	grpcStatus  []string // Grpc-Status: the code in decimal
	grpcMessage []string // Grpc-Message: percent-encoded
	grpcDetails []string // Grpc-Status-Details-Bin: nil if the status has no details (or did not marshal)
}

// Header values shared by all rejections.
var (
	textPlain       = []string{"text/plain; charset=utf-8"}
	noSniff         = []string{"nosniff"}
	retryAfter      = []string{strconv.Itoa(retryAfterSeconds)}
	rateLimitNone   = []string{`"sluice";r=0;t=` + strconv.Itoa(retryAfterSeconds)}
	grpcContentType = []string{"application/grpc"}
)

func (h *httpRejection) write(w http.ResponseWriter) {
	// Canonical keys assigned directly: no canonicalisation, no formatting.
	hdr := w.Header()
	hdr["Content-Type"] = textPlain
	hdr["X-Content-Type-Options"] = noSniff
	hdr["Content-Length"] = h.contentLength
	h.writeRateLimit(hdr)
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(h.body) // the caller is gone if this fails; nothing to do
}

// writeGRPC answers a gRPC call in the trailers-only form: HTTP 200 and the
// status in the headers, no body. With nothing written after WriteHeader
// and no Flush, the HTTP/2 server sends the headers with END_STREAM when the
// handler returns, which a gRPC client reads as the call's trailers.
func (h *httpRejection) writeGRPC(w http.ResponseWriter) {
	hdr := w.Header()
	hdr["Content-Type"] = grpcContentType
	hdr["Grpc-Status"] = h.grpcStatus
	hdr["Grpc-Message"] = h.grpcMessage
	if h.grpcDetails != nil {
		hdr["Grpc-Status-Details-Bin"] = h.grpcDetails
	}
	h.writeRateLimit(hdr)
	w.WriteHeader(http.StatusOK)
}

// writeRateLimit sets the headers both forms share.
func (h *httpRejection) writeRateLimit(hdr http.Header) {
	hdr["Retry-After"] = retryAfter
	hdr["Ratelimit"] = rateLimitNone
	if h.policy != nil {
		hdr["Ratelimit-Policy"] = h.policy
	}
}

// maxSFInteger is the largest integer a structured field (RFC 9651) holds.
const maxSFInteger = 999_999_999_999_999

func renderHTTP(service string, r *Rule) *httpRejection {
	h := &httpRejection{
		body: []byte("request from caller " + r.Peer + " to service " + service + " was rate limited by sluice\n"),
	}
	h.contentLength = []string{strconv.Itoa(len(h.body))}
	// The quota is what the bucket may send now, which is never above its
	// limit; nothing is announced when the bucket is unbounded.
	if quota := min(r.AllowedRPS, r.LimitRPS); quota >= 0 && !math.IsInf(quota, 0) {
		q := int64(min(math.Floor(quota), maxSFInteger))
		h.policy = []string{`"sluice";q=` + strconv.FormatInt(q, 10) + `;w=1`}
	}
	// The gRPC form carries exactly the status the interceptors return:
	// both come from renderGRPC.
	h.grpcStatus, h.grpcMessage, h.grpcDetails = grpcTrailers(status.Convert(renderGRPC(service, r)))
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
