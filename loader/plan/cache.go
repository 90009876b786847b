package plan

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Cache computes a node's plans as Compute does, snapshot after snapshot,
// and reuses from the previous call the parts whose inputs did not change:
// the aggregated routes of each address chunk (see aggregate) and the
// aggregated allowed sources of each peer with many. A one-Node
// change of a remote site touches the chunk of its podCIDR (and of its
// InternalIP), so the aggregation of the other sites' thousands of routes is
// not done again. The result equals Compute's exactly, whatever changed
// (TestCacheEqualsCompute); a part is reused only when its inputs compare
// equal, never on a guess of what a change touches. Safe for concurrent use;
// one Cache serves one node's plans best (another node's call replaces what
// it keeps).
type Cache struct {
	mu sync.Mutex
	// chunks are the aggregated routes of each chunk of the last call.
	chunks map[netip.Prefix]routeChunk
	// sources are the allowed sources of each peer with many (a gateway a
	// member reaches every remote site through), before and after
	// aggregation, of the last call; next those of the call under way.
	sources, next map[string]sourceList
	// reused counts the chunks and source lists the last call took from
	// the one before.
	reused int
}

// sourceList is a peer's allowed sources before aggregation (a copy) and
// after.
type sourceList struct{ in, out []netip.Prefix }

// manySources is the length from which a peer's allowed sources are kept:
// shorter lists cost less to aggregate than to keep.
const manySources = 16

// routeChunk is the aggregation of the routes inside one chunk.
type routeChunk struct {
	// in are the chunk's routes before aggregation (a deep copy). Of what
	// aggregateTargeted made of them, inner are the routes longer than the
	// chunk, final, and whole the route as long as it, if any, which may
	// merge further with other chunks'.
	in, inner []Route
	whole     []targeted
}

// NewCache returns an empty Cache.
func NewCache() *Cache { return &Cache{} }

// Compute is plan.Compute, reusing what the previous call computed.
func (c *Cache) Compute(set *objects.Set, node string) (*NodePlan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reused = 0
	c.next = map[string]sourceList{}
	p, err := compute(set, node, c)
	c.sources, c.next = c.next, nil
	return p, err
}

// allowedSources returns the sorted, aggregated sources of peer (which ps
// lists in any order, duplicates and all), reusing the previous call's
// result when it had the same list for the peer. A nil c aggregates.
func (c *Cache) allowedSources(peer string, ps []netip.Prefix) []netip.Prefix {
	if c == nil || len(ps) < manySources {
		return AggregatePrefixes(sortedUnique(ps))
	}
	if l, ok := c.sources[peer]; ok && slices.Equal(l.in, ps) {
		c.reused++
		c.next[peer] = l
		return slices.Clone(l.out)
	}
	l := sourceList{in: slices.Clone(ps)}
	l.out = AggregatePrefixes(sortedUnique(ps))
	c.next[peer] = sourceList{in: l.in, out: slices.Clone(l.out)}
	return l.out
}

// chunkBits is the length of the chunks routes are aggregated in: a fleet's
// Site has a /16 of pod blocks, so its nodes' /24s share one.
func chunkBits(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 16
	}
	return 48
}

// chunkOf returns the chunk holding p.
func chunkOf(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Addr(), chunkBits(p)).Masked()
}

// aggregate is aggregateRoutes (routes sorted by prefix, each prefix once,
// as dedupeRoutes leaves them) done chunk by chunk, each chunk's result
// reused when its routes equal those of the previous call. With no route
// shorter than a chunk, aggregation inside one chunk depends on nothing
// outside it: every route holding a route of the chunk, and its sibling, are
// in the chunk. Only the results as long as a chunk can merge with a
// neighbour or into something shorter: one more aggregation over those alone
// finishes the job, with the counts of what each already folded in. A route
// shorter than a chunk (a routedCidrs /12, say) aggregates the whole list.
func (c *Cache) aggregate(routes []Route) []Route {
	if c == nil || len(routes) < 2 {
		return aggregateRoutes(routes)
	}
	for _, r := range routes {
		if r.Prefix.Bits() < chunkBits(r.Prefix) {
			c.chunks = nil
			return aggregateRoutes(routes)
		}
	}
	chunks := make(map[netip.Prefix]routeChunk, len(c.chunks))
	out := make([]Route, 0, len(routes))
	var whole []targeted
	for start := 0; start < len(routes); {
		key := chunkOf(routes[start].Prefix)
		end := start + 1
		for end < len(routes) && chunkOf(routes[end].Prefix) == key {
			end++
		}
		if _, seen := chunks[key]; seen { // not sorted after all
			c.chunks = nil
			return aggregateRoutes(routes)
		}
		run := routes[start:end]
		ch, ok := c.chunks[key]
		if ok && slices.EqualFunc(ch.in, run, Route.Equal) {
			c.reused++
		} else {
			ch = newRouteChunk(run, key)
		}
		chunks[key] = ch
		for _, r := range ch.inner {
			r.Group = slices.Clone(r.Group) // the cache keeps its own: a caller may change its plan
			out = append(out, r)
		}
		whole = append(whole, ch.whole...)
		start = end
	}
	c.chunks = chunks
	if len(whole) > 0 {
		for _, r := range withOrigins(aggregateTargeted(whole)) {
			r.Group = slices.Clone(r.Group)
			out = append(out, r)
		}
		slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	}
	return out
}

// newRouteChunk aggregates run, the routes of chunk key.
func newRouteChunk(run []Route, key netip.Prefix) routeChunk {
	ch := routeChunk{in: cloneRoutes(run)}
	var inner []targeted
	for _, t := range aggregateTargeted(targetedOf(run)) {
		if t.route.Prefix.Bits() == key.Bits() {
			ch.whole = append(ch.whole, t)
		} else {
			inner = append(inner, t)
		}
	}
	ch.inner = withOrigins(inner)
	return ch
}

// cloneRoutes returns a deep copy of routes.
func cloneRoutes(routes []Route) []Route {
	out := slices.Clone(routes)
	for i := range out {
		out[i].Group = slices.Clone(out[i].Group)
	}
	return out
}
