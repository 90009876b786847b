package deploy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// The kustomization directories this package owns. crds/ is generated and
// checked by the api package's tests; it is listed by the root kustomization.
var kustomizations = []string{".", "uninstall"}

// The image name every container uses and each kustomization's images: entry
// rewrites, so a user sets the image in one place.
const imageName = "isthmus"

// The pin directory the agent pins into and the uninstall DaemonSet removes.
const pinDir = "/sys/fs/bpf/isthmus"

// grants is the RBAC each ServiceAccount needs, derived from the code, one line
// per (scope, API group, resource, verb); "core" is the core group (""). A rule in the manifests that grants
// anything else fails the test, and so does a missing grant.
var grants = map[string][]string{
	// The agent reads through informers (loader/source/kube.go: list and watch
	// of Nodes and the four kinds, never a get) and writes one merge patch of
	// its own Node (NodeAnnotationPublisher: its WireGuard public key).
	"isthmus-system/isthmus-agent": {
		"cluster core nodes list",
		"cluster core nodes patch",
		"cluster core nodes watch",
		"cluster isthmus.dev gatewaypools list",
		"cluster isthmus.dev gatewaypools watch",
		"cluster isthmus.dev sitegatewaypoolassignments list",
		"cluster isthmus.dev sitegatewaypoolassignments watch",
		"cluster isthmus.dev sitepeerings list",
		"cluster isthmus.dev sitepeerings watch",
		"cluster isthmus.dev sites list",
		"cluster isthmus.dev sites watch",
	},
	// The controller (loader/controller/controller.go): informers on Nodes and
	// Sites, merge patches of Nodes (site label, tunnel-address annotation,
	// podCIDRs), Site UpdateStatus; in its own namespace the leader-election
	// Lease; Warning Events on invalid Sites (in the default namespace). Its
	// LeaseLock has no EventRecorder: no Events about the Lease.
	"isthmus-system/isthmus-controller": {
		"cluster core events create",
		"cluster core nodes list",
		"cluster core nodes patch",
		"cluster core nodes watch",
		"cluster isthmus.dev sites list",
		"cluster isthmus.dev sites watch",
		"cluster isthmus.dev sites/status update",
		"cluster isthmus.dev gatewaypools list",
		"cluster isthmus.dev gatewaypools watch",
		"cluster isthmus.dev gatewaypools/status update",
		"cluster isthmus.dev sitepeerings list",
		"cluster isthmus.dev sitepeerings watch",
		"cluster isthmus.dev sitepeerings/status update",
		"cluster isthmus.dev sitegatewaypoolassignments list",
		"cluster isthmus.dev sitegatewaypoolassignments watch",
		"cluster isthmus.dev sitegatewaypoolassignments/status update",
		"isthmus-system coordination.k8s.io leases create",
		"isthmus-system coordination.k8s.io leases get",
		"isthmus-system coordination.k8s.io leases update",
	},
}

// manifest is one YAML document of a file, decoded into its typed object.
type manifest struct {
	where string // file:document
	obj   any    // *corev1.Namespace, *appsv1.DaemonSet, ...
	meta  metav1.ObjectMeta
}

// newObject returns an empty typed object for apiVersion and kind, or nil for a
// kind these manifests have no business declaring.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	}
	return nil
}

// decodeFile splits a YAML file into documents and decodes each strictly (an
// unknown or duplicate field is an error) into its typed object.
func decodeFile(path string) ([]manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []manifest
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: read document %d: %w", path, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", path, i)
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		obj := newObject(tm.APIVersion, tm.Kind)
		if obj == nil {
			return nil, fmt.Errorf("%s: unexpected %s %s", where, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s: decode %s: %w", where, tm.Kind, err)
		}
		m := manifest{where: where, obj: obj}
		var om struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &om); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		m.meta = om.Metadata
		if m.meta.Name == "" {
			return nil, fmt.Errorf("%s: %s without a name", where, tm.Kind)
		}
		out = append(out, m)
	}
	return out, nil
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for l := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			b.Write(l)
		}
	}
	return b.Bytes()
}

