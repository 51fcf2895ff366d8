// Package rls answers Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService, ShouldRateLimit) from a
// sidecar's local limiter: the fourth way a data plane asks sluice (see
// docs/dataplanes.md). Envoy's ratelimit filter, pointed at a cluster on
// localhost, sends each request's descriptors; the Service decides them
// with the sidecar.ServiceLimiter the proxy port decides with, so each
// call is counted, reported and limited exactly as a proxied request is,
// and no call waits on the network.
//
// # Mapping
//
// A request's domain names the callee: Mapping.Domain, the sidecar's
// service by default; any other domain is answered OK for every
// descriptor, as envoyproxy/ratelimit answers a domain it has no
// configuration for, and counted as unmapped. In each descriptor:
//
//   - the entry of key Mapping.CallerKey (source_cluster) names the caller;
//   - Mapping.ProcedureKey (path) is the request's path, or a gRPC call's
//     full method, and Mapping.MethodKey (method) its HTTP method: the
//     policy's routes and procedures find its procedure, as DecideHTTP
//     does (a query string is cut off);
//   - Mapping.TierKey, when set, is the request's tier header's value;
//   - an entry whose key names one of the policy's descriptors (issue #15),
//     directly or through Mapping.Descriptors, is that descriptor's value;
//   - any other entry is ignored.
//
// A descriptor with a caller, procedure or method entry is one decision
// of its bucket (a missing caller is names.Unknown, as a request without
// a caller header is); Envoy should name the caller in one descriptor per
// request, or the request counts once per such descriptor. Once no
// bucket dropped the call, every descriptor of the policy decides it, as
// the proxy decides them after the bucket: by the first entry that
// carries its value, or as descriptor.Missing when none does (a value
// that drops it marks its own descriptor OVER_LIMIT, a missing one the
// first bucket's). A call with neither a bucket nor a value decides no
// descriptor. A descriptor with none of the
// keys maps to no sluice bucket: OK with no limit, as envoyproxy/ratelimit
// answers an unconfigured descriptor, counted as unmapped.
//
// hits_addend (the descriptor's, else the request's) is the request's cost
// for a policy counting cost (unit: cost): its price, clamped to the
// policy's max. A policy counting requests counts one request per
// decision, whatever hits_addend says (counted in
// sluice_sidecar_rls_hits_ignored_total): its limits are in requests, and
// a call is one request. hits_addend 0, Envoy's default, prices the
// request as the proxy would (the procedure's static cost, else the
// default).
//
// Envoy never tells the service when the request it asked about ends, so
// a decision that holds a concurrency slot gives it back at once: caps
// (max_concurrency) do not limit through this API, and a policy priced by
// its responses counts each request at its price.
package rls

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/sidecar"
)

// Bounds on a request: a call beyond them is refused with
// INVALID_ARGUMENT (Envoy's filter then follows its failure_mode_deny)
// and counted. Envoy sends one descriptor per rate_limits action list,
// a handful.
const (
	// MaxDescriptors is the most descriptors a call may carry.
	MaxDescriptors = 64
	// MaxEntries is the most entries a descriptor may carry.
	MaxEntries = 32
	// MaxPathLen is the longest procedure entry matched against the
	// policy's routes; a longer one is names.Other's (counted as folded).
	MaxPathLen = 4096
	// MaxRecvMsgSize bounds a call's size on the wire, for the server's
	// grpc.MaxRecvMsgSize: MaxDescriptors descriptors of MaxEntries
	// entries of about 30 bytes each fit.
	MaxRecvMsgSize = 64 << 10
)

// Mapping says how a ShouldRateLimit call maps to sluice's buckets. See
// the package comment.
type Mapping struct {
	// Domain is the request domain that names the sidecar's service.
	Domain string
	// CallerKey is the entry key that names the caller: source_cluster
	// by default (Envoy's source_cluster action).
	CallerKey string
	// ProcedureKey is the entry key of the request's path or gRPC full
	// method: path by default (a request_headers action on :path).
	ProcedureKey string
	// MethodKey is the entry key of the request's HTTP method: method by
	// default (a request_headers action on :method).
	MethodKey string
	// TierKey, when set, is the entry key of the request's tier
	// (criticality) header's value.
	TierKey string
	// Descriptors maps a policy descriptor's name to the entry key that
	// carries its value, when the key is not the name itself.
	Descriptors map[string]string
	// Headers has the response carry x-ratelimit-limit,
	// x-ratelimit-remaining and x-ratelimit-reset, for the descriptor
	// with the least remaining, as envoyproxy/ratelimit does with
	// LIMIT_RESPONSE_HEADERS_ENABLED.
	Headers bool
}

