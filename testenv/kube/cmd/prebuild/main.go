// Command prebuild fills the cache of the kube-apiserver, etcd and kube-proxy
// binaries that the Kubernetes tests use, of the crictl that the container
// runtime tests use, of the kubelet of the Pod tests, of the
// kube-controller-manager and kube-scheduler of the DaemonSet tests, of
// the kubectl of deploy/'s tests, of the kube-router whose policy
// controller the lab runs, of the CoreDNS of the lab's cluster DNS and of
// Kubernetes' conformance suite (e2e.test) and its agnhost
// (testenv/kube/kubebin), printing each step and a progress line every few
// seconds. `make test` runs it before `go test`, which
// shows the output of a passing package only with -v: without it, the first
// run on a machine would sit silent for minutes while kube-apiserver compiles.
// When the binaries are cached it prints one line for each set and exits.
//
// After each set it builds, it prints the CPU time (user and system) its go
// commands took: the figure docs/development.md's table of first-build costs
// compares, since wall time depends on what else the machine runs.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sets := []struct {
		name  string
		build func() error
	}{
		{"kube-apiserver, etcd and kube-proxy", func() error { _, _, err := kubebin.Build(ctx, os.Stdout); return err }},
		{"crictl", func() error { _, err := kubebin.BuildCrictl(ctx, os.Stdout); return err }},
		{"kubelet", func() error { _, err := kubebin.BuildKubelet(ctx, os.Stdout); return err }},
		{"kubectl", func() error { _, err := kubebin.BuildKubectl(ctx, os.Stdout); return err }},
		{"kube-controller-manager and kube-scheduler", func() error { _, _, err := kubebin.BuildControlPlane(ctx, os.Stdout); return err }},
		{"kube-router", func() error { _, err := kubebin.BuildKubeRouter(ctx, os.Stdout); return err }},
		{"coredns", func() error { _, err := kubebin.BuildCoreDNS(ctx, os.Stdout); return err }},
		{"e2e.test and agnhost", func() error { _, err := kubebin.BuildE2ETest(ctx, os.Stdout); return err }},
	}
	for _, s := range sets {
		before, start := childCPU(), time.Now()
		if err := s.build(); err != nil {
			fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
			os.Exit(1)
		}
		// A cached set runs only go env: a fraction of a second.
		if cpu := childCPU() - before; cpu > 5*time.Second {
			fmt.Printf("testenv/kube: %s: %s CPU (user and system) in %s\n", s.name, cpu.Round(time.Second), time.Since(start).Round(time.Second))
		}
	}
}

// childCPU is the user and system time of the child processes (the go
// commands and the compilers they ran) that have ended so far.
func childCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
