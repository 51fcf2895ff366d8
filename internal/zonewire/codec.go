package zonewire

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// ServerOption makes a gRPC server decode zone loads with Unmarshal and
// every other message as gRPC does by default; it is the controller's,
// which serves zone loads and xDS on one server. A server option rather
// than a registered codec, so that no other server in the process, nor
// a client, changes.
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(codec{}) }

// codec is gRPC's proto codec but for StreamZoneLoadsRequest. Safe for
// concurrent use: every decode takes its own decoder.
type codec struct{}

func (codec) Name() string { return grpcproto.Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*sluicev1.StreamZoneLoadsRequest)
	if !ok {
		return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
	}
	// Every name is copied out of buf: nothing decoded refers to it once
	// it is freed.
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return Unmarshal(buf.ReadOnlyData(), m)
}
