package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

// maxErrorDetail bounds the NACK message: it is logged by the server, and a
// handler error can be long.
const maxErrorDetail = 4 << 10

// stream is the state of one ADS stream. It lives on Run's goroutine.
type stream struct {
	c        *Client
	addr     string
	received bool
}

// runDelta speaks delta xDS: subscribe once, naming the versions held so a
// restarted server sends only what changed; then ACK or NACK each response
// by its nonce.
func (s *stream) runDelta(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) (bool, error) {
	c := s.c
	st, err := ads.DeltaAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(maxRecvMsgSize))
	if err != nil {
		return false, fmt.Errorf("open delta stream to %s: %w", s.addr, err)
	}
	versions := c.heldVersions()
	if c.fresh {
		versions = nil
	}
	err = st.Send(&discovery.DeltaDiscoveryRequest{
		Node:                    c.node,
		TypeUrl:                 names.DropPolicyType,
		ResourceNamesSubscribe:  c.cfg.Resources,
		InitialResourceVersions: versions,
	})
	if err != nil {
		return false, fmt.Errorf("subscribe on %s: %w", s.addr, sendErr(st, err))
	}
	for {
		// No lock is held here: Policy and Connected stay available while
		// the stream waits for the server.
		resp, err := st.Recv()
		if err != nil {
			return s.received, fmt.Errorf("receive from %s: %w", s.addr, err)
		}
		s.gotResponse()
		req := c.applyDelta(resp)
		if req == nil {
			continue
		}
		if err := st.Send(req); err != nil {
			return s.received, fmt.Errorf("acknowledge on %s: %w", s.addr, sendErr(st, err))
		}
		if c.moved {
			return s.received, errMoved
		}
	}
}

// runSotW speaks state-of-the-world xDS. Every request names all subscribed
// resources. The first one carries no version: SotW can not resume (the
// server resends every subscribed resource on a new stream anyway), and an
// empty version makes go-control-plane answer even when none of them exist,
// so Connected turns true.
func (s *stream) runSotW(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient) (bool, error) {
	c := s.c
	st, err := ads.StreamAggregatedResources(ctx, grpc.MaxCallRecvMsgSize(maxRecvMsgSize))
	if err != nil {
		return false, fmt.Errorf("open sotw stream to %s: %w", s.addr, err)
	}
	err = st.Send(&discovery.DiscoveryRequest{
		Node:          c.node,
		TypeUrl:       names.DropPolicyType,
		ResourceNames: c.cfg.Resources,
	})
	if err != nil {
		return false, fmt.Errorf("subscribe on %s: %w", s.addr, sendErr(st, err))
	}
	// accepted is the version_info of the last response ACKed on this
	// stream; a NACK repeats it. Versions are per server instance, so it
	// starts empty on every stream.
	var accepted string
	for {
		resp, err := st.Recv()
		if err != nil {
			return s.received, fmt.Errorf("receive from %s: %w", s.addr, err)
		}
		s.gotResponse()
		req := c.applySotW(resp, accepted)
		if req == nil {
			continue
		}
		if req.GetErrorDetail() == nil {
			accepted = req.GetVersionInfo()
		}
		if err := st.Send(req); err != nil {
			return s.received, fmt.Errorf("acknowledge on %s: %w", s.addr, sendErr(st, err))
		}
		if c.moved {
			return s.received, errMoved
		}
	}
}

func (s *stream) gotResponse() {
	if s.received {
		return
	}
	s.received = true
	// The first answer of a new owner: from now on a reconnect may name
	// the versions held (see followShard).
	s.c.fresh = false
	s.c.setConnected(true)
	s.c.log.Info("xds connected", "server", s.addr, "protocol", s.c.cfg.Protocol.String())
}