// kustomization is the part of kustomize's Kustomization these manifests use;
// decoded strictly, so a field this test does not know fails it.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// bundle is one kustomization and the objects of the files it lists (crds/
// excepted: they are generated and another package checks them).
type bundle struct {
	dir  string
	k    kustomization
	objs []manifest
}

func loadBundle(t *testing.T, dir string) bundle {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{dir: dir}
	if err := yaml.UnmarshalStrict(data, &b.k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if b.k.APIVersion != "kustomize.config.k8s.io/v1beta1" || b.k.Kind != "Kustomization" {
		t.Fatalf("%s/kustomization.yaml: %s %s", dir, b.k.APIVersion, b.k.Kind)
	}
	for _, r := range b.k.Resources {
		if strings.HasPrefix(r, "crds/") {
			continue
		}
		ms, err := decodeFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		b.objs = append(b.objs, ms...)
	}
	return b
}

func each[T any](b bundle) []*T {
	var out []*T
	for _, m := range b.objs {
		if o, ok := m.obj.(*T); ok {
			out = append(out, o)
		}
	}
	return out
}

// yamlFiles lists the .yaml files of dir (not recursive), relative to base.
func yamlFiles(t *testing.T, base, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(base, dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) && e.Name() != "kustomization.yaml" {
			out = append(out, filepath.ToSlash(filepath.Join(dir, e.Name())))
		}
	}
	return out
}

// TestEveryManifestDecodesStrictly decodes every YAML file under deploy/ except
// crds/, whether a kustomization lists it or not.
func TestEveryManifestDecodesStrictly(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == "crds" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") {
			return nil
		}
		if d.Name() == "kustomization.yaml" {
			var k kustomization
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if err := yaml.UnmarshalStrict(data, &k); err != nil {
				t.Errorf("%s: %v", path, err)
			}
			return nil
		}
		ms, err := decodeFile(path)
		if err != nil {
			t.Error(err)
		}
		n += len(ms)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no manifests found")
	}
}

// TestKustomizationListsEveryFile: each kustomization lists exactly the YAML
// files of its directory (the root one also every CRD in crds/), each once, and
// rewrites the one image name every container uses.
func TestKustomizationListsEveryFile(t *testing.T) {
	for _, dir := range kustomizations {
		b := loadBundle(t, dir)
		want := yamlFiles(t, dir, ".")
		if dir == "." {
			want = append(want, yamlFiles(t, dir, "crds")...)
		}
		for i, w := range want {
			want[i] = strings.TrimPrefix(w, "./")
		}
		got := slices.Clone(b.k.Resources)
		slices.Sort(got)
		slices.Sort(want)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s resources (-files in the directory +listed):\n%s", filepath.Join(dir, "kustomization.yaml"), d)
		}
		if len(b.k.Images) != 1 || b.k.Images[0].Name != imageName || b.k.Images[0].NewName == "" || b.k.Images[0].NewTag == "" {
			t.Errorf("%s/kustomization.yaml: want one images entry rewriting %q with newName and newTag, have %+v", dir, imageName, b.k.Images)
		}
		for _, pod := range podSpecs(b) {
			for _, c := range slices.Concat(pod.spec.InitContainers, pod.spec.Containers) {
				if c.Image != imageName {
					t.Errorf("%s container %s: image %q, want %q (set by the kustomization's images entry)", pod.name, c.Name, c.Image, imageName)
				}
			}
		}
	}
}

type podSpec struct {
	name      string
	namespace string
	spec      corev1.PodSpec
}

func podSpecs(b bundle) []podSpec {
	var out []podSpec
	for _, d := range each[appsv1.DaemonSet](b) {
		out = append(out, podSpec{"DaemonSet " + d.Name, d.Namespace, d.Spec.Template.Spec})
	}
	for _, d := range each[appsv1.Deployment](b) {
		out = append(out, podSpec{"Deployment " + d.Name, d.Namespace, d.Spec.Template.Spec})
	}
	return out
}

