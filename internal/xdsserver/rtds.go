package xdsserver

import (
	"maps"
	"slices"

	runtime "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/log"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/pkg/names"
)

// RuntimeTypeURL is the xDS type of an RTDS layer.
const RuntimeTypeURL = resourcev3.RuntimeType

// AbortHTTPStatus is the status an Envoy in front of a callee answers a
// dropped request with, as sluice's sidecar does: 429 Too Many Requests.
const AbortHTTPStatus = 429

// RuntimeLayerName is the RTDS resource that the Envoy in front of callee
// subscribes to. Each callee has a layer of its own because an Envoy fronts
// one callee and needs the ratios of that callee's callers only; the fault
// filter's runtime keys name the caller, never the callee.
func RuntimeLayerName(callee string) string { return "sluice/" + callee }

// AbortPercentKey is the runtime key Envoy's fault filter reads for requests
// whose x-envoy-downstream-service-cluster header is caller. Its value is
// served as a FractionalPercent per million, {numerator: ppm, denominator:
// MILLION}, so the ratio is as exact as the proxyless route's.
func AbortPercentKey(caller string) string { return "fault.http." + caller + ".abort.abort_percent" }

// AbortHTTPStatusKey is the runtime key for the status of caller's aborted
// requests.
func AbortHTTPStatusKey(caller string) string { return "fault.http." + caller + ".abort.http_status" }

// rtds holds one runtime layer per callee with a DropPolicy, in a
// LinearCache: Envoys subscribe by name, and a tick's changed layers go out
// in one batch, only to the Envoys of those callees.
type rtds struct {
	cache *cache.LinearCache
}

func newRTDS(prefix string, logger log.Logger) *rtds {
	return &rtds{cache: cache.NewLinearCache(RuntimeTypeURL,
		cache.WithVersionPrefix(prefix), cache.WithLogger(logger))}
}

// runtimeLayer builds callee's layer from its enforced callers' ratios.
// Every caller in the policy gets its keys, ratio 0 included, so that the
// layer says what sluice decided for each caller it knows. Callers that no
// header can name ("unknown", "_overflow") are left out: Envoy would read
// them only for a downstream cluster of that very name.
//
// callers holds buckets of procedure "" only: a leaf of a callee that
// declares procedures is never in a layer (dataplanes.update), so such a
// callee's layer is empty. The fault filter's runtime keys are per
// downstream cluster; a key per (caller, route) does not exist.
func runtimeLayer(callee string, callers map[string]float64) *runtime.Runtime {
	fields := make(map[string]*structpb.Value, 2*len(callers))
	for _, caller := range slices.Sorted(maps.Keys(callers)) {
		if caller == names.Unknown || caller == names.Overflow {
			continue
		}
		fields[AbortPercentKey(caller)] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"numerator":   structpb.NewNumberValue(float64(PPM(callers[caller]))),
			"denominator": structpb.NewStringValue("MILLION"),
		}})
		fields[AbortHTTPStatusKey(caller)] = structpb.NewNumberValue(AbortHTTPStatus)
	}
	return &runtime.Runtime{Name: RuntimeLayerName(callee), Layer: &structpb.Struct{Fields: fields}}
}

// update replaces the layers of the callees whose policies changed, when
// their content changed, and removes those of deleted callees, in one
// batch.
func (r *rtds) update(changed map[string]map[string]float64, deleted []string) error {
	current := r.cache.GetResources()
	set := make(map[string]types.Resource, len(changed))
	for callee, callers := range changed {
		layer := runtimeLayer(callee, callers)
		if old, ok := current[layer.GetName()]; ok && proto.Equal(old, layer) {
			continue
		}
		set[layer.GetName()] = layer
	}
	var del []string
	for _, callee := range deleted {
		if _, ok := current[RuntimeLayerName(callee)]; ok {
			del = append(del, RuntimeLayerName(callee))
		}
	}
	if len(set) == 0 && len(del) == 0 {
		return nil
	}
	return r.cache.UpdateResources(set, del)
}
