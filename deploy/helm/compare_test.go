package helm_test

import (
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The labels the chart and the manifests set differently by design:
// Helm's own, and who manages the objects. Nothing else may differ.
const (
	labelChart     = "helm.sh/chart"
	labelManagedBy = "app.kubernetes.io/managed-by"
)

// normalise checks, then removes, the labels that differ by design from
// every metadata.labels in o (objects and pod, job and jobTemplate
// templates): the chart's helm.sh/chart and managed-by Helm, the
// manifests' managed-by kustomize. It reports a label that is missing or
// has another value, so that the comparison can not pass by dropping
// something that was never there.
func normalise(t *testing.T, where string, o any, chart bool) {
	t.Helper()
	m, ok := o.(map[string]any)
	if !ok {
		if l, ok := o.([]any); ok {
			for _, v := range l {
				normalise(t, where, v, chart)
			}
		}
		return
	}
	for k, v := range m {
		if k != "metadata" {
			normalise(t, where, v, chart)
			continue
		}
		meta, _ := v.(map[string]any)
		labels, _ := meta["labels"].(map[string]any)
		want := map[string]any{labelManagedBy: "kustomize"}
		if chart {
			want = map[string]any{labelManagedBy: "Helm", labelChart: "sluice-0.1.0"}
		}
		for name, value := range want {
			if labels[name] != value {
				t.Errorf("%s: metadata with label %s=%v, want %v", where, name, labels[name], value)
			}
			delete(labels, name)
		}
	}
}

// TestChartMatchesProdOverlay renders the chart with its default values
// and the prod overlay, and compares them object for object: the same
// objects, each equal but for the labels that differ by design.
func TestChartMatchesProdOverlay(t *testing.T) {
	chartObjects := renderChart(t, releaseNamespace, nil)
	overlayObjects := renderOverlay(t)

	var keys []key
	for k := range overlayObjects {
		keys = append(keys, k)
		if _, ok := chartObjects[k]; !ok {
			t.Errorf("only in the overlay: %s", k)
		}
	}
	for k := range chartObjects {
		if _, ok := overlayObjects[k]; !ok {
			t.Errorf("only in the chart: %s", k)
		}
	}
	if len(overlayObjects) < 30 {
		t.Fatalf("the overlay has %d objects: it lost some", len(overlayObjects))
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		c, ok := chartObjects[k]
		if !ok {
			continue
		}
		o := overlayObjects[k]
		normalise(t, "chart "+k.String(), c, true)
		normalise(t, "overlay "+k.String(), o, false)
		if diff := cmp.Diff(o, c); diff != "" {
			t.Errorf("%s differs (-overlay +chart):\n%s", k, diff)
		}
	}
	t.Logf("%d objects compared", len(keys))
}
