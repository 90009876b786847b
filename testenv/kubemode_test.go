package testenv

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestKubeMode builds the default scenario's topology in Kubernetes mode
// without agents: the API server holds the scenario's Sites, SitePeering and
// Nodes (addresses in status, podCIDRs in spec), the kubeconfig works from
// the host and, through the forwarder, from inside every node namespace, and
// Down closes the forwarders and stops the server.
func TestKubeMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the lab builds network namespaces: run as root")
	}
	sc, err := LoadScenario("default")
	if err != nil {
		t.Fatal(err)
	}
	name := "k" + strconv.Itoa(rand.IntN(1e6))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a first build of the binaries
	defer cancel()
	l, err := Up(ctx, sc, Options{Name: name, Datapath: DatapathNone, Source: SourceKube})
	if err != nil {
		t.Fatal(err)
	}
	down := false
	t.Cleanup(func() {
		if !down {
			l.Down()
		}
	})
	server := l.Kube()
	if server == nil || l.Kubeconfig() == "" {
		t.Fatal("no API server or kubeconfig in Kubernetes mode")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range sc.Nodes() {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.Address.String()}) {
			t.Errorf("node %s addresses %v, want InternalIP %s", n.Name, node.Status.Addresses, n.Address)
		}
		if len(node.Spec.PodCIDRs) != len(n.PodCIDRs) || node.Spec.PodCIDRs[0] != n.PodCIDRs[0].String() {
			t.Errorf("node %s podCIDRs %v, want %v", n.Name, node.Spec.PodCIDRs, n.PodCIDRs)
		}
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for res, want := range map[string]int{"sites": len(sc.Sites), "sitepeerings": len(sc.Peerings)} {
		list, err := dyn.Resource(isthmusGVR(res)).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != want {
			t.Errorf("%d %s in the API server, want %d", len(list.Items), res, want)
		}
	}

	// From inside each node namespace, 127.0.0.1:<port> is the API server.
	pool := x509.NewCertPool()
	raw, err := clientcmd.LoadFromFile(l.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range raw.Clusters {
		pool.AppendCertsFromPEM(c.CertificateAuthorityData)
	}
	addr := "127.0.0.1:" + strconv.Itoa(server.Port())
	for _, n := range sc.Nodes() {
		var conn net.Conn
		if err := Do(l.NodeNS(n.Name), func() (err error) {
			conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
			return err
		}); err != nil {
			t.Fatalf("node %s: dial the API server at %s: %v", n.Name, addr, err)
		}
		status := readyz(t, conn, pool)
		if status != http.StatusOK {
			t.Errorf("node %s: /readyz through the forwarder: %d", n.Name, status)
		}
	}

	down = true
	if err := l.Down(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(server.Dir()); !os.IsNotExist(err) {
		t.Errorf("API server directory %s left after Down (stat: %v)", server.Dir(), err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("API server still answers on %s after Down", addr)
	}
}

// readyz sends GET /readyz over conn (TLS, verified against pool) and returns
// the status code.
func readyz(t *testing.T, conn net.Conn, pool *x509.CertPool) int {
	t.Helper()
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1/readyz", nil)
	if err := req.Write(tc); err != nil {
		t.Fatalf("send /readyz: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	if err != nil {
		t.Fatalf("read /readyz: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func isthmusGVR(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "isthmus.dev", Version: "v1alpha1", Resource: resource}
}
