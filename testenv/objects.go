package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// APIVersion is the apiVersion of the isthmus objects the lab writes.
const APIVersion = "isthmus.dev/v1alpha1"

type objectMeta struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type object struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       any        `json:"spec,omitempty"`
	Status     any        `json:"status,omitempty"`
}

type nodeSpec struct {
	PodCIDR  string   `json:"podCIDR,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`
}

type nodeAddress struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

type nodeStatus struct {
	Addresses []nodeAddress `json:"addresses"`
}

// ObjectFiles renders the scenario's objects: file name -> multi-document YAML.
// sites.yaml holds the Sites given as specs and every site's raw objects,
// peerings.yaml the SitePeerings, nodes.yaml one core v1 Node per node (InternalIP,
// ExternalIP when the node has an externalAddress, Hostname, podCIDR and
// podCIDRs, labels, annotations), extra.yaml the scenario's further objects.
func (s *Scenario) ObjectFiles() (map[string][]byte, error) {
	files := map[string][]byte{}
	var sites []string
	for _, site := range s.Sites {
		if len(site.Spec) > 0 {
			doc, err := yaml.Marshal(object{APIVersion: APIVersion, Kind: "Site",
				Metadata: objectMeta{Name: site.Name}, Spec: json.RawMessage(site.Spec)})
			if err != nil {
				return nil, fmt.Errorf("render site %q: %w", site.Name, err)
			}
			sites = append(sites, string(doc))
		}
		if strings.TrimSpace(site.Objects) != "" {
			sites = append(sites, strings.TrimSpace(site.Objects)+"\n")
		}
	}
	files["sites.yaml"] = joinDocs(sites)

	var peerings []string
	for _, p := range s.Peerings {
		spec := map[string]any{"sites": p.Sites}
		if p.MeshNodes != nil {
			spec["meshNodes"] = *p.MeshNodes
		}
		if p.Encryption != "" {
			spec["encryption"] = p.Encryption
		}
		doc, err := yaml.Marshal(object{APIVersion: APIVersion, Kind: "SitePeering",
			Metadata: objectMeta{Name: p.Name}, Spec: spec})
		if err != nil {
			return nil, fmt.Errorf("render peering %q: %w", p.Name, err)
		}
		peerings = append(peerings, string(doc))
	}
	if len(peerings) > 0 {
		files["peerings.yaml"] = joinDocs(peerings)
	}

	var nodes []string
	for _, n := range s.Nodes() {
		var spec nodeSpec
		for i, c := range n.PodCIDRs {
			if i == 0 {
				spec.PodCIDR = c.String()
			}
			spec.PodCIDRs = append(spec.PodCIDRs, c.String())
		}
		addrs := []nodeAddress{{Type: "InternalIP", Address: n.Address.String()}}
		if n.ExternalAddress.IsValid() {
			addrs = append(addrs, nodeAddress{Type: "ExternalIP", Address: n.ExternalAddress.String()})
		}
		addrs = append(addrs, nodeAddress{Type: "Hostname", Address: n.Name})
		doc, err := yaml.Marshal(object{APIVersion: "v1", Kind: "Node",
			Metadata: objectMeta{Name: n.Name, Labels: n.Labels, Annotations: n.Annotations},
			Spec:     spec,
			Status:   nodeStatus{Addresses: addrs}})
		if err != nil {
			return nil, fmt.Errorf("render node %q: %w", n.Name, err)
		}
		nodes = append(nodes, string(doc))
	}
	files["nodes.yaml"] = joinDocs(nodes)

	if strings.TrimSpace(s.Objects) != "" {
		files["extra.yaml"] = []byte(strings.TrimSpace(s.Objects) + "\n")
	}
	return files, nil
}

func joinDocs(docs []string) []byte {
	return []byte(strings.Join(docs, "---\n"))
}

// WriteObjects writes ObjectFiles into dir, creating it. Each file is written
// to a temporary name and renamed, so a watching agent never reads half a file.
func (s *Scenario) WriteObjects(dir string) error {
	files, err := s.ObjectFiles()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create objects dir: %w", err)
	}
	for name, data := range files {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return fmt.Errorf("write objects: %w", err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("write objects: %w", err)
		}
	}
	return nil
}

// pod returns the pod of that name.
func (s *Scenario) pod(name string) (PodRef, bool) {
	for _, p := range s.Pods() {
		if p.Name == name {
			return p, true
		}
	}
	return PodRef{}, false
}

// node returns the node of that name.
func (s *Scenario) node(name string) (NodeRef, bool) {
	for _, n := range s.Nodes() {
		if n.Name == name {
			return n, true
		}
	}
	return NodeRef{}, false
}