func find[T any](t *testing.T, b bundle, name string) *T {
	t.Helper()
	for _, m := range b.objs {
		if o, ok := m.obj.(*T); ok && m.meta.Name == name {
			return o
		}
	}
	var zero T
	t.Fatalf("%s: no %T named %s", b.dir, zero, name)
	return nil
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

// flagValue returns the value following flag in args ("" when absent).
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// tolerant says whether the pod spec tolerates every taint: a toleration with
// operator Exists and neither key nor effect.
func tolerant(spec *corev1.PodSpec) bool {
	return slices.ContainsFunc(spec.Tolerations, func(t corev1.Toleration) bool {
		return t.Operator == corev1.TolerationOpExists && t.Key == "" && t.Effect == ""
	})
}

// bpffsMount checks that c mounts the node's /sys/fs/bpf at /sys/fs/bpf,
// writable, with propagation prop (any when empty).
func bpffsMount(t *testing.T, where string, spec *corev1.PodSpec, c *corev1.Container, prop corev1.MountPropagationMode) {
	t.Helper()
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/sys/fs/bpf" })
	if i < 0 {
		t.Errorf("%s container %s: /sys/fs/bpf not mounted", where, c.Name)
		return
	}
	m := c.VolumeMounts[i]
	if m.ReadOnly {
		t.Errorf("%s container %s: /sys/fs/bpf mounted read-only", where, c.Name)
	}
	if prop != "" && (m.MountPropagation == nil || *m.MountPropagation != prop) {
		got := "none"
		if m.MountPropagation != nil {
			got = string(*m.MountPropagation)
		}
		t.Errorf("%s container %s: /sys/fs/bpf propagation %s, want %s", where, c.Name, got, prop)
	}
	v := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
	if v < 0 || spec.Volumes[v].HostPath == nil || spec.Volumes[v].HostPath.Path != "/sys/fs/bpf" {
		t.Errorf("%s: volume %s is not the node's /sys/fs/bpf", where, m.Name)
	}
}

func TestAgentDaemonSet(t *testing.T) {
	b := loadBundle(t, ".")
	ds := find[appsv1.DaemonSet](t, b, "isthmus-agent")
	spec := &ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("agent: not hostNetwork: the datapath and routes belong to the node's network namespace")
	}
	if spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("agent: dnsPolicy %q, want ClusterFirstWithHostNet", spec.DNSPolicy)
	}
	if !tolerant(spec) {
		t.Errorf("agent: does not tolerate every taint: %+v", spec.Tolerations)
	}
	for _, n := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"isthmus.dev/site": "flex-site"}, true},
		{map[string]string{"kubernetes.io/os": "linux"}, false},
		{nil, false},
	} {
		if got := schedulable(t, spec, n.labels); got != n.want {
			t.Errorf("agent: node with labels %v schedulable = %v, want %v (only nodes with the site label)", n.labels, got, n.want)
		}
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("agent: priorityClassName %q", spec.PriorityClassName)
	}
	if spec.TerminationGracePeriodSeconds == nil {
		t.Error("agent: no terminationGracePeriodSeconds")
	}
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
		u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.String() != "1" {
		t.Errorf("agent: update strategy %+v, want RollingUpdate with maxUnavailable 1", u)
	}
	if sel := ds.Spec.Selector; sel == nil || !labelsMatch(sel.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("agent: selector %v does not match the template's labels %v", sel, ds.Spec.Template.Labels)
	}

	c := container(t, spec, "agent")
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("agent: not privileged")
	}
	bpffsMount(t, "agent", spec, c, corev1.MountPropagationBidirectional)
	for _, ic := range spec.InitContainers {
		if slices.ContainsFunc(ic.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/sys/fs/bpf" }) {
			// It mounts bpffs, which must reach the node.
			bpffsMount(t, "agent init", spec, &ic, corev1.MountPropagationBidirectional)
		}
	}
	if v := spec.Volumes[slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/sys/fs/bpf" })]; v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
		t.Errorf("agent: /sys/fs/bpf hostPath type %v, want DirectoryOrCreate", v.HostPath.Type)
	}

	if len(c.Args) == 0 || c.Args[0] != "agent" {
		t.Errorf("agent: args %q do not start with the agent command", c.Args)
	}
	if got := flagValue(c.Args, "--node"); got != "$(NODE_NAME)" {
		t.Errorf("agent: --node %q, want $(NODE_NAME)", got)
	}
	if got := flagValue(c.Args, "--pin-dir"); got != pinDir {
		t.Errorf("agent: --pin-dir %q, want %s", got, pinDir)
	}
	// Agents set aside tunnel addresses outside the controller's range: the
	// two flags must name the same prefix.
	if got, want := flagValue(c.Args, "--tunnel-cidr"), flagValue(container(t, &find[appsv1.Deployment](t, b, "isthmus-controller").Spec.Template.Spec, "controller").Args, "--tunnel-cidr"); got == "" || got != want {
		t.Errorf("agent: --tunnel-cidr %q, controller's %q: want the same prefix in both", got, want)
	}
	if flagValue(c.Args, "--objects") != "" {
		t.Error("agent: --objects is file mode; on a cluster the agent reads the API server")
	}
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" })
	if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Error("agent: NODE_NAME is not spec.nodeName from the downward API")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("agent: no cpu and memory requests")
	}
	// The agent serves /metrics, /healthz and /readyz on --metrics-addr, declared
	// as the metrics port; the probes and the scrape annotations use it.
	pi := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" })
	if pi < 0 || c.Ports[pi].ContainerPort != 9963 || (c.Ports[pi].Protocol != "" && c.Ports[pi].Protocol != corev1.ProtocolTCP) {
		t.Fatalf("agent: ports %+v, want metrics 9963/TCP", c.Ports)
	}
	if addr := flagValue(c.Args, "--metrics-addr"); addr != ":9963" {
		t.Errorf("agent: --metrics-addr %q, want :9963 (the metrics port)", addr)
	}
	ann := ds.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9963" || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("agent: pod annotations %v, want prometheus.io scrape true, port 9963, path /metrics", ann)
	}
	for _, tc := range []struct {
		name string
		p    *corev1.Probe
		path string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if tc.p == nil || tc.p.HTTPGet == nil {
			t.Errorf("agent: %s probe %+v, want httpGet %s", tc.name, tc.p, tc.path)
			continue
		}
		g := tc.p.HTTPGet
		if g.Path != tc.path || !(g.Port.String() == "metrics" || g.Port.IntValue() == 9963) {
			t.Errorf("agent: %s probe gets %s on port %s, want %s on metrics", tc.name, g.Path, g.Port.String(), tc.path)
		}
		if tc.p.Exec != nil {
			t.Errorf("agent: %s probe still runs a command", tc.name)
		}
	}
	if flagValue(c.Args, "--ready-file") != "" {
		t.Error("agent: --ready-file is left over from the exec probe; /readyz replaces it")
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestUninstallDaemonSet: it runs everywhere the agent ran, in the node's
// network namespace, and removes the pin directory the agent uses.
func TestUninstallDaemonSet(t *testing.T) {
	b := loadBundle(t, "uninstall")
	ds := find[appsv1.DaemonSet](t, b, "isthmus-uninstall")
	spec := &ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("uninstall: not hostNetwork: isthmus0 is in the node's network namespace")
	}
	if !tolerant(spec) {
		t.Error("uninstall: does not tolerate every taint, so it misses nodes the agent ran on")
	}
	run := uninstallContainer(t, spec)
	if got := flagValue(run.Args, "--pin-dir"); got != pinDir {
		t.Errorf("uninstall: --pin-dir %q, want the agent's %s", got, pinDir)
	}
	if run.SecurityContext == nil || run.SecurityContext.Privileged == nil || !*run.SecurityContext.Privileged {
		t.Error("uninstall: not privileged")
	}
	bpffsMount(t, "uninstall", spec, run, "")
	if ds.Namespace == "isthmus-system" {
		t.Error("uninstall: in isthmus-system, which kubectl delete -k deploy/ removes before it runs")
	}
}

