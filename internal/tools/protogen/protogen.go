// Package protogen regenerates the Go code for the protobuf sources in api/.
//
// It compiles the sources with protocompile (the compiler buf is built on) and
// feeds the plugins pinned in go.mod (protoc-gen-go, protoc-gen-go-grpc) a
// CodeGeneratorRequest, so neither protoc nor buf has to be installed. `make
// generate` writes the output; TestGeneratedCodeIsFresh fails when the
// committed code differs from it.
package protogen

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/pluginpb"
)

// plugins are run in this order, each with source-relative output paths.
var plugins = []string{"protoc-gen-go", "protoc-gen-go-grpc"}

// Generate compiles every .proto file under root and returns the generated
// files, keyed by their path relative to root.
func Generate(ctx context.Context, root string) (map[string][]byte, error) {
	var sources []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".proto") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			sources = append(sources, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find proto sources: %w", err)
	}
	sort.Strings(sources)

	compiler := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{root}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	files, err := compiler.Compile(ctx, sources...)
	if err != nil {
		return nil, fmt.Errorf("compile protos: %w", err)
	}

	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: sources}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		req.ProtoFile = append(req.ProtoFile, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range files {
		add(f)
	}
	for _, fdp := range req.ProtoFile {
		for _, s := range sources {
			if fdp.GetName() == s {
				req.SourceFileDescriptors = append(req.SourceFileDescriptors, fdp)
			}
		}
	}

	out := map[string][]byte{}
	for _, plugin := range plugins {
		req.Parameter = proto.String("paths=source_relative")
		resp, err := runPlugin(ctx, plugin, req)
		if err != nil {
			return nil, err
		}
		for _, f := range resp.GetFile() {
			out[f.GetName()] = []byte(f.GetContent())
		}
	}
	return out, nil
}

// runPlugin runs one plugin through `go tool`, which builds the version pinned
// in go.mod.
func runPlugin(ctx context.Context, plugin string, req *pluginpb.CodeGeneratorRequest) (*pluginpb.CodeGeneratorResponse, error) {
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("marshal request for %s: %w", plugin, err)
	}
	cmd := exec.CommandContext(ctx, "go", "tool", plugin)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("run %s: %w: %s", plugin, err, stderr.String())
	}
	resp := &pluginpb.CodeGeneratorResponse{}
	if err := proto.Unmarshal(stdout.Bytes(), resp); err != nil {
		return nil, fmt.Errorf("decode %s response: %w", plugin, err)
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("%s: %s", plugin, resp.GetError())
	}
	return resp, nil
}

// Write generates the code for root and writes it beside the sources,
// returning the paths it wrote.
func Write(ctx context.Context, root string) ([]string, error) {
	files, err := Generate(ctx, root)
	if err != nil {
		return nil, err
	}
	var written []string
	for name, content := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.WriteFile(path, content, 0o644); err != nil {
			return nil, fmt.Errorf("write generated code: %w", err)
		}
		written = append(written, path)
	}
	sort.Strings(written)
	return written, nil
}
