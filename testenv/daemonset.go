package testenv

// The lab as a cluster that runs isthmus from deploy/ (Options.NoAgents): the
// agents are the DaemonSet's pods, started by a kubelet on each node. The lab
// nodes share one kernel, one bpffs and one host file system, and a
// DaemonSet has one pod template for every node, so the lab's overlay of
// deploy/ (DeployOverlay) gives each node's agent the paths the lab's own
// agents use, chosen per pod from its node's name ($(NODE_NAME) in the
// arguments): the pins in PinDir(node), the CNI files in CNIBinDir(node),
// CNIConfDir(node), IPAMDir(node) and IPAMSocket(node). docs/lab.md says
// more.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"text/template"
)

// prepareDaemonSet readies the nodes for agents from the DaemonSet: each
// node's CNI directories (the runtime watches them before the agent writes
// there), and the lab's pin directory bind mounted on itself with shared
// propagation, the DaemonSet's bpffs volume (mounted with Bidirectional
// propagation, which the runtime allows only from a shared mount; the
// machine's /sys/fs/bpf stays as it is).
func (l *Lab) prepareDaemonSet() error {
	for _, n := range l.Scenario.Nodes() {
		for _, d := range []string{cniBinDir(l.Name, n.Name), cniConfDir(l.Name, n.Name)} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("node %s: create CNI dir: %w", n.Name, err)
			}
		}
	}
	pins := filepath.Join(PinRoot, l.Name)
	if err := os.MkdirAll(pins, 0o755); err != nil {
		return fmt.Errorf("create pin dir: %w", err)
	}
	if err := syscall.Mount(pins, pins, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", pins, err)
	}
	if err := syscall.Mount("", pins, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", pins, err)
	}
	return nil
}

// unmountShared undoes prepareDaemonSet's mount of dir (and any mount the
// agents' pods propagated there), if there is one.
func unmountShared(dir string, logf func(string, ...any)) {
	for i := 0; i < 8; i++ {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				logf("unmount %s: %v", dir, err)
			}
			return
		}
	}
}

// DeployDir returns deploy/ of the source tree this package was built from.
func DeployDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "deploy")
}

// DeployOverlay writes into dir the lab's kustomization of deploy/: deploy/
// as a base, unchanged but for the image (isthmus to image, "name:tag") and
// what a lab must change because its nodes share one machine and reach the
// API server through the lab's forwarders:
//
//   - the agent's pins in PinDir(node): the bpffs volume is the lab's pin
//     directory (prepareDaemonSet), so --pin-dir is /sys/fs/bpf/$(NODE_NAME)
//     in the pod;
//   - the agent's CNI files in the lab's per-node directories: one volume,
//     the lab's CNI directory at the same path in the pod as on the host (the
//     conflist the agent writes names the socket the plugin dials on the
//     host), instead of the node-wide /opt/cni/bin, /etc/cni/net.d,
//     /var/lib/isthmus and /run/isthmus, and the four CNI flags naming
//     $(NODE_NAME)'s directories;
//   - KUBERNETES_SERVICE_HOST and _PORT in the agent and the controller: the
//     lab's API server is 127.0.0.1:<port> in every node's namespace (the
//     lab's forwarder), and the lab has no kube-proxy for the kubernetes
//     Service's ClusterIP.
//
// Every JSON patch first tests the value it replaces, so a change to
// deploy/ that moves what the overlay changes fails the render instead of
// patching the wrong thing.
func (l *Lab) DeployOverlay(dir, image string) error {
	if l.kube == nil {
		return errors.New("deploy overlay: the lab is not in Kubernetes mode")
	}
	return writeDeployOverlay(dir, l.Name, image, l.kube.server.Port())
}

// OtherCNIPodInterfaces is the agent's --pod-interfaces on a cluster some of
// whose nodes run another CNI, the bridge plugin of a site that does not
// manage the CNI (cri.BridgeCNI), besides isthmus-cni's (pod-*): the bridge
// cni0, not its veth<hex> ports, since the pods' addresses route through
// cni0 and pod_ingress checks a pod's source against the route back to it
// (docs/unmanaged-sites.md, "In a cluster").
const OtherCNIPodInterfaces = "--pod-interfaces=pod-*,cni0"

