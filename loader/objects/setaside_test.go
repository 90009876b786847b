package objects

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkSetAside runs files through LoadSettingAside and checks the promise
// against Load's verdict loadErr: every object Load reported is set aside,
// and what stays passes Validate.
func checkSetAside(t *testing.T, files map[string][]byte, loadErr error) {
	t.Helper()
	set, _ := LoadSettingAside(files)
	for _, e := range Errors(loadErr) {
		if set.Rejection(e.Object) == nil {
			t.Errorf("LoadSettingAside kept %s, which Load rejects: %v; rejected: %v", e.Object, e, set.Rejected)
		}
	}
	if _, _, err := Validate(objectsOf(set)); err != nil {
		t.Errorf("what LoadSettingAside kept fails Validate: %v", err)
	}
}

func objectsOf(s *Set) Objects {
	return Objects{Sites: s.Sites, SitePeerings: s.SitePeerings, GatewayPools: s.GatewayPools,
		SiteGatewayPoolAssignments: s.SiteGatewayPoolAssignments, Nodes: s.Nodes}
}

func names[T any](items []T, name func(T) string) []string {
	var out []string
	for _, i := range items {
		out = append(out, name(i))
	}
	return out
}

func rejectedLabels(s *Set) []string {
	return names(s.Rejected, func(r Rejected) string { return r.Object })
}

// decodeAPI decodes files into Objects, stamping each object with a creation
// time in the order given by created (names not listed get the zero time).
func decodeAPI(t *testing.T, files map[string][]byte, created ...string) Objects {
	t.Helper()
	in, ok := decodeOnly(files)
	if !ok {
		t.Fatal("test objects do not decode")
	}
	stamp := func(m *metav1.ObjectMeta) {
		if i := slices.Index(created, m.Name); i >= 0 {
			m.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC))
		}
	}
	for i := range in.Nodes {
		stamp(&in.Nodes[i].ObjectMeta)
	}
	for i := range in.Sites {
		stamp(&in.Sites[i].ObjectMeta)
	}
	return in
}

// TestSetAsideOverlapCreatedFirstWins: of two Nodes with overlapping
// podCIDRs the one created first stays, whatever the names and the order the
// cache lists them in, and every other Node of every Site is kept.
func TestSetAsideOverlapCreatedFirstWins(t *testing.T) {
	files := map[string][]byte{"o.yaml": docs(
		site("a", "10.1.0.0/24", "10.10.0.0/16"),
		site("b", "10.2.0.0/24", "10.20.0.0/16"),
		peering("a-b", "a, b"),
		node("a1", "10.1.0.1", "10.10.1.0/24"),
		node("b1", "10.2.0.1", "10.20.1.0/24"),
		node("b2-old", "10.2.0.2", "10.20.2.0/24"),
		node("b0-new", "10.2.0.3", "10.20.2.0/25"),
	)}
	in := decodeAPI(t, files, "a1", "b1", "b2-old", "b0-new")
	for i := range 5 {
		rand.New(rand.NewPCG(uint64(i), 1)).Shuffle(len(in.Nodes), func(a, b int) { in.Nodes[a], in.Nodes[b] = in.Nodes[b], in.Nodes[a] })
		set, _ := ValidateSettingAside(in)
		if diff := cmp.Diff([]string{`Node "b0-new"`}, rejectedLabels(set)); diff != "" {
			t.Fatalf("rejected (-want +got):\n%s", diff)
		}
		if r := set.Rejected[0].String(); !strings.Contains(r, "overlaps") || !strings.Contains(r, "b2-old") {
			t.Errorf("reason %q does not name the overlap with b2-old", r)
		}
		if diff := cmp.Diff([]string{"a1", "b1", "b2-old"}, nodeNames(set)); diff != "" {
			t.Errorf("kept nodes (-want +got):\n%s", diff)
		}
		if len(set.Sites) != 2 || len(set.SitePeerings) != 1 {
			t.Errorf("kept %d sites and %d peerings, want 2 and 1", len(set.Sites), len(set.SitePeerings))
		}
	}
	// Same creation time: the name decides.
	in = decodeAPI(t, files)
	set, _ := ValidateSettingAside(in)
	if diff := cmp.Diff([]string{`Node "b2-old"`}, rejectedLabels(set)); diff != "" {
		t.Errorf("with equal creation times, rejected (-want +got):\n%s", diff)
	}
}

