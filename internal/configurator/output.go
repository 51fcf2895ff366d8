package configurator

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// format is the value of -o/--output.
type format string

const (
	formatTable format = "table"
	formatJSON  format = "json"
	formatYAML  format = "yaml"
)

func (f *format) Set(s string) error {
	switch format(s) {
	case formatTable, formatJSON, formatYAML:
		*f = format(s)
		return nil
	}
	return fmt.Errorf("%q is not table, json or yaml", s)
}

func (f *format) String() string { return string(*f) }
func (f *format) Type() string   { return "format" }

// addOutput declares -o/--output on cmd.
func addOutput(cmd *cobra.Command, f *format) {
	*f = formatTable
	cmd.Flags().VarP(f, "output", "o", "output format: table, json or yaml")
	setting(cmd.Flags(), "output")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(
		[]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
}

// encode writes v as JSON or YAML.
func encode(w io.Writer, f format, v any) error {
	switch f {
	case formatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case formatYAML:
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return err
		}
		return enc.Close()
	}
	return fmt.Errorf("format %q is not json or yaml", f)
}

// table writes aligned columns.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// timeLayout renders times in tables: UTC, to the second.
const timeLayout = "2006-01-02 15:04:05Z"

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeLayout)
}

// formatShare renders a share as a percentage with up to three figures:
// "31.3%", "0.042%", "0%".
func formatShare(s float64) string {
	switch {
	case s == 0:
		return "0%"
	case s >= 0.1:
		return fmt.Sprintf("%.1f%%", s*100)
	case s >= 0.001:
		return fmt.Sprintf("%.2f%%", s*100)
	}
	return fmt.Sprintf("%.2g%%", s*100)
}