// DeployOperatorOverlay writes into dir an operator's kustomization on top of
// the lab's overlay of deploy/ (DeployOverlay, written into dir/lab): the
// agent's arguments plus args, as docs/install.md's overlay adds
// --pod-interfaces. `kubectl apply -k dir` installs it.
func (l *Lab) DeployOperatorOverlay(dir, image string, args ...string) error {
	if l.kube == nil {
		return errors.New("deploy operator overlay: the lab is not in Kubernetes mode")
	}
	return writeOperatorOverlay(dir, l.Name, image, l.kube.server.Port(), args)
}

// writeOperatorOverlay is DeployOperatorOverlay for lab, image and the API
// server's port.
func writeOperatorOverlay(dir, lab, image string, apiPort int, args []string) error {
	if err := writeDeployOverlay(filepath.Join(dir, "lab"), lab, image, apiPort); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("resources: [lab]\npatches:\n- target: {kind: DaemonSet, name: isthmus-agent}\n  patch: |-\n")
	for _, a := range args {
		fmt.Fprintf(&b, "    - {op: add, path: /spec/template/spec/containers/0/args/-, value: %q}\n", a)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("deploy operator overlay: %w", err)
	}
	return nil
}

// writeDeployOverlay is DeployOverlay for lab, image and the API server's
// port.
func writeDeployOverlay(dir, lab, image string, apiPort int) error {
	return writeOverlay(dir, lab, image, apiPort, "", overlayTemplate)
}

// writeOverlay writes the kustomization tmpl makes of deploy/<base> into
// dir.
func writeOverlay(dir, lab, image string, apiPort int, base string, tmpl *template.Template) error {
	name, tag, ok := strings.Cut(image, ":")
	if !ok {
		return fmt.Errorf("deploy overlay: image %q has no tag", image)
	}
	// kustomize takes no absolute path to a base.
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("deploy overlay: %w", err)
	}
	deploy, err := filepath.Rel(abs, filepath.Join(DeployDir(), base))
	if err != nil {
		return fmt.Errorf("deploy overlay: %w", err)
	}
	var buf bytes.Buffer
	err = tmpl.Execute(&buf, map[string]any{
		"Lab": lab, "Deploy": deploy, "ImageName": name, "ImageTag": tag,
		"Pins": filepath.Join(PinRoot, lab), "CNI": filepath.Join(StateDir(lab), "cni"),
		"APIPort": apiPort,
	})
	if err != nil {
		return fmt.Errorf("deploy overlay: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("deploy overlay: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("deploy overlay: %w", err)
	}
	return nil
}

// UninstallOverlay writes into dir the lab's kustomization of
// deploy/uninstall/, as DeployOverlay does for deploy/: the image, and the
// uninstall pod's pin and CNI paths those of its node in the lab (its
// container gets NODE_NAME from the downward API, as the agent's has).
func (l *Lab) UninstallOverlay(dir, image string) error {
	return writeOverlay(dir, l.Name, image, 0, "uninstall", uninstallTemplate)
}