// DefaultMapping returns the defaults for service: the keys Envoy's
// actions give (see Mapping).
func DefaultMapping(service string) Mapping {
	return Mapping{Domain: service, CallerKey: "source_cluster", ProcedureKey: "path", MethodKey: "method"}
}

// maxKeyLen bounds a configured entry key.
const maxKeyLen = 128

// Validate reports every problem of m at once, by field.
func (m Mapping) Validate() error {
	var errs []error
	if m.Domain == "" {
		errs = append(errs, errors.New("Domain: required: the domain Envoy's ratelimit filter sends"))
	}
	seen := map[string]string{}
	key := func(field, k string, required bool) {
		switch {
		case k == "" && required:
			errs = append(errs, fmt.Errorf("%s: required", field))
			return
		case k == "":
			return
		case len(k) > maxKeyLen || strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			errs = append(errs, fmt.Errorf("%s: %q is not an entry key: at most %d bytes, no spaces or control characters", field, k, maxKeyLen))
			return
		}
		if other, ok := seen[k]; ok {
			errs = append(errs, fmt.Errorf("%s: key %q is %s's already", field, k, other))
			return
		}
		seen[k] = field
	}
	key("CallerKey", m.CallerKey, true)
	key("ProcedureKey", m.ProcedureKey, false)
	key("MethodKey", m.MethodKey, false)
	key("TierKey", m.TierKey, false)
	for _, name := range slices.Sorted(maps.Keys(m.Descriptors)) {
		if err := descriptor.CheckName(name); err != nil {
			errs = append(errs, fmt.Errorf("Descriptors: %q: %w", name, err))
		}
		key(fmt.Sprintf("Descriptors: %q", name), m.Descriptors[name], true)
	}
	return errors.Join(errs...)
}

// Service is the rate limit service of one sidecar.ServiceLimiter. Safe
// for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc *sidecar.ServiceLimiter
	m   Mapping
	// byKey is Mapping.Descriptors inverted: entry key to descriptor name.
	byKey map[string]string

	// cache is the current policy's statuses, rendered once per policy.
	cache atomic.Pointer[statusCache]
	mu    sync.Mutex // serialises builders of cache

	requests  [2]prometheus.Counter // by overall code: ok, over limit
	descs     [2]prometheus.Counter // descriptors decided, by code
	unmapped  [2]prometheus.Counter // by reason: domain, descriptor
	rejected  [2]prometheus.Counter // by reason: descriptors, entries
	folded    prometheus.Counter
	hitsIgnrd prometheus.Counter
}

// Reasons, the indexes of Service.unmapped and Service.rejected.
const (
	unmappedDomain     = 0
	unmappedDescriptor = 1
	tooManyDescriptors = 0
	tooManyEntries     = 1
)

