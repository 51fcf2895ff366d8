package k8s_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluicehq/sluice/internal/agent"
	"github.com/sluicehq/sluice/internal/aggregator"
	"github.com/sluicehq/sluice/internal/controller"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/internal/webhook"
	"github.com/sluicehq/sluice/internal/webhook/inject"
	"github.com/sluicehq/sluice/pkg/history"
)

// describer is a prometheus.Registerer that only records the names of the
// metrics registered with it, and their labels.
type describer struct {
	names  map[string]bool
	labels map[string]map[string]bool // by metric name
}

var (
	fqName     = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)
	// constLabels are name="value" pairs (%q), variableLabels names, each
	// c(name) when constrained.
	constLabel    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)
	variableLabel = regexp.MustCompile(`(?:^|,)(?:c\()?([a-zA-Z_][a-zA-Z0-9_]*)`)
)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		// Desc has no accessor for its name; its String has had this form
		// for as long as client_golang has had Desc.
		m := fqName.FindStringSubmatch(desc.String())
		if m == nil {
			continue
		}
		d.names[m[1]] = true
		if d.labels[m[1]] == nil {
			d.labels[m[1]] = map[string]bool{}
		}
		if l := descLabels.FindStringSubmatch(desc.String()); l != nil {
			for _, n := range constLabel.FindAllStringSubmatch(l[1], -1) {
				d.labels[m[1]][n[1]] = true
			}
			for _, n := range variableLabel.FindAllStringSubmatch(l[2], -1) {
				d.labels[m[1]][n[1]] = true
			}
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return false }

// codeMetrics is the list of metrics the binaries export, built by the
// binaries' own constructors, so that alerts and dashboards can only name
// metrics that exist.
func codeMetrics(t *testing.T) map[string]bool { return codeDescriber(t).names }

// codeDescriber registers every binary's metrics with a describer.
func codeDescriber(t *testing.T) *describer {
	t.Helper()
	d := &describer{names: map[string]bool{}, labels: map[string]map[string]bool{}}
	if _, err := controller.New(controller.DefaultConfig(), limits.Static{}, nil, d); err != nil {
		t.Fatal(err)
	}
	controller.NewRecorder(controller.DefaultRecorderConfig(), history.NewMemory(), nil, d)
	acfg := aggregator.DefaultConfig()
	acfg.Zone, acfg.Controllers = "zone-a", []string{"127.0.0.1:18000"}
	if _, err := aggregator.New(acfg, nil, d); err != nil {
		t.Fatal(err)
	}
	scfg := agent.DefaultConfig()
	scfg.Service = "checkout"
	a, err := agent.New(scfg, nil, d)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	certFile, keyFile := selfSigned(t)
	if _, err := webhook.New(webhook.Config{
		Inject: inject.Config{Image: "sidecar:test", Aggregators: []string{"a:1"}, Controllers: []string{"c:1"},
			ProxyPort: inject.DefaultProxyPort, AdminPort: inject.DefaultAdminPort},
		CertFile: certFile, KeyFile: keyFile, ShutdownTimeout: time.Second,
	}, nil, d); err != nil {
		t.Fatal(err)
	}
	// The one metric the controller's command registers itself (it counts
	// failed reads of whichever limits source the flags chose).
	src, err := os.ReadFile("../../internal/controller/command.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`Name: +"(sluice_[a-z0-9_]+)"`).FindAllStringSubmatch(string(src), -1) {
		d.names[m[1]] = true
	}
	if len(d.names) < 40 {
		t.Fatalf("found only %d metrics: %v", len(d.names), d.names)
	}
	return d
}

func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// metricNames parses a PromQL expression and returns the metrics it selects.
func metricNames(expr string) ([]string, error) {
	sels, err := selectors(expr)
	var names []string
	for _, s := range sels {
		names = append(names, s.name)
	}
	return names, err
}

// selector is one vector selector of an expression: the metric and its
// other matchers, as "name=value", "name=~value" and so on.
type selector struct {
	name     string
	matchers []string
}

// selectors parses a PromQL expression and returns its vector selectors.
func selectors(expr string) ([]selector, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []selector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			s := selector{name: vs.Name}
			for _, m := range vs.LabelMatchers {
				if m.Name == "__name__" {
					s.name = m.Value
					continue
				}
				s.matchers = append(s.matchers, m.Name+m.Type.String()+m.Value)
			}
			out = append(out, s)
		}
		return nil
	})
	return out, nil
}

