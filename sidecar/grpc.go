package sidecar

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/pkg/health"
)

// GRPCOptions configure the server interceptors. The zero value is ready to
// use.
type GRPCOptions struct {
	// CallerHeader names the incoming metadata key that carries the
	// caller's service name; DefaultCallerHeader when empty. gRPC keys are
	// lower case; the name is lowered here. A call without it counts as
	// names.Unknown.
	CallerHeader string
	// Identify, when set, names the caller from what authenticates the
	// call (PeerTLSIdentity) instead of CallerHeader: see
	// HTTPOptions.Identify.
	Identify IdentifyContext
	// RejectMismatch: see HTTPOptions.RejectMismatch; the call fails with
	// PERMISSION_DENIED.
	RejectMismatch bool
	// TrustDecided: see HTTPOptions.TrustDecided.
	TrustDecided bool
	// RateLimitHeaders: see HTTPOptions.RateLimitHeaders. Admitted calls
	// carry the headers as header metadata (grpc.SetHeader), drops carry
	// them as trailer metadata next to the status. An admitted call whose
	// handler fails then sends those headers before its status instead of
	// answering trailers-only; a proxy that retries on a gRPC status reads
	// it from a trailers-only response (Envoy's retry-grpc-on does), so
	// such failures are no longer retried by it. The middleware in front
	// of a proxied app (the sidecar binary) does not change the form of
	// the app's answer.
	RateLimitHeaders RateLimitHeaders
	// StreamHealth has StreamServerInterceptor record each stream as the
	// unary interceptor records a call, for capacity from health (issue
	// #18): its duration and the status it ended with. The sidecar's gRPC
	// forwarder sets it: it sees every call, unary ones too, as a stream,
	// and its HTTP path records every request it forwards. In an app's own
	// server, streams are mostly long-lived and their durations say nothing
	// of its latency, so they are left out by default.
	StreamHealth bool
}

func (o GRPCOptions) rules() callerRules {
	return callerRules{authenticated: o.Identify != nil, rejectMismatch: o.RejectMismatch, trustDecided: o.TrustDecided}
}

func (o GRPCOptions) key() string {
	return strings.ToLower(cmp.Or(o.CallerHeader, DefaultCallerHeader))
}

// UnaryServerInterceptor enforces s's policy on inbound unary calls. A
// dropped call never reaches the handler and fails with RESOURCE_EXHAUSTED
// carrying a google.rpc.RetryInfo detail whose retry_delay is the
// Retry-After an HTTP drop gets (see retryAfter); its trailers-only response
// carries x-envoy-ratelimited: true, as Envoy's own rate-limit replies do,
// so that an Envoy in front does not retry it, plus the rate-limit headers
// of opts.RateLimitHeaders. An admitted call gets those headers as header
// metadata (see Middleware for which calls and what they say). With
// opts.TrustDecided, a call whose DecidedHeader names its caller reaches the
// handler undecided and uncounted (see Middleware). With opts.Identify and
// opts.RejectMismatch, a call whose caller header disagrees with its
// identity fails with PERMISSION_DENIED. A call the bucket admits is then
// decided by the policy's descriptors, which read its incoming metadata
// (x-forwarded-for for an xff source) and its peer's address: one that any
// drops fails with the descriptor's RESOURCE_EXHAUSTED status
// (DecideDescriptor renders it) and the trailers of a drop.
//
// The decision and the headers are rendered when the policy is installed;
// sluice allocates nothing per call for them, but grpc-go copies metadata
// handed to SetHeader and SetTrailer: each costs the call a map and a slice
// per key, next to what grpc-go allocates for every call anyway.
func (s *ServiceLimiter) UnaryServerInterceptor(opts GRPCOptions) grpc.UnaryServerInterceptor {
	in := s.incoming(opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		d, v, rec, err := in.decide(ctx, unaryMethod(info))
		if err != nil {
			return nil, err
		}
		if d.Drop {
			// The error only says that ctx has no stream (a caller
			// that runs the interceptor by hand): the status still
			// goes back.
			_ = grpc.SetTrailer(ctx, d.v.http.grpcTrailer(opts.RateLimitHeaders))
			return nil, d.v.grpcErr
		}
		if dv := in.s.decideDescriptorsGRPC(ctx); dv != nil {
			d.Done(0, false)                                                     // refused after all: it holds its slot no longer
			_ = grpc.SetTrailer(ctx, dv.http.grpcTrailer(opts.RateLimitHeaders)) // as above
			return nil, dv.grpcErr
		}
		if md := v.admitHeader(opts.RateLimitHeaders); md != nil {
			_ = grpc.SetHeader(ctx, md) // as above; or the handler has sent headers: it has not run yet
		}
		// What the app did with the call, for capacity from health
		// (issue #18), as serveUpstream counts a proxied request: its
		// latency and how it ended, by the status the caller gets. A
		// handler that panics is counted as failed (in process, a panic
		// is the app's, where the proxy's means the caller went away),
		// and the panic goes on.
		rec.Start()
		began := time.Now()
		outcome := health.Failed
		defer func() { rec.Done(time.Since(began), outcome) }()
		var resp any
		switch {
		case d.flags()&responsePriced != 0:
			resp, err = in.s.unaryCosted(ctx, req, handler, d)
		case d.pending():
			defer d.Done(0, false) // after the handler, returned or panicked
			resp, err = handler(ctx, req)
		default:
			resp, err = handler(ctx, req)
		}
		outcome = health.GRPCOutcome(uint32(callStatus(err)))
		return resp, err
	}
}