// New returns the service deciding with svc under mapping m, its metrics
// registered with reg (nil: none). m must be valid (Validate).
func New(svc *sidecar.ServiceLimiter, m Mapping, reg prometheus.Registerer) (*Service, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	s := &Service{svc: svc, m: m, byKey: map[string]string{}}
	for name, k := range m.Descriptors {
		s.byKey[k] = name
	}
	labels := prometheus.Labels{"service": svc.Name()}
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sidecar_rls_requests_total", ConstLabels: labels,
		Help: "ShouldRateLimit calls answered, by overall code (ok, over_limit)."}, []string{"code"})
	descs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sidecar_rls_descriptors_total", ConstLabels: labels,
		Help: "Descriptors of ShouldRateLimit calls answered, by code (ok, over_limit); unmapped ones included as ok."}, []string{"code"})
	unmapped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sidecar_rls_unmapped_total", ConstLabels: labels,
		Help: "Descriptors answered OK with no limit because they map to no sluice bucket, by reason: domain (another domain), descriptor (no mapped key)."}, []string{"reason"})
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sidecar_rls_rejected_total", ConstLabels: labels,
		Help: "ShouldRateLimit calls refused with INVALID_ARGUMENT, by reason: descriptors (more than 64), entries (a descriptor of more than 32)."}, []string{"reason"})
	s.folded = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_sidecar_rls_folded_total", ConstLabels: labels,
		Help: "Procedure entries longer than 4096 bytes, decided as the _other procedure."})
	s.hitsIgnrd = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_sidecar_rls_hits_ignored_total", ConstLabels: labels,
		Help: "Decisions whose hits_addend above 1 counted as one request: the policy counts requests, not cost."})
	s.requests = [2]prometheus.Counter{reqs.WithLabelValues("ok"), reqs.WithLabelValues("over_limit")}
	s.descs = [2]prometheus.Counter{descs.WithLabelValues("ok"), descs.WithLabelValues("over_limit")}
	s.unmapped = [2]prometheus.Counter{unmapped.WithLabelValues("domain"), unmapped.WithLabelValues("descriptor")}
	s.rejected = [2]prometheus.Counter{rejected.WithLabelValues("descriptors"), rejected.WithLabelValues("entries")}
	if reg != nil {
		for _, c := range []prometheus.Collector{reqs, descs, unmapped, rejected, s.folded, s.hitsIgnrd} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register rls metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Register registers s with g.
func (s *Service) Register(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// ServerOptions are the options a server serving s should have: its
// messages bounded by MaxRecvMsgSize.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRecvMsgSize)}
}

// The statuses of a descriptor that maps to no limit, and the overall
// codes: shared by every response, never modified.
var (
	unlimitedOK   = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	unlimitedOver = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
)

// ShouldRateLimit decides every descriptor of req with the local limiter
// and answers at once; see the package comment for the mapping.
//
// Each descriptor's status says, besides its code:
//   - current_limit: the bucket's limit as sluice announces it in its
//     rate-limit headers, requests (or units) per SECOND: min(allowed,
//     limit), the caller's share of the callee's capacity while that is
//     shared out; absent for a bucket the policy does not bound (and for
//     a descriptor that maps to none);
//   - limit_remaining: a drop ratio is not a counter, and a sidecar knows
//     neither the fleet's count in this second nor a window's start: 0
//     while the bucket's ratio is above 0 (it is over its limit, and some
//     of its requests are dropped, this one or not); at ratio 0 the
//     fleet's headroom, the limit less the bucket's global offered rate
//     as of the last policy (sidecar.Quota): how much more per second
//     the caller's instances together can send before the ratio rises;
//   - duration_until_reset: 1 s (the window limits are counted in) at
//     ratio 0; above it, the time the controller needs to release the
//     ratio if the caller slows down to its limit, as a drop's
//     Retry-After.
//
// A policy descriptor's value (tenant) that drops the request is
// OVER_LIMIT with that descriptor's limit, 0 remaining, 1 s to reset;
// one that admits it adds nothing to the descriptor's status: its count
// is the sketch's, per sidecar, not a fleet-wide count sluice can state.
//
// It allocates the response and its statuses slice, nothing per
// descriptor once the policy's statuses are rendered (once per policy).
func (s *Service) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ds := req.GetDescriptors()
	if len(ds) > MaxDescriptors {
		s.rejected[tooManyDescriptors].Inc()
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d", len(ds), MaxDescriptors)
	}
	for _, d := range ds {
		if len(d.GetEntries()) > MaxEntries {
			s.rejected[tooManyEntries].Inc()
			return nil, status.Errorf(codes.InvalidArgument, "a descriptor of %d entries: at most %d", len(d.GetEntries()), MaxEntries)
		}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	if len(ds) == 0 {
		s.requests[0].Inc()
		return resp, nil
	}
	resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))
	if req.GetDomain() != s.m.Domain {
		for i := range resp.Statuses {
			resp.Statuses[i] = unlimitedOK
		}
		s.unmapped[unmappedDomain].Add(float64(len(ds)))
		s.descs[0].Add(float64(len(ds)))
		s.requests[0].Inc()
		return resp, nil
	}
	c := s.statuses()
	hits := uint64(req.GetHitsAddend())
	// First the buckets, then, unless one dropped the request, the
	// policy descriptors' values: the proxy's order.
	var valued uint64 // descriptors with a policy descriptor's entry, by index
	first := -1       // the first descriptor decided in a bucket
	dropped := false
	// The headers of the decided bucket with the least remaining.
	var hdr []*corev3.HeaderValue
	least := int64(-1)
	for i, d := range ds {
		var peer, method, path, tier string
		bucket := false
		for _, e := range d.GetEntries() {
			k := e.GetKey()
			if k == "" { // no configured key is empty: the unset ones are
				continue
			}
			switch k {
			case s.m.CallerKey:
				peer, bucket = e.GetValue(), true
			case s.m.ProcedureKey:
				path, bucket = e.GetValue(), true
			case s.m.MethodKey:
				method, bucket = e.GetValue(), true
			case s.m.TierKey:
				tier = e.GetValue()
			default:
				if c.descIndex(s.descName(k)) >= 0 {
					valued |= 1 << i
				}
			}
		}
		if !bucket {
			resp.Statuses[i] = unlimitedOK
			if valued&(1<<i) == 0 {
				s.unmapped[unmappedDescriptor].Inc()
			}
			continue
		}
		if first < 0 {
			first = i
		}
		if len(path) > MaxPathLen {
			path = ""
			s.folded.Inc()
		} else if q := strings.IndexByte(path, '?'); q >= 0 {
			path = path[:q]
		}
		h := hits
		if dh := d.GetHitsAddend(); dh != nil {
			h = dh.GetValue()
		}
		if h > 1 && !c.cost {
			s.hitsIgnrd.Inc()
		}
		dec := s.svc.DecideHits(peer, method, path, tier, h)
		// Envoy does not say when the request ends: give back its slot
		// now (see the package comment).
		dec.Done(0, false)
		rs := c.rule(s, dec.Rule())
		st, hv, rem := rs.ok, rs.okHdr, rs.q.Remaining
		if dec.Drop {
			dropped = true
			st, hv, rem = rs.over, rs.overHdr, 0
		}
		resp.Statuses[i] = st
		if hv != nil && (least < 0 || rem < least) {
			hdr, least = hv, rem
		}
	}
	if !dropped && (first >= 0 || valued != 0) {
		// As the proxy: every descriptor of the policy decides the
		// request its buckets admitted, a value the call does not carry
		// as descriptor.Missing.
		for j := range c.descs {
			value, at := s.valueOf(ds, valued, c.descs[j].name)
			if dec := s.svc.DecideDescriptor(c.descs[j].index, value); dec.Drop {
				dropped = true
				if at < 0 {
					at = first
				}
				if at >= 0 {
					resp.Statuses[at] = c.descs[j].over
				}
			}
		}
	}
	overall := 0
	if dropped {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		overall = 1
	}
	over := 0
	for _, st := range resp.Statuses {
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			over++
		}
	}
	s.descs[0].Add(float64(len(ds) - over))
	if over > 0 {
		s.descs[1].Add(float64(over))
	}
	s.requests[overall].Inc()
	if s.m.Headers {
		resp.ResponseHeadersToAdd = hdr
	}
	return resp, nil
}