func nodeNames(s *Set) []string {
	return names(s.Nodes, func(n corev1.Node) string { return n.Name })
}

// TestSetAsideCascades: a Site set aside takes its Nodes and the peerings and
// assignments that name it along, each with its own reason; an External pool
// that selects a node without an ExternalIP is set aside with the assignment
// that needs it, and the rest is planned.
func TestSetAsideCascades(t *testing.T) {
	files := map[string][]byte{
		"1-sites.yaml": docs(
			site("a", "10.1.0.0/24", "10.10.0.0/16"),
			site("b", "10.2.0.0/24", "10.20.0.0/16"),
			site("c", "10.3.0.0/24", "10.30.0.0/16"),
			site("late", "10.2.0.128/25", "10.40.0.0/16"),
			peering("a-b", "a, b"),
			peering("a-late", "a, late"),
		),
		"2-nodes.yaml": docs(
			labeled("a1", "10.1.0.1", "10.10.1.0/24", "gw: yes", ""),
			labeled("b1", "10.2.0.1", "10.20.1.0/24", "gw: yes", "203.0.113.2"),
			labeled("c1", "10.3.0.1", "10.30.1.0/24", "gw: yes", "203.0.113.3"),
			node("l1", "10.2.0.130", "10.40.1.0/24"),
		),
		"3-pools.yaml": docs(
			pool("ext", "External", "{matchLabels: {gw: \"yes\"}}", ""),
			assignment("b-c", "b, c", "ext"),
			pool("int", "Internal", "{matchLabels: {gw: \"yes\"}}", ""),
			assignment("b-c-int", "b, c", "int"),
			pool("nobody", "Internal", "{matchLabels: {gw: \"never\"}}", ""),
			assignment("a-c-nobody", "a, c", "nobody"),
		),
	}
	set, _ := LoadSettingAside(files)
	want := []string{
		`Site "late"`, `Node "l1"`, `GatewayPool "ext"`, `SiteGatewayPoolAssignment "a-c-nobody"`,
		`SitePeering "a-late"`, `SiteGatewayPoolAssignment "b-c"`,
	}
	if diff := cmp.Diff(want, rejectedLabels(set)); diff != "" {
		t.Errorf("rejected (-want +got):\n%s", diff)
	}
	for _, r := range set.Rejected {
		if len(r.Reasons) == 0 || r.File == "" {
			t.Errorf("%s set aside without a reason or file: %+v", r.Object, r)
		}
	}
	if got := set.Rejection(`SitePeering "a-late"`).String(); !strings.Contains(got, `unknown Site "late"`) {
		t.Errorf("a-late set aside for %q, want the unknown site", got)
	}
	if diff := cmp.Diff([]string{"a1", "b1", "c1"}, nodeNames(set)); diff != "" {
		t.Errorf("kept nodes (-want +got):\n%s", diff)
	}
	if set.GatewayPool("int") == nil || len(set.SiteGatewayPoolAssignments) != 1 || set.SiteGatewayPoolAssignments[0].Name != "b-c-int" {
		t.Errorf("kept pools %v and assignments %v, want int and b-c-int", set.GatewayPools, set.SiteGatewayPoolAssignments)
	}
	if _, _, err := Validate(objectsOf(set)); err != nil {
		t.Errorf("kept objects fail Validate: %v", err)
	}
}

