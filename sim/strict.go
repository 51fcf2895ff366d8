package sim

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var nodeType = reflect.TypeFor[yaml.Node]()

// checkNode walks a YAML node along the Go type it will be decoded into and
// reports, each with its path (flows[2].rate.ramp[0].rps) and line, every
// key the type does not have and every scalar that does not decode into its
// field's type. yaml.v3's own KnownFields names neither the path nor more
// than the first problem. A yaml.Node field is left to its own parser.
func checkNode(n *yaml.Node, t reflect.Type, path string, errs *[]error) {
	if n == nil {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType {
		return
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			checkNode(c, t, path, errs)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		checkNode(n.Alias, t, path, errs)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // absent: the field keeps its zero value
	}
	bad := func(format string, args ...any) {
		*errs = append(*errs, fmt.Errorf("%s: %s (line %d)", orRoot(path), fmt.Sprintf(format, args...), n.Line))
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			bad("want a mapping, got %s", kindName(n))
			return
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			f, ok := fields[k.Value]
			if !ok {
				*errs = append(*errs, fmt.Errorf("%s: unknown field (line %d); known: %s", join(path, k.Value), k.Line, strings.Join(slices.Sorted(maps.Keys(fields)), ", ")))
				continue
			}
			checkNode(v, f.Type, join(path, k.Value), errs)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			bad("want a mapping, got %s", kindName(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			checkNode(v, t.Elem(), join(path, k.Value), errs)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			bad("want a list, got %s", kindName(n))
			return
		}
		for i, c := range n.Content {
			checkNode(c, t.Elem(), path+"["+strconv.Itoa(i)+"]", errs)
		}
	default:
		if n.Kind != yaml.ScalarNode {
			bad("want a single value, got %s", kindName(n))
			return
		}
		v := reflect.New(t)
		if err := n.Decode(v.Interface()); err != nil {
			msg := err.Error()
			if te, ok := err.(*yaml.TypeError); ok && len(te.Errors) > 0 {
				msg = te.Errors[0]
				if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
					msg = msg[i+2:]
				}
			}
			bad("%s", msg)
		}
	}
}

func orRoot(path string) string {
	if path == "" {
		return "(document)"
	}
	return path
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}
