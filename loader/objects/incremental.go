package objects

import (
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// nodeFacts is what validation finds in one Node alone, apart from the
// other objects: its parsed addresses and podCIDRs, its tunnel address and
// the problems of each. The Site it belongs to, overlaps and collisions are
// checked against the others on every validation; these facts are computed
// once per version of the Node and, by a Validator, kept across snapshots.
type nodeFacts struct {
	// version is the Node's resourceVersion the facts hold for; obj is its
	// copy with the CIDR fields normalized.
	version string
	obj     *corev1.Node

	addrErrs    []*Error // unparsable addresses
	internal    netip.Addr
	hasInternal bool
	internalIPs int

	pods     []fieldPrefix
	podErrs  []*Error
	podWarns []Warning

	underlays []fieldAddr

	tunnel                    fieldAddr
	tunnelAnnotated, tunnelOK bool
	tunnelErrs                []*Error
}

// factsOf returns the facts of e's Node, computing them (and normalizing
// e.obj in place) on first use.
func (l *loader) factsOf(e entry[corev1.Node]) *nodeFacts {
	if f, ok := l.facts[e.obj]; ok {
		return f
	}
	// A loader of its own collects the problems, so they can be replayed
	// in the order full validation reports them.
	scratch := &loader{rules: l.rules}
	f := &nodeFacts{version: e.obj.ResourceVersion, obj: e.obj}
	f.internalIPs = scratch.checkNodeAddresses(e)
	f.addrErrs = scratch.takeErrors()
	f.internal, f.hasInternal = InternalIP(e.obj)
	f.pods = scratch.checkPodCIDRs(e)
	f.podErrs, f.podWarns = scratch.takeErrors(), scratch.warnings
	f.underlays = underlaysOf(e)
	f.tunnel, f.tunnelAnnotated, f.tunnelOK = scratch.tunnelAddrOf(e)
	f.tunnelErrs = scratch.takeErrors()
	if l.facts == nil {
		l.facts = make(map[*corev1.Node]*nodeFacts)
	}
	l.facts[e.obj] = f
	return f
}

// takeErrors returns the problems found so far and forgets them.
func (l *loader) takeErrors() []*Error {
	var out []*Error
	for _, err := range l.errs {
		out = append(out, err.(*Error))
	}
	l.errs = nil
	return out
}

func (l *loader) addErrors(errs []*Error) {
	for _, e := range errs {
		l.errs = append(l.errs, e)
	}
}

// copyNode returns the loader's copy of o: the one a Validator kept when
// o is the version it saw last (same name, same non-empty resourceVersion),
// else a deep copy.
func (l *loader) copyNode(o *corev1.Node) *corev1.Node {
	if f, ok := l.previous[o.Name]; ok && o.ResourceVersion != "" && f.version == o.ResourceVersion {
		if l.facts == nil {
			l.facts = make(map[*corev1.Node]*nodeFacts)
		}
		l.facts[f.obj] = f
		return f.obj
	}
	return o.DeepCopy()
}

// Validator validates successive snapshots of the same objects, such as an
// agent's informer caches, with the result of ValidateSettingAside (a
// property test checks they are equal), but does the work that depends on
// one Node alone (parsing and normalizing its addresses, podCIDRs and tunnel
// address, deep copying it) only for the Nodes whose resourceVersion changed
// since the last snapshot. At 5,000 Nodes that is most of validation's cost;
// what relates objects to each other (sites, overlaps, collisions, pools) is
// checked on every snapshot, on the parsed forms. An object without a
// resourceVersion (from a file) is validated afresh each time. A Set it
// returns shares unchanged Nodes with the Sets it returned before: Sets are
// read-only. Safe for concurrent use.
type Validator struct {
	rules Rules

	mu    sync.Mutex
	nodes map[string]*nodeFacts // by name, of the last snapshot
}

// NewValidator returns a Validator that checks objects against r.
func NewValidator(r Rules) *Validator { return &Validator{rules: r} }

// ValidateSettingAside is objects.ValidateSettingAside with the Validator's
// Rules, reusing what the previous snapshot found for unchanged Nodes.
func (v *Validator) ValidateSettingAside(in Objects) (*Set, []Warning) {
	v.mu.Lock()
	defer v.mu.Unlock()
	l := &loader{rules: v.rules, previous: v.nodes}
	l.addAll(in)
	set, warns := l.finishSettingAside()
	// Keep the facts of this snapshot's Nodes only: a deleted Node's go.
	v.nodes = make(map[string]*nodeFacts, len(l.facts))
	for _, f := range l.facts {
		if f.version == "" {
			continue
		}
		if _, dup := v.nodes[f.obj.Name]; !dup {
			v.nodes[f.obj.Name] = f
		}
	}
	return set, warns
}
