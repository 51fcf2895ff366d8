package protogen

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsFresh fails when the committed code under api/ is not
// what `make generate` would write: a proto edited without regenerating, a
// generated file edited by hand, or a plugin version changed in go.mod.
func TestGeneratedCodeIsFresh(t *testing.T) {
	root := filepath.Join("..", "..", "..", "api")
	files, err := Generate(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no code generated: are the proto sources missing?")
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			t.Errorf("%s: %v; run `make generate`", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale; run `make generate`", name)
		}
	}
	generated, err := filepath.Glob(filepath.Join(root, "sluice", "v1", "*.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range generated {
		rel, _ := filepath.Rel(root, path)
		if _, ok := files[filepath.ToSlash(rel)]; !ok {
			t.Errorf("%s is no longer generated from any proto; delete it", path)
		}
	}
}