var overlayTemplate = template.Must(template.New("overlay").Parse(`# The overlay of deploy/ for lab {{.Lab}} (testenv.Lab.DeployOverlay).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- {{.Deploy}}
images:
- name: isthmus
  newName: {{.ImageName}}
  newTag: "{{.ImageTag}}"
patches:
- target: {group: apps, version: v1, kind: DaemonSet, name: isthmus-agent}
  patch: |-
    - {op: test, path: /spec/template/spec/volumes/0/name, value: bpffs}
    - {op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: {{.Pins}}}
    - {op: test, path: /spec/template/spec/volumes/1/name, value: cni-bin}
    - {op: replace, path: /spec/template/spec/volumes/1/hostPath/path, value: {{.CNI}}}
    - {op: test, path: /spec/template/spec/volumes/4/name, value: ipam-socket}
    - {op: remove, path: /spec/template/spec/volumes/4}
    - {op: test, path: /spec/template/spec/volumes/3/name, value: ipam-data}
    - {op: remove, path: /spec/template/spec/volumes/3}
    - {op: test, path: /spec/template/spec/volumes/2/name, value: cni-conf}
    - {op: remove, path: /spec/template/spec/volumes/2}
    - {op: test, path: /spec/template/spec/containers/0/volumeMounts/1/name, value: cni-bin}
    - {op: replace, path: /spec/template/spec/containers/0/volumeMounts/1/mountPath, value: {{.CNI}}}
    - {op: test, path: /spec/template/spec/containers/0/volumeMounts/4/name, value: ipam-socket}
    - {op: remove, path: /spec/template/spec/containers/0/volumeMounts/4}
    - {op: test, path: /spec/template/spec/containers/0/volumeMounts/3/name, value: ipam-data}
    - {op: remove, path: /spec/template/spec/containers/0/volumeMounts/3}
    - {op: test, path: /spec/template/spec/containers/0/volumeMounts/2/name, value: cni-conf}
    - {op: remove, path: /spec/template/spec/containers/0/volumeMounts/2}
    - {op: test, path: /spec/template/spec/containers/0/args/3, value: --pin-dir}
    - {op: replace, path: /spec/template/spec/containers/0/args/4, value: /sys/fs/bpf/$(NODE_NAME)}
    - {op: test, path: /spec/template/spec/containers/0/args/9, value: --ipam-socket}
    - {op: replace, path: /spec/template/spec/containers/0/args/10, value: {{.CNI}}/$(NODE_NAME)/ipam.sock}
    - {op: test, path: /spec/template/spec/containers/0/args/11, value: --ipam-dir}
    - {op: replace, path: /spec/template/spec/containers/0/args/12, value: {{.CNI}}/$(NODE_NAME)/ipam}
    - {op: test, path: /spec/template/spec/containers/0/args/13, value: --cni-bin-dir}
    - {op: replace, path: /spec/template/spec/containers/0/args/14, value: {{.CNI}}/$(NODE_NAME)/bin}
    - {op: test, path: /spec/template/spec/containers/0/args/15, value: --cni-conf-dir}
    - {op: replace, path: /spec/template/spec/containers/0/args/16, value: {{.CNI}}/$(NODE_NAME)/net.d}
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--state-dir={{.CNI}}/$(NODE_NAME)/state"}
    - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}}
    - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "{{.APIPort}}"}}
- target: {group: apps, version: v1, kind: Deployment, name: isthmus-controller}
  patch: |-
    - {op: test, path: /spec/template/spec/containers/0/name, value: controller}
    - {op: add, path: /spec/template/spec/containers/0/env, value: [{name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}, {name: KUBERNETES_SERVICE_PORT, value: "{{.APIPort}}"}]}
`))

var uninstallTemplate = template.Must(template.New("uninstall").Parse(`# The overlay of deploy/uninstall/ for lab {{.Lab}} (testenv.Lab.UninstallOverlay).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- {{.Deploy}}
images:
- name: isthmus
  newName: {{.ImageName}}
  newTag: "{{.ImageTag}}"
patches:
- target: {group: apps, version: v1, kind: DaemonSet, name: isthmus-uninstall}
  patch: |-
    - {op: test, path: /spec/template/spec/volumes/0/name, value: bpffs}
    - {op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: {{.Pins}}}
    - {op: test, path: /spec/template/spec/volumes/1/name, value: cni-bin}
    - {op: replace, path: /spec/template/spec/volumes/1/hostPath/path, value: {{.CNI}}}
    - {op: test, path: /spec/template/spec/volumes/2/name, value: cni-conf}
    - {op: remove, path: /spec/template/spec/volumes/2}
    - {op: test, path: /spec/template/spec/initContainers/0/volumeMounts/1/name, value: cni-bin}
    - {op: replace, path: /spec/template/spec/initContainers/0/volumeMounts/1/mountPath, value: {{.CNI}}}
    - {op: test, path: /spec/template/spec/initContainers/0/volumeMounts/2/name, value: cni-conf}
    - {op: remove, path: /spec/template/spec/initContainers/0/volumeMounts/2}
    - {op: test, path: /spec/template/spec/initContainers/0/args/1, value: --pin-dir}
    - {op: replace, path: /spec/template/spec/initContainers/0/args/2, value: /sys/fs/bpf/$(NODE_NAME)}
    - {op: test, path: /spec/template/spec/initContainers/0/args/3, value: --cni-bin-dir}
    - {op: replace, path: /spec/template/spec/initContainers/0/args/4, value: {{.CNI}}/$(NODE_NAME)/bin}
    - {op: test, path: /spec/template/spec/initContainers/0/args/5, value: --cni-conf-dir}
    - {op: replace, path: /spec/template/spec/initContainers/0/args/6, value: {{.CNI}}/$(NODE_NAME)/net.d}
    - {op: add, path: /spec/template/spec/initContainers/0/env, value: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]}
`))
