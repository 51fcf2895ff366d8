package helm_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the chart's copies of the manifests' files (files/) from deploy/k8s/base")

const (
	chartDir = "sluice"
	overlay  = "../k8s/overlays/prod"
	// The release the comparison installs: the overlay's namespace, and the
	// name its instance label says.
	releaseName      = "sluice"
	releaseNamespace = "sluice-system"
)

// key names an object as the API server does.
type key struct{ apiVersion, kind, namespace, name string }

func (k key) String() string {
	if k.namespace == "" {
		return fmt.Sprintf("%s %s %s", k.apiVersion, k.kind, k.name)
	}
	return fmt.Sprintf("%s %s %s/%s", k.apiVersion, k.kind, k.namespace, k.name)
}

// object is one rendered object, parsed into generic maps (numbers are
// float64, as JSON has them), whichever tool made it.
type object = map[string]any

func keyOf(t *testing.T, o object) key {
	t.Helper()
	meta, _ := o["metadata"].(map[string]any)
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	k := key{str(o, "apiVersion"), str(o, "kind"), str(meta, "namespace"), str(meta, "name")}
	if k.apiVersion == "" || k.kind == "" || k.name == "" {
		t.Fatalf("object without apiVersion, kind or name: %v", o)
	}
	return k
}

// parse turns one YAML document into an object; nil for an empty one.
func parse(t *testing.T, where string, doc []byte) object {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatalf("%s: %v\n%s", where, err, doc)
	}
	var o object
	if err := json.Unmarshal(j, &o); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return o
}

// loadChart loads the chart as helm does, and checks it as helm lint
// would: its metadata, and its default values against its schema.
func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("chart metadata: %v", err)
	}
	return c
}

// renderChart renders the chart as `helm template` does, with overrides on
// top of values.yaml, into objects by key. Strict: a template that names a
// value values.yaml does not have fails.
func renderChart(t *testing.T, namespace string, overrides map[string]any) map[key]object {
	t.Helper()
	out, err := render(t, namespace, overrides)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func render(t *testing.T, namespace string, overrides map[string]any) (map[key]object, error) {
	t.Helper()
	c := loadChart(t)
	vals, err := chartutil.ToRenderValues(c, overrides, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engineStrict().Render(c, vals)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	objects := map[key]object{}
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		for i, doc := range strings.Split(files[name], "\n---") {
			o := parse(t, fmt.Sprintf("%s document %d", name, i), []byte(doc))
			if o == nil {
				continue
			}
			k := keyOf(t, o)
			if _, dup := objects[k]; dup {
				t.Errorf("%s: %s rendered twice", name, k)
			}
			objects[k] = o
		}
	}
	return objects, nil
}

// engineStrict is helm's template engine, failing on a template that names
// a value values.yaml does not have.
func engineStrict() engine.Engine { return engine.Engine{Strict: true} }

// renderOverlay builds the overlay with kustomize's library, as
// deploy/k8s's tests and kubectl kustomize do.
func renderOverlay(t *testing.T) map[key]object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", overlay, err)
	}
	objects := map[key]object{}
	for _, res := range m.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		o := parse(t, res.CurId().String(), y)
		objects[keyOf(t, o)] = o
	}
	return objects
}

// TestChartCopiesOfBaseFiles keeps the chart's copies of the manifests'
// alert rules and dashboard equal to them (a chart can not read files
// outside its directory). With -update it writes them.
func TestChartCopiesOfBaseFiles(t *testing.T) {
	alerts, err := os.ReadFile("../k8s/base/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, spec, ok := strings.Cut(string(alerts), "\nspec:\n")
	if !ok {
		t.Fatal("deploy/k8s/base/alerts.yaml has no spec")
	}
	var b strings.Builder
	b.WriteString("# The spec of deploy/k8s/base/alerts.yaml, copied by `go test ./deploy/helm -update`:\n# edit that file, not this one.\n")
	for _, line := range strings.SplitAfter(spec, "\n") {
		if line != "" && line != "\n" && !strings.HasPrefix(line, "  ") {
			t.Fatalf("deploy/k8s/base/alerts.yaml: spec line %q is not indented by two", line)
		}
		b.WriteString(strings.TrimPrefix(line, "  "))
	}
	dashboard, err := os.ReadFile("../k8s/base/dashboards/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]byte{"files/alerts.yaml": []byte(b.String()), "files/dashboard.json": dashboard} {
		path = filepath.Join(chartDir, path)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
			t.Errorf("%s is not the manifests' (%v): run go test ./deploy/helm -run %s -update", path, err, t.Name())
		}
	}
}
