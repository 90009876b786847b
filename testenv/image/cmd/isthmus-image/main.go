// Command isthmus-image builds the isthmus image without a registry and
// writes it as an OCI image archive (package testenv/image), for
// `ctr -n k8s.io images import`. `make image` runs it; it needs root
// (mmdebstrap), the first time Debian's mirrors.
//
//	go run ./testenv/image/cmd/isthmus-image -version v0.3.0 -o bin/isthmus-image.oci.tar
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/isthmus-dev/isthmus/testenv/image"
)

func main() {
	var o image.Options
	flag.StringVar(&o.Version, "version", "dev", "the image's tag and version label")
	flag.StringVar(&o.Name, "name", "isthmus", "the image's name")
	flag.StringVar(&o.Commit, "commit", "", "the commit the binaries report (default git rev-parse HEAD, -dirty for a changed tree)")
	flag.StringVar(&o.LDFlags, "ldflags", "", "extra go build -ldflags for the binaries")
	flag.StringVar(&o.Out, "o", "", "the archive to write (default bin/isthmus-image.oci.tar, or bin/isthmus-image-<version>.oci.tar)")
	flag.StringVar(&o.CacheDir, "cache", image.CacheDir(), "where the Debian layer is cached ($ISTHMUS_KUBE_CACHE, else "+image.DefaultCacheDir+")")
	flag.Parse()
	o.Log = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "isthmus-image: "+format+"\n", args...) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := image.Build(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "isthmus-image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s\t%s\n", a.Path, a.Ref)
}