// known reports whether name is an exported metric, or a series the
// Prometheus server makes (up) or a histogram's part of one.
func known(metrics map[string]bool, name string) bool {
	if name == "up" || metrics[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && metrics[base] {
			return true
		}
	}
	return false
}

// TestAlertRules parses every alert expression, checks that it names only
// metrics the code exports, and that the docs say what to do about it.
func TestAlertRules(t *testing.T) {
	metrics := codeMetrics(t)
	docs, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	eachOverlay(t, func(t *testing.T, r *rendered) {
		rules := all[*monitoringv1.PrometheusRule](r)
		if len(rules) != 1 {
			t.Fatalf("%d PrometheusRules, want 1", len(rules))
		}
		var alerts []string
		for _, g := range rules[0].Spec.Groups {
			for _, rule := range g.Rules {
				if rule.Alert == "" {
					t.Errorf("group %s: a rule without an alert name", g.Name)
					continue
				}
				alerts = append(alerts, rule.Alert)
				names, err := metricNames(rule.Expr.String())
				if err != nil {
					t.Errorf("%s: %v", rule.Alert, err)
				}
				for _, n := range names {
					if !known(metrics, n) {
						t.Errorf("%s: metric %s is exported by no sluice binary", rule.Alert, n)
					}
				}
				if len(names) == 0 {
					t.Errorf("%s: selects no metric", rule.Alert)
				}
				if s := rule.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("%s: severity %q", rule.Alert, s)
				}
				if rule.For != nil {
					if _, err := time.ParseDuration(string(*rule.For)); err != nil {
						t.Errorf("%s: for %q: %v", rule.Alert, *rule.For, err)
					}
				}
				anchor := strings.ToLower(rule.Alert)
				if rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" ||
					!strings.HasSuffix(rule.Annotations["runbook_url"], "docs/kubernetes.md#"+anchor) {
					t.Errorf("%s: annotations %v: want summary, description and the runbook in docs/kubernetes.md", rule.Alert, rule.Annotations)
				}
				if !strings.Contains(string(docs), "\n### "+rule.Alert+"\n") {
					t.Errorf("%s: docs/kubernetes.md has no section \"### %s\"", rule.Alert, rule.Alert)
				}
			}
		}
		for _, want := range []string{
			"SluiceSidecarPolicyStale", "SluiceControllerTickSlow", "SluiceReportsRejected", "SluiceZoneLoadsRejected",
			"SluicePostgresUnreachable", "SluiceControllerNotWarm", "SluiceNoAggregators", "SluicePolicyNacked",
		} {
			if !slices.Contains(alerts, want) {
				t.Errorf("no alert %s", want)
			}
		}
	})
}

// TestMetricNamesParse keeps metricNames, selectors and the describer
// honest: a test that could not find a name or a label could not fail.
func TestMetricNamesParse(t *testing.T) {
	got, err := metricNames(`histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0 and on() b{x="y"} or {__name__="c"}`)
	if err != nil || !slices.Equal(got, []string{"a_bucket", "b", "c"}) {
		t.Errorf("metricNames = %q, %v", got, err)
	}
	sels, err := selectors(`sum(rate(a{service=~"$service", x="y"}[5m]))`)
	if err != nil || len(sels) != 1 || !slices.Equal(sels[0].matchers, []string{`service=~$service`, `x=y`}) {
		t.Errorf("selectors = %+v, %v", sels, err)
	}
	d := &describer{names: map[string]bool{}, labels: map[string]map[string]bool{}}
	d.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "m_total", Help: "h",
		ConstLabels: prometheus.Labels{"zone": "a,b", "tier": "x"}}, []string{"service", "peer"}))
	if l := d.labels["m_total"]; len(l) != 4 || !l["zone"] || !l["tier"] || !l["service"] || !l["peer"] {
		t.Errorf("describer labels %v, want zone, tier, service, peer", l)
	}
	if _, err := metricNames(`sum(rate(x[5m])`); err == nil {
		t.Error("an unbalanced expression parsed")
	}
}

// grafanaPanel is the part of a Grafana panel the test reads.
type grafanaPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // rows
}