// callStatus is the code the caller of a handler that returned err gets:
// grpc-go turns a bare context error into CANCELLED or DEADLINE_EXCEEDED
// (status.FromContextError), which status.Code alone reads as UNKNOWN, a
// failure of the app's, where the caller went away or ran out of time.
func callStatus(err error) codes.Code {
	c := status.Code(err)
	if c == codes.Unknown {
		switch {
		case errors.Is(err, context.Canceled):
			return codes.Canceled
		case errors.Is(err, context.DeadlineExceeded):
			return codes.DeadlineExceeded
		}
	}
	return c
}

// StreamServerInterceptor enforces s's policy on inbound streams, once per
// stream when it opens, the way UnaryServerInterceptor does per call.
func (s *ServiceLimiter) StreamServerInterceptor(opts GRPCOptions) grpc.StreamServerInterceptor {
	in := s.incoming(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		d, v, rec, err := in.decide(ss.Context(), streamMethod(info))
		if err != nil {
			return err
		}
		if d.Drop {
			ss.SetTrailer(d.v.http.grpcTrailer(opts.RateLimitHeaders))
			return d.v.grpcErr
		}
		if dv := in.s.decideDescriptorsGRPC(ss.Context()); dv != nil {
			d.Done(0, false) // refused after all
			ss.SetTrailer(dv.http.grpcTrailer(opts.RateLimitHeaders))
			return dv.grpcErr
		}
		if md := v.admitHeader(opts.RateLimitHeaders); md != nil {
			_ = ss.SetHeader(md) // fails only once headers are sent, and the handler has not run
		}
		if !opts.StreamHealth {
			return in.s.serveStream(srv, ss, handler, d)
		}
		// As the unary interceptor counts a call; a panic counts as failed.
		rec.Start()
		began := time.Now()
		outcome := health.Failed
		defer func() { rec.Done(time.Since(began), outcome) }()
		err = in.s.serveStream(srv, ss, handler, d)
		outcome = health.GRPCOutcome(uint32(callStatus(err)))
		return err
	}
}

// serveStream runs the handler of an admitted stream decided by d.
func (s *ServiceLimiter) serveStream(srv any, ss grpc.ServerStream, handler grpc.StreamHandler, d Decision) error {
	switch {
	case d.flags()&responsePriced != 0:
		return s.streamCosted(srv, ss, handler, d)
	case d.pending():
		defer d.Done(0, false)
	}
	return handler(srv, ss)
}

// incoming is what the server interceptors decide calls with.
type incoming struct {
	s        *ServiceLimiter
	key      string
	identify IdentifyContext
	rules    callerRules
	refusal  error // PERMISSION_DENIED for a mismatch under RejectMismatch
}

func (s *ServiceLimiter) incoming(opts GRPCOptions) *incoming {
	return &incoming{s: s, key: opts.key(), identify: opts.Identify, rules: opts.rules(), refusal: renderRefusal(s.name).grpcErr}
}

// decide decides an inbound call of fullMethod, in the leaf of that
// procedure when the policy declares it (see DecideGRPC) and of the tier
// its criticality metadata and the policy's defaults give it when the
// policy has criticality (see DecideGRPCTier), unless its caller
// decided it already (see resolveCaller): then it admits it uncounted. v is
// the verdict of the caller's rule either way (nil: none), for the headers
// of an admitted call; err refuses the call before any decision.
func (in *incoming) decide(ctx context.Context, fullMethod string) (d Decision, v *verdict, rec *health.Recorder, err error) {
	var id string
	res := Authenticated
	if in.identify != nil {
		id, res = in.identify(ctx)
	}
	t := in.s.table.Load()
	caller, decided, reject := in.s.resolveCaller(in.rules, callerFromContext(ctx, in.key), id, res,
		metadata.ValueFromIncomingContext(ctx, DecidedHeader), t.fineLeaves())
	if reject {
		return Decision{}, nil, nil, in.refusal
	}
	idx := t.procs.grpc(fullMethod)
	if decided { // never with criticality: see fineLeaves
		return Decision{}, in.s.verdictOf(t, caller, idx), t.health[idx], nil
	}
	var tier string
	if t.crit != nil {
		// grpc-go copies the value's slice: one small allocation, for
		// services with criticality only (see grpcValue).
		tier = callerFromContext(ctx, t.crit.header)
	}
	var raw string
	if c := t.cost; c != nil && c.reqKey != "" {
		raw = callerFromContext(ctx, c.reqKey) // copies the value's slice, as the tier's
	}
	d = in.s.decide(t, caller, idx, tier, raw, 0)
	return d, d.v, t.health[idx], nil
}

// unaryMethod and streamMethod return a call's full method; "" (names.Other)
// for a caller that runs an interceptor by hand without its info.
func unaryMethod(info *grpc.UnaryServerInfo) string {
	if info == nil {
		return ""
	}
	return info.FullMethod
}

func streamMethod(info *grpc.StreamServerInfo) string {
	if info == nil {
		return ""
	}
	return info.FullMethod
}

// callerFromContext returns the first value of the incoming metadata key
// of ctx, "" when it has none: the caller's name, or a tier.
func callerFromContext(ctx context.Context, key string) string {
	if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// renderGRPC builds the rejection of rule r once, telling the caller to
// retry after retry seconds. The error is shared by every rejected call
// under the rule; gRPC only reads it.
func renderGRPC(service string, r *Rule, retry int) error {
	st := status.New(codes.ResourceExhausted,
		"call from caller "+r.Peer+" to "+target(service, r)+" was rate limited by sluice")
	withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(retry) * time.Second)})
	if err != nil { // marshalling a RetryInfo does not fail; keep the bare status if it ever does
		return st.Err()
	}
	return withInfo.Err()
}