func TestControllerDeployment(t *testing.T) {
	b := loadBundle(t, ".")
	d := find[appsv1.Deployment](t, b, "isthmus-controller")
	spec := &d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("controller: replicas %v, want 2", d.Spec.Replicas)
	}
	c := container(t, spec, "controller")
	if len(c.Args) == 0 || c.Args[0] != "controller" {
		t.Errorf("controller: args %q do not start with the controller command", c.Args)
	}
	if ns := flagValue(c.Args, "--namespace"); ns != d.Namespace {
		t.Errorf("controller: --namespace %q, but it runs in %q (its Lease Role is there)", ns, d.Namespace)
	}
	if !slices.Contains(c.Args, "--leader-elect") && !slices.Contains(c.Args, "--leader-elect=true") {
		t.Errorf("controller: two replicas without --leader-elect: %q", c.Args)
	}
	sc, psc := c.SecurityContext, spec.SecurityContext
	if sc == nil || psc == nil {
		t.Fatal("controller: no security context")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("controller: may run as root")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("controller: root filesystem writable")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("controller: allows privilege escalation")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("controller: privileged")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) != 0 {
		t.Errorf("controller: capabilities %+v, want drop ALL and add none", sc.Capabilities)
	}
	if len(c.VolumeMounts) != 0 || len(spec.Volumes) != 0 {
		t.Error("controller: mounts volumes; it needs none")
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p != nil {
			t.Errorf("controller: probe %+v, but the controller serves no health endpoint", p)
		}
	}
}