// TestDashboard parses the Grafana dashboard the build ships and checks
// that every panel's queries parse and name exported metrics.
func TestDashboard(t *testing.T) {
	metrics := codeMetrics(t)
	eachOverlay(t, func(t *testing.T, r *rendered) {
		cm := one[*corev1.ConfigMap](t, r, "sluice-grafana-dashboard")
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard ConfigMap labels %v: want grafana_dashboard=1 for Grafana's sidecar", cm.Labels)
		}
		var dash struct {
			Title      string         `json:"title"`
			UID        string         `json:"uid"`
			Panels     []grafanaPanel `json:"panels"`
			Templating struct {
				List []grafanaVariable `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal([]byte(cm.Data["sluice.json"]), &dash); err != nil {
			t.Fatalf("dashboard JSON: %v", err)
		}
		if dash.Title == "" || dash.UID == "" || len(dash.Templating.List) == 0 || dash.Templating.List[0].Name != "datasource" {
			t.Errorf("dashboard %q (uid %q): want a title, a uid and a datasource variable", dash.Title, dash.UID)
		}
		var queries int
		ids := map[int]bool{}
		var walk func([]grafanaPanel)
		walk = func(ps []grafanaPanel) {
			for _, p := range ps {
				if ids[p.ID] {
					t.Errorf("panel id %d twice", p.ID)
				}
				ids[p.ID] = true
				walk(p.Panels)
				if p.Type == "row" {
					continue
				}
				if p.Datasource["uid"] != "${datasource}" || len(p.Targets) == 0 {
					t.Errorf("panel %q: datasource %v, %d queries", p.Title, p.Datasource, len(p.Targets))
				}
				for _, q := range p.Targets {
					queries++
					expr := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m").Replace(q.Expr)
					names, err := metricNames(expr)
					if err != nil {
						t.Errorf("panel %q: %q: %v", p.Title, q.Expr, err)
					}
					for _, n := range names {
						if !known(metrics, n) {
							t.Errorf("panel %q: metric %s is exported by no sluice binary", p.Title, n)
						}
					}
				}
			}
		}
		walk(dash.Panels)
		if queries < 10 {
			t.Errorf("%d queries: the dashboard lost its panels", queries)
		}
	})
}

// grafanaVariable is the part of a Grafana template variable the test
// reads.
type grafanaVariable struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Query any    `json:"query"` // a string for the datasource variable
	Multi bool   `json:"multi"`
	All   bool   `json:"includeAll"`
	// AllValue ".*" makes "All" every value, also those the variable's
	// query does not list (services the controller knows but no sidecar
	// in the chosen namespaces serves).
	AllValue string `json:"allValue"`
}

// filters are the dashboard's variables and which metrics have the label
// each filters on: service where the code gives the metric that label;
// namespace on the sidecars' metrics, whose scrape target (the PodMonitor's
// pods) is in the application's namespace. Every other metric is scraped
// in sluice-system, where a namespace filter would only empty the panel.
var filters = []struct {
	variable string
	has      func(d *describer, metric string) bool
}{
	{"namespace", func(_ *describer, m string) bool { return strings.HasPrefix(m, "sluice_sidecar_") }},
	{"service", func(d *describer, m string) bool {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(m, suffix); ok && d.names[base] {
				m = base
			}
		}
		return d.labels[m]["service"]
	}},
}

// checkFilters checks that every selector of expr filters on each
// variable exactly when its metric has the label, with a regular
// expression match (multi-value and All expand to alternatives).
func checkFilters(t *testing.T, d *describer, where, expr string) {
	t.Helper()
	sels, err := selectors(expr)
	if err != nil {
		t.Errorf("%s: %q: %v", where, expr, err)
		return
	}
	for _, s := range sels {
		for _, f := range filters {
			want := f.variable + "=~$" + f.variable
			uses := slices.Contains(s.matchers, want)
			mentions := false
			for _, m := range s.matchers {
				mentions = mentions || strings.Contains(m, "$"+f.variable)
			}
			switch has := f.has(d, s.name); {
			case has && !uses:
				t.Errorf("%s: %s has the label %s but is not filtered by it: want %s=~\"$%s\" in %q", where, s.name, f.variable, f.variable, f.variable, expr)
			case !has && mentions:
				t.Errorf("%s: %s has no %s to filter on: %q", where, s.name, f.variable, expr)
			case mentions && !uses:
				t.Errorf("%s: %s filters on $%s other than with %s=~: %q", where, s.name, f.variable, f.variable, expr)
			}
		}
	}
}

// TestDashboardFilters checks the dashboard's namespace and service
// variables: each is a label_values query of a sluice metric that has the
// label (service within the chosen namespaces), and every panel query
// filters on each variable whose label its metric has.
func TestDashboardFilters(t *testing.T) {
	d := codeDescriber(t)
	data, err := os.ReadFile("base/dashboards/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []grafanaVariable `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	labelValues := regexp.MustCompile(`^label_values\((.+), *([a-z_]+)\)$`)
	for _, f := range filters {
		i := slices.IndexFunc(dash.Templating.List, func(v grafanaVariable) bool { return v.Name == f.variable })
		if i < 0 {
			t.Errorf("no variable %s", f.variable)
			continue
		}
		v := dash.Templating.List[i]
		q, _ := v.Query.(map[string]any)
		query, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(query)
		if v.Type != "query" || m == nil || m[2] != f.variable {
			t.Errorf("variable %s: %s %v: want a query label_values(<sluice metric>, %s)", f.variable, v.Type, v.Query, f.variable)
			continue
		}
		if !v.Multi || !v.All || v.AllValue != ".*" {
			t.Errorf("variable %s: multi %v, includeAll %v, allValue %q: want several values, All, and All as .*", f.variable, v.Multi, v.All, v.AllValue)
		}
		sels, err := selectors(m[1])
		if err != nil || len(sels) != 1 || !strings.HasPrefix(sels[0].name, "sluice_") || !f.has(d, sels[0].name) {
			t.Errorf("variable %s: %q is not a sluice metric with the label %s (%v)", f.variable, m[1], f.variable, err)
			continue
		}
		// The services offered are those of the chosen namespaces.
		if want := "namespace=~$namespace"; f.variable == "service" && !slices.Equal(sels[0].matchers, []string{want}) {
			t.Errorf("variable service: %q: want it to select only %s", m[1], want)
		}
	}

	var queries int
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, q := range p.Targets {
				queries++
				checkFilters(t, d, "panel "+strconv.Quote(p.Title), strings.ReplaceAll(q.Expr, "$__rate_interval", "5m"))
			}
		}
	}
	walk(dash.Panels)
	if queries < 10 {
		t.Errorf("%d queries: the dashboard lost its panels", queries)
	}
}

// TestScrapeTargets checks that Prometheus is told to scrape every sluice
// admin port, the sidecars' included.
func TestScrapeTargets(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		sms := all[*monitoringv1.ServiceMonitor](r)
		if len(sms) != 1 || len(sms[0].Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitors %d: want one, one endpoint", len(sms))
		}
		sm := sms[0]
		for _, name := range []string{"sluice-controller", "sluice-aggregator", "sluice-injector"} {
			svc := one[*corev1.Service](t, r, name)
			if !selects(t, &sm.Spec.Selector, svc.Labels) {
				t.Errorf("ServiceMonitor does not select Service %s", name)
			}
			var ok bool
			for _, p := range svc.Spec.Ports {
				ok = ok || p.Name == sm.Spec.Endpoints[0].Port
			}
			if !ok {
				t.Errorf("Service %s has no port %q", name, sm.Spec.Endpoints[0].Port)
			}
		}
		pms := all[*monitoringv1.PodMonitor](r)
		if len(pms) != 1 {
			t.Fatalf("PodMonitors %d, want 1", len(pms))
		}
		pm := pms[0]
		if !pm.Spec.NamespaceSelector.Any || len(pm.Spec.PodMetricsEndpoints) != 1 ||
			pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != inject.AdminPortName ||
			!selects(t, &pm.Spec.Selector, map[string]string{inject.SidecarLabel: inject.Injected}) ||
			selects(t, &pm.Spec.Selector, map[string]string{"app": "web"}) {
			t.Errorf("sidecar PodMonitor %+v: want port %s of pods labelled %s=%s in every namespace",
				pm.Spec, inject.AdminPortName, inject.SidecarLabel, inject.Injected)
		}
	})
}
