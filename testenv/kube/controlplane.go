package kube

import (
	"fmt"
	"path/filepath"
	"strings"
)

// ControllerManagerControllers are the kube-controller-manager controllers
// StartControlPlane runs: what a DaemonSet and a Deployment need to become
// pods (daemonset, deployment, replicaset), what their pods need to start
// (the default ServiceAccount of each namespace, the kube-root-ca.crt
// ConfigMap their token volume projects), what deleting them needs
// (garbage collection of the pods, namespace deletion), and the
// EndpointSlices of Services with a selector, which kube-proxy carries and
// the cluster DNS answers from (headless Services), and the node lifecycle
// controller, which lifts the not-ready taint the API server's admission
// puts on every new Node once its kubelet reports Ready (without it only
// pods that tolerate the taint are ever scheduled). No taint-based eviction
// and no podCIDR allocation: isthmus assigns them (docs/install.md).
var ControllerManagerControllers = []string{
	"daemonset-controller", "deployment-controller", "replicaset-controller",
	"serviceaccount-controller", "root-ca-certificate-publisher-controller",
	"garbage-collector-controller", "namespace-controller", "endpointslice-controller",
	"node-lifecycle-controller",
}

// ClusterControllers are the kube-controller-manager controllers of a whole
// cluster (testenv/cluster): every controller enabled by default, as a
// kubeadm cluster runs them, among them the EndpointSlice, Endpoints and
// ReplicationController controllers Services and the conformance suite need.
// The node IPAM controller allocates nothing (--allocate-node-cidrs=false);
// the cloud controllers find no cloud and stay idle.
var ClusterControllers = []string{"*"}

// StartControlPlane starts kube-controller-manager (ControllerManagerControllers)
// and kube-scheduler against the server, on the host, with the admin
// kubeconfig, no leader election and no serving port. Their logs are
// kube-controller-manager.log and kube-scheduler.log in the server's
// directory. The binaries come from kubebin.ControlPlane. The caller stops
// both (Process.Stop), also when the second fails to start.
func (s *Server) StartControlPlane(controllerManager, scheduler string) (kcm, sched *Process, err error) {
	return s.StartControlPlaneWith(controllerManager, scheduler, ControllerManagerControllers)
}

// StartControlPlaneWith is StartControlPlane running the given
// kube-controller-manager controllers (--controllers).
func (s *Server) StartControlPlaneWith(controllerManager, scheduler string, controllers []string) (kcm, sched *Process, err error) {
	cfg := s.Kubeconfig()
	kcm, err = s.spawn("kube-controller-manager", controllerManager,
		"--kubeconfig="+cfg,
		"--leader-elect=false",
		"--secure-port=0",
		"--controllers="+strings.Join(controllers, ","),
		"--allocate-node-cidrs=false",
		// The CA pods trust for the API server (kube-root-ca.crt).
		"--root-ca-file="+filepath.Join(s.dir, "ca.crt"),
		"--concurrent-gc-syncs=2",
		"--v=1")
	if err != nil {
		return nil, nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	sched, err = s.spawn("kube-scheduler", scheduler,
		"--kubeconfig="+cfg,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1")
	if err != nil {
		return kcm, nil, fmt.Errorf("start kube-scheduler: %w", err)
	}
	return kcm, sched, nil
}

// LogTail returns the last n lines of a log the server's directory holds
// (kube-apiserver.log, kube-controller-manager.log, ...).
func (s *Server) LogTail(name string, n int) string {
	return tailFile(filepath.Join(s.dir, name), n)
}