// valueOf returns the value of the policy descriptor name in the first of
// ds's descriptors valued marks that carries it, and that descriptor's
// index; "" and -1 when none does.
func (s *Service) valueOf(ds []*ratelimitv3.RateLimitDescriptor, valued uint64, name string) (string, int) {
	for i, d := range ds {
		if valued&(1<<i) == 0 {
			continue
		}
		for _, e := range d.GetEntries() {
			k := e.GetKey()
			if k == "" || k == s.m.CallerKey || k == s.m.ProcedureKey || k == s.m.MethodKey || k == s.m.TierKey {
				continue
			}
			if s.descName(k) == name {
				return e.GetValue(), i
			}
		}
	}
	return "", -1
}

// descName returns the policy descriptor name entry key k stands for.
func (s *Service) descName(k string) string {
	if name, ok := s.byKey[k]; ok {
		return name
	}
	return k
}

// statusCache is one policy's statuses, rendered once. Immutable.
type statusCache struct {
	policy *sidecar.Policy
	cost   bool // the policy counts cost
	rules  map[*sidecar.Rule]*ruleStatus
	descs  []descStatus
	// extra holds the statuses of rules that are not the policy's own
	// (*sidecar.Rule → *ruleStatus): the provisional ratios a surge
	// projection lays over it (sidecar/provisional.go) are copies. At
	// most maxExtra; past that each is rendered per call.
	extra  sync.Map
	extras atomic.Int32
}

