package objects

import (
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"weak"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// index holds the lookups of a Set, built once on first use: nodes by name and
// by site, sites by name, each node's site, pools by name and the gateways of
// each pool, with every selector and CIDR parsed once. A plan of a 5,000-node
// fleet makes hundreds of thousands of such lookups; scanning the slices for
// each made it take seconds.
type index struct {
	nodes    map[string]*corev1.Node
	sites    map[string]*v1alpha1.Site
	siteOf   map[*corev1.Node]*v1alpha1.Site
	nodesOf  map[string][]*corev1.Node
	pools    map[string]*v1alpha1.GatewayPool
	selected map[string][]*corev1.Node // pool name -> the nodes its selector selects
	pooled   map[*corev1.Node][]string // node -> the pools selecting it, sorted
}

// setIndex is a Set's index and the once that builds it.
type setIndex struct {
	once sync.Once
	idx  *index
}

// indexes maps each Set with an index to it. The index lives beside the Set,
// not in it, so a Set stays plain data (comparable with cmp, copyable); the
// key is weak and a cleanup drops the entry when the Set is collected.
var indexes sync.Map // weak.Pointer[Set] -> *setIndex

// lookup returns the Set's index, building it on first use. A Set must not be
// changed after its first lookup (Site, Node, SiteOf, NodesOf, GatewayPool,
// GatewaysOf, PoolsSelecting); build a new Set instead.
func (s *Set) lookup() *index {
	key := weak.Make(s)
	v, ok := indexes.Load(key)
	if !ok {
		var loaded bool
		v, loaded = indexes.LoadOrStore(key, &setIndex{})
		if !loaded {
			runtime.AddCleanup(s, func(k weak.Pointer[Set]) { indexes.Delete(k) }, key)
		}
	}
	si := v.(*setIndex)
	si.once.Do(func() { si.idx = buildIndex(s) })
	return si.idx
}

func buildIndex(s *Set) *index {
	ix := &index{
		nodes:    make(map[string]*corev1.Node, len(s.Nodes)),
		sites:    make(map[string]*v1alpha1.Site, len(s.Sites)),
		siteOf:   make(map[*corev1.Node]*v1alpha1.Site, len(s.Nodes)),
		nodesOf:  make(map[string][]*corev1.Node, len(s.Sites)),
		pools:    make(map[string]*v1alpha1.GatewayPool, len(s.GatewayPools)),
		selected: make(map[string][]*corev1.Node, len(s.GatewayPools)),
		pooled:   make(map[*corev1.Node][]string),
	}
	type sitePrefix struct {
		prefix netip.Prefix
		site   *v1alpha1.Site
	}
	var prefixes []sitePrefix
	for i := range s.Sites {
		site := &s.Sites[i]
		if _, dup := ix.sites[site.Name]; !dup {
			ix.sites[site.Name] = site
		}
		for _, c := range site.Spec.NodeCIDRs {
			if p, err := netip.ParsePrefix(string(c)); err == nil {
				prefixes = append(prefixes, sitePrefix{p, site})
			}
		}
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if _, dup := ix.nodes[n.Name]; !dup {
			ix.nodes[n.Name] = n
		}
		ip, ok := InternalIP(n)
		if !ok {
			continue
		}
		for _, sp := range prefixes {
			if sp.prefix.Contains(ip) {
				ix.siteOf[n] = sp.site
				ix.nodesOf[sp.site.Name] = append(ix.nodesOf[sp.site.Name], n)
				break
			}
		}
	}
	for name := range ix.nodesOf {
		sortNodes(ix.nodesOf[name])
	}
	byKey := newLabelKeyIndex(len(s.Nodes), func(i int) map[string]string { return s.Nodes[i].Labels })
	for i := range s.GatewayPools {
		pool := &s.GatewayPools[i]
		if _, dup := ix.pools[pool.Name]; dup {
			continue
		}
		ix.pools[pool.Name] = pool
		sel, err := poolSelector(pool)
		if err != nil {
			continue // selects nothing
		}
		for _, j := range byKey.selected(sel) {
			n := &s.Nodes[j]
			ix.selected[pool.Name] = append(ix.selected[pool.Name], n)
			ix.pooled[n] = append(ix.pooled[n], pool.Name)
		}
		sortNodes(ix.selected[pool.Name])
	}
	for _, names := range ix.pooled {
		slices.Sort(names)
	}
	return ix
}

func sortNodes(ns []*corev1.Node) {
	slices.SortFunc(ns, func(a, b *corev1.Node) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
}
