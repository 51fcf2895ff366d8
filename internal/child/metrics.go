package child

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// client reads the processes' HTTP endpoints. Without keep-alives: a
// request costs nothing to dial on loopback, and no idle connection (and
// its goroutines) outlives a test or a run. Without a timeout of its own:
// callers bound each request with its context.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// Get fetches url with the given header fields (name, value, name, value,
// ...) and returns the response's status, header and body.
func Get(ctx context.Context, url string, header ...string) (int, http.Header, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, "", err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, resp.Header, string(body), fmt.Errorf("read %s: %w", url, err)
	}
	return resp.StatusCode, resp.Header, string(body), nil
}

// Scrape reads /metrics on an admin address (host:port).
func Scrape(ctx context.Context, admin string) (Metrics, error) {
	code, _, body, err := Get(ctx, "http://"+admin+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %d %.100s", admin, code, body)
	}
	m, err := ParseMetrics(body)
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", admin, err)
	}
	return m, nil
}

// Metrics is one scrape of a /metrics page: its samples, in order.
type Metrics []Sample

// Sample is one line of the Prometheus text format:
// name{labels} value.
type Sample struct {
	Name   string
	Labels string // the text between the braces: `peer="web",service="api"`
	Value  float64
}

// ParseMetrics reads the Prometheus text format as sluice's processes
// write it: one sample a line, no timestamps. Comments and blank lines are
// skipped; a sample line without a number for its value is an error.
func ParseMetrics(text string) (Metrics, error) {
	var m Metrics
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("bad sample %q: no value", line)
		}
		series, value := line[:sp], line[sp+1:]
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("bad sample %q: %w", line, err)
		}
		name, labels, _ := strings.Cut(strings.TrimSpace(series), "{")
		m = append(m, Sample{Name: name, Labels: strings.TrimSuffix(labels, "}"), Value: v})
	}
	return m, nil
}

// Each calls fn with every sample of the metric name: its label set and
// its value.
func (m Metrics) Each(name string, fn func(labels string, v float64)) {
	for _, s := range m {
		if s.Name == name {
			fn(s.Labels, s.Value)
		}
	}
}

// Sum adds up the samples of name whose label sets hold every one of
// labels (each a whole pair, e.g. `peer="web"`); ok is false when there is
// none.
func (m Metrics) Sum(name string, labels ...string) (sum float64, ok bool) {
	m.Each(name, func(set string, v float64) {
		for _, l := range labels {
			if !hasLabel(set, l) {
				return
			}
		}
		sum, ok = sum+v, true
	})
	return sum, ok
}

// hasLabel reports whether the label set holds pair, as a whole pair:
// `peer="web"` is not in `caller_peer="web"` nor in `peer="web2"`.
func hasLabel(set, pair string) bool {
	for i := 0; ; {
		j := strings.Index(set[i:], pair)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(pair)
		if (start == 0 || set[start-1] == ',') && (end == len(set) || set[end] == ',') {
			return true
		}
		i = start + 1
	}
}

// LabelValue returns the value of label name in a label set; "" when the
// set has none.
func LabelValue(labels, name string) string {
	for i := 0; ; {
		j := strings.Index(labels[i:], name+`="`)
		if j < 0 {
			return ""
		}
		start := i + j
		if start == 0 || labels[start-1] == ',' {
			v, _, _ := strings.Cut(labels[start+len(name)+2:], `"`)
			return v
		}
		i = start + 1
	}
}
