package sidecar

import (
	"cmp"
	"context"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// GRPCOptions configure the server interceptors. The zero value is ready to
// use.
type GRPCOptions struct {
	// CallerHeader names the incoming metadata key that carries the
	// caller's service name; DefaultCallerHeader when empty. gRPC keys are
	// lower case; the name is lowered here. A call without it counts as
	// names.Unknown.
	CallerHeader string
	// IgnoreDecided: see HTTPOptions.IgnoreDecided.
	IgnoreDecided bool
}

func (o GRPCOptions) key() string {
	return strings.ToLower(cmp.Or(o.CallerHeader, DefaultCallerHeader))
}

// UnaryServerInterceptor enforces s's policy on inbound unary calls. A
// dropped call never reaches the handler and fails with RESOURCE_EXHAUSTED
// carrying a google.rpc.RetryInfo detail. A call whose DecidedHeader names
// its caller reaches the handler undecided and uncounted (see Middleware).
func (s *ServiceLimiter) UnaryServerInterceptor(opts GRPCOptions) grpc.UnaryServerInterceptor {
	key := opts.key()
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if d := s.decideIncoming(ctx, key, opts.IgnoreDecided); d.Drop {
			return nil, d.v.grpcErr
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor enforces s's policy on inbound streams, once per
// stream when it opens, the way UnaryServerInterceptor does per call.
func (s *ServiceLimiter) StreamServerInterceptor(opts GRPCOptions) grpc.StreamServerInterceptor {
	key := opts.key()
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if d := s.decideIncoming(ss.Context(), key, opts.IgnoreDecided); d.Drop {
			return d.v.grpcErr
		}
		return handler(srv, ss)
	}
}

// decideIncoming decides an inbound call, unless its caller decided it
// already (and ignoreDecided is off): then it admits it uncounted.
func (s *ServiceLimiter) decideIncoming(ctx context.Context, key string, ignoreDecided bool) Decision {
	caller := callerFromContext(ctx, key)
	if !ignoreDecided && decidedUpstream(metadata.ValueFromIncomingContext(ctx, DecidedHeader), caller) {
		s.upstream.Add(1)
		return Decision{}
	}
	return s.Decide(caller)
}

func callerFromContext(ctx context.Context, key string) string {
	if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// renderGRPC builds the rejection of rule r once. The error is shared by
// every rejected call under the rule; gRPC only reads it.
func renderGRPC(service string, r *Rule) error {
	st := status.New(codes.ResourceExhausted,
		"call from caller "+r.Peer+" to service "+service+" was rate limited by sluice")
	withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfterSeconds * time.Second)})
	if err != nil { // marshalling a RetryInfo does not fail; keep the bare status if it ever does
		return st.Err()
	}
	return withInfo.Err()
}
