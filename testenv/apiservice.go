package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// apiSliceManager is the endpointslice.kubernetes.io/managed-by of the
// kubernetes Service's EndpointSlice the lab writes: no controller of the
// cluster claims it.
const apiSliceManager = "isthmus-lab"

// ServeAPIToPods makes the API server reachable from pods as a cluster's is,
// through the default/kubernetes Service (kube.APIServiceIP:443), which
// in-cluster clients such as CoreDNS dial. The lab's API server listens on the
// host's loopback and its reconciler of that Service's endpoints is off, so
// the lab does both parts itself: in every node's namespace a forwarder
// listens on the node's address at the API server's port (beside the one on
// 127.0.0.1 the agents use), and an EndpointSlice of the kubernetes Service
// (and an Endpoints object) lists every node's address at that port, for
// kube-proxy (StartKubeProxy) to carry the Service to; the Service's internalTrafficPolicy is Local, so a
// pod's connection goes to its own node's forwarder. The lab must be in SourceKube; the forwarders close
// on Down. Calling it twice is an error.
func (l *Lab) ServeAPIToPods(ctx context.Context) error {
	if l.kube == nil {
		return fmt.Errorf("serve the API server to pods: the lab is not in Kubernetes mode (SourceKube)")
	}
	port := l.kube.server.Port()
	target := "127.0.0.1:" + strconv.Itoa(port)
	var endpoints []discoveryv1.Endpoint
	for _, n := range l.Scenario.Nodes() {
		addr := net.JoinHostPort(n.Address.String(), strconv.Itoa(port))
		var ln net.Listener
		err := Do(l.NodeNS(n.Name), func() (err error) {
			ln, err = net.Listen("tcp", addr)
			return err
		})
		if err != nil {
			return fmt.Errorf("node %s: forward the API server on %s: %w", n.Name, addr, err)
		}
		l.mu.Lock()
		l.kube.listeners = append(l.kube.listeners, ln)
		l.mu.Unlock()
		l.kube.wg.Add(1)
		go func() { defer l.kube.wg.Done(); forward(ln, target) }()
		ready, name := true, n.Name
		endpoints = append(endpoints, discoveryv1.Endpoint{Addresses: []string{n.Address.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &name})
	}
	cs, err := kubernetes.NewForConfig(l.kube.server.RESTConfig())
	if err != nil {
		return fmt.Errorf("serve the API server to pods: %w", err)
	}
	svc, err := cs.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("serve the API server to pods: %w", err)
	}
	// Each node's pods reach the API server through their own node's
	// forwarder (internalTrafficPolicy Local; every endpoint names its
	// node), as a cluster's pods reach its one API server from wherever
	// they run: the lab's path to it never depends on one node reaching
	// another, which a scenario's firewall may forbid across sites
	// (crossSite: gateways). The API server's reconciler of the Service
	// keeps its ports and type, not this.
	if local := corev1.ServiceInternalTrafficPolicyLocal; svc.Spec.InternalTrafficPolicy == nil || *svc.Spec.InternalTrafficPolicy != local {
		svc.Spec.InternalTrafficPolicy = &local
		if svc, err = cs.CoreV1().Services(metav1.NamespaceDefault).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("serve the API server to pods: internalTrafficPolicy Local on the kubernetes Service: %w", err)
		}
	}
	var portName string
	for _, p := range svc.Spec.Ports {
		if p.Port == 443 {
			portName = p.Name
		}
	}
	proto, p32 := corev1.ProtocolTCP, int32(port)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault, Labels: map[string]string{
			discoveryv1.LabelServiceName: "kubernetes",
			discoveryv1.LabelManagedBy:   apiSliceManager,
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &p32}},
	}
	_, err = cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Update(ctx, slice, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("serve the API server to pods: write the kubernetes EndpointSlice: %w", err)
	}
	// The Endpoints object too, as the API server's reconciler keeps it: a
	// client may read either (the conformance case of the kubernetes Service
	// checks that both list the same addresses and port).
	var subset corev1.EndpointSubset
	for _, e := range endpoints {
		subset.Addresses = append(subset.Addresses, corev1.EndpointAddress{IP: e.Addresses[0], NodeName: e.NodeName})
	}
	subset.Ports = []corev1.EndpointPort{{Name: portName, Port: p32, Protocol: proto}}
	eps := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault},
		Subsets: []corev1.EndpointSubset{subset}}
	_, err = cs.CoreV1().Endpoints(metav1.NamespaceDefault).Create(ctx, eps, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = cs.CoreV1().Endpoints(metav1.NamespaceDefault).Update(ctx, eps, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("serve the API server to pods: write the kubernetes Endpoints: %w", err)
	}
	return nil
}
