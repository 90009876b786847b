package testenv

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// manifestNode is the part of a core v1 Node the lab takes from a manifest.
type manifestNode struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		PodCIDR  string   `json:"podCIDR"`
		PodCIDRs []string `json:"podCIDRs"`
	} `json:"spec"`
	Status struct {
		Addresses []nodeAddress `json:"addresses"`
	} `json:"status"`
}

// mergeManifests reads the *.yaml and *.yml files directly in dir (as
// `isthmus plan --objects` and the agent do) into the scenario, as
// Scenario.Manifests says. Every scenario node must have a Node in dir and
// every Node a scenario node, and a scenario site or node may not also give
// what the manifests give, so the lab runs exactly the manifests.
func (s *Scenario) mergeManifests(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read manifests: %w", err)
	}
	sites := map[string]*Site{}
	for i := range s.Sites {
		site := &s.Sites[i]
		if len(site.Spec) > 0 || site.Objects != "" {
			return fmt.Errorf("site %q: spec and objects come from the manifests", site.Name)
		}
		sites[site.Name] = site
	}
	nodes := map[string]*Node{}
	for i := range s.Sites {
		for j := range s.Sites[i].Nodes {
			n := &s.Sites[i].Nodes[j]
			if n.Address.IsValid() || n.ExternalAddress.IsValid() || n.PodCIDR.IsValid() || len(n.PodCIDRs) > 0 ||
				len(n.Labels) > 0 || len(n.Annotations) > 0 {
				return fmt.Errorf("node %q: address, externalAddress, podCIDRs, labels and annotations come from the manifests", n.Name)
			}
			nodes[n.Name] = n
		}
	}
	seen := map[string]bool{}
	var extra []string
	for _, e := range ents {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return fmt.Errorf("read manifests: %w", err)
		}
		docs, err := splitDocs(string(data))
		if err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		for _, d := range docs {
			name := d.Metadata.Name
			switch d.Kind {
			case "Site":
				site, ok := sites[name]
				if !ok {
					return fmt.Errorf("%s: Site %q: no scenario site of that name", e.Name(), name)
				}
				site.Objects += strings.TrimSpace(string(d.Raw)) + "\n---\n"
			case "Node":
				n, ok := nodes[name]
				if !ok {
					return fmt.Errorf("%s: Node %q: no scenario node of that name", e.Name(), name)
				}
				if seen[name] {
					return fmt.Errorf("%s: Node %q: given twice", e.Name(), name)
				}
				seen[name] = true
				if err := n.fromManifest(d.Raw); err != nil {
					return fmt.Errorf("%s: Node %q: %w", e.Name(), name, err)
				}
			default:
				extra = append(extra, strings.TrimSpace(string(d.Raw))+"\n")
			}
		}
	}
	for name := range nodes {
		if !seen[name] {
			return fmt.Errorf("node %q: no Node of that name in the manifests", name)
		}
	}
	for i := range s.Sites {
		s.Sites[i].Objects = strings.TrimSuffix(s.Sites[i].Objects, "---\n")
	}
	if len(extra) > 0 {
		if strings.TrimSpace(s.Objects) != "" {
			extra = append([]string{strings.TrimSpace(s.Objects) + "\n"}, extra...)
		}
		s.Objects = string(joinDocs(extra))
	}
	return nil
}

// fromManifest sets the node's address (InternalIP), external address
// (ExternalIP), podCIDRs, labels and annotations from a Node manifest.
func (n *Node) fromManifest(raw []byte) error {
	var m manifestNode
	if err := yaml.Unmarshal(raw, &m); err != nil {
		return err
	}
	for _, a := range m.Status.Addresses {
		var dst *netip.Addr
		switch a.Type {
		case "InternalIP":
			dst = &n.Address
		case "ExternalIP":
			dst = &n.ExternalAddress
		default:
			continue
		}
		addr, err := netip.ParseAddr(a.Address)
		if err != nil {
			return fmt.Errorf("status.addresses %s: %w", a.Type, err)
		}
		if !dst.IsValid() { // the first of each type, as the agent reads them
			*dst = addr
		}
	}
	if !n.Address.IsValid() {
		return fmt.Errorf("no InternalIP in status.addresses")
	}
	cidrs := m.Spec.PodCIDRs
	if m.Spec.PodCIDR != "" && !slices.Contains(cidrs, m.Spec.PodCIDR) {
		cidrs = append([]string{m.Spec.PodCIDR}, cidrs...)
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("spec.podCIDRs: %w", err)
		}
		n.PodCIDRs = append(n.PodCIDRs, p)
	}
	n.Labels = m.Metadata.Labels
	n.Annotations = m.Metadata.Annotations
	return nil
}
