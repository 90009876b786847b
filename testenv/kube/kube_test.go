package kube_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// Paths from this package's directory.
const (
	deployDir = "../../deploy"
	crdDir    = "../../deploy/crds"
)

var siteGVR = schema.GroupVersionResource{Group: "isthmus.dev", Version: "v1alpha1", Resource: "sites"}

// startServer starts an API server for one test and stops it when the test
// ends. A failed build of the binaries fails the test with the build's output.
func startServer(t testing.TB) *kube.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // the first build is slow
	defer cancel()
	s, err := kube.Start(ctx, kube.Options{})
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop API server: %v", err)
		}
	})
	return s
}

// startWithCRDs starts an API server with the CRDs of deploy/crds installed.
func startWithCRDs(t testing.TB) *kube.Server {
	t.Helper()
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.InstallCRDs(ctx, crdDir); err != nil {
		t.Fatal(err)
	}
	return s
}

func clientset(t *testing.T, s *kube.Server) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func dynClient(t *testing.T, s *kube.Server) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(s.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestServer: the server answers through its REST config and its kubeconfig,
// the admin is authorised, an anonymous client is not, and Stop ends both
// processes and removes the directory.
func TestServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s, err := kube.Start(ctx, kube.Options{})
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s.Stop()
		}
	})
	cs := clientset(t, s)
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get namespace default: %v", err)
	}
	if ns.Name != "default" {
		t.Fatalf("got namespace %q", ns.Name)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v.GitVersion, "v1.") {
		t.Errorf("server version %q, want v1.x", v.GitVersion)
	}
	t.Logf("kube-apiserver %s", v.GitVersion)

	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	kcs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kcs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list nodes through the kubeconfig: %v", err)
	}

	// RBAC is on: a service account with no binding may not list nodes.
	anon := s.RESTConfig()
	anon.BearerToken = ""
	acs, err := kubernetes.NewForConfig(anon)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("anonymous list nodes: %v, want Forbidden", err)
	}

	pids := processesUnder(t, s.Dir())
	if len(pids) != 2 {
		t.Fatalf("%d processes run from %s, want etcd and kube-apiserver", len(pids), s.Dir())
	}
	stopped = true
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d still runs after Stop", pid)
		}
	}
	if _, err := os.Stat(s.Dir()); !os.IsNotExist(err) {
		t.Errorf("%s left after Stop (stat: %v)", s.Dir(), err)
	}
}

