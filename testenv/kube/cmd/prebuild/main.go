// Command prebuild fills the cache of the kube-apiserver, etcd and kube-proxy
// binaries that the Kubernetes tests use, of the crictl that the container
// runtime tests use, of the kubelet of the Pod tests, of the
// kube-controller-manager and kube-scheduler of the DaemonSet tests, of
// the kubectl of deploy/'s tests and of Kubernetes' conformance suite
// (e2e.test) and its agnhost (testenv/kube/kubebin), printing each step and a
// progress line every few seconds. `make test` runs it before `go test`, which
// shows the output of a passing package only with -v: without it, the first
// run on a machine would sit silent for minutes while kube-apiserver compiles.
// When the binaries are cached it prints one line for each set and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, _, err := kubebin.Build(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
	if _, err := kubebin.BuildCrictl(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
	if _, err := kubebin.BuildKubelet(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
	if _, err := kubebin.BuildKubectl(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
	if _, _, err := kubebin.BuildControlPlane(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
	if _, err := kubebin.BuildE2ETest(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
		os.Exit(1)
	}
}
