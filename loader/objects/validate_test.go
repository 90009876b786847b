package objects

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// decodeOnly decodes files as Load does, without validating, into the
// Objects an API source would hand to Validate; ok is false when decoding
// alone failed (such errors have no API counterpart).
func decodeOnly(files map[string][]byte) (in Objects, ok bool) {
	l := &loader{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		l.decodeFile(name, files[name])
	}
	for _, e := range l.sites {
		in.Sites = append(in.Sites, *e.obj)
	}
	for _, e := range l.peerings {
		in.SitePeerings = append(in.SitePeerings, *e.obj)
	}
	for _, e := range l.pools {
		in.GatewayPools = append(in.GatewayPools, *e.obj)
	}
	for _, e := range l.assigns {
		in.SiteGatewayPoolAssignments = append(in.SiteGatewayPoolAssignments, *e.obj)
	}
	for _, e := range l.nodes {
		in.Nodes = append(in.Nodes, *e.obj)
	}
	return in, len(l.errs) == 0
}

var inYAMLFile = regexp.MustCompile(`(, first defined)? in [\w.-]+\.ya?ml`)

// checkSharedPath runs the objects of files through Validate and checks it
// reports exactly the errors Load reported in loadErr, without file names.
// Cases whose files do not decode are skipped: the API server decodes.
func checkSharedPath(t *testing.T, files map[string][]byte, loadErr error) {
	t.Helper()
	in, ok := decodeOnly(files)
	if !ok {
		return
	}
	var want []string
	for _, e := range Errors(loadErr) {
		want = append(want, location(e.Object, e.Field, inYAMLFile.ReplaceAllString(e.Msg, "")))
	}
	_, _, err := Validate(in)
	var got []string
	for _, e := range Errors(err) {
		if e.File != "" {
			t.Errorf("Validate error names a file: %v", e)
		}
		got = append(got, e.Error())
	}
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Validate and Load disagree (-Load +Validate):\n%s", diff)
	}
}

