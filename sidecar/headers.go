package sidecar

import (
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"google.golang.org/grpc/metadata"
)

// Rate-limit headers: what sluice tells a caller about its quota, on drops
// (always) and on admitted responses (when asked to, see RateLimitHeaders).
//
// Every value is rendered once per rule when a policy is installed (compile),
// never per request: the request path only assigns shared, pre-rendered
// header slices to the response's header map. Policies change about once a
// second, so the values are as fresh as the policy and cost nothing per
// request. Each shared slice has cap == len, so a later Header().Add copies
// instead of writing into it; nobody may write into its elements.

// RateLimitHeaders says which rate-limit headers a response carries besides
// the ones every drop gets. The zero value, NoRateLimitHeaders, leaves
// admitted responses untouched.
type RateLimitHeaders uint8

const (
	// NoRateLimitHeaders: admitted responses get no rate-limit headers;
	// drops get Retry-After, x-envoy-ratelimited and the draft's
	// RateLimit-Policy and RateLimit.
	NoRateLimitHeaders RateLimitHeaders = iota
	// DraftRateLimitHeaders: admitted responses get RateLimit-Policy and
	// RateLimit as in draft-ietf-httpapi-ratelimit-headers, the form drops
	// always get.
	DraftRateLimitHeaders
	// XRateLimitHeaders: admitted responses get X-RateLimit-Limit,
	// X-RateLimit-Remaining and X-RateLimit-Reset, the form Envoy's
	// ratelimit filter emits with enable_x_ratelimit_headers:
	// DRAFT_VERSION_03; drops get them too, as Envoy's do.
	XRateLimitHeaders
)

func (h RateLimitHeaders) String() string {
	switch h {
	case NoRateLimitHeaders:
		return "none"
	case DraftRateLimitHeaders:
		return "draft"
	case XRateLimitHeaders:
		return "x-ratelimit"
	}
	return "RateLimitHeaders(" + strconv.Itoa(int(h)) + ")"
}

// ParseRateLimitHeaders is the inverse of RateLimitHeaders.String: "none",
// "draft" or "x-ratelimit".
func ParseRateLimitHeaders(s string) (RateLimitHeaders, error) {
	for _, h := range []RateLimitHeaders{NoRateLimitHeaders, DraftRateLimitHeaders, XRateLimitHeaders} {
		if s == h.String() {
			return h, nil
		}
	}
	return 0, fmt.Errorf("%q is not none, draft or x-ratelimit", s)
}

// Retry-After bounds, in whole seconds (Retry-After is delta-seconds).
const (
	// MinRetryAfter is one controller tick: no ratio changes sooner.
	MinRetryAfter = 1
	// MaxRetryAfter caps the advice. The rule below reaches it only for a
	// blocked caller (limit 0), whose ratio no wait will lower.
	MaxRetryAfter = 60
)

// assumedReleaseRate is the controller's default --release-rate: the factor
// by which the law lets a caller's admitted share 1 − p grow per second
// (pkg/dropratio Config.ReleaseRate). Policies do not carry it.
const assumedReleaseRate = 2

// retryAfter is the wait, in whole seconds within [MinRetryAfter,
// MaxRetryAfter], that a request dropped at ratio p (clamped to [0, 1)) with
// limit limitRPS is told to wait (Retry-After, RetryInfo.retry_delay, and the
// t= of RateLimit).
//
// The rule: the number of controller ticks (one a second) that the control
// law needs to release p to 0, if the caller's offered load fell to its
// limit at once. The law releases slowly: the admitted share 1 − p may at
// most double per second (the default --release-rate), so p = 0.5 is gone
// after one tick, 0.9 after four (0.8, 0.6, 0.2, 0), 0.99 after seven. A
// client that comes back sooner meets a ratio that is still above 0 however
// fast the load fell: at p = 0.9 (ten times over the limit) a retry after
// 1 s is dropped with a probability of at least 0.8. So this is the
// earliest time at which a retry can expect to be admitted, not a promise:
// it leaves out the report lag before the controller sees the load fall, and
// while the load stays up the ratio stays up. The ratio alone is enough: it
// is 1 − limit ÷ offered already (up to p_max, and above it while it is
// being released), and it is what the law releases.
//
// A blocked caller (limit 0) is dropped at p_max until an operator changes
// its limit: no wait helps, and it is told MaxRetryAfter. A controller run
// with a slower release makes the advice short (the client is dropped again
// and told again), a faster one makes it long.
func retryAfter(p, limitRPS float64) int {
	if limitRPS == 0 {
		return MaxRetryAfter
	}
	// The law's own arithmetic: after n ticks the ratio is
	// 1 − (1−p)·rate^n, and it is 0 once that is ≤ 0.
	share, n := 1-clampRatio(p), MinRetryAfter
	for share*assumedReleaseRate < 1 && n < MaxRetryAfter {
		share *= assumedReleaseRate
		n++
	}
	return n
}

