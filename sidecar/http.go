package sidecar

import (
	"cmp"
	"math"
	"net/http"
	"net/textproto"
	"strconv"
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
}

// Middleware enforces s's policy on inbound HTTP requests: the peer is the
// caller named by opts.CallerHeader. A dropped request never reaches next;
// it gets 429 Too Many Requests with Retry-After and the RateLimit-Policy /
// RateLimit headers of draft-ietf-httpapi-ratelimit-headers, and a short
// text body. Admitted requests, shadow drops included, reach next untouched.
func (s *ServiceLimiter) Middleware(next http.Handler, opts HTTPOptions) http.Handler {
	key := textproto.CanonicalMIMEHeaderKey(cmp.Or(opts.CallerHeader, DefaultCallerHeader))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var caller string
		if v := r.Header[key]; len(v) > 0 {
			caller = v[0]
		}
		if d := s.Decide(caller); d.Drop {
			d.v.http.write(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// httpRejection is a 429 response rendered once per rule. Its header values
// are shared by every rejection under the rule: each slice has cap == len,
// so a later Header().Add copies instead of writing into the shared array.
type httpRejection struct {
	policy        []string // RateLimit-Policy; nil when the rule has no quota to announce
	contentLength []string
	body          []byte
}

// Header values shared by all rejections.
var (
	textPlain     = []string{"text/plain; charset=utf-8"}
	noSniff       = []string{"nosniff"}
	retryAfter    = []string{strconv.Itoa(retryAfterSeconds)}
	rateLimitNone = []string{`"sluice";r=0;t=` + strconv.Itoa(retryAfterSeconds)}
)

func (h *httpRejection) write(w http.ResponseWriter) {
	// Canonical keys assigned directly: no canonicalisation, no formatting.
	hdr := w.Header()
	hdr["Content-Type"] = textPlain
	hdr["X-Content-Type-Options"] = noSniff
	hdr["Content-Length"] = h.contentLength
	hdr["Retry-After"] = retryAfter
	hdr["Ratelimit"] = rateLimitNone
	if h.policy != nil {
		hdr["Ratelimit-Policy"] = h.policy
	}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(h.body) // the caller is gone if this fails; nothing to do
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
	return h
}