// processesUnder returns the pids whose command line names dir.
func processesUnder(t *testing.T, dir string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestCRDsInstall: every CRD of deploy/crds is Established, serves
// isthmus.dev/v1alpha1, is cluster-scoped, and has a status subresource.
func TestCRDsInstall(t *testing.T) {
	s := startWithCRDs(t)
	ctx := context.Background()
	objs, err := kube.ReadManifests(crdDir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"sites.isthmus.dev": false, "sitepeerings.isthmus.dev": false,
		"gatewaypools.isthmus.dev": false, "sitegatewaypoolassignments.isthmus.dev": false,
	}
	crds := dynClient(t, s).Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, o := range objs {
		if _, ok := want[o.GetName()]; !ok {
			continue
		}
		want[o.GetName()] = true
		crd, err := crds.Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if scope, _, _ := unstructured.NestedString(crd.Object, "spec", "scope"); scope != "Cluster" {
			t.Errorf("%s: scope %q, want Cluster", o.GetName(), scope)
		}
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		var served bool
		for _, v := range versions {
			vm := v.(map[string]any)
			if vm["name"] == "v1alpha1" && vm["served"] == true {
				served = true
				if _, ok, _ := unstructured.NestedMap(vm, "subresources", "status"); !ok {
					t.Errorf("%s v1alpha1: no status subresource", o.GetName())
				}
			}
		}
		if !served {
			t.Errorf("%s: v1alpha1 not served", o.GetName())
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("no CRD %s in %s", name, crdDir)
		}
	}
	// The resources are usable: a valid Site is stored with its defaults.
	site := newSite("defaults", map[string]any{"nodeCidrs": []any{"172.16.1.0/24"}})
	got, err := dynClient(t, s).Resource(siteGVR).Create(ctx, site, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a valid Site: %v", err)
	}
	if v, _, _ := unstructured.NestedBool(got.Object, "spec", "manageCniPlugin"); !v {
		t.Errorf("Site stored with manageCniPlugin %v, want the default true: %v", v, got.Object["spec"])
	}
}

func newSite(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "isthmus.dev/v1alpha1",
		"kind":       "Site",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
}

// TestCRDValidation: the API server rejects invalid isthmus objects with the
// CRD's own messages, and names the field.
func TestCRDValidation(t *testing.T) {
	s := startWithCRDs(t)
	ctx := context.Background()
	dyn := dynClient(t, s)
	cases := []struct {
		name     string
		gvr      schema.GroupVersionResource
		obj      *unstructured.Unstructured
		wantMsgs []string
	}{
		{"node CIDR with /33", siteGVR,
			newSite("bad-nodecidr", map[string]any{"nodeCidrs": []any{"172.16.1.0/33"}}),
			[]string{"spec.nodeCidrs[0]", "must be a CIDR"}},
		{"pod block not a CIDR", siteGVR,
			newSite("bad-podblock", map[string]any{"podCidrAssignments": []any{
				map[string]any{"cidrBlocks": []any{"10.244.0.0"}}}}),
			[]string{"spec.podCidrAssignments[0].cidrBlocks[0]", "must be a CIDR"}},
		{"local CIDR garbage", siteGVR,
			newSite("bad-local", map[string]any{"localCidrs": []any{"ten.0.0.0/8"}}),
			[]string{"spec.localCidrs[0]", "must be a CIDR"}},
		{"unknown returnPath", siteGVR,
			newSite("bad-returnpath", map[string]any{"returnPath": "Tunnel"}),
			[]string{"spec.returnPath", `Unsupported value: "Tunnel"`, `"Fabric"`, `"SNAT"`}},
		{"tunnel MTU too small", siteGVR,
			newSite("bad-mtu", map[string]any{"tunnelMTU": int64(100)}),
			[]string{"spec.tunnelMTU", "576"}},
		{"unknown gateway pool type",
			schema.GroupVersionResource{Group: "isthmus.dev", Version: "v1alpha1", Resource: "gatewaypools"},
			&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "isthmus.dev/v1alpha1", "kind": "GatewayPool",
				"metadata": map[string]any{"name": "bad-type"},
				"spec":     map[string]any{"type": "Public", "nodeSelector": map[string]any{}},
			}},
			[]string{"spec.type", `Unsupported value: "Public"`, `"Internal"`, `"External"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := dyn.Resource(c.gvr).Create(ctx, c.obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("created %s %s, want it rejected", c.obj.GetKind(), c.obj.GetName())
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("error %v (reason %s), want Invalid", err, apierrors.ReasonForError(err))
			}
			for _, m := range c.wantMsgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not contain %q", err, m)
				}
			}
			if _, err := dyn.Resource(c.gvr).Get(ctx, c.obj.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("get after rejected create: %v, want NotFound", err)
			}
		})
	}
}

// TestManifestsDryRun applies every object of `kubectl apply -k deploy/` to
// the API server with server-side dry run (the namespace is created for real
// first, the CRDs installed), so a manifest the API server would refuse fails
// here: a schema error, a wrong field, a bad RBAC rule, a privileged pod that
// admission rejects.
func TestManifestsDryRun(t *testing.T) {
	objs, err := kube.Kustomization(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s renders no objects", deployDir)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "DaemonSet", "Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if kinds[k] == 0 {
			t.Errorf("%s renders no %s (kinds: %v)", deployDir, k, kinds)
		}
	}
	s := startWithCRDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var namespaces, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			namespaces = append(namespaces, o)
		} else {
			rest = append(rest, o)
		}
	}
	if err := s.Apply(ctx, namespaces, kube.ApplyOptions{}); err != nil {
		t.Fatalf("create namespaces: %v", err)
	}
	if err := s.Apply(ctx, rest, kube.ApplyOptions{DryRun: true}); err != nil {
		t.Fatalf("server-side dry run of %s:\n%v", deployDir, err)
	}
	// Dry run stored nothing.
	cs := clientset(t, s)
	for _, o := range rest {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		if _, err := cs.AppsV1().DaemonSets(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("DaemonSet %s/%s after dry run: %v, want NotFound", o.GetNamespace(), o.GetName(), err)
		}
	}
	// And it is a real check: a broken object is refused.
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "DaemonSet",
		"metadata": map[string]any{"name": "broken", "namespace": namespaces[0].GetName()},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": "a"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "b"}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "x"}}},
			},
		},
	}}
	if err := s.Apply(ctx, []*unstructured.Unstructured{bad}, kube.ApplyOptions{DryRun: true}); err == nil ||
		!strings.Contains(err.Error(), "selector") {
		t.Errorf("dry run of a DaemonSet whose selector misses its template: %v, want a selector error", err)
	}
}
