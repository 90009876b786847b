package testenv

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/isthmus-dev/isthmus/testenv/kube"
)

// TestDeployOverlay renders the lab's overlay of deploy/ with kustomize (as
// kubectl apply -k does) beside deploy/ itself with only its image changed,
// and compares them object by object: everything is equal but the agent's
// pin and CNI paths, which name the lab's per-node directories, and the API
// server's address in the two workloads. The paths are checked against the
// lab's own accessors, the ones its agents and tests use.
func TestDeployOverlay(t *testing.T) {
	const lab, image, port = "ovl", "isthmus.test/isthmus:v1", 34567
	dir := t.TempDir()
	if err := writeDeployOverlay(filepath.Join(dir, "lab"), lab, image, port); err != nil {
		t.Fatal(err)
	}
	got, err := kube.Kustomize(filepath.Join(dir, "lab"))
	if err != nil {
		t.Fatal(err)
	}
	// deploy/ with only the image set: the operator's install.
	plain := filepath.Join(dir, "plain")
	os.MkdirAll(plain, 0o755)
	rel, err := filepath.Rel(plain, DeployDir())
	if err != nil {
		t.Fatal(err)
	}
	k := "resources:\n- " + rel + "\nimages:\n- {name: isthmus, newName: isthmus.test/isthmus, newTag: v1}\n"
	if err := os.WriteFile(filepath.Join(plain, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	want, err := kube.Kustomize(plain)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("overlay renders %d objects, deploy/ %d", len(got), len(want))
	}
	l := &Lab{Name: lab}
	for i := range want {
		g, w := got[i], want[i]
		id := w.GetKind() + " " + w.GetName()
		switch id {
		case "DaemonSet isthmus-agent":
			checkOverlayAgent(t, l, g, w, port)
		case "Deployment isthmus-controller":
			env, _, _ := unstructured.NestedSlice(g.Object, "spec", "template", "spec", "containers")
			c := env[0].(map[string]any)
			wantEnv := []any{map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
				map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": "34567"}}
			if !reflect.DeepEqual(c["env"], wantEnv) {
				t.Errorf("%s: env %v, want %v", id, c["env"], wantEnv)
			}
			delete(c, "env")
			unstructured.SetNestedSlice(g.Object, env, "spec", "template", "spec", "containers")
			fallthrough
		default:
			if !reflect.DeepEqual(g.Object, w.Object) {
				gj, _ := json.MarshalIndent(g.Object, "", " ")
				wj, _ := json.MarshalIndent(w.Object, "", " ")
				t.Errorf("%s differs from deploy/'s:\n%s\nwant\n%s", id, gj, wj)
			}
		}
	}
}

// TestDeployOperatorOverlay renders the operator's overlay on the lab's
// overlay with kustomize: the agent's arguments are the lab overlay's with
// the operator's appended, in order, and every other object is the lab
// overlay's own.
func TestDeployOperatorOverlay(t *testing.T) {
	const lab, image, port = "ovl", "isthmus.test/isthmus:v1", 34567
	dir := t.TempDir()
	extra := []string{OtherCNIPodInterfaces, "--log-level=debug"}
	if err := writeOperatorOverlay(filepath.Join(dir, "op"), lab, image, port, extra); err != nil {
		t.Fatal(err)
	}
	got, err := kube.Kustomize(filepath.Join(dir, "op"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := kube.Kustomize(filepath.Join(dir, "op", "lab"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("operator overlay renders %d objects, the lab's %d", len(got), len(want))
	}
	agents := 0
	for i := range want {
		g, w := got[i], want[i]
		if w.GetKind() == "DaemonSet" && w.GetName() == "isthmus-agent" {
			agents++
			path := []string{"spec", "template", "spec", "containers"}
			gc, _, _ := unstructured.NestedSlice(g.Object, path...)
			wc, _, _ := unstructured.NestedSlice(w.Object, path...)
			ga, wa := gc[0].(map[string]any)["args"].([]any), wc[0].(map[string]any)["args"].([]any)
			wantArgs := append(append([]any{}, wa...), extra[0], extra[1])
			if !reflect.DeepEqual(ga, wantArgs) {
				t.Errorf("agent args %v, want %v", ga, wantArgs)
			}
			gc[0].(map[string]any)["args"] = wa
			unstructured.SetNestedSlice(g.Object, gc, path...)
		}
		if !reflect.DeepEqual(g.Object, w.Object) {
			t.Errorf("%s %s differs from the lab overlay's", w.GetKind(), w.GetName())
		}
	}
	if agents != 1 {
		t.Errorf("%d agent DaemonSets rendered, want 1", agents)
	}
}

// checkOverlayAgent compares the overlay's agent DaemonSet g with deploy/'s
// w: the differences are exactly the lab's, and the rest is equal.
func checkOverlayAgent(t *testing.T, l *Lab, g, w *unstructured.Unstructured, port int) {
	t.Helper()
	spec := func(u *unstructured.Unstructured) map[string]any {
		s, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
		return s
	}
	gs, ws := spec(g), spec(w)
	agent := func(s map[string]any) map[string]any { return s["containers"].([]any)[0].(map[string]any) }
	ga, wa := agent(gs), agent(ws)
	// The node's name as the kubelet expands $(NODE_NAME) in a1's pod.
	expand := func(v string) string { return strings.ReplaceAll(v, "$(NODE_NAME)", "a1") }
	flags := map[string]string{}
	args := ga["args"].([]any)
	for i := 0; i+1 < len(args); i++ {
		if a := args[i].(string); strings.HasPrefix(a, "--") {
			flags[a] = expand(args[i+1].(string))
		}
	}
	// The node's WireGuard key survives the agent's container, one per node
	// (deploy/'s hostPath /var/lib/isthmus would be one for every lab node).
	for _, a := range args {
		if v, ok := strings.CutPrefix(a.(string), "--state-dir="); ok {
			flags["--state-dir"] = expand(v)
		}
	}
	if got, want := flags["--state-dir"], filepath.Join(filepath.Dir(l.CNIBinDir("a1")), "state"); got != want {
		t.Errorf("--state-dir %s, want %s", got, want)
	}
	// The pod's /sys/fs/bpf is the lab's pin directory.
	if got, want := flags["--pin-dir"], "/sys/fs/bpf/a1"; got != want {
		t.Errorf("--pin-dir %s, want %s", got, want)
	}
	for flag, want := range map[string]string{"--ipam-socket": l.IPAMSocket("a1"), "--ipam-dir": l.IPAMDir("a1"),
		"--cni-bin-dir": l.CNIBinDir("a1"), "--cni-conf-dir": l.CNIConfDir("a1")} {
		if flags[flag] != want {
			t.Errorf("%s %s, want the lab's %s", flag, flags[flag], want)
		}
	}
	vols := map[string]string{}
	for _, v := range gs["volumes"].([]any) {
		vm := v.(map[string]any)
		hp, _ := vm["hostPath"].(map[string]any)
		vols[vm["name"].(string)], _ = hp["path"].(string)
	}
	cni := filepath.Dir(filepath.Dir(l.CNIBinDir("a1")))
	// wireguard-run is an emptyDir (no host path): each pod has its own.
	if p, ok := vols["wireguard-run"]; vols["bpffs"] != filepath.Dir(l.PinDir("a1")) || vols["cni-bin"] != cni || !ok || p != "" || len(vols) != 5 {
		t.Errorf("volumes %v, want bpffs %s, cni-bin %s, netns, xtables-lock and the emptyDir wireguard-run", vols, filepath.Dir(l.PinDir("a1")), cni)
	}
	env := ga["env"].([]any)
	if n := len(env); n < 2 || !reflect.DeepEqual(env[n-2:], []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
		map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": "34567"}}) {
		t.Errorf("agent env %v, want the API server at 127.0.0.1:%d last", env, port)
	}
	// Equal but for those: the lab's values put back to deploy/'s.
	ga["args"], ga["env"], ga["volumeMounts"] = wa["args"], wa["env"], wa["volumeMounts"]
	gs["volumes"] = ws["volumes"]
	unstructured.SetNestedMap(g.Object, gs, "spec", "template", "spec")
	if !reflect.DeepEqual(g.Object, w.Object) {
		gj, _ := json.MarshalIndent(g.Object, "", " ")
		t.Errorf("the agent DaemonSet differs from deploy/'s in more than the lab's paths and API address:\n%s", gj)
	}
}

// TestUninstallOverlay renders the lab's overlay of deploy/uninstall/: the
// uninstall pod removes its node's pins and CNI files in the lab, given its
// node's name, and nothing else changes but the image.
func TestUninstallOverlay(t *testing.T) {
	const lab = "ovl"
	dir := filepath.Join(t.TempDir(), "u")
	l := &Lab{Name: lab}
	if err := l.UninstallOverlay(dir, "isthmus.test/isthmus:v2"); err != nil {
		t.Fatal(err)
	}
	objs, err := kube.Kustomize(dir)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		found = true
		inits, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "initContainers")
		c := inits[0].(map[string]any)
		var args []string
		for _, a := range c["args"].([]any) {
			args = append(args, strings.ReplaceAll(a.(string), "$(NODE_NAME)", "b2"))
		}
		want := []string{"uninstall", "--pin-dir", "/sys/fs/bpf/b2", "--cni-bin-dir", l.CNIBinDir("b2"), "--cni-conf-dir", l.CNIConfDir("b2")}
		if !reflect.DeepEqual(args, want) {
			t.Errorf("uninstall args %v, want %v", args, want)
		}
		if c["image"] != "isthmus.test/isthmus:v2" {
			t.Errorf("image %v", c["image"])
		}
		env, _ := json.Marshal(c["env"])
		if string(env) != `[{"name":"NODE_NAME","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]` {
			t.Errorf("uninstall env %s, want NODE_NAME from spec.nodeName", env)
		}
		vols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
		got, _ := json.Marshal(vols)
		wantVols := `[{"hostPath":{"path":"` + filepath.Dir(l.PinDir("b2")) + `","type":"Directory"},"name":"bpffs"},{"hostPath":{"path":"` +
			filepath.Dir(filepath.Dir(l.CNIBinDir("b2"))) + `","type":"DirectoryOrCreate"},"name":"cni-bin"}]`
		if string(got) != wantVols {
			t.Errorf("uninstall volumes %s, want %s", got, wantVols)
		}
	}
	if !found {
		t.Fatal("no DaemonSet rendered")
	}
}