// TestSetAsideFilesAndDuplicates: in files the object written first stays (by
// file name, then place in the file); documents that do not decode are set
// aside by their location and the rest loads.
func TestSetAsideFilesAndDuplicates(t *testing.T) {
	files := map[string][]byte{
		"a.yaml": docs(site("s", "10.1.0.0/24", "10.10.0.0/16"), node("z", "10.1.0.9", "10.10.9.0/24")),
		"b.yaml": docs(site("s", "10.2.0.0/24", "10.20.0.0/16"), node("y", "10.1.0.8", "10.10.9.0/24"), "spec: [\n"),
	}
	set, _ := LoadSettingAside(files)
	want := []string{"document 3 (line 18)", `Site "s"`, `Node "y"`}
	if diff := cmp.Diff(want, rejectedLabels(set)); diff != "" {
		t.Errorf("rejected (-want +got):\n%s", diff)
	}
	if r := set.Rejection(`Site "s"`); r == nil || r.File != "b.yaml" || !strings.Contains(r.String(), "first defined in a.yaml") {
		t.Errorf("duplicate Site set aside as %+v, want the one in b.yaml", r)
	}
	if len(set.Sites) != 1 || set.Sites[0].Spec.NodeCIDRs[0] != "10.1.0.0/24" || set.Node("z") == nil {
		t.Errorf("kept %v, want a.yaml's Site s and Node z", set.Sites)
	}
}

// TestOverlapPairs compares the sweep with comparing every pair, for random
// nested, equal and disjoint prefixes.
func TestOverlapPairs(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 5))
		var ps []fieldPrefix
		for range r.IntN(30) {
			a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(256)), 0})
			ps = append(ps, fieldPrefix{prefix: netip.PrefixFrom(a, 14+r.IntN(11)).Masked()})
		}
		var want [][2]int
		for i, a := range ps {
			for j, b := range ps[:i] {
				if a.prefix.Overlaps(b.prefix) {
					want = append(want, [2]int{i, j})
				}
			}
		}
		if diff := cmp.Diff(want, overlapPairs(ps)); diff != "" {
			t.Fatalf("seed %d (-every pair +sweep):\n%s", seed, diff)
		}
	}
}

// TestSetAsideTunnelOutsideCIDR: with a tunnel CIDR configured, a Node whose
// annotation lies outside it is set aside with that reason, and a Node
// annotated inside it, a Node whose tunnel address is its podCIDR's first
// address (outside the CIDR, and not an annotation) and the other Site's Node
// stay. Without the rule the same objects are all valid.
func TestSetAsideTunnelOutsideCIDR(t *testing.T) {
	files := map[string][]byte{"o.yaml": docs(
		site("a", "10.1.0.0/24", "10.10.0.0/16"),
		site("b", "10.2.0.0/24", "10.20.0.0/16"),
		peering("a-b", "a, b"),
		tunnelNode("a1", "10.1.0.1", "", "100.64.0.1"),
		tunnelNode("a2", "10.1.0.2", "", "192.168.77.7"),
		node("a3", "10.1.0.3", "10.10.3.0/24"),
		node("b1", "10.2.0.1", "10.20.1.0/24"),
	)}
	if set, _ := LoadSettingAside(files); len(set.Rejected) != 0 {
		t.Fatalf("without a tunnel CIDR: set aside %v", set.Rejected)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "o.yaml"), files["o.yaml"], 0o644); err != nil {
		t.Fatal(err)
	}
	rules := Rules{TunnelCIDR: netip.MustParsePrefix("100.64.0.0/16")}
	fromDir, _, err := rules.LoadDirSettingAside(dir)
	if err != nil {
		t.Fatal(err)
	}
	in, ok := decodeOnly(files)
	if !ok {
		t.Fatal("test objects do not decode")
	}
	fromAPI, _ := rules.ValidateSettingAside(in)
	for what, set := range map[string]*Set{"directory": fromDir, "API objects": fromAPI} {
		if diff := cmp.Diff([]string{`Node "a2"`}, rejectedLabels(set)); diff != "" {
			t.Fatalf("%s: set aside (-want +got):\n%s", what, diff)
		}
		r := set.Rejection(`Node "a2"`)
		if got := r.String(); !strings.Contains(got, "192.168.77.7 is outside the tunnel CIDR 100.64.0.0/16") {
			t.Errorf("%s: reason %q does not name the address and the CIDR", what, got)
		}
		if diff := cmp.Diff([]string{"a1", "a3", "b1"}, names(set.Nodes, func(n corev1.Node) string { return n.Name })); diff != "" {
			t.Errorf("%s: nodes kept (-want +got):\n%s", what, diff)
		}
	}
}
