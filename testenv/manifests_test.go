package testenv

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const manifestSites = `apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: s1}
spec: {nodeCidrs: [192.168.1.0/24], podCidrAssignments: [{cidrBlocks: [10.1.0.0/16]}]}
---
apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: s2}
spec: {nodeCidrs: [192.168.2.0/24], manageCniPlugin: false, podCidrAssignments: [{cidrBlocks: [10.2.0.0/16]}]}
`

const manifestNodes = `apiVersion: v1
kind: Node
metadata: {name: n1, labels: {isthmus.dev/gateway: "true"}}
spec: {podCIDR: 10.1.1.0/24, podCIDRs: [10.1.1.0/24]}
status: {addresses: [{type: Hostname, address: n1}, {type: InternalIP, address: 192.168.1.10}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2, annotations: {isthmus.dev/tunnel-ipv4: 100.64.0.2}}
status: {addresses: [{type: InternalIP, address: 192.168.2.10}, {type: ExternalIP, address: 203.0.113.2}]}
`

const manifestPools = `apiVersion: isthmus.dev/v1alpha1
kind: GatewayPool
metadata: {name: gw}
spec: {type: Internal, nodeSelector: {matchLabels: {isthmus.dev/gateway: "true"}}}
`

const manifestScenario = `name: t
manifests: m
sites:
  - name: s1
    subnet: 192.168.1.0/24
    nodes:
      - name: n1
        pods: [{name: p1, address: 10.1.1.5}]
  - name: s2
    subnet: 192.168.2.0/24
    nodes:
      - name: n2
        pods: [{name: p2, address: 10.2.0.9, unmanaged: true}]
`

// writeManifests writes the test's manifests into dir/m and the scenario into
// dir/scenario.yaml, and returns the scenario's path.
func writeManifests(t *testing.T, dir, scenario string, files map[string]string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "m", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, "m", name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "scenario.yaml")
	if err := os.WriteFile(p, []byte(scenario), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestScenarioManifests: a scenario's manifests directory, relative to the
// scenario file, gives each site its Site, each node its address, external
// address, podCIDRs, labels and annotations, and the rest to Objects; files
// in subdirectories and of other extensions are not read, as the agent
// reads none.
func TestScenarioManifests(t *testing.T) {
	dir := t.TempDir()
	p := writeManifests(t, dir, manifestScenario, map[string]string{
		"sites.yaml": manifestSites, "nodes.yml": manifestNodes, "pools.yaml": manifestPools,
		"notes.txt": "not yaml", "sub/x.yaml": "kind: Bogus\n",
	})
	sc, err := LoadScenario(p)
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := sc.Sites[0].Nodes[0], sc.Sites[1].Nodes[0]
	if n1.Address != netip.MustParseAddr("192.168.1.10") || len(n1.PodCIDRs) != 1 ||
		n1.PodCIDRs[0] != netip.MustParsePrefix("10.1.1.0/24") || n1.Labels["isthmus.dev/gateway"] != "true" {
		t.Errorf("n1 = %+v", n1)
	}
	if n2.Address != netip.MustParseAddr("192.168.2.10") || n2.ExternalAddress != netip.MustParseAddr("203.0.113.2") ||
		len(n2.PodCIDRs) != 0 || n2.Annotations[TunnelAnnotation] != "100.64.0.2" {
		t.Errorf("n2 = %+v", n2)
	}
	for i, name := range []string{"s1", "s2"} {
		if !strings.Contains(sc.Sites[i].Objects, "metadata: {name: "+name+"}") || strings.Count(sc.Sites[i].Objects, "kind: Site") != 1 {
			t.Errorf("site %s objects:\n%s", name, sc.Sites[i].Objects)
		}
	}
	if !strings.Contains(sc.Objects, "kind: GatewayPool") || strings.Contains(sc.Objects, "Bogus") || strings.Contains(sc.Objects, "kind: Node") {
		t.Errorf("objects:\n%s", sc.Objects)
	}
	blocks, err := sc.Sites[1].podBlocks()
	if err != nil || len(blocks) != 1 || blocks[0] != netip.MustParsePrefix("10.2.0.0/16") {
		t.Errorf("s2 pod blocks %v, %v", blocks, err)
	}
}

func TestScenarioManifestsErrors(t *testing.T) {
	all := map[string]string{"sites.yaml": manifestSites, "nodes.yaml": manifestNodes}
	tests := []struct {
		name     string
		scenario string
		files    map[string]string
		want     string
	}{
		{"node missing from manifests", strings.Replace(manifestScenario, "name: n2\n", "name: n3\n", 1), all, `Node "n2": no scenario node`},
		{"scenario node without a Node", manifestScenario + "      - name: n4\n", all, `node "n4": no Node of that name`},
		{"site not in scenario", strings.Replace(manifestScenario, "name: s2\n", "name: s3\n", 1), all, `Site "s2": no scenario site`},
		{"scenario gives an address", strings.Replace(manifestScenario, "name: n1\n", "name: n1\n        address: 192.168.1.11\n", 1), all, "come from the manifests"},
		{"scenario gives a spec", strings.Replace(manifestScenario, "subnet: 192.168.1.0/24\n", "subnet: 192.168.1.0/24\n    spec: {nodeCidrs: [192.168.1.0/24]}\n", 1), all, "spec and objects come from the manifests"},
		{"no InternalIP", manifestScenario, map[string]string{"sites.yaml": manifestSites, "nodes.yaml": strings.Replace(manifestNodes, "type: InternalIP", "type: InternalDNS", 1)}, "no InternalIP"},
		{"no directory", strings.Replace(manifestScenario, "manifests: m", "manifests: nope", 1), all, "read manifests"},
		{"pod outside the manifest's podCIDR", strings.Replace(manifestScenario, "10.1.1.5", "10.1.2.5", 1), all, "not in the node's podCIDRs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeManifests(t, t.TempDir(), tt.scenario, tt.files)
			_, err := LoadScenario(p)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("LoadScenario = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