// seconds[n] is strconv.Itoa(n) for every Retry-After and reset value, and
// rateLimitZero[n] the RateLimit value of a caller with nothing left for n
// seconds: shared by every rule with the same wait, so that installing a
// policy does not render them again.
var (
	seconds       [MaxRetryAfter + 1][]string
	rateLimitZero [MaxRetryAfter + 1][]string
)

func init() {
	for n := range seconds {
		seconds[n] = []string{strconv.Itoa(n)}
		rateLimitZero[n] = []string{`"sluice";r=0;t=` + strconv.Itoa(n)}
	}
}

// Header values shared by every response that carries them.
var (
	// envoyRateLimited marks a response as a rate limiter's, as Envoy's
	// ratelimit filter does: Envoy's router does not retry a response that
	// carries x-envoy-ratelimited (whatever its retry_on says: 5xx,
	// retriable-status-codes 429, resource-exhausted) unless the route
	// retries on envoy-ratelimited. The filter sets it on its gRPC
	// trailers-only replies too: the header goes through sendLocalReply's
	// modify_headers, which runs before the reply is turned into gRPC.
	envoyRateLimited = []string{"true"}
	// envoyRateLimitedMD is the same as gRPC trailer metadata.
	envoyRateLimitedMD = metadata.MD{"x-envoy-ratelimited": envoyRateLimited}
)

// quotaHeaders are one rule's rate-limit headers in both forms, for one
// kind of response (admitted, or dropped), rendered once.
type quotaHeaders struct {
	// draft-ietf-httpapi-ratelimit-headers.
	policy    []string // RateLimit-Policy: "<name>";q=<quota>;w=1; nil when the rule has no quota
	rateLimit []string // RateLimit: "<name>";r=<remaining>;t=<reset>

	// Envoy's DRAFT_VERSION_03 form; all nil when the rule has no quota.
	xLimit     []string // X-RateLimit-Limit: <quota>, <quota>;w=1
	xRemaining []string // X-RateLimit-Remaining: <remaining>
	xReset     []string // X-RateLimit-Reset: <reset>
}

// quota returns the whole requests per second a rule announces, and whether
// it announces any: min(allowed, limit), what the bucket may send now. That
// is the caller's limit unless the callee's capacity is being shared out, in
// which case it is the caller's smaller share, which the ratio enforces; an
// unbounded rule (or a hand-built NaN) announces nothing.
func quota(r *Rule) (q int64, exact float64, ok bool) {
	exact = min(r.AllowedRPS, r.LimitRPS)
	if !(exact >= 0) || math.IsInf(exact, 0) {
		return 0, 0, false
	}
	return int64(min(math.Floor(exact), maxSFInteger)), exact, true
}

// remaining is what an admitted response says is left of the quota, in whole
// requests, for a rule with quota exact at ratio p. A drop ratio is not a
// token bucket: the sidecar knows neither this second's count across the
// fleet nor a window boundary, only the global offered rate R of the last
// policy. So:
//   - at p > 0 the bucket is over its quota: 0;
//   - at p = 0 the fleet can send about quota − R more per second before
//     the ratio rises: that, rounded down, clamped to [0, quota]. It is the
//     whole fleet's headroom, shared by all the caller's instances, and it
//     is as old as the policy: at ratio 0 the controller re-issues a policy
//     only every half TTL or when something else changes, so R may be that
//     old; a rise past the quota is pushed at once (the ratio leaves 0).
func remaining(exact, p, offered float64) int64 {
	if p > 0 {
		return 0
	}
	left := math.Floor(exact - offered)
	if !(left > 0) { // also NaN
		return 0
	}
	return int64(min(left, math.Floor(exact), maxSFInteger))
}