// TestReferencesResolve: every namespaced object is in a namespace the bundle
// creates; every ServiceAccount a pod or binding names exists there; every
// binding's role exists; a pod without a ServiceAccount of its own does not
// mount the default one's token.
func TestReferencesResolve(t *testing.T) {
	for _, dir := range kustomizations {
		b := loadBundle(t, dir)
		namespaces := map[string]bool{}
		for _, n := range each[corev1.Namespace](b) {
			namespaces[n.Name] = true
		}
		sas := map[string]bool{}
		for _, sa := range each[corev1.ServiceAccount](b) {
			sas[sa.Namespace+"/"+sa.Name] = true
		}
		for _, m := range b.objs {
			switch m.obj.(type) {
			case *corev1.Namespace, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
				if m.meta.Namespace != "" {
					t.Errorf("%s: cluster-scoped object with namespace %q", m.where, m.meta.Namespace)
				}
			default:
				if !namespaces[m.meta.Namespace] {
					t.Errorf("%s: namespace %q is not created by %s/kustomization.yaml", m.where, m.meta.Namespace, dir)
				}
			}
		}
		for _, p := range podSpecs(b) {
			switch {
			case p.spec.ServiceAccountName != "":
				if !sas[p.namespace+"/"+p.spec.ServiceAccountName] {
					t.Errorf("%s: ServiceAccount %s/%s does not exist", p.name, p.namespace, p.spec.ServiceAccountName)
				}
			case p.spec.AutomountServiceAccountToken == nil || *p.spec.AutomountServiceAccountToken:
				t.Errorf("%s: mounts the default ServiceAccount's token", p.name)
			}
		}
		roles := map[string]bool{}
		for _, r := range each[rbacv1.ClusterRole](b) {
			roles["ClusterRole "+r.Name] = true
		}
		for _, r := range each[rbacv1.Role](b) {
			roles["Role "+r.Namespace+"/"+r.Name] = true
		}
		check := func(where string, ref rbacv1.RoleRef, ns string, subjects []rbacv1.Subject) {
			key := "ClusterRole " + ref.Name
			if ref.Kind == "Role" {
				key = "Role " + ns + "/" + ref.Name
			}
			if ref.APIGroup != rbacv1.GroupName || !roles[key] {
				t.Errorf("%s: roleRef %+v does not exist", where, ref)
			}
			if len(subjects) == 0 {
				t.Errorf("%s: no subjects", where)
			}
			for _, s := range subjects {
				if s.Kind != rbacv1.ServiceAccountKind || !sas[s.Namespace+"/"+s.Name] {
					t.Errorf("%s: subject %+v is not a ServiceAccount of the bundle", where, s)
				}
			}
		}
		for _, rb := range each[rbacv1.ClusterRoleBinding](b) {
			check("ClusterRoleBinding "+rb.Name, rb.RoleRef, "", rb.Subjects)
		}
		for _, rb := range each[rbacv1.RoleBinding](b) {
			check("RoleBinding "+rb.Namespace+"/"+rb.Name, rb.RoleRef, rb.Namespace, rb.Subjects)
		}
	}
}

