// Command protogen regenerates api/'s Go code; run it with `make generate`.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/tools/protogen"
)

func main() {
	root := "api"
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	written, err := protogen.Write(context.Background(), root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
	for _, w := range written {
		fmt.Println(w)
	}
}