// policyName is the name the RateLimit-Policy and RateLimit fields give the
// bucket of rule r of service that binds it, so that a caller told no can
// tell which of its buckets refused: "sluice" for a whole (service, peer)
// bucket, as before procedures; for a leaf, by its Bound, the leaf's path
// "service/peer/procedure" (e.g. "checkout/web/create-charge",
// "checkout/web//shop.Checkout/Pay"), its caller's limit across procedures
// "service/peer", its procedure's capacity "service/*/procedure", or the
// callee's capacity "service". Every byte of a valid name is allowed in a
// structured field's string unescaped ([A-Za-z0-9._/*-]); a hand-built
// rule's is quoted anyway.
func policyName(service string, r *Rule) string {
	if r.Procedure == "" {
		return "sluice"
	}
	switch r.Bound {
	case dropratio.BoundCaller:
		return service + "/" + r.Peer
	case dropratio.BoundProcedure:
		return service + "/*/" + r.Procedure
	case dropratio.BoundCallee:
		return service
	}
	return service + "/" + r.Peer + "/" + r.Procedure
}

// target names what a rejection under rule r of service refused access
// to, in the body of a 429 and the message of a RESOURCE_EXHAUSTED:
// "service checkout", for a leaf "procedure create-charge of service
// checkout", and for a leaf bound by a level above it that level's bucket
// too (see policyName): "procedure create-charge of service checkout
// (bucket checkout/web: the limit of caller web across procedures)".
func target(service string, r *Rule) string {
	if r.Procedure == "" {
		return "service " + service
	}
	t := "procedure " + r.Procedure + " of service " + service
	switch r.Bound {
	case dropratio.BoundCaller:
		return t + " (bucket " + policyName(service, r) + ": the limit of caller " + r.Peer + " across procedures)"
	case dropratio.BoundProcedure:
		return t + " (bucket " + policyName(service, r) + ": the capacity of procedure " + r.Procedure + ")"
	case dropratio.BoundCallee:
		return t + " (bucket " + policyName(service, r) + ": the capacity of service " + service + ")"
	}
	return t
}

// sfString renders s as a structured field string (RFC 9651): quoted,
// with '"' and '\' escaped and bytes outside printable ASCII left out.
func sfString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= ' ' && c <= '~':
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}

// renderQuota renders r's quota headers, under policy name name (see
// policyName), for a response that says remaining requests are left for
// reset seconds. ok is false when the rule has no quota: then only the
// RateLimit field is set.
func renderQuota(name string, r *Rule, rem int64, reset int) (h quotaHeaders, ok bool) {
	reset = min(max(reset, 0), MaxRetryAfter)
	q, _, ok := quota(r)
	sn := sfString(name)
	switch {
	case rem == 0 && name == "sluice":
		h.rateLimit = rateLimitZero[reset]
	default:
		h.rateLimit = []string{sn + `;r=` + strconv.FormatInt(rem, 10) + `;t=` + strconv.Itoa(reset)}
	}
	if !ok {
		return h, false
	}
	qs := strconv.FormatInt(q, 10)
	h.policy = []string{sn + `;q=` + qs + `;w=1`}
	h.xLimit = []string{qs + ", " + qs + ";w=1"}
	if rem == 0 {
		h.xRemaining = seconds[0]
	} else {
		h.xRemaining = []string{strconv.FormatInt(rem, 10)}
	}
	h.xReset = seconds[reset]
	return h, true
}

// setHTTP puts the headers of form into hdr. Canonical keys are assigned
// directly: no canonicalisation, no formatting, no allocation.
func (h *quotaHeaders) setHTTP(hdr http.Header, form RateLimitHeaders) {
	switch form {
	case DraftRateLimitHeaders:
		hdr["Ratelimit"] = h.rateLimit
		if h.policy != nil {
			hdr["Ratelimit-Policy"] = h.policy
		}
	case XRateLimitHeaders:
		if h.xLimit != nil {
			hdr["X-Ratelimit-Limit"] = h.xLimit
			hdr["X-Ratelimit-Remaining"] = h.xRemaining
			hdr["X-Ratelimit-Reset"] = h.xReset
		}
	}
}

