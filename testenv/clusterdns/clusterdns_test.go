package clusterdns

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestObjects: coredns.yaml renders to kubeadm's set of objects, with the
// Service at the address asked for, the Corefile serving the domain asked for
// without a forward (nothing upstream here), the image asked for, and the
// node selector merged into kubeadm's.
func TestObjects(t *testing.T) {
	objs, err := Objects(Config{Image: "registry.k8s.io/coredns/coredns:v9", ServiceIP: netip.MustParseAddr("10.96.0.53"),
		Domain: "lab.example", Replicas: 3, NodeSelector: map[string]string{"kubernetes.io/hostname": "b1"}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	byKind := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+" "+o.GetName())
		byKind[o.GetKind()] = o
	}
	if got, want := strings.Join(kinds, ", "), "ServiceAccount coredns, ClusterRole system:coredns, ClusterRoleBinding system:coredns, ConfigMap coredns, Deployment coredns, Service kube-dns"; got != want {
		t.Errorf("objects %s, want %s", got, want)
	}
	if ip, _, _ := unstructured.NestedString(byKind["Service"].Object, "spec", "clusterIP"); ip != "10.96.0.53" {
		t.Errorf("Service clusterIP %q", ip)
	}
	corefile, _, _ := unstructured.NestedString(byKind["ConfigMap"].Object, "data", "Corefile")
	if !strings.Contains(corefile, "kubernetes lab.example in-addr.arpa ip6.arpa {") || strings.Contains(corefile, "forward") {
		t.Errorf("Corefile:\n%s", corefile)
	}
	dep := byKind["Deployment"].Object
	if n, _, _ := unstructured.NestedFieldNoCopy(dep, "spec", "replicas"); fmt.Sprint(n) != "3" {
		t.Errorf("replicas %v", n)
	}
	sel, _, _ := unstructured.NestedStringMap(dep, "spec", "template", "spec", "nodeSelector")
	if len(sel) != 2 || sel["kubernetes.io/os"] != "linux" || sel["kubernetes.io/hostname"] != "b1" {
		t.Errorf("nodeSelector %v", sel)
	}
	cs, _, _ := unstructured.NestedSlice(dep, "spec", "template", "spec", "containers")
	if len(cs) != 1 || cs[0].(map[string]any)["image"] != "registry.k8s.io/coredns/coredns:v9" {
		t.Errorf("containers %v", cs)
	}
}
