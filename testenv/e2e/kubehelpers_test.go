package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/testenv/cluster"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// isthmusPodLogs returns the tail of every log the kubelets under work keep
// of the containers of isthmus-system and isthmus-uninstall pods, for tests
// that bring up their kubelets themselves rather than through
// testenv/cluster.
func isthmusPodLogs(work string) string {
	return podLogs(work, "isthmus-system") + podLogs(work, "isthmus-uninstall")
}

// kubectlFor returns a function that runs the real kubectl (built from the
// module proxy at the API server's release, kubebin) against kubeconfig, the
// way an operator installs and removes isthmus.
func kubectlFor(ctx context.Context, t *testing.T, kubeconfig string) func(args ...string) error {
	t.Helper()
	bin, err := kubebin.Kubectl(ctx)
	if err != nil {
		t.Fatalf("kubectl: %v", err)
	}
	return func(args ...string) error {
		out, err := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
		return nil
	}
}

// agentPodsState describes the isthmus agent pods (cluster.PodsState).
func agentPodsState(ctx context.Context, cs kubernetes.Interface) string {
	return cluster.PodsState(ctx, cs, cluster.Namespace, "app.kubernetes.io/name=isthmus-agent")
}

// controllerState describes the isthmus controller pods (cluster.PodsState).
func controllerState(ctx context.Context, cs kubernetes.Interface) string {
	return cluster.PodsState(ctx, cs, cluster.Namespace, "app.kubernetes.io/name=isthmus-controller")
}
