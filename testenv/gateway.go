package testenv

import (
	"encoding/json"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// GatewayPool types (docs/gateways.md): gateways of an Internal pool are
// reached by their InternalIP, of an External pool by their ExternalIP.
const (
	PoolInternal = "Internal"
	PoolExternal = "External"
)

// gatewayPool is what the lab reads of a GatewayPool object.
type gatewayPool struct {
	Name         string
	Type         string
	NodeSelector *metav1.LabelSelector
	selector     labels.Selector
}

// assignment is what the lab reads of a SiteGatewayPoolAssignment object.
type assignment struct {
	Name         string
	Sites        []string
	GatewayPools []string
	encrypted    bool // spec.encryption WireGuard
}

// allObjects returns the scenario's raw manifests: Objects and every site's.
func (s *Scenario) allObjects() ([]manifest, error) {
	all := s.Objects
	for _, site := range s.Sites {
		all += "\n---\n" + site.Objects
	}
	return splitDocs(all)
}

// gatewayObjects reads the GatewayPools and SiteGatewayPoolAssignments among
// the scenario's raw objects.
func (s *Scenario) gatewayObjects() ([]gatewayPool, []assignment, error) {
	docs, err := s.allObjects()
	if err != nil {
		return nil, nil, err
	}
	var pools []gatewayPool
	var asgs []assignment
	for _, d := range docs {
		switch d.Kind {
		case "GatewayPool":
			var f struct {
				Type         string                `json:"type"`
				NodeSelector *metav1.LabelSelector `json:"nodeSelector"`
			}
			if err := json.Unmarshal(d.Spec, &f); err != nil {
				return nil, nil, fmt.Errorf("read GatewayPool %q: %w", d.Metadata.Name, err)
			}
			if f.Type != PoolInternal && f.Type != PoolExternal {
				return nil, nil, fmt.Errorf("read GatewayPool %q: type %q: want %s or %s", d.Metadata.Name, f.Type, PoolInternal, PoolExternal)
			}
			if f.NodeSelector == nil {
				return nil, nil, fmt.Errorf("read GatewayPool %q: nodeSelector: missing", d.Metadata.Name)
			}
			sel, err := metav1.LabelSelectorAsSelector(f.NodeSelector)
			if err != nil {
				return nil, nil, fmt.Errorf("read GatewayPool %q: nodeSelector: %w", d.Metadata.Name, err)
			}
			pools = append(pools, gatewayPool{Name: d.Metadata.Name, Type: f.Type, NodeSelector: f.NodeSelector, selector: sel})
		case "SiteGatewayPoolAssignment":
			var f struct {
				Sites        []string `json:"sites"`
				GatewayPools []string `json:"gatewayPools"`
				Encryption   string   `json:"encryption"`
			}
			if err := json.Unmarshal(d.Spec, &f); err != nil {
				return nil, nil, fmt.Errorf("read SiteGatewayPoolAssignment %q: %w", d.Metadata.Name, err)
			}
			asgs = append(asgs, assignment{Name: d.Metadata.Name, Sites: f.Sites, GatewayPools: f.GatewayPools, encrypted: f.Encryption == "WireGuard"})
		}
	}
	return pools, asgs, nil
}

// validateGateways checks the gateway objects against the scenario: known
// sites and pools in every assignment, and a CrossSite mode that has gateways
// to let through.
func (s *Scenario) validateGateways() error {
	pools, asgs, err := s.gatewayObjects()
	if err != nil {
		return fmt.Errorf("objects: %w", err)
	}
	for _, a := range asgs {
		for _, sn := range a.Sites {
			if !slices.ContainsFunc(s.Sites, func(site Site) bool { return site.Name == sn }) {
				return fmt.Errorf("SiteGatewayPoolAssignment %q: unknown site %q", a.Name, sn)
			}
		}
		for _, pn := range a.GatewayPools {
			if !slices.ContainsFunc(pools, func(p gatewayPool) bool { return p.Name == pn }) {
				return fmt.Errorf("SiteGatewayPoolAssignment %q: unknown GatewayPool %q", a.Name, pn)
			}
		}
	}
	if s.Underlay6() && (len(pools) > 0 || len(asgs) > 0) {
		what := ""
		if len(pools) > 0 {
			what = fmt.Sprintf("GatewayPool %q", pools[0].Name)
		} else {
			what = fmt.Sprintf("SiteGatewayPoolAssignment %q", asgs[0].Name)
		}
		return fmt.Errorf("%s: gateways over the IPv6 underlay are not carried yet (transit and next-hop groups are IPv4 only; docs/architecture.md, \"IPv6 underlay\"), and the sites' subnets are IPv6", what)
	}
	for _, p := range pools {
		if p.Type != PoolExternal {
			continue
		}
		// A gateway behind a NAT needs none where the pool's assignments all
		// encrypt (WireGuard learns its endpoint), as isthmus' validation says.
		encryptedOnly := slices.ContainsFunc(asgs, func(a assignment) bool { return slices.Contains(a.GatewayPools, p.Name) }) &&
			!slices.ContainsFunc(asgs, func(a assignment) bool { return slices.Contains(a.GatewayPools, p.Name) && !a.encrypted })
		for _, n := range s.Nodes() {
			if p.selector.Matches(labels.Set(n.Labels)) && !n.ExternalAddress.IsValid() && !(encryptedOnly && n.Site.BehindNAT.IsValid()) {
				return fmt.Errorf("GatewayPool %q (External) selects node %q, which has no externalAddress", p.Name, n.Name)
			}
		}
	}
	switch s.Underlay.CrossSite {
	case "", CrossSiteAll:
	case CrossSiteGateways:
		if !s.Underlay.Firewall {
			return fmt.Errorf("underlay.crossSite %q: needs underlay.firewall", s.Underlay.CrossSite)
		}
		if len(s.Gateways()) == 0 {
			return fmt.Errorf("underlay.crossSite %q: no GatewayPool selects any node", s.Underlay.CrossSite)
		}
	default:
		return fmt.Errorf("underlay.crossSite %q: want %s or %s", s.Underlay.CrossSite, CrossSiteAll, CrossSiteGateways)
	}
	return nil
}

// Gateways returns the names of the nodes some GatewayPool of the scenario
// selects (by the nodes' labels), in scenario order.
func (s *Scenario) Gateways() []string {
	pools, _, _ := s.gatewayObjects() // validated
	var out []string
	for _, n := range s.Nodes() {
		if slices.ContainsFunc(pools, func(p gatewayPool) bool { return p.selector.Matches(labels.Set(n.Labels)) }) {
			out = append(out, n.Name)
		}
	}
	return out
}

// IsGateway reports whether a GatewayPool of the scenario selects the node.
func (s *Scenario) IsGateway(node string) bool { return slices.Contains(s.Gateways(), node) }

// assigned reports whether sites a and b are joined by a
// SiteGatewayPoolAssignment: they reach each other through gateways.
func (s *Scenario) assigned(a, b string) bool {
	_, asgs, _ := s.gatewayObjects() // validated
	return slices.ContainsFunc(asgs, func(x assignment) bool {
		return slices.Contains(x.Sites, a) && slices.Contains(x.Sites, b)
	})
}