// maxExtra bounds statusCache.extra: a policy's rules, several surges
// over. A new policy starts a new cache.
const maxExtra = 4096

// ruleStatus is what a decision under one rule answers.
type ruleStatus struct {
	q              sidecar.Quota
	ok, over       *rlsv3.RateLimitResponse_DescriptorStatus
	okHdr, overHdr []*corev3.HeaderValue // nil: the rule announces no quota
}

// descStatus is one policy descriptor's.
type descStatus struct {
	name  string
	index int // DecideDescriptor's
	over  *rlsv3.RateLimitResponse_DescriptorStatus
}

// noRule is a decision's without a rule: no limit.
var noRule = ruleStatus{ok: unlimitedOK, over: unlimitedOver}

// statuses returns the current policy's statuses, rendering them when the
// policy has changed.
func (s *Service) statuses() *statusCache {
	p := s.svc.Policy()
	if c := s.cache.Load(); c != nil && c.policy == p {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p = s.svc.Policy()
	if c := s.cache.Load(); c != nil && c.policy == p {
		return c
	}
	c := &statusCache{policy: p, cost: s.svc.CountsCost(), rules: map[*sidecar.Rule]*ruleStatus{}}
	if p != nil {
		for i := range p.Peers {
			c.rules[&p.Peers[i]] = renderRule(s.svc.Name(), &p.Peers[i])
		}
		for i := range p.Descriptors {
			d := &p.Descriptors[i]
			c.descs = append(c.descs, descStatus{name: d.Name, index: i, over: &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit:       limitOf(d.Name, d.LimitRPS),
				DurationUntilReset: durationpb.New(time.Second),
			}})
		}
	}
	s.cache.Store(c)
	return c
}

// rule returns the status of a decision under r (nil: none), rendered
// now if r is not the cached policy's (a policy installed since).
func (c *statusCache) rule(s *Service, r *sidecar.Rule) *ruleStatus {
	if r == nil {
		return &noRule
	}
	if rs, ok := c.rules[r]; ok {
		return rs
	}
	if rs, ok := c.extra.Load(r); ok {
		return rs.(*ruleStatus)
	}
	rs := renderRule(s.svc.Name(), r)
	if c.extras.Add(1) <= maxExtra {
		c.extra.Store(r, rs)
	}
	return rs
}

// descIndex returns the index in c.descs of the descriptor named name, -1
// for none.
func (c *statusCache) descIndex(name string) int {
	for i := range c.descs {
		if c.descs[i].name == name {
			return i
		}
	}
	return -1
}

// renderRule renders the statuses of rule r of service.
func renderRule(service string, r *sidecar.Rule) *ruleStatus {
	q, ok := r.Quota(service)
	if !ok {
		return &noRule
	}
	reset := durationpb.New(time.Duration(q.Reset) * time.Second)
	limit := limitOf(q.Name, float64(q.Limit))
	rs := &ruleStatus{q: q,
		ok: &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: limit,
			LimitRemaining: clampU32(q.Remaining), DurationUntilReset: reset},
		over: &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: limit,
			DurationUntilReset: reset},
	}
	rs.okHdr = headers(q.Limit, q.Remaining, q.Reset)
	rs.overHdr = headers(q.Limit, 0, q.Reset)
	return rs
}

// headers renders the x-ratelimit-* headers as envoyproxy/ratelimit does:
// the limit with its window ("10, 10;w=1"), the remaining and the seconds
// to reset.
func headers(limit, remaining int64, reset int) []*corev3.HeaderValue {
	l := strconv.FormatInt(limit, 10)
	return []*corev3.HeaderValue{
		{Key: "x-ratelimit-limit", Value: l + ", " + l + ";w=1"},
		{Key: "x-ratelimit-remaining", Value: strconv.FormatInt(remaining, 10)},
		{Key: "x-ratelimit-reset", Value: strconv.Itoa(reset)},
	}
}

// limitOf is a current_limit of rps per SECOND named name; nil for an
// unbounded one.
func limitOf(name string, rps float64) *rlsv3.RateLimitResponse_RateLimit {
	if !(rps >= 0) || rps > float64(^uint32(0)) {
		return nil
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(rps), Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
}

func clampU32(v int64) uint32 {
	return uint32(min(max(v, 0), int64(^uint32(0))))
}