// TestRBACIsWhatTheCodeUses expands every role bound to each ServiceAccount into
// (scope, group, resource, verb) grants and compares them with grants: nothing
// more (least privilege), nothing less (the code would fail with forbidden).
func TestRBACIsWhatTheCodeUses(t *testing.T) {
	b := loadBundle(t, ".")
	rules := map[string][]rbacv1.PolicyRule{}
	for _, r := range each[rbacv1.ClusterRole](b) {
		if r.AggregationRule != nil {
			t.Errorf("ClusterRole %s: aggregated roles grant what others add", r.Name)
		}
		rules["ClusterRole "+r.Name] = r.Rules
	}
	for _, r := range each[rbacv1.Role](b) {
		rules["Role "+r.Namespace+"/"+r.Name] = r.Rules
	}
	got := map[string][]string{}
	expand := func(sa, scope string, rs []rbacv1.PolicyRule, where string) {
		for _, r := range rs {
			if len(r.NonResourceURLs) != 0 || len(r.ResourceNames) != 0 {
				t.Errorf("%s: rule %+v: nonResourceURLs or resourceNames are not in the design", where, r)
			}
			for _, g := range r.APIGroups {
				group := g
				if group == "" {
					group = "core"
				}
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						if g == "*" || res == "*" || v == "*" {
							t.Errorf("%s: wildcard in rule %+v", where, r)
						}
						got[sa] = append(got[sa], fmt.Sprintf("%s %s %s %s", scope, group, res, v))
					}
				}
			}
		}
	}
	for _, rb := range each[rbacv1.ClusterRoleBinding](b) {
		for _, s := range rb.Subjects {
			expand(s.Namespace+"/"+s.Name, "cluster", rules["ClusterRole "+rb.RoleRef.Name], "ClusterRole "+rb.RoleRef.Name)
		}
	}
	for _, rb := range each[rbacv1.RoleBinding](b) {
		key := "Role " + rb.Namespace + "/" + rb.RoleRef.Name
		if rb.RoleRef.Kind == "ClusterRole" {
			key = "ClusterRole " + rb.RoleRef.Name
		}
		for _, s := range rb.Subjects {
			expand(s.Namespace+"/"+s.Name, rb.Namespace, rules[key], key)
		}
	}
	want := map[string][]string{}
	for sa, gs := range grants {
		want[sa] = slices.Clone(gs)
	}
	for sa := range got {
		slices.Sort(got[sa])
	}
	for sa := range want {
		slices.Sort(want[sa])
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("RBAC grants (-what the code uses +what the manifests grant):\n%s", d)
	}
}

// TestKustomizeBuilds renders each kustomization with kubectl's built-in
// kustomize, as `kubectl apply -k` does, and checks the image was rewritten.
// The kubectl is the one `make kube-binaries` builds (testenv/kube/kubebin:
// the API server's release, from the Go module proxy), built here if the
// cache lacks it; a kubectl that cannot be had fails the test.
func TestKustomizeBuilds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	kubectl, err := kubebin.Kubectl(ctx)
	if err != nil {
		t.Fatalf("kubectl for kustomize: %v", err)
	}
	for _, dir := range kustomizations {
		b := loadBundle(t, dir)
		out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
		if err != nil {
			t.Errorf("kubectl kustomize %s: %v\n%s", dir, err, out)
			continue
		}
		img := b.k.Images[0].NewName + ":" + b.k.Images[0].NewTag
		for l := range strings.Lines(string(out)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "image: "); ok && v != img {
				t.Errorf("kubectl kustomize %s: image %s, want %s", dir, v, img)
			}
		}
	}
}

