package limits

import (
	"cmp"
	"context"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Decoding a limits file: the YAML parser builds the document's node tree,
// and decoder walks it into a fileDoc. yaml.v3's own decoding into Go maps
// checks every mapping for duplicate keys pair by pair, which made a
// 200,000-caller file parse for ever (issue 13); here each mapping's keys
// go through a Go map once, so decoding is linear in the document's nodes,
// and the walk stops when its context is cancelled.
//
// It keeps yaml.v3's rules where a limits file can tell them apart:
// unknown fields and duplicate keys are errors; aliases and merge keys
// (<<) work, a mapping's own keys winning over merged ones and earlier
// merges over later ones; numbers read as YAML reads them (0x10, 1_000,
// .inf). Aliases and merges are expanded against a budget of nodes, as
// yaml.v3 bounds its alias expansion, so a small document can not make it
// do unbounded work.

// decodeBudget is how many nodes decoding may visit, aliases and merges
// expanded, beyond aliasFactor times the nodes the document holds:
// yaml.v3's own limit lets 400,000 decodes through whatever their ratio.
const (
	decodeBudget = 400_000
	aliasFactor  = 10
)

// cancelEvery is how many nodes decoding visits between looks at its
// context.
const cancelEvery = 4096

type decoder struct {
	ctx   context.Context
	left  int // nodes it may still visit
	steps int
	stop  bool // cancelled or over budget: the walk unwinds
	errs  []error
}

func newDecoder(ctx context.Context, nodes int) *decoder {
	return &decoder{ctx: ctx, left: decodeBudget + aliasFactor*nodes}
}

// errorf records a problem at path, on n's line.
func (d *decoder) errorf(path string, n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, fmt.Errorf("%s: line %d: %s", cmp.Or(path, "(top level)"), n.Line, fmt.Sprintf(format, args...)))
}

// visit pays for one node and follows it if it is an alias; nil when the
// walk must stop.
func (d *decoder) visit(n *yaml.Node) *yaml.Node {
	for n != nil && !d.stop {
		d.left--
		d.steps++
		if d.left < 0 {
			d.stop = true
			d.errs = append(d.errs, fmt.Errorf("document contains excessive aliasing (over %d nodes visited)", decodeBudget))
			return nil
		}
		if d.steps%cancelEvery == 0 && d.ctx.Err() != nil {
			d.stop = true
			return nil
		}
		if n.Kind != yaml.AliasNode {
			return n
		}
		n = n.Alias
	}
	return nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

var kindNames = map[yaml.Kind]string{yaml.DocumentNode: "document", yaml.SequenceNode: "sequence", yaml.MappingNode: "mapping", yaml.ScalarNode: "scalar", yaml.AliasNode: "alias"}

// mapping calls fn for every entry of the mapping n, merged entries
// included, each key once: its own keys first, in order, then those merged
// in that it does not have. A null n is an empty mapping; anything else
// that is not a mapping is an error. Null keys are skipped (nullKeys
// reports them).
func (d *decoder) mapping(n *yaml.Node, path string, fn func(key string, k, v *yaml.Node)) {
	seen := map[string]bool{}
	d.entries(n, path, seen, true, fn)
}

// entries is mapping for n, skipping the keys in seen and adding its own;
// own says whether n is the mapping itself rather than one merged into it,
// whose duplicate keys are its own definition's to report.
func (d *decoder) entries(n *yaml.Node, path string, seen map[string]bool, own bool, fn func(key string, k, v *yaml.Node)) {
	n = d.visit(n)
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(path, n, "want a mapping, got a %s", kindNames[n.Kind])
		return
	}
	var merges []*yaml.Node
	line := map[string]int{} // this mapping's own keys, for duplicates
	for i := 0; i+1 < len(n.Content) && !d.stop; i += 2 {
		k := d.visit(n.Content[i])
		if k == nil {
			return
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, n.Content[i+1])
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(path, k, "a key is a %s, want a name", kindNames[k.Kind])
			continue
		}
		if isNull(k) {
			continue
		}
		if at, dup := line[k.Value]; dup {
			if own {
				d.errorf(path, k, "mapping key %q already defined at line %d", k.Value, at)
			}
			continue
		}
		line[k.Value] = k.Line
		if seen[k.Value] {
			continue
		}
		seen[k.Value] = true
		fn(k.Value, k, n.Content[i+1])
	}
	for _, m := range merges {
		m = d.visit(m)
		if m == nil {
			return
		}
		merged := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			merged = m.Content
		}
		for _, e := range merged {
			if e = d.visit(e); e == nil {
				return
			}
			if e.Kind != yaml.MappingNode {
				d.errorf(path, e, "a merge (<<) takes a mapping or a sequence of mappings, not a %s", kindNames[e.Kind])
				continue
			}
			d.entries(e, path, seen, false, fn)
		}
	}
}

// scalar returns the scalar n, nil when it is null or the walk stopped.
func (d *decoder) scalar(n *yaml.Node, path string) *yaml.Node {
	n = d.visit(n)
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		d.errorf(path, n, "want a scalar, got a %s", kindNames[n.Kind])
		return nil
	}
	return n
}

// number reads an optional number; nil when absent or null.
func (d *decoder) number(n *yaml.Node, path string) *float64 {
	s := d.scalar(n, path)
	if s == nil {
		return nil
	}
	var v float64
	if err := s.Decode(&v); err != nil {
		d.errorf(path, s, "%q is not a number", s.Value)
		return nil
	}
	return &v
}

