package sidecar

import (
	"github.com/sluicehq/sluice/pkg/descriptor"
)

// Descriptors (issue #15): the API the data plane's edges call. The HTTP
// middleware and the gRPC interceptor take each descriptor's value from the
// request by its source, in the order DescriptorSources gives, and call
// DecideDescriptor for each one after the request's bucket admitted it.
//
// CONTRACT STUB: the bodies below are placeholders of this session's
// contract commit, replaced by the descriptor limiter.

// DescriptorSources returns where the current policy's descriptors take
// their values from, in the policy's order: index i is DecideDescriptor's
// i. Nil when the policy names none. The slice belongs to the policy
// snapshot: callers must not modify it. It allocates nothing.
func (s *ServiceLimiter) DescriptorSources() []descriptor.Source { return nil }

// DecideDescriptor decides one request's value of descriptor i (an index
// of DescriptorSources; a policy swap in between is harmless: an index the
// new policy does not have admits) and counts it. value is the raw
// attribute, "" when the request has none: DecideDescriptor maps it with
// descriptor.Value. It allocates nothing and takes no lock.
func (s *ServiceLimiter) DecideDescriptor(i int, value string) Decision { return Decision{} }