func TestValidateNamesObjectsNotFiles(t *testing.T) {
	in := Objects{
		Sites: []v1alpha1.Site{
			{ObjectMeta: metav1.ObjectMeta{Name: "flex-site"}, Spec: v1alpha1.SiteSpec{NodeCIDRs: []v1alpha1.CIDR{"10.0.0.0/27", "10.0.0.0/33"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}, Spec: v1alpha1.SiteSpec{NodeCIDRs: []v1alpha1.CIDR{"10.0.0.16/28"}}},
		},
		SitePeerings: []v1alpha1.SitePeering{{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.SitePeeringSpec{Sites: []string{"flex-site", "gone"}}}},
		Nodes:        []corev1.Node{{}},
	}
	set, _, err := Validate(in)
	if set != nil {
		t.Errorf("Validate returned a Set along with an error")
	}
	var got []string
	for _, e := range Errors(err) {
		got = append(got, e.Error())
	}
	want := []string{
		`Node [0]: metadata.name: required`,
		`Site "flex-site": spec.nodeCidrs[1]: invalid CIDR "10.0.0.0/33"`,
		`Site "flex-site": spec.nodeCidrs[0]: 10.0.0.0/27 overlaps Site "cluster" spec.nodeCidrs[0] 10.0.0.16/28`,
		`SitePeering "p": spec.sites[1]: unknown Site "gone"`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	// API objects have no order (informer caches are maps): the same objects in
	// another order give the same messages.
	slices.Reverse(in.Sites)
	_, _, err = Validate(in)
	var again []string
	for _, e := range Errors(err) {
		again = append(again, e.Error())
	}
	if diff := cmp.Diff(got, again); diff != "" {
		t.Errorf("errors depend on the order of the objects (-first +reversed):\n%s", diff)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v holds no *Error", err)
	}
	if kind, name, ok := Errors(err)[1].KindName(); kind != "Site" || name != "flex-site" || !ok {
		t.Errorf("KindName = %q %q %v, want Site flex-site true", kind, name, ok)
	}
	if _, _, ok := Errors(err)[0].KindName(); ok {
		t.Errorf("KindName of an object without a name reports ok")
	}
}

// TestValidateCopies checks that Validate normalizes its own copies: the
// input may be an informer's cache, which must never change.
func TestValidateCopies(t *testing.T) {
	in := Objects{
		Sites: []v1alpha1.Site{{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1alpha1.SiteSpec{
			NodeCIDRs: []v1alpha1.CIDR{"10.1.0.5/24"},
		}}},
		Nodes: []corev1.Node{{
			ObjectMeta: metav1.ObjectMeta{Name: "a1"},
			Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.10.1.7/24"}},
			Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.1"}}},
		}},
	}
	set, warnings, err := Validate(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := set.Sites[0].Spec.NodeCIDRs[0]; got != "10.1.0.0/24" {
		t.Errorf("Set nodeCidrs[0] = %s, want normalized 10.1.0.0/24", got)
	}
	if got := set.Nodes[0].Spec.PodCIDRs[0]; got != "10.10.1.0/24" {
		t.Errorf("Set podCIDRs[0] = %s, want normalized 10.10.1.0/24", got)
	}
	if in.Sites[0].Spec.NodeCIDRs[0] != "10.1.0.5/24" || in.Nodes[0].Spec.PodCIDRs[0] != "10.10.1.7/24" {
		t.Errorf("Validate changed its input: %v %v", in.Sites[0].Spec.NodeCIDRs, in.Nodes[0].Spec.PodCIDRs)
	}
	var got []string
	for _, w := range warnings {
		got = append(got, w.String())
	}
	want := []string{
		`Site "a": spec.nodeCidrs[0]: 10.1.0.5/24 has host bits set; normalized to 10.1.0.0/24`,
		`Node "a1": spec.podCIDRs[0]: 10.10.1.7/24 has host bits set; normalized to 10.10.1.0/24`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

// TestValidateSeedsLikeLoad checks that the seed topologies give the same
// Set through either path.
func TestValidateSeedsLikeLoad(t *testing.T) {
	for _, dir := range []string{"testdata/seed000", "testdata/seed000-gateway"} {
		t.Run(dir, func(t *testing.T) {
			files := make(map[string][]byte)
			names, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
			for _, n := range names {
				data, err := os.ReadFile(n)
				if err != nil {
					t.Fatal(err)
				}
				files[filepath.Base(n)] = data
			}
			want, _, err := Load(files)
			if err != nil {
				t.Fatal(err)
			}
			in, ok := decodeOnly(files)
			if !ok {
				t.Fatal("decode failed")
			}
			// The API hands objects over in any order.
			slices.Reverse(in.Nodes)
			slices.Reverse(in.Sites)
			got, _, err := Validate(in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Validate Set (-Load +Validate):\n%s", diff)
			}
			if len(got.Nodes) == 0 || len(got.Sites) == 0 {
				t.Errorf("empty Set: %+v", got)
			}
		})
	}
}

func TestWithoutUnsitedNodes(t *testing.T) {
	addr := func(ip string) []corev1.NodeAddress {
		return []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	}
	in := Objects{
		Sites: []v1alpha1.Site{{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1alpha1.SiteSpec{NodeCIDRs: []v1alpha1.CIDR{"10.1.0.0/24"}}}},
		Nodes: []corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "a1"}, Status: corev1.NodeStatus{Addresses: addr("10.1.0.1")}},
			{ObjectMeta: metav1.ObjectMeta{Name: "cp"}, Status: corev1.NodeStatus{Addresses: addr("192.168.0.1")}},
			{ObjectMeta: metav1.ObjectMeta{Name: "new"}},
		},
	}
	_, _, err := Validate(in)
	if err == nil {
		t.Fatal("Validate accepted nodes outside every Site")
	}
	kept, warns := in.WithoutUnsitedNodes()
	if len(kept.Nodes) != 1 || kept.Nodes[0].Name != "a1" || len(kept.Sites) != 1 {
		t.Errorf("kept %+v, want Site a and Node a1", kept)
	}
	if len(in.Nodes) != 3 {
		t.Errorf("input changed: %d nodes", len(in.Nodes))
	}
	var got []string
	for _, w := range warns {
		got = append(got, w.String())
	}
	want := []string{
		`Node "cp": status.addresses: InternalIP 192.168.0.1 is in no Site's spec.nodeCidrs: left out`,
		`Node "new": status.addresses: no InternalIP yet: left out`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
	if _, _, err := Validate(kept); err != nil {
		t.Errorf("Validate(kept): %v", err)
	}
}
