package datapath

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/isthmus-dev/isthmus/maps"
)

// TracerPin is where the link of the kfree_skb tracer is pinned: outside
// <pinDir>/links, which holds only per-interface links (ListLinks, PruneLinks).
func TracerPin(pinDir string) string { return filepath.Join(pinDir, maps.TracerLinkPin) }

// splitTracer removes the kfree_skb tracer from spec and returns a spec holding it
// alone (nil if the object has none). The rest of the collection then loads without
// the kernel's BTF for tracepoints.
func splitTracer(spec *ebpf.CollectionSpec) *ebpf.CollectionSpec {
	ps, ok := spec.Programs[maps.ProgKfreeSkbTracer]
	if !ok {
		return nil
	}
	delete(spec.Programs, maps.ProgKfreeSkbTracer)
	return &ebpf.CollectionSpec{Maps: spec.Maps, Programs: map[string]*ebpf.ProgramSpec{maps.ProgKfreeSkbTracer: ps},
		Types: spec.Types, ByteOrder: spec.ByteOrder}
}

// AttachTracer loads the tp_btf/kfree_skb program on the collection's maps and
// attaches it to the kfree_skb tracepoint, with its link pinned at TracerPin. It
// counts into redirect_drops the packets the kernel frees after a program of this
// collection redirected them (bpf/lib/kdrop.h). A tracing link cannot be switched
// to another program in place: a link pinned by an earlier run is replaced, after
// the new one is attached. It needs the kernel's BTF (/sys/kernel/btf/vmlinux); the
// datapath works without it, only those drops go uncounted.
func (d *Datapath) AttachTracer() error {
	if d.tracer == nil {
		return errors.New("attach kfree_skb tracer: not in the object")
	}
	spec := d.tracer.Copy()
	for _, ms := range spec.Maps {
		ms.Pinning = ebpf.PinNone
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: d.Collection.Maps})
	if err != nil {
		return fmt.Errorf("load kfree_skb tracer: %w", err)
	}
	defer coll.Close()
	l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[maps.ProgKfreeSkbTracer]})
	if err != nil {
		return fmt.Errorf("attach kfree_skb tracer: %w", err)
	}
	defer l.Close()
	path := TracerPin(d.PinDir)
	if err := unpin(path); err != nil {
		return err
	}
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin kfree_skb tracer link %s: %w", path, err)
	}
	return nil
}

// TracerAttached reports whether a kfree_skb tracer link is pinned under pinDir.
func TracerAttached(pinDir string) bool {
	l, err := link.LoadPinnedLink(TracerPin(pinDir), nil)
	if err != nil {
		return false
	}
	l.Close()
	return true
}