// schedulable reports whether the pod spec's required node affinity admits a
// node with the given labels (terms ORed, expressions ANDed, as the scheduler
// reads them); true without affinity.
func schedulable(t *testing.T, spec *corev1.PodSpec, nodeLabels map[string]string) bool {
	t.Helper()
	if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil || spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	ops := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	}
	for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		sel := labels.NewSelector()
		for _, e := range term.MatchExpressions {
			r, err := labels.NewRequirement(e.Key, ops[e.Operator], e.Values)
			if err != nil {
				t.Fatalf("node affinity expression %+v: %v", e, err)
			}
			sel = sel.Add(*r)
		}
		if sel.Matches(labels.Set(nodeLabels)) {
			return true
		}
	}
	return false
}

// hostPathOf returns the node path that path in container c is, through its
// hostPath mounts ("" when path is not on a hostPath volume).
func hostPathOf(spec *corev1.PodSpec, c *corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		rest, ok := strings.CutPrefix(path, m.MountPath)
		if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
			continue
		}
		v := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if v >= 0 && spec.Volumes[v].HostPath != nil {
			return spec.Volumes[v].HostPath.Path + rest
		}
	}
	return ""
}

// TestCNIInstall: the agent serves IPAM and installs the plugin and conflist
// into the node's CNI directories; the socket and reservation directory are at
// the same paths on the node as in the container, because the conflist names
// them for the plugin, which runs on the node; the uninstall DaemonSet removes
// from the same node directories.
func TestCNIInstall(t *testing.T) {
	b := loadBundle(t, ".")
	ds := find[appsv1.DaemonSet](t, b, "isthmus-agent")
	spec := &ds.Spec.Template.Spec
	c := container(t, spec, "agent")
	want := map[string]string{"--cni-bin-dir": "/opt/cni/bin", "--cni-conf-dir": "/etc/cni/net.d"}
	for flag, node := range want {
		if got := hostPathOf(spec, c, flagValue(c.Args, flag)); got != node {
			t.Errorf("agent: %s %q is node path %q, want %s", flag, flagValue(c.Args, flag), got, node)
		}
	}
	sock, dir := flagValue(c.Args, "--ipam-socket"), flagValue(c.Args, "--ipam-dir")
	if sock == "" || dir == "" {
		t.Fatalf("agent: --ipam-socket %q --ipam-dir %q: the agent does not serve IPAM", sock, dir)
	}
	for _, p := range []string{sock, dir} {
		if got := hostPathOf(spec, c, p); got != p {
			t.Errorf("agent: %s is %q on the node; the conflist names it for the plugin, so it must be the same path", p, got)
		}
	}
	if flagValue(c.Args, "--cni-plugin") == "" {
		t.Error("agent: no --cni-plugin: the image's isthmus-cni is not installed")
	}
	if flagValue(c.Args, "--cni-portmap-plugin") == "" {
		t.Error("agent: no --cni-portmap-plugin: the image's portmap is not installed, and hostPort does not work")
	}

	u := loadBundle(t, "uninstall")
	uds := find[appsv1.DaemonSet](t, u, "isthmus-uninstall")
	uspec := &uds.Spec.Template.Spec
	run := uninstallContainer(t, uspec)
	for flag, node := range want {
		if got := hostPathOf(uspec, run, flagValue(run.Args, flag)); got != node {
			t.Errorf("uninstall: %s is node path %q, want the agent's %s", flag, got, node)
		}
	}
}

// uninstallContainer returns the init container that runs isthmus uninstall.
func uninstallContainer(t *testing.T, spec *corev1.PodSpec) *corev1.Container {
	t.Helper()
	for i, c := range spec.InitContainers {
		if len(c.Args) > 0 && c.Args[0] == "uninstall" {
			return &spec.InitContainers[i]
		}
	}
	t.Fatal("uninstall: no init container runs isthmus uninstall")
	return nil
}