// sendErr turns the io.EOF of a Send on a stream the server ended into the
// stream's status, which says why.
func sendErr[Req, Resp any](st grpc.BidiStreamingClient[Req, Resp], err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := st.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// applyDelta applies a delta response and returns its ACK or NACK, or nil
// for a response of another type, which is not ours to answer.
func (c *Client) applyDelta(resp *discovery.DeltaDiscoveryResponse) *discovery.DeltaDiscoveryRequest {
	if resp.GetTypeUrl() != names.DropPolicyType {
		c.log.Warn("xds response of an unexpected type ignored", "type_url", resp.GetTypeUrl())
		return nil
	}
	var errs []error
	for _, r := range resp.GetResources() {
		name := r.GetName()
		p, err := c.decode(name, r.GetResource())
		if err == nil {
			err = c.apply(name, r.GetVersion(), p)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	removed := resp.GetRemovedResources()
	for _, rn := range resp.GetRemovedResourceNames() {
		removed = append(removed, rn.GetName())
	}
	for _, name := range removed {
		c.remove(name)
	}
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: names.DropPolicyType, ResponseNonce: resp.GetNonce()}
	if len(errs) > 0 {
		req.ErrorDetail = c.nack(resp.GetNonce(), errs)
	}
	return req
}

// applySotW applies a SotW response and returns its ACK or NACK, or nil for
// a response of another type. A NACK carries the previously accepted
// version: that is how SotW says which state the client is still in.
func (c *Client) applySotW(resp *discovery.DiscoveryResponse, accepted string) *discovery.DiscoveryRequest {
	if resp.GetTypeUrl() != names.DropPolicyType {
		c.log.Warn("xds response of an unexpected type ignored", "type_url", resp.GetTypeUrl())
		return nil
	}
	var errs []error
	for _, a := range resp.GetResources() {
		// A SotW Any has no name of its own; the policy carries it.
		p, err := c.decode("", a)
		if err == nil {
			err = c.apply(p.GetName(), "", p)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	req := &discovery.DiscoveryRequest{
		VersionInfo:   resp.GetVersionInfo(),
		ResourceNames: c.cfg.Resources,
		TypeUrl:       names.DropPolicyType,
		ResponseNonce: resp.GetNonce(),
	}
	if len(errs) > 0 {
		req.VersionInfo = accepted
		req.ErrorDetail = c.nack(resp.GetNonce(), errs)
	}
	return req
}

// decode unpacks one resource and checks that it is a DropPolicy we asked
// for. name is the resource name the envelope gave (delta), or "" if it gave
// none (SotW); either way the policy's own name must be a subscribed one.
func (c *Client) decode(name string, a *anypb.Any) (*sluicev1.DropPolicy, error) {
	if a == nil {
		return nil, fmt.Errorf("resource %q: no body", name)
	}
	if a.GetTypeUrl() != names.DropPolicyType {
		return nil, fmt.Errorf("resource %q: type %q, want %q", name, a.GetTypeUrl(), names.DropPolicyType)
	}
	p := new(sluicev1.DropPolicy)
	if err := proto.Unmarshal(a.GetValue(), p); err != nil {
		return nil, fmt.Errorf("resource %q: decode: %w", name, err)
	}
	if name != "" && p.GetName() != name {
		return nil, fmt.Errorf("resource %q: policy is named %q", name, p.GetName())
	}
	if _, ok := c.names[p.GetName()]; !ok {
		return nil, fmt.Errorf("resource %q: not subscribed", p.GetName())
	}
	return p, nil
}

// apply hands a new version of a resource to the handler and keeps it if the
// handler accepts it. A version equal in content to the one held is not
// handed over again (a SotW reconnect resends everything).
func (c *Client) apply(name, version string, p *sluicev1.DropPolicy) error {
	si := p.GetShard()
	if si == nil && c.templated {
		// An unsharded controller owns every callee: a count of 1.
		si = &sluicev1.ShardInfo{Count: 1, Owner: true}
	}
	if si != nil && !c.followShard(si) {
		return nil
	}
	// Only this goroutine writes held, so reading it unlocked is safe.
	old, ok := c.held[name]
	if ok && proto.Equal(old.policy, p) {
		if old.version != version {
			c.mu.Lock()
			c.held[name] = heldResource{policy: old.policy, version: version}
			c.mu.Unlock()
		}
		return nil
	}
	if err := c.h.Update(name, p); err != nil {
		return fmt.Errorf("resource %q: rejected: %w", name, err)
	}
	c.mu.Lock()
	c.held[name] = heldResource{policy: p, version: version}
	c.mu.Unlock()
	c.m.updates.Inc()
	c.m.lastUpdate.SetToCurrentTime()
	return nil
}

// remove forgets a resource the server removed. Names never held are
// ignored: there is nothing to take back.
func (c *Client) remove(name string) {
	if _, ok := c.held[name]; !ok {
		return
	}
	c.mu.Lock()
	delete(c.held, name)
	c.mu.Unlock()
	c.h.Remove(name)
	c.m.updates.Inc()
	c.m.lastUpdate.SetToCurrentTime()
}

// heldVersions returns the delta versions of the resources held, for
// initial_resource_versions.
func (c *Client) heldVersions() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := make(map[string]string, len(c.held))
	for name, r := range c.held {
		if r.version != "" {
			v[name] = r.version
		}
	}
	return v
}

// nack counts and logs a rejected response and returns the error_detail
// that tells the server why.
func (c *Client) nack(nonce string, errs []error) *status.Status {
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	msg := strings.Join(msgs, "; ")
	if len(msg) > maxErrorDetail {
		msg = strings.ToValidUTF8(msg[:maxErrorDetail], "") + "…"
	}
	c.m.nacks.Inc()
	c.log.Warn("xds response rejected", "nonce", nonce, "error", msg)
	return &status.Status{Code: int32(codes.InvalidArgument), Message: msg}
}