// text reads an optional string; "" when absent or null.
func (d *decoder) text(n *yaml.Node, path string) string {
	if s := d.scalar(n, path); s != nil {
		return s.Value
	}
	return ""
}

// document decodes the document root into a fileDoc.
func (d *decoder) document(root *yaml.Node) fileDoc {
	var doc fileDoc
	if root.Kind == 0 { // no document at all
		return doc
	}
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return doc
		}
		root = root.Content[0]
	}
	d.mapping(root, "", func(key string, k, v *yaml.Node) {
		if key != "services" {
			d.errorf("", k, "field %s not found", key)
			return
		}
		doc.Services = map[string]fileService{}
		d.mapping(v, "services", func(name string, _, v *yaml.Node) {
			doc.Services[name] = d.service(v, "services."+name)
		})
	})
	return doc
}

func (d *decoder) service(n *yaml.Node, path string) fileService {
	var fs fileService
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "capacity":
			fs.Capacity = d.number(v, p)
		case "default_limit":
			fs.DefaultLimit = d.number(v, p)
		case "mode":
			fs.Mode = d.text(v, p)
		case "fail_mode":
			fs.FailMode = d.text(v, p)
		case "enforcement":
			fs.Enforcement = d.text(v, p)
		case "callers":
			fs.Callers = map[string]fileBucket{}
			d.mapping(v, p, func(caller string, _, v *yaml.Node) {
				fs.Callers[caller] = d.bucket(v, p+"."+caller)
			})
		case "routes":
			fs.Routes = []fileRoute{}
			d.sequence(v, p, func(i int, v *yaml.Node) {
				fs.Routes = append(fs.Routes, d.route(v, fmt.Sprintf("%s[%d]", p, i)))
			})
		case "procedures":
			fs.Procedures = map[string]fileProcedure{}
			d.mapping(v, p, func(proc string, _, v *yaml.Node) {
				fs.Procedures[proc] = d.procedure(v, p+"."+proc)
			})
		case "descriptors":
			fs.Descriptors = map[string]fileDescriptor{}
			d.mapping(v, p, func(name string, _, v *yaml.Node) {
				fs.Descriptors[name] = d.descriptor(v, p+"."+name)
			})
		case "criticality":
			fs.Criticality = d.criticality(v, p)
		case "unit":
			fs.Unit = d.text(v, p)
		case "cost":
			fs.Cost = d.cost(v, p)
		case "slo":
			fs.SLO = d.slo(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fs
}

func (d *decoder) slo(n *yaml.Node, path string) *fileSLO {
	f := &fileSLO{}
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "latency_p99":
			f.LatencyP99 = d.text(v, p)
		case "errors":
			f.Errors = d.text(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return f
}

func (d *decoder) bucket(n *yaml.Node, path string) fileBucket {
	var fb fileBucket
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "limit":
			fb.Limit = d.number(v, p)
		case "mode":
			fb.Mode = d.text(v, p)
		case "enforcement":
			fb.Enforcement = d.text(v, p)
		case "criticality":
			fb.Criticality = d.text(v, p)
		case "max_criticality":
			fb.MaxCriticality = d.text(v, p)
		case "max_concurrency":
			fb.MaxConcurrency = d.number(v, p)
		case "burst":
			fb.Burst = d.number(v, p)
		case "payback":
			fb.Payback = d.text(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fb
}

// route decodes one entry of a service's routes; line is the entry's, for
// the errors CompileRoutes finds later.
func (d *decoder) route(n *yaml.Node, path string) fileRoute {
	fr := fileRoute{line: n.Line}
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "route":
			fr.Route = d.text(v, p)
		case "procedure":
			fr.Procedure = d.text(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fr
}

func (d *decoder) procedure(n *yaml.Node, path string) fileProcedure {
	var fp fileProcedure
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		p := path + "." + key
		switch key {
		case "capacity":
			fp.Capacity = d.number(v, p)
		case "callers":
			fp.Callers = map[string]fileLeaf{}
			d.mapping(v, p, func(caller string, _, v *yaml.Node) {
				fp.Callers[caller] = d.leaf(v, p+"."+caller)
			})
		case "criticality":
			fp.Criticality = d.text(v, p)
		case "cost":
			fp.Cost = d.number(v, p)
		case "slo":
			fp.SLO = d.slo(v, p)
		default:
			d.errorf(path, k, "field %s not found", key)
		}
	})
	return fp
}

// leaf decodes the limit and cap of a (caller, procedure) leaf: its mode
// and enforcement are its caller's, so a leaf has no such fields.
func (d *decoder) leaf(n *yaml.Node, path string) fileLeaf {
	var fl fileLeaf
	d.mapping(n, path, func(key string, k, v *yaml.Node) {
		switch key {
		case "limit":
			fl.Limit = d.number(v, path+"."+key)
		case "max_concurrency":
			fl.MaxConcurrency = d.number(v, path+"."+key)
		default:
			d.errorf(path, k, "field %s not found (a leaf's mode and enforcement are its caller's)", key)
		}
	})
	return fl
}

// sequence calls fn for every element of the sequence n, in order. A null
// n is an empty sequence; anything else that is not a sequence is an
// error.
func (d *decoder) sequence(n *yaml.Node, path string, fn func(i int, v *yaml.Node)) {
	n = d.visit(n)
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(path, n, "want a sequence, got a %s", kindNames[n.Kind])
		return
	}
	for i, c := range n.Content {
		if d.stop {
			return
		}
		fn(i, c)
	}
}

// ctxReader fails its reads once ctx is done, which stops the YAML parser
// reading from it.
type ctxReader struct {
	ctx context.Context
	r   interface{ Read([]byte) (int, error) }
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
