package clusterdns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/isthmus-dev/isthmus/testenv/kube"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// TestCorefileAnswersFromAPI: the objects of coredns.yaml are accepted by a
// real API server (applied, not a dry run), and the CoreDNS that
// kubebin.CoreDNS builds, run on the host with the ConfigMap's Corefile,
// answers from that API server: a Service's ClusterIP, a headless Service's
// endpoint, and SERVFAIL at once for a name outside the cluster, over UDP and
// TCP, as dig (BIND's resolver) reads them. The Corefile is the ConfigMap's
// with only what a process on the host needs changed: loopback ports instead
// of 53, 8080, 8181 and 9153, and the kubeconfig of the admin instead of the
// pod's service account. No root needed; TestClusterDNS (testenv/e2e) runs it
// as a pod.
func TestCorefileAnswersFromAPI(t *testing.T) {
	if err := programs.Require("dig"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // first builds are slow
	defer cancel()
	bin, err := kubebin.CoreDNS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kube.Start(ctx, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	objs, err := Objects(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.ApplyTo(ctx, s.RESTConfig(), objs, kube.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(s.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(Namespace).Get(ctx, Service, metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != kube.ClusterDNSIP.String() {
		t.Fatalf("Service %s: %v, clusterIP %v; want %s", Service, err, svc, kube.ClusterDNSIP)
	}
	// A Service and a headless one, their EndpointSlices written as the
	// EndpointSlice controller would (no controller manager runs here).
	ns := "dns-test"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const podIP = "10.244.7.9"
	var clusterIP string
	for _, name := range []string{"web", "web-headless"} {
		spec := corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 8080}}}
		if name == "web-headless" {
			spec.ClusterIP = corev1.ClusterIPNone
		}
		created, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if name == "web" {
			clusterIP = created.Spec.ClusterIP
		}
		ready, port, proto, pname := true, int32(8080), corev1.ProtocolTCP, "http"
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{podIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var corefile string
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			corefile, _, _ = unstructured.NestedString(o.Object, "data", "Corefile")
		}
	}
	ports, err := freeLoopbackPorts(4)
	if err != nil {
		t.Fatal(err)
	}
	dnsPort, readyPort := ports[0], ports[2]
	hostCorefile := corefile
	for _, r := range []struct{ old, new string }{
		{".:53 {", fmt.Sprintf(".:%d {\n    bind 127.0.0.1", dnsPort)},
		{"health {", fmt.Sprintf("health 127.0.0.1:%d {", ports[1])},
		{"ready\n", fmt.Sprintf("ready 127.0.0.1:%d\n", readyPort)},
		{"prometheus :9153", fmt.Sprintf("prometheus 127.0.0.1:%d", ports[3])},
		{"pods insecure", "pods insecure\n       kubeconfig " + s.Kubeconfig()},
	} {
		if !strings.Contains(hostCorefile, r.old) {
			t.Fatalf("the Corefile has no %q:\n%s", r.old, corefile)
		}
		hostCorefile = strings.Replace(hostCorefile, r.old, r.new, 1)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Corefile"), []byte(hostCorefile), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "coredns.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-conf", filepath.Join(dir, "Corefile"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	logTail := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "coredns.log"))
		return kubebin.TailLines(string(b), 30)
	}
	// Ready once its kubernetes plugin has synced with the API server.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(readyPort), time.Second)
		if err == nil {
			fmt.Fprintf(c, "GET /ready HTTP/1.0\r\n\r\n")
			buf := make([]byte, 64)
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, _ := c.Read(buf)
			c.Close()
			if strings.Contains(string(buf[:n]), " 200 ") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CoreDNS not ready after a minute:\n%s", logTail())
		}
	}
	// The ready plugin answers on its own listener, which can come up before
	// the server's UDP socket: wait until a UDP query of the zone is answered
	// at all (seen once under load: a UDP query refused after ready said 200).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err := exec.CommandContext(ctx, "dig", "@127.0.0.1", "-p", strconv.Itoa(dnsPort), "+notcp", "+tries=1", "+time=1",
			"+noall", "+comments", "kubernetes.default.svc.cluster.local.", "A").CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CoreDNS answers no UDP query on port %d: %v\n%s\n%s", dnsPort, err, out, logTail())
		}
	}
	for _, proto := range []string{"+notcp", "+tcp"} {
		for name, want := range map[string]string{
			"web." + ns + ".svc.cluster.local.":          "NOERROR aa " + clusterIP,
			"web-headless." + ns + ".svc.cluster.local.": "NOERROR aa " + podIP,
			"nothing." + ns + ".svc.cluster.local.":      "NXDOMAIN aa",
			"example.com.":                               "SERVFAIL",
		} {
			began := time.Now()
			out, err := exec.CommandContext(ctx, "dig", "@127.0.0.1", "-p", strconv.Itoa(dnsPort), proto, "+tries=1", "+time=3",
				"+noall", "+comments", "+answer", name, "A").CombinedOutput()
			if got := digSummary(name, string(out)); err != nil || got != want {
				t.Errorf("dig %s %s A: %q, %v; want %q\n%s", proto, name, got, err, want, out)
			} else if d := time.Since(began); d > 2*time.Second {
				t.Errorf("dig %s %s A: answered after %s, want at once", proto, name, d)
			}
		}
	}
}

var digHeader = regexp.MustCompile(`status: ([A-Z]+),[^\n]*\n;; flags: ([a-z ]*);`)

// digSummary sums up dig's output: the status, "aa" when authoritative, and
// the A records of name.
func digSummary(name, out string) string {
	m := digHeader.FindStringSubmatch(out)
	if m == nil {
		return "no header"
	}
	parts := []string{m[1]}
	for _, f := range strings.Fields(m[2]) {
		if f == "aa" {
			parts = append(parts, "aa")
		}
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == name && f[3] == "A" {
			parts = append(parts, f[4])
		}
	}
	return strings.Join(parts, " ")
}

// freeLoopbackPorts returns n ports free on 127.0.0.1 for both TCP and UDP
// when asked.
func freeLoopbackPorts(n int) ([]int, error) {
	var ports []int
	var open []net.Listener
	defer func() {
		for _, l := range open {
			l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		open = append(open, l)
		p := l.Addr().(*net.TCPAddr).Port
		if u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			u.Close()
			ports = append(ports, p)
		}
	}
	return ports, nil
}
