package cri

import (
	"net/netip"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKubeletConfigClusterDNS: the KubeletConfiguration carries clusterDNS and
// clusterDomain when the config names them, and neither otherwise, as a YAML
// decoder reads the file the kubelet is given.
func TestKubeletConfigClusterDNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		dns  []netip.Addr
		dom  string
		want map[string]any
	}{
		{"none", nil, "", map[string]any{}},
		{"kubeadm's", []netip.Addr{netip.MustParseAddr("10.96.0.10")}, "cluster.local",
			map[string]any{"clusterDNS": []any{"10.96.0.10"}, "clusterDomain": "cluster.local"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := KubeletConfig{Dir: "/k", Runtime: &Containerd{cfg: Config{Dir: "/c"}}, ClusterDNS: tc.dns, ClusterDomain: tc.dom}
			var m map[string]any
			if err := yaml.Unmarshal([]byte(kubeletConfigYAML(cfg)), &m); err != nil {
				t.Fatalf("kubelet config is not YAML: %v\n%s", err, kubeletConfigYAML(cfg))
			}
			got := map[string]any{}
			for _, k := range []string{"clusterDNS", "clusterDomain"} {
				if v, ok := m[k]; ok {
					got[k] = v
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("clusterDNS/clusterDomain = %v, want %v", got, tc.want)
			}
			if m["kind"] != "KubeletConfiguration" {
				t.Errorf("kind = %v", m["kind"])
			}
		})
	}
}
