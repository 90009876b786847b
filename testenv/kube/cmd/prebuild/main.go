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
// The sets of the k8s.io/kubernetes release build one after another, the
// others (crictl, kube-router, CoreDNS) beside them.
//
// Run as root, it also makes the Debian layers of the images the tests build
// (the isthmus image's, and agnhost's and nginx's of the conformance suite),
// with mmdebstrap, while the kube binaries compile: mmdebstrap mostly waits
// on Debian's mirrors and on dpkg writing files, so beside the compilers it
// costs little, where the tests would otherwise make each layer in turn.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/image"
	"github.com/isthmus-dev/isthmus/testenv/kube/e2eimages"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Two lanes of builds at once. The sets of one k8s.io/kubernetes
	// release share most of their packages, so they go one after another
	// (the later ones find the earlier ones' packages in the build cache);
	// the sets of other modules share nothing with them and fill the cores
	// the first lane leaves idle (its links and the narrow parts of its
	// package graphs run on one core).
	lanes := [][]func() error{
		{
			func() error { _, _, err := kubebin.Build(ctx, os.Stdout); return err },
			func() error { _, err := kubebin.BuildKubelet(ctx, os.Stdout); return err },
			func() error { _, err := kubebin.BuildKubectl(ctx, os.Stdout); return err },
			func() error { _, _, err := kubebin.BuildControlPlane(ctx, os.Stdout); return err },
			func() error { _, err := kubebin.BuildE2ETest(ctx, os.Stdout); return err },
		},
		{
			func() error { _, err := kubebin.BuildCrictl(ctx, os.Stdout); return err },
			func() error { _, err := kubebin.BuildKubeRouter(ctx, os.Stdout); return err },
			func() error { _, err := kubebin.BuildCoreDNS(ctx, os.Stdout); return err },
		},
	}
	done := make(chan error, len(lanes)+1)
	if os.Geteuid() == 0 {
		go func() { done <- debianLayers(ctx) }()
	} else {
		fmt.Println("testenv/image: not root: the tests make the Debian layers of their images (mmdebstrap needs root)")
		done <- nil
	}
	for _, lane := range lanes {
		go func() {
			for _, build := range lane {
				if err := build(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range len(lanes) + 1 {
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "prebuild: %v\n", err)
			os.Exit(1)
		}
	}
}

// debianLayers makes, one after another, the Debian layers that are not
// cached yet: the isthmus image's (image.Packages) and those of the
// conformance suite's agnhost and nginx images (testenv/kube/e2eimages).
func debianLayers(ctx context.Context) error {
	for _, l := range []struct {
		image    string
		packages []string
	}{
		{"isthmus", image.Packages},
		{e2eimages.Agnhost, e2eimages.AgnhostPackages},
		{e2eimages.Nginx, e2eimages.NginxPackages},
	} {
		start := time.Now()
		log := func(format string, args ...any) {
			fmt.Printf("testenv/image: %s image: "+format+"\n", append([]any{l.image}, args...)...)
		}
		if _, err := image.DebianLayer(ctx, image.Debian{Packages: l.packages, Log: log}); err != nil {
			return fmt.Errorf("the %s image's Debian layer: %w", l.image, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			log("Debian layer made in %s", d.Round(time.Second))
		}
	}
	return nil
}
