package sidecar

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Headers of a throttled response of a service counting cost, as Shopify's
// GraphQL API tells a client its request's cost and its bucket's restore
// rate.
const (
	// CostResponseHeader carries the price of the throttled request, in units,
	// when the sidecar knew it before (a static or request-header price).
	CostResponseHeader = "x-sluice-cost"
	// RestoreRateHeader carries the bucket's limit, in units per second.
	RestoreRateHeader = "x-sluice-restore-rate"

	httpCostKey    = "X-Sluice-Cost"
	httpRestoreKey = "X-Sluice-Restore-Rate"
)

// decorate finishes the verdict v of a rule of procedure index proc for c
// (nil: nothing to do): it renders the concurrency refusal of a capped rule
// and, for a service counting cost, adds the cost headers to the
// rejections: the rule's static price when a request of its leaf has one
// (no response header; a request-header price is echoed by the edge) and
// the bucket's limit as its restore rate.
func (c *costTable) decorate(service string, dir Direction, v *verdict, proc uint32) {
	if c == nil {
		return
	}
	r := v.rule
	if r.MaxConcurrency > 0 && !r.upstream() {
		v.conc = renderConcurrency(service, dir, r, v.shadow)
	}
	if !c.priced {
		return
	}
	var cost, restore []string
	if p := c.static[proc]; p != noStatic {
		cost = []string{strconv.FormatFloat(float64(p)/1000, 'f', -1, 64)}
	}
	if isLimit(r.LimitRPS) {
		restore = []string{strconv.FormatFloat(r.LimitRPS, 'f', -1, 64)}
	}
	for _, h := range []*httpRejection{v.http, v.conc.rejection()} {
		if h == nil {
			continue
		}
		h.cost, h.restore = cost, restore
		for _, md := range []metadata.MD{h.grpcTrailerDraft, h.grpcTrailerX} {
			if cost != nil {
				md[CostResponseHeader] = cost
			}
			if restore != nil {
				md[RestoreRateHeader] = restore
			}
		}
	}
}

func (v *verdict) rejection() *httpRejection {
	if v == nil {
		return nil
	}
	return v.http
}

// renderConcurrency renders the verdict of a request of rule r refused
// because the sidecar's share of its concurrency cap is taken: 429 with
// Retry-After 1 (a slot frees when a request completes), or
// RESOURCE_EXHAUSTED with a RetryInfo of 1 s, with the rate-limit headers
// of a drop.
func renderConcurrency(service string, dir Direction, r *Rule, shadow bool) *verdict {
	v := &verdict{rule: r, kind: kindEnforce, shadow: shadow}
	if shadow {
		return v // admitted: nothing to render
	}
	from, to := r.Peer, service
	if dir == Outbound {
		from, to = service, r.Peer
	}
	rr := *r
	rr.Peer = from
	what := "request from caller " + from + " to " + target(to, &rr) + " was refused by sluice: its bucket has as many requests in flight as its concurrency cap allows"
	st, err := status.New(codes.ResourceExhausted, what).WithDetails(retryInfo(MinRetryAfter))
	if err != nil {
		st = status.New(codes.ResourceExhausted, what)
	}
	v.grpcErr = st.Err()
	v.http = renderHTTP(to, &rr, MinRetryAfter, v.grpcErr)
	v.http.body = []byte(what + "\n")
	v.http.contentLength = []string{strconv.Itoa(len(v.http.body))}
	return v
}

// trailerCost is the call's ServerTransportStream, seeing the metadata
// its handler sets, for the cost its response reports (a header or a
// trailer: the last value set).
type trailerCost struct {
	grpc.ServerTransportStream
	key string
	raw string
	set bool
}

func (t *trailerCost) see(md metadata.MD) {
	if v := md[t.key]; len(v) > 0 {
		t.raw, t.set = v[len(v)-1], true
	}
}

func (t *trailerCost) SetHeader(md metadata.MD) error {
	t.see(md)
	return t.ServerTransportStream.SetHeader(md)
}

func (t *trailerCost) SendHeader(md metadata.MD) error {
	t.see(md)
	return t.ServerTransportStream.SendHeader(md)
}

func (t *trailerCost) SetTrailer(md metadata.MD) error {
	t.see(md)
	return t.ServerTransportStream.SetTrailer(md)
}

// costServerStream is a stream whose handler's metadata t sees, through the
// stream's methods and through its context (grpc.SetTrailer).
type costServerStream struct {
	grpc.ServerStream
	ctx context.Context
	t   trailerCost
}

func (s *costServerStream) Context() context.Context { return s.ctx }

func (s *costServerStream) SetHeader(md metadata.MD) error {
	s.t.see(md)
	return s.ServerStream.SetHeader(md)
}

func (s *costServerStream) SendHeader(md metadata.MD) error {
	s.t.see(md)
	return s.ServerStream.SendHeader(md)
}

func (s *costServerStream) SetTrailer(md metadata.MD) {
	s.t.see(md)
	s.ServerStream.SetTrailer(md)
}

// responseKey returns the metadata key the current policy's responses
// report their cost in; "": none.
func (s *ServiceLimiter) responseKey() string {
	if c := s.table.Load().cost; c != nil {
		return c.respKey
	}
	return ""
}

// unaryCosted runs the handler of a unary call d admitted and priced by its
// response, seeing the metadata it sets, and calls Done with the cost it
// reported. It costs the call two allocations (the stream's wrapper and a
// context holding it), next to the dozens grpc-go makes per call.
func (s *ServiceLimiter) unaryCosted(ctx context.Context, req any, handler grpc.UnaryHandler, d Decision) (resp any, err error) {
	tc := &trailerCost{key: s.responseKey()}
	if ts := grpc.ServerTransportStreamFromContext(ctx); ts != nil {
		tc.ServerTransportStream = ts
		ctx = grpc.NewContextWithServerTransportStream(ctx, tc)
	}
	defer func() { d.doneRaw(tc.raw, tc.set) }()
	return handler(ctx, req)
}

// streamCosted is unaryCosted for a stream: the wrapper and a context, two
// allocations per stream.
func (s *ServiceLimiter) streamCosted(srv any, ss grpc.ServerStream, handler grpc.StreamHandler, d Decision) error {
	cs := &costServerStream{ServerStream: ss, ctx: ss.Context(), t: trailerCost{key: s.responseKey()}}
	if ts := grpc.ServerTransportStreamFromContext(cs.ctx); ts != nil {
		cs.t.ServerTransportStream = ts
		cs.ctx = grpc.NewContextWithServerTransportStream(cs.ctx, &cs.t)
	}
	defer func() { d.doneRaw(cs.t.raw, cs.t.set) }()
	return handler(srv, cs)
}

// retryInfo is a RetryInfo detail of sec seconds.
func retryInfo(sec int) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(sec) * time.Second)}
}