// metadata returns the headers of form as gRPC metadata, plus extra (the
// x-envoy-ratelimited of a drop), or nil when there is nothing to send.
func (h *quotaHeaders) metadata(form RateLimitHeaders, extra metadata.MD) metadata.MD {
	md := metadata.MD{}
	for k, v := range extra {
		md[k] = v
	}
	switch form {
	case DraftRateLimitHeaders:
		md["ratelimit"] = h.rateLimit
		if h.policy != nil {
			md["ratelimit-policy"] = h.policy
		}
	case XRateLimitHeaders:
		if h.xLimit != nil {
			md["x-ratelimit-limit"] = h.xLimit
			md["x-ratelimit-remaining"] = h.xRemaining
			md["x-ratelimit-reset"] = h.xReset
		}
	}
	if len(md) == 0 {
		return nil
	}
	return md
}

// admitHeaders is what an admitted response from a caller may carry, by
// form, rendered once per rule (see RateLimitHeaders). Immutable.
type admitHeaders struct {
	quotaHeaders
	// The same as gRPC header metadata, for the server interceptors.
	grpcDraft, grpcX metadata.MD
}

// renderAdmit renders what an admitted request under r, at ratio p, is told;
// nil when it is told nothing: a rule without a quota (see quota), and a
// shadow rule, whose limit is not enforced: shadow mode must not change what
// callers see, and a client that slowed down on remaining 0 would be
// enforcing it.
//
// The limit is the quota; the window is 1 s (limits are per second);
// remaining is the rule in remaining; reset is 1 s at ratio 0 (the window)
// and the Retry-After of a drop above it, since the bucket has nothing left
// until the ratio is released.
func renderAdmit(service string, r *Rule, p float64) *admitHeaders {
	if r.Mode == dropratio.Shadow {
		return nil
	}
	_, exact, ok := quota(r)
	if !ok {
		return nil
	}
	reset := 1
	if p > 0 {
		reset = retryAfter(p, r.LimitRPS)
	}
	h := &admitHeaders{}
	h.quotaHeaders, _ = renderQuota(policyName(service, r), r, remaining(exact, p, r.OfferedRPS), reset)
	h.grpcDraft = h.metadata(DraftRateLimitHeaders, nil)
	h.grpcX = h.metadata(XRateLimitHeaders, nil)
	return h
}

// grpcHeader returns the header metadata of an admitted call in form; nil
// for none.
func (h *admitHeaders) grpcHeader(form RateLimitHeaders) metadata.MD {
	switch form {
	case DraftRateLimitHeaders:
		return h.grpcDraft
	case XRateLimitHeaders:
		return h.grpcX
	}
	return nil
}

// admitHeader returns the header metadata of a call admitted under v in
// form; nil for none, and for a nil v (no rule).
func (v *verdict) admitHeader(form RateLimitHeaders) metadata.MD {
	if v == nil || v.admit == nil {
		return nil
	}
	return v.admit.grpcHeader(form)
}

// Quota is what the rate-limit headers tell a caller of its bucket's quota,
// for an edge that renders them in another form (Envoy's rate limit
// service, sidecar/rls). See Rule.Quota.
type Quota struct {
	// Name names the bucket as RateLimit-Policy does (see policyName).
	Name string
	// Limit is the whole requests (units, for a policy counting cost) per
	// second the bucket may send now: min(allowed, limit).
	Limit int64
	// Remaining is what an admitted request is told is left of Limit:
	// 0 while the bucket's ratio is above 0; at ratio 0 the headroom of
	// the whole fleet per second, Limit less the bucket's global offered
	// rate as of the policy (see remaining). A drop ratio is not a token
	// bucket: this is an estimate, as old as the policy.
	Remaining int64
	// Reset is, at ratio 0, the 1 s window limits are counted in; above
	// it, the Retry-After of a drop: the seconds the controller needs to
	// release the ratio, 1 to MaxRetryAfter.
	Reset int
}

// Quota returns what r's headers tell a request of r's bucket of service
// (see renderAdmit), and false when they tell nothing: a rule without a
// bounded limit, and a shadow rule. It allocates the name; an edge renders
// it once per policy.
func (r *Rule) Quota(service string) (Quota, bool) {
	if r.Mode == dropratio.Shadow {
		return Quota{}, false
	}
	q, exact, ok := quota(r)
	if !ok {
		return Quota{}, false
	}
	p := clampRatio(r.DropRatio)
	reset := 1
	if p > 0 {
		reset = retryAfter(p, r.LimitRPS)
	}
	return Quota{Name: policyName(service, r), Limit: q, Remaining: remaining(exact, p, r.OfferedRPS), Reset: reset}, true
}
