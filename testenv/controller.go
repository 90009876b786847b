package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/controller"
	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// ControllerLog returns the log file of the lab's controller.
func (l *Lab) ControllerLog() string {
	return filepath.Join(l.StateDir(), "controller.log")
}

// StartController runs `isthmus controller` (the lab's binary) on the host
// against the lab's API server, with leader election on the Lease in
// controller.DefaultNamespace (created here, as deploy/ does), as the
// Deployment of deploy/ would. It labels the Nodes with their Site and writes
// Site status; the scenario's podCIDRs and tunnel addresses are already in
// its pools, so it keeps them. Down stops it. The lab must be in SourceKube.
func (l *Lab) StartController(ctx context.Context) error {
	if l.kube == nil {
		return errors.New("start controller: the lab is not in Kubernetes mode (SourceKube)")
	}
	cs, err := kubernetes.NewForConfig(l.kube.server.RESTConfig())
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: controller.DefaultNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns.Name, err)
	}
	p, err := kube.Spawn("isthmus controller", l.ControllerLog(), l.Binary, "controller",
		"--kubeconfig", l.kube.kubeconfig, "--identity", "lab-"+l.Name)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.kube.controller = p
	l.mu.Unlock()
	return nil
}

// stopController stops the controller StartController started, if any. It
// is idempotent.
func (l *Lab) stopController() error {
	if l.kube == nil {
		return nil
	}
	l.mu.Lock()
	p := l.kube.controller
	l.kube.controller = nil
	l.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := p.Stop(); err != nil {
		return fmt.Errorf("stop controller: %w", err)
	}
	return nil
}

// SiteCondition is one Site's Ready condition as the controller wrote it.
type SiteCondition struct {
	Site    string
	Status  metav1.ConditionStatus // "" when the controller has written none yet
	Reason  string
	Message string
}

func (c SiteCondition) String() string {
	if c.Status == "" {
		return fmt.Sprintf("site %s: Ready not reported yet", c.Site)
	}
	return fmt.Sprintf("site %s: Ready %s %s %s", c.Site, c.Status, c.Reason, c.Message)
}

// SiteConditions reads every Site's Ready condition from the lab's API
// server, through the kubeconfig in its state directory (so an attached lab,
// in another process than the one serving it, can read them too). A lab not
// in Kubernetes mode has no kubeconfig there: os.ErrNotExist.
func (l *Lab) SiteConditions(ctx context.Context) ([]SiteCondition, error) {
	path := filepath.Join(l.StateDir(), "kubeconfig")
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig %s: %w", path, err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create dynamic client: %w", err)
	}
	list, err := dc.Resource(controller.SiteResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list sites: %w", err)
	}
	var out []SiteCondition
	for _, u := range list.Items {
		var s v1alpha1.Site
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
			return nil, fmt.Errorf("decode site %s: %w", u.GetName(), err)
		}
		c := SiteCondition{Site: s.Name}
		if r := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady); r != nil {
			c.Status, c.Reason, c.Message = r.Status, r.Reason, strings.TrimSpace(r.Message)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Site < out[j].Site })
	return out, nil
}
